"""State time-to-live (StateTtlConfig) on the heap keyed state backend, with Flink's semantics,
driven by a ManualClock: every state type, both visibilities, both update types, cleanup on
read, incremental cleanup, snapshots that leave expired entries out, restore, and state
without TTL (window contents included) untouched."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chandy.api.environment import StreamExecutionEnvironment
from chandy.core.functions import KeyedProcessFunction, ProcessWindowFunction, RuntimeContext
from chandy.core.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from chandy.core.time import MAX_WATERMARK, Duration, Time
from chandy.core.windows import TumblingEventTimeWindows
from chandy.graph.execution_graph import ExecutionGraph
from chandy.state.handles import ByteStreamStateHandle, KeyGroupsStateHandle
from chandy.state.heap import (
    HeapAggregatingState,
    HeapKeyedStateBackend,
    HeapListState,
    HeapMapState,
    HeapNamespacedListState,
    HeapReducingState,
    HeapValueState,
    IncompatibleRestoredStateError,
    SerializedKeyedState,
)
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.storage.checkpoint_storage import StateReader
from chandy.task.operator_chain import OperatorChain
from chandy.task.operators.process import KeyedProcessOperator
from chandy.task.operators.window import WINDOW_STATE_NAME, ProcessWindowFunctionCall, WindowOperator
from chandy.task.services import TaskServices
from chandy.util.clock import ManualClock
from tests.jobs import FailOnceMap, KeyedCounter
from tests.operator_harness import KeyedOperatorHarness
from tests.probes import Probe
from tests.test_checkpointing_e2e import checkpointing_env

TTL_MS = 1_000
NEVER = StateTtlConfig.StateVisibility.NeverReturnExpired
RETURN = StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp
ON_WRITE = StateTtlConfig.UpdateType.OnCreateAndWrite
ON_READ = StateTtlConfig.UpdateType.OnReadAndWrite


def ttl(
    update: StateTtlConfig.UpdateType = ON_WRITE,
    visibility: StateTtlConfig.StateVisibility = NEVER,
    *,
    background: bool = False,
) -> StateTtlConfig:
    """A 1 s TTL; without background cleanup unless asked, so that only reads clean up."""
    builder = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).set_update_type(update)
    builder.set_state_visibility(visibility)
    if not background:
        builder.disable_cleanup_in_background()
    return builder.build()


def with_ttl(descriptor: StateDescriptor, config: StateTtlConfig) -> Any:
    descriptor.enable_time_to_live(config)
    return descriptor


class Clocked:
    """A backend over every key group with a ManualClock at 0."""

    def __init__(self) -> None:
        self.clock = ManualClock(start_ms=0)
        self.backend = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128, clock=self.clock)

    def at(self, key: Any) -> Clocked:
        self.backend.set_current_key(key, assign_to_key_group(key, 128))
        return self

    def state(self, descriptor: StateDescriptor) -> Any:
        return self.backend.get_partitioned_state(descriptor)

    def advance(self, ms: int) -> None:
        self.clock.advance_ms(ms)

    def raw(self, name: str) -> dict[Any, Any]:
        """Every stored entry of state ``name`` (expired or not), by key."""
        return {k: v for _, m in self.backend.tables[name].key_group_maps() for k, v in m.items()}


@pytest.fixture
def c() -> Clocked:
    return Clocked()


# ---------------------------------------------------------------------------- the config


def test_the_builder_has_flinks_defaults_and_setters() -> None:
    config = StateTtlConfig.new_builder(Time.seconds(1)).build()
    assert config.get_update_type() is ON_WRITE and config.is_enabled()
    assert config.get_state_visibility() is NEVER
    assert config.get_ttl_time_characteristic() is StateTtlConfig.TtlTimeCharacteristic.ProcessingTime
    assert config.get_ttl() == Time.seconds(1) and config.ttl_milliseconds() == 1000
    strategies = config.get_cleanup_strategies()
    assert strategies.is_cleanup_in_background() and not strategies.in_full_snapshot()
    default = strategies.get_incremental_cleanup_strategy()
    assert default is not None
    assert (default.get_cleanup_size(), default.run_cleanup_for_every_record()) == (5, False)

    built = (
        StateTtlConfig.new_builder(Duration.of_minutes(1))
        .update_ttl_on_read_and_write()
        .return_expired_if_not_cleaned_up()
        .use_processing_time()
        .cleanup_full_snapshot()
        .cleanup_incrementally(10, True)
        .cleanup_in_rocksdb_compact_filter(500)
        .disable_cleanup_in_background()
        .set_ttl(Time.minutes(2))
        .build()
    )
    assert built.get_update_type() is ON_READ and built.get_state_visibility() is RETURN
    assert built.ttl_milliseconds() == 120_000
    strategies = built.get_cleanup_strategies()
    assert strategies.in_full_snapshot() and not strategies.is_cleanup_in_background()
    incremental = strategies.get_incremental_cleanup_strategy()
    assert incremental is not None
    assert (incremental.get_cleanup_size(), incremental.run_cleanup_for_every_record()) == (10, True)
    rocksdb = strategies.get_rocksdb_compact_filter_cleanup_strategy()
    assert rocksdb is not None and rocksdb.get_query_time_after_num_entries() == 500
    assert rocksdb.get_periodic_compaction_time() == Duration.of_days(30)
    assert "OnReadAndWrite" in repr(built)
    # Without background cleanup and without an explicit one, nothing cleans incrementally.
    bare = StateTtlConfig.new_builder(Time.seconds(1)).disable_cleanup_in_background().build()
    assert bare.get_cleanup_strategies().get_incremental_cleanup_strategy() is None
    assert (
        StateTtlConfig.new_builder(Time.seconds(1))
        .set_update_type(StateTtlConfig.UpdateType.Disabled)
        .build()
        .is_enabled()
        is False
    )


def test_wrong_settings_name_the_cause() -> None:
    with pytest.raises(TypeError, match="Time or a Duration"):
        StateTtlConfig.new_builder(1000)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be positive"):
        StateTtlConfig.new_builder(Time.seconds(0))
    with pytest.raises(ValueError, match="cleanup_size"):
        StateTtlConfig.new_builder(Time.seconds(1)).cleanup_incrementally(0, False)
    with pytest.raises(TypeError, match="UpdateType"):
        StateTtlConfig.new_builder(Time.seconds(1)).set_update_type("OnReadAndWrite")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="StateTtlConfig"):
        ValueStateDescriptor("v").enable_time_to_live(Time.seconds(1))  # type: ignore[arg-type]


def test_state_without_ttl_keeps_its_plain_handles_and_backend(c: Clocked) -> None:
    """No TTL, or a TTL with update type Disabled: the handles every job used before TTL
    existed, exactly (the W1 hot path), and no key listener on the backend."""
    disabled = StateTtlConfig.new_builder(Time.seconds(1)).set_update_type(StateTtlConfig.UpdateType.Disabled)
    cases = [
        (ValueStateDescriptor("v"), HeapValueState),
        (ListStateDescriptor("l"), HeapListState),
        (MapStateDescriptor("m"), HeapMapState),
        (ReducingStateDescriptor("r", lambda a, b: a + b), HeapReducingState),
        (AggregatingStateDescriptor("a", Average()), HeapAggregatingState),
        (with_ttl(ValueStateDescriptor("d"), disabled.build()), HeapValueState),
    ]
    for descriptor, handle_type in cases:
        assert type(c.state(descriptor)) is handle_type
    assert {t.kind for t in c.backend.tables.values()} == {"value", "list", "map", "reducing", "aggregating"}
    assert all(t.expire is None for t in c.backend.tables.values())
    assert type(c.backend) is HeapKeyedStateBackend and "current_key" in vars(c.backend)


# ---------------------------------------------------------------------------- value state


def test_a_value_expires_ttl_after_its_last_write(c: Clocked) -> None:
    value = c.at("k").state(with_ttl(ValueStateDescriptor("v"), ttl()))
    value.update(1)
    c.advance(600)
    assert value.value() == 1  # a read does not extend the life with OnCreateAndWrite
    value.update(2)  # a write does
    c.advance(999)
    assert value.value() == 2
    c.advance(1)  # last write + ttl <= now: expired (Flink's bound)
    assert value.value() is None
    assert c.raw("v") == {}, "the read that found it expired removed it"


def test_on_read_and_write_a_read_extends_the_life(c: Clocked) -> None:
    value = c.at("k").state(with_ttl(ValueStateDescriptor("v"), ttl(ON_READ)))
    value.update("x")
    for _ in range(5):
        c.advance(900)
        assert value.value() == "x"
    c.advance(1000)
    assert value.value() is None


def test_return_expired_if_not_cleaned_up_returns_it_once(c: Clocked) -> None:
    value = c.at("k").state(with_ttl(ValueStateDescriptor("v"), ttl(visibility=RETURN)))
    value.update("old")
    c.advance(5000)
    assert value.value() == "old"  # still stored: returned, and cleaned up by this read
    assert value.value() is None


def test_expiry_is_per_key(c: Clocked) -> None:
    value = c.at("a").state(with_ttl(ValueStateDescriptor("v"), ttl()))
    value.update("a")
    c.advance(500)
    c.at("b")
    value.update("b")
    c.advance(500)
    assert value.value() == "b"
    c.at("a")
    assert value.value() is None


# ---------------------------------------------------------------------------- list, map


def test_each_list_element_expires_on_its_own(c: Clocked) -> None:
    items = c.at("k").state(with_ttl(ListStateDescriptor("l"), ttl()))
    items.add(1)
    c.advance(400)
    items.add_all([2, 3])
    c.advance(400)
    items.add(4)
    assert list(items.get()) == [1, 2, 3, 4]
    c.advance(200)  # 1 expires
    assert list(items.get()) == [2, 3, 4]
    assert [v for v, _ in c.raw("l")["k"]] == [2, 3, 4], "the read removed the expired element"
    c.advance(400)
    assert list(items.get()) == [4]
    items.update([7, 8])  # all written now
    c.advance(999)
    assert list(items.get()) == [7, 8]
    c.advance(1)
    assert list(items.get()) == []
    assert c.raw("l") == {}


def test_list_visibility_and_update_on_read(c: Clocked) -> None:
    shown = c.at("k").state(with_ttl(ListStateDescriptor("shown"), ttl(visibility=RETURN)))
    shown.add("a")
    c.advance(600)
    shown.add("b")
    c.advance(500)
    assert list(shown.get()) == ["a", "b"]  # "a" expired but not cleaned up yet: shown once
    assert list(shown.get()) == ["b"]
    refreshed = c.state(with_ttl(ListStateDescriptor("refreshed"), ttl(ON_READ)))
    refreshed.add("a")
    for _ in range(3):
        c.advance(900)
        assert list(refreshed.get()) == ["a"]
    c.advance(1000)
    assert list(refreshed.get()) == []


def test_each_map_entry_expires_on_its_own(c: Clocked) -> None:
    mapping = c.at("k").state(with_ttl(MapStateDescriptor("m"), ttl()))
    mapping.put("old", 1)
    c.advance(500)
    mapping.put_all({"new": 2, "none": None})
    assert mapping.contains("none") and mapping.get("none") is None
    c.advance(500)
    assert mapping.get("old") is None and not mapping.contains("old") and "old" not in mapping
    assert mapping.get("new") == 2
    assert sorted(mapping.keys()) == ["new", "none"]
    assert sorted(mapping.items(), key=repr) == [("new", 2), ("none", None)]
    assert not mapping.is_empty()
    c.advance(500)
    assert list(mapping.values()) == [] and mapping.is_empty() and list(mapping) == []
    assert c.raw("m") == {}
    mapping["again"] = 3
    mapping.remove("again")
    assert mapping.is_empty()


def test_map_visibility_and_update_on_read(c: Clocked) -> None:
    shown = c.at("k").state(with_ttl(MapStateDescriptor("shown"), ttl(visibility=RETURN)))
    shown.put("a", 1)
    shown.put("b", 2)
    c.advance(1000)
    assert shown.get("a") == 1 and shown.get("a") is None  # shown once, then cleaned up
    assert dict(shown.items()) == {"b": 2}
    assert shown.is_empty()
    refreshed = c.state(with_ttl(MapStateDescriptor("refreshed"), ttl(ON_READ)))
    refreshed.put("by-get", 1)
    refreshed.put("by-iteration", 2)
    refreshed.put("untouched", 3)
    c.advance(600)
    assert refreshed.get("by-get") == 1
    assert refreshed.contains("by-iteration")
    c.advance(600)
    assert dict(refreshed.items()) == {"by-get": 1, "by-iteration": 2}  # reads refreshed them
    c.advance(999)
    assert sorted(refreshed.keys()) == ["by-get", "by-iteration"]  # iteration refreshed them too
    c.advance(999)
    assert sorted(refreshed.values()) == [1, 2]


# ---------------------------------------------------------------------------- reducing, aggregating


class Average:
    """An AggregateFunction: (sum, count) -> mean."""

    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc: tuple[int, int]) -> float:
        return acc[0] / acc[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


@pytest.mark.parametrize("visibility", [NEVER, RETURN], ids=["never", "return-expired"])
def test_reducing_and_aggregating_state_start_afresh_after_expiry(
    c: Clocked, visibility: StateTtlConfig.StateVisibility
) -> None:
    """Flink's TtlReduceFunction / TtlAggregateFunction: an add folds into the old value
    only if it is visible; every add re-stamps the value."""
    total = c.at("k").state(
        with_ttl(ReducingStateDescriptor("sum", lambda a, b: a + b), ttl(visibility=visibility))
    )
    mean = c.state(with_ttl(AggregatingStateDescriptor("mean", Average()), ttl(visibility=visibility)))
    for v in (1, 3):
        total.add(v)
        mean.add(v)
    c.advance(999)
    assert (total.get(), mean.get()) == (4, 2.0)
    total.add(10)
    mean.add(8)
    c.advance(999)
    assert (total.get(), mean.get()) == (14, 4.0)  # the adds extended the life
    c.advance(1)
    total.add(100)
    mean.add(100)
    if visibility is NEVER:
        assert (total.get(), mean.get()) == (100, 100.0)
    else:  # an expired value still stored is folded into, as in Flink
        assert (total.get(), mean.get()) == (114, 28.0)
    c.advance(1000)
    if visibility is RETURN:  # shown once more by the read that cleans them up
        assert (total.get(), mean.get()) == (114, 28.0)
    assert (total.get(), mean.get()) == (None, None)


def test_reducing_and_aggregating_reads_expire_and_refresh(c: Clocked) -> None:
    total = c.at("k").state(with_ttl(ReducingStateDescriptor("sum", lambda a, b: a + b), ttl(ON_READ)))
    mean = c.state(with_ttl(AggregatingStateDescriptor("mean", Average()), ttl(visibility=RETURN)))
    total.add(5)
    mean.add(5)
    c.advance(900)
    assert total.get() == 5
    c.advance(900)
    assert total.get() == 5  # refreshed by the read before
    c.advance(1000)
    assert total.get() is None
    assert mean.get() == 5.0 and mean.get() is None  # expired: shown once, then gone


# ---------------------------------------------------------------------------- incremental cleanup


def test_incremental_cleanup_removes_expired_entries_of_other_keys_on_each_access(c: Clocked) -> None:
    config = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).cleanup_incrementally(10, False).build()
    value = c.state(with_ttl(ValueStateDescriptor("v"), config))
    keys = [f"k{i}" for i in range(200)]
    for key in keys:
        c.at(key)
        value.update(key)
    c.advance(TTL_MS)
    c.at("reader")
    assert len(c.raw("v")) == 200
    accesses = 0
    while c.raw("v"):
        value.value()
        accesses += 1
        # 10 steps per access: 200 entries to check and 128 key groups to move through
        assert accesses <= 33, "every expired entry is reached within one round"
    assert accesses >= 20, "no more than 10 entries are checked per access"


def test_incremental_cleanup_leaves_unexpired_entries_and_trims_lists(c: Clocked) -> None:
    config = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).cleanup_incrementally(1000, False).build()
    items = c.state(with_ttl(ListStateDescriptor("l"), config))
    for key in range(50):
        c.at(key)
        items.add("old")
    c.advance(500)
    for key in range(25):
        c.at(key)
        items.add("new")
    c.advance(500)
    c.at("reader")
    items.get()  # 1000 steps: one round over every key group
    assert {k: [v for v, _ in e] for k, e in c.raw("l").items()} == {k: ["new"] for k in range(25)}


def test_run_cleanup_for_every_record_cleans_when_the_key_is_set(c: Clocked) -> None:
    """Operators set ``backend.current_key`` directly for every record and timer: with
    run_cleanup_for_every_record, that alone runs a cleanup step (Flink's key selection
    listener), even if the function touches no state."""
    config = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).cleanup_incrementally(5, True).build()
    value = c.state(with_ttl(ValueStateDescriptor("v"), config))
    for key in range(20):
        c.at(key)
        value.update(key)
    assert c.backend.current_key == 19
    c.advance(TTL_MS)
    for record in range(30):  # 5 steps each: a round of 128 key groups and 20 entries
        c.backend.current_key = ("record", record)
        c.backend.current_index = assign_to_key_group(("record", record), 128)
    assert c.raw("v") == {}
    assert c.backend.get_current_key() == ("record", 29)


def test_without_background_cleanup_only_reads_remove_expired_values(c: Clocked) -> None:
    value = c.state(with_ttl(ValueStateDescriptor("v"), ttl()))
    for key in range(20):
        c.at(key)
        value.update(key)
    c.advance(TTL_MS)
    c.at("reader")
    for _ in range(100):
        value.value()
    assert len(c.raw("v")) == 20
    c.at(3)
    assert value.value() is None and len(c.raw("v")) == 19


def test_cleanup_while_a_snapshot_is_in_flight_does_not_change_the_snapshot(c: Clocked) -> None:
    config = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).cleanup_incrementally(1000, False).build()
    items = c.state(with_ttl(ListStateDescriptor("l"), config))
    c.at("k")
    items.add("first")
    c.advance(500)
    items.add("second")
    snapshot = c.backend.snapshot()  # the barrier, at 500 ms: both elements alive
    c.advance(600)  # "first" expires; cleanup trims the live list
    c.at("other")
    items.get()
    items.get()
    assert [v for v, _ in c.raw("l")["k"]] == ["second"]
    serialized = snapshot.serialize()
    snapshot.release()
    restored = restore([serialized], clock=ManualClock(start_ms=500))
    restored_items = restored.get_partitioned_state(with_ttl(ListStateDescriptor("l"), config))
    restored.set_current_key("k", assign_to_key_group("k", 128))
    assert list(restored_items.get()) == ["first", "second"]


def test_values_a_cleanup_kept_are_still_copied_before_user_code_changes_them(c: Clocked) -> None:
    """Incremental cleanup trims a list into a new list that still holds the element objects
    a snapshot in flight holds; user code that then changes a read element in place must
    not reach the snapshot (copy-on-write as for state without TTL)."""
    config = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).cleanup_incrementally(1000, False).build()
    items = c.state(with_ttl(ListStateDescriptor("l"), config))
    c.at("k")
    items.add({"n": "old"})
    c.advance(500)
    items.add({"n": 1})
    snapshot = c.backend.snapshot()
    c.advance(500)  # the first element expires
    c.at("other")
    items.get()  # the cleanup trims k's list
    c.at("k")
    (element,) = items.get()
    element["n"] = 2  # in place, as user code may
    serialized = snapshot.serialize()
    snapshot.release()
    assert [v for v, _ in stored(restore([serialized], clock=ManualClock()), "l")["k"]] == [
        {"n": "old"},
        {"n": 1},
    ]
    assert list(items.get()) == [{"n": 2}]


# ---------------------------------------------------------------------------- snapshots and restore


def restore(
    serialized: list[SerializedKeyedState], *, clock: ManualClock, key_groups: KeyGroupRange | None = None
) -> HeapKeyedStateBackend:
    backend = HeapKeyedStateBackend(key_groups or KeyGroupRange(0, 127), 128, clock=clock)
    handles = [
        KeyGroupsStateHandle(s.key_group_range, s.ranges, ByteStreamStateHandle("x", s.payload))
        for s in serialized
    ]
    backend.restore(handles, StateReader())  # type: ignore[attr-defined]
    return backend


def checkpoint(backend: HeapKeyedStateBackend) -> SerializedKeyedState:
    snapshot = backend.snapshot()
    try:
        return snapshot.serialize()
    finally:
        snapshot.release()


def stored(backend: HeapKeyedStateBackend, name: str) -> dict[Any, Any]:
    table = backend.tables.get(name)
    return {} if table is None else {k: v for _, m in table.key_group_maps() for k, v in m.items()}


@pytest.mark.parametrize("visibility", [NEVER, RETURN], ids=["never", "return-expired"])
def test_a_snapshot_taken_after_expiry_holds_no_expired_entry(
    c: Clocked, visibility: StateTtlConfig.StateVisibility
) -> None:
    """Whatever the visibility, and although nothing read them (no cleanup ran), expired
    values, list elements and map entries are not written; the live ones are, with
    their timestamps."""
    config = ttl(visibility=visibility)
    value = c.state(with_ttl(ValueStateDescriptor("v"), config))
    items = c.state(with_ttl(ListStateDescriptor("l"), config))
    mapping = c.state(with_ttl(MapStateDescriptor("m"), config))
    total = c.state(with_ttl(ReducingStateDescriptor("r", lambda a, b: a + b), config))
    plain = c.state(ValueStateDescriptor("plain"))
    for key in ("gone", "kept"):
        c.at(key)
        value.update(key)
        items.add(f"{key}-old")
        mapping.put("old", key)
        total.add(1)
        plain.update(key)
    c.advance(600)
    c.at("kept")
    value.update("kept-new")
    items.add("kept-new")
    mapping.put("new", "kept")
    total.add(1)
    c.advance(400)  # everything written at 0 has expired, nothing was read
    assert len(c.raw("v")) == 2 and len(c.raw("l")["gone"]) == 1
    serialized = checkpoint(c.backend)
    for name in ("v", "l", "m", "r"):
        assert len(c.raw(name)) == 2, "the snapshot leaves the live state as it is"
    back = restore([serialized], clock=ManualClock(start_ms=0))
    assert stored(back, "v") == {"kept": ("kept-new", 600)}
    assert stored(back, "l") == {"kept": [("kept-new", 600)]}
    assert stored(back, "m") == {"kept": {"new": ("kept", 600)}}
    assert stored(back, "r") == {"kept": (2, 600)}
    assert stored(back, "plain") == {"gone": "gone", "kept": "kept"}, "state without TTL never expires"
    assert back.tables["v"].kind == "ttl value"


def test_the_snapshot_filters_at_the_time_of_its_barrier(c: Clocked) -> None:
    value = c.at("k").state(with_ttl(ValueStateDescriptor("v"), ttl()))
    value.update(1)
    c.advance(999)
    snapshot = c.backend.snapshot()
    c.advance(10_000)  # serialized much later (asynchronously): still as of the barrier
    serialized = snapshot.serialize()
    snapshot.release()
    assert stored(restore([serialized], clock=ManualClock()), "v") == {"k": (1, 0)}


def test_restored_values_keep_their_timestamps_and_expire_on_time(c: Clocked) -> None:
    config = ttl()
    value = c.at("k").state(with_ttl(ValueStateDescriptor("v"), config))
    value.update("x")
    c.advance(500)
    serialized = checkpoint(c.backend)
    clock = ManualClock(start_ms=700)  # the restarted task's clock
    half = KeyGroupRange.of_operator(128, 2, 0 if assign_to_key_group("k", 128) < 64 else 1)
    back = restore([serialized], clock=clock, key_groups=half)  # restored after rescaling
    restored = back.get_partitioned_state(with_ttl(ValueStateDescriptor("v"), config))
    back.set_current_key("k", assign_to_key_group("k", 128))
    assert restored.value() == "x"
    clock.advance_ms(299)
    assert restored.value() == "x"
    clock.advance_ms(1)
    assert restored.value() is None


def test_ttl_cannot_be_switched_on_or_off_across_a_restore(c: Clocked) -> None:
    """As in Flink, state with TTL restores only as state with TTL (the TTL itself may change)."""
    c.at("k").state(with_ttl(ValueStateDescriptor("ttl"), ttl())).update(1)
    c.state(ValueStateDescriptor("plain")).update(1)
    back = restore([checkpoint(c.backend)], clock=ManualClock(start_ms=0))
    with pytest.raises(IncompatibleRestoredStateError, match="enable_time_to_live"):
        back.get_partitioned_state(ValueStateDescriptor("ttl"))
    with pytest.raises(IncompatibleRestoredStateError, match="ttl value"):
        back.get_partitioned_state(with_ttl(ValueStateDescriptor("plain"), ttl()))
    longer = StateTtlConfig.new_builder(Time.seconds(10)).build()
    value = back.get_partitioned_state(with_ttl(ValueStateDescriptor("ttl"), longer))
    back.set_current_key("k", assign_to_key_group("k", 128))
    back.clock.advance_ms(5000)  # type: ignore[attr-defined]
    assert value.value() == 1, "a longer TTL applies to restored values"


# ---------------------------------------------------------------------------- in operators


class Sum(KeyedProcessFunction):
    """PyFlink's state_access.py example function: a running sum with a 1 s TTL refreshed
    on reads and writes, no background cleanup."""

    def open(self, runtime_context: RuntimeContext) -> None:
        descriptor = ValueStateDescriptor("state")
        descriptor.enable_time_to_live(
            StateTtlConfig.new_builder(Time.seconds(1))
            .set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)
            .disable_cleanup_in_background()
            .build()
        )
        self.state = runtime_context.get_state(descriptor)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        current = (self.state.value() or 0) + value[1]
        self.state.update(current)
        yield value[0], current


def test_a_keyed_process_function_forgets_a_key_idle_for_longer_than_the_ttl() -> None:
    h = KeyedOperatorHarness(KeyedProcessOperator(Sum()), lambda v: v[0], clock=ManualClock(0)).open_keyed()
    h.process_records([("a", 1), ("b", 10), ("a", 2)])
    h.clock.advance_ms(999)
    h.process_records([("a", 3)])  # "a" read and written: lives on; "b" untouched
    h.clock.advance_ms(1)
    h.process_records([("b", 20)])  # "b" idle for 1 s: expired, starts again
    snapshot = h.snapshot_keyed(1)
    h.clock.advance_ms(998)
    h.process_records([("a", 4)])
    assert h.values() == [("a", 1), ("b", 10), ("a", 3), ("a", 6), ("b", 20), ("a", 10)]
    h.clock.advance_ms(1_000)
    h.process_records([("a", 5), ("b", 30)])
    assert h.values()[-2:] == [("a", 5), ("b", 30)]
    # The checkpoint taken at 1,000 ms restores both sums, stamped as they were.
    clock = ManualClock(start_ms=1_999)
    back = KeyedOperatorHarness(KeyedProcessOperator(Sum()), lambda v: v[0], clock=clock).open_keyed(
        [snapshot]
    )
    back.process_records([("a", 100), ("b", 100)])
    assert back.values() == [("a", 100), ("b", 120)], "a (stamped at 999) expired, b (at 1,000) lives"


def test_acceptance_expired_values_are_invisible_and_a_checkpoint_after_expiry_lacks_them() -> None:
    """The issue's acceptance test, on the real operator and the real snapshot bytes, with a
    processing-time ManualClock: keys idle for the TTL read as absent, and the checkpoint
    taken then restores only the live key."""
    h = KeyedOperatorHarness(KeyedProcessOperator(Sum()), lambda v: v[0], clock=ManualClock(0)).open_keyed()
    h.process_records([("live", 1), ("idle", 10), ("idle-too", 100)])
    h.clock.advance_ms(600)
    h.process_records([("live", 1)])
    h.clock.advance_ms(400)  # "idle" and "idle-too" untouched for 1 s: expired
    checkpoint = h.snapshot_keyed(1)
    assert checkpoint.keyed is not None
    back = restore([checkpoint.keyed], clock=ManualClock(start_ms=1_000))
    assert stored(back, "state") == {"live": (2, 600)}
    h.process_records([("idle", 5), ("live", 1)])
    assert h.values()[-2:] == [("idle", 5), ("live", 3)]
    restored = KeyedOperatorHarness(
        KeyedProcessOperator(Sum()), lambda v: v[0], clock=ManualClock(start_ms=1_000)
    ).open_keyed([checkpoint])
    restored.process_records([("idle-too", 1), ("live", 1)])
    assert restored.values() == [("idle-too", 1), ("live", 3)]


class PerKeyAndWindow(ProcessWindowFunction):
    """Counts firings per key in global state with a TTL, and per window in window state with
    a TTL, and emits the window's contents."""

    def process(self, key: Any, context: ProcessWindowFunction.Context, elements: Any) -> Iterator[Any]:
        config = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).build()
        per_key = context.global_state().get_state(with_ttl(ValueStateDescriptor("per-key"), config))
        per_key.update((per_key.value() or 0) + 1)
        per_window = context.window_state().get_state(with_ttl(ValueStateDescriptor("per-window"), config))
        per_window.update((per_window.value() or 0) + 1)
        yield key, context.window().start, sorted(v for _, v in elements), per_key.value(), per_window.value()


