"""Filesystems for checkpoint storage: the local disk, or anything fsspec reaches.

Only what checkpoints need: write a file so that it appears whole or not at all
(``write_atomic``: temporary name, flush and fsync, rename), read it back, list,
delete. ``file://`` paths and plain paths use the local implementation; other
schemes (``s3://``, ``hdfs://``, ``gs://``, ``memory://``) go through fsspec,
where an object store's single PUT is atomic by itself.

An object store is reached with the job's :class:`ObjectStoreOptions` (Flink's ``s3.*`` keys,
else the ``AWS_*`` variables of the process that submitted the job), which every caller
hands to :func:`resolve`: they travel with the job (in :class:`CheckpointStorage`, in a
sink) to every task, a Spark slot process included, instead of living in a process-wide
registry that a second job in the same process, or a slot started earlier, would not see.
Its errors (botocore's, aiohttp's) come out as :class:`OSError` naming the storage, so the
callers' handling of a full disk covers an unreachable endpoint too.

Local files and directories are created with explicit permissions
(:class:`FilePermissions`, private by default: checkpoints hold the job's state, which
other local users must not read). Object stores have no such modes: their access is the
bucket's or the cluster's policy.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlparse

from chandy.config import Configuration
from chandy.config.options import S3Options
from chandy.errors import StorageError

_T = TypeVar("_T")

#: URI schemes of S3: object stores without directories or rename, where an object becomes
#: visible whole when its PUT (or multipart upload) completes, and not before.
S3_SCHEMES = ("s3", "s3a")


@dataclass(frozen=True)
class ObjectStoreOptions:
    """How the job reaches its object store: the settings handed to fsspec's ``s3fs``.

    Built once, where the job is submitted (:meth:`from_configuration`): Flink's keys win,
    else the ``AWS_*`` variables of that process. They are shipped with the job, so a task
    in a Spark slot process (started before the variables were set, or on another host)
    reaches the store with the same endpoint and credentials as the driver. Unset fields
    leave botocore's own chain (``~/.aws``, an instance role) to the process using them.
    The secrets never show in a ``repr`` (logs, error messages).
    """

    s3_endpoint: str | None = None
    s3_access_key: str | None = field(default=None, repr=False)
    s3_secret_key: str | None = field(default=None, repr=False)
    s3_session_token: str | None = field(default=None, repr=False)
    s3_region: str | None = None
    s3_path_style_access: bool = False

    @staticmethod
    def from_configuration(
        config: Configuration | Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> ObjectStoreOptions:
        """The job's options: ``s3.endpoint``, ``s3.access-key``, ``s3.secret-key`` and
        ``s3.path.style.access``, each else its ``AWS_*`` variable in ``environ`` (this
        process's environment by default)."""
        conf = config if isinstance(config, Configuration) else Configuration(config)
        env = os.environ if environ is None else environ
        return ObjectStoreOptions(
            s3_endpoint=conf.get(S3Options.ENDPOINT)
            or env.get("AWS_ENDPOINT_URL_S3")
            or env.get("AWS_ENDPOINT_URL")
            or None,
            s3_access_key=conf.get(S3Options.ACCESS_KEY) or env.get("AWS_ACCESS_KEY_ID") or None,
            s3_secret_key=conf.get(S3Options.SECRET_KEY) or env.get("AWS_SECRET_ACCESS_KEY") or None,
            # A session token belongs to the variables' key pair only, never to a configured one.
            s3_session_token=None if conf.get(S3Options.ACCESS_KEY) else env.get("AWS_SESSION_TOKEN") or None,
            s3_region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            s3_path_style_access=conf.get(S3Options.PATH_STYLE_ACCESS),
        )

    @property
    def s3_endpoint_url(self) -> str | None:
        """The endpoint as a URL: a bare ``host:port`` is https, as in Hadoop's S3A."""
        endpoint = self.s3_endpoint
        if endpoint and "://" not in endpoint:
            return f"https://{endpoint}"
        return endpoint

    def describe(self, protocol: str) -> str:
        """The storage as an error names it: scheme and endpoint, never a secret."""
        if protocol in S3_SCHEMES:
            return f"S3 at {self.s3_endpoint_url or 'AWS (botocore default endpoint)'}"
        return f"{protocol}:// storage"

    def fsspec_kwargs(self, protocol: str) -> dict[str, Any]:
        """The keyword arguments of ``fsspec.filesystem(protocol, ...)``."""
        if protocol not in S3_SCHEMES:
            return {}
        # Another process writes what this one looks for (a task's state file, the driver's
        # _metadata, a restarted driver's listing): a cached listing must never answer.
        kwargs: dict[str, Any] = {"use_listings_cache": False}
        if self.s3_endpoint_url:
            kwargs["endpoint_url"] = self.s3_endpoint_url
        if self.s3_access_key:
            kwargs["key"] = self.s3_access_key
        if self.s3_secret_key:
            kwargs["secret"] = self.s3_secret_key
        if self.s3_session_token:
            kwargs["token"] = self.s3_session_token
        if self.s3_region:
            kwargs["client_kwargs"] = {"region_name": self.s3_region}
        if self.s3_path_style_access:
            kwargs["config_kwargs"] = {"s3": {"addressing_style": "path"}}
        return kwargs

    def rust_object_store_options(self) -> dict[str, str]:
        """The same settings for delta-rs (Rust's ``object_store`` crate), whose S3 client is
        its own: a plain-HTTP endpoint must be allowed explicitly there."""
        options: dict[str, str] = {}
        if self.s3_endpoint_url:
            options["AWS_ENDPOINT_URL"] = self.s3_endpoint_url
            if self.s3_endpoint_url.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        for name, value in (
            ("AWS_ACCESS_KEY_ID", self.s3_access_key),
            ("AWS_SECRET_ACCESS_KEY", self.s3_secret_key),
            ("AWS_SESSION_TOKEN", self.s3_session_token),
            ("AWS_REGION", self.s3_region),
        ):
            if value:
                options[name] = value
        if self.s3_path_style_access:
            options["AWS_FORCE_PATH_STYLE"] = "true"
        return options


#: The options of a caller that has no job configuration (tests, a tool reading a local
#: checkpoint): botocore's own chain, the ``AWS_*`` variables of this process included.
DEFAULT_OBJECT_STORE = ObjectStoreOptions()


class ObjectStoreError(OSError):
    """An object store failed a request for another reason than a missing object or denied
    access (unreachable, timed out, a server error): named with the storage and the cause."""


@dataclass(frozen=True)
class FilePermissions:
    """The modes of the files and directories checkpoint storage creates on a local disk.

    Set explicitly after creation (``fchmod``/``chmod``), so the process's umask neither
    opens nor narrows them. Directories that already existed are left as they are.
    """

    file_mode: int = 0o600
    dir_mode: int = 0o700


#: Only the user the job runs as reads or lists its checkpoints (Flink's advice for state).
PRIVATE = FilePermissions()


class NotARegularFileError(OSError):
    """A path that should be a file is a FIFO, a device, a socket or a directory: reading
    it could block for ever (a FIFO) or never end (``/dev/zero``), so it is not read."""

    def __init__(self, path: str, mode: int) -> None:
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a directory"
            if stat.S_ISDIR(mode)
            else "not a regular file"
        )
        super().__init__(errno.EINVAL, f"{path} is {kind}, not a regular file")


