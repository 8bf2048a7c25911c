"""The RocksDB keyed state backend's core: views over real RocksDB files, the write-back
cache, every state kind, timers, TTL, snapshots and restores, memory bounds, setup errors.

Each test opens real databases in pytest's tmp dir. Where the heap backend defines what is
right, a test runs the same operations on both and compares (the RocksDB backend must be a
heap backend whose dictionaries happen to live in RocksDB)."""

from __future__ import annotations

import itertools
import os
import random
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from chandy import StreamExecutionEnvironment
from chandy.config.configuration import Configuration
from chandy.core.functions import (
    AggregateFunction,
    KeyedProcessFunction,
    ProcessWindowFunction,
    RuntimeContext,
)
from chandy.core.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from chandy.core.time import Time
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from chandy.state.backend import KeyedStateBackend
from chandy.state.factory import keyed_state_backend_factory
from chandy.state.handles import KeyedStateHandle
from chandy.state.heap import (
    HeapKeyedStateBackend,
    IncompatibleRestoredStateError,
    IncompatibleStateError,
)
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.state.rocksdb.backend import RocksDBKeyedStateBackend
from chandy.state.rocksdb.factory import RocksDBSetupError, rocksdb_backend_factory
from chandy.state.rocksdb.layout import state_id, table_prefix
from chandy.state.rocksdb.resources import SlotMemory
from chandy.state.rocksdb.views import KeyGroupView, scan_keys
from chandy.storage.checkpoint_storage import CheckpointStorage, StateReader
from chandy.util.clock import ManualClock

MAX_PARALLELISM = 16


@pytest.fixture
def make_backend(tmp_path: Path) -> Iterator[Any]:
    """``make_backend(range=..., budget=..., clock=...)``: a RocksDB backend in tmp_path,
    disposed at the end of the test."""
    made: list[RocksDBKeyedStateBackend] = []

    def make(
        key_group_range: KeyGroupRange = KeyGroupRange(0, MAX_PARALLELISM - 1),
        budget: int = 64 << 20,
        clock: ManualClock | None = None,
        incremental: bool = False,
    ) -> RocksDBKeyedStateBackend:
        directory = tmp_path / f"backend-{len(made)}"
        directory.mkdir()
        backend = RocksDBKeyedStateBackend(
            key_group_range,
            MAX_PARALLELISM,
            directory=str(directory),
            memory=SlotMemory.of(budget),
            incremental=incremental,
            owner="operator 'test'",
            clock=clock,
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.dispose()


def at(backend: KeyedStateBackend, key: Any) -> None:
    backend.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))


def cold(backend: RocksDBKeyedStateBackend) -> None:
    """Write the cache back and forget it: the next reads come from RocksDB files."""
    backend.flush()
    backend.cache.drop()


def snapshot_handles(
    backend: KeyedStateBackend, storage: CheckpointStorage, checkpoint_id: int, *, canonical: bool = False
) -> tuple[KeyedStateHandle, ...]:
    """The whole snapshot protocol: synchronous part, serializer steps, write, release."""
    snapshot = backend.snapshot(checkpoint_id, canonical=canonical)
    try:
        serializer = snapshot.serializer()
        while not serializer.step(None):
            pass
        written = serializer.result().write(storage, checkpoint_id, None)
    finally:
        snapshot.release()
    backend.notify_checkpoint_complete(checkpoint_id)
    return written.handles


