"""The canonical snapshot format on RocksDB (chandy/state/rocksdb/canonical.py).

A canonical snapshot of a RocksDB database is what the heap backend writes, byte for byte
in format (per key group each state's ``{table key: value}``, see
:mod:`chandy.state.key_group_format`), so the heap restores it; a restore writes the
heap's snapshots into a database in the RocksDB layout.
Tested against real databases (rocksdict ``Rdict`` in raw mode, in pytest's tmp dir),
written either by hand through the layout or by :func:`restore_canonical`, and read back by
the heap backend: every state kind, namespaced state, timers, TTL filtering at the barrier,
consistency while the database changes between serializer steps, rescaling (handles of
other ranges clipped) and kinds that disagree. Then the same through the RocksDB backend a
job builds, and whole jobs that switch backends through a CANONICAL savepoint.
"""

from __future__ import annotations

import gc
import itertools
import os
import random
import re
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from rocksdict import BlockBasedOptions, Cache, Options, Rdict

from chandy import StreamExecutionEnvironment
from chandy.config.configuration import Configuration
from chandy.config.options import SavepointFormatType
from chandy.core.functions import AggregateFunction
from chandy.core.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from chandy.core.time import Time
from chandy.core.windows import TimeWindow
from chandy.errors import InvalidCheckpointError, JobCancelledError
from chandy.state.backend import KeyedStateBackend
from chandy.state.codec import encode
from chandy.state.factory import keyed_state_backend_factory
from chandy.state.handles import ByteStreamStateHandle, FileStateHandle, KeyGroupsStateHandle
from chandy.state.heap import (
    TIMER_STATE_PREFIX,
    HeapKeyedStateBackend,
    IncompatibleRestoredStateError,
    SerializedKeyedState,
)
from chandy.state.key_group_format import read_key_group
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.state.rocksdb import canonical
from chandy.state.rocksdb.backend import TTL_CLEANUP_STEPS_PER_SNAPSHOT, RocksDBKeyedStateBackend
from chandy.state.rocksdb.canonical import CanonicalSnapshot, restore_canonical
from chandy.state.rocksdb.layout import META_COLUMN_FAMILY, key_group_of, state_id, table_prefix
from chandy.state.ttl import expiry_filter
from chandy.storage.checkpoint_storage import CheckpointStorage, StateReader
from chandy.util.clock import ManualClock
from tests.test_savepoints import (
    assert_exact_prefix,
    checkpointing_env,
    committed,
    counting_job,
    metadata_body,
    parts_written,
    wait_for,
)

MAX_PARALLELISM = 128
ALL = KeyGroupRange(0, MAX_PARALLELISM - 1)
TTL_MS = 1_000
TIMERS = f"{TIMER_STATE_PREFIX}event_window"


def open_db(path: Path) -> Rdict:
    """A database as the backend opens it: raw mode, with the catalogue's column family."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return Rdict(str(path), options, column_families={META_COLUMN_FAMILY: Options(raw_mode=True)})


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Rdict]:
    database = open_db(tmp_path / "db")
    yield database
    database.close()


def catalogue_of(database: Rdict) -> dict[str, str]:
    meta = database.get_column_family(META_COLUMN_FAMILY)
    return {cast(bytes, k).decode(): v.decode() for k, v in meta.items()}


def handle_of(serialized: SerializedKeyedState) -> KeyGroupsStateHandle:
    return KeyGroupsStateHandle(
        serialized.key_group_range,
        serialized.ranges,
        ByteStreamStateHandle("state", serialized.payload),
        serialized.state_kinds,
    )


def heap_snapshot(backend: HeapKeyedStateBackend) -> SerializedKeyedState:
    snapshot = backend.snapshot(canonical=True)
    try:
        return snapshot.serialize()
    finally:
        snapshot.release()


def canonical_snapshot(
    database: Rdict,
    key_groups: KeyGroupRange,
    catalogue: dict[str, str],
    expiring: dict[str, Any] | None = None,
    now_ms: int = 0,
) -> SerializedKeyedState:
    snapshot = CanonicalSnapshot(database, database.snapshot(), key_groups, catalogue, expiring or {}, now_ms)
    try:
        return in_memory(snapshot.serialize())
    finally:
        snapshot.release()


def in_memory(result: SerializedKeyedState | canonical.SpilledKeyedState) -> SerializedKeyedState:
    """A snapshot's bytes in memory, read from its spill file (then deleted) if it has one."""
    if isinstance(result, SerializedKeyedState):
        return result
    try:
        payload = Path(result.path).read_bytes()
    finally:
        result.discard()
    return SerializedKeyedState(result.key_group_range, payload, result.ranges, result.state_kinds)


def heap_restored(
    serialized: list[SerializedKeyedState], key_groups: KeyGroupRange = ALL
) -> HeapKeyedStateBackend:
    backend = HeapKeyedStateBackend(key_groups, MAX_PARALLELISM, clock=ManualClock())
    backend.restore([handle_of(s) for s in serialized], StateReader())
    return backend


def contents(backend: HeapKeyedStateBackend) -> dict[str, tuple[str, dict[int, dict[Any, Any]]]]:
    """Every non-empty table, by name: its kind and its non-empty key groups."""
    found = {}
    for name, table in backend.tables.items():
        groups = {kg: dict(m) for kg, m in table.key_group_maps() if m}
        if groups:
            found[name] = (table.kind, groups)
    return found


def at(backend: KeyedStateBackend, key: Any) -> None:
    backend.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))


class Average(AggregateFunction):
    def create_accumulator(self) -> Any:
        return (0, 0)

    def add(self, value: Any, accumulator: Any) -> Any:
        return (accumulator[0] + value, accumulator[1] + 1)

    def get_result(self, accumulator: Any) -> Any:
        return accumulator[0] / accumulator[1]

    def merge(self, acc_a: Any, acc_b: Any) -> Any:
        return (acc_a[0] + acc_b[0], acc_a[1] + acc_b[1])


