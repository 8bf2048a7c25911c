"""Windows in real jobs: the API end to end, and Flink's EventTimeWindowCheckpointingITCase
(keyed tumbling, sliding and session event-time windows over an out-of-order source,
exactly-once checkpoints, one failure after a checkpoint, every window result exact and
committed once by the two-phase-commit FileSink) on both executors."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.connectors import Encoder, FileSink
from chandy.core.functions import (
    AggregateFunction,
    CheckpointListener,
    MapFunction,
    ProcessFunction,
    ProcessWindowFunction,
    RuntimeContext,
)
from chandy.core.output_tag import OutputTag
from chandy.core.time import Time
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.core.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)
from chandy.errors import InvalidProgramError
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too


def _by_third_field(value: Any, record_timestamp: int) -> int:
    return int(value[2])


def test_windows_through_the_api_on_the_local_executor(local_env: StreamExecutionEnvironment) -> None:
    records = [("a", 1, 100), ("b", 2, 200), ("a", 3, 1500), ("a", 4, 900), ("b", 5, 3000), ("a", 6, 50)]
    late = OutputTag("late")
    stream = local_env.from_collection(records).assign_timestamps_and_watermarks(
        WatermarkStrategy.for_bounded_out_of_orderness(5000).with_timestamp_assigner(_by_third_field)
    )
    sums = (
        stream.key_by(lambda r: r[0])
        .window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .allowed_lateness(Time.seconds(1))
        .side_output_late_data(late)
        .reduce(lambda a, b: (a[0], a[1] + b[1], max(a[2], b[2])))
    )
    # Nothing is late here (when a periodic watermark passes depends on timing; the
    # operator tests drive lateness by hand): the side output is wired and empty.
    result = sums.union(sums.get_side_output(late).map(lambda r: ("late", *r))).execute_and_collect()
    with result:
        out = sorted(result)
    assert out == [("a", 3, 1500), ("a", 11, 900), ("b", 2, 200), ("b", 5, 3000)]


def test_late_records_reach_the_side_output_in_a_job(local_env: StreamExecutionEnvironment) -> None:
    """One record per batch, 50 ms apart, and a watermark every 5 ms: each record sees the
    watermark of the records before it (monotonous timestamps: the latest minus 1)."""
    from tests.jobs import Throttle

    local_env.set_parallelism(1)
    local_env.configure({"chandy.network.batch-size": 1, "pipeline.auto-watermark-interval": 5})
    records = [("a", 1, 100), ("a", 2, 5000), ("a", 3, 200), ("a", 4, 4500)]
    late = OutputTag("late")
    sums = (
        local_env.from_collection(records)
        .map(Throttle(0.05))
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(_by_third_field)
        )
        .key_by(lambda r: r[0])
        .window(TumblingEventTimeWindows.of(1000))
        .allowed_lateness(1000)
        .side_output_late_data(late)
        .reduce(lambda a, b: (a[0], a[1] + b[1], min(a[2], b[2])))
    )
    with sums.union(sums.get_side_output(late).map(lambda r: ("late", *r))).execute_and_collect() as got:
        out = list(got)
    # after (a, 2, 5000) the watermark is 4999: [0, 1000) is past its lateness, so (a, 3, 200)
    # is late; [4000, 5000) is within it, so (a, 4, 4500) opens it and fires it at once
    assert sorted(out, key=repr) == sorted(
        [("a", 1, 100), ("late", "a", 3, 200), ("a", 4, 4500), ("a", 2, 5000)], key=repr
    )


def test_processing_time_windows_fire_while_the_job_runs_and_not_after_its_input_ends(
    local_env: StreamExecutionEnvironment,
) -> None:
    from tests.jobs import Throttle

    local_env.set_parallelism(1)
    local_env.configure({"chandy.network.batch-size": 1})

    def run(size_ms: int) -> list[Any]:
        sums = (
            local_env.from_collection([("k", 1)] * 40)
            .map(Throttle(0.01))
            .key_by(lambda r: r[0])
            .window(TumblingProcessingTimeWindows.of(size_ms))
            .reduce(lambda a, b: (a[0], a[1] + b[1]))
            .process(_WithTimestamp())
        )
        with sums.execute_and_collect() as got:
            return list(got)

    fired = run(50)  # 400 ms of input: several windows end while it lasts
    assert fired and all(ts % 50 == 49 for _, ts in fired)
    assert sum(v for (_, v), _ in fired) <= 40
    assert run(3_600_000) == []  # a window still open when the input ends never fires (Flink)


class _WithTimestamp(ProcessFunction):
    def process_element(self, value: Any, ctx: ProcessFunction.Context) -> Any:
        yield value, ctx.timestamp()


def _numbers(env: StreamExecutionEnvironment) -> Any:
    """``(i % 2, i, i * 100)`` for i in 0..9, with the third field as event time."""
    return env.from_collection([(i % 2, i, i * 100) for i in range(10)]).assign_timestamps_and_watermarks(
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(_by_third_field)
    )


def test_window_all_and_count_windows(local_env: StreamExecutionEnvironment) -> None:
    local_env.set_parallelism(1)  # count windows count in arrival order: keep the order
    totals = (
        _numbers(local_env)
        .window_all(TumblingEventTimeWindows.of(500))
        .apply(lambda window, inputs: [(window.start, sum(v for _, v, _ in inputs))])
        .process(_WithTimestamp())
    )
    with totals.execute_and_collect() as got:
        assert sorted(got) == [((0, 10), 499), ((500, 35), 999)]
    counted = (
        _numbers(local_env).key_by(lambda r: r[0]).count_window(2).reduce(lambda a, b: (a[0], a[1] + b[1], 0))
    )
    with counted.execute_and_collect() as got:
        # key 0: 0+2, 4+6 (8 alone is not a full window); key 1: 1+3, 5+7
        assert sorted(got) == [(0, 2, 0), (0, 10, 0), (1, 4, 0), (1, 12, 0)]
    all_counted = _numbers(local_env).count_window_all(4, 2).reduce(lambda a, b: (0, a[1] + b[1], 0))
    with all_counted.execute_and_collect() as got:
        assert sorted(v for _, v, _ in got) == [0 + 1 + 2 + 3, 2 + 3 + 4 + 5, 4 + 5 + 6 + 7, 6 + 7 + 8 + 9]


@pytest.mark.slow
def test_window_api_errors_name_the_fix(local_env: StreamExecutionEnvironment) -> None:
    keyed = local_env.from_collection([1]).key_by(lambda x: x)
    with pytest.raises(InvalidProgramError, match="WindowAssigner"):
        keyed.window("1s")  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match="AggregateFunction"):
        keyed.window(TumblingEventTimeWindows.of(10)).aggregate(lambda a, b: a)  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match="negative"):
        keyed.window(TumblingEventTimeWindows.of(10)).allowed_lateness(-1)
    with pytest.raises(InvalidProgramError, match="ProcessWindowFunction"):
        keyed.window(TumblingEventTimeWindows.of(10)).process(lambda k, c, e: e)


# ---------------------------------------------------------------------------------------------- ITCase

#: Records ``i`` in ``0..N-1``: key ``i % KEYS``, value ``i``, event time :func:`event_time`.
N = 120_000
KEYS = 10
#: Timestamps are dealt out of order within blocks of this many ms (so the disorder is below it).
BLOCK = 100
#: Of every second of event time only the first ``ACTIVE`` ms hold records: the gaps end sessions.
ACTIVE = 700
SESSION_GAP = 200


def event_time(i: int) -> int:
    """Record ``i``'s timestamp: position ``i`` shuffled within its block of ``BLOCK``
    (``j -> j * 19 % BLOCK``), then spread over the first ``ACTIVE`` ms of each second."""
    t = (i // BLOCK) * BLOCK + (i % BLOCK) * 19 % BLOCK
    return (t // ACTIVE) * 1000 + t % ACTIVE


def to_record(i: int) -> tuple[int, int, int]:
    return i % KEYS, i, event_time(i)


def expected_results() -> Counter[str]:
    """Every window result the job must commit, once each (the lines the sink writes)."""
    tumbling: dict[tuple[int, int], int] = defaultdict(int)
    sliding: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    times: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for i in range(N):
        key, _, ts = to_record(i)
        tumbling[key, ts - ts % 1000 + 999] += i
        last_start = ts - ts % 500
        for start in (last_start, last_start - 500):
            acc = sliding[key, start + 999]
            acc[0] += i
            acc[1] += 1
        times[key].append((ts, i))
    lines = [f"tumbling,{k},{end},{total}" for (k, end), total in tumbling.items()]
    lines += [f"sliding,{k},{end},{s},{c}" for (k, end), (s, c) in sliding.items()]
    for key, events in times.items():
        events.sort()
        start, last, total, count = events[0][0], events[0][0], 0, 0
        for ts, i in events:
            if ts > last + SESSION_GAP:  # windows [t, t + gap) that do not touch stay apart
                lines.append(f"session,{key},{start},{last + SESSION_GAP},{total},{count}")
                start, total, count = ts, 0, 0
            last, total, count = ts, total + i, count + 1
        lines.append(f"session,{key},{start},{last + SESSION_GAP},{total},{count}")
    return Counter(lines)


class FailAfterCheckpoint(MapFunction, CheckpointListener):
    """Subtask 0 raises once, 1000 records after the first checkpoint it hears complete (so the
    restore replays records and windows that the failed attempt had already seen); until a
    checkpoint completes it slows down, so that the job cannot end before one has."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def open(self, runtime_context: RuntimeContext) -> None:
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.done = self.subtask != 0 or self.probe.get("failures") > 0
        self.armed = False
        self.seen = 0

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.armed = True

    def map(self, value: Any) -> Any:
        if not self.done:
            if self.armed:
                self.seen += 1
                if self.seen == 1000:
                    self.done = True
                    if self.probe.add("failures") == 1:
                        raise RuntimeError("induced failure after a completed checkpoint")
            elif value[1] % 20 == 0:
                time.sleep(0.001)
        return value