class Average(AggregateFunction):
    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        accumulator[0] += value  # in place, as user code may
        accumulator[1] += 1
        return accumulator

    def get_result(self, accumulator: list[int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]


def descriptors() -> dict[str, Any]:
    return {
        "value": ValueStateDescriptor("value"),
        "list": ListStateDescriptor("list"),
        "map": MapStateDescriptor("map"),
        "reducing": ReducingStateDescriptor("reducing", lambda a, b: a + b),
        "aggregating": AggregatingStateDescriptor("aggregating", Average()),
    }


def random_operations(
    backend: KeyedStateBackend, seed: int, steps: int, namespaced: bool = False, drop: Any = None
) -> list[Any]:
    """Seeded random operations on every state kind; what each read returned, in order."""
    rng = random.Random(seed)
    states = {
        name: backend.get_partitioned_state(d, namespaced=namespaced)  # type: ignore[call-arg]
        for name, d in descriptors().items()
    }
    seen: list[Any] = []
    for step in range(steps):
        at(backend, rng.choice([rng.randrange(50), f"k{rng.randrange(20)}", (rng.randrange(5), "t")]))
        namespace = rng.randrange(3)
        if namespaced:
            for state in states.values():
                state.set_current_namespace(namespace)  # type: ignore[attr-defined]
        name = rng.choice(sorted(states))
        state: Any = states[name]
        op = rng.randrange(4)
        value = rng.randrange(100)
        if name == "value":
            if op == 0:
                state.update(value)
            elif op == 1:
                state.clear()
            else:
                seen.append(state.value())
        elif name == "list":
            if op == 0:
                state.add(value)
            elif op == 1:
                state.update([value, value + 1])
            elif op == 2 and namespaced:
                state.merge_namespaces(namespace, [(namespace + 1) % 3, (namespace + 2) % 3])
            else:
                seen.append(list(state.get()))
        elif name == "map":
            if op == 0:
                state.put(value % 7, [value])
            elif op == 1:
                state.remove(value % 7)
            elif op == 2:
                seen.append((state.get(value % 7), state.contains(value % 7), state.is_empty()))
            else:
                seen.append(sorted(state.items()))
                seen.append(
                    (
                        sorted(state.keys()),
                        sorted(state.values()),
                    )
                )
        elif name in ("reducing", "aggregating"):
            if op in (0, 1):
                state.add(value)
            elif op == 2 and namespaced:
                state.merge_namespaces(namespace, [(namespace + 1) % 3])
            elif op == 2:
                state.clear()
            else:
                seen.append(state.get())
        if drop is not None and step % 37 == 0:
            drop()
    return seen


@pytest.mark.parametrize("namespaced", [False, True], ids=["plain", "namespaced"])
def test_every_state_kind_behaves_as_on_the_heap(make_backend: Any, namespaced: bool) -> None:
    """2,000 seeded operations on value, list, map, reducing and aggregating state (in windows'
    namespaces with merges too) read the same on RocksDB as on the heap, with the cache written
    back and dropped now and then so reads come from the RocksDB files."""
    heap = HeapKeyedStateBackend(KeyGroupRange(0, MAX_PARALLELISM - 1), MAX_PARALLELISM)
    rocks = make_backend()
    expected = random_operations(heap, seed=7, steps=2000, namespaced=namespaced)
    actual = random_operations(rocks, seed=7, steps=2000, namespaced=namespaced, drop=lambda: cold(rocks))
    assert actual == expected
    assert len(expected) > 500
    cold(rocks)
    for name in descriptors():
        assert rocks.num_keys(name) == heap.num_keys(name), name
        for kg in range(MAX_PARALLELISM):
            assert sorted(map(repr, rocks.tables[name].maps[kg])) == sorted(  # type: ignore[union-attr]
                map(repr, heap.tables[name].maps[kg])  # type: ignore[union-attr]
            )


def test_map_entries_are_separate_rocksdb_keys(make_backend: Any) -> None:
    backend = make_backend()
    state = backend.get_partitioned_state(MapStateDescriptor("m"))
    at(backend, "k")
    state.put_all({i: str(i) for i in range(100)})
    state.remove(5)
    kg = assign_to_key_group("k", MAX_PARALLELISM)
    keys = list(scan_keys(backend.db, table_prefix(kg, state_id("m"))))
    assert len(keys) == 99  # one RocksDB key per entry, no whole-map value
    assert state.get(7) == "7" and state.get(5) is None
    assert backend.num_keys("m") == 1
    assert list(backend.tables["m"].maps[kg]) == ["k"]
    state.clear()
    assert state.is_empty() and backend.num_keys("m") == 0


def test_values_changed_in_place_reach_rocksdb_after_every_flush(make_backend: Any) -> None:
    """ListState.add appends to the list it read; an aggregate changes its accumulator: the
    view cannot see it, so such values stay dirty and every flush writes them again."""
    backend = make_backend()
    items = backend.get_partitioned_state(ListStateDescriptor("l"))
    average = backend.get_partitioned_state(AggregatingStateDescriptor("a", Average()))
    at(backend, 1)
    for i in range(3):
        items.add(i)
        average.add(i)
        backend.flush()  # a checkpoint between the additions
    cold(backend)
    assert list(items.get()) == [0, 1, 2]
    assert average.get() == 1.0


def test_the_view_is_a_dict_for_code_that_reaches_into_tables(make_backend: Any) -> None:
    backend = make_backend()
    table = backend.get_timer_table("_timer_state/t")
    m = table.maps[3]
    assert isinstance(m, KeyGroupView) and isinstance(m, dict)
    m[(10, "a", None)] = None
    assert (10, "a", None) in m and m.get((10, "a", None), "x") is None
    cold(backend)
    assert (10, "a", None) in m and (11, "a", None) not in m
    assert m.pop((10, "a", None), "gone") is None
    assert m.pop((10, "a", None), "gone") == "gone"
    with pytest.raises(KeyError):
        del m[(10, "a", None)]
    m.update({(1, "b", None): None, (2, "c", None): None})
    m.setdefault((3, "d", None))
    assert len(m) == 3 and bool(m) and sorted(m) == [(1, "b", None), (2, "c", None), (3, "d", None)]
    assert dict(m) == {(1, "b", None): None, (2, "c", None): None, (3, "d", None): None} == m
    cold(backend)
    assert len(m) == 3 and m.copy() == dict(m)
    m.clear()
    assert not m and len(m) == 0 and list(m) == [] and len(table) == 0


def test_timers_fire_from_rocksdb(make_backend: Any) -> None:
    """The timer service keeps its tables as it does on the heap; a restore after the cache
    was dropped finds every timer, and deleted ones never fire."""
    from chandy.task.processing_time import ProcessingTimeService
    from chandy.task.timers import InternalTimer, InternalTimerService

    fired: list[tuple[int, Any]] = []

    class Triggerable:
        def on_event_time(self, timer: InternalTimer) -> None:
            fired.append((timer.timestamp, timer.key))

        def on_processing_time(self, timer: InternalTimer) -> None:
            raise AssertionError("no processing-time timers here")

    backend = make_backend()
    service = InternalTimerService("t", backend, ProcessingTimeService(ManualClock()), Triggerable())
    for key in range(40):
        at(backend, key)
        service.register_event_time_timer(None, 100 + key)
    at(backend, 7)
    service.delete_event_time_timer(None, 107)
    cold(backend)
    again = InternalTimerService("t", backend, ProcessingTimeService(ManualClock()), Triggerable())
    assert again.num_event_time_timers() == 39
    again.advance_watermark(120)
    assert fired == [(100 + k, k) for k in range(21) if k != 7]
    cold(backend)
    assert backend.num_keys("_timer_state/event_t") == 19


def test_apply_to_all_keys_and_num_keys(make_backend: Any) -> None:
    backend = make_backend()
    state = backend.get_partitioned_state(ValueStateDescriptor("v"))
    for key in range(30):
        at(backend, key)
        state.update(key)
    seen: dict[Any, Any] = {}

    def visit(key: Any, s: Any) -> None:
        seen[key] = s.value()
        if key % 2:
            s.clear()
        else:
            s.update(s.value() * 10)

    backend.apply_to_all_keys(ValueStateDescriptor("v"), visit)
    assert seen == {k: k for k in range(30)}
    assert backend.num_keys("v") == 15
    cold(backend)
    at(backend, 4)
    assert state.value() == 40
    assert backend.num_keys("v") == 15 and backend.num_keys("nothing") == 0


def test_kind_conflicts_raise_the_heaps_errors(make_backend: Any, tmp_path: Path) -> None:
    backend = make_backend()
    assert not backend.has_state()
    backend.get_partitioned_state(ValueStateDescriptor("s"))
    assert backend.has_state()
    with pytest.raises(IncompatibleStateError, match="holds value state"):
        backend.get_partitioned_state(ListStateDescriptor("s"))
    with pytest.raises(IncompatibleStateError, match="holds value state"):
        backend.get_partitioned_state(MapStateDescriptor("s"))
    with pytest.raises(ValueError, match="reserved for timers"):
        backend.get_partitioned_state(MapStateDescriptor("_timer_state/x"))
    at(backend, 1)
    backend.get_partitioned_state(ValueStateDescriptor("s")).update(1)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"), "job")
    handles = snapshot_handles(backend, storage, 1, canonical=True)
    restored = make_backend()
    restored.restore(handles, StateReader(storage))
    assert restored.has_state()
    with pytest.raises(IncompatibleRestoredStateError, match="cannot restore state 's'"):
        restored.get_partitioned_state(ListStateDescriptor("s"))


@pytest.mark.parametrize("canonical", [True, False], ids=["canonical", "native"])
def test_snapshot_and_restore_every_kind(make_backend: Any, tmp_path: Path, canonical: bool) -> None:
    """A snapshot taken with values still in the cache holds them (the flush comes first),
    and does not see what is written after it; the restored backend reads the same, on the
    heap too for the canonical format."""
    backend = make_backend(incremental=not canonical)
    expected = random_operations(backend, seed=3, steps=600, namespaced=False)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"), "job")
    snapshot = backend.snapshot(1, canonical=canonical)
    random_operations(backend, seed=4, steps=300)  # after the barrier: not in the snapshot
    serializer = snapshot.serializer()
    while not serializer.step(None):
        pass
    handles = serializer.result().write(storage, 1, None).handles
    snapshot.release()
    targets: list[KeyedStateBackend] = [make_backend()]
    if canonical:
        targets.append(HeapKeyedStateBackend(KeyGroupRange(0, MAX_PARALLELISM - 1), MAX_PARALLELISM))
    for target in targets:
        target.restore(handles, StateReader(storage))
        # the same reads from the restored state as from a heap that ran only the first part
        reference = HeapKeyedStateBackend(KeyGroupRange(0, MAX_PARALLELISM - 1), MAX_PARALLELISM)
        assert random_operations(reference, seed=3, steps=600) == expected
        assert random_operations(target, seed=5, steps=400) == random_operations(reference, seed=5, steps=400)


def test_state_with_ttl_expires_and_snapshots_clean_it_up(make_backend: Any, tmp_path: Path) -> None:
    clock = ManualClock()
    backend = make_backend(clock=clock)
    ttl = StateTtlConfig.new_builder(Time.milliseconds(1000)).build()
    value = ValueStateDescriptor("v")
    value.enable_time_to_live(ttl)
    items = ListStateDescriptor("l")
    items.enable_time_to_live(ttl)
    v = backend.get_partitioned_state(value)
    lst = backend.get_partitioned_state(items)
    for key in range(200):
        at(backend, key)
        v.update(key)
        lst.add(key)
    clock.advance_ms(600)
    for key in range(100):
        at(backend, key)
        v.update(-key)  # refreshed: lives 1000 ms from now
    clock.advance_ms(600)
    cold(backend)
    at(backend, 150)
    assert v.value() is None and list(lst.get()) == []  # expired: invisible
    at(backend, 50)
    assert v.value() == -50
    kg_tables = [backend.tables["v"], backend.tables["l"]]
    before = sum(len(list(scan_keys(backend.db, t.maps[kg]._prefix))) for t in kg_tables for kg in range(16))  # type: ignore[union-attr]
    storage = CheckpointStorage(str(tmp_path / "checkpoints"), "job")
    handles = snapshot_handles(backend, storage, 1, canonical=True)
    after = sum(len(list(scan_keys(backend.db, t.maps[kg]._prefix))) for t in kg_tables for kg in range(16))  # type: ignore[union-attr]
    assert before > 100 + 0 and after == 100  # the pass dropped the expired entries from RocksDB
    restored = HeapKeyedStateBackend(KeyGroupRange(0, 15), MAX_PARALLELISM, clock=clock)
    restored.restore(handles, StateReader(storage))
    assert restored.num_keys("v") == 100 and restored.num_keys("l") == 0


def test_the_cache_stays_bounded_while_far_more_state_is_written(make_backend: Any) -> None:
    """With a 1 MB budget (a 256 KB share for decoded values), 50,000 keys of 100-byte
    values (several MB) are written and read back: the cache evicts, every value survives."""
    backend = make_backend(budget=1 << 20)
    state = backend.get_partitioned_state(ValueStateDescriptor("v"))
    peak = 0
    for key in range(50_000):
        at(backend, key)
        state.update("x" * 90 + str(key))
        if key % 500 == 0:
            peak = max(peak, backend.cached_entries())
            assert backend.cache.total == backend.cached_entries()  # the running count is exact
    limit = backend.cache.limit
    assert backend.cache.evictions > 0
    assert limit < 5_000 and peak <= limit  # the state is 10x more than what is cached
    for key in range(0, 50_000, 7):
        at(backend, key)
        assert state.value() == "x" * 90 + str(key)
        peak = max(peak, backend.cached_entries())
    assert peak <= backend.cache.limit
    assert backend.num_keys("v") == 50_000


def test_dispose_closes_the_database_and_deletes_its_directory(tmp_path: Path) -> None:
    factory = keyed_state_backend_factory(
        {"state.backend.type": "rocksdb", "state.backend.rocksdb.localdir": str(tmp_path / "local")}, {}, 0
    )
    backend = factory(KeyGroupRange(0, 3), 4, "op", ManualClock())
    assert isinstance(backend, RocksDBKeyedStateBackend)
    directory = backend.directory
    assert directory.startswith(str(tmp_path / "local")) and os.path.isdir(backend.db_path)
    backend.get_partitioned_state(ValueStateDescriptor("v"))
    backend.dispose()
    assert not os.path.exists(directory)


def test_backends_of_a_slot_share_one_memory_budget(tmp_path: Path) -> None:
    resources: dict[Any, Any] = {}
    config = Configuration(
        {
            "state.backend.rocksdb.localdir": str(tmp_path),
            "state.backend.rocksdb.memory.fixed-per-slot": "8 mb",
        }
    )
    create = rocksdb_backend_factory(config, resources, 0)
    a = create(KeyGroupRange(0, 3), 4, "a", ManualClock())
    b = create(KeyGroupRange(0, 3), 4, "b", ManualClock())
    other_slot = rocksdb_backend_factory(config, resources, 1)(KeyGroupRange(0, 3), 4, "c", ManualClock())
    try:
        assert isinstance(a, RocksDBKeyedStateBackend) and isinstance(b, RocksDBKeyedStateBackend)
        assert isinstance(other_slot, RocksDBKeyedStateBackend)
        assert a.memory is b.memory and a.memory is not other_slot.memory
        assert a.memory.budget == 8 << 20
        assert a.memory.value_cache_share() == (8 << 20) // 4 // 2  # two backends share a quarter
    finally:
        for backend in (a, b, other_slot):
            backend.dispose()


def test_an_unwritable_local_directory_is_named_with_its_option(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    config = Configuration({"state.backend.rocksdb.localdir": str(blocker / "rocksdb")})
    with pytest.raises(RocksDBSetupError, match="state.backend.rocksdb.localdir"):
        rocksdb_backend_factory(config, {}, 0)


def test_a_missing_rocksdict_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rocksdict", None)  # what an uninstalled package looks like
    with pytest.raises(RocksDBSetupError, match=r"pip install rocksdict.*state.backend.type: hashmap"):
        keyed_state_backend_factory({"state.backend.type": "rocksdb"}, {}, 0)


def test_ttl_cleanup_for_every_record_keeps_the_rocksdb_backend(make_backend: Any) -> None:
    """Incremental cleanup on every record makes the backend call listeners when the key is
    set, by changing its class: it must stay a RocksDB backend (it became a heap one)."""
    clock = ManualClock()
    backend = make_backend(clock=clock)
    descriptor = ValueStateDescriptor("v")
    descriptor.enable_time_to_live(
        StateTtlConfig.new_builder(Time.milliseconds(100)).cleanup_incrementally(5, True).build()
    )
    state = backend.get_partitioned_state(descriptor)
    assert isinstance(backend, RocksDBKeyedStateBackend)
    for key in range(20):
        at(backend, key)
        state.update(key)
    clock.advance_ms(200)
    for key in range(100, 140):  # each key set runs 5 cleanup steps
        at(backend, key)
    cold(backend)
    assert backend.num_keys("v") == 0  # the expired entries are gone from RocksDB
    backend.dispose()
    assert not os.path.exists(backend.directory)


class CountUntilTimer(KeyedProcessFunction):
    """Counts a key's records in a ValueState, appends them to a ListState, keeps per-residue
    counts in a MapState, and emits all three when an event-time timer fires: each record
    moves the key's timer to 10 s after itself (deleting the one before), so it fires once
    the key's records ended, whenever the watermark passes."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count"))
        self.seen = runtime_context.get_list_state(ListStateDescriptor("seen"))
        self.residues = runtime_context.get_map_state(MapStateDescriptor("residues"))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        count = self.count.value() or 0
        if count:
            ctx.timer_service().delete_event_time_timer(max(self.seen.get()) + 10_000)
        ctx.timer_service().register_event_time_timer(value + 10_000)
        self.count.update(count + 1)
        self.seen.add(value)
        residue = value % 3
        self.residues.put(residue, (self.residues.get(residue) or 0) + 1)
        return ()

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:
        yield ("timer", ctx.get_current_key(), timestamp, self.count.value(), sum(self.seen.get()))
        yield ("residues", ctx.get_current_key(), timestamp, sorted(self.residues.items()))
        self.count.clear()
        self.seen.clear()
        self.residues.clear()


class SumWindow(ProcessWindowFunction):
    def process(self, key: Any, context: ProcessWindowFunction.Context, elements: Any) -> Any:
        values = list(elements)
        yield ("window", key, context.window().start, len(values), sum(values))


def keyed_job_outputs(backend: dict[str, Any], tmp_path: Path) -> list[Any]:
    """Every path that reaches into state tables (StreamGroupedReduce, the window fast path's
    panes and pane timers, the generic window operator's list state and timers, a process
    function's value, list and map state and timers) in one local job with checkpoints."""
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    env.configure({"chandy.network.batch-size": 64, **backend})
    env.enable_checkpointing(20)
    env.get_checkpoint_config().set_checkpoint_storage(f"file://{tmp_path}/checkpoints")
    n, keys = 30_000, 500
    source = (
        env.from_sequence(0, n - 1)
        .set_parallelism(1)
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda v, ts: v)
        )
    )
    keyed = source.key_by(lambda i: i % keys)
    sums = keyed.reduce(lambda a, b: a + b).filter(lambda s: s > 880_000)  # the last sums only
    tumbling = keyed.window(TumblingEventTimeWindows.of(Time.milliseconds(1000))).reduce(lambda a, b: a + b)
    sliding = keyed.window(
        SlidingEventTimeWindows.of(Time.milliseconds(2000), Time.milliseconds(500))
    ).reduce(lambda a, b: max(a, b))
    generic = keyed.window(TumblingEventTimeWindows.of(Time.milliseconds(700))).process(SumWindow())
    timers = keyed.process(CountUntilTimer())
    results = (
        sums.map(lambda s: ("sum", s))
        .union(
            tumbling.map(lambda s: ("tumbling", s)), sliding.map(lambda s: ("sliding", s)), generic, timers
        )
        .execute_and_collect(limit=10**7)
    )
    return sorted(results, key=repr)


@pytest.mark.slow
@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "canonical"])
def test_operators_that_reach_into_tables_give_the_heaps_results(tmp_path: Path, incremental: bool) -> None:
    """The same job on the heap and on RocksDB (with a 2 MB budget, so the cache evicts while
    the job runs, and checkpoints every 20 ms, native or canonical) gives the same records."""
    expected = keyed_job_outputs({}, tmp_path / "heap")
    rocksdb = {
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": incremental,
        "state.backend.rocksdb.memory.fixed-per-slot": "2 mb",
        "state.backend.rocksdb.localdir": str(tmp_path / "local"),
    }
    assert keyed_job_outputs(rocksdb, tmp_path / "rocksdb") == expected
    assert len(expected) > 30_000 // 700 * 500
    # Every backend deletes its directory: at once, or (a backend disposed while a native
    # snapshot of the job's last checkpoint was still uploading) once that upload ended.
    deadline = time.monotonic() + 30
    while os.listdir(tmp_path / "local") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.listdir(tmp_path / "local") == []