def ttl_config() -> StateTtlConfig:
    builder = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS))
    builder.disable_cleanup_in_background()
    return builder.build()


def ttl(descriptor: Any) -> Any:
    descriptor.enable_time_to_live(ttl_config())
    return descriptor


#: Keys of several encodings: ints (negative too), strings, tuples, None inside a tuple.
KEYS: list[Any] = [*range(-5, 60), *(f"user-{i}" for i in range(40)), ("a", 1), ("b", None, 2.5), "é✓"]


def populate(backend: KeyedStateBackend, keys: list[Any] = KEYS) -> None:
    """Every state kind, namespaced state and timers, for every key, through the handles."""
    value = backend.get_partitioned_state(ValueStateDescriptor("value"))
    items = backend.get_partitioned_state(ListStateDescriptor("list"))
    mapping = backend.get_partitioned_state(MapStateDescriptor("map"))
    total = backend.get_partitioned_state(ReducingStateDescriptor("reducing", lambda a, b: a + b))
    average = backend.get_partitioned_state(AggregatingStateDescriptor("aggregating", Average()))
    get = backend.get_partitioned_state  # namespaced=True is the heap's (and RocksDB's) extension
    window_list: Any = get(ListStateDescriptor("window-contents"), namespaced=True)  # type: ignore[call-arg]
    window_map: Any = get(MapStateDescriptor("window-map"), namespaced=True)  # type: ignore[call-arg]
    window_value: Any = get(ValueStateDescriptor("window-value"), namespaced=True)  # type: ignore[call-arg]
    timers = backend.get_timer_table(TIMERS)  # type: ignore[attr-defined]
    for i, key in enumerate(keys):
        at(backend, key)
        value.update({"key": key, "n": i})  # type: ignore[attr-defined]
        items.add_all([i, str(key), (i, None)])  # type: ignore[attr-defined]
        mapping.put_all({"x": i, i: [key], (i, "t"): None, 2.5: b"bytes"})  # type: ignore[attr-defined]
        for n in range(i % 4 + 1):
            total.add(n)  # type: ignore[attr-defined]
            average.add(n * 10)  # type: ignore[attr-defined]
        for window in (TimeWindow(0, 10), TimeWindow(10, 20)):
            window_list.set_current_namespace(window)
            window_list.add(i)
            window_map.set_current_namespace(window)
            window_map.put(window.start, key)
            window_value.set_current_namespace(window.end)  # a plain namespace too
            window_value.update(i * 2)
            kg = assign_to_key_group(key, MAX_PARALLELISM)
            timers.maps[kg][(window.max_timestamp(), key, window)] = None


# ------------------------------------------------------------------ snapshots of hand-written databases


def key_group(blob: bytes) -> dict[str, tuple[str, dict[Any, Any]]]:
    """One key group of the canonical format: ``{name: (kind, values)}``."""
    return {name: (kind, values) for name, (kind, values, _) in read_key_group(blob, "test").items()}


def test_a_database_written_by_the_layout_snapshots_into_the_heaps_format(db: Rdict) -> None:
    """The layout written by hand (as the backend writes it), read into exactly the pickles the
    heap writes for the same state: one per non-empty key group, empty ranges for the others."""
    kg_a, kg_b = 3, 90
    value_id, map_id, timers_id = state_id("count"), state_id("m"), state_id(TIMERS)
    db.put(table_prefix(kg_a, value_id) + encode("a"), encode(7))
    db.put(table_prefix(kg_a, value_id) + encode(("k", 1)), encode([1, 2]))
    db.put(table_prefix(kg_b, value_id) + encode(-12), encode(None))
    db.put(table_prefix(kg_a, map_id) + encode("a") + encode("x"), encode(1.5))
    db.put(table_prefix(kg_a, map_id) + encode("a") + encode(2), encode({"nested": True}))
    db.put(table_prefix(kg_a, map_id) + encode("ab") + encode("y"), encode(b"raw"))
    db.put(table_prefix(kg_b, timers_id) + encode((100, -12, None)), encode(None))
    catalogue = {"count": "value", "m": "map", TIMERS: "timers", "unused": "list"}

    serialized = canonical_snapshot(db, ALL, catalogue)

    assert serialized.key_group_range == ALL
    assert serialized.state_kinds == tuple(sorted(catalogue.items()))
    assert len(serialized.ranges) == ALL.number_of_key_groups
    non_empty = [kg for kg, (start, end) in zip(ALL, serialized.ranges, strict=True) if end > start]
    assert non_empty == [kg_a, kg_b]
    groups = {kg: key_group(serialized.payload[slice(*serialized.ranges[kg])]) for kg in non_empty}
    assert groups[kg_a] == {
        "count": ("value", {"a": 7, ("k", 1): [1, 2]}),
        # the map's entries reassembled per table key: "a" and "ab" stay apart
        "m": ("map", {"a": {"x": 1.5, 2: {"nested": True}}, "ab": {"y": b"raw"}}),
    }
    assert list(groups[kg_a]) == ["count", "m"]  # the catalogue's order, as the heap's tables
    assert groups[kg_b] == {"count": ("value", {-12: None}), TIMERS: ("timers", {(100, -12, None): None})}
    # and the heap restores it
    restored = heap_restored([serialized])
    assert restored.tables["m"].maps[kg_a] == {"a": {"x": 1.5, 2: {"nested": True}}, "ab": {"y": b"raw"}}
    assert restored.tables[TIMERS].kind == "timers"


def test_only_the_snapshots_key_group_range_is_read(db: Rdict) -> None:
    name_id = state_id("s")
    for kg in (0, 9, 10, 20, 21, 127):
        db.put(table_prefix(kg, name_id) + encode(kg), encode(kg))

    serialized = canonical_snapshot(db, KeyGroupRange(10, 20), {"s": "value"})

    assert len(serialized.ranges) == 11
    restored = heap_restored([serialized], KeyGroupRange(10, 20))
    assert contents(restored) == {"s": ("value", {10: {10: 10}, 20: {20: 20}})}


