"""Where checkpoints go, laid out as Flink lays them out.

```
<execution.checkpointing.dir>/<job-id>/
    shared/      files referenced by several checkpoints (SST files of incremental snapshots)
    taskowned/   state owned by the tasks, never deleted by the JobMaster
    chk-1/       exclusive state files of checkpoint 1, then _metadata
    chk-2/
```

``chk-N/_metadata`` is written last, atomically, by the JobMaster when every
subtask has acknowledged: a directory without a valid ``_metadata`` is an
incomplete checkpoint and is never restored from. State smaller than the
inline threshold is not written to a file at all; it travels inside the
handle and ends up in ``_metadata`` (Flink's ``data-inline-threshold``).

A savepoint goes elsewhere, into a directory of its own that the user names
(``execution.checkpointing.savepoint-dir`` or the request), created by the
JobMaster when the savepoint is triggered::

    <savepoint-dir>/savepoint-<first 6 of the job id>-<12 random hex>/
        _metadata    (paths of the files beside it relative to this directory)
        <state files>

Every file the savepoint needs is inside that directory, so it can be moved and
restored from its new place. Tasks learn the directory from the barrier's
``CheckpointOptions.target_location``.

With no directory configured the storage keeps everything in the JobMaster's
memory (Flink's ``jobmanager`` checkpoint storage): failover works, nothing
survives the job.

The object is a few strings and numbers, so it pickles into every task (and
every Spark slot): tasks write their state files through it, the JobMaster its
metadata.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from chandy.errors import InvalidCheckpointError, StorageError
from chandy.state.handles import ByteStreamStateHandle, FileStateHandle, Range, StreamStateHandle
from chandy.storage.filesystem import (
    DEFAULT_OBJECT_STORE,
    PRIVATE,
    FilePermissions,
    FileSystem,
    NotARegularFileError,
    ObjectStoreOptions,
    resolve,
)
from chandy.storage.snapshot_key import SnapshotKey, environment_key, key_at_root, user_key

log = logging.getLogger(__name__)

METADATA_FILE_NAME = "_metadata"
CHECKPOINT_DIR_PREFIX = "chk-"
SAVEPOINT_DIR_PREFIX = "savepoint-"
SHARED_DIR = "shared"
TASK_OWNED_DIR = "taskowned"
#: Files are copied in chunks of this size: an SST file of hundreds of MB never sits in memory.
COPY_CHUNK_BYTES = 1 << 20


class CheckpointStorage:
    """Checkpoint storage of one job: a directory tree on a filesystem, or memory."""

    def __init__(
        self,
        base_uri: str | None,
        job_id: str,
        *,
        create_subdir: bool = True,
        inline_threshold: int = 20 * 1024,
        permissions: FilePermissions = PRIVATE,
        object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE,
    ) -> None:
        """``permissions``: the modes of the files and directories created on a local disk
        (``execution.checkpointing.file-permissions``/``dir-permissions``). ``object_store``:
        how an ``s3://`` directory is reached (endpoint, credentials); it pickles into every
        task with this object, so a Spark slot writes with the driver's settings."""
        self.base_uri = base_uri
        self.job_id = job_id
        self.create_subdir = create_subdir
        self.inline_threshold = inline_threshold
        self.permissions = permissions
        self.object_store = object_store
        self._fs: FileSystem | None = None
        self._job_dir: str | None = None
        self._made_dirs: set[str] = set()
        #: The key ``_metadata`` is signed with (the JobMaster sets the deployment's, see
        #: :func:`chandy.storage.snapshot_key.snapshot_key`); ``None``: the key kept in this
        #: storage's root, or in a savepoint's target directory (:meth:`signing_key`).
        self.snapshot_key: SnapshotKey | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None  # filesystems hold clients and connections: rebuilt on the other side
        state["_made_dirs"] = set()
        state["snapshot_key"] = None  # tasks never sign: the secret stays in the driver
        return state

    def signing_key(self, target_location: str | None = None) -> SnapshotKey:
        """The key to sign a ``_metadata`` with: the deployment's, else ``CHANDY_SNAPSHOT_KEY``,
        else the one generated in this storage's root, else (in-memory storage writing a
        savepoint) the user's own key, else the one in the directory the savepoint was
        written into. Every written ``_metadata`` is signed."""
        if self.snapshot_key is None:
            self.snapshot_key = environment_key()
        if self.snapshot_key is None:
            if self.base_uri is not None:
                self.snapshot_key = key_at_root(self.base_uri, self.object_store)
            else:
                if target_location is None:
                    raise StorageError("in-memory checkpoint storage writes no _metadata to sign")
                own = user_key()
                if own is not None:
                    return own
                return key_at_root(target_location.rstrip("/").rsplit("/", 1)[0] or "/", self.object_store)
        return self.snapshot_key

    def _mkdirs_once(self, directory: str) -> None:
        # Every syscall costs a wait for the interpreter lock on a busy process: create once.
        if directory not in self._made_dirs:
            self.fs.mkdirs(directory)
            self._made_dirs.add(directory)

    @property
    def is_persistent(self) -> bool:
        """False for JobManager (in-memory) storage: nothing is written anywhere."""
        return self.base_uri is not None

    @property
    def fs(self) -> FileSystem:
        if self._fs is None:
            assert self.base_uri is not None
            self._fs, base = resolve(self.base_uri, self.permissions, self.object_store)
            self._job_dir = self._fs.join(base, self.job_id) if self.create_subdir else base
        return self._fs

    @property
    def job_dir(self) -> str:
        self.fs  # noqa: B018 - resolves the directory
        assert self._job_dir is not None
        return self._job_dir

    def initialize(self) -> None:
        """Create the layout and prove it is writable; a clear error if it is not."""
        if not self.is_persistent:
            return
        try:
            fs = self.fs
            for sub in (SHARED_DIR, TASK_OWNED_DIR):
                fs.mkdirs(fs.join(self.job_dir, sub))
            probe = fs.join(self.job_dir, f".probe-{uuid.uuid4().hex}")
            fs.write_atomic(probe, b"ok")
            fs.delete(probe)
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(
                f"checkpoint storage '{self.base_uri}' is not writable ({type(exc).__name__}: "
                f"{exc}). Set execution.checkpointing.dir to a directory this job can write, "
                "reachable from every executor."
            ) from None

    def checkpoint_dir(self, checkpoint_id: int) -> str:
        return self.fs.join(self.job_dir, f"{CHECKPOINT_DIR_PREFIX}{checkpoint_id}")

    # ------------------------------------------------------------------ task side

    def write_state(
        self, checkpoint_id: int, data: bytes, target_location: str | None = None
    ) -> StreamStateHandle:
        """Store one subtask's state bytes for a checkpoint; inline when small.

        ``target_location`` (a savepoint's directory) replaces ``chk-N``, whether or not
        this storage is persistent. That directory is not created here: the JobMaster
        created it at the trigger, and a write that comes late, after a failed savepoint's
        directory was deleted, must fail rather than bring the directory back.
        """
        if len(data) <= self.inline_threshold or (target_location is None and not self.is_persistent):
            return ByteStreamStateHandle(uuid.uuid4().hex, data)
        if target_location is None:
            fs = self.fs
            directory = self.checkpoint_dir(checkpoint_id)
            self._mkdirs_once(directory)
        else:
            fs, directory = resolve(target_location, self.permissions, self.object_store)
        path = fs.join(directory, uuid.uuid4().hex)
        # referenced only once _metadata (atomic, last) is written
        _create_or_delete(fs, path, lambda: fs.write_new(path, data))
        return FileStateHandle(path, len(data), hashlib.sha256(data).hexdigest())

    def upload_file(
        self, checkpoint_id: int, local_path: str, shared: bool, target_location: str | None = None
    ) -> StreamStateHandle:
        """Copy a local file (an incremental snapshot's SST or metadata file) into storage.

        ``shared`` files go to ``<job dir>/shared/<uuid>``, always as files: later
        checkpoints reference them by path and the JobMaster's shared state registry deletes
        them once no retained checkpoint does. The others are exclusive to this checkpoint:
        inline when small, else in ``chk-N``, or in ``target_location`` (a savepoint's
        directory, which takes every file, shared or not, so it is self-contained). In-memory
        storage inlines everything (there is no directory), which also means nothing uploaded
        there can be referenced again.

        The file is streamed in chunks while its SHA-256 is computed; a failed copy deletes
        the partial file (nothing references it, and a late copy of a discarded checkpoint
        would otherwise leave it for good).
        """
        if target_location is None and not self.is_persistent:
            return self._inline_file(local_path)
        if shared and target_location is None:
            fs = self.fs
            directory = fs.join(self.job_dir, SHARED_DIR)
        elif os.path.getsize(local_path) <= self.inline_threshold:
            return self._inline_file(local_path)
        elif target_location is None:
            fs = self.fs
            directory = self.checkpoint_dir(checkpoint_id)
        else:
            # created by the JobMaster
            fs, directory = resolve(target_location, self.permissions, self.object_store)
        if target_location is None:
            self._mkdirs_once(directory)
        path = fs.join(directory, uuid.uuid4().hex)
        digest = hashlib.sha256()
        size = 0

        def chunks() -> Iterator[bytes]:
            nonlocal size
            with open(local_path, "rb") as source:
                while chunk := source.read(COPY_CHUNK_BYTES):
                    digest.update(chunk)  # releases the interpreter lock for large chunks
                    size += len(chunk)
                    yield chunk

        _create_or_delete(fs, path, lambda: fs.write_new_from(path, chunks()))
        return FileStateHandle(path, size, digest.hexdigest())

    @staticmethod
    def _inline_file(local_path: str) -> ByteStreamStateHandle:
        with open(local_path, "rb") as source:
            return ByteStreamStateHandle(uuid.uuid4().hex, source.read())

    def reader(self) -> StateReader:
        return StateReader(self)

    # ------------------------------------------------------------------ JobMaster side

    def init_savepoint_location(self, target_directory: str) -> str:
        """Create ``<target_directory>/savepoint-<job>-<random>/`` and return it (Flink's
        ``initializeLocationForSavepoint``); raises ``OSError``/``StorageError`` naming the
        directory if it cannot be created."""
        fs, base = resolve(target_directory, self.permissions, self.object_store)
        location = fs.join(base, f"{SAVEPOINT_DIR_PREFIX}{self.job_id[:6]}-{uuid.uuid4().hex[:12]}")
        fs.mkdirs(location)
        return location

    def write_metadata(
        self, checkpoint_id: int, data: bytes, target_location: str | None = None
    ) -> str | None:
        """Write ``chk-N/_metadata`` (or ``<target_location>/_metadata``) last and atomically;
        returns the external pointer (the snapshot's directory) or ``None`` for in-memory
        storage."""
        if target_location is not None:
            fs, directory = resolve(target_location, self.permissions, self.object_store)
        elif not self.is_persistent:
            return None
        else:
            fs = self.fs
            directory = self.checkpoint_dir(checkpoint_id)
            self._mkdirs_once(directory)
        fs.write_atomic(fs.join(directory, METADATA_FILE_NAME), data)
        return directory

    def discard_checkpoint(self, checkpoint_id: int, target_location: str | None = None) -> None:
        """Delete ``chk-N`` (or ``target_location``, a failed savepoint's directory) with
        everything in it (a subsumed or aborted checkpoint)."""
        if target_location is not None:
            try:
                fs, directory = resolve(target_location, options=self.object_store)
                fs.delete(directory, recursive=True)
            except (OSError, StorageError) as exc:
                log.warning("could not delete savepoint directory %s: %s", target_location, exc)
            return
        if not self.is_persistent:
            return
        directory = self.checkpoint_dir(checkpoint_id)
        self._made_dirs.discard(directory)
        try:
            self.fs.delete(directory, recursive=True)
        except OSError as exc:
            log.warning("could not delete checkpoint %d of job %s: %s", checkpoint_id, self.job_id, exc)

    def discard_handles(self, handles: Iterable[FileStateHandle]) -> None:
        """Delete state files that no checkpoint will reference (late or rejected acks)."""
        for handle in handles:
            try:
                # a savepoint's files may be outside this storage
                fs, path = resolve(handle.path, options=self.object_store)
                fs.delete(path)
            except OSError as exc:
                log.warning("could not delete state file %s: %s", handle.path, exc)

    def checkpoint_ids_on_disk(self) -> list[int]:
        """The ids of the ``chk-N`` directories in the job's directory (sorted)."""
        if not self.is_persistent:
            return []
        fs = self.fs
        if not fs.exists(self.job_dir):
            return []
        ids = []
        for name in fs.list_dir(self.job_dir):
            suffix = name.removeprefix(CHECKPOINT_DIR_PREFIX)
            if suffix != name and suffix.isdigit():
                ids.append(int(suffix))
        return sorted(ids)

    def discard_job_dir_if_empty(self) -> None:
        """Remove the job's directory when it holds no checkpoint anymore."""
        if not self.is_persistent:
            return
        fs = self.fs
        try:
            names = fs.list_dir(self.job_dir) if fs.exists(self.job_dir) else []
            if any(n.startswith(CHECKPOINT_DIR_PREFIX) for n in names):
                return
            for sub in (SHARED_DIR, TASK_OWNED_DIR):
                path = fs.join(self.job_dir, sub)
                if fs.exists(path) and not fs.list_dir(path):
                    fs.delete(path, recursive=True)
            if self.create_subdir and fs.exists(self.job_dir) and not fs.list_dir(self.job_dir):
                fs.delete(self.job_dir, recursive=True)
        except OSError as exc:
            log.debug("could not tidy %s: %s", self.job_dir, exc)