def test_a_failed_native_restore_still_disposes_cleanly(make_backend: Any, tmp_path: Path) -> None:
    """A native restore whose shared file is gone fails naming it; the backend, whose database
    was closed for the restore, still disposes (it raised DbClosedError) and deletes its files."""
    from chandy.errors import InvalidCheckpointError
    from chandy.state.handles import FileStateHandle, IncrementalKeyedStateHandle

    backend = make_backend(incremental=True)
    random_operations(backend, seed=1, steps=300)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"), "job", inline_threshold=0)
    (handle,) = snapshot_handles(backend, storage, 1)
    assert isinstance(handle, IncrementalKeyedStateHandle)
    lost = next(h for _, h in handle.shared if isinstance(h, FileStateHandle))
    os.remove(lost.path.removeprefix("file://"))
    restored = make_backend()
    with pytest.raises(InvalidCheckpointError):
        restored.restore([handle], StateReader(storage))
    restored.dispose()
    assert not os.path.exists(restored.directory)


def test_map_state_through_apply_to_all_keys_and_with_ttl(make_backend: Any) -> None:
    """Keys holding a map (entries in RocksDB keys of their own) are listed once each; a map
    with a time-to-live, one value per key through ttl.py's handles, expires per entry."""
    clock = ManualClock()
    backend = make_backend(clock=clock)
    plain = backend.get_partitioned_state(MapStateDescriptor("m"))
    descriptor = MapStateDescriptor("t")
    descriptor.enable_time_to_live(StateTtlConfig.new_builder(Time.milliseconds(100)).build())
    expiring = backend.get_partitioned_state(descriptor)
    for key in range(10):
        at(backend, key)
        plain.put_all({"a": key, "b": -key})
        expiring.put("old", key)
    clock.advance_ms(60)
    for key in range(10):
        at(backend, key)
        expiring.put("new", key)
    clock.advance_ms(60)
    cold(backend)
    visited: list[Any] = []
    backend.apply_to_all_keys(
        MapStateDescriptor("m"), lambda key, s: visited.append((key, sorted(s.items())))
    )
    assert sorted(visited) == [(k, [("a", k), ("b", -k)]) for k in range(10)]
    at(backend, 3)
    assert sorted(expiring.items()) == [("new", 3)]
    assert backend.num_keys("m") == 10 and backend.num_keys("t") == 10


