"""Windows and window assigners (chandy.core.windows): PyFlink's names, Flink's arithmetic."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest

from chandy.core.functions import RuntimeContext
from chandy.core.time import Duration, Time
from chandy.core.windows import (
    CountSlidingWindowAssigner,
    CountTrigger,
    CountTumblingWindowAssigner,
    CountWindow,
    DynamicEventTimeSessionWindows,
    EventTimeSessionWindows,
    EventTimeTrigger,
    GlobalWindow,
    GlobalWindows,
    MergingWindowAssigner,
    NeverTrigger,
    ProcessingTimeSessionWindows,
    ProcessingTimeTrigger,
    PurgingTrigger,
    SessionWindowTimeGapExtractor,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TriggerResult,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
)
from chandy.state.heap import HeapKeyedStateBackend
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.task.runtime_context import StreamingRuntimeContext


class _Context(WindowAssigner.WindowAssignerContext):
    """An assigner context over a real heap backend and a settable processing time."""

    def __init__(self, now: int = 0) -> None:
        self.now = now
        self.backend = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128)
        self.runtime_context = StreamingRuntimeContext(
            job_id="j",
            job_name="j",
            task_name="t",
            operator_name="window",
            subtask_index=0,
            parallelism=1,
            max_parallelism=128,
            attempt_number=0,
            job_parameters={},
            keyed_state_backend=self.backend,
        )

    def at_key(self, key: Any) -> _Context:
        self.backend.set_current_key(key, assign_to_key_group(key, 128))
        return self

    def get_current_processing_time(self) -> int:
        return self.now

    def get_runtime_context(self) -> RuntimeContext:
        return self.runtime_context


CTX = _Context()


def starts(windows: Any) -> list[tuple[int, int]]:
    return [(w.start, w.end) for w in windows]


def test_time_window_basics() -> None:
    w = TimeWindow(0, 10)
    assert w.max_timestamp() == 9
    assert w == TimeWindow(0, 10) and hash(w) == hash(TimeWindow(0, 10)) and w != TimeWindow(0, 11)
    assert w.intersects(TimeWindow(10, 20)) and w.intersects(TimeWindow(-5, 0))
    assert not w.intersects(TimeWindow(11, 20))
    assert w.cover(TimeWindow(5, 30)) == TimeWindow(0, 30)
    assert TimeWindow(0, 5) < TimeWindow(0, 6) < TimeWindow(1, 2)
    assert TimeWindow(0, 5) <= TimeWindow(0, 5)
    assert pickle.loads(pickle.dumps(w)) == w
    assert repr(w) == "TimeWindow(start=0, end=10)"


def test_window_start_with_offset_matches_flink_for_positive_and_negative_timestamps() -> None:
    assert TimeWindow.get_window_start_with_offset(1234, 0, 1000) == 1000
    assert TimeWindow.get_window_start_with_offset(999, 0, 1000) == 0
    assert TimeWindow.get_window_start_with_offset(1000, 0, 1000) == 1000
    assert TimeWindow.get_window_start_with_offset(1234, 300, 1000) == 300
    assert TimeWindow.get_window_start_with_offset(1300, 300, 1000) == 1300
    # Flink's fixed arithmetic for timestamps before the epoch: a window still holds its timestamp
    assert TimeWindow.get_window_start_with_offset(-1, 0, 1000) == -1000
    rng = random.Random(7)
    for _ in range(2000):
        size = rng.randint(1, 5000)
        offset = rng.randint(-size + 1, size - 1)
        ts = rng.randint(-(10**9), 10**9)
        start = TimeWindow.get_window_start_with_offset(ts, offset, size)
        assert start <= ts < start + size
        assert (start - offset) % size == 0


def test_count_and_global_windows() -> None:
    assert CountWindow(3) == CountWindow(3) != CountWindow(4)
    assert CountWindow(3).max_timestamp() == 2**63 - 1
    assert GlobalWindow.get() == GlobalWindow() and hash(GlobalWindow()) == 0
    assert pickle.loads(pickle.dumps(CountWindow(5))) == CountWindow(5)
    assert pickle.loads(pickle.dumps(GlobalWindow.get())) == GlobalWindow.get()


@pytest.mark.parametrize("size", [Time.seconds(5), Duration.of_seconds(5), 5000])
def test_tumbling_event_time_accepts_time_duration_or_millis(size: Any) -> None:
    assigner = TumblingEventTimeWindows.of(size)
    assert starts(assigner.assign_windows("x", 7_300, CTX)) == [(5000, 10000)]
    assert assigner.is_event_time()
    assert isinstance(assigner.get_default_trigger(), EventTimeTrigger)


def test_tumbling_with_offset_and_processing_time() -> None:
    assigner = TumblingEventTimeWindows.of(Time.hours(1), Time.minutes(15))
    assert starts(assigner.assign_windows("x", 3_600_000, CTX)) == [(900_000, 4_500_000)]
    processing = TumblingProcessingTimeWindows.of(Time.seconds(1))
    assert starts(processing.assign_windows("x", None, _Context(now=12_345))) == [(12_000, 13_000)]
    assert not processing.is_event_time()
    assert isinstance(processing.get_default_trigger(), ProcessingTimeTrigger)


def test_sliding_windows_hold_their_timestamp_latest_first() -> None:
    assigner = SlidingEventTimeWindows.of(Time.seconds(10), Time.seconds(5))
    assert starts(assigner.assign_windows("x", 12_000, CTX)) == [(10_000, 20_000), (5_000, 15_000)]
    assert starts(SlidingEventTimeWindows.of(3000, 1000, 500).assign_windows("x", 2600, CTX)) == [
        (2500, 5500),
        (1500, 4500),
        (500, 3500),
    ]
    rng = random.Random(3)
    for _ in range(500):
        slide = rng.randint(1, 50)
        size = slide * rng.randint(1, 5) + rng.randint(0, slide - 1)
        ts = rng.randint(-1000, 1000)
        windows = SlidingEventTimeWindows.of(size, slide).assign_windows("x", ts, CTX)
        expected = [s for s in range(ts - size - slide, ts + 1) if s % slide == 0 and s <= ts < s + size]
        assert sorted(w.start for w in windows) == expected
    processing = SlidingProcessingTimeWindows.of(Time.seconds(2), Time.seconds(1))
    assert starts(processing.assign_windows("x", None, _Context(now=5_500))) == [(5000, 7000), (4000, 6000)]


@pytest.mark.parametrize(
    "make",
    [
        lambda: TumblingEventTimeWindows.of(0),
        lambda: TumblingEventTimeWindows.of(1000, 1000),
        lambda: SlidingEventTimeWindows.of(1000, 0),
        lambda: SlidingEventTimeWindows.of(1000, 100, 100),
        lambda: EventTimeSessionWindows.with_gap(0),
        lambda: CountTumblingWindowAssigner.of(0),
    ],
)
def test_invalid_parameters_are_rejected(make: Any) -> None:
    with pytest.raises(ValueError):
        make()


def test_event_time_assigners_name_the_missing_timestamp() -> None:
    for assigner in (
        TumblingEventTimeWindows.of(1000),
        SlidingEventTimeWindows.of(1000, 500),
        EventTimeSessionWindows.with_gap(1000),
    ):
        with pytest.raises(ValueError, match="assign_timestamps_and_watermarks"):
            assigner.assign_windows("x", None, CTX)


def test_wrong_size_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="Duration, a Time or milliseconds"):
        TumblingEventTimeWindows.of("5s")


class _Collect(MergingWindowAssigner.MergeCallback[TimeWindow]):
    def __init__(self) -> None:
        self.merges: list[tuple[set[TimeWindow], TimeWindow]] = []

    def merge(self, to_be_merged: Any, merge_result: TimeWindow) -> None:
        self.merges.append((set(to_be_merged), merge_result))


def test_merge_windows_groups_overlapping_and_touching_windows() -> None:
    collect = _Collect()
    windows = [TimeWindow(0, 5), TimeWindow(20, 25), TimeWindow(3, 8), TimeWindow(8, 10), TimeWindow(30, 31)]
    TimeWindow.merge_windows(windows, collect)
    assert collect.merges == [({TimeWindow(0, 5), TimeWindow(3, 8), TimeWindow(8, 10)}, TimeWindow(0, 10))]


def test_session_assigners() -> None:
    sessions = EventTimeSessionWindows.with_gap(Time.seconds(3))
    assert starts(sessions.assign_windows("x", 10_000, CTX)) == [(10_000, 13_000)]
    assert isinstance(sessions, MergingWindowAssigner) and sessions.is_event_time()
    collect = _Collect()
    sessions.merge_windows([TimeWindow(0, 3000), TimeWindow(2000, 5000)], collect)
    assert collect.merges == [({TimeWindow(0, 3000), TimeWindow(2000, 5000)}, TimeWindow(0, 5000))]
    processing = ProcessingTimeSessionWindows.with_gap(1000)
    assert starts(processing.assign_windows("x", None, _Context(now=50))) == [(50, 1050)]


def test_dynamic_session_gap_from_an_extractor_or_a_callable() -> None:
    class Gap(SessionWindowTimeGapExtractor):
        def extract(self, element: Any) -> int:
            return int(element[1])

    dynamic = EventTimeSessionWindows.with_dynamic_gap(Gap())
    assert isinstance(dynamic, DynamicEventTimeSessionWindows)
    assert starts(dynamic.assign_windows(("a", 7), 100, CTX)) == [(100, 107)]
    by_callable = EventTimeSessionWindows.with_dynamic_gap(lambda e: Time.milliseconds(e))
    assert starts(by_callable.assign_windows(4, 10, CTX)) == [(10, 14)]
    with pytest.raises(ValueError, match="gap must be > 0"):
        dynamic.assign_windows(("a", 0), 100, CTX)
    processing = ProcessingTimeSessionWindows.with_dynamic_gap(lambda e: e)
    assert starts(processing.assign_windows(5, None, _Context(now=1))) == [(1, 6)]


def test_global_windows() -> None:
    assigner = GlobalWindows.create()
    assert list(assigner.assign_windows("x", None, CTX)) == [GlobalWindow.get()]
    assert isinstance(assigner.get_default_trigger(), NeverTrigger)


def test_count_tumbling_windows_count_per_key_in_keyed_state() -> None:
    ctx = _Context()
    assigner = CountTumblingWindowAssigner.of(3)
    got = {k: [assigner.assign_windows(i, None, ctx.at_key(k))[0].id for i in range(7)] for k in ("a", "b")}
    assert got == {"a": [0, 0, 0, 1, 1, 1, 2], "b": [0, 0, 0, 1, 1, 1, 2]}
    assert ctx.backend.num_keys("tumble-count-assigner") == 2
    trigger = assigner.get_default_trigger()
    assert isinstance(trigger, PurgingTrigger) and isinstance(trigger.nested_trigger, CountTrigger)


def test_count_sliding_windows_match_pyflink() -> None:
    ctx = _Context().at_key("k")
    assigner = CountSlidingWindowAssigner.of(3, 2)
    got = [sorted(w.id for w in assigner.assign_windows(i, None, ctx)) for i in range(7)]
    # window i holds records i*2 .. i*2+2
    assert got == [[0], [0], [0, 1], [1], [1, 2], [2], [2, 3]]


def test_trigger_results() -> None:
    assert TriggerResult.FIRE.is_fire() and not TriggerResult.FIRE.is_purge()
    assert TriggerResult.FIRE_AND_PURGE.is_fire() and TriggerResult.FIRE_AND_PURGE.is_purge()
    assert TriggerResult.PURGE.is_purge() and not TriggerResult.PURGE.is_fire()
    assert not TriggerResult.CONTINUE.is_fire() and not TriggerResult.CONTINUE.is_purge()
    assert EventTimeTrigger.create().can_merge() and ProcessingTimeTrigger.create().can_merge()
    assert PurgingTrigger.of(CountTrigger.of(2)).can_merge()
