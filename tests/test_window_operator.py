"""The window operator driven by hand: assigners, triggers, window functions, lateness,
merging, processing time, and snapshots through real bytes (Flink's WindowOperatorTest)."""

from __future__ import annotations

import operator
import random
from collections.abc import Iterable
from typing import Any

import pytest

from chandy.core.functions import (
    AggregateFunction,
    ProcessAllWindowFunction,
    ProcessWindowFunction,
    WindowFunction,
)
from chandy.core.output_tag import OutputTag
from chandy.core.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from chandy.core.time import MAX_WATERMARK
from chandy.core.windows import (
    ContinuousEventTimeTrigger,
    CountSlidingWindowAssigner,
    CountTrigger,
    CountTumblingWindowAssigner,
    EventTimeSessionWindows,
    EventTimeTrigger,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    ProcessingTimeTrigger,
    PurgingTrigger,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    Trigger,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
)
from chandy.errors import InvalidProgramError
from chandy.task.operators.window import (
    FAST_STATE_NAME,
    WINDOW_STATE_NAME,
    ApplyWindowFunction,
    InternalWindowFunction,
    PassThroughWindowFunction,
    ProcessWindowFunctionCall,
    WindowOperator,
)
from tests.operator_harness import KeyedOperatorHarness, KeyedSnapshot

LATE = OutputTag("late")


def key(record: tuple[str, int]) -> str:
    return record[0]


