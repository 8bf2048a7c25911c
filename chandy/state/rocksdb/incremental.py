"""Native RocksDB snapshots: incremental checkpoints of the database's own files, and their restore.

Flink's ``RocksIncrementalSnapshotStrategy`` and ``RocksDBIncrementalRestoreOperation``.

**Snapshot.** The synchronous part (task thread, at the barrier, after the backend flushed
its cache) is a RocksDB checkpoint: ``Checkpoint(db).create_checkpoint`` into
``<work_dir>/chk-<id>``, which hard-links the live SST files and copies the few small
metadata files, in milliseconds whatever the size of the state. Nothing is left to
serialize. The asynchronous part (checkpoint I/O pool) uploads the directory:

- SST files are immutable and RocksDB never reuses a file name, so a name identifies its
  content for the life of the database. Every SST file that the base checkpoint (below)
  already holds is referenced again (its handle), every other one is uploaded once into
  the storage's ``shared/`` directory. After a checkpoint of 1 M keys,
  updating 1% of them adds one small SST file (and whatever compaction rewrote): that is
  all the next checkpoint uploads.
- ``MANIFEST-*``, ``CURRENT``, ``OPTIONS-*`` (and rocksdict's ``rocksdict-config.json``)
  change with every checkpoint: they are private, exclusive to the checkpoint (in its
  ``chk-N`` directory, or inline when small).

Only the files of the checkpoint the barrier names as the base are reused
(``CheckpointOptions.base_checkpoint_id``: the coordinator's latest completed checkpoint
when it triggered this one; the coordinator keeps the base's files until the checkpoint
naming it completes or aborts). A file of a checkpoint that never completed may be deleted
with it; and the last checkpoint this task *heard* completed is no base either: the notice
is an RPC, which the barrier can overtake in the data channels, so that checkpoint may
already be subsumed by one the task has not heard of, its files deleted. So every
checkpoint's uploads are remembered by id when its write finishes; a snapshot with base B
reuses exactly B's (B completed: the coordinator said so) or, if this snapshotter holds
none of B (a savepoint, or B predates a restore), uploads every file. Entries older than
B are forgotten, and so are those older than a checkpoint
:meth:`NativeSnapshotter.notify_checkpoint_complete` confirms, and an aborted
checkpoint's. A caller that names no base (a backend driven outside a job) gets the last
checkpoint confirmed by ``notify_checkpoint_complete`` (Flink's ``uploadedSstFiles``).

A NATIVE savepoint (a ``target_location``) or a non-incremental native snapshot copies
every file into its own location and shares nothing: a savepoint must be self-contained.
In-memory checkpoint storage inlines every file and nothing is reused: a reused inline
handle would keep the bytes of every SST file alive in the task as well as in the
JobMaster.

**Restore.** Every file of a handle is downloaded (streamed, SHA-256 verified) into a
directory laid out as the database was. One handle of exactly this backend's key-group
range *is* the database: it is moved into place and opened. After rescaling, the handle
that overlaps the new range most is the base: opened in place and clipped to the range
with two range deletes; the overlapping key groups of every other handle are then copied
in (one contiguous scan each, thanks to the key-group prefix), catalogues merged.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence

from rocksdict import AccessType, Checkpoint, Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from chandy.errors import InvalidCheckpointError
from chandy.state.backend import (
    LAST_CONFIRMED,
    BaseCheckpoint,
    StateFileReader,
    StateWriter,
    WrittenKeyedState,
)
from chandy.state.handles import FileStateHandle, IncrementalKeyedStateHandle, StreamStateHandle
from chandy.state.key_groups import KeyGroupRange
from chandy.state.rocksdb.in_flight import InFlightResults
from chandy.state.rocksdb.layout import (
    KEY_GROUP_BYTES,
    META_COLUMN_FAMILY,
    key_group_range_bounds,
    parse_catalogue_entry,
)

log = logging.getLogger(__name__)

SST_SUFFIX = ".sst"
#: Entries per write batch when a restore after rescaling copies key groups in.
COPY_BATCH_ENTRIES = 20_000
#: Above every key of the layout (the largest key group is far below 0xffff).
_END_OF_KEYS = b"\xff" * (KEY_GROUP_BYTES + 1)


class NativeSnapshotter:
    """Takes the native snapshots of one backend instance and remembers, per checkpoint,
    which SST files it holds in storage (see the module docstring).

    ``take`` runs on the task thread, the writes on the checkpoint I/O pool, the
    notifications on the task thread again: the upload bookkeeping is under a lock.
    """

    def __init__(
        self,
        backend_id: str,
        key_group_range: KeyGroupRange,
        work_dir: str,
        in_flight: InFlightResults | None = None,
    ) -> None:
        self.backend_id = backend_id
        #: Counts the results still uploading (the backend's directory waits for them).
        self.in_flight = in_flight if in_flight is not None else InFlightResults()
        self.key_group_range = key_group_range
        self.work_dir = work_dir
        os.makedirs(work_dir, exist_ok=True)
        self._lock = threading.Lock()
        #: checkpoint id -> (SST name -> shared handle) of recent checkpoints written: the
        #: bases later barriers may name.
        self._written: dict[int, dict[str, StreamStateHandle]] = {}
        #: Checkpoints below this one are forgotten: no later barrier names them as base.
        self._oldest_base = -1
        #: The SST files of the last checkpoint confirmed complete: the base of a snapshot
        #: whose caller names none.
        self._confirmed: dict[str, StreamStateHandle] = {}
        self._last_completed_id = -1
        #: Checkpoints aborted while (or before) their files were uploaded: the upload stops.
        self._aborted: set[int] = set()

    def take(
        self,
        db: Rdict,
        checkpoint_id: int,
        state_kinds: Iterable[tuple[str, str]] | Mapping[str, str],
        *,
        incremental: bool,
        base_checkpoint_id: BaseCheckpoint = LAST_CONFIRMED,
    ) -> NativeSnapshot:
        """The synchronous part: a RocksDB checkpoint (hard links) of ``db``, whose cache the
        backend has flushed. ``incremental`` false makes every file this checkpoint's own;
        otherwise the files of ``base_checkpoint_id`` (the barrier's base; ``None``: there is
        none) are referenced, every other file is uploaded."""
        directory = os.path.join(self.work_dir, f"chk-{checkpoint_id}")
        shutil.rmtree(directory, ignore_errors=True)  # a leftover of a snapshot never written
        started = time.monotonic_ns()
        checkpoint = Checkpoint(db)
        try:
            checkpoint.create_checkpoint(directory)
        finally:
            del checkpoint
        with self._lock:
            previous = self._files_of(base_checkpoint_id, checkpoint_id) if incremental else {}
        kinds = state_kinds.items() if isinstance(state_kinds, Mapping) else state_kinds
        log.debug(
            "native snapshot %d of backend %s taken in %.1f ms",
            checkpoint_id,
            self.backend_id,
            (time.monotonic_ns() - started) / 1e6,
        )
        return NativeSnapshot(
            NativeSnapshotResult(
                self,
                checkpoint_id,
                directory,
                previous,
                tuple(sorted(kinds)),
                incremental,
                self.in_flight.started(),
            )
        )

    def _files_of(self, base: BaseCheckpoint, checkpoint_id: int) -> dict[str, StreamStateHandle]:
        """What a snapshot with base ``base`` may reference (under the lock); forgets the
        checkpoints older than the base."""
        if base is LAST_CONFIRMED:
            return dict(self._confirmed)
        if base is None:
            return {}
        self._forget_before(base)
        files = self._written.get(base)
        if files is None:
            log.debug(
                "native snapshot %d of backend %s: no files of its base checkpoint %d here, every "
                "file is uploaded",
                checkpoint_id,
                self.backend_id,
                base,
            )
            return {}
        return dict(files)

    def _forget_before(self, checkpoint_id: int) -> None:
        self._oldest_base = max(self._oldest_base, checkpoint_id)
        for written_id in [i for i in self._written if i < checkpoint_id]:
            del self._written[written_id]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: the checkpoints before it are forgotten
        (barriers triggered from now on name it or a later one as base), and it is the base
        of snapshots whose caller names none (a later checkpoint of this backend that
        completed first wins; earlier pending ones are subsumed and will never complete)."""
        with self._lock:
            files = self._written.get(checkpoint_id)
            if files is not None and checkpoint_id > self._last_completed_id:
                self._confirmed = files
                self._last_completed_id = checkpoint_id
            self._forget_before(checkpoint_id)
            self._aborted = {i for i in self._aborted if i > checkpoint_id}

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete: its uploads are never referenced
        (the JobMaster deletes them with it), an upload still running stops."""
        with self._lock:
            self._written.pop(checkpoint_id, None)
            if checkpoint_id > self._last_completed_id:
                self._aborted.add(checkpoint_id)

    def confirmed_files(self) -> dict[str, StreamStateHandle]:
        """The SST files (local name -> handle) of the last checkpoint confirmed complete: what
        a snapshot whose caller names no base references."""
        with self._lock:
            return dict(self._confirmed)

    def remembered_checkpoints(self) -> list[int]:
        """The checkpoints whose files a later snapshot may still reference (oldest first)."""
        with self._lock:
            return sorted(self._written)

    def close(self) -> None:
        """Forget everything and delete the work directory. (The backend calls it once no
        snapshot is on its way to storage: a disposed backend's directory stays until the
        ``chk-*`` directories of its uploads are gone, which each result deletes when written,
        failed or dropped.)"""
        with self._lock:
            self._written.clear()
            self._confirmed = {}
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def _record(self, checkpoint_id: int, files: dict[str, StreamStateHandle]) -> None:
        with self._lock:
            if checkpoint_id >= self._oldest_base and checkpoint_id not in self._aborted:
                self._written[checkpoint_id] = files

    def _check_not_aborted(self, checkpoint_id: int) -> None:
        with self._lock:
            aborted = checkpoint_id in self._aborted
        if aborted:
            raise CheckpointAbortedDuringUpload(
                f"checkpoint {checkpoint_id} was aborted while the files of its RocksDB snapshot "
                "were being uploaded"
            )


class CheckpointAbortedDuringUpload(Exception):
    """The upload of a native snapshot stopped: its checkpoint was aborted meanwhile."""


class NativeSnapshotResult:
    """A RocksDB checkpoint directory waiting to be uploaded; owns the directory and deletes
    it once written (or failed, or discarded)."""

    def __init__(
        self,
        snapshotter: NativeSnapshotter,
        checkpoint_id: int,
        directory: str,
        previous: dict[str, StreamStateHandle],
        state_kinds: tuple[tuple[str, str], ...],
        incremental: bool,
        ended: Callable[[], None] = lambda: None,
    ) -> None:
        self._snapshotter = snapshotter
        self.checkpoint_id = checkpoint_id
        self.directory = directory
        self._previous = previous
        self._state_kinds = state_kinds
        self._incremental = incremental
        # A result dropped unwritten still deletes its directory: its hard links keep SST
        # files on disk that the database itself has long compacted away.
        self._delete_directory = weakref.finalize(self, _delete_then, directory, ended)

    def write(
        self, writer: StateWriter, checkpoint_id: int, target_location: str | None
    ) -> WrittenKeyedState:
        """Upload the SST files the base checkpoint does not hold (into ``shared/``), reference
        the others, store the metadata files privately; one
        :class:`IncrementalKeyedStateHandle`. A savepoint (``target_location``) or a
        non-incremental snapshot stores every file in its own location."""
        own_location = target_location is not None or not self._incremental
        previous = {} if own_location else self._previous
        snapshotter = self._snapshotter
        shared: list[tuple[str, StreamStateHandle]] = []
        private: list[tuple[str, StreamStateHandle]] = []
        uploaded: set[str] = set()
        written: list[FileStateHandle] = []
        checkpointed_size = state_size = 0
        try:
            for name in sorted(os.listdir(self.directory)):
                snapshotter._check_not_aborted(checkpoint_id)
                path = os.path.join(self.directory, name)
                size = os.path.getsize(path)
                state_size += size
                if name.endswith(SST_SUFFIX) and not own_location:
                    reused = previous.get(name)
                    if reused is not None:
                        shared.append((name, reused))
                        continue
                    handle = writer.upload_file(checkpoint_id, path, True)
                    shared.append((name, handle))
                    uploaded.add(name)
                else:
                    handle = writer.upload_file(checkpoint_id, path, False, target_location)
                    private.append((name, handle))
                checkpointed_size += size
                if isinstance(handle, FileStateHandle):
                    written.append(handle)
        except BaseException:
            writer.discard_handles(written)
            raise
        finally:
            self.discard()
        if not own_location:
            # Only files in storage are reused: an inline one (in-memory storage) would keep
            # its bytes alive here too.
            snapshotter._record(
                checkpoint_id, {name: h for name, h in shared if isinstance(h, FileStateHandle)}
            )
        keyed = IncrementalKeyedStateHandle(
            snapshotter.key_group_range,
            snapshotter.backend_id,
            checkpoint_id,
            tuple(shared),
            tuple(private),
            frozenset(uploaded),
            self._state_kinds,
        )
        log.debug(
            "native snapshot %d: %d of %d SST files uploaded, %d of %d bytes",
            checkpoint_id,
            len(uploaded),
            len(shared),
            checkpointed_size,
            state_size,
        )
        return WrittenKeyedState((keyed,), written, checkpointed_size, state_size)

    def discard(self) -> None:
        """Delete the local checkpoint directory (its hard links keep SST files alive)."""
        self._delete_directory()


def _delete_then(directory: str, ended: Callable[[], None]) -> None:
    try:
        shutil.rmtree(directory, ignore_errors=True)
    finally:
        ended()


class NativeSnapshot:
    """The synchronous part of a native snapshot: nothing to serialize, the directory is ready.

    The coordinator releases a snapshot once its serializer's result is taken, before the
    result is written: from then on the result owns the directory (and deletes it after the
    upload, or when dropped unwritten). A snapshot released without its result taken (the task
    ended first) deletes it.
    """

    def __init__(self, result: NativeSnapshotResult) -> None:
        self._result = result
        self._result_taken = False

    @property
    def is_empty(self) -> bool:
        return False  # a database always has files, even without entries

    def serializer(self) -> _WrittenByTheDatabase:
        return _WrittenByTheDatabase(self)

    def release(self) -> None:
        if not self._result_taken:
            self._result.discard()


class _WrittenByTheDatabase:
    """RocksDB wrote the snapshot's files already: done from the start."""

    done = True

    def __init__(self, snapshot: NativeSnapshot) -> None:
        self._snapshot = snapshot

    def step(self, deadline_ns: int | None) -> bool:
        return True

    def result(self) -> NativeSnapshotResult:
        self._snapshot._result_taken = True
        return self._snapshot._result


