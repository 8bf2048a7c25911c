"""Watermarks: the valve that combines input channels, and where watermarks start.

The valve is driven with exact event sequences (Flink's StatusWatermarkValveTest
shape); the emitter with a manual clock: periodic watermarks, idleness and the
end of input happen when the test moves time, never by sleeping.
"""

from __future__ import annotations

from typing import Any

import pytest

from chandy.core.time import MAX_WATERMARK, MIN_TIMESTAMP, Duration
from chandy.core.watermark_strategy import TimestampAssigner, WatermarkStrategy
from chandy.network.events import ACTIVE, IDLE, Watermark
from chandy.network.watermark_valve import StatusWatermarkValve
from chandy.task.batches import TimestampedBatch
from chandy.task.operators.timestamps import WatermarkEmitter
from chandy.task.processing_time import ProcessingTimeService
from chandy.util.clock import ManualClock

# -- the valve -----------------------------------------------------------------------------


def test_the_watermark_is_the_minimum_over_channels_and_only_advances() -> None:
    valve = StatusWatermarkValve(3)
    assert valve.input_watermark(0, 10) == []  # channels 1 and 2 are still at MIN
    assert valve.input_watermark(1, 5) == []
    assert valve.input_watermark(2, 7) == [Watermark(5)]
    assert valve.input_watermark(1, 12) == [Watermark(7)]
    assert valve.input_watermark(1, 11) == []  # a channel going back changes nothing
    assert valve.input_watermark(2, 9) == [Watermark(9)]
    assert valve.input_watermark(2, 9) == []  # nothing new: nothing forwarded
    assert valve.last_output == 9


def test_an_idle_channel_does_not_hold_the_watermark_back() -> None:
    valve = StatusWatermarkValve(2)
    assert valve.input_watermark(0, 100) == []
    assert valve.input_status(1, True) == [Watermark(100)]  # channel 1 held the minimum
    assert valve.input_watermark(0, 200) == [Watermark(200)]
    assert valve.input_watermark(1, 150) == []  # watermarks of an idle channel are ignored


def test_a_channel_becoming_active_rejoins_only_once_it_caught_up() -> None:
    valve = StatusWatermarkValve(2)
    valve.input_watermark(0, 100)
    valve.input_status(1, True)
    valve.input_watermark(0, 300)
    assert valve.input_status(1, False) == []  # active again, but at MIN: not aligned
    assert valve.input_watermark(1, 200) == []  # still behind the output (300): ignored
    assert valve.input_watermark(0, 400) == [Watermark(400)]  # channel 1 does not hold it back
    assert valve.input_watermark(1, 450) == []  # now aligned: the minimum is 400
    assert valve.input_watermark(0, 500) == [Watermark(450)]


def test_all_channels_idle_flushes_the_highest_watermark_and_marks_the_task_idle() -> None:
    valve = StatusWatermarkValve(2)
    valve.input_watermark(0, 100)
    valve.input_watermark(1, 50)
    assert valve.last_output == 50
    assert valve.input_status(0, True) == []  # channel 0 was not holding the minimum
    assert valve.input_status(1, True) == [Watermark(100), IDLE]
    assert valve.is_idle
    assert valve.input_watermark(0, 500) == []  # an idle valve forwards nothing
    assert valve.input_status(0, False) == [ACTIVE]
    assert valve.input_watermark(0, 600) == [Watermark(600)]


def test_an_ended_channel_stops_holding_the_watermark_back() -> None:
    valve = StatusWatermarkValve(2)
    valve.input_watermark(0, 100)
    assert valve.channel_finished(1) == [Watermark(100)]
    assert valve.input_watermark(0, 200) == [Watermark(200)]
    assert valve.channel_finished(0) == []  # the last one: the task ends, nothing to forward


def test_the_first_watermark_starts_from_min() -> None:
    valve = StatusWatermarkValve(1)
    assert valve.last_output == MIN_TIMESTAMP
    assert valve.input_watermark(0, MIN_TIMESTAMP) == []
    assert valve.input_watermark(0, MAX_WATERMARK) == [Watermark(MAX_WATERMARK)]


# -- where watermarks start ----------------------------------------------------------------


class Emitted:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def watermark(self, timestamp: int) -> None:
        self.events.append(("watermark", timestamp))

    def status(self, idle: bool) -> None:
        self.events.append(("idle" if idle else "active",))