def add_values(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    return a[0], a[1] + b[1]


class SumAndCount(AggregateFunction):
    """(sum, count) of the records' values; the result is ``(sum, count)``."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]  # mutable on purpose: copy-on-write snapshots must keep it as it was

    def add(self, value: tuple[str, int], accumulator: list[int]) -> list[int]:
        accumulator[0] += value[1]
        accumulator[1] += 1
        return accumulator

    def get_result(self, accumulator: list[int]) -> tuple[int, int]:
        return accumulator[0], accumulator[1]

    def merge(self, acc_a: list[int], acc_b: list[int]) -> list[int]:
        return [acc_a[0] + acc_b[0], acc_a[1] + acc_b[1]]


class GeneralEventTimeTrigger(EventTimeTrigger):
    """EventTimeTrigger's behaviour through the general path (the fast path takes only the
    exact default trigger)."""


def reduce_op(
    assigner: WindowAssigner[Any, Any],
    *,
    trigger: Trigger[Any, Any] | None = None,
    function: InternalWindowFunction | None = None,
    lateness: int = 0,
    late_tag: OutputTag | None = LATE,
) -> WindowOperator:
    return WindowOperator(
        assigner,
        trigger or assigner.get_default_trigger(),
        ReducingStateDescriptor(WINDOW_STATE_NAME, add_values),
        function or PassThroughWindowFunction(),
        allowed_lateness=lateness,
        late_data_output_tag=late_tag,
    )


def aggregate_op(
    assigner: WindowAssigner[Any, Any],
    *,
    trigger: Trigger[Any, Any] | None = None,
    function: InternalWindowFunction | None = None,
    lateness: int = 0,
) -> WindowOperator:
    return WindowOperator(
        assigner,
        trigger or assigner.get_default_trigger(),
        AggregatingStateDescriptor(WINDOW_STATE_NAME, SumAndCount()),
        function or PassThroughWindowFunction(),
        allowed_lateness=lateness,
        late_data_output_tag=LATE,
    )


def list_op(
    assigner: WindowAssigner[Any, Any], function: InternalWindowFunction, **kw: Any
) -> WindowOperator:
    return WindowOperator(
        assigner,
        kw.pop("trigger", None) or assigner.get_default_trigger(),
        ListStateDescriptor(WINDOW_STATE_NAME),
        function,
        late_data_output_tag=LATE,
        **kw,
    )


def harness(op: WindowOperator, **kw: Any) -> KeyedOperatorHarness:
    return KeyedOperatorHarness(op, key, side_output_tags=["late"], **kw).open_keyed()


def feed(h: KeyedOperatorHarness, *records: tuple[str, int, int]) -> None:
    """Records ``(key, value, timestamp)``."""
    h.process_records([(k, v) for k, v, _ in records], [t for _, _, t in records])


# ---------------------------------------------------------------------------------------------- event time


@pytest.mark.parametrize("trigger", [None, GeneralEventTimeTrigger()], ids=["fast", "general"])
def test_tumbling_event_time_reduce_fires_at_the_watermark_with_the_window_end_timestamp(
    trigger: Trigger[Any, Any] | None,
) -> None:
    op = reduce_op(TumblingEventTimeWindows.of(1000), trigger=trigger)
    h = harness(op)
    assert op._fast is (trigger is None)
    feed(h, ("a", 1, 1500), ("b", 10, 1200), ("a", 2, 300), ("a", 4, 1999))
    h.watermark(998)
    assert h.records() == []
    h.watermark(999)
    assert h.records() == [(("a", 2), 999)]
    assert h.watermarks == [998, 999]
    feed(h, ("a", 8, 1000))
    h.watermark(2500)
    assert sorted(h.records()) == [(("a", 2), 999), (("a", 13), 1999), (("b", 10), 1999)]
    assert op.num_panes() == 0
    assert op.num_timers() == 0


@pytest.mark.parametrize("trigger", [None, GeneralEventTimeTrigger()], ids=["fast", "general"])
def test_sliding_event_time_aggregate(trigger: Trigger[Any, Any] | None) -> None:
    op = aggregate_op(SlidingEventTimeWindows.of(2000, 1000), trigger=trigger)
    h = harness(op)
    feed(h, ("a", 1, 500), ("a", 2, 1500), ("a", 4, 2500))
    h.watermark(MAX_WATERMARK)
    assert h.records() == [((1, 1), 999), ((3, 2), 1999), ((6, 2), 2999), ((4, 1), 3999)]
    assert op.num_panes() == 0


def test_late_records_go_to_the_side_output_with_their_timestamps() -> None:
    for trigger in (None, GeneralEventTimeTrigger()):
        op = reduce_op(TumblingEventTimeWindows.of(1000), trigger=trigger)
        h = harness(op)
        feed(h, ("a", 1, 100))
        h.watermark(1500)
        feed(h, ("a", 2, 999), ("a", 3, 1000), ("b", 4, 5))
        h.watermark(MAX_WATERMARK)
        assert h.records() == [(("a", 1), 999), (("a", 3), 1999)]
        assert h.side_records("late") == [(("a", 2), 999), (("b", 4), 5)]


def test_late_records_without_a_side_output_are_dropped() -> None:
    h = harness(reduce_op(TumblingEventTimeWindows.of(1000), late_tag=None))
    h.watermark(5000)
    feed(h, ("a", 1, 100))
    h.watermark(MAX_WATERMARK)
    assert h.records() == [] and h.side_records("late") == []


@pytest.mark.parametrize("trigger", [None, GeneralEventTimeTrigger()], ids=["fast", "general"])
def test_allowed_lateness_refires_the_window_for_each_late_record_until_cleanup(
    trigger: Trigger[Any, Any] | None,
) -> None:
    op = reduce_op(TumblingEventTimeWindows.of(1000), trigger=trigger, lateness=500)
    h = harness(op)
    feed(h, ("a", 1, 100))
    h.watermark(1000)
    assert h.records() == [(("a", 1), 999)]
    feed(h, ("a", 2, 200))  # late, but within the lateness: fires again with everything
    assert h.records() == [(("a", 1), 999), (("a", 3), 999)]
    feed(h, ("b", 7, 900))  # a pane first seen within the lateness fires at once
    assert h.records()[-1] == (("b", 7), 999)
    h.watermark(1498)
    assert op.num_panes() == 2
    feed(h, ("a", 4, 300))
    assert h.records()[-1] == (("a", 7), 999)
    h.watermark(1499)  # cleanup time: max timestamp 999 + lateness 500
    assert op.num_panes() == 0
    feed(h, ("a", 8, 999))
    assert h.side_records("late") == [(("a", 8), 999)]
    h.watermark(MAX_WATERMARK)
    assert len(h.records()) == 4
    assert op.num_timers() == 0


def test_records_without_timestamps_into_an_event_time_window_name_the_fix() -> None:
    for trigger in (None, GeneralEventTimeTrigger()):
        h = harness(reduce_op(TumblingEventTimeWindows.of(1000), trigger=trigger))
        with pytest.raises((InvalidProgramError, ValueError), match="assign_timestamps_and_watermarks"):
            h.process_records([("a", 1)])


# ---------------------------------------------------------------------------------------------- sessions


def test_event_time_sessions_merge_and_bridge() -> None:
    op = reduce_op(EventTimeSessionWindows.with_gap(3000))
    h = harness(op)
    feed(h, ("a", 1, 0), ("a", 2, 6000), ("b", 5, 1000))
    assert op.num_panes() == 3
    feed(h, ("a", 4, 3000))  # touches [0, 3000) and [6000, 9000): one session [0, 9000)
    assert op.num_panes() == 2
    feed(h, ("a", 8, 10000))  # [10000, 13000): merges too (touches 9000? no: 9000 < 10000)
    h.watermark(8999)
    assert sorted(h.records()) == [(("a", 7), 8999), (("b", 5), 3999)]
    h.watermark(MAX_WATERMARK)
    assert h.records()[-1] == (("a", 8), 12999)
    assert op.num_panes() == 0
    assert op.backend.num_keys("merging-window-set") == 0
    assert op.num_timers() == 0


class Described(ProcessWindowFunction):
    """Emits (key, window, elements, firings of this key); per-window state counts firings
    of the window where windows do not merge."""

    def process(self, key: Any, context: ProcessWindowFunction.Context, elements: Iterable[Any]) -> Any:
        per_key = context.global_state().get_state(ValueStateDescriptor("fired-total"))
        per_key.update((per_key.value() or 0) + 1)
        window = context.window()
        yield key, (window.start, window.end), sorted(v for _, v in elements), per_key.value()


class PerWindow(ProcessWindowFunction):
    def process(self, key: Any, context: ProcessWindowFunction.Context, elements: Iterable[Any]) -> Any:
        per_window = context.window_state().get_state(ValueStateDescriptor("fired"))
        per_window.update((per_window.value() or 0) + 1)
        yield context.window().start, per_window.value()

    def clear(self, context: ProcessWindowFunction.Context) -> None:
        context.window_state().get_state(ValueStateDescriptor("fired")).clear()


def test_session_process_function_sees_all_records_of_the_merged_window() -> None:
    op = list_op(
        EventTimeSessionWindows.with_gap(1000),
        ProcessWindowFunctionCall(Described(), keyed=True, single_value=False),
        allowed_lateness=2000,
    )
    h = harness(op)
    feed(h, ("a", 1, 0), ("a", 2, 500), ("a", 3, 5000))
    h.watermark(1499)
    feed(h, ("a", 4, 1400))  # late but allowed: the session becomes [0, 2400) and fires again
    h.watermark(MAX_WATERMARK)
    assert h.records() == [
        (("a", (0, 1500), [1, 2], 1), 1499),
        (("a", (0, 2400), [1, 2, 4], 2), 2399),
        (("a", (5000, 6000), [3], 3), 5999),
    ]
    assert op.backend.num_keys(WINDOW_STATE_NAME) == 0 and op.backend.num_keys("fired-total") == 1


def test_per_window_state_lives_and_goes_with_its_window() -> None:
    op = list_op(
        TumblingEventTimeWindows.of(1000),
        ProcessWindowFunctionCall(PerWindow(), keyed=True, single_value=False),
        allowed_lateness=1000,
    )
    h = harness(op)
    feed(h, ("a", 1, 0), ("a", 2, 1500))
    h.watermark(1000)
    feed(h, ("a", 3, 10))  # fires [0, 1000) again
    assert h.values() == [(0, 1), (0, 2)]
    assert op.backend.num_keys("fired") == 1
    h.watermark(MAX_WATERMARK)
    assert h.values() == [(0, 1), (0, 2), (1000, 1)]
    assert op.backend.num_keys("fired") == 0
    sessions = harness(
        list_op(
            EventTimeSessionWindows.with_gap(10),
            ProcessWindowFunctionCall(PerWindow(), keyed=True, single_value=False),
        )
    )
    feed(sessions, ("a", 1, 0))
    with pytest.raises(InvalidProgramError, match="merging windows"):
        sessions.watermark(MAX_WATERMARK)


def test_processing_time_sessions() -> None:
    op = reduce_op(ProcessingTimeSessionWindows.with_gap(100))
    h = harness(op)
    h.process_records([("a", 1)])
    h.advance_processing_time(50)
    h.process_records([("a", 2)])
    h.advance_processing_time(98)  # the session is [1050, 1150): it fires at 1149
    assert h.records() == []
    h.advance_processing_time(1)
    assert h.records() == [(("a", 3), 1149)]


def test_a_merging_assigner_refuses_a_trigger_that_cannot_merge() -> None:
    class NoMerge(EventTimeTrigger):
        def can_merge(self) -> bool:
            return False

    with pytest.raises(InvalidProgramError, match="cannot merge"):
        reduce_op(EventTimeSessionWindows.with_gap(10), trigger=NoMerge())


# ---------------------------------------------------------------------------------------------- functions


class Apply(WindowFunction):
    def apply(self, key: Any, window: TimeWindow, inputs: Iterable[Any]) -> Any:
        return [(key, window.start, [v for _, v in inputs])]


class ProcessOne(ProcessWindowFunction):
    def process(self, key: Any, context: ProcessWindowFunction.Context, elements: Iterable[Any]) -> Any:
        (only,) = list(elements)
        yield key, context.window().start, only, context.current_watermark()


class AllProcess(ProcessAllWindowFunction):
    def process(self, context: ProcessAllWindowFunction.Context, elements: Iterable[Any]) -> Any:
        yield context.window().start, sorted(elements)
        yield OutputTag("late"), "side"


@pytest.mark.parametrize(
    "make, expected",
    [
        (
            lambda a: list_op(a, ApplyWindowFunction(Apply(), keyed=True, single_value=False)),
            [("a", 0, [1, 2]), ("a", 1000, [4])],
        ),
        (
            lambda a: reduce_op(
                a, function=ProcessWindowFunctionCall(ProcessOne(), keyed=True, single_value=True)
            ),
            [("a", 0, ("a", 3), 999), ("a", 1000, ("a", 4), 1999)],
        ),
        (
            lambda a: aggregate_op(
                a, function=ProcessWindowFunctionCall(ProcessOne(), keyed=True, single_value=True)
            ),
            [("a", 0, (3, 2), 999), ("a", 1000, (4, 1), 1999)],
        ),
        (
            lambda a: reduce_op(a, function=ApplyWindowFunction(Apply(), keyed=True, single_value=True)),
            [("a", 0, [3]), ("a", 1000, [4])],
        ),
        (
            lambda a: aggregate_op(
                a,
                function=ApplyWindowFunction(
                    lambda w, inputs: [(w.end, *inputs)], keyed=False, single_value=True
                ),
            ),
            [(1000, (3, 2)), (2000, (4, 1))],
        ),
    ],
    ids=["apply", "reduce+process", "aggregate+process", "reduce+apply", "aggregate+all-apply-callable"],
)
def test_window_functions(make: Any, expected: list[Any]) -> None:
    h = harness(make(TumblingEventTimeWindows.of(1000)))
    feed(h, ("a", 1, 10), ("a", 2, 20), ("a", 4, 1000))
    h.watermark(999)
    h.watermark(1999)
    assert h.values() == expected


def test_process_all_window_function_and_its_side_output() -> None:
    op = list_op(
        TumblingEventTimeWindows.of(1000),
        ProcessWindowFunctionCall(AllProcess(), keyed=False, single_value=False),
    )
    h = harness(op)
    h.process_records([("all", 3), ("all", 1)], [5, 6])
    h.watermark(MAX_WATERMARK)
    assert h.records() == [((0, [("all", 1), ("all", 3)]), 999)]
    assert h.side_records("late") == [("side", 999)]


# ---------------------------------------------------------------------------------------------- triggers


def test_count_windows_tumbling_and_sliding() -> None:
    tumbling = harness(reduce_op(CountTumblingWindowAssigner.of(3)))
    tumbling.process_records([("a", i) for i in range(1, 8)] + [("b", 100)])
    assert tumbling.values() == [("a", 6), ("a", 15)]
    assert tumbling.records()[0][1] == MAX_WATERMARK
    sliding = harness(reduce_op(CountSlidingWindowAssigner.of(3, 2)))
    sliding.process_records([("a", i) for i in range(1, 8)])
    assert sliding.values() == [("a", 6), ("a", 12), ("a", 18)]  # 1+2+3, 3+4+5, 5+6+7
    assert sliding.operator.num_panes() == 1  # window 3 holds record 7 only


def test_count_trigger_without_purge_keeps_the_contents() -> None:
    h = harness(reduce_op(GlobalWindows.create(), trigger=CountTrigger.of(2)))
    h.process_records([("a", i) for i in (1, 2, 3, 4, 5)])
    assert h.values() == [("a", 3), ("a", 10)]
    h2 = harness(reduce_op(GlobalWindows.create(), trigger=PurgingTrigger.of(CountTrigger.of(2))))
    h2.process_records([("a", i) for i in (1, 2, 3, 4, 5)])
    assert h2.values() == [("a", 3), ("a", 7)]


def test_global_windows_never_fire_by_default() -> None:
    h = harness(reduce_op(GlobalWindows.create()))
    h.process_records([("a", 1)], [5])
    h.watermark(MAX_WATERMARK)
    assert h.records() == []


def test_processing_time_tumbling_and_sliding_windows() -> None:
    op = reduce_op(TumblingProcessingTimeWindows.of(100))
    h = harness(op)  # the harness clock starts at 1000
    h.process_records([("a", 1), ("b", 2)])
    h.advance_processing_time(50)
    h.process_records([("a", 3)])
    h.watermark(MAX_WATERMARK)  # processing-time windows ignore watermarks
    assert h.records() == []
    h.advance_processing_time(48)  # the window [1000, 1100) fires when processing time reaches 1099
    assert h.records() == []
    h.advance_processing_time(1)
    assert sorted(h.records()) == [(("a", 4), 1099), (("b", 2), 1099)]
    assert op.num_panes() == 0 and op.num_timers() == 0
    sliding = harness(reduce_op(SlidingProcessingTimeWindows.of(200, 100)))
    sliding.process_records([("a", 1)])
    sliding.advance_processing_time(100)
    assert sliding.values() == [("a", 1)]
    sliding.process_records([("a", 2)])
    sliding.advance_processing_time(100)
    assert sliding.values() == [("a", 1), ("a", 3)]
    sliding.advance_processing_time(100)
    assert sliding.values() == [("a", 1), ("a", 3), ("a", 2)]


def test_processing_time_trigger_on_event_time_windows() -> None:
    op = reduce_op(TumblingEventTimeWindows.of(1000), trigger=ProcessingTimeTrigger.create())
    h = harness(op)
    h.process_records([("a", 1)], [1000 + 10])  # the window [1000, 2000) by event time
    h.watermark(1500)  # (a watermark past 1999 would clean the window up, as in Flink)
    assert h.records() == []
    h.advance_processing_time(998)  # processing time reaches 1998
    assert h.records() == []
    h.advance_processing_time(1)
    assert h.records() == [(("a", 1), 1999)]


def test_continuous_event_time_trigger_fires_every_interval_and_at_the_end() -> None:
    h = harness(reduce_op(TumblingEventTimeWindows.of(1000), trigger=ContinuousEventTimeTrigger.of(300)))
    feed(h, ("a", 1, 10), ("a", 2, 400))
    h.watermark(299)
    assert h.values() == []
    h.watermark(300)
    assert h.records() == [(("a", 3), 999)]
    feed(h, ("a", 4, 700))
    h.watermark(999)  # fires at 600, 900 and the window's end
    assert h.values() == [("a", 3), ("a", 7), ("a", 7), ("a", 7)]


# ---------------------------------------------------------------------------------------------- snapshots


def _run(
    make: Any,
    batches: list[list[tuple[str, int, int]]],
    watermarks: list[int],
    *,
    snapshot_after: int | None = None,
    restore_parallelism: int = 2,
) -> list[tuple[Any, int | None]]:
    """Feed ``batches`` (a watermark after each); optionally snapshot after batch
    ``snapshot_after``, throw the operator away and go on in ``restore_parallelism`` new
    subtasks restored from the snapshot's bytes. Returns every result, sorted."""
    h = harness(make())
    results: list[tuple[Any, int | None]] = []
    subtasks = [h]
    for i, (batch, wm) in enumerate(zip(batches, watermarks, strict=True)):
        for s in subtasks:
            mine = [r for r in batch if s.owns(r[0])]
            if mine:
                feed(s, *mine)
            s.watermark(wm)
        if i == snapshot_after:
            snapshot: KeyedSnapshot = h.snapshot_keyed(1)
            results.extend(h.records())
            subtasks = [
                KeyedOperatorHarness(
                    make(), key, subtask=j, parallelism=restore_parallelism, side_output_tags=["late"]
                )
                for j in range(restore_parallelism)
            ]
            for s in subtasks:
                s.open_keyed([snapshot], 1)
                # The watermark is not part of a checkpoint (in Flink neither): a restored
                # subtask starts at MIN_TIMESTAMP, so records that were late before would
                # open their windows again until the next watermark. Give it the watermark
                # the snapshot was taken at, as the next one from upstream would be.
                s.watermark(wm)
    for s in subtasks:
        s.watermark(MAX_WATERMARK)
    for s in subtasks if snapshot_after is not None else [h]:
        results.extend(s.records())
    return sorted(results, key=repr)


