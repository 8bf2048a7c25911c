"""The embedded RocksDB keyed state backend: the heap backend over RocksDB.

:class:`RocksDBKeyedStateBackend` *is* a :class:`~chandy.state.heap.HeapKeyedStateBackend`
whose tables' per-key-group dictionaries are :class:`~chandy.state.rocksdb.views.KeyGroupView`
objects: dictionaries over the entries of one state in one key group in RocksDB, with a
bounded write-back cache of decoded values in front. So every handle of the heap, TTL
(:mod:`chandy.state.ttl`), timers and the operators that reach into ``table.maps`` run
unchanged on RocksDB, and a hot key costs a dict lookup, not a RocksDB get and a decode.
Map state is the exception: its handles (:mod:`chandy.state.rocksdb.map_state`) keep one
RocksDB key per map entry, so a huge map is never loaded whole.

``cow`` stays ``None`` on every table: a snapshot reads RocksDB (a RocksDB snapshot, or a
native checkpoint of its files) after a :meth:`~RocksDBKeyedStateBackend.flush`, never the
cached objects, so nothing has to be copied on write.

A snapshot's synchronous part (task thread, at the barrier): a bounded pass that drops
expired entries of state with a time-to-live (Flink's incremental cleanup), the flush of
every dirty cached value in one batch, then either the canonical snapshot (the heap's
format, :mod:`chandy.state.rocksdb.canonical`: savepoints, and every checkpoint when
``execution.checkpointing.incremental`` is false) or a native one
(:mod:`chandy.state.rocksdb.incremental`: a RocksDB checkpoint whose new SST files the
asynchronous part uploads).

The database lives in a directory of its own under ``state.backend.rocksdb.localdir``
(see :mod:`chandy.state.rocksdb.factory`), deleted by :meth:`dispose`. No write-ahead log:
the checkpoints are the durability, as in Flink.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from rocksdict import BlockBasedOptions, Options, Rdict, WriteBatch, WriteOptions

from chandy.core.state import MapStateDescriptor, State, StateDescriptor
from chandy.state.backend import LAST_CONFIRMED, BaseCheckpoint, KeyedStateSnapshot, StateFileReader
from chandy.state.codec import encode
from chandy.state.handles import IncrementalKeyedStateHandle, KeyedStateHandle, KeyGroupsStateHandle
from chandy.state.heap import (
    NAMESPACED,
    TIMER_STATE_PREFIX,
    HeapKeyedStateBackend,
    StateTable,
)
from chandy.state.key_groups import KeyGroupRange
from chandy.state.missing_classes import load_state
from chandy.state.rocksdb.in_flight import InFlightResults
from chandy.state.rocksdb.layout import (
    MAP_KINDS,
    META_COLUMN_FAMILY,
    catalogue_entry,
    parse_catalogue_entry,
    state_id,
    table_prefix,
)
from chandy.state.rocksdb.map_state import RocksDBMapState, RocksDBNamespacedMapState
from chandy.state.rocksdb.resources import SlotMemory
from chandy.state.rocksdb.views import KeyGroupView, MapKeyGroupView, ValueCache, scan_items
from chandy.state.typed import StateSerializer
from chandy.state.unpickling import DEFAULT_POLICY, UnpicklingPolicy
from chandy.util.clock import Clock

if TYPE_CHECKING:
    from chandy.state.rocksdb.incremental import NativeSnapshotter

logger = logging.getLogger(__name__)

#: Entries of each state with a time-to-live checked for expiry at every snapshot (a
#: bounded pass that goes on where the previous one stopped, round-robin over the keys).
TTL_CLEANUP_STEPS_PER_SNAPSHOT = 1000


def open_db(path: str, memory: SlotMemory) -> Rdict:
    """Open (creating if missing) the database at ``path`` in raw mode, without a WAL,
    with the slot's block cache and write buffer manager, and the catalogue's column
    family (created if missing)."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    table_options = BlockBasedOptions()
    table_options.set_block_cache(memory.cache)
    # Point lookups (every cache miss) skip the SST files without the key: a bloom filter
    # per file, its blocks in the (bounded) block cache, L0's pinned there.
    table_options.set_bloom_filter(10, False)
    table_options.set_cache_index_and_filter_blocks(True)
    table_options.set_pin_l0_filter_and_index_blocks_in_cache(True)
    options.set_block_based_table_factory(table_options)
    options.set_write_buffer_manager(memory.write_buffer_manager)
    # RocksDB's default 64 MB memtable outgrew the manager's share whenever a flush lagged
    # (59 MB of a 6 MB share measured, a 16 MB budget): two memtables (one flushing) of
    # half the share each keep them within it.
    options.set_write_buffer_size(max(1 << 18, memory.write_buffer_manager.get_buffer_size() // 2))
    db = Rdict(path, options, column_families={META_COLUMN_FAMILY: Options(raw_mode=True)})
    write_options = WriteOptions()
    write_options.disable_wal = True  # type: ignore[method-assign,assignment]  # a property at run time
    db.set_write_options(write_options)
    return db


class RocksDBKeyedStateBackend(HeapKeyedStateBackend):
    """Keyed state of one operator subtask in an embedded RocksDB (see the module docstring).

    ``directory`` is this backend's own local directory (the database in ``db/``, native
    snapshots' work in ``work/``); :meth:`dispose` deletes it. ``memory`` is the slot's
    budget, shared with the slot's other backends, or one of the backend's own.
    """

    def __init__(
        self,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        *,
        directory: str,
        memory: SlotMemory,
        incremental: bool = False,
        owner: str = "the operator",
        clock: Clock | None = None,
    ) -> None:
        super().__init__(key_group_range, max_parallelism, owner=owner, clock=clock)
        self.directory = directory
        self.db_path = os.path.join(directory, "db")
        self.work_dir = os.path.join(directory, "work")
        os.makedirs(self.work_dir, exist_ok=True)
        self.memory = memory
        self.incremental = incremental
        #: Names this backend's native snapshots (a restore starts a new one).
        self.backend_id = uuid.uuid4().hex
        memory.attach(id(self))
        self.db: Rdict = open_db(self.db_path, memory)
        self._db_closed = False
        self.cache = ValueCache(self.db, self._cache_limit)
        self._snapshotter: NativeSnapshotter | None = None
        #: Snapshot results still writing files of this backend's directory.
        self.in_flight = InFlightResults()
        #: Where the TTL cleanup pass of each state goes on: (key group, last RocksDB key checked).
        self._ttl_cursors: dict[str, tuple[int, bytes | None]] = {}
        self._disposed = False

    def _cache_limit(self, entry_cost: int) -> int:
        """How many decoded values this backend may cache: its share of the slot's budget."""
        return self.memory.value_cache_share() // max(1, entry_cost)

    def open_db(self, path: str) -> Rdict:
        """Open the database at ``path`` as this backend opens its own (for restores)."""
        return open_db(path, self.memory)

    # ------------------------------------------------------------------ tables

    def _table(self, name: str, kind: str) -> StateTable:
        if name not in self.tables:
            self.tables[name] = self._new_table(name, kind)
            self.db.get_column_family(META_COLUMN_FAMILY).put(
                name.encode("utf-8"), catalogue_entry(kind, None)
            )
        return super()._table(name, kind)

    def set_serializer(self, table: StateTable, serializer: StateSerializer | None) -> None:
        """As the heap's; the views write with it from now on, and the catalogue records
        the type, so that a native snapshot says which serializer wrote the state."""
        previous = table.serializer
        super().set_serializer(table, serializer)
        for kg in self.key_group_range:
            view = table.maps[kg]
            if isinstance(view, KeyGroupView):
                view._encode = encode if serializer is None else serializer.encode
            elif isinstance(view, MapKeyGroupView):
                view._encode = encode if serializer is None else serializer.encode_entry
        spec = None if serializer is None else serializer.spec
        if previous is None or spec != previous.spec:
            entry = catalogue_entry(table.kind, spec)
            self.db.get_column_family(META_COLUMN_FAMILY).put(table.name.encode("utf-8"), entry)

    def _new_table(self, name: str, kind: str) -> StateTable:
        """A table whose per-key-group maps are views of RocksDB."""
        table = StateTable(name, kind, KeyGroupRange(1, 0), self.max_parallelism)
        table.key_group_range = self.key_group_range
        sid = state_id(name)
        cache = self.cache
        view: Callable[[ValueCache, bytes], dict[Any, Any]] = (
            MapKeyGroupView if kind in MAP_KINDS else KeyGroupView
        )
        for kg in self.key_group_range:
            table.maps[kg] = view(cache, table_prefix(kg, sid))
        return table

    def get_partitioned_state(self, descriptor: StateDescriptor, namespaced: bool = False) -> State:
        """As the heap's, but map state without a time-to-live gets handles that keep one
        RocksDB key per map entry. (With a TTL a map is one value per key, through the
        heap's TTL handles: its entries expire together with the map's read.)"""
        ttl_config = descriptor.get_ttl_config()
        if type(descriptor) is not MapStateDescriptor or (ttl_config is not None and ttl_config.is_enabled()):
            return super().get_partitioned_state(descriptor, namespaced)
        if descriptor.name.startswith(TIMER_STATE_PREFIX):
            return super().get_partitioned_state(descriptor, namespaced)  # the heap names the error
        kind = NAMESPACED + "map" if namespaced else "map"
        table = self._table(descriptor.name, kind)
        handle = self._handles.get(descriptor.name)
        if handle is None:
            self.declare_type(table, descriptor)
            handle_type = RocksDBNamespacedMapState if namespaced else RocksDBMapState
            handle = self._handles[descriptor.name] = handle_type(self, table)
        return handle

    def cached_entries(self) -> int:
        """How many decoded values (and keys known to be absent) the cache holds now."""
        return self.cache.size()

    # ------------------------------------------------------------------ snapshots

    def flush(self) -> None:
        """Write every dirty cached value to RocksDB (one batch)."""
        self.cache.flush()

    def _clean_up_expired(self) -> None:
        """Flink's incremental TTL cleanup, run at each snapshot (after the flush, so RocksDB
        holds every value): a pass over at most :data:`TTL_CLEANUP_STEPS_PER_SNAPSHOT`
        entries of every state with a time-to-live, read straight from RocksDB and going on
        where the previous pass stopped, deletes the expired entries and rewrites the partly
        expired ones (lists, maps), in one batch. A step is an entry or a move to the next
        key group, so a pass is bounded however the state is spread; it leaves the cache
        alone, except to forget the keys it changed."""
        now = self.clock.now_ms()
        batch = WriteBatch(raw_mode=True)
        for name, table in self.tables.items():
            expire = table.expire
            if expire is not None:
                self._expiry_pass(name, table, expire, now, batch)
        if not batch.is_empty():
            self.db.write(batch)

    def _expiry_pass(
        self, name: str, table: StateTable, expire: Callable[[Any, int], Any], now: int, batch: WriteBatch
    ) -> None:
        key_groups = self.key_group_range
        kg, after = self._ttl_cursors.get(name, (key_groups.start, None))
        steps = TTL_CLEANUP_STEPS_PER_SNAPSHOT
        moves = 0  # round the range at most once a pass: a sparse state costs no empty rounds
        while steps > 0 and moves <= key_groups.number_of_key_groups:
            view = table.maps[kg]
            assert isinstance(view, KeyGroupView)
            start = len(view._prefix)
            decode_key, decode_value = self.cache.decode_from, self.cache.decode
            for db_key, data in scan_items(self.db, view._prefix, after):
                if db_key == after:
                    continue  # where the previous pass stopped: already checked
                steps -= 1
                after = db_key
                stored = decode_value(data)
                kept = expire(stored, now)
                if kept is not stored:
                    if kept is None:
                        batch.delete(db_key)
                    else:
                        batch.put(db_key, view._encode(kept))
                    view.forget(decode_key(db_key, start)[0])
                if steps == 0:
                    break
            else:  # the key group is done: on to the next one (a step too)
                steps -= 1
                moves += 1
                kg = kg + 1 if kg < key_groups.end else key_groups.start
                after = None
        self._ttl_cursors[name] = (kg, after)

    def snapshot(  # type: ignore[override]  # the heap's returns its own kind of snapshot
        self,
        checkpoint_id: int = 0,
        *,
        canonical: bool = False,
        native: bool = False,
        base_checkpoint_id: BaseCheckpoint = LAST_CONFIRMED,
    ) -> KeyedStateSnapshot:
        """The synchronous part: flush, TTL cleanup pass, then a canonical snapshot (when
        ``canonical``, or for checkpoints that are not incremental) or a native one: every
        file its own when ``native`` (a NATIVE savepoint), else referencing the files of
        ``base_checkpoint_id``."""
        self.flush()
        self._clean_up_expired()
        if canonical or (not native and not self.incremental):
            from chandy.state.rocksdb.canonical import CanonicalSnapshot  # deferred: loaded when used

            catalogue = {name: table.kind for name, table in self.tables.items()}
            expiring = {name: table.expire for name, table in self.tables.items() if table.expire is not None}
            return CanonicalSnapshot(
                self.db,
                self.db.snapshot(),
                self.key_group_range,
                catalogue,
                expiring,
                self.clock.now_ms(),
                self.work_dir,
                self.in_flight,
                self.serializers(),
                self.cache.decode_from,
            )
        state_kinds = tuple(sorted((name, table.kind) for name, table in self.tables.items()))
        return self._native().take(
            self.db, checkpoint_id, state_kinds, incremental=not native, base_checkpoint_id=base_checkpoint_id
        )

    def _native(self) -> NativeSnapshotter:
        if self._snapshotter is None:
            from chandy.state.rocksdb.incremental import NativeSnapshotter

            self._snapshotter = NativeSnapshotter(
                self.backend_id, self.key_group_range, self.work_dir, self.in_flight
            )
        return self._snapshotter

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self._snapshotter is not None:
            self._snapshotter.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self._snapshotter is not None:
            self._snapshotter.notify_checkpoint_aborted(checkpoint_id)

    # ------------------------------------------------------------------ restore

    def restore(
        self,
        handles: Iterable[KeyedStateHandle],
        reader: StateFileReader,
        policy: UnpicklingPolicy = DEFAULT_POLICY,
    ) -> None:
        """Native (incremental) handles rebuild the database from their files; canonical
        ones (any backend's savepoints and full checkpoints) are written into it. Then the
        tables come back from the database's catalogue.

        Every pickle read from the handles goes through the restricted unpickler of
        ``policy``: a canonical restore unpickles (and checks) each one now; after a native
        restore the database holds the snapshot's own bytes, so every pickle this backend
        reads from then on is restricted."""
        handles = list(handles)
        native = [h for h in handles if isinstance(h, IncrementalKeyedStateHandle)]
        canonical = [h for h in handles if isinstance(h, KeyGroupsStateHandle)]
        if native:
            from chandy.state.rocksdb.incremental import restore_native

            self._close_db()
            shutil.rmtree(self.db_path, ignore_errors=True)
            self.db = restore_native(
                native, self.key_group_range, self.db_path, self.work_dir, reader, self.open_db
            )
            self._db_closed = False
            self.cache.db = self.db
            self.cache.read_pickles_with(functools.partial(load_state, policy=policy))
        if canonical:
            from chandy.state.rocksdb.canonical import restore_canonical

            self.flush()
            restore_canonical(
                self.db, canonical, self.key_group_range, reader, self.work_dir, self.owner, policy
            )
        self._load_catalogue()

    def _load_catalogue(self) -> None:
        """Tables for every state the database holds (after a restore)."""
        self.cache.drop()  # what the restore wrote is newer than anything cached
        meta = self.db.get_column_family(META_COLUMN_FAMILY)
        catalogue = {
            cast(bytes, name).decode("utf-8"): parse_catalogue_entry(cast(bytes, entry))
            for name, entry in meta.items()
        }
        del meta
        for name, (kind, spec) in catalogue.items():
            table = self.tables.get(name)
            if table is None:
                self.tables[name] = self._new_table(name, kind)
            elif table.kind != kind:
                raise ValueError(
                    f"restored state '{name}' is {kind} state in the checkpoint and {table.kind} "
                    "state in this backend"
                )
            self._restored_kinds[name] = kind
            if spec is not None:
                self.restored_type(name, spec)

    # ------------------------------------------------------------------ disposal

    def _close_db(self) -> None:
        self.cache.drop()
        if not self._db_closed:
            self._db_closed = True
            self.db.close()

    def dispose(self) -> None:
        """Close the database and delete this backend's local directory.

        A snapshot whose files are still being uploaded (the task ended while its
        checkpoint's asynchronous part ran) keeps the directory until its upload is done:
        the last such upload deletes it (see :mod:`chandy.state.rocksdb.in_flight`)."""
        if self._disposed:
            return
        self._disposed = True
        try:
            self._close_db()
        finally:
            self.memory.detach(id(self))
            super().dispose()
            shutil.rmtree(self.db_path, ignore_errors=True)
            self.in_flight.close_when_idle(self._delete_directory)

    def _delete_directory(self) -> None:
        if self._snapshotter is not None:
            self._snapshotter.close()
        shutil.rmtree(self.directory, ignore_errors=True)