def test_without_managed_memory_each_backend_has_a_budget_of_its_own(tmp_path: Path) -> None:
    config = Configuration(
        {
            "state.backend.rocksdb.localdir": str(tmp_path),
            "state.backend.rocksdb.memory.managed": False,
            "taskmanager.memory.managed.size": "4 mb",
        }
    )
    create = rocksdb_backend_factory(config, {}, 0)
    a, b = (create(KeyGroupRange(0, 3), 4, name, ManualClock()) for name in "ab")
    try:
        assert isinstance(a, RocksDBKeyedStateBackend) and isinstance(b, RocksDBKeyedStateBackend)
        assert a.memory is not b.memory and a.memory.budget == b.memory.budget == 4 << 20
        assert a.memory.value_cache_share() == (4 << 20) // 4  # all of the quarter: not shared
    finally:
        a.dispose()
        b.dispose()


def test_a_map_is_iterated_entry_by_entry_as_it_was_when_asked(make_backend: Any) -> None:
    """Iteration reads RocksDB as it goes (a huge map is never loaded whole) and sees the map
    as of the call: entries removed or added while the caller walks it change nothing."""
    backend = make_backend()
    state = backend.get_partitioned_state(MapStateDescriptor("m"))
    at(backend, "k")
    state.put_all({i: i * i for i in range(1000)})
    items, keys, values = state.items(), state.keys(), state.values()
    assert next(items) == (0, 0)
    state.clear()
    state.put("new", 1)
    assert list(items) == [(i, i * i) for i in range(1, 1000)]
    assert list(keys) == list(range(1000)) and list(values) == [i * i for i in range(1000)]
    assert list(state.items()) == [("new", 1)]