def _random_batches(seed: int, n: int = 12) -> tuple[list[list[tuple[str, int, int]]], list[int]]:
    """Batches of 40 records over 10 keys, around the watermark before them (some late); every
    third batch spans only 30 ms of event time (mostly one window, as batches of a real stream)."""
    rng = random.Random(seed)
    batches, watermarks = [], []
    wm = 0
    for i in range(n):
        low, high = (-800, 1500) if i % 3 else (rng.randint(0, 1000), 0)
        high = high or low + 30
        batches.append(
            [
                (f"k{rng.randint(0, 9)}", rng.randint(1, 9), max(0, wm + rng.randint(low, high)))
                for _ in range(40)
            ]
        )
        wm += rng.randint(0, 900)
        watermarks.append(wm)
    return batches, watermarks


SNAPSHOT_CASES = {
    "tumbling-fast": lambda: reduce_op(TumblingEventTimeWindows.of(1000), lateness=300),
    "sliding-aggregate-fast": lambda: aggregate_op(SlidingEventTimeWindows.of(1000, 250), lateness=200),
    "tumbling-general": lambda: reduce_op(
        TumblingEventTimeWindows.of(1000), trigger=GeneralEventTimeTrigger(), lateness=300
    ),
    "sessions": lambda: aggregate_op(EventTimeSessionWindows.with_gap(400), lateness=100),
    "sessions-process": lambda: list_op(
        EventTimeSessionWindows.with_gap(400),
        ProcessWindowFunctionCall(Described(), keyed=True, single_value=False),
    ),
}