def is_inside(path: str, directory: str) -> bool:
    """Whether ``path`` lies under ``directory`` once both are normalised (``..`` resolved as
    text): what a deletion driven by a checkpoint's metadata is confined to."""
    norm_dir = posixpath.normpath(directory.rstrip("/") or "/")
    norm = posixpath.normpath(path)
    return norm != norm_dir and norm.startswith(norm_dir.rstrip("/") + "/")


def shared_dir_of(snapshot_dir: str) -> str:
    """The ``shared/`` of the job directory holding checkpoint directory ``snapshot_dir``."""
    parent = snapshot_dir.rstrip("/").rsplit("/", 1)[0]
    return f"{parent}/{SHARED_DIR}"


def _create_or_delete(fs: FileSystem, path: str, create: Callable[[], None]) -> None:
    """Run ``create`` (which writes the new file ``path``); if it fails, delete the part.

    Flink's stream deletes its file on failure too: a write that fails after its checkpoint
    was discarded (a late, cancelled attempt) would leave the part for good."""
    try:
        create()
    except BaseException:
        try:
            fs.delete(path)
        except OSError as exc:
            log.warning("could not delete the partial state file %s: %s", path, exc)
        raise


class StateReader:
    """Reads byte ranges of state handles, each file once, verified against its SHA-256."""

    def __init__(self, storage: CheckpointStorage | None = None) -> None:
        self._storage = storage
        self._object_store = storage.object_store if storage is not None else DEFAULT_OBJECT_STORE
        self._cache: dict[str, bytes] = {}

    def read(self, handle: StreamStateHandle, byte_range: Range) -> bytes:
        start, end = byte_range
        if isinstance(handle, ByteStreamStateHandle):
            return handle.data[start:end]
        if isinstance(handle, FileStateHandle):
            data = self._cache.get(handle.path)
            if data is None:
                data = self._cache[handle.path] = read_verified(handle, self._object_store)
            return data[start:end]
        raise TypeError(f"cannot read state handle {handle!r}")

    def copy_to(self, handle: StreamStateHandle, local_path: str) -> None:
        """Write the handle's content to the new file ``local_path``, streamed in chunks and
        verified: a missing file, or one whose size or SHA-256 differ from the checkpoint's
        record, raises :class:`InvalidCheckpointError` naming it (and leaves no local file)."""
        if isinstance(handle, ByteStreamStateHandle):
            with open(local_path, "xb") as out:
                out.write(handle.data)
            return
        if not isinstance(handle, FileStateHandle):
            raise TypeError(f"cannot copy state handle {handle!r}")
        fs, path = resolve(handle.path, options=self._object_store)
        digest = hashlib.sha256()
        size = 0
        out = open(local_path, "xb")  # closed below, deleted on failure
        try:
            with out:
                for chunk in fs.read_chunks(path, COPY_CHUNK_BYTES):
                    digest.update(chunk)
                    size += len(chunk)
                    if size > handle.size:  # never more than the checkpoint says it holds
                        raise _corrupt(handle)
                    out.write(chunk)
            if size != handle.size or digest.hexdigest() != handle.sha256:
                raise _corrupt(handle)
        except BaseException as exc:
            os.remove(local_path)
            if isinstance(exc, FileNotFoundError):
                raise _missing(handle) from None
            if isinstance(exc, NotARegularFileError):
                raise _not_a_file(handle, exc) from None
            if isinstance(exc, OSError):
                raise StorageError(f"cannot copy state file {handle.path} to {local_path}: {exc}") from None
            raise