def test_a_state_smaller_than_the_cache_stays_cached(tmp_path: Path) -> None:
    """Keys read then written (a running aggregate) count once each against the limit: 90% of
    the limit in distinct keys, spread over 32,768 key groups, rewritten after checkpoints,
    never evicts (the cache evicted from 75% of its limit on)."""
    backend = RocksDBKeyedStateBackend(
        KeyGroupRange(0, 32767), 32768, directory=str(tmp_path), memory=SlotMemory.of(16 << 20)
    )
    try:
        state = backend.get_partitioned_state(ValueStateDescriptor("v"))
        keys = backend.cache.limit * 9 // 10
        for rounds in range(3):
            for key in range(keys):
                backend.set_current_key(key, assign_to_key_group(key, 32768))
                state.update((state.value() or 0) + 1)
            backend.flush()  # a checkpoint between rounds
        assert backend.cache.evictions == 0
        assert backend.cached_entries() == keys
    finally:
        backend.dispose()


def test_decode_of_ints_at_the_edges_and_of_corrupt_bytes() -> None:
    from chandy.state.codec import decode, encode

    for value in (0, -1, 1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, True, 1.0, "1", (1,)):
        decoded = decode(encode(value))
        assert decoded == value and type(decoded) is type(value)
    with pytest.raises(ValueError, match="1 bytes after the value"):
        decode(encode(5) + b"x")


