"""Broadcast state: ``ds.connect(rules.broadcast(descriptor)).process(...)``.

From the bottom up: the broadcast state in the operator state backend (snapshot, restore,
one identical copy per subtask at any parallelism), ``apply_to_all_keys`` on the keyed
backend, the two operators driven by hand (read-only element side, writable broadcast side,
keyed state, timers, side outputs, timestamps, restore), then the API in local jobs.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.api.broadcast_stream import BroadcastConnectedStream, BroadcastStream
from chandy.checkpoint.state_assignment import repartition_operator_state
from chandy.core.functions import (
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    ProcessFunction,
    RuntimeContext,
)
from chandy.core.output_tag import OutputTag
from chandy.core.state import (
    BroadcastState,
    ListStateDescriptor,
    MapStateDescriptor,
    ReadOnlyBroadcastState,
    StateTtlConfig,
    ValueStateDescriptor,
)
from chandy.core.time import Duration, TimeDomain
from chandy.errors import InvalidProgramError, JobExecutionError
from chandy.state.handles import (
    ByteStreamStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
)
from chandy.state.heap import (
    HeapKeyedStateBackend,
    IncompatibleRestoredStateError,
    IncompatibleStateError,
)
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.state.operator_state import OperatorStateBackend
from chandy.task.batches import TimestampedBatch
from chandy.task.operators.base import StateInitializationContext
from chandy.task.operators.broadcast import BroadcastProcessOperator, KeyedBroadcastProcessOperator
from chandy.task.processing_time import ProcessingTimeService
from chandy.util.clock import ManualClock
from tests.operator_harness import MAX_PARALLELISM, KeyedOperatorHarness, KeyedSnapshot, OperatorHarness

ROOT = Path(__file__).resolve().parent.parent
RULES = MapStateDescriptor("rules")
LIMITS = MapStateDescriptor("limits")
COUNT = ValueStateDescriptor("count")
LATE = OutputTag("late")


def _read(handle: Any, byte_range: tuple[int, int]) -> bytes:
    data: bytes = handle.data
    return data[byte_range[0] : byte_range[1]]


def _handles(backend: OperatorStateBackend, name: str) -> list[OperatorStateHandle]:
    snapshot = backend.snapshot()
    assert snapshot is not None
    payload, metas = snapshot
    return [OperatorStateHandle(metas, ByteStreamStateHandle(name, payload))]


def _restored(handles: list[OperatorStateHandle]) -> OperatorStateBackend:
    backend = OperatorStateBackend()
    backend.restore([(h.states, h.delegate) for h in handles], _read)
    return backend


# ---------------------------------------------------------------------- the state


def test_a_broadcast_state_is_snapshotted_entry_by_entry_in_broadcast_mode() -> None:
    backend = OperatorStateBackend()
    rules = backend.get_broadcast_state(RULES)
    assert isinstance(rules, BroadcastState)
    assert backend.get_broadcast_state(MapStateDescriptor("rules")) is rules, "one state per name"
    store = StateInitializationContext(backend, None).get_operator_state_store()
    assert store.get_broadcast_state(RULES) is rules, "what a CheckpointedFunction gets"
    rules.put_all({"a": 1, "b": [2, 3]})
    rules["c"] = {"x": 4}
    rules.remove("a")
    backend.get_broadcast_state(LIMITS)  # declared, empty: still in the snapshot
    (handle,) = _handles(backend, "subtask-0")
    assert handle.states["rules"].mode is OperatorStateDistributionMode.BROADCAST
    assert len(handle.states["rules"].elements) == 2
    assert handle.states["limits"].elements == ()
    restored = _restored([handle])
    assert restored.get_broadcast_state(RULES).items() == [("b", [2, 3]), ("c", {"x": 4})]
    assert restored.get_broadcast_state(LIMITS).is_empty()
    assert restored.get_registered_broadcast_state_names() == {"rules", "limits"}


def test_the_snapshot_is_taken_at_the_barrier_not_when_written_later() -> None:
    backend = OperatorStateBackend()
    rules = backend.get_broadcast_state(RULES)
    rules.put("r", [1])
    handles = _handles(backend, "s")
    rules.get("r").append(2)  # a change after the synchronous part
    rules.put("later", 0)
    assert _restored(handles).get_broadcast_state(RULES).items() == [("r", [1])]


@pytest.mark.parametrize(("old", "new"), [(2, 3), (2, 5), (3, 2), (3, 1), (2, 2)])
def test_every_new_subtask_restores_one_identical_copy_at_any_parallelism(old: int, new: int) -> None:
    """Each old subtask holds the same broadcast state (and different list state): after
    repartitioning every new subtask has the broadcast state exactly once, never merged
    copies (a merge would be visible as repeated list elements in the copy's entries)."""
    old_handles = []
    for subtask in range(old):
        backend = OperatorStateBackend()
        backend.get_broadcast_state(RULES).put_all({f"rule-{i}": [i, i * i] for i in range(5)})
        backend.get_list_state(ListStateDescriptor("offsets")).add(subtask)
        old_handles.append(_handles(backend, f"old-{subtask}"))
    new_handles = repartition_operator_state(old_handles, new)
    assert len(new_handles) == new
    offsets: list[int] = []
    for handles in new_handles:
        restored = _restored(handles)
        assert restored.get_broadcast_state(RULES).items() == [(f"rule-{i}", [i, i * i]) for i in range(5)]
        assert len(handles) == 1 or old != new  # equal parallelism keeps each subtask's own handle
        offsets += restored.get_list_state(ListStateDescriptor("offsets")).get()
    assert sorted(offsets) == list(range(old)), "list state is still split, not copied"


def test_the_element_side_view_reads_the_state_and_refuses_writes() -> None:
    backend = OperatorStateBackend()
    rules = backend.get_broadcast_state(RULES)
    view = rules.read_only
    assert isinstance(view, ReadOnlyBroadcastState) and not isinstance(view, BroadcastState)
    rules.put("a", 1)
    assert view.get("a") == 1 and "a" in view and view["a"] == 1 and list(view) == ["a"]
    assert view.get("missing") is None and not view.is_empty()
    assert view.items() == [("a", 1)] and view.keys() == ["a"] and view.values() == [1]
    for write in (
        lambda: view.put("b", 2),  # type: ignore[attr-defined]
        lambda: view.put_all({"b": 2}),  # type: ignore[attr-defined]
        lambda: view.remove("a"),  # type: ignore[attr-defined]
        view.clear,
    ):
        with pytest.raises(TypeError, match="broadcast state 'rules' is read-only in process_element"):
            write()
    with pytest.raises(TypeError, match="read-only"):
        view["b"] = 2  # type: ignore[index]
    assert rules.items() == [("a", 1)]


def test_entries_may_be_removed_while_iterating() -> None:
    rules = OperatorStateBackend().get_broadcast_state(RULES)
    rules.put_all({i: i for i in range(10)})
    for key, value in rules.items():
        if value % 2:
            rules.remove(key)
    for key in rules:
        if key > 4:
            del rules[key]
    assert rules.keys() == [0, 2, 4]


def test_a_name_holds_broadcast_or_list_state_not_both() -> None:
    backend = OperatorStateBackend()
    backend.get_broadcast_state(RULES)
    with pytest.raises(IncompatibleStateError, match="'rules' was registered as BROADCAST"):
        backend.get_list_state(ListStateDescriptor("rules"))
    backend.get_union_list_state(ListStateDescriptor("offsets"))
    with pytest.raises(IncompatibleStateError, match="'offsets' was registered as UNION"):
        backend.get_broadcast_state(MapStateDescriptor("offsets"))
    with pytest.raises(TypeError, match="broadcast state is a map: use a MapStateDescriptor"):
        backend.get_broadcast_state(ListStateDescriptor("x"))  # type: ignore[arg-type]


def test_restored_broadcast_state_declared_as_a_list_names_both_fixes() -> None:
    backend = OperatorStateBackend()
    backend.get_broadcast_state(RULES).put("a", 1)
    restored = _restored(_handles(backend, "s"))
    with pytest.raises(IncompatibleRestoredStateError) as raised:
        restored.get_list_state(ListStateDescriptor("rules"))
    message = str(raised.value)
    assert "the checkpoint holds it as BROADCAST state" in message
    assert "DataStream.broadcast(MapStateDescriptor)" in message and "uid()" in message


def test_apply_to_all_keys_visits_each_key_with_the_state_and_may_change_it() -> None:
    backend = HeapKeyedStateBackend(KeyGroupRange(0, 63), MAX_PARALLELISM)
    mine = [k for k in range(200) if assign_to_key_group(k, MAX_PARALLELISM) <= 63][:20]
    count = backend.get_partitioned_state(COUNT)
    other = backend.get_partitioned_state(ValueStateDescriptor("other"))
    for key in mine:
        backend.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))
        if key % 2:
            count.update(key)  # type: ignore[attr-defined]
        else:
            other.update(key)  # type: ignore[attr-defined]
    backend.set_current_key(mine[0], assign_to_key_group(mine[0], MAX_PARALLELISM))
    seen: list[tuple[Any, Any]] = []

    def double_or_drop(key: Any, state: Any) -> None:
        seen.append((key, state.value()))
        if key % 3 == 0:
            state.clear()
        else:
            state.update(state.value() * 2)

    backend.apply_to_all_keys(COUNT, double_or_drop)
    assert sorted(seen) == sorted((k, k) for k in mine if k % 2)
    assert backend.current_key == mine[0], "the current key is the one before"
    after: dict[Any, Any] = {}
    backend.apply_to_all_keys(COUNT, lambda key, state: after.update({key: state.value()}))
    assert after == {k: 2 * k for k in mine if k % 2 and k % 3}
    visited: list[Any] = []
    backend.apply_to_all_keys(ValueStateDescriptor("never-written"), lambda k, s: visited.append(k))
    assert visited == []