def tumbling_sum(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return a[0], a[1] + b[1], max(a[2], b[2])


class SumCount(AggregateFunction):
    def create_accumulator(self) -> list[int]:
        return [0, 0, 0]

    def add(self, value: tuple[int, int, int], accumulator: list[int]) -> list[int]:
        accumulator[0] = value[0]
        accumulator[1] += value[1]
        accumulator[2] += 1
        return accumulator

    def get_result(self, accumulator: list[int]) -> tuple[int, int, int]:
        return accumulator[0], accumulator[1], accumulator[2]

    def merge(self, acc_a: list[int], acc_b: list[int]) -> list[int]:
        return [acc_a[0], acc_a[1] + acc_b[1], acc_a[2] + acc_b[2]]


class SessionSum(ProcessWindowFunction):
    def process(self, key: Any, context: ProcessWindowFunction.Context, elements: Iterable[Any]) -> Any:
        values = [v for _, v, _ in elements]
        window = context.window()
        yield f"session,{key},{window.start},{window.end},{sum(values)},{len(values)}"


class Label(ProcessFunction):
    """``kind,key,window max timestamp,fields...``: the window comes from the result's timestamp."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def process_element(self, value: Any, ctx: ProcessFunction.Context) -> Any:
        fields = ",".join(str(f) for f in value[1:])
        yield f"{self.kind},{value[0]},{ctx.timestamp()},{fields}"


@pytest.mark.slow
@on_rocksdb_too(executor="local")
def test_event_time_windows_exactly_once_through_a_failure(tmp_path: Path, executor: str) -> None:
    from tests.test_file_sink import committed_lines

    probe = Probe()
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    env.configure({"restart-strategy.fixed-delay.delay": 0})
    events = (
        env.from_sequence(0, N - 1)
        .uid("source")
        .map(to_record)
        .uid("records")
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_bounded_out_of_orderness(BLOCK).with_timestamp_assigner(_by_third_field)
        )
        .uid("timestamps")
        .map(FailAfterCheckpoint(probe))
        .uid("fail")
    )
    keyed = events.key_by(lambda r: r[0])
    tumbling = (
        keyed.window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .reduce(tumbling_sum)
        .uid("tumbling")
        .map(lambda r: r[:2])  # keeps the window's timestamp
        .uid("tumbling-fields")
        .process(Label("tumbling"))
        .uid("tumbling-label")
    )
    sliding = (
        keyed.window(SlidingEventTimeWindows.of(Time.seconds(1), Time.milliseconds(500)))
        .aggregate(SumCount())
        .uid("sliding")
        .process(Label("sliding"))
        .uid("sliding-label")
    )
    sessions = (
        keyed.window(EventTimeSessionWindows.with_gap(SESSION_GAP)).process(SessionSum()).uid("sessions")
    )
    output = tmp_path / "out"
    tumbling.union(sliding, sessions).sink_to(
        FileSink.for_row_format(str(output), Encoder.simple_string_encoder()).build()
    ).uid("sink")

    client = env.execute_async("event-time windows through a failure")
    client.get_job_execution_result(timeout=600)
    assert probe.get("failures") == 1
    assert client.restarts >= 1

    committed = Counter(committed_lines(output))
    expected = expected_results()
    assert len(expected) > 6 * (N // ACTIVE)
    duplicated = {line: n for line, n in committed.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} results committed more than once, e.g. {list(duplicated)[:3]}"
    missing, wrong = expected.keys() - committed.keys(), committed.keys() - expected.keys()
    assert not missing and not wrong, (
        f"{len(missing)} results missing (e.g. {sorted(missing)[:3]}), "
        f"{len(wrong)} wrong (e.g. {sorted(wrong)[:3]})"
    )