@pytest.mark.parametrize("case", list(SNAPSHOT_CASES))
def test_snapshot_and_restore_at_another_parallelism_gives_the_same_results(case: str) -> None:
    make = SNAPSHOT_CASES[case]
    batches, watermarks = _random_batches(11)
    uninterrupted = _run(make, batches, watermarks)
    assert uninterrupted
    for snapshot_after, parallelism in ((3, 1), (5, 2), (8, 3)):
        restored = _run(
            make, batches, watermarks, snapshot_after=snapshot_after, restore_parallelism=parallelism
        )
        assert restored == uninterrupted, (snapshot_after, parallelism)


def test_a_snapshot_in_flight_keeps_the_window_contents_as_they_were_at_the_barrier() -> None:
    def results(h: KeyedOperatorHarness) -> list[Any]:
        h.watermark(MAX_WATERMARK)
        return sorted(h.records())

    for make in (SNAPSHOT_CASES["sliding-aggregate-fast"], SNAPSHOT_CASES["sessions"]):
        before, after = [("a", 1, 100), ("a", 2, 200)], [("a", 4, 300)]
        h = harness(make())
        feed(h, *before)
        snapshot = h.backend.snapshot()  # taken, not yet serialized
        feed(h, *after)  # mutates the (mutable) accumulators in place
        serialized = snapshot.serialize()
        snapshot.release()
        restored = KeyedOperatorHarness(make(), key, side_output_tags=["late"]).open_keyed(
            [KeyedSnapshot(serialized, None)], 1
        )
        only_before, everything = harness(make()), harness(make())
        feed(only_before, *before)
        feed(everything, *before, *after)
        assert results(restored) == results(only_before)
        assert results(h) == results(everything) != results(only_before)