# ---------------------------------------------------------------------- the operators


def key_of(value: Any) -> Any:
    return value[0]


class Threshold(KeyedBroadcastProcessFunction):
    """Keyed side ``(key, amount)``: counted per key; emitted when at least the rule of its
    key (or the "*" rule). Broadcast side ``(key, limit)``: sets the rule, and with
    ``"reset"`` clears every key's count through ``apply_to_keyed_state``. An element of a
    key without a rule sets an event-time timer ``ts + 5`` that reports it late."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(COUNT)

    def process_element(self, value: Any, ctx: KeyedBroadcastProcessFunction.ReadOnlyContext) -> Any:
        self.count.update((self.count.value() or 0) + 1)
        rules = ctx.get_broadcast_state(RULES)
        limit = rules.get(ctx.get_current_key())
        if limit is None:
            limit = rules.get("*")
        if limit is None:
            if ctx.timestamp() is not None:
                ctx.timer_service().register_event_time_timer(ctx.timestamp() + 5)
            return
        if value[1] >= limit:
            yield ("pass", value, self.count.value(), ctx.timestamp())

    def process_broadcast_element(self, value: Any, ctx: KeyedBroadcastProcessFunction.Context) -> Any:
        if value == "reset":
            counts: list[tuple[Any, Any]] = []

            def reset(key: Any, state: Any) -> None:
                counts.append((key, state.value()))
                state.clear()

            ctx.apply_to_keyed_state(COUNT, reset)
            yield ("reset", sorted(counts), ctx.timestamp())
            return
        ctx.get_broadcast_state(RULES).put(value[0], value[1])
        yield LATE, ("rule", value, ctx.current_watermark())

    def on_timer(self, timestamp: int, ctx: KeyedBroadcastProcessFunction.OnTimerContext) -> Any:
        rules = ctx.get_broadcast_state(RULES)
        yield ("timer", ctx.get_current_key(), timestamp, ctx.time_domain(), rules.keys())


def _keyed_harness(**kwargs: Any) -> KeyedOperatorHarness:
    operator = KeyedBroadcastProcessOperator(Threshold(), (RULES,))
    return KeyedOperatorHarness(operator, key_of, side_output_tags=[LATE.tag_id], **kwargs)


def test_keyed_rules_filter_elements_and_reset_keyed_state_through_apply_to_keyed_state() -> None:
    harness = _keyed_harness().open_keyed()
    operator = harness.operator
    assert isinstance(operator, KeyedBroadcastProcessOperator)
    harness.process_records([("a", 5), ("b", 1)], timestamps=[10, 11], input_number=1)
    assert harness.values() == [], "no rules yet"
    operator.process_batch2(TimestampedBatch([("a", 3), ("*", 2)], [20, 21]))
    harness.process_records(
        [("a", 5), ("a", 2), ("b", 2), ("c", 1)], timestamps=[30, 31, 32, 33], input_number=1
    )
    assert harness.records() == [(("pass", ("a", 5), 2, 30), 30), (("pass", ("b", 2), 2, 32), 32)]
    assert [v for v, _ in harness.side_records(LATE.tag_id)] == [
        ("rule", ("a", 3), harness.operator.current_watermark),
        ("rule", ("*", 2), harness.operator.current_watermark),
    ]
    harness.batches.clear()
    operator.process_batch2(["reset"])
    assert harness.records() == [(("reset", [("a", 3), ("b", 2), ("c", 1)], None), None)]
    harness.batches.clear()
    harness.process_records([("a", 9)], input_number=1)
    assert harness.values() == [("pass", ("a", 9), 1, None)], "the count starts again"


def test_timers_of_the_keyed_side_fire_with_their_key_and_the_broadcast_state() -> None:
    harness = _keyed_harness().open_keyed()
    harness.process_records([("x", 1)], timestamps=[100], input_number=1)  # no rule: a timer at 105
    harness.operator.process_batch2([("y", 0)])
    harness.watermark(104)
    assert harness.values() == []
    harness.watermark(105)
    assert harness.records() == [(("timer", "x", 105, TimeDomain.EVENT_TIME, ["y"]), 105)]
    assert harness.watermarks == [104, 105]


def test_a_function_without_on_timer_gets_no_timer_tables() -> None:
    class NoTimers(KeyedBroadcastProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            yield value

        def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
            return None

    operator = KeyedBroadcastProcessOperator(NoTimers(), (RULES,))
    KeyedOperatorHarness(operator, key_of).open_keyed()
    assert operator._timers is None


def test_broadcast_and_keyed_state_come_back_after_restore_at_another_parallelism() -> None:
    """Two subtasks see the same rules and different keys; restored at parallelism 3, every
    subtask has the rules, and each key's count is on the subtask of its key group."""
    old = [_keyed_harness(subtask=i, parallelism=2).open_keyed() for i in range(2)]
    keys = [f"k{i}" for i in range(12)]
    for harness in old:
        harness.operator.process_batch2([("*", 0), ("k1", 100)])
        harness.process_records([(k, 1) for k in keys if harness.owns(k)], input_number=1)
    snapshots = [harness.snapshot_keyed(7) for harness in old]
    old_operator_state = []
    for i, snapshot in enumerate(snapshots):
        assert snapshot.operator is not None
        payload, metas = snapshot.operator
        old_operator_state.append([OperatorStateHandle(metas, ByteStreamStateHandle(f"old-{i}", payload))])
    new_operator_state = repartition_operator_state(old_operator_state, 3)
    for subtask in range(3):
        (handle,) = new_operator_state[subtask]  # one copy, from one old subtask
        assert isinstance(handle.delegate, ByteStreamStateHandle)
        # every old subtask's key groups (the harness keeps its own), the operator state assigned
        restore = [KeyedSnapshot(s.keyed, None) for s in snapshots]
        restore[0].operator = (handle.delegate.data, handle.states)
        harness = _keyed_harness(subtask=subtask, parallelism=3).open_keyed(restore, 7)
        operator = harness.operator
        assert isinstance(operator, KeyedBroadcastProcessOperator)
        assert operator.broadcast_states["rules"].items() == [("*", 0), ("k1", 100)]
        mine = [k for k in keys if harness.owns(k)]
        assert mine, "every subtask owns some of the keys"
        harness.process_records([(k, 5) for k in mine], input_number=1)
        assert harness.values() == [("pass", (k, 5), 2, None) for k in mine if k != "k1"]


