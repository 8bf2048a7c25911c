"""The canonical (backend-independent) snapshot format, read from and written into RocksDB.

Canonical is exactly what :meth:`HeapKeyedStateBackend.snapshot` writes: per key group
each state's ``{table key: value}`` (:mod:`chandy.state.key_group_format`: typed states as
data, the others pickled), map state as ``{table key: {map key: value}}``, timers as
``{(timestamp, key, namespace): None}``, entries of TTL state that had expired at the
barrier left out. So a heap backend
restores what :class:`CanonicalSnapshot` wrote, :func:`restore_canonical` restores what
the heap wrote, and a savepoint in the CANONICAL format moves a job between backends.
It is also every checkpoint of the RocksDB backend when incremental checkpoints are off.

Why one RocksDB iterator, created at the barrier, and not the RocksDB snapshot the backend
passes in: rocksdict (0.3.29) sets the snapshot on read options that ``Snapshot.iter`` then
throws away, so iterating a ``Snapshot`` reads the live database, records written after
the barrier included. A RocksDB iterator, though, reads the database as it was when the
iterator was created (its implicit snapshot pins the memtables and files of that moment,
across later writes, flushes and compactions). The layout puts the key group first, so
the backend's whole range is one ordered scan, and one iterator is all a snapshot needs:
the serializer pulls entries from it in bounded steps while the task writes new ones.

Memory: a canonical snapshot is as big as the state, which on RocksDB may be many times the
slot's memory budget. So the serializer keeps the key groups' pickles in memory only up to
:data:`SPILL_THRESHOLD_BYTES` and then appends them to a local file in the backend's work
directory, which the checkpoint I/O pool streams into storage (``StateWriter.upload_file``)
and deletes; and a restore copies each file to a local one (``StateFileReader.copy_to``,
streamed and verified against the checkpoint's SHA-256 before any byte is used) and reads
one key group's range at a time from it. Neither ever holds more than one key group.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any, cast

from rocksdict import Options, Rdict, ReadOptions, Snapshot, WriteBatch, WriteOptions

from chandy.state.backend import StateFileReader, StateWriter, WrittenKeyedState
from chandy.state.codec import decode_from, encode, encode_key
from chandy.state.handles import FileStateHandle, KeyGroupsStateHandle, Range, StreamStateHandle
from chandy.state.heap import (
    TIMERS_KIND,
    IncompatibleRestoredStateError,
    KeyGroupPayload,
    SerializedKeyedState,
    unexpired,
)
from chandy.state.key_group_format import read_key_group
from chandy.state.key_groups import KeyGroupRange
from chandy.state.rocksdb.in_flight import InFlightResults
from chandy.state.rocksdb.layout import (
    KEY_GROUP_BYTES,
    MAP_KINDS,
    META_COLUMN_FAMILY,
    PREFIX_BYTES,
    catalogue_entry,
    key_group_of,
    key_group_prefix,
    parse_catalogue_entry,
    state_id,
    table_prefix,
)
from chandy.state.typed import StateSerializer, state_serializer, type_of_spec
from chandy.state.unpickling import DEFAULT_POLICY, UnpicklingPolicy

log = logging.getLogger(__name__)

#: A serializer keeps its pickles in memory up to this many bytes, then spills them to a
#: local file: small snapshots (and the inline ones among them) never touch the disk.
SPILL_THRESHOLD_BYTES = 1 << 20

#: How many entries a serializer step handles between two looks at the clock.
_ENTRIES_PER_CLOCK_CHECK = 64
#: A restore writes a WriteBatch once it holds this many entries (bounded memory: a
#: batch of a million entries would hold a second copy of a big key group).
RESTORE_BATCH_ENTRIES = 16_384
#: ... or about this many bytes, estimated from the key group's pickle: 16,384 values of
#: 4 KB made batches of 64 MB, whose buffer doubled as it grew (128 MB) and then went into a
#: memtable whole, far past the write buffer manager's share of a small budget.
RESTORE_BATCH_BYTES = 1 << 20

_PLAIN, _MAP, _TIMERS, _END = 0, 1, 2, 3


def _mode(kind: str) -> int:
    if kind in MAP_KINDS:
        return _MAP
    return _TIMERS if kind == TIMERS_KIND else _PLAIN


class CanonicalSnapshot:
    """The synchronous part of a canonical snapshot of a RocksDB database (at the barrier).

    ``catalogue`` is every state of the database, name -> kind; ``expiring`` the expiry
    filters of its TTL states (``expire(value, now_ms)``: the unexpired part or ``None``),
    applied at ``now_ms``, the barrier's time; ``serializers`` write its typed states;
    ``decode_at`` reads the database's bytes (the backend's: restricted after a native
    restore). The RocksDB iterator that serializes it is
    created here, so the snapshot sees the database as it is now, whatever is written
    after (see the module's docstring); ``rocksdb_snapshot`` is kept until :meth:`release`.
    """

    def __init__(
        self,
        db: Rdict,
        rocksdb_snapshot: Snapshot | None,
        key_group_range: KeyGroupRange,
        catalogue: dict[str, str],
        expiring: dict[str, Callable[[Any, int], Any]],
        now_ms: int,
        work_dir: str | None = None,
        in_flight: InFlightResults | None = None,
        serializers: dict[str, StateSerializer] | None = None,
        decode_at: Callable[[bytes, int], tuple[Any, int]] = decode_from,
    ) -> None:
        self.key_group_range = key_group_range
        self._work_dir = work_dir
        self._in_flight = in_flight
        self._serializers = dict(serializers or {})
        self._decode_at = decode_at
        self._rocksdb_snapshot = rocksdb_snapshot
        self._catalogue = dict(catalogue)
        self._expiring = dict(expiring)
        self._now_ms = now_ms
        # No iterate bounds: RocksDB reads them from the ReadOptions object, which rocksdict's
        # iterator does not keep alive (freed, a bound is garbage and the scan runs on). The
        # iterator seeks to the range's first key and the serializer stops at the first key
        # after the range instead. A bulk scan leaves the block cache to the task's reads. No
        # explicit readahead: RocksDB's own (growing to 256 KB) is as fast here, and 2 MB a
        # file, for each SST file the scan reads, took 40 MB outside the budget (312 MB of state).
        read_options = ReadOptions()
        read_options.fill_cache(False)  # type: ignore[call-arg]  # the stub forgets the argument
        lower = key_group_prefix(key_group_range.start)
        items = cast(  # raw mode: bytes
            "Iterator[tuple[bytes, bytes]]", db.items(from_key=lower, read_opt=read_options)
        )
        first = next(items, None)
        if first is not None and key_group_of(first[0]) > key_group_range.end:
            first, items = None, iter(())  # nothing in the range
        self._first: tuple[bytes, bytes] | None = first
        self._items: Iterator[tuple[bytes, bytes]] | None = items
        self._serializer: CanonicalSerializer | None = None

    @property
    def is_empty(self) -> bool:
        """True if the range held no entry at the barrier."""
        return self._first is None

    def serializer(self) -> CanonicalSerializer:
        """The serializer of this snapshot (one per snapshot: it consumes the iterator)."""
        if self._serializer is None:
            items = self._items
            if items is None:
                raise RuntimeError("the canonical snapshot was released; take a new snapshot")
            self._serializer = CanonicalSerializer(
                self.key_group_range,
                self._first,
                items,
                self._catalogue,
                self._expiring,
                self._now_ms,
                self._work_dir,
                self._in_flight,
                self._serializers,
                self._decode_at,
            )
        return self._serializer

    def serialize(self) -> SerializedKeyedState | SpilledKeyedState:
        """Serialize every key group at once (as :meth:`HeapSnapshot.serialize`)."""
        serializer = self.serializer()
        serializer.step(None)
        return serializer.result()

    def release(self) -> None:
        """Drop the iterator and the RocksDB snapshot: both pin the memtables and files of
        the barrier, and an open iterator keeps the database open too."""
        self._items = None
        self._first = None
        self._rocksdb_snapshot = None
        serializer, self._serializer = self._serializer, None
        if serializer is not None:
            serializer._release()


class CanonicalSerializer:
    """Reads a :class:`CanonicalSnapshot` key group by key group into the heap's format,
    in steps of bounded duration (as :class:`chandy.state.heap.KeyGroupSerializer`).

    A key group is assembled across steps if it is too big for one: the clock is
    checked every few hundred entries, not only between key groups, because decoding
    from RocksDB costs a Python call per key where the heap pickles a whole dictionary
    at C speed.

    The pickles go to a :class:`_Spill` (in memory while small, then a local file in
    ``work_dir``, the temporary directory if ``None``), counted in ``in_flight`` (the
    backend's: a disposed backend keeps its directory until the file is gone) while it exists.
    """

    def __init__(
        self,
        key_group_range: KeyGroupRange,
        first: tuple[bytes, bytes] | None,
        items: Iterator[tuple[bytes, bytes]],
        catalogue: dict[str, str],
        expiring: dict[str, Callable[[Any, int], Any]],
        now_ms: int,
        work_dir: str | None = None,
        in_flight: InFlightResults | None = None,
        serializers: dict[str, StateSerializer] | None = None,
        decode_at: Callable[[bytes, int], tuple[Any, int]] = decode_from,
    ) -> None:
        self.key_group_range = key_group_range
        self._decode_at = decode_at
        self._items: Iterator[tuple[bytes, bytes]] | None = (
            items if first is None else itertools.chain((first,), items)
        )
        #: state id -> (name, kind, mode)
        self._states = {state_id(name): (name, kind, _mode(kind)) for name, kind in catalogue.items()}
        if len(self._states) < len(catalogue):
            by_id: dict[bytes, list[str]] = {}
            for name in catalogue:
                by_id.setdefault(state_id(name), []).append(name)
            clashes = [sorted(names) for names in by_id.values() if len(names) > 1]
            raise ValueError(
                f"states {clashes} share a RocksDB state id (a hash collision of their names), "
                "so their entries cannot be told apart: rename one state of each group"
            )
        self._order = {name: i for i, name in enumerate(catalogue)}
        self._state_kinds = tuple(sorted(catalogue.items()))
        self._expiring = expiring
        self._now_ms = now_ms
        self._spill: _Spill | None = _Spill(work_dir, in_flight)
        self._payload = KeyGroupPayload(self._spill.append, serializers)
        #: The key group being assembled (-1: none yet) and its tables so far, by name.
        self._key_group = -1
        self._group: dict[str, tuple[str, dict[Any, Any]]] = {}
        #: The 6-byte prefix (key group, state) of the entries being read, and where they go.
        self._prefix: bytes | None = None
        self._target: dict[Any, Any] = {}
        self._mode = _PLAIN
        #: The key prefix of the map being read (key group, state, table key) and its entries.
        self._map_prefix: bytes | None = None
        self._entries: dict[Any, Any] = {}
        self.done = False

    def step(self, deadline_ns: int | None) -> bool:
        """Serialize entries until ``deadline_ns`` (monotonic) passes; True when done."""
        if self.done:
            return True
        items = self._items
        if items is None:
            raise RuntimeError("the canonical snapshot was released before it was serialized")
        prefix, target, mode = self._prefix, self._target, self._mode
        map_prefix, entries = self._map_prefix, self._entries
        countdown = _ENTRIES_PER_CLOCK_CHECK
        # The hot loop: the decoder from a local, and values decoded with ``decode_from`` (one
        # call each instead of ``decode``'s two; RocksDB's checksums guard the bytes).
        decode_at, start = self._decode_at, PREFIX_BYTES
        for key, value in items:
            if prefix is None or not key.startswith(prefix):
                prefix = key[:start]
                target, mode = self._switch(prefix)
            if mode == _PLAIN:
                target[decode_at(key, start)[0]] = decode_at(value, 0)[0]
            elif mode == _MAP:
                # A map's entries are contiguous and its key's encoding is prefix-free: the
                # table key is decoded once per map, not once per entry.
                if map_prefix is not None and key.startswith(map_prefix):
                    end = len(map_prefix)
                else:
                    table_key, end = decode_at(key, start)
                    map_prefix = key[:end]
                    entries = target.setdefault(table_key, {})
                entries[decode_at(key, end)[0]] = decode_at(value, 0)[0]
            elif mode == _TIMERS:
                target[decode_at(key, start)[0]] = None
            else:  # the first key after the range
                break
            countdown -= 1
            if countdown == 0:
                countdown = _ENTRIES_PER_CLOCK_CHECK
                if deadline_ns is not None and time.monotonic_ns() >= deadline_ns:
                    self._prefix, self._target, self._mode = prefix, target, mode
                    self._map_prefix, self._entries = map_prefix, entries
                    return False
        if self._key_group >= 0:
            self._finish_key_group()
        self._empty_key_groups_until(self.key_group_range.end + 1)
        self._items = None
        self.done = True
        return True

    def _switch(self, prefix: bytes) -> tuple[dict[Any, Any], int]:
        """Entries of another state (or key group) begin: where they go, and how."""
        key_group = int.from_bytes(prefix[:KEY_GROUP_BYTES], "big")
        if key_group > self.key_group_range.end:
            return self._target, _END
        if key_group != self._key_group:
            if self._key_group >= 0:
                self._finish_key_group()
            self._empty_key_groups_until(key_group)
            self._key_group = key_group
        state = self._states.get(prefix[KEY_GROUP_BYTES:])
        if state is None:
            raise ValueError(
                f"key group {key_group} of the RocksDB database holds entries of a state that is "
                f"not in its catalogue (state id {prefix[KEY_GROUP_BYTES:].hex()}): the database "
                "is corrupt or was written by another program; restore from another checkpoint"
            )
        name, kind, mode = state
        table = self._group.get(name)
        if table is None:
            table = self._group[name] = (kind, {})
        return table[1], mode

    def _empty_key_groups_until(self, key_group: int) -> None:
        """Record the key groups before ``key_group`` not yet recorded as empty."""
        self._payload.add_empty(key_group - self.key_group_range.start - len(self._payload))

    def _finish_key_group(self) -> None:
        group = self._group
        if self._expiring:
            group = unexpired(group, self._expiring, self._now_ms)
        if len(group) > 1:  # the heap's order: the states' order, not their ids'
            order = self._order
            group = dict(sorted(group.items(), key=lambda item: order[item[0]]))
        self._payload.add(group)
        self._group = {}

    def _release(self) -> None:
        """The snapshot is released: a spill file no result took is deleted now (a result
        that took it deletes it once written)."""
        self._items = None
        spill, self._spill = self._spill, None
        if spill is not None:
            spill.discard()

    def result(self) -> SerializedKeyedState | SpilledKeyedState:
        """The pickles, in memory if small, else the spill file (whose ownership passes to
        the result: it deletes the file once written, or failed, or garbage)."""
        if not self.done:
            raise RuntimeError("serialization is not finished")
        spill, self._spill = self._spill, None
        if spill is None:
            raise RuntimeError("the result of a canonical snapshot is taken once, before its release")
        return spill.result(self.key_group_range, self._payload.ranges, self._state_kinds)


class _Spill:
    """Where a serializer's pickles go: a list in memory up to :data:`SPILL_THRESHOLD_BYTES`,
    then a new local file in ``work_dir`` that every later pickle is appended to."""

    def __init__(self, work_dir: str | None, in_flight: InFlightResults | None) -> None:
        self._work_dir = work_dir
        self._in_flight = in_flight
        self._parts: list[bytes] = []
        self._size = 0
        self._file: IO[bytes] | None = None
        self._path: str | None = None
        #: Ends this spill file's count in ``in_flight`` (once it is deleted).
        self._ended: Callable[[], None] = _nothing

    def append(self, blob: bytes) -> None:
        if self._file is not None:
            self._file.write(blob)
            return
        self._parts.append(blob)
        self._size += len(blob)
        if self._size > SPILL_THRESHOLD_BYTES:
            if self._in_flight is not None:
                self._ended = self._in_flight.started()
            fd, self._path = tempfile.mkstemp(prefix="canonical-", suffix=".spill", dir=self._work_dir)
            self._file = os.fdopen(fd, "wb")
            self._file.writelines(self._parts)
            self._parts = []

    def result(
        self,
        key_group_range: KeyGroupRange,
        ranges: tuple[Range, ...],
        state_kinds: tuple[tuple[str, str], ...],
    ) -> SerializedKeyedState | SpilledKeyedState:
        if self._file is None or self._path is None:
            return SerializedKeyedState(key_group_range, b"".join(self._parts), ranges, state_kinds)
        try:
            self._file.close()  # flushed: the I/O pool reads it
        except BaseException:
            self.discard()
            raise
        path, self._path, self._file = self._path, None, None
        ended, self._ended = self._ended, _nothing
        return SpilledKeyedState(key_group_range, path, ranges, state_kinds, ended)

    def discard(self) -> None:
        self._parts = []
        file, path, self._file, self._path = self._file, self._path, None, None
        ended, self._ended = self._ended, _nothing
        try:
            if file is not None:
                file.close()
        finally:
            if path is not None:
                _remove(path, ended)


def _nothing() -> None:
    pass


def _remove(path: str, ended: Callable[[], None] = _nothing) -> None:
    """Delete ``path``, then call ``ended`` (whatever happened)."""
    try:
        _delete(path)
    finally:
        ended()


def _delete(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not delete the canonical snapshot's local file %s: %s", path, exc)


class SpilledKeyedState:
    """A canonical snapshot too big to keep in memory: the key groups' pickles in the local
    file ``path`` (exactly the bytes a :class:`SerializedKeyedState` would hold), streamed
    into storage by :meth:`write`. The file is deleted once written or failed, or when this
    result is garbage (never written: the checkpoint failed before its turn); ``ended`` is
    called then (the backend's in-flight count)."""

    def __init__(
        self,
        key_group_range: KeyGroupRange,
        path: str,
        ranges: tuple[Range, ...],
        state_kinds: tuple[tuple[str, str], ...],
        ended: Callable[[], None] = _nothing,
    ) -> None:
        self.key_group_range = key_group_range
        self.path = path
        self.ranges = ranges
        self.state_kinds = state_kinds
        self.size = ranges[-1][1] if ranges else 0
        self._delete = weakref.finalize(self, _remove, path, ended)

    def write(
        self, writer: StateWriter, checkpoint_id: int, target_location: str | None
    ) -> WrittenKeyedState:
        """Upload the file as one stream (inline when small, as ``write_state`` would), then
        delete it, whether the upload succeeded or not."""
        try:
            delegate = writer.upload_file(checkpoint_id, self.path, False, target_location)
        finally:
            self.discard()
        handle = KeyGroupsStateHandle(self.key_group_range, self.ranges, delegate, self.state_kinds)
        written = [delegate] if isinstance(delegate, FileStateHandle) else []
        return WrittenKeyedState((handle,), written, self.size, self.size)

    def discard(self) -> None:
        """Delete the local file (idempotent)."""
        self._delete()


# ---------------------------------------------------------------------- restore


def restore_canonical(
    db: Rdict,
    handles: Sequence[KeyGroupsStateHandle],
    key_group_range: KeyGroupRange,
    reader: StateFileReader,
    work_dir: str | None = None,
    owner: str = "the operator",
    policy: UnpicklingPolicy = DEFAULT_POLICY,
) -> dict[str, str]:
    """Write the key groups of ``handles`` that lie in ``key_group_range`` into ``db`` in the
    RocksDB layout, and the states' kinds (and types) into its catalogue; return the
    catalogue's kinds. Pickles are read under ``policy``; a typed state's values are written
    with the serializer of the type they were written with.

    ``handles`` may cover other key groups too (a restore after rescaling): only this
    range's are read. Entries go in WriteBatches of at most :data:`RESTORE_BATCH_ENTRIES`
    entries, without the write-ahead log: until the next checkpoint, the handles are the
    durable copy. A file handle is copied to a local file in ``work_dir`` (the temporary
    directory if ``None``), verified as it is copied, and its key groups read one at a time
    from there, never the whole file into memory. A state that one handle (or the
    database) holds as one kind and another as another kind stops the restore with an
    :class:`IncompatibleRestoredStateError`, and a class it holds that the job no longer
    has a :class:`~chandy.state.missing_classes.StateClassNotFoundError` (``owner`` names the
    operator in both).
    """
    meta = _meta_family(db)
    entries = {
        name.decode("utf-8"): parse_catalogue_entry(entry)
        for name, entry in cast("Iterable[tuple[bytes, bytes]]", meta.items())
    }
    catalogue: dict[str, str] = {name: kind for name, (kind, _) in entries.items()}
    types: dict[str, str] = {name: spec for name, (_, spec) in entries.items() if spec is not None}
    existing = dict(entries)
    writer = _BatchWriter(db)
    prefixes: dict[str, bytes] = {}
    serializers: dict[str, StateSerializer | None] = {}
    for handle in handles:
        part = handle.intersection(key_group_range)
        if part is None:
            continue
        for name, kind in part.state_kinds:
            _record_kind(catalogue, name, kind)
        groups = [
            (key_group, byte_range)
            for key_group, byte_range in part.key_groups()
            if byte_range[1] > byte_range[0]
        ]
        if not groups:
            continue
        with _ranges_of(part.delegate, reader, work_dir) as read:
            for key_group, byte_range in groups:
                blob = read(byte_range)
                group = read_key_group(blob, owner, policy)
                writer.expect_entry_bytes(
                    len(blob) // max(1, sum(len(values) for _, values, _ in group.values()))
                )
                del blob
                for name, (kind, values, spec) in group.items():
                    _record_kind(catalogue, name, kind)
                    if spec is not None:
                        types[name] = spec
                    if name not in serializers:
                        written = types.get(name)
                        serializers[name] = (
                            None if written is None else state_serializer(name, kind, type_of_spec(written))
                        )
                    name_id = prefixes.get(name)
                    if name_id is None:
                        name_id = prefixes[name] = state_id(name)
                    writer.put_table(table_prefix(key_group, name_id), _mode(kind), values, serializers[name])
                del group
    writer.write()
    # The catalogue last: a database that names a state holds all of its restored entries.
    for name, kind in catalogue.items():
        entry = (kind, types.get(name))
        if existing.get(name) != entry:
            meta.put(name.encode("utf-8"), catalogue_entry(*entry), writer.options)
    return catalogue


@contextlib.contextmanager
def _ranges_of(
    handle: StreamStateHandle, reader: StateFileReader, work_dir: str | None
) -> Iterator[Callable[[Range], bytes]]:
    """A reader of ``handle``'s byte ranges. A file is first copied to a local file
    (``copy_to`` verifies its size and SHA-256 as it streams, so a corrupt file is refused
    before any of its bytes is used), read range by range, and deleted at the end; inline
    bytes are in the handle already."""
    if not isinstance(handle, FileStateHandle):
        yield lambda byte_range: reader.read(handle, byte_range)
        return
    path = os.path.join(work_dir or tempfile.gettempdir(), f"restore-{uuid.uuid4().hex}.canonical")
    try:
        reader.copy_to(handle, path)
        with open(path, "rb") as local:
            fd = local.fileno()

            def read(byte_range: Range) -> bytes:
                start, end = byte_range
                data = os.pread(fd, end - start, start)
                if len(data) != end - start:
                    raise ValueError(
                        f"state file {handle.path} ends before byte {end} of a key group: its "
                        "checkpoint's metadata does not describe it. Restore from another checkpoint"
                    )
                return data

            yield read
    finally:
        _remove(path)


def _meta_family(db: Rdict) -> Rdict:
    """The catalogue's column family (created if the database has none yet)."""
    try:
        return db.get_column_family(META_COLUMN_FAMILY)
    except Exception:  # noqa: BLE001 - rocksdict raises a bare Exception for a missing family
        return db.create_column_family(META_COLUMN_FAMILY, Options(raw_mode=True))


def _record_kind(catalogue: dict[str, str], name: str, kind: str) -> None:
    known = catalogue.setdefault(name, kind)
    if known != kind:
        raise IncompatibleRestoredStateError(
            f"restored state '{name}' is {kind} state in one snapshot and {known} state in another "
            "(or in the database restored so far): the state handles do not come from one "
            "checkpoint of one job. Restore from a single checkpoint or savepoint of this job"
        )


class _BatchWriter:
    """Puts into WriteBatches of bounded size, written without the write-ahead log."""

    def __init__(self, db: Rdict) -> None:
        self._db = db
        self.options = WriteOptions()
        # rocksdict's stub declares a method; the binding is a settable property.
        self.options.disable_wal = True  # type: ignore[method-assign,assignment]
        self._batch = WriteBatch(raw_mode=True)
        self._count = 0
        self._limit = RESTORE_BATCH_ENTRIES

    def expect_entry_bytes(self, entry_bytes: int) -> None:
        """Entries of about ``entry_bytes`` each follow (a map's table counts as one entry,
        which only makes its batches smaller): bound the batches by bytes too."""
        self._limit = max(1, min(RESTORE_BATCH_ENTRIES, RESTORE_BATCH_BYTES // max(1, entry_bytes)))

    def put_table(
        self, prefix: bytes, mode: int, values: dict[Any, Any], serializer: StateSerializer | None = None
    ) -> None:
        """The entries of one state's table in one key group (``prefix``: its key group and
        state), a typed state's values written by its ``serializer``. Timers go as plain
        entries: their values are all ``None``."""
        if mode == _MAP:
            encode_entry = encode if serializer is None else serializer.encode_entry
            for table_key, entries in values.items():
                self._put(prefix + encode_key(table_key), entries, encode_entry)
        else:
            self._put(prefix, values, encode if serializer is None else serializer.encode)

    def _put(self, prefix: bytes, values: dict[Any, Any], encode: Callable[[Any], bytes] = encode) -> None:
        """``prefix + encode_key(key) -> encode(value)`` for every entry of ``values``, in as few
        tight loops as the batch bound allows (the encoding is the restore's main cost)."""
        pending = iter(values.items())
        left = len(values)
        while left:
            if self._count >= self._limit:
                self.write()
            count = min(left, self._limit - self._count)
            put = self._batch.put
            for key, value in itertools.islice(pending, count):
                put(prefix + encode_key(key), encode(value))
            left -= count
            self._count += count
        if self._count >= self._limit:
            self.write()

    def write(self) -> None:
        if self._count:
            self._db.write(self._batch, self.options)
            self._batch = WriteBatch(raw_mode=True)
            self._count = 0