def emitter(
    strategy: WatermarkStrategy, interval: int = 200
) -> tuple[WatermarkEmitter, ManualClock, Emitted, ProcessingTimeService]:
    clock = ManualClock(start_ms=1_000_000)
    timers = ProcessingTimeService(clock)
    out = Emitted()
    e = WatermarkEmitter(strategy, interval, timers, out.watermark, out.status)
    e.start()
    return e, clock, out, timers


def advance(clock: ManualClock, timers: ProcessingTimeService, ms: int) -> None:
    clock.advance_ms(ms)
    timers.fire_due()


class FirstField(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        assert record_timestamp == MIN_TIMESTAMP  # the records carried none
        return int(value[0])


def test_bounded_out_of_orderness_watermarks_are_periodic_and_lag_the_highest_timestamp() -> None:
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_seconds(2)).with_timestamp_assigner(
        FirstField()
    )
    e, clock, out, timers = emitter(strategy)
    batch = e.assign([(5000, "a"), (3000, "b"), (9000, "c")])
    assert batch == TimestampedBatch([(5000, "a"), (3000, "b"), (9000, "c")], [5000, 3000, 9000])
    assert out.events == []  # nothing before the interval passed
    advance(clock, timers, 199)
    assert out.events == []
    advance(clock, timers, 1)
    assert out.events == [("watermark", 9000 - 2000 - 1)]
    advance(clock, timers, 200)
    assert out.events == [("watermark", 6999)]  # not advanced: not forwarded again
    e.assign([(12000, "d")])
    advance(clock, timers, 200)
    assert out.events[-1] == ("watermark", 9999)
    e.end_of_input()
    assert out.events[-1] == ("watermark", MAX_WATERMARK)
    advance(clock, timers, 1000)
    assert out.events[-1] == ("watermark", MAX_WATERMARK)  # periodic emission stopped


def test_monotonous_timestamps_follow_the_latest_record() -> None:
    e, clock, out, timers = emitter(
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda v, t: v)
    )
    e.assign([10, 20, 30])
    advance(clock, timers, 200)
    assert out.events == [("watermark", 29)]


def test_no_watermarks_still_assigns_timestamps_but_emits_only_the_end_of_input() -> None:
    e, clock, out, timers = emitter(
        WatermarkStrategy.no_watermarks().with_timestamp_assigner(lambda v, t: v * 10)
    )
    assert e.assign([1, 2]).timestamps == [10, 20]
    advance(clock, timers, 5000)
    assert out.events == []
    e.end_of_input()
    assert out.events == [("watermark", MAX_WATERMARK)]


def test_a_source_without_records_for_the_idle_timeout_goes_idle_until_the_next_record() -> None:
    strategy = (
        WatermarkStrategy.for_monotonous_timestamps()
        .with_timestamp_assigner(lambda v, t: v)
        .with_idleness(Duration.of_seconds(1))
    )
    e, clock, out, timers = emitter(strategy)
    e.assign([100])
    advance(clock, timers, 200)
    assert out.events == [("watermark", 99)]
    advance(clock, timers, 800)
    assert out.events == [("watermark", 99), ("idle",)]
    advance(clock, timers, 1000)
    assert out.events == [("watermark", 99), ("idle",)]  # idle: no watermarks
    e.assign([500])
    assert out.events[-1] == ("active",)
    advance(clock, timers, 200)
    assert out.events[-1] == ("watermark", 499)


def test_the_end_of_input_of_an_idle_source_marks_it_active_first() -> None:
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_idleness(Duration.of_millis(100))
    e, clock, out, timers = emitter(strategy, interval=100)
    advance(clock, timers, 100)
    assert out.events == [("idle",)]
    e.end_of_input()
    assert out.events == [("idle",), ("active",), ("watermark", MAX_WATERMARK)]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(-1)), "negative"),
        (
            lambda: WatermarkStrategy.for_monotonous_timestamps().with_idleness(Duration.of_millis(0)),
            "positive",
        ),
        (
            lambda: WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(42),
            "TimestampAssigner",
        ),
        (lambda: WatermarkStrategy.for_bounded_out_of_orderness("2s"), "Duration"),
    ],
)
def test_bad_strategies_fail_when_built(make: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        make()