def test_eviction_gives_recently_written_keys_a_second_chance(make_backend: Any) -> None:
    """Hot keys (read and written all the time) stay cached while a stream of cold keys
    passes through: after the first eviction (when every key is as recent as any other)
    they are never read from RocksDB again. Evicting in insertion order alone read them
    1,613 times over 24 evictions instead of 400."""
    backend = make_backend(budget=8 << 20)
    state = backend.get_partitioned_state(ValueStateDescriptor("v"))
    hot, cold_keys = 200, 60_000
    for i in range(cold_keys):
        at(backend, ("cold", i))
        state.update(i)  # a blind write: never a miss
        at(backend, i % hot)
        state.update((state.value() or 0) + 1)
    assert backend.cache.evictions >= 10
    assert backend.cache.misses <= 2 * hot  # loaded at first, and once after the first eviction
    at(backend, 7)
    assert state.value() == cold_keys // hot


def test_the_ttl_pass_at_snapshots_is_bounded_and_leaves_the_cache_alone(
    make_backend: Any, tmp_path: Path
) -> None:
    """2,500 expired entries over 16 key groups: each snapshot's pass checks at most 1,000
    entries and key-group moves, straight from RocksDB (it read them into the cache before,
    through the views), and three snapshots drop them all."""
    from chandy.state.rocksdb.backend import TTL_CLEANUP_STEPS_PER_SNAPSHOT

    clock = ManualClock()
    backend = make_backend(clock=clock)
    descriptor = ValueStateDescriptor("v")
    descriptor.enable_time_to_live(StateTtlConfig.new_builder(Time.milliseconds(100)).build())
    state = backend.get_partitioned_state(descriptor)
    for key in range(2500):
        at(backend, key)
        state.update(key)
    cold(backend)
    clock.advance_ms(200)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"), "job")
    left = [backend.num_keys("v")]
    for checkpoint_id in range(1, 4):
        snapshot_handles(backend, storage, checkpoint_id, canonical=True)
        assert backend.cached_entries() == 0
        left.append(backend.num_keys("v"))
    assert left[0] == 2500 and left[-1] == 0
    assert all(0 < a - b <= TTL_CLEANUP_STEPS_PER_SNAPSHOT for a, b in itertools.pairwise(left) if a)