def _open_regular(path: str) -> int:
    """A file descriptor of regular file ``path`` opened for reading; a FIFO is opened without
    blocking (``O_NONBLOCK``) and refused, as is any other non-regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFileError(path, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


class FileSystem(ABC):
    """The operations checkpoint storage needs."""

    @abstractmethod
    def join(self, base: str, *parts: str) -> str: ...

    @abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None:
        """Create or replace ``path`` so that readers see either nothing or all of ``data``."""

    def write_new(self, path: str, data: bytes) -> None:
        """Create ``path`` (which must not exist) with ``data``, durably.

        Not atomic: a crash may leave a partial file. Checkpoint state files are
        written this way: nothing references them until ``_metadata`` (written
        atomically, last) does, and its directory sync makes their entries durable.
        """
        self.write_atomic(path, data)

    def write_new_from(self, path: str, chunks: Iterable[bytes]) -> None:
        """Create ``path`` (which must not exist) from ``chunks``, durably, directory entry
        included, never holding the whole content in memory (a large file copied into
        checkpoint storage, e.g. an SST file of an incremental checkpoint). Not atomic, as
        :meth:`write_new`."""
        self.write_new(path, b"".join(chunks))

    def read_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The content of ``path`` in chunks of at most ``chunk_size`` bytes (a large file,
        never whole in memory); :class:`FileNotFoundError` if it does not exist."""
        yield self.read(path)

    @abstractmethod
    def read(self, path: str) -> bytes: ...

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def is_dir(self, path: str) -> bool: ...

    @abstractmethod
    def size(self, path: str) -> int:
        """Size in bytes; :class:`FileNotFoundError` if it does not exist."""

    @abstractmethod
    def list_dir(self, path: str) -> list[str]:
        """Names (not paths) of the entries of a directory."""

    @abstractmethod
    def mkdirs(self, path: str) -> None: ...

    @abstractmethod
    def delete(self, path: str, recursive: bool = False) -> None:
        """Remove a file or (with ``recursive``) a directory; missing is not an error."""