def test_an_empty_range_is_an_empty_snapshot(db: Rdict) -> None:
    db.put(table_prefix(50, state_id("s")) + encode(1), encode(1))
    snapshot = CanonicalSnapshot(db, db.snapshot(), KeyGroupRange(0, 49), {"s": "value"}, {}, 0)
    assert snapshot.is_empty
    serialized = snapshot.serialize()
    snapshot.release()
    assert serialized.payload == b"" and serialized.ranges == ((0, 0),) * 50
    assert not CanonicalSnapshot(db, None, KeyGroupRange(50, 50), {"s": "value"}, {}, 0).is_empty


def test_entries_of_a_state_missing_from_the_catalogue_are_refused(db: Rdict) -> None:
    db.put(table_prefix(5, state_id("ghost")) + encode(1), encode(1))
    with pytest.raises(ValueError, match="not in its catalogue"):
        canonical_snapshot(db, ALL, {"s": "value"})


def test_names_whose_state_ids_collide_are_refused(db: Rdict) -> None:
    """Two names with one 4-byte state id would mix their entries: named, not merged."""
    seen: dict[bytes, str] = {}
    for i in itertools.count():  # a birthday search: about 80 000 names
        name = f"state-{i}"
        other = seen.setdefault(state_id(name), name)
        if other != name:
            break
    clash = re.escape(str([sorted([other, name])]))
    with pytest.raises(ValueError, match=f"states {clash} share a RocksDB state id"):
        canonical_snapshot(db, ALL, {other: "value", name: "list"})


def test_a_snapshot_leaves_the_block_cache_to_the_tasks_reads(tmp_path: Path) -> None:
    """A canonical snapshot reads the whole range once: caching those blocks would evict
    the task's working set at every (full) checkpoint."""
    cache = Cache(64 << 20)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    table_options = BlockBasedOptions()
    table_options.set_block_cache(cache)
    options.set_block_based_table_factory(table_options)
    database = Rdict(str(tmp_path / "db"), options)
    name_id = state_id("s")
    for i in range(50_000):
        database.put(table_prefix(i % MAX_PARALLELISM, name_id) + encode(i), encode("x" * 20))
    database.flush()
    database.compact_range(None, None)  # every entry in SST files, none in the memtable
    before = cache.get_usage()

    serialized = canonical_snapshot(database, ALL, {"s": "value"})

    assert len(serialized.payload) > 1 << 20
    assert cache.get_usage() - before < 64 << 10  # the data blocks (> 1 MB) were not cached
    database.close()


# ------------------------------------------------------------------ the barrier and the steps


def fill(database: Rdict, name: str, count: int) -> None:
    name_id = state_id(name)
    for i in range(count):
        kg = assign_to_key_group(i, MAX_PARALLELISM)
        database.put(table_prefix(kg, name_id) + encode(i), encode(i))


def test_the_snapshot_sees_the_database_as_at_the_barrier_while_it_changes_between_steps(
    db: Rdict,
) -> None:
    """Records flow between serializer steps: writes, overwrites, deletes and a flush plus a
    compaction after the barrier reach the database, never the snapshot. (Iterators that a
    rocksdict ``Snapshot`` creates after the barrier, one per step say, would see them all: it
    drops the snapshot from their read options.)"""
    fill(db, "s", 3_000)
    snapshot = CanonicalSnapshot(db, db.snapshot(), ALL, {"s": "value"}, {}, 0)
    serializer = snapshot.serializer()
    name_id = state_id("s")
    steps = 0
    while not serializer.step(time.monotonic_ns()):  # a deadline already passed: the smallest steps
        steps += 1
        i = 10_000 + steps
        db.put(table_prefix(assign_to_key_group(i, MAX_PARALLELISM), name_id) + encode(i), encode(i))
        j = steps * 7 % 3_000
        kg = assign_to_key_group(j, MAX_PARALLELISM)
        if steps % 2:
            db.put(table_prefix(kg, name_id) + encode(j), encode("changed"))
        else:
            db.delete(table_prefix(kg, name_id) + encode(j))
        if steps == 5:
            db.flush()
            db.compact_range(None, None)
    result = serializer.result()
    snapshot.release()

    assert steps >= 3_000 // canonical._ENTRIES_PER_CLOCK_CHECK  # a step stops at a passed deadline
    restored = heap_restored([result])
    values = {k: v for _, m in restored.tables["s"].key_group_maps() for k, v in m.items()}
    assert values == {i: i for i in range(3_000)}


def test_steps_build_the_same_bytes_as_one_pass(db: Rdict) -> None:
    """Steps that stop anywhere (inside a key group, a state, a map) resume where they stopped."""
    fill(db, "s", 2_000)
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    populate(heap)
    mapping: Any = heap.get_partitioned_state(MapStateDescriptor("map"))
    for key in KEYS[:5]:
        at(heap, key)
        mapping.put_all({f"entry-{i}": i for i in range(300)})  # maps longer than a step
    catalogue = {"s": "value", **restore_canonical(db, [handle_of(heap_snapshot(heap))], ALL, StateReader())}
    one_pass = canonical_snapshot(db, ALL, catalogue)
    snapshot = CanonicalSnapshot(db, db.snapshot(), ALL, catalogue, {}, 0)
    serializer = snapshot.serializer()
    with pytest.raises(RuntimeError, match="not finished"):
        serializer.result()
    while not serializer.step(time.monotonic_ns()):
        pass
    assert serializer.step(None)  # done stays done
    stepped = serializer.result()
    snapshot.release()
    assert stepped == one_pass
    restored = contents(heap_restored([stepped]))
    assert restored.pop("s")[1] == {
        kg: {i: i for i in range(2_000) if assign_to_key_group(i, MAX_PARALLELISM) == kg}
        for kg in {assign_to_key_group(i, MAX_PARALLELISM) for i in range(2_000)}
    }
    assert restored == contents(heap)