class Enrich(BroadcastProcessFunction):
    """Non-keyed: elements are looked up in the broadcast state; the broadcast side adds
    entries and emits where it ran; it cannot reach keyed state."""

    def process_element(self, value: Any, ctx: BroadcastProcessFunction.ReadOnlyContext) -> Any:
        yield value, ctx.get_broadcast_state(RULES).get(value), ctx.timestamp()

    def process_broadcast_element(self, value: Any, ctx: BroadcastProcessFunction.Context) -> Any:
        if value == "keyed?":
            ctx.apply_to_keyed_state(COUNT, lambda k, s: None)  # type: ignore[attr-defined]
        ctx.get_broadcast_state(RULES).put(value[0], value[1])
        yield "added", value, ctx.timestamp(), ctx.current_processing_time() > 0


def test_non_keyed_elements_read_what_the_broadcast_side_wrote() -> None:
    harness = OperatorHarness(BroadcastProcessOperator(Enrich(), (RULES,)), operator_id="enrich")
    harness.operator.processing_time_service = ProcessingTimeService(ManualClock(start_ms=5))
    harness.open()
    operator = harness.operator
    assert isinstance(operator, BroadcastProcessOperator)
    operator.process_batch1(["a"])
    operator.process_batch2(TimestampedBatch([("a", 1)], [7]))
    operator.process_batch1(TimestampedBatch(["a", "b"], [8, 9]))
    assert harness.output == [  # a timestamped batch's records come as (value, timestamp)
        ("a", None, None),
        (("added", ("a", 1), 7, True), 7),
        (("a", 1, 8), 8),
        (("b", None, 9), 9),
    ]
    with pytest.raises(InvalidProgramError, match="apply_to_keyed_state needs keyed state.*key_by"):
        operator.process_batch2(["keyed?"])
    restored = OperatorHarness(BroadcastProcessOperator(Enrich(), (RULES,)), operator_id="enrich")
    restored.operator.processing_time_service = operator.processing_time_service
    restored.open([harness.snapshot(1)], 1)
    restored.operator.process_batch1(["a"])  # type: ignore[attr-defined]
    assert restored.output == [("a", 1, None)]


