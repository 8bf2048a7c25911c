"""Stop-with-savepoint (Flink's synchronous savepoint), on real jobs.

Every job reads an unbounded, rate-limited ``DataGeneratorSource`` (it never ends on its
own: only the stop ends it) into two-phase-commit FileSinks, so "exactly once" is
checked on what a reader of the output directory sees: every record of every source
split once and without a gap (``assert_exact_prefix``), every event-time window once
with the count its records give.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.connectors.data_generator import DataGeneratorSource
from chandy.connectors.file_sink import Encoder, FileSink
from chandy.core.functions import (
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    MapFunction,
    RuntimeContext,
)
from chandy.core.state import ListStateDescriptor
from chandy.core.time import Time
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.core.windows import TumblingEventTimeWindows
from chandy.messages.checkpoint import CheckpointException, CheckpointFailureReason
from chandy.messages.status import JobStatus
from tests.state_backends import on_rocksdb_too
from tests.test_savepoints import (
    assert_exact_prefix,
    checkpointing_env,
    committed,
    counting_job,
    metadata_body,
    wait_for,
)

#: Record ``i`` happens at ``i * EVENT_MS`` in event time; windows are ``WINDOW_MS`` long.
EVENT_MS = 10
WINDOW_MS = 1_000


def event_time(value: int, record_timestamp: int) -> int:
    return value * EVENT_MS


def window_job(
    env: StreamExecutionEnvironment, out: Path, rate: float, *, restore: str | None = None
) -> StreamExecutionEnvironment:
    """Numbers to ``out/raw``; per key (``i % 3``) tumbling event-time windows counting them
    to ``out/windows`` as ``key,window,count``."""
    if restore is not None:
        env.set_restore_path(restore)
    numbers = env.from_source(
        DataGeneratorSource(lambda i: i, None, rate),
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(event_time),
        "numbers",
    ).uid("numbers")
    numbers.map(str).uid("raw-text").sink_to(file_sink(out / "raw")).uid("raw")
    (
        numbers.map(lambda i: (i % 3, 1, i))
        .uid("pairs")
        .key_by(lambda t: t[0])
        .window(TumblingEventTimeWindows.of(Time.milliseconds(WINDOW_MS)))
        .reduce(lambda a, b: (a[0], a[1] + b[1], min(a[2], b[2])))
        .uid("windows")
        .map(lambda t: f"{t[0]},{t[2] * EVENT_MS // WINDOW_MS},{t[1]}")
        .uid("window-text")
        .sink_to(file_sink(out / "windows"))
        .uid("window-files")
    )
    return env


def file_sink(directory: Path) -> FileSink:
    return FileSink.for_row_format(str(directory), Encoder.simple_string_encoder()).build()


def expected_windows(raw: list[str]) -> Counter[tuple[int, int]]:
    return Counter((int(i) % 3, int(i) * EVENT_MS // WINDOW_MS) for i in raw)


def fired_windows(out: Path) -> Counter[tuple[int, int]]:
    """Each fired window's count; a window fired twice would show up as a repeated key."""
    fired: Counter[tuple[int, int]] = Counter()
    seen: Counter[tuple[int, int]] = Counter()
    for line in committed(out / "windows"):
        key, window, count = (int(x) for x in line.split(","))
        fired[(key, window)] += count
        seen[(key, window)] += 1
    twice = [w for w, n in seen.items() if n > 1]
    assert not twice, f"windows fired more than once: {sorted(twice)[:10]}"
    return fired


def stop_window_job(tmp_path: Path, out: Path, drain: bool) -> str:
    """Run the window job until windows fire, stop it with a savepoint; the savepoint."""
    client = window_job(checkpointing_env(tmp_path, 2), out, 1000).execute_async(f"drain={drain}")
    wait_for(lambda: len(committed(out / "windows")) >= 6, 60, "the first fired windows")
    path = client.stop_with_savepoint(drain, str(tmp_path / "sp")).result(60)
    client.get_job_execution_result(10)
    assert client.get_job_status() is JobStatus.FINISHED
    assert metadata_body(path)["checkpoint_type"] == "SYNC_SAVEPOINT"
    return path


def assert_raw_exact(raw: list[str]) -> None:
    assert_exact_prefix([f"{i},{int(i) % 7},0" for i in raw], 2, check_counts=False)


@on_rocksdb_too()
def test_stop_with_drain_fires_every_window_before_the_savepoint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    stop_window_job(tmp_path, out, drain=True)

    raw = committed(out / "raw")
    assert_raw_exact(raw)
    # every window fired, the last, partly filled ones included: MAX_WATERMARK went out
    # before the barrier, and the sinks committed what the windows emitted
    assert fired_windows(out) == expected_windows(raw)


@on_rocksdb_too()
@pytest.mark.slow
def test_stop_without_drain_keeps_pending_windows_in_the_savepoint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    path = stop_window_job(tmp_path, out, drain=False)

    raw_before = committed(out / "raw")
    fired_before = fired_windows(out)
    expected_before = expected_windows(raw_before)
    # event time did not advance to the end: the latest windows did not fire ...
    unfired = set(expected_before) - set(fired_before)
    assert unfired, "every window fired although the stop did not drain"
    assert all(fired_before[w] == expected_before[w] for w in fired_before)

    # ... their contents are in the savepoint and fire after the restore, exactly once
    restored = window_job(checkpointing_env(tmp_path, 2), out, 1000, restore=path).execute_async("restored")
    wait_for(lambda: len(committed(out / "raw")) > len(raw_before) + 200, 60, "records after the restore")
    restored.stop_with_savepoint(True, str(tmp_path / "sp2")).result(60)
    restored.get_job_execution_result(10)

    raw = committed(out / "raw")
    assert_raw_exact(raw)
    assert fired_windows(out) == expected_windows(raw)