# ---------------------------------------------------------------------------------- restore


def restore_native(
    handles: Sequence[IncrementalKeyedStateHandle],
    key_group_range: KeyGroupRange,
    db_path: str,
    work_dir: str,
    reader: StateFileReader,
    open_db: Callable[[str], Rdict],
) -> Rdict:
    """Build the database of ``key_group_range`` at ``db_path`` from native snapshots and
    return it opened with ``open_db`` (see the module docstring). Whatever is at ``db_path``
    is replaced (the caller has closed it). A missing or corrupt file raises
    :class:`InvalidCheckpointError` naming it; downloads are deleted in every case."""
    overlapping = [
        (handle.key_group_range.intersection(key_group_range).number_of_key_groups, index, handle)
        for index, handle in enumerate(handles)
    ]
    overlapping = [entry for entry in overlapping if entry[0] > 0]
    if os.path.lexists(db_path):
        shutil.rmtree(db_path)
    if not overlapping:
        return open_db(db_path)
    started = time.monotonic()
    os.makedirs(work_dir, exist_ok=True)
    downloads = tempfile.mkdtemp(prefix="restore-", dir=work_dir)
    try:
        _, _, base = max(overlapping, key=lambda entry: (entry[0], -entry[1]))
        base_dir = os.path.join(downloads, "base")
        _download(base, base_dir, reader)
        shutil.move(base_dir, db_path)
        db = open_db(db_path)
        try:
            if base.key_group_range != key_group_range:
                _clip(db, key_group_range)
            for _, index, handle in overlapping:
                if handle is not base:
                    part_dir = os.path.join(downloads, f"part-{index}")
                    _download(handle, part_dir, reader)
                    _copy_in(part_dir, handle, db, key_group_range)
                    shutil.rmtree(part_dir, ignore_errors=True)
        except BaseException:
            db.close()
            raise
    finally:
        shutil.rmtree(downloads, ignore_errors=True)
    log.info(
        "restored key groups %s from %d native snapshot(s) (base: key groups %s of checkpoint %d) in %.2f s",
        key_group_range,
        len(overlapping),
        base.key_group_range,
        base.checkpoint_id,
        time.monotonic() - started,
    )
    return db