def test_an_undeclared_broadcast_state_is_a_clear_error() -> None:
    class Typo(BroadcastProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            return None

        def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
            ctx.get_broadcast_state(MapStateDescriptor("rulez")).put(1, 1)

    harness = OperatorHarness(BroadcastProcessOperator(Typo(), (RULES, LIMITS)), operator_id="typo").open()
    with pytest.raises(InvalidProgramError) as raised:
        harness.operator.process_batch2([1])  # type: ignore[attr-defined]
    assert "no broadcast state 'rulez': it has ['limits', 'rules']" in str(raised.value)
    assert "broadcast(...)" in str(raised.value)


# ---------------------------------------------------------------------- the API, in local jobs


class WhereAmI(BroadcastProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.subtask = runtime_context.get_index_of_this_subtask()

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield "element", value

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        ctx.get_broadcast_state(RULES).put(value, self.subtask)
        yield "broadcast", value, self.subtask


def test_every_subtask_gets_every_broadcast_element_and_the_elements_once(
    local_env: StreamExecutionEnvironment,
) -> None:
    rules = local_env.from_collection(["r1", "r2", "r3"]).broadcast(RULES)
    assert isinstance(rules, BroadcastStream) and rules.broadcast_state_descriptors == [RULES]
    connected = local_env.from_sequence(1, 50).connect(rules)
    assert isinstance(connected, BroadcastConnectedStream)
    result = connected.process(WhereAmI()).set_parallelism(3).execute_and_collect(limit=1000)
    assert sorted(v for kind, v in (r[:2] for r in result) if kind == "element") == list(range(1, 51))
    assert Counter((r[1], r[2]) for r in result if r[0] == "broadcast") == Counter(
        (rule, subtask) for rule in ("r1", "r2", "r3") for subtask in range(3)
    )


def test_the_graph_is_a_two_input_node_with_a_broadcast_second_input(
    local_env: StreamExecutionEnvironment,
) -> None:
    events = local_env.from_sequence(1, 10).key_by(lambda x: x % 3)
    rules = local_env.from_collection([("*", 1)]).broadcast(RULES, LIMITS)
    events.connect(rules).process(Threshold()).uid("rules").print()
    job = local_env._build_job_graph(None, clear=False)
    (vertex,) = [v for v in job.vertices if v.name.startswith("Keyed-Co-Process-Broadcast")]
    by_type = {e.type_number: e.partitioner.name for e in vertex.inputs}
    assert by_type[1] == "HASH" and by_type[2] == "BROADCAST"


def test_broadcast_without_descriptors_is_still_a_partitioning(local_env: StreamExecutionEnvironment) -> None:
    stream = local_env.from_collection([1, 2]).broadcast()
    assert not isinstance(stream, BroadcastStream)
    result = stream.map(lambda x: x * 10).set_parallelism(2).execute_and_collect(limit=10)
    assert sorted(result) == [10, 10, 20, 20]


def test_wrong_uses_are_refused_while_the_job_is_built(local_env: StreamExecutionEnvironment) -> None:
    source = local_env.from_collection([1, 2])
    with pytest.raises(
        InvalidProgramError, match="broadcast\\(\\) takes MapStateDescriptors.*ValueStateDescriptor"
    ):
        source.broadcast(COUNT)  # type: ignore[call-overload]
    with pytest.raises(InvalidProgramError, match="two MapStateDescriptors named \\['rules'\\]"):
        source.broadcast(RULES, MapStateDescriptor("rules"))
    rules = source.broadcast(RULES)
    with pytest.raises(InvalidProgramError, match="BroadcastProcessFunction should be applied to non-keyed"):
        source.key_by(lambda x: x).connect(rules).process(WhereAmI())
    with pytest.raises(InvalidProgramError, match="KeyedBroadcastProcessFunction should be applied to keyed"):
        source.connect(rules).process(Threshold())

    class NotBroadcast(ProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            return None

    with pytest.raises(InvalidProgramError, match="takes a BroadcastProcessFunction or a KeyedBroadcast"):
        source.connect(rules).process(NotBroadcast())  # type: ignore[arg-type]
    other = StreamExecutionEnvironment.get_execution_environment(executor="local")
    with pytest.raises(InvalidProgramError, match="different environments"):
        other.from_collection([1]).connect(rules)


def test_writing_broadcast_state_on_the_element_side_fails_the_job_with_the_fix(
    local_env: StreamExecutionEnvironment,
) -> None:
    class WritesOnTheWrongSide(KeyedBroadcastProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            ctx.get_broadcast_state(RULES).put(value, value)

        def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
            return None

    local_env.configure({"restart-strategy.type": "none"})
    events = local_env.from_collection([1, 2]).key_by(lambda x: x)
    stream = events.connect(local_env.from_collection([0]).broadcast(RULES)).process(WritesOnTheWrongSide())
    with pytest.raises(JobExecutionError) as raised:
        stream.execute_and_collect(limit=10)
    assert "is read-only in process_element" in str(raised.value.__cause__)
    assert "change it in process_broadcast_element" in str(raised.value.__cause__)


def test_keyed_process_function_contexts_are_unchanged(local_env: StreamExecutionEnvironment) -> None:
    """The process operators' element contexts now come from a hook the broadcast operators
    override: a plain KeyedProcessFunction still gets its own context and no broadcast state."""

    class Plain(KeyedProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            yield type(ctx).__name__, hasattr(ctx, "get_broadcast_state"), ctx.get_current_key()

    result = local_env.from_collection([1]).key_by(lambda x: x).process(Plain()).execute_and_collect(limit=5)
    assert result == [("_KeyedContext", False, 1)]


def test_the_example_prints_the_alerts_its_comments_promise() -> None:
    """examples/broadcast_rules.py: the transactions wait for their period's limits (paced
    late) and are checked in order all the same; the subtask of each account is fixed."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "broadcast_rules.py"), "--executor", "local"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(done.stdout.splitlines()) == [
        "1> ('alert', 't08', 'dave', 2, 'games', 25, 20)",
        "1> ('alert', 't14', 'dave', 3, 'groceries', 81, 80)",
        "2> ('alert', 't03', 'alice', 1, 'groceries', 110, 100)",
        "2> ('alert', 't05', 'bob', 1, 'travel', 330, 300)",
        "2> ('alert', 't11', 'alice', 2, 'groceries', 65, 60)",
    ]


def test_apply_to_all_keys_reads_expired_values_of_state_with_ttl_as_absent() -> None:
    """As Flink's heap backend: a key whose value expired but was not cleaned up yet is still
    visited, and its handle answers as for an absent value."""
    clock = ManualClock(start_ms=1_000)
    backend = HeapKeyedStateBackend(KeyGroupRange(0, 127), MAX_PARALLELISM, clock=clock)
    descriptor = ValueStateDescriptor("with-ttl")
    descriptor.enable_time_to_live(StateTtlConfig.new_builder(Duration.of_millis(100)).build())
    state = backend.get_partitioned_state(descriptor)
    for key in range(4):
        backend.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))
        state.update(key * 10)  # type: ignore[attr-defined]
    clock.advance_ms(60)
    state.update(99)  # type: ignore[attr-defined]  (key 3, written again)
    clock.advance_ms(60)
    seen: dict[Any, Any] = {}
    backend.apply_to_all_keys(descriptor, lambda key, s: seen.update({key: s.value()}))
    assert seen == {0: None, 1: None, 2: None, 3: 99}