class CountingScans:
    """A RocksDB handle that counts the scans made through it (everything else passes through)."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.scans = 0

    def items(self, *args: Any, **kwargs: Any) -> Any:
        self.scans += 1
        return self._db.items(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_the_ttl_pass_over_a_sparse_state_rounds_the_range_once(make_backend: Any) -> None:
    """A state with a time-to-live and three keys in 16 key groups: one pass scans each key
    group once (it went round the range until its thousand steps were spent: 1,000 scans)."""
    clock = ManualClock()
    backend = make_backend(clock=clock)
    descriptor = ValueStateDescriptor("v")
    descriptor.enable_time_to_live(StateTtlConfig.new_builder(Time.milliseconds(100)).build())
    state = backend.get_partitioned_state(descriptor)
    for key in range(3):
        at(backend, key)
        state.update(key)
    backend.flush()
    clock.advance_ms(200)
    counting = backend.db = CountingScans(backend.db)
    backend._clean_up_expired()
    assert counting.scans <= MAX_PARALLELISM + 1
    backend.db = counting._db
    assert backend.num_keys("v") == 0


def test_a_backend_disposed_during_an_upload_is_deleted_when_the_upload_ends(
    make_backend: Any, tmp_path: Path
) -> None:
    """The task ended while its checkpoint's files were still being uploaded: the directory
    stays for the upload and goes with its end, on the uploading thread (nothing left
    behind when the process exits right after, no watcher thread polling)."""
    backend = make_backend(incremental=True)
    at(backend, "k")
    backend.get_partitioned_state(ValueStateDescriptor("v")).update(1)
    snapshot = backend.snapshot(1)
    result = snapshot.serializer().result()
    snapshot.release()
    backend.dispose()
    assert os.path.isdir(backend.directory)  # the upload's hard links are in it
    assert not os.path.exists(backend.db_path)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"), "job")
    storage.initialize()
    written = result.write(storage, 1, None)
    assert written.handles and not os.path.exists(backend.directory)


def test_directories_of_killed_processes_are_deleted_by_the_next_factory(tmp_path: Path) -> None:
    """A SIGKILLed slot disposes nothing; the next slot process on the host (the restarted
    one) deletes what it left, and never a live process's or another host's directories."""
    import signal
    import socket
    import subprocess

    from chandy.state.rocksdb.factory import DIRECTORY_PREFIX

    local = tmp_path / "local"
    config = {"state.backend.type": "rocksdb", "state.backend.rocksdb.localdir": str(local)}
    killed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            from chandy.state.factory import keyed_state_backend_factory
            from chandy.state.key_groups import KeyGroupRange
            from chandy.util.clock import SystemClock
            create = keyed_state_backend_factory({config!r}, {{}}, 0)
            backend = create(KeyGroupRange(0, 3), 4, "op", SystemClock())
            print(backend.directory, flush=True)
            time.sleep(60)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert killed.stdout is not None
    left_by_killed = killed.stdout.readline().strip()
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert os.path.isdir(left_by_killed)
    other_host = local / f"{DIRECTORY_PREFIX}not-{socket.gethostname()}-p{killed.pid}-x"
    other_host.mkdir()
    # a live database named for a dead pid: a process of another pid namespace on this host
    other_namespace = local / f"{DIRECTORY_PREFIX}{socket.gethostname()}-p{killed.pid}-y"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import rocksdict, sys, time; db = rocksdict.Rdict(sys.argv[1]); "
         "print('open', flush=True); time.sleep(60)", str(other_namespace / "db")],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
    factory = keyed_state_backend_factory(config, {}, 0)
    live = factory(KeyGroupRange(0, 3), 4, "op", ManualClock())
    try:
        assert not os.path.exists(left_by_killed)
        assert other_host.is_dir() and os.path.isdir(live.directory)
        assert (other_namespace / "db" / "LOCK").exists()
        keyed_state_backend_factory(config, {}, 0)  # another slot's factory: the live one stays
        assert os.path.isdir(live.directory)
    finally:
        live.dispose()
        holder.kill()
        holder.wait()


class Point(NamedTuple):
    user: str
    region: str


def test_equal_keys_of_any_picklable_type_find_the_same_state(make_backend: Any) -> None:
    """Keys pickle would encode (named tuples, dataclasses, frozensets) key state by value,
    as on the heap: pickle's memo made K(s, s) and an equal K built from other string objects
    two different RocksDB keys, and a set's order follows the process's string hashes."""
    import subprocess

    from chandy.state.codec import encode_key

    backend = make_backend()
    state = backend.get_partitioned_state(ValueStateDescriptor("count"))
    shared = "europe-west"
    written, equal = Point(shared, shared), Point("".join(["europe-", "west"]), "europe-" + "west")
    at(backend, written)
    state.update(1)
    at(backend, frozenset({"a", "b", "c"}))
    state.update(2)
    cold(backend)  # what an eviction or a restart does
    at(backend, equal)
    assert state.value() == 1
    at(backend, frozenset(["c", "b", "a"]))
    assert state.value() == 2

    script = (
        "import sys; from chandy.state.codec import encode_key;"
        "sys.stdout.write(encode_key(frozenset({'a', 'b', 'c', ('x', 1)})).hex())"
    )
    encodings = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert encodings == {encode_key(frozenset({"a", "b", "c", ("x", 1)})).hex()}


def test_a_flush_writes_what_changed_not_every_cached_list(make_backend: Any) -> None:
    """Accumulators ([sum, count] lists) stayed dirty while cached: every flush, so every
    checkpoint, rewrote the whole cache. Once written they leave it."""
    backend = make_backend()
    accumulator = backend.get_partitioned_state(ValueStateDescriptor("acc"))
    for key in range(5_000):
        at(backend, key)
        accumulator.update([key, 1])
    backend.flush()
    for key in range(0, 5_000, 100):  # 1% change
        at(backend, key)
        accumulator.update([key, 2])
    before = backend.cache._encoded_entries
    backend.flush()
    assert backend.cache._encoded_entries - before == 50
    before = backend.cache._encoded_entries
    backend.flush()
    assert backend.cache._encoded_entries - before == 0
    for key in (0, 1, 100):
        at(backend, key)
        assert accumulator.value() == [key, 2 if key % 100 == 0 else 1]


def test_a_flush_that_cannot_encode_a_value_marks_nothing_written(make_backend: Any) -> None:
    """One state's value that cannot be pickled fails the flush; the other states' updates
    stay dirty and reach RocksDB with the next flush (they were marked clean unwritten)."""
    import threading

    backend = make_backend()
    counts = backend.get_partitioned_state(ValueStateDescriptor("counts"))
    other = backend.get_partitioned_state(ValueStateDescriptor("other"))
    at(backend, "a")
    counts.update(41)
    other.update(threading.Lock())
    with pytest.raises(TypeError) as failed:
        backend.flush()
    assert any("must be picklable" in note for note in failed.value.__notes__)
    other.update(7)
    cold(backend)
    assert counts.value() == 41 and other.value() == 7