class LocalFileSystem(FileSystem):
    def __init__(self, permissions: FilePermissions = PRIVATE) -> None:
        self.permissions = permissions

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    # Raw os calls, as few as possible: in a busy process every system call gives up
    # the interpreter lock and waits to get it back behind the task threads.

    def _write_fd(self, path: str, chunks: Iterable[bytes], flags: int) -> None:
        mode = self.permissions.file_mode
        fd = os.open(path, flags, mode)
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed a shared mode; never widened it
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _sync_dir(directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_atomic(self, path: str, data: bytes) -> None:
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.inprogress")
        try:
            self._write_fd(tmp, (data,), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            os.replace(tmp, path)
        except BaseException:
            self.delete(tmp)
            raise
        self._sync_dir(directory)  # make the rename (and earlier files of the directory) durable

    def write_new(self, path: str, data: bytes) -> None:
        self._write_fd(path, (data,), os.O_WRONLY | os.O_CREAT | os.O_EXCL)

    def write_new_from(self, path: str, chunks: Iterable[bytes]) -> None:
        self._write_fd(path, chunks, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        # A shared file is referenced by later checkpoints whose _metadata syncs only their
        # own directory: its entry must be durable by itself.
        self._sync_dir(os.path.dirname(path))

    # Checkpoint files are regular files: anything else (a FIFO, /dev/zero) in a crafted
    # checkpoint would hang a reader or never end, so it is refused before a byte is read.

    def read_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        fd = _open_regular(path)
        try:
            while chunk := os.read(fd, chunk_size):
                yield chunk
        finally:
            os.close(fd)

    def read(self, path: str) -> bytes:
        fd = _open_regular(path)
        try:
            size = os.fstat(fd).st_size
            chunks = []
            while size > 0:
                chunk = os.read(fd, size)
                if not chunk:
                    break
                chunks.append(chunk)
                size -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def size(self, path: str) -> int:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFileError(path, st.st_mode)
        return st.st_size

    def list_dir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def mkdirs(self, path: str) -> None:
        """Create ``path`` and its missing parents with the directory mode; those that
        exist keep theirs (the user's base directory is the user's)."""
        missing = []
        current = path
        while not os.path.isdir(current):
            missing.append(current)
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
        mode = self.permissions.dir_mode
        for directory in reversed(missing):
            try:
                os.mkdir(directory, mode)
            except FileExistsError:
                if not os.path.isdir(directory):  # a file is in the way: say so, as mkdir -p does
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), directory) from None
                continue  # another task created it meanwhile, with the same mode
            os.chmod(directory, mode)

    def delete(self, path: str, recursive: bool = False) -> None:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                if recursive:
                    shutil.rmtree(path)
                else:
                    os.rmdir(path)
            else:
                os.remove(path)
        except FileNotFoundError:
            pass


class FsspecFileSystem(FileSystem):
    """Any filesystem fsspec knows, by URI scheme; S3 through ``s3fs`` with the job's
    :class:`ObjectStoreOptions`.

    On S3 every call's failure is an :class:`OSError`: :class:`FileNotFoundError` for a
    missing object, :class:`PermissionError` (naming the storage and the keys to check) for
    denied access, else :class:`ObjectStoreError` naming the storage and the cause.
    """

    def __init__(self, protocol: str, options: ObjectStoreOptions = DEFAULT_OBJECT_STORE) -> None:
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec is a dependency
            raise StorageError(
                f"checkpoint storage '{protocol}://' needs fsspec: pip install fsspec"
            ) from None
        try:
            self._fs = fsspec.filesystem(protocol, **options.fsspec_kwargs(protocol))
        except (ImportError, ValueError) as exc:
            raise StorageError(
                f"no filesystem for '{protocol}://' checkpoint storage: {exc}. Install the fsspec "
                f"implementation for '{protocol}' (e.g. s3fs for s3://) or use a local path"
            ) from None
        self.protocol = protocol
        self.options = options
        #: An object store: no directories to create, no rename.
        self.is_object_store = protocol in S3_SCHEMES

    @property
    def raw(self) -> Any:
        """The fsspec filesystem itself (for a connector's multipart upload)."""
        return self._fs

    def call(self, what: str, path: str, action: Callable[[], _T]) -> _T:
        """Run ``action`` (a request about ``path``), its failure an :class:`OSError` that names
        the storage and the cause (botocore and aiohttp raise their own exception types)."""
        if not self.is_object_store:  # other fsspec filesystems raise as they always did
            return action()
        try:
            return action()
        except FileNotFoundError:
            raise
        except PermissionError as exc:
            raise PermissionError(
                errno.EACCES,
                f"{self.options.describe(self.protocol)} denied {what} {path}: {_sentence(exc)} Check the "
                "credentials (s3.access-key / s3.secret-key, or AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY) and the bucket's policy",
            ) from exc
        except ObjectStoreError:
            raise
        except Exception as exc:  # botocore's, aiohttp's: one kind for callers
            raise ObjectStoreError(
                errno.EIO,
                f"{self.options.describe(self.protocol)}: {what} {path} failed: {type(exc).__name__}: "
                f"{_sentence(exc)}",
            ) from exc

    def join(self, base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *parts])

    def write_atomic(self, path: str, data: bytes) -> None:
        # One PUT of the whole object: object stores make it visible all at once.
        self.call("writing", path, lambda: self._fs.pipe_file(path, data))

    def write_new_from(self, path: str, chunks: Iterable[bytes]) -> None:
        # A multipart upload on object stores: visible once closed, and only then
        def write() -> None:
            with self._fs.open(path, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)

        self.call("writing", path, write)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` with ``data`` unless it exists; False if it did (another writer won).

        On S3 a conditional PUT (``If-None-Match: *``), so two writers racing agree on one
        object; elsewhere a check, then a PUT."""
        if not self.is_object_store:
            if self.exists(path):
                return False
            self.write_atomic(path, data)
            return True
        bucket, _, key = self._fs._strip_protocol(path).partition("/")
        try:
            self.call(
                "creating",
                path,
                lambda: self._fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*"),
            )
        except OSError:
            if self.exists(path):  # 412 Precondition Failed: another writer created it first
                return False
            raise
        return True

    def read(self, path: str) -> bytes:
        data: bytes = self.call("reading", path, lambda: self._fs.cat_file(path))  # fsspec has no type hints
        return data

    def read_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        source = self.call("opening", path, lambda: self._fs.open(path, "rb"))
        with source:
            while chunk := self.call("reading", path, lambda: source.read(chunk_size)):
                yield chunk

    def exists(self, path: str) -> bool:
        return bool(self.call("looking up", path, lambda: self._fs.exists(path)))

    def is_dir(self, path: str) -> bool:
        return bool(self.call("looking up", path, lambda: self._fs.isdir(path)))

    def size(self, path: str) -> int:
        info = self.call("looking up", path, lambda: self._fs.info(path))
        if info.get("type") == "directory":
            raise FileNotFoundError(errno.ENOENT, "not a file", path)
        return int(info["size"])

    def list_dir(self, path: str) -> list[str]:
        names = self.call("listing", path, lambda: self._fs.ls(path, detail=False))
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in names)

    def mkdirs(self, path: str) -> None:
        if self.is_object_store:
            return  # no directories: a key's prefix exists once an object under it does
        self.call("creating", path, lambda: self._fs.makedirs(path, exist_ok=True))

    def delete(self, path: str, recursive: bool = False) -> None:
        def delete() -> None:
            if self._fs.exists(path):
                self._fs.rm(path, recursive=recursive)

        try:
            self.call("deleting", path, delete)
        except FileNotFoundError:
            pass


def _sentence(exc: BaseException) -> str:
    """An exception's text as one sentence (a trailing period once, not twice)."""
    text = str(exc).strip() or type(exc).__name__
    return text if text.endswith((".", "!", "?")) else text + "."


def resolve(
    uri: str, permissions: FilePermissions = PRIVATE, options: ObjectStoreOptions = DEFAULT_OBJECT_STORE
) -> tuple[FileSystem, str]:
    """The filesystem for ``uri`` and the path to hand to it.

    A plain path or ``file://`` URI is local (made absolute), and creates its files and
    directories with ``permissions``; other schemes go to fsspec, reached with ``options``.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise StorageError(f"a checkpoint storage location must be a non-empty path or URI, got {uri!r}")
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        path = parsed.path if parsed.scheme == "file" else uri
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise StorageError(
                f"'{uri}' names host '{parsed.netloc}'; a file:// URI must be file:///absolute/path"
            )
        return LocalFileSystem(permissions), os.path.abspath(os.path.expanduser(path))
    return FsspecFileSystem(parsed.scheme, options), uri
