"""Recovery time: from a failure to the first record processed after the restore.

Two failures, as the Spark executor handles them on two paths:

* ``exception``: a user function raises. The slots stay up; the JobMaster
  cancels the tasks and deploys new ones into the same slots.
* ``kill``: a slot process gets SIGKILL. The barrier stage is gone; the
  JobMaster submits a new one and restores every slot.

The job is W1-shaped (a source, a keyed running sum, a sink) slowed to a steady
rate, checkpointing every 200 ms, restarting with no delay. The sink notes the
attempt and wall time of every batch; recovery is the first batch of a later
attempt minus the moment of the failure.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.w1 import KEYS, RunningSum
from chandy import StreamExecutionEnvironment
from chandy.core.connector import Sink, SinkWriter, SinkWriterContext
from chandy.core.functions import MapFunction, RuntimeContext


class _RecoveryWriter(SinkWriter):
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, element: Any) -> None:
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        with open(self.path, "a") as f:
            f.write(f"{time.time()}\n")


class RecoverySink(Sink):
    """Appends the arrival time of every batch to ``<dir>/attempt-<n>-subtask-<i>``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        return _RecoveryWriter(
            Path(self.directory) / f"attempt-{context.attempt_number}-subtask-{context.subtask_index}"
        )


class Pace(MapFunction):
    """Keeps the job at a steady rate; in attempt 0 of subtask 0, raises once at ``fail_at``."""

    def __init__(self, delay_s: float, fail_at: float | None, marker: str) -> None:
        self.delay_s = delay_s
        self.fail_at = fail_at
        self.marker = marker

    def open(self, runtime_context: RuntimeContext) -> None:
        self.armed = (
            self.fail_at is not None
            and runtime_context.get_attempt_number() == 0
            and runtime_context.get_index_of_this_subtask() == 0
        )

    def map(self, value: Any) -> Any:
        time.sleep(self.delay_s)
        if self.armed and time.time() >= self.fail_at:  # type: ignore[operator]
            self.armed = False
            Path(self.marker).write_text(str(time.time()))
            raise RuntimeError("induced failure")
        return value


def first_after(directory: Path, attempt_above: int) -> float | None:
    times = []
    for path in directory.glob("attempt-*-subtask-*"):
        attempt = int(path.name.split("-")[1])
        if attempt > attempt_above and path.stat().st_size:
            times.append(float(path.read_text().split()[0]))
    return min(times) if times else None


def measure_recovery(executor: str, failure: str, warmup_s: float = 4.0) -> dict[str, Any]:
    """One job, one failure; seconds from the failure to processing resumed."""
    if failure == "kill" and executor != "spark":
        raise ValueError("only the Spark executor has slot processes to kill")
    with tempfile.TemporaryDirectory(prefix="chandy-failover-") as tmp:
        marker = os.path.join(tmp, "failed-at")
        env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
        env.set_parallelism(2)
        env.enable_checkpointing(200)
        # small batches: the first record after the restore reaches the sink at once
        env.configure({"restart-strategy.fixed-delay.delay": 0, "chandy.network.batch-size": 16})
        fail_at = time.time() + warmup_s + 8 if failure == "exception" else None
        (
            env.from_sequence(0, 10**9)
            .map(Pace(0.0005, fail_at, marker))
            .key_by(lambda i: i % KEYS)
            .process(RunningSum())
            .sink_to(RecoverySink(tmp))
        )
        client = env.execute_async(f"recovery after {failure}")
        try:
            directory = Path(tmp)
            deadline = time.monotonic() + 120
            while first_after(directory, -1) is None:  # running
                if time.monotonic() > deadline:
                    raise RuntimeError("the job did not start")
                time.sleep(0.05)
            if failure == "kill":
                time.sleep(warmup_s)
                victim = client.get_task_slots()[1]["pid"]
                failed_at = time.time()
                os.kill(victim, signal.SIGKILL)
            else:
                while not os.path.exists(marker):
                    time.sleep(0.05)
                failed_at = float(Path(marker).read_text())
            resumed = None
            deadline = time.monotonic() + 120
            while resumed is None and time.monotonic() < deadline:
                time.sleep(0.05)
                resumed = first_after(directory, 0)
        finally:
            client.cancel()
            try:
                client.get_job_execution_result(timeout=60)
            except Exception:  # noqa: BLE001 - cancelled, as asked
                pass
    if resumed is None:
        raise RuntimeError(f"no record was processed after the {failure}")
    return {"executor": executor, "failure": failure, "recovery_s": resumed - failed_at}