def test_window_contents_never_expire_while_ttl_state_beside_them_does() -> None:
    """The window's own state has no TTL (its descriptor is the operator's): however much
    processing time passes, its contents are all there when it fires. A process window
    function's own state with a TTL, per key or per window, expires."""
    op = WindowOperator(
        TumblingEventTimeWindows.of(1000),
        TumblingEventTimeWindows.of(1000).get_default_trigger(),
        ListStateDescriptor(WINDOW_STATE_NAME),
        ProcessWindowFunctionCall(PerKeyAndWindow(), keyed=True, single_value=False),
        allowed_lateness=10_000,
    )
    h = KeyedOperatorHarness(op, lambda v: v[0], clock=ManualClock(0)).open_keyed()
    h.process_records([("a", 1), ("a", 2)], [0, 10])
    h.clock.advance_ms(60_000)
    h.watermark(999)
    h.process_records([("a", 3)], [20])  # late, allowed: fires again at once
    h.clock.advance_ms(TTL_MS)
    h.process_records([("a", 4)], [30])
    assert h.values() == [("a", 0, [1, 2], 1, 1), ("a", 0, [1, 2, 3], 2, 2), ("a", 0, [1, 2, 3, 4], 1, 1)]
    assert type(
        op.backend.get_partitioned_state(ListStateDescriptor(WINDOW_STATE_NAME), namespaced=True)
    ) is (HeapNamespacedListState)
    h.watermark(MAX_WATERMARK)
    assert op.backend.num_keys(WINDOW_STATE_NAME) == 0