def test_release_drops_the_iterator_so_the_database_can_close(tmp_path: Path) -> None:
    """An open iterator keeps RocksDB open (and its directory locked); a released snapshot
    does not, and its serializer refuses to go on."""
    database = open_db(tmp_path / "db")
    fill(database, "s", 1_000)
    snapshot = CanonicalSnapshot(database, database.snapshot(), ALL, {"s": "value"}, {}, 0)
    serializer = snapshot.serializer()
    assert not serializer.step(time.monotonic_ns())
    snapshot.release()
    with pytest.raises(RuntimeError, match="released"):
        serializer.step(None)
    with pytest.raises(RuntimeError, match="released"):
        snapshot.serializer()
    database.close()
    del database, serializer
    reopened = open_db(tmp_path / "db")  # the lock is free
    assert len(list(reopened.keys())) == 1_000
    reopened.close()


# ------------------------------------------------------------------ TTL


def test_ttl_entries_expired_at_the_barrier_are_left_out(db: Rdict) -> None:
    """The heap's filters (``expiry_filter``) at the barrier's time: a pair expires whole, a
    list and a map keep their live elements, a state left with nothing is not written."""
    kinds = {"v": "ttl value", "l": "ttl list", "m": "ttl map", "w": "namespaced ttl value", "plain": "value"}
    stored: dict[str, dict[Any, Any]] = {
        "v": {"old": ("x", 0), "new": ("y", 600)},
        "l": {"k": [(1, 0), (2, 600)], "gone": [(3, 0)]},
        "m": {"k": {"a": (1, 0), "b": (2, 900)}},
        "w": {("k", 5): ("z", 0)},
        "plain": {"k": ("not ttl", 0)},
    }
    kg = 7
    for name, values in stored.items():
        for key, value in values.items():
            db.put(table_prefix(kg, state_id(name)) + encode(key), encode(value))
    expiring = {name: expiry_filter(kind, TTL_MS) for name, kind in kinds.items() if "ttl" in kind}

    serialized = canonical_snapshot(db, ALL, kinds, expiring, now_ms=1_000)

    group = key_group(serialized.payload[slice(*serialized.ranges[kg])])
    assert group == {
        "v": ("ttl value", {"new": ("y", 600)}),
        "l": ("ttl list", {"k": [(2, 600)]}),
        "m": ("ttl map", {"k": {"b": (2, 900)}}),
        "plain": ("value", {"k": ("not ttl", 0)}),
    }
    assert db.get(table_prefix(kg, state_id("v")) + encode("old")) is not None  # the database keeps it


# ------------------------------------------------------------------ heap -> rocksdb -> heap


def test_every_state_kind_round_trips_heap_to_rocksdb_to_heap(db: Rdict) -> None:
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    populate(heap)
    before = heap_snapshot(heap)

    catalogue = restore_canonical(db, [handle_of(before)], ALL, StateReader())

    assert catalogue == dict(before.state_kinds) == catalogue_of(db)
    assert catalogue["map"] == "map" and catalogue["window-map"] == "namespaced map"
    assert catalogue[TIMERS] == "timers"
    after = canonical_snapshot(db, ALL, catalogue)
    assert after.state_kinds == before.state_kinds
    assert contents(heap_restored([after])) == contents(heap)


def test_the_same_state_in_the_same_order_gives_the_heaps_bytes(db: Rdict) -> None:
    """Byte for byte: where the heap's dictionaries happen to be in RocksDB's order (keys
    inserted in ascending order, states declared in the catalogue's order), the two
    snapshots are the same bytes, pickles, ranges and kinds alike. (Only the order and
    sharing of objects may differ: pickle writes an object the heap shares between values
    once and then refers to it, where decoded values are each their own.)"""
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    counts = heap.get_partitioned_state(ValueStateDescriptor("a-counts"))
    items = heap.get_partitioned_state(ListStateDescriptor("b-items"))
    mapping = heap.get_partitioned_state(MapStateDescriptor("c-map"))
    for key in range(5_000):
        at(heap, key)
        counts.update(key * 7)  # type: ignore[attr-defined]
        items.add_all([key, str(key)])  # type: ignore[attr-defined]
        mapping.put_all({1: -key, 2: (key, f"v{key}")})  # type: ignore[attr-defined]
    from_heap = heap_snapshot(heap)
    catalogue = restore_canonical(db, [handle_of(from_heap)], ALL, StateReader())

    assert canonical_snapshot(db, ALL, catalogue) == from_heap


def test_map_entries_are_one_rocksdb_key_each(db: Rdict) -> None:
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    mapping = heap.get_partitioned_state(MapStateDescriptor("m"))
    at(heap, "k")
    mapping.put_all({1: "a", "two": "b", (3,): "c"})  # type: ignore[attr-defined]
    restore_canonical(db, [handle_of(heap_snapshot(heap))], ALL, StateReader())
    kg = assign_to_key_group("k", MAX_PARALLELISM)
    prefix = table_prefix(kg, state_id("m")) + encode("k")
    assert {db[prefix + encode(k)] for k in (1, "two", (3,))} == {encode("a"), encode("b"), encode("c")}