def _missing(handle: FileStateHandle) -> InvalidCheckpointError:
    return InvalidCheckpointError(
        f"state file {handle.path} is missing: the checkpoint that references it was "
        "deleted or moved. Restore from another checkpoint."
    )


def _corrupt(handle: FileStateHandle) -> InvalidCheckpointError:
    return InvalidCheckpointError(
        f"state file {handle.path} is corrupt (size or checksum does not match the checkpoint "
        "metadata). Restore from another checkpoint."
    )


def _not_a_file(handle: FileStateHandle, exc: OSError) -> InvalidCheckpointError:
    return InvalidCheckpointError(
        f"state file {handle.path} is refused: {exc.strerror}. A checkpoint's state files are "
        "regular files; restore from another checkpoint."
    )


def read_verified(handle: FileStateHandle, object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE) -> bytes:
    """The bytes of a state file, refused unless size and SHA-256 match the checkpoint's record.

    Its size is checked before it is read (a file larger than recorded is never read into
    memory), and only a regular file is read (a FIFO would block the task for ever)."""
    fs, path = resolve(handle.path, options=object_store)
    try:
        if fs.size(path) != handle.size:
            raise _corrupt(handle)
        data = fs.read(path)
    except FileNotFoundError:
        raise _missing(handle) from None
    except NotARegularFileError as exc:
        raise _not_a_file(handle, exc) from None
    except OSError as exc:
        raise StorageError(f"cannot read state file {handle.path}: {exc}") from None
    if len(data) != handle.size or hashlib.sha256(data).hexdigest() != handle.sha256:
        raise _corrupt(handle)
    return data