def test_a_tasks_keyed_state_measures_ttl_in_the_tasks_clock() -> None:
    """OperatorChain gives each keyed operator's backend the task's clock (TaskServices.clock),
    so TTL follows the same processing time as timers, and tests can drive it."""
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    env.from_collection([("a", 1)]).key_by(lambda v: v[0]).process(Sum()).print()
    graph = ExecutionGraph(env._build_job_graph("ttl clock"))
    (keyed,) = [
        v for v in graph.all_execution_vertices() if any(spec.keyed for spec in v.job_vertex.operators)
    ]
    clock = ManualClock(start_ms=0)
    chain = OperatorChain(graph.deployment_descriptor(keyed), [], TaskServices(clock=clock), lambda: False)
    backends = [
        op.runtime_context.keyed_state_backend for op in chain.in_order() if op.runtime_context is not None
    ]
    assert [b.clock for b in backends if b is not None] == [clock]


# ---------------------------------------------------------------------------- PyFlink's example

ROOT = Path(__file__).resolve().parent.parent


def test_the_state_access_example_prints_what_pyflink_prints() -> None:
    """``examples/state_access.py`` is PyFlink 2.3's ``examples/datastream/state_access.py``
    with its imports changed; ``tests/pyflink_outputs/state-access.txt`` is what PyFlink
    printed, run as shipped on 2 cores (parallelism 2; both keys landed on subtask 1, hence
    the ``1>``). Chandy's default parallelism is 1, which prints no prefix; the records are
    the same, in the same order (the FLOAT amounts rounded to 32 bits, the sums in 64)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "state_access.py"), "--executor", "local"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = (ROOT / "tests" / "pyflink_outputs" / "state-access.txt").read_text(encoding="utf-8")
    assert done.stdout.splitlines() == [re.sub(r"^\d+> ", "", line) for line in expected.splitlines()]


def test_the_guides_example_prints_what_it_says() -> None:
    """docs/state-ttl.md's example runs as printed (on the local executor) and prints the
    lines the page shows after it."""
    page = (ROOT / "docs" / "state-ttl.md").read_text(encoding="utf-8")
    (language, code), (shown_language, shown) = re.findall(r"```(\w+)\n(.*?)```", page, re.S)[:2]
    assert (language, shown_language) == ("python", "text")
    code = code.replace("get_execution_environment()", 'get_execution_environment(executor="local")')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [re.sub(r"^\d+> ", "", line) for line in done.stdout.splitlines()]
    assert sorted(printed) == sorted(shown.splitlines())


# ---------------------------------------------------------------------------- in a job


class TtlKeyedCounter(KeyedCounter):
    """KeyedCounter whose count has a TTL (an hour: nothing expires in the test) with a
    cleanup step for every record, so the real tasks run the TTL handles, the key listener
    and the snapshot filter through checkpoints, a failure and a restore."""

    def open(self, runtime_context: RuntimeContext) -> None:
        count = ValueStateDescriptor("count")
        count.enable_time_to_live(
            StateTtlConfig.new_builder(Time.hours(1)).cleanup_incrementally(5, True).build()
        )
        self.counter = runtime_context.get_state(count)


@pytest.mark.quick  # the quick subset's exactly-once-through-a-failure test on both executors
def test_state_with_ttl_is_exactly_once_through_a_failure(executor: str) -> None:
    n, keys = 100_000, 100
    probe = Probe()
    env = checkpointing_env(executor=executor, interval_ms=100)
    out = (
        env.from_sequence(0, n - 1)
        .map(FailOnceMap("failing", probe, n // 2, seed=7))
        .key_by(lambda x: x % keys)
        .process(TtlKeyedCounter(n // keys))
        .execute_and_collect("ttl exactly once", limit=10**6)
    )
    assert probe.get("failures") >= 1  # the failure happened (a restore passes the point again)
    assert sorted(out) == [(k, n // keys) for k in range(keys)]  # no overflow, no key short