def test_ttl_state_round_trips_and_expires_at_the_next_barrier(db: Rdict) -> None:
    clock = ManualClock(start_ms=0)
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM, clock=clock)
    value = heap.get_partitioned_state(ttl(ValueStateDescriptor("v")))
    items = heap.get_partitioned_state(ttl(ListStateDescriptor("l")))
    for key in ("early", "late"):
        clock.advance_ms(0 if key == "early" else 600)
        at(heap, key)
        value.update(key)  # type: ignore[attr-defined]
        items.add(key)  # type: ignore[attr-defined]
    catalogue = restore_canonical(db, [handle_of(heap_snapshot(heap))], ALL, StateReader())
    assert catalogue == {"v": "ttl value", "l": "ttl list"}
    expiring = {name: expiry_filter(kind, TTL_MS) for name, kind in catalogue.items()}

    # at 1 000 ms "early" (written at 0) has expired, "late" (written at 600) has not
    restored = heap_restored([canonical_snapshot(db, ALL, catalogue, expiring, now_ms=1_000)])

    assert {k for _, m in restored.tables["v"].key_group_maps() for k in m} == {"late"}
    assert {k for _, m in restored.tables["l"].key_group_maps() for k in m} == {"late"}


# ------------------------------------------------------------------ rescaling


