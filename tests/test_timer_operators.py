"""ProcessOperator and KeyedProcessOperator: timestamps, timers, on_timer, side outputs,
and timers through snapshots restored after a failure and at other parallelisms."""

from __future__ import annotations

from typing import Any

import pytest

from chandy.core.functions import KeyedProcessFunction, ProcessFunction, RuntimeContext
from chandy.core.output_tag import OutputTag
from chandy.core.state import AggregatingStateDescriptor, ValueStateDescriptor
from chandy.core.time import MIN_TIMESTAMP, TimeDomain
from chandy.errors import InvalidProgramError
from chandy.state.heap import TIMER_STATE_PREFIX
from chandy.task.batches import TimestampedBatch
from chandy.task.operators.process import KeyedProcessOperator, ProcessOperator
from chandy.task.processing_time import ProcessingTimeService
from chandy.util.clock import ManualClock
from tests.operator_harness import KeyedOperatorHarness, KeyedSnapshot, OperatorHarness

LATE = OutputTag("late")
UNCONSUMED = OutputTag("nobody-reads-this")


def key_of(value: Any) -> Any:
    return value[0]


class Timeouts(KeyedProcessFunction):
    """Per record: an event-time timer at ts + 10 and a processing-time timer at now + 100;
    a record older than the watermark goes to the LATE side output."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count"))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        timers = ctx.timer_service()
        ts = ctx.timestamp()
        self.count.update((self.count.value() or 0) + 1)
        if ts is not None and ts < timers.current_watermark():
            yield LATE, value
            return
        if ts is not None:
            timers.register_event_time_timer(ts + 10)
        timers.register_processing_time_timer(timers.current_processing_time() + 100)
        yield ("seen", value[1], ts)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:
        yield (
            "fired",
            ctx.get_current_key(),
            timestamp,
            ctx.time_domain(),
            ctx.timestamp(),
            self.count.value(),
        )
        yield UNCONSUMED, "dropped"


def keyed(function: Any, **kwargs: Any) -> KeyedOperatorHarness:
    return KeyedOperatorHarness(KeyedProcessOperator(function), key_of, side_output_tags=["late"], **kwargs)


def test_plain_batches_have_no_timestamps_and_emit_plain_lists() -> None:
    h = keyed(Timeouts()).open_keyed()
    h.process_records([("a", 1), ("b", 2)])
    assert h.batches == [[("seen", 1, None), ("seen", 2, None)]]
    assert type(h.batches[0]) is list


def test_outputs_keep_their_record_timestamp() -> None:
    h = keyed(Timeouts()).open_keyed()
    h.process_records([("a", 1), ("b", 2), ("a", 3)], timestamps=[100, None, 105])
    assert h.batches == [
        TimestampedBatch([("seen", 1, 100), ("seen", 2, None), ("seen", 3, 105)], [100, None, 105])
    ]


def test_event_time_timers_fire_on_the_watermark_before_it_is_forwarded() -> None:
    h = keyed(Timeouts()).open_keyed()
    h.process_records([("a", 1), ("b", 2), ("a", 3)], timestamps=[100, 95, 100])  # a's two timers: one
    h.batches.clear()
    h.watermark(104)
    assert h.records() == []
    assert h.watermarks == [104]
    h.watermark(110)
    assert h.records() == [
        (("fired", "b", 105, TimeDomain.EVENT_TIME, 105, 1), 105),
        (("fired", "a", 110, TimeDomain.EVENT_TIME, 110, 2), 110),
    ]
    assert len(h.batches) == 1  # one batch per watermark
    assert h.watermarks == [104, 110]
    timers = h.operator.internal_timer_service()  # type: ignore[attr-defined]
    assert timers.num_event_time_timers() == 0
    assert h.side_records("late") == []
    h.process_records([("c", 7)], timestamps=[109])  # behind the watermark
    assert h.side_records("late") == [(("c", 7), 109)]


def test_processing_time_timers_fire_with_their_domain_and_no_timestamp() -> None:
    h = keyed(Timeouts()).open_keyed()
    h.process_records([("a", 1)])
    h.advance_processing_time(60)
    h.process_records([("b", 2)])
    h.batches.clear()
    assert h.advance_processing_time(40) == 1
    assert h.batches == [[("fired", "a", 1_100, TimeDomain.PROCESSING_TIME, 1_100, 1)]]
    h.advance_processing_time(100)
    assert h.values()[-1] == ("fired", "b", 1_160, TimeDomain.PROCESSING_TIME, 1_160, 1)
    assert h.records()[-1][1] is None


class TimerCtl(KeyedProcessFunction):
    """Registers and deletes timers as records say; reports the time it sees."""

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        key, op, ts = value
        timers = ctx.timer_service()
        getattr(timers, op)(ts)
        yield key, op, timers.current_watermark(), timers.current_processing_time()

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:
        yield ctx.get_current_key(), ctx.time_domain().name, timestamp
        if timestamp < 50 and ctx.time_domain() is TimeDomain.EVENT_TIME:
            ctx.timer_service().register_event_time_timer(timestamp + 20)  # for the timer's key


def test_delete_dedup_and_re_registration_inside_on_timer() -> None:
    h = keyed(TimerCtl()).open_keyed()
    h.process_records(
        [
            ("a", "register_event_time_timer", 10),
            ("a", "register_event_time_timer", 10),  # the same timer: kept once
            ("b", "register_event_time_timer", 20),
            ("b", "delete_event_time_timer", 20),
            ("c", "register_processing_time_timer", 1_010),
            ("c", "delete_processing_time_timer", 1_010),
            ("d", "register_processing_time_timer", 1_020),
        ]
    )
    assert h.values()[0] == ("a", "register_event_time_timer", MIN_TIMESTAMP, 1_000)
    h.batches.clear()
    h.watermark(100)
    assert h.values() == [("a", "EVENT_TIME", 10), ("a", "EVENT_TIME", 30), ("a", "EVENT_TIME", 50)]
    h.batches.clear()
    h.advance_processing_time(100)
    assert h.values() == [("d", "PROCESSING_TIME", 1_020)]


def test_a_non_keyed_process_function_sees_timestamps_and_cannot_set_timers() -> None:
    class Tag(ProcessFunction):
        def process_element(self, value: Any, ctx: ProcessFunction.Context) -> Any:
            if value == "timer":
                ctx.timer_service().register_event_time_timer(5)
            if value < 0:
                yield LATE, value
            else:
                yield value, ctx.timestamp(), ctx.timer_service().current_processing_time()

    operator = ProcessOperator(Tag())
    side: list[Any] = []
    operator.side_outputs = {"late": side.append}
    operator.processing_time_service = ProcessingTimeService(ManualClock(start_ms=7_000))
    h = OperatorHarness(operator)
    out: list[Any] = []
    operator.output = out.append
    h.open()
    operator.process_batch([1, -1])
    operator.process_batch(TimestampedBatch([2, -2, 3], [20, 21, None]))  # type: ignore[arg-type]
    assert out == [[(1, None, 7_000)], TimestampedBatch([(2, 20, 7_000), (3, None, 7_000)], [20, None])]
    assert side == [[-1], TimestampedBatch([-2], [21])]
    with pytest.raises(InvalidProgramError, match="only supported on a keyed stream.*key_by"):
        operator.process_batch(["timer"])


def test_a_function_without_on_timer_pays_for_no_timers() -> None:
    class Count(KeyedProcessFunction):
        def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
            yield value

    h = keyed(Count()).open_keyed()
    h.process_records([("a", 1)])
    h.watermark(10)
    assert not any(name.startswith(TIMER_STATE_PREFIX) for name in h.backend.tables)
    assert h.operator._timers is None  # type: ignore[attr-defined]
    assert h.watermarks == [10]


def test_aggregating_state_from_the_runtime_context() -> None:
    class Mean:
        def create_accumulator(self) -> tuple[int, int]:
            return (0, 0)

        def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
            return acc[0] + value, acc[1] + 1

        def get_result(self, acc: tuple[int, int]) -> float:
            return acc[0] / acc[1]

        def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
            return a[0] + b[0], a[1] + b[1]

    class RunningMean(KeyedProcessFunction):
        def open(self, runtime_context: RuntimeContext) -> None:
            self.mean = runtime_context.get_aggregating_state(
                AggregatingStateDescriptor("mean", Mean(), None)
            )

        def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
            self.mean.add(value[1])
            yield value[0], self.mean.get()

    h = keyed(RunningMean()).open_keyed()
    h.process_records([("a", 1), ("b", 10), ("a", 3)])
    assert h.values() == [("a", 1), ("b", 10), ("a", 2)]


# ---------------------------------------------------------------------- snapshots


def run_subtasks(parallelism: int, clock: ManualClock, restore_from: list[KeyedSnapshot] | None = None):
    return [
        keyed(Timeouts(), subtask=i, parallelism=parallelism, clock=clock).open_keyed(restore_from)
        for i in range(parallelism)
    ]


def feed(subtasks: list[KeyedOperatorHarness], keys: list[str]) -> None:
    for h in subtasks:
        mine = [(k, i) for i, k in enumerate(keys) if h.owns(k)]
        h.process_records(mine, timestamps=[100] * len(mine))


def fired(subtasks: list[KeyedOperatorHarness]) -> list[tuple[str, int, TimeDomain]]:
    """Every timer that fired, checking it fired on the subtask owning its key."""
    result = []
    for h in subtasks:
        for value in h.values():
            if value[0] == "fired":
                assert h.owns(value[1])
                result.append((value[1], value[2], value[3]))
    return sorted(result, key=repr)


def test_timers_registered_before_a_checkpoint_fire_once_after_a_failure() -> None:
    clock = ManualClock(start_ms=1_000)
    (h,) = run_subtasks(1, clock)
    feed([h], ["a", "b"])
    snapshot = h.snapshot_keyed(1)
    feed([h], ["c"])  # after the checkpoint: lost with the failure, as its timers
    h.close()  # the task fails
    (back,) = run_subtasks(1, clock, [snapshot])
    back.watermark(200)
    back.advance_processing_time(500)
    assert fired([back]) == sorted(
        [(k, 110, TimeDomain.EVENT_TIME) for k in "ab"]
        + [(k, 1_100, TimeDomain.PROCESSING_TIME) for k in "ab"],
        key=repr,
    )
    back.watermark(300)
    back.advance_processing_time(500)
    assert len(fired([back])) == 4  # nothing fires twice


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_after_rescaling_each_timer_fires_once_on_the_subtask_owning_its_key(old: int, new: int) -> None:
    clock = ManualClock(start_ms=1_000)
    keys = [f"k{i}" for i in range(60)]
    before = run_subtasks(old, clock)
    feed(before, keys)
    snapshots = [h.snapshot_keyed(7) for h in before]
    after = run_subtasks(new, clock, snapshots)
    for h in after:
        h.watermark(500)
    clock.advance_ms(500)
    for h in after:
        h.processing_time.fire_due()
    assert fired(after) == sorted(
        [(k, 110, TimeDomain.EVENT_TIME) for k in keys]
        + [(k, 1_100, TimeDomain.PROCESSING_TIME) for k in keys],
        key=repr,
    )
    # the restored keyed state is the owner's too: each timer saw its key's count
    for h in after:
        for value in h.values():
            assert value[5] == 1


class Route(KeyedProcessFunction):
    """Yields what each record lists: main outputs, ``(tag, value)`` pairs, odd tuples."""

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        return value[1]


@pytest.mark.parametrize("timestamps", [None, [5, 6, 7]])
def test_side_outputs_are_split_from_any_mix_of_outputs(timestamps: list[int] | None) -> None:
    h = keyed(Route()).open_keyed()
    h.process_records(
        [
            ("a", [(1, 2), (LATE, "x"), ()]),  # tuples only, one of them tagged
            ("b", [3, (LATE, "y"), (UNCONSUMED, "dropped"), ("tuple", LATE)]),  # mixed types
            ("c", [(4,), (5, 6)]),  # tuples, none tagged: no side output
        ],
        timestamps=timestamps,
    )
    ts = timestamps or [None, None, None]
    assert h.records() == [
        ((1, 2), ts[0]),
        ((), ts[0]),
        (3, ts[1]),
        (("tuple", LATE), ts[1]),
        ((4,), ts[2]),
        ((5, 6), ts[2]),
    ]
    assert h.side_records("late") == [("x", ts[0]), ("y", ts[1])]
    assert type(h.batches[0]) is (list if timestamps is None else TimestampedBatch)


def test_restored_timers_of_a_function_without_on_timer_still_fire_and_leave_state() -> None:
    class Remind(KeyedProcessFunction):
        def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
            ctx.timer_service().register_processing_time_timer(2_000)  # lazily creates the timers
            yield value

    clock = ManualClock(start_ms=1_000)
    h = keyed(Remind(), clock=clock).open_keyed()
    h.process_records([("a", 1)])
    snapshot = h.snapshot_keyed(1)  # only the processing-time table holds a timer
    back = keyed(Remind(), clock=clock).open_keyed([snapshot])
    timers = back.operator._timers  # type: ignore[attr-defined]
    assert timers is not None and timers.num_processing_time_timers() == 1
    assert back.advance_processing_time(1_500) == 1
    assert timers.num_processing_time_timers() == 0
