"""Watermarks through a running job: the minimum over input channels, idleness, union and rebalance.

Two sources feed a union and a rebalance into an operator of parallelism 2 that
records every watermark it receives. The sources emit their records in phases
the test releases one by one, so what each subtask may have seen at each point
is known exactly: the test waits for the expected watermark and checks that
nothing beyond it arrived while a slower source held it back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.api.datastream import DataStream
from chandy.core.connector import Boundedness, Source, SourceReader, SourceReaderContext
from chandy.core.time import MAX_WATERMARK, Duration
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.task.operators.base import StreamOperator
from tests.probes import Probe

PHASE = "phase"


class PhasedReader(SourceReader):
    idle_wait_s = 0.005

    def __init__(self, phases: Sequence[Sequence[int]], probe: Probe) -> None:
        self.phases = phases
        self.probe = probe
        self.next_phase = 0

    def add_splits(self, splits: Sequence[Any]) -> None:
        pass

    def poll_next(self, max_records: int) -> list[Any] | None:
        if self.next_phase > self.probe.get(PHASE):
            return []  # holding: the test has not released the next phase yet
        if self.next_phase == len(self.phases):
            return None
        records = list(self.phases[self.next_phase])
        self.next_phase += 1
        return records

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return []


class PhasedSource(Source):
    """Emits ``phases[0]`` at once, then each further phase (and finally the end of input)
    once the probe's ``phase`` counter allows it."""

    def __init__(self, phases: Sequence[Sequence[int]], probe: Probe) -> None:
        self.phases = phases
        self.probe = probe

    def get_boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED

    def create_splits(self, parallelism: int) -> list[Any]:
        return [0]

    def create_reader(self, context: SourceReaderContext) -> SourceReader:
        return PhasedReader(self.phases, self.probe)


class WatermarkRecorder(StreamOperator):
    """Passes records on and logs every watermark it receives, with its subtask."""

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self.probe = probe

    def process_batch(self, records: Any) -> None:
        self.output(records)

    def process_watermark(self, timestamp: int) -> None:
        assert self.runtime_context is not None
        self.probe.append((self.runtime_context.get_index_of_this_subtask(), timestamp))
        super().process_watermark(timestamp)


def record_watermarks(stream: DataStream, probe: Probe, parallelism: int) -> DataStream:
    import functools

    node = stream._add_operator("Watermark recorder", functools.partial(WatermarkRecorder, probe))
    node.parallelism = parallelism
    return DataStream._of(stream.get_execution_environment(), node)


def seen(probe: Probe) -> dict[int, list[int]]:
    by_subtask: dict[int, list[int]] = {0: [], 1: []}
    for subtask, timestamp in probe.items:
        by_subtask[subtask].append(timestamp)
    return by_subtask


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def both_reached(probe: Probe, watermark: int) -> Callable[[], bool]:
    return lambda: all(watermark in marks for marks in seen(probe).values())


def monotonous(idle_ms: int | None = None) -> WatermarkStrategy:
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda v, t: v)
    return strategy if idle_ms is None else strategy.with_idleness(Duration.of_millis(idle_ms))


def build(executor: str, probe: Probe, slow_strategy: WatermarkStrategy) -> Any:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.configure({"pipeline.auto-watermark-interval": "20 ms"})
    fast = env.from_source(
        PhasedSource([[1000, 2000, 3000, 4000, 5000], []], probe), monotonous(), "fast"
    ).set_parallelism(1)
    slow = env.from_source(
        PhasedSource([[100, 200], [8000], []], probe), slow_strategy, "slow"
    ).set_parallelism(1)
    out = record_watermarks(fast.union(slow).rebalance(), probe, parallelism=2)
    out.add_sink(lambda value: None).set_parallelism(2)
    return env.execute_async("watermark propagation")


def test_the_watermark_is_the_minimum_over_a_union_and_a_rebalance(executor: str) -> None:
    probe = Probe()
    client = build(executor, probe, monotonous())
    try:
        wait_until(both_reached(probe, 199), "the slow source's watermark (199) on both subtasks")
        time.sleep(0.3)  # fifteen watermark intervals: the fast source (4999) must stay held back
        assert all(max(marks) == 199 for marks in seen(probe).values()), seen(probe)
        probe.add(PHASE)  # the slow source moves to 8000: the fast one (4999) is the minimum now
        wait_until(both_reached(probe, 4999), "the fast source's watermark (4999)")
        time.sleep(0.3)
        assert all(max(marks) == 4999 for marks in seen(probe).values()), seen(probe)
        probe.add(PHASE)  # the fast source ends: the slow one's 7999 is all that holds it
        wait_until(both_reached(probe, 7999), "the slow source's watermark (7999)")
        probe.add(PHASE)  # both end
        client.get_job_execution_result(timeout=120)
    finally:
        if not client.is_done():
            client.cancel()
    for marks in seen(probe).values():
        assert marks == sorted(set(marks)), "watermarks only advance, each forwarded once"
        assert marks[-1] == MAX_WATERMARK  # the end of input fires everything downstream
        assert 199 in marks and 4999 in marks and 7999 in marks


def test_an_idle_source_does_not_hold_the_watermark_back(executor: str) -> None:
    probe = Probe()
    client = build(executor, probe, monotonous(idle_ms=100))
    try:
        # The slow source emitted 100 and 200, then nothing: after 100 ms it is idle and
        # the fast source alone decides the watermark.
        wait_until(both_reached(probe, 4999), "the fast source's watermark while the slow one idles")
        probe.add(PHASE)  # the slow source becomes active again with 8000 (ahead of 4999)
        probe.add(PHASE)  # then everything ends
        probe.add(PHASE)
        client.get_job_execution_result(timeout=120)
    finally:
        if not client.is_done():
            client.cancel()
    for marks in seen(probe).values():
        assert marks == sorted(set(marks))
        assert marks[-1] == MAX_WATERMARK


def test_event_time_needs_a_watermark_strategy_object() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    from chandy.errors import InvalidProgramError

    with pytest.raises(InvalidProgramError, match="WatermarkStrategy"):
        env.from_source(PhasedSource([[1]], Probe()), "not a strategy", "s")  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match="WatermarkStrategy"):
        env.from_collection([1, 2]).assign_timestamps_and_watermarks(lambda v, t: v)  # type: ignore[arg-type]
