"""Filesystems for checkpoint storage: the local disk, or anything fsspec reaches.

Only what checkpoints need: write a file so that it appears whole or not at all
(``write_atomic``: temporary name, flush and fsync, rename), read it back, list,
delete. ``file://`` paths and plain paths use the local implementation; other
schemes (``s3://``, ``hdfs://``, ``gs://``, ``memory://``) go through fsspec,
where an object store's single PUT is atomic by itself.

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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

from chandy.errors import StorageError


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
    """Any filesystem fsspec knows, by URI scheme."""

    def __init__(self, protocol: str) -> None:
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec is a dependency
            raise StorageError(
                f"checkpoint storage '{protocol}://' needs fsspec: pip install fsspec"
            ) from None
        try:
            self._fs = fsspec.filesystem(protocol)
        except (ImportError, ValueError) as exc:
            raise StorageError(
                f"no filesystem for '{protocol}://' checkpoint storage: {exc}. Install the fsspec "
                f"implementation for '{protocol}' (e.g. s3fs for s3://) or use a local path"
            ) from None
        self.protocol = protocol

    def join(self, base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *parts])

    def write_atomic(self, path: str, data: bytes) -> None:
        # One PUT of the whole object: object stores make it visible all at once.
        self._fs.pipe_file(path, data)

    def write_new_from(self, path: str, chunks: Iterable[bytes]) -> None:
        # A multipart upload on object stores: visible once closed, and only then
        with self._fs.open(path, "wb") as out:
            for chunk in chunks:
                out.write(chunk)

    def read(self, path: str) -> bytes:
        data: bytes = self._fs.cat_file(path)  # fsspec has no type hints
        return data

    def read_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        with self._fs.open(path, "rb") as source:
            while chunk := source.read(chunk_size):
                yield chunk

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(path))

    def is_dir(self, path: str) -> bool:
        return bool(self._fs.isdir(path))

    def size(self, path: str) -> int:
        if not self._fs.exists(path):
            raise FileNotFoundError(path)
        return int(self._fs.size(path))

    def list_dir(self, path: str) -> list[str]:
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self._fs.ls(path, detail=False))

    def mkdirs(self, path: str) -> None:
        self._fs.makedirs(path, exist_ok=True)

    def delete(self, path: str, recursive: bool = False) -> None:
        if self._fs.exists(path):
            self._fs.rm(path, recursive=recursive)


def resolve(uri: str, permissions: FilePermissions = PRIVATE) -> tuple[FileSystem, str]:
    """The filesystem for ``uri`` and the path to hand to it.

    A plain path or ``file://`` URI is local (made absolute), and creates its files and
    directories with ``permissions``; other schemes go to fsspec.
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
    return FsspecFileSystem(parsed.scheme), uri