def split(key_groups: KeyGroupRange, parts: int) -> list[KeyGroupRange]:
    n = key_groups.number_of_key_groups
    bounds = [key_groups.start + n * i // parts for i in range(parts + 1)]
    return [KeyGroupRange(bounds[i], bounds[i + 1] - 1) for i in range(parts)]


def populated_heaps(keys: list[Any], parts: int) -> list[HeapKeyedStateBackend]:
    """``parts`` heap backends splitting the key groups, each holding its share of ``keys``."""
    heaps = []
    for key_groups in split(ALL, parts):
        heap = HeapKeyedStateBackend(key_groups, MAX_PARALLELISM)
        populate(heap, [k for k in keys if assign_to_key_group(k, MAX_PARALLELISM) in key_groups])
        heaps.append(heap)
    return heaps


def merged_contents(heaps: list[HeapKeyedStateBackend]) -> dict[str, tuple[str, dict[int, dict[Any, Any]]]]:
    """The :func:`contents` of backends of disjoint ranges, as one backend would hold them."""
    merged: dict[str, tuple[str, dict[int, dict[Any, Any]]]] = {}
    for heap in heaps:
        for name, (kind, groups) in contents(heap).items():
            merged.setdefault(name, (kind, {}))[1].update(groups)
    return merged


def test_rescaling_two_handles_to_three_databases_to_one_heap(tmp_path: Path) -> None:
    """Each database reads only its own key groups of handles that cover others too, every
    key lands in exactly one database, and their snapshots restore whole."""
    keys = [*range(300), *(f"k{i}" for i in range(100))]
    heaps = populated_heaps(keys, 2)
    handles = [handle_of(heap_snapshot(heap)) for heap in heaps]

    snapshots = []
    seen: list[bytes] = []
    for i, key_groups in enumerate(split(ALL, 3)):
        database = open_db(tmp_path / f"db{i}")
        restore_canonical(database, handles, key_groups, StateReader())
        found = cast("list[bytes]", list(database.keys()))
        assert found and all(key_group_of(k) in key_groups for k in found)
        seen.extend(found)
        snapshots.append(canonical_snapshot(database, key_groups, catalogue_of(database)))
        database.close()

    assert len(seen) == len(set(seen))
    assert contents(heap_restored(snapshots)) == merged_contents(heaps)
    value = {k for _, m in heap_restored(snapshots).tables["value"].key_group_maps() for k in m}
    assert value == set(keys)


# ------------------------------------------------------------------ restore details


def test_kinds_that_disagree_stop_the_restore(db: Rdict) -> None:
    first = HeapKeyedStateBackend(KeyGroupRange(0, 63), MAX_PARALLELISM)
    second = HeapKeyedStateBackend(KeyGroupRange(64, 127), MAX_PARALLELISM)
    first.get_partitioned_state(ValueStateDescriptor("s"))
    second.get_partitioned_state(ListStateDescriptor("s"))
    handles = [handle_of(heap_snapshot(first)), handle_of(heap_snapshot(second))]
    with pytest.raises(IncompatibleRestoredStateError, match="'s' is list state in one snapshot and value"):
        restore_canonical(db, handles, ALL, StateReader())


def test_a_kind_the_database_already_holds_otherwise_stops_the_restore(db: Rdict) -> None:
    db.get_column_family(META_COLUMN_FAMILY).put(b"s", b"map")
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    at(heap, 1)
    heap.get_partitioned_state(ValueStateDescriptor("s")).update(1)  # type: ignore[attr-defined]
    with pytest.raises(IncompatibleRestoredStateError, match="value state in one snapshot and map"):
        restore_canonical(db, [handle_of(heap_snapshot(heap))], ALL, StateReader())


def test_states_without_entries_and_handles_of_other_ranges(db: Rdict) -> None:
    """The catalogue names every state of the handles that overlap the range (empty ones too,
    as the heap's snapshot lists them); a handle of other key groups is not read at all."""
    heap = HeapKeyedStateBackend(KeyGroupRange(0, 63), MAX_PARALLELISM)
    heap.get_partitioned_state(ValueStateDescriptor("declared"))
    elsewhere = HeapKeyedStateBackend(KeyGroupRange(64, 127), MAX_PARALLELISM)
    elsewhere.get_partitioned_state(ListStateDescriptor("declared"))  # would conflict if read
    handles = [handle_of(heap_snapshot(heap)), handle_of(heap_snapshot(elsewhere))]

    assert restore_canonical(db, handles, KeyGroupRange(0, 63), StateReader()) == {"declared": "value"}
    assert catalogue_of(db) == {"declared": "value"}
    assert list(db.keys()) == []


def test_a_restore_without_a_catalogue_family_creates_it(tmp_path: Path) -> None:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    database = Rdict(str(tmp_path / "db"), options)
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    at(heap, 1)
    heap.get_partitioned_state(ValueStateDescriptor("s")).update(5)  # type: ignore[attr-defined]
    assert restore_canonical(database, [handle_of(heap_snapshot(heap))], ALL, StateReader()) == {"s": "value"}
    assert catalogue_of(database) == {"s": "value"}
    database.close()


def test_batches_split_anywhere_lose_nothing(db: Rdict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches written every few entries: inside a table, a map, between key groups."""
    monkeypatch.setattr(canonical, "RESTORE_BATCH_ENTRIES", 3)
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    populate(heap, KEYS[:20])
    catalogue = restore_canonical(db, [handle_of(heap_snapshot(heap))], ALL, StateReader())
    assert contents(heap_restored([canonical_snapshot(db, ALL, catalogue)])) == contents(heap)


# ------------------------------------------------------------------ through the RocksDB backend


@pytest.fixture
def rocksdb_backend(tmp_path: Path) -> Iterator[Any]:
    """``rocksdb_backend(key_groups, clock=None)``: a RocksDB backend built as a job's are
    (the factory ``state.backend.type: rocksdb`` selects), disposed at the end of the test."""
    configuration = Configuration(
        {
            "state.backend.type": "rocksdb",
            "execution.checkpointing.incremental": True,
            "state.backend.rocksdb.localdir": str(tmp_path / "rocksdb"),
        }
    )
    create = keyed_state_backend_factory(configuration, {}, 0)
    made: list[KeyedStateBackend] = []

    def make(key_groups: KeyGroupRange = ALL, clock: ManualClock | None = None) -> RocksDBKeyedStateBackend:
        backend = create(key_groups, MAX_PARALLELISM, "operator 'test'", clock or ManualClock())
        assert isinstance(backend, RocksDBKeyedStateBackend)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.dispose()


def stepped(snapshot: Any) -> SerializedKeyedState:
    """The serializer driven in the smallest steps (a deadline already passed)."""
    try:
        serializer = snapshot.serializer()
        while not serializer.step(time.monotonic_ns()):
            pass
        return in_memory(serializer.result())
    finally:
        snapshot.release()


def test_heap_to_rocksdb_backend_to_heap_with_every_kind(rocksdb_backend: Any) -> None:
    """The backend restores the heap's canonical snapshot (its handles read it back), and its
    canonical snapshot, taken while the backend goes on writing, restores the same on the heap."""
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    populate(heap)
    backend = rocksdb_backend()
    backend.restore([handle_of(heap_snapshot(heap))], StateReader())

    at(backend, "user-3")
    assert backend.get_partitioned_state(ValueStateDescriptor("value")).value() == {"key": "user-3", "n": 68}
    mapping: Any = backend.get_partitioned_state(MapStateDescriptor("map"))
    assert mapping.get(68) == ["user-3"] and mapping.get((68, "t")) is None and mapping.contains((68, "t"))
    assert list(backend.get_partitioned_state(ListStateDescriptor("list")).get()) == [
        68,
        "user-3",
        (68, None),
    ]
    timers = backend.get_timer_table(TIMERS)
    kg = assign_to_key_group("user-3", MAX_PARALLELISM)
    assert (9, "user-3", TimeWindow(0, 10)) in timers.maps[kg]

    snapshot = backend.snapshot(7, canonical=True)
    populate(backend, ["after", "the", "barrier"])  # new keys
    at(backend, "user-3")
    backend.get_partitioned_state(ValueStateDescriptor("value")).clear()
    mapping.put("new", 1)
    backend.flush()
    restored = heap_restored([stepped(snapshot)])

    assert contents(restored) == contents(heap)


def test_state_written_on_rocksdb_snapshots_as_the_same_state_on_the_heap(rocksdb_backend: Any) -> None:
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    backend = rocksdb_backend()
    for target in (heap, backend):
        populate(target)
        mapping: Any = target.get_partitioned_state(MapStateDescriptor("map"))
        for key in KEYS[::3]:  # some map entries removed, some maps emptied
            at(target, key)
            mapping.remove("x")
            if isinstance(key, int):
                mapping.clear()
    from_heap = heap_snapshot(heap)

    from_rocksdb = stepped(backend.snapshot(1, canonical=True))

    assert from_rocksdb.state_kinds == from_heap.state_kinds
    assert from_rocksdb.ranges != () and len(from_rocksdb.ranges) == len(from_heap.ranges)
    assert contents(heap_restored([from_rocksdb])) == contents(heap_restored([from_heap])) == contents(heap)


def test_ttl_entries_expired_at_the_barrier_are_not_in_the_backends_canonical_snapshot(
    rocksdb_backend: Any,
) -> None:
    """More expired entries than the backend's cleanup pass at the snapshot removes: the
    snapshot leaves the rest out itself, at the barrier's time."""
    clock = ManualClock(start_ms=0)
    backend = rocksdb_backend(clock=clock)
    value = backend.get_partitioned_state(ttl(ValueStateDescriptor("v")))
    count = 3 * TTL_CLEANUP_STEPS_PER_SNAPSHOT
    for key in range(count):
        at(backend, key)
        value.update(key)
    clock.advance_ms(600)
    for key in range(0, count, 10):
        at(backend, key)
        value.update(-key)  # refreshed: written at 600
    clock.advance_ms(400)  # 1 000: the others expired

    snapshot = backend.snapshot(1, canonical=True)
    clock.advance_ms(10_000)  # what counts is the barrier's time, not the serializer's
    restored = heap_restored([stepped(snapshot)])

    kept = {k: v for _, m in restored.tables["v"].key_group_maps() for k, v in m.items()}
    assert kept == {key: (-key, 600) for key in range(0, count, 10)}


def test_rescaling_two_heaps_to_three_rocksdb_backends_to_one(rocksdb_backend: Any) -> None:
    """2 heap handles -> 3 RocksDB backends (each reads its own key groups of both) -> one
    RocksDB backend and one heap: the state of the two heaps, whole, every key once."""
    keys = [*range(200), *(f"k{i}" for i in range(80))]
    heaps = populated_heaps(keys, 2)
    handles = [handle_of(heap_snapshot(heap)) for heap in heaps]

    snapshots = []
    for key_groups in split(ALL, 3):
        backend = rocksdb_backend(key_groups)
        backend.restore(handles, StateReader())
        assert all(key_group_of(cast(bytes, k)) in key_groups for k in backend.db.keys())
        at_one = next(k for k in keys if assign_to_key_group(k, MAX_PARALLELISM) in key_groups)
        at(backend, at_one)
        assert backend.get_partitioned_state(ValueStateDescriptor("value")).value()["key"] == at_one
        snapshots.append(stepped(backend.snapshot(1, canonical=True)))

    assert contents(heap_restored(snapshots)) == merged_contents(heaps)
    one = rocksdb_backend(ALL)
    one.restore([handle_of(s) for s in snapshots], StateReader())
    assert one.num_keys("value") == len(keys)
    assert contents(heap_restored([stepped(one.snapshot(2, canonical=True))])) == merged_contents(heaps)


def test_the_backend_refuses_handles_whose_kinds_disagree(rocksdb_backend: Any) -> None:
    first = HeapKeyedStateBackend(KeyGroupRange(0, 63), MAX_PARALLELISM)
    second = HeapKeyedStateBackend(KeyGroupRange(64, 127), MAX_PARALLELISM)
    first.get_partitioned_state(MapStateDescriptor("s"))
    second.get_partitioned_state(ttl(MapStateDescriptor("s")))
    with pytest.raises(IncompatibleRestoredStateError, match="'s' is ttl map state in one snapshot and map"):
        rocksdb_backend().restore(
            [handle_of(heap_snapshot(first)), handle_of(heap_snapshot(second))], StateReader()
        )


# ------------------------------------------------------------------ savepoints: switching backends


def backend_config(backend: str, tmp_path: Path) -> dict[str, Any]:
    if backend == "hashmap":
        return {"state.backend.type": "hashmap"}
    return {
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": True,
        "state.backend.rocksdb.localdir": str(tmp_path / "rocksdb"),
    }


@pytest.mark.parametrize(("first", "second"), [("hashmap", "rocksdb"), ("rocksdb", "hashmap")])
def test_a_canonical_savepoint_moves_a_running_job_to_the_other_backend(
    tmp_path: Path, first: str, second: str
) -> None:
    """Job A on one backend takes a CANONICAL savepoint and is cancelled; the same job restores
    it on the other backend at another parallelism (3 instead of 2), with incremental
    checkpoints on RocksDB, and stops with a savepoint: every record once, every key counted
    1, 2, 3, ... across the switch."""
    out = tmp_path / "out"
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    env.configure(
        {"execution.checkpointing.savepoint-dir": str(tmp_path / "sp"), **backend_config(first, tmp_path)}
    )
    client = counting_job(env, out, 2000).execute_async(f"on {first}")
    wait_for(lambda: parts_written(out) >= 2, 60, "both sink subtasks writing")

    path = client.trigger_savepoint(format_type=SavepointFormatType.CANONICAL).result(60)

    body = metadata_body(path)
    assert body["savepoint_format"] == "CANONICAL"
    keyed = [h for op in body["operators"] for task in op["subtasks"].values() for h in task["keyed"]]
    assert keyed and all("ranges" in h for h in keyed)  # key-group handles, whatever the backend
    client.cancel()
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(60)
    assert committed(out) == []
    second_env = checkpointing_env(tmp_path, 3, **backend_config(second, tmp_path))
    restored = counting_job(second_env, out, 2000, restore=path).execute_async(f"on {second}")
    wait_for(lambda: len(committed(out)) > 600, 90, "records committed after the restore")
    restored.stop_with_savepoint(savepoint_directory=str(tmp_path / "sp2")).result(60)
    restored.get_job_execution_result(60)

    assert assert_exact_prefix(committed(out), 2) > 600
    assert (tmp_path / "rocksdb").is_dir()  # the RocksDB run did run on RocksDB


# ------------------------------------------------------------------ state larger than memory


def large_backend(rocksdb_backend: Any, keys: int, value_bytes: int) -> RocksDBKeyedStateBackend:
    """A backend holding ``keys`` values of ``value_bytes`` incompressible bytes each."""
    backend: RocksDBKeyedStateBackend = rocksdb_backend()
    state = backend.get_partitioned_state(ValueStateDescriptor("big"))
    for key in range(keys):
        at(backend, key)
        state.update(random.Random(key).randbytes(value_bytes))
    backend.flush()
    return backend


def spill_files(backend: RocksDBKeyedStateBackend) -> list[str]:
    return sorted(name for name in os.listdir(backend.work_dir) if not name.startswith("chk-"))


def file_storage(tmp_path: Path) -> CheckpointStorage:
    storage = CheckpointStorage(str(tmp_path / "checkpoints"), "job")
    storage.initialize()
    return storage


def test_a_snapshot_larger_than_the_spill_threshold_is_written_from_a_local_file_with_the_heaps_bytes(
    rocksdb_backend: Any, tmp_path: Path
) -> None:
    """3 MB of state: the serializer spills its pickles to the backend's work directory, the
    result uploads that file (the exact bytes the heap writes for the same state, in the same
    ranges) and deletes it; heap and RocksDB restore it from the checkpoint file."""
    backend = large_backend(rocksdb_backend, 600, 5_000)
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    heap_state = heap.get_partitioned_state(ValueStateDescriptor("big"))
    for key in range(600):
        at(heap, key)
        heap_state.update(random.Random(key).randbytes(5_000))
    expected = heap_snapshot(heap)
    assert len(expected.payload) > canonical.SPILL_THRESHOLD_BYTES

    snapshot = backend.snapshot(1, canonical=True)
    serializer = snapshot.serializer()
    while not serializer.step(time.monotonic_ns()):
        pass
    result = serializer.result()
    snapshot.release()  # before the write, as the task does: the result owns the file
    assert isinstance(result, canonical.SpilledKeyedState)
    assert spill_files(backend) == [os.path.basename(result.path)]

    storage = file_storage(tmp_path)
    written = result.write(storage, 1, None)
    assert spill_files(backend) == []
    (handle,) = written.handles
    assert isinstance(handle, KeyGroupsStateHandle) and isinstance(handle.delegate, FileStateHandle)
    assert written.written == [handle.delegate]
    assert written.checkpointed_size == written.state_size == len(expected.payload)
    assert Path(handle.delegate.path).read_bytes() == expected.payload
    assert handle.ranges == expected.ranges

    restored_heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    restored_heap.restore([handle], StateReader(storage))
    assert contents(restored_heap) == contents(heap)
    restored = rocksdb_backend()
    restored.restore([handle], StateReader(storage))
    assert spill_files(restored) == []  # the restore's local copy is gone too
    state = restored.get_partitioned_state(ValueStateDescriptor("big"))
    for key in (0, 299, 599):
        at(restored, key)
        assert state.value() == random.Random(key).randbytes(5_000)


def test_a_canonical_snapshot_and_its_restore_hold_one_key_group_not_the_state(
    rocksdb_backend: Any, tmp_path: Path
) -> None:
    """24 MB of state, 190 KB a key group: serializing and writing it, then restoring it,
    each peak at a few MB of Python memory (tracemalloc). Before the spill the snapshot held
    the pickles twice (48 MB, list and join) and the restore the whole file (24 MB)."""
    backend = large_backend(rocksdb_backend, 3_000, 8_192)
    storage = file_storage(tmp_path)
    bound = 6 << 20
    tracemalloc.start()
    try:
        snapshot = backend.snapshot(1, canonical=True)
        serializer = snapshot.serializer()
        serializer.step(None)
        result = serializer.result()
        snapshot.release()
        written = result.write(storage, 1, None)
        del result, serializer, snapshot
        _, snapshot_peak = tracemalloc.get_traced_memory()
        assert written.state_size >= 3_000 * 8_192
        tracemalloc.reset_peak()
        restored = rocksdb_backend()
        restored.restore(written.handles, StateReader(storage))
        _, restore_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert snapshot_peak <= bound and restore_peak <= bound, (
        f"peaks {snapshot_peak >> 20} MB snapshotting, {restore_peak >> 20} MB restoring "
        f"{written.state_size >> 20} MB of state"
    )
    at(restored, 2_999)
    assert restored.get_partitioned_state(ValueStateDescriptor("big")).value() == random.Random(
        2_999
    ).randbytes(8_192)


class FailingUpload:
    """A storage whose uploads fail (a full or unreachable file system)."""

    def write_state(self, checkpoint_id: int, data: bytes, target_location: str | None = None) -> Any:
        raise OSError("no space left on device")

    def upload_file(
        self, checkpoint_id: int, local_path: str, shared: bool, target_location: str | None = None
    ) -> Any:
        assert os.path.exists(local_path)
        raise OSError("no space left on device")

    def discard_handles(self, handles: Any) -> None:
        pass


def test_the_spill_file_is_deleted_when_the_write_fails_when_released_unwritten_and_when_dropped(
    rocksdb_backend: Any,
) -> None:
    backend = large_backend(rocksdb_backend, 300, 5_000)

    def spilled() -> tuple[Any, Any]:
        snapshot = backend.snapshot(1, canonical=True)
        serializer = snapshot.serializer()
        serializer.step(None)
        assert len(spill_files(backend)) == 1
        return snapshot, serializer

    snapshot, serializer = spilled()
    result = serializer.result()
    snapshot.release()
    with pytest.raises(OSError, match="no space left"):
        result.write(FailingUpload(), 1, None)
    assert spill_files(backend) == []

    snapshot, serializer = spilled()
    snapshot.release()  # abandoned before its result was taken (the checkpoint was aborted)
    assert spill_files(backend) == []

    snapshot, serializer = spilled()
    result = serializer.result()
    snapshot.release()
    del result  # never written: an earlier operator's write failed the checkpoint
    gc.collect()
    assert spill_files(backend) == []


def test_a_corrupt_checkpoint_file_is_refused_before_any_key_group_is_restored(
    rocksdb_backend: Any, tmp_path: Path
) -> None:
    backend = large_backend(rocksdb_backend, 300, 5_000)
    storage = file_storage(tmp_path)
    snapshot = backend.snapshot(1, canonical=True)
    serializer = snapshot.serializer()
    serializer.step(None)
    result = serializer.result()
    snapshot.release()
    (handle,) = result.write(storage, 1, None).handles
    assert isinstance(handle, KeyGroupsStateHandle) and isinstance(handle.delegate, FileStateHandle)
    data = bytearray(Path(handle.delegate.path).read_bytes())
    data[-10] ^= 0xFF  # the last key group's bytes: the first ones would still load
    Path(handle.delegate.path).write_bytes(bytes(data))

    restored = rocksdb_backend()
    with pytest.raises(InvalidCheckpointError, match="is corrupt .*Restore from another checkpoint"):
        restored.restore([handle], StateReader(storage))
    assert spill_files(restored) == []
    assert list(restored.db.keys()) == []  # nothing written


def test_a_backend_disposed_while_its_spilled_snapshot_uploads_keeps_its_directory_until_written(
    rocksdb_backend: Any, tmp_path: Path
) -> None:
    """The task ended while the I/O pool had a full checkpoint to write: the spill file (and
    the backend's directory) stay until that write is done, which then deletes them."""
    backend = large_backend(rocksdb_backend, 300, 5_000)
    snapshot = backend.snapshot(1, canonical=True)
    serializer = snapshot.serializer()
    serializer.step(None)
    result = serializer.result()
    snapshot.release()
    backend.dispose()
    assert os.path.exists(result.path) and backend.in_flight.count == 1

    written = result.write(file_storage(tmp_path), 1, None)
    assert written.state_size > canonical.SPILL_THRESHOLD_BYTES
    assert not os.path.exists(backend.directory)
