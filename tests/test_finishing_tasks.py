"""Exactly-once while subtasks finish (Flink's FLIP-147): a fault at every moment around a
subtask's end of input, on both executors and both state backends.

The job: numbers in two splits of very different sizes (subtask 0's short, subtask 1's long and
paced until the fault struck) -> a map that raises once at the chosen moment -> either a
two-phase-commit FileSink chained to the map (the sink ends with its subtask), or key_by ->
a keyed running count in ValueState -> the FileSink (the sink's task ends after its upstream).
The committed output must hold every number once and, keyed, every key's counts exactly 1..n.

Before the fix, a sink committed its last transaction when its input ended, before any
checkpoint covered it; a failover then restored an earlier checkpoint, the source read the end
of its split again and the sink committed it twice (issue 26: up to 100 % of subtask 0's split
duplicated when subtask 1 failed right after subtask 0 ended).
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.common.watermark_strategy import WatermarkStrategy
from chandy.connectors import FileSink, JsonLinesEncoder
from chandy.core.time import Time
from chandy.core.windows import TumblingEventTimeWindows
from chandy.messages.status import ExecutionState
from chandy.runtime.job_client import JobClient
from tests.finishing_jobs import (
    FaultNearTheEnd,
    RunningCount,
    SlowCountSum,
    UnevenNumberSequence,
    position_in_split,
)
from tests.jobs import Throttle, release

SIZES = [3_000, 12_000]
N = sum(SIZES)
KEYS = 7
PACE_S = 0.0005  # subtask 1, until the fault struck: ~6 s for its split, so it outlives subtask 0


def committed(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.name.startswith((".", "_")):
            rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def assert_exactly_once(rows: list[dict[str, Any]], keyed: bool) -> None:
    values = Counter(row["v"] for row in rows)
    repeated = {v: n for v, n in values.items() if n > 1}
    assert not repeated, f"{sum(n - 1 for n in repeated.values())} rows committed twice, e.g. {min(repeated)}"
    assert len(values) == N, f"{N - len(values)} numbers lost"
    if keyed:
        counts: dict[int, list[int]] = defaultdict(list)
        for row in rows:
            assert row["k"] == row["v"] % KEYS
            counts[row["k"]].append(row["c"])
        for key, seen in counts.items():
            assert sorted(seen) == list(range(1, len(seen) + 1)), f"key {key}: counts {sorted(seen)[:10]}..."


def build(env: StreamExecutionEnvironment, tmp_path: Path, moment: str, victim: int, keyed: bool) -> Path:
    signals = tmp_path / "signals"
    signals.mkdir()
    out = tmp_path / "out"
    numbers = env.from_source(UnevenNumberSequence(SIZES), WatermarkStrategy.no_watermarks(), "numbers")
    mapped = numbers.map(FaultNearTheEnd(str(signals), moment, victim, SIZES[0] - 1, PACE_S)).uid("fault")
    if keyed:
        mapped = mapped.key_by(lambda v: v % KEYS).process(RunningCount()).uid("count")
    else:
        mapped = mapped.map(lambda v: {"v": v})
    mapped.sink_to(FileSink.for_row_format(str(out), JsonLinesEncoder()).build()).uid("sink")
    return out


def new_env(executor: str) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    env.configure({"restart-strategy.fixed-delay.delay": 0})
    return env


def run_with_fault(
    executor: str, tmp_path: Path, moment: str, victim: int, keyed: bool, **config: Any
) -> None:
    env = new_env(executor)
    env.configure(config)
    out = build(env, tmp_path, moment, victim, keyed)
    result = env.execute(f"fault at {moment} in subtask {victim}")
    assert (tmp_path / "signals" / "struck").is_dir(), "the fault never struck"
    assert result.restarts >= 1
    assert_exactly_once(committed(out), keyed)


# The other subtask fails at each moment of subtask 0's end; subtask 0 itself fails at each
# moment before it ended. Keyed: the sink is in the task after the keyed exchange.
CASES = [
    pytest.param("end-of-input", 1, id="other-fails-as-it-ends"),
    pytest.param("final-snapshot", 1, id="other-fails-during-its-final-checkpoint"),
    pytest.param("final-complete", 1, id="other-fails-as-its-final-checkpoint-completes"),
    pytest.param("finished", 1, id="other-fails-after-it-finished"),
    pytest.param("end-of-input", 0, id="it-fails-on-its-last-record"),
    pytest.param("final-snapshot", 0, id="it-fails-in-its-final-snapshot"),
    pytest.param("final-complete", 0, id="it-fails-before-its-sink-commits"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("moment", "victim"), CASES)
@pytest.mark.parametrize("keyed", [False, True], ids=["chained-sink", "keyed-sink"])
def test_a_fault_around_a_subtask_finishing_loses_and_repeats_nothing_local(
    tmp_path: Path, moment: str, victim: int, keyed: bool
) -> None:
    run_with_fault("local", tmp_path, moment, victim, keyed)


#: The cases where a sink chained to the finishing subtask committed twice before the fix.
CHAINED_ON_SPARK = [
    pytest.param("end-of-input", 1, False, id="chained-sink-other-fails-as-it-ends"),
    pytest.param("final-snapshot", 1, False, id="chained-sink-other-fails-during-its-final-checkpoint"),
    pytest.param("final-snapshot", 0, False, id="chained-sink-it-fails-in-its-final-snapshot"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("moment", "victim", "keyed"),
    [pytest.param(*case.values, True, id=f"keyed-sink-{case.id}") for case in CASES] + CHAINED_ON_SPARK,
)
def test_a_fault_around_a_subtask_finishing_loses_and_repeats_nothing_spark(
    spark_session: Any, tmp_path: Path, moment: str, victim: int, keyed: bool
) -> None:
    """On Spark (slots in processes of their own, channels over TCP): every moment with the
    keyed sink, and the chained sink where it went wrong before the fix."""
    run_with_fault("spark", tmp_path, moment, victim, keyed)


@pytest.mark.slow
@pytest.mark.parametrize("state_backend", ["rocksdb"], indirect=True)
@pytest.mark.parametrize(
    ("executor", "moment", "victim", "keyed"),
    [
        pytest.param("local", "end-of-input", 1, False, id="local-chained-sink-other-fails-as-it-ends"),
        pytest.param(
            "local", "final-complete", 0, True, id="local-keyed-sink-it-fails-before-its-sink-commits"
        ),
        pytest.param("spark", "end-of-input", 1, True, id="spark-keyed-sink-other-fails-as-it-ends"),
        pytest.param("spark", "final-complete", 0, False, id="spark-chained-sink-it-fails-before-it-commits"),
    ],
    indirect=["executor"],
)
def test_a_fault_around_a_subtask_finishing_on_rocksdb(
    executor: str, state_backend: str, tmp_path: Path, moment: str, victim: int, keyed: bool
) -> None:
    """The heap backend runs in the tests above; here every job keeps its keyed state in
    RocksDB with incremental checkpoints."""
    run_with_fault(executor, tmp_path, moment, victim, keyed)


SINKS = {False: "chained", True: "keyed"}
UNALIGNED_MOMENTS = [("end-of-input", 1), ("final-snapshot", 0), ("final-complete", 0)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("executor", "moment", "victim", "keyed"),
    [
        pytest.param(
            "local", moment, victim, keyed, id=f"local-{moment}-{victim}-{'keyed' if keyed else 'chained'}"
        )
        for moment, victim in UNALIGNED_MOMENTS
        for keyed in (False, True)
    ]
    + [
        pytest.param(
            "spark", "end-of-input", 1, keyed, id=f"spark-end-of-input-1-{'keyed' if keyed else 'chained'}"
        )
        for keyed in (False, True)
    ],
    indirect=["executor"],
)
def test_a_fault_around_a_subtask_finishing_with_unaligned_checkpoints(
    executor: str, tmp_path: Path, moment: str, victim: int, keyed: bool
) -> None:
    """Unaligned barriers overtake the end of data: a task may snapshot before it finished,
    and its final checkpoint is then a later one, triggered directly once its upstream ended.
    Every moment on the local executor, the first on Spark (the suite's time)."""
    run_with_fault(
        executor, tmp_path, moment, victim, keyed, **{"execution.checkpointing.unaligned.enabled": True}
    )


def _event_time(value: int, record_timestamp: int) -> int:
    return position_in_split(SIZES, value)


@pytest.mark.slow
def test_event_time_windows_after_a_restore_from_a_subtasks_final_unaligned_checkpoint(
    tmp_path: Path,
) -> None:
    """Subtask 0 ends its short split while the (slow) window task still has the split's last
    records and final watermark in its input channels: its final checkpoint, unaligned, holds
    them as in-flight data. Subtask 1 fails as that checkpoint completes, and the job restores
    it. Both splits start at event time 0, so subtask 1's split, read on after the restore, is
    far behind subtask 0's final watermark.

    Before the fix the restore dealt the source's split lists out again (its shared state is a
    union list): subtask 1's split moved to subtask 0, whose input channel replayed the final
    watermark first, so the window task's event time jumped to the end and every later record
    of the moved split was late and dropped."""
    env = new_env("local")
    env.configure({"execution.checkpointing.unaligned.enabled": True})
    signals = tmp_path / "signals"
    signals.mkdir()
    out = tmp_path / "out"
    numbers = env.from_source(UnevenNumberSequence(SIZES), WatermarkStrategy.no_watermarks(), "numbers")
    fault = FaultNearTheEnd(str(signals), "final-complete", 1, SIZES[0] - 1, PACE_S)
    mapped = numbers.map(fault).uid("fault")
    timed = mapped.assign_timestamps_and_watermarks(
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(_event_time)
    )
    windows = (
        timed.map(lambda v: (v % KEYS, 1, v))
        .key_by(lambda t: t[0])
        .window(TumblingEventTimeWindows.of(Time.milliseconds(100)))
        .reduce(SlowCountSum(0.0002))
        .uid("windows")
    )
    windows.map(lambda t: {"k": t[0], "c": t[1], "s": t[2]}).sink_to(
        FileSink.for_row_format(str(out), JsonLinesEncoder()).build()
    ).uid("sink")
    result = env.execute("restored from a final unaligned checkpoint")
    assert (signals / "struck").is_dir(), "the fault never struck"
    assert result.restarts >= 1
    counts: Counter[int] = Counter()
    sums: Counter[int] = Counter()
    for row in committed(out):
        counts[row["k"]] += row["c"]
        sums[row["k"]] += row["s"]
    expected_counts = Counter(v % KEYS for v in range(N))
    expected_sums: Counter[int] = Counter()
    for v in range(N):
        expected_sums[v % KEYS] += v
    assert sum(counts.values()) == N, f"{N - sum(counts.values())} of {N} records missing from the windows"
    assert counts == expected_counts and sums == expected_sums


@pytest.mark.slow
def test_every_subtask_ended_and_the_final_checkpoint_fails(tmp_path: Path) -> None:
    """Both subtasks read all their input; the final checkpoint's snapshot raises in subtask 0
    once subtask 1 ended too (every source finished, the job not yet FINISHED)."""
    env = new_env("local")
    env.set_parallelism(1)
    signals = tmp_path / "signals"
    signals.mkdir()
    out = tmp_path / "out"
    env.from_source(UnevenNumberSequence([N]), WatermarkStrategy.no_watermarks(), "numbers").map(
        FaultNearTheEnd(str(signals), "final-snapshot", 0, N - 1, PACE_S)
    ).key_by(lambda v: v % KEYS).process(RunningCount()).sink_to(
        FileSink.for_row_format(str(out), JsonLinesEncoder()).build()
    )
    result = env.execute("final checkpoint fails")
    assert (signals / "struck").is_dir() and result.restarts == 1
    assert_exactly_once(committed(out), keyed=True)


@pytest.mark.slow
def test_stop_with_savepoint_while_one_subtask_has_finished(executor: str, tmp_path: Path) -> None:
    """Subtask 0 read its split and finished; subtask 1 is still reading (throttled) when the
    job stops with a savepoint. Restored from it, the job reads the rest of subtask 1's split
    only: the output holds every number once."""
    until = str(tmp_path / "release")
    out = tmp_path / "out"
    env = new_env(executor)
    numbers = env.from_source(UnevenNumberSequence(SIZES), WatermarkStrategy.no_watermarks(), "numbers")
    throttled = numbers.map(Throttle(0.001, until=until)).uid("throttle")
    counted = throttled.key_by(lambda v: v % KEYS).process(RunningCount()).uid("count")
    counted.sink_to(FileSink.for_row_format(str(out), JsonLinesEncoder()).build()).uid("sink")
    client: JobClient = env.execute_async("stopped while finishing")
    try:
        wait_until_finished_subtask(client)
        savepoint = client.stop_with_savepoint(False, str(tmp_path / "savepoints")).result(120)
        client.get_job_execution_result(60)
    finally:
        release(until)
    partial = committed(out)
    assert 0 < len({r["v"] for r in partial}) < N
    restored = new_env(executor)
    restored.configure({"execution.state-recovery.path": savepoint})
    numbers = restored.from_source(UnevenNumberSequence(SIZES), WatermarkStrategy.no_watermarks(), "numbers")
    again = numbers.map(Throttle(0.0, until=until)).uid("throttle")
    counted = again.key_by(lambda v: v % KEYS).process(RunningCount()).uid("count")
    counted.sink_to(FileSink.for_row_format(str(out), JsonLinesEncoder()).build()).uid("sink")
    restored.execute("restored")
    assert_exactly_once(committed(out), keyed=True)


def wait_until_finished_subtask(client: JobClient) -> None:
    """Until a source subtask has FINISHED (subtask 0 read its short split and its final
    checkpoint completed), read from the JobMaster's execution graph."""
    execution_graph = client._job_master.execution_graph

    def finished() -> bool:
        return any(
            ev.job_vertex.is_source and ev.current_execution.state is ExecutionState.FINISHED
            for ev in execution_graph.all_execution_vertices()
        )

    deadline = time.monotonic() + 120
    while not client._ask(finished, 60):
        assert time.monotonic() < deadline, "subtask 0 never finished"
        time.sleep(0.02)