@pytest.mark.parametrize("seed", range(6))
def test_the_fast_path_gives_the_results_of_the_general_path(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.choice([100, 1000, 1500])
    slide = rng.choice([size, size // 2, size // 4])
    offset = rng.randint(-slide + 1, slide - 1)
    lateness = rng.choice([0, 0, 250, 2000])
    assigner = (
        TumblingEventTimeWindows.of(size, offset)
        if slide == size
        else SlidingEventTimeWindows.of(size, slide, offset)
    )
    batches, watermarks = _random_batches(seed + 100, n=15)
    for make_state in (
        lambda: ReducingStateDescriptor(WINDOW_STATE_NAME, add_values),
        lambda: AggregatingStateDescriptor(WINDOW_STATE_NAME, SumAndCount()),
    ):
        outputs = []
        for trigger in (EventTimeTrigger(), GeneralEventTimeTrigger()):
            op = WindowOperator(
                assigner,
                trigger,
                make_state(),
                PassThroughWindowFunction(),
                allowed_lateness=lateness,
                late_data_output_tag=LATE,
            )
            h = harness(op)
            assert op._fast is (type(trigger) is EventTimeTrigger)
            steps = []
            for i, (batch, wm) in enumerate(zip(batches, watermarks, strict=True)):
                if i % 4 == 2:
                    snapshot = h.backend.snapshot()  # copy-on-write in flight while records arrive
                feed(h, *batch)
                if i % 4 == 2:
                    snapshot.release()
                steps.append(sorted(h.records(), key=repr))
                h.watermark(wm)
                steps.append(sorted(h.records(), key=repr))
            h.watermark(MAX_WATERMARK)
            steps.append(sorted(h.records(), key=repr))
            steps.append(sorted(h.side_records("late"), key=repr))
            assert op.num_panes() == 0 and op.num_timers() == 0
            outputs.append(steps)
        assert outputs[0] == outputs[1]


def test_state_names() -> None:
    fast = harness(reduce_op(TumblingEventTimeWindows.of(1000)))
    feed(fast, ("a", 1, 1))
    assert fast.backend.num_keys(FAST_STATE_NAME) == 1
    general = harness(reduce_op(TumblingEventTimeWindows.of(1000), trigger=GeneralEventTimeTrigger()))
    feed(general, ("a", 1, 1))
    assert general.backend.num_keys(WINDOW_STATE_NAME) == 1


def test_reduce_with_operator_add_on_plain_numbers() -> None:
    op = WindowOperator(
        TumblingEventTimeWindows.of(10),
        EventTimeTrigger(),
        ReducingStateDescriptor(WINDOW_STATE_NAME, operator.add),
        PassThroughWindowFunction(),
    )
    h = KeyedOperatorHarness(op, lambda v: v % 3).open_keyed()
    h.process_records([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 15])
    h.watermark(MAX_WATERMARK)
    assert sorted(h.records()) == [(3, 9), (5, 9), (6, 19), (7, 9)]