class BlockingSnapshot(MapFunction, CheckpointedFunction):
    """Passes records on; once the test arms it (a file), subtask 0's next snapshot waits
    until the test says go, so the test can act while that snapshot is under way."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        self.state = context.get_operator_state_store().get_list_state(ListStateDescriptor("seen"))

    def open(self, runtime_context: RuntimeContext) -> None:
        self.subtask = runtime_context.get_index_of_this_subtask()

    def map(self, value: Any) -> Any:
        return value

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        self.state.update([context.get_checkpoint_id()])
        armed = os.path.join(self.directory, "armed")
        if self.subtask != 0 or not os.path.exists(armed):
            return
        os.remove(armed)
        Path(self.directory, "blocked").write_text(str(context.get_checkpoint_id()))
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(self.directory, "go")) and time.monotonic() < deadline:
            time.sleep(0.01)


def blocking_counting_job(
    env: StreamExecutionEnvironment, out: Path, control: Path
) -> StreamExecutionEnvironment:
    env.configure({"execution.checkpointing.data-inline-threshold": 0})  # state in files
    counting_job(env, out, 2000, between=BlockingSnapshot(str(control)))
    return env


def test_a_stop_whose_savepoint_fails_leaves_the_job_running(tmp_path: Path, executor: str) -> None:
    """Two failed stops, then one that works: the directory cannot be created (no task was
    asked: the job simply goes on), then a task cannot write its state (declined after the
    sources stopped: the job fails over to its latest checkpoint, which the restart
    strategy "none" would refuse were it counted). The output stays exactly once."""
    out, control, sp = tmp_path / "out", tmp_path / "control", tmp_path / "sp"
    control.mkdir()
    env = checkpointing_env(tmp_path, 2, executor, **{"restart-strategy.type": "none"})
    client = blocking_counting_job(env, out, control).execute_async("failing stops")
    wait_for(lambda: len(committed(out)) > 200, 60, "the first committed records")

    (tmp_path / "a-file").write_text("in the way")
    with pytest.raises(CheckpointException) as unwritable:
        client.stop_with_savepoint(False, str(tmp_path / "a-file" / "sp")).result(60)
    assert unwritable.value.reason is CheckpointFailureReason.IO_EXCEPTION
    assert "a-file/sp" in str(unwritable.value) and "keeps running" in str(unwritable.value)
    assert client.get_job_status() is JobStatus.RUNNING and client.restarts == 0
    completed = client.get_checkpoint_statistics()["counts"]["completed"]
    wait_for(
        lambda: client.get_checkpoint_statistics()["counts"]["completed"] > completed + 1,
        60,
        "periodic checkpoints again",
    )

    (control / "armed").write_text("")
    stop = client.stop_with_savepoint(False, str(sp))
    wait_for(lambda: (control / "blocked").exists(), 60, "the stop's snapshot")
    for directory in sp.iterdir():  # the savepoint's directory vanishes under the tasks
        shutil.rmtree(directory)
    (control / "go").write_text("")
    with pytest.raises(CheckpointException) as declined:
        stop.result(60)
    assert declined.value.reason is CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION
    assert "keeps running" in str(declined.value)
    wait_for(lambda: client.get_job_status() is JobStatus.RUNNING, 60, "the job running again")
    assert client.restarts == 1
    assert list(sp.iterdir()) == []  # what a task wrote of the failed savepoint is gone
    records = len(committed(out))
    wait_for(lambda: len(committed(out)) > records + 200, 60, "records after the failover")

    path = client.stop_with_savepoint(False, str(sp)).result(60)
    client.get_job_execution_result(10)
    assert os.path.isdir(path) and client.get_job_status() is JobStatus.FINISHED
    assert_exact_prefix(committed(out), 2)


def test_savepoint_stop_and_restore_at_another_parallelism_on_spark(
    tmp_path: Path, spark_session: Any
) -> None:
    """Spark slots: a savepoint of the running job, a stop with a savepoint (sinks commit
    it before their tasks finish), a restore of that at parallelism 3 and a drained stop:
    the two-phase-commit FileSink holds every record once."""
    out = tmp_path / "out"
    client = counting_job(checkpointing_env(tmp_path, 2, "spark"), out, 2000).execute_async("spark one")
    wait_for(lambda: len(committed(out)) > 300, 120, "the first committed records")
    intermediate = client.trigger_savepoint(str(tmp_path / "sp")).result(120)
    assert client.get_job_status() is JobStatus.RUNNING
    stopped = client.stop_with_savepoint(False, str(tmp_path / "sp")).result(120)
    client.get_job_execution_result(60)
    assert client.get_job_status() is JobStatus.FINISHED
    records_before = len(committed(out))
    assert_exact_prefix(committed(out), 2)  # the stop committed everything up to its savepoint
    assert os.path.isdir(intermediate) and os.path.isdir(stopped)

    client = counting_job(checkpointing_env(tmp_path, 3, "spark"), out, 2000, restore=stopped).execute_async(
        "spark two"
    )
    wait_for(lambda: len(committed(out)) > records_before + 300, 120, "records after the restore")
    final = client.stop_with_savepoint(True, str(tmp_path / "sp")).result(120)
    client.get_job_execution_result(60)

    assert client.get_job_status() is JobStatus.FINISHED
    assert_exact_prefix(committed(out), 2)
    assert sorted(os.listdir(tmp_path / "sp")) == sorted(Path(p).name for p in (intermediate, stopped, final))