def _download(handle: IncrementalKeyedStateHandle, directory: str, reader: StateFileReader) -> None:
    """Lay out the handle's files in ``directory`` under their names in the database."""
    os.makedirs(directory)
    for name, file in (*handle.shared, *handle.private):
        if not name or name in (".", "..") or os.path.basename(name) != name:
            raise InvalidCheckpointError(
                f"the native snapshot of key groups {handle.key_group_range} (checkpoint "
                f"{handle.checkpoint_id}) names a file '{name}' that is not a plain file name: "
                "its metadata is corrupt. Restore from another checkpoint."
            )
        reader.copy_to(file, os.path.join(directory, name))


def _clip(db: Rdict, key_group_range: KeyGroupRange) -> None:
    """Hide every entry outside ``key_group_range`` with two range deletes (what another
    subtask owns now; compaction drops them)."""
    lower, upper = key_group_range_bounds(key_group_range.start, key_group_range.end)
    options = _no_wal()
    if lower:
        db.delete_range(b"", lower, options)
    if upper < _END_OF_KEYS:
        db.delete_range(upper, _END_OF_KEYS, options)


def _copy_in(
    directory: str, handle: IncrementalKeyedStateHandle, db: Rdict, key_group_range: KeyGroupRange
) -> None:
    """Copy the entries of the key groups that ``handle`` and ``key_group_range`` share from
    the database in ``directory`` into ``db``, and its catalogue."""
    common = handle.key_group_range.intersection(key_group_range)
    lower, upper = key_group_range_bounds(common.start, common.end)
    source = Rdict(directory, Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        _merge_catalogue(source, db, handle)
        read_options = ReadOptions()
        read_options.set_iterate_lower_bound(lower)
        read_options.set_iterate_upper_bound(upper)
        write_options = _no_wal()
        batch = WriteBatch(raw_mode=True)
        for key, value in source.items(from_key=lower, read_opt=read_options):
            batch.put(key, value)
            if batch.len() >= COPY_BATCH_ENTRIES:
                db.write(batch, write_options)
                batch = WriteBatch(raw_mode=True)
        if not batch.is_empty():
            db.write(batch, write_options)
    finally:
        source.close()


def _merge_catalogue(source: Rdict, db: Rdict, handle: IncrementalKeyedStateHandle) -> None:
    """Add ``source``'s states to ``db``'s catalogue; the same name must be the same kind
    (a type recorded by either is kept)."""
    target_meta = db.get_column_family(META_COLUMN_FAMILY)
    source_meta = source.get_column_family(META_COLUMN_FAMILY)
    try:
        for name, entry in source_meta.items():
            existing = target_meta.get(name)
            if existing is None:
                target_meta.put(name, entry)
                continue
            kind, spec = parse_catalogue_entry(entry)
            known_kind, known_spec = parse_catalogue_entry(existing)
            if known_kind != kind:
                raise InvalidCheckpointError(
                    f"state '{_text(name)}' is {kind} state in the native "
                    f"snapshot of key groups {handle.key_group_range} (checkpoint "
                    f"{handle.checkpoint_id}) but {known_kind} state in another "
                    "subtask's snapshot restored with it: the snapshots do not belong together. "
                    "Restore from another checkpoint."
                )
            if known_spec is None and spec is not None:
                target_meta.put(name, entry)
    finally:
        del source_meta, target_meta


def _text(raw: object) -> str:
    """A catalogue entry (raw mode: bytes) as text."""
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


def _no_wal() -> WriteOptions:
    options = WriteOptions()
    # The checkpoints are the durability. (rocksdict's stub declares a method; it is a property.)
    options.disable_wal = True  # type: ignore[method-assign, assignment]
    return options
