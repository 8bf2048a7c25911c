"""Recovery time: from a failure to the first record processed after the restore.

Two failures, as the Spark executor handles them on two paths:

* ``exception``: a user function raises. The slots stay up; the JobMaster
  cancels the tasks and deploys new ones into the same slots.
* ``kill``: a slot process (the one running the tasks) gets SIGKILL. Its
  supervisor, the Spark task, forks a new one; the JobMaster deploys new tasks
  into the same stage and restores them. Several kills in one job, alternating
  between the slots; each row says whether it cost a new Spark stage.
* ``executor JVM kill`` (with ``--standalone N``: a Spark standalone cluster of N
  one-core workers on loopback, started here): the executor JVM hosting a slot gets
  SIGKILL, which costs the slot stage; with more workers than slots, the new stage
  starts on a spare executor at once, while the killed one's worker starts a new JVM.

The job is W1-shaped (a source, a keyed running sum, a sink) slowed to a steady
rate, checkpointing every 200 ms, restarting with no delay. The sink notes the
attempt and wall time of every batch; recovery is the first batch of a later
attempt minus the moment of the failure.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.standalone_cluster import StandaloneCluster
from bench.w1 import KEYS, RunningSum
from chandy import StreamExecutionEnvironment
from chandy.core.connector import Sink, SinkWriter, SinkWriterContext
from chandy.core.functions import MapFunction, RuntimeContext
from chandy.runtime.spark.spares import CHECK_INTERVAL_S


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


def first_after(directory: Path, attempt_above: int, not_before: float = 0.0) -> float | None:
    """The earliest batch time of an attempt above ``attempt_above`` (at or after ``not_before``)."""
    times = []
    for path in directory.glob("attempt-*-subtask-*"):
        attempt = int(path.name.split("-")[1])
        if attempt > attempt_above and path.stat().st_size:
            times.extend(t for t in map(float, path.read_text().split()[:1]) if t >= not_before)
    return min(times) if times else None


def _latest_attempt(directory: Path) -> int:
    return max((int(p.name.split("-")[1]) for p in directory.glob("attempt-*-subtask-*")), default=-1)


def measure_recovery(
    executor: str,
    failure: str,
    warmup_s: float = 4.0,
    kills: int = 1,
    supervisor_kills: int = 0,
    settle_s: float = 2.0,
    master: str | None = None,
    jvm_kills: int = 0,
    cluster_executors: int = 0,
    cluster: StandaloneCluster | None = None,
    worker_kills: int = 0,
) -> list[dict[str, Any]]:
    """One job and its failures; per failure, seconds from it to processing resumed.

    ``exception``: one raised exception (the slots stay up). ``kill``: ``kills`` SIGKILLs
    of a slot process (alternating between the two slots), ``settle_s`` apart once the
    job runs again, then ``supervisor_kills`` of the Spark task supervising one (which
    costs the stage), then ``jvm_kills`` of the executor JVM hosting one (a real cluster's
    executor lost) and ``worker_kills`` of the worker hosting one (on ``cluster``), each
    once the cluster has ``cluster_executors`` executors again. Each row also says
    whether the kill cost a new Spark stage."""
    if failure == "kill" and executor != "spark":
        raise ValueError("only the Spark executor has slot processes to kill")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="chandy-failover-") as tmp:
        marker = os.path.join(tmp, "failed-at")
        env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
        env.set_parallelism(2)
        env.enable_checkpointing(200)
        # small batches: the first record after the restore reaches the sink at once
        env.configure({"restart-strategy.fixed-delay.delay": 0, "chandy.network.batch-size": 16})
        if master is not None:  # e.g. local-cluster[2,1,1024]: executor JVMs of their own
            env.configure(
                {
                    "spark.master": master,
                    "chandy.spark.slot-wait": "120 s",
                    # the job's functions are this package's: the executors import it
                    "spark.executorEnv.PYTHONPATH": str(Path(__file__).resolve().parent.parent),
                }
            )
        fail_at = time.time() + warmup_s + 8 if failure == "exception" else None
        (
            env.from_sequence(0, 10**9)
            .map(Pace(0.0005, fail_at, marker))
            .key_by(lambda i: i % KEYS)
            .process(RunningSum())
            .sink_to(RecoverySink(tmp))
        )
        client = env.execute_async(f"recovery after {failure}")
        restart_delay_ms = client._job_master.restart_strategy.get_backoff_time_ms()
        try:
            directory = Path(tmp)
            _wait(lambda: first_after(directory, -1) is not None, "the job did not start")
            if failure == "kill":
                time.sleep(warmup_s)
                for kill in range(kills):
                    rows.append(_kill_once(client, directory, kill % 2 if kills > 1 else 1, "pid"))
                    time.sleep(settle_s)
                for kill in range(supervisor_kills):  # the old path: a new Spark stage
                    row = _kill_once(client, directory, kill % 2, "supervisor_pid")
                    rows.append({**row, "failure": "supervisor kill"})
                    time.sleep(settle_s)
                losses: list[tuple[str, Callable[[int], None]]] = [
                    ("executor JVM kill", _sigkill)
                ] * jvm_kills
                if cluster is not None:
                    losses += [("worker kill", _worker_killer(cluster))] * worker_kills
                for kill, (failure_name, how) in enumerate(losses):
                    _wait(lambda: _slots_ready(client), "the slots did not come back", 300)
                    # the cluster whole again (the killed JVM's worker started a new one, or a
                    # new worker joined), and warmed up: each loss meets it with its spare
                    _wait(lambda: _executors(client) >= cluster_executors, "no new executor", 300)
                    time.sleep(settle_s + 2 * CHECK_INTERVAL_S)
                    row = _kill_once(client, directory, kill % 2, "jvm_pid", how)
                    rows.append({**row, "failure": failure_name})
                    time.sleep(settle_s)
            else:
                _wait(lambda: os.path.exists(marker), "the function did not raise")
                failed_at = float(Path(marker).read_text())
                _wait(lambda: first_after(directory, 0) is not None, "no record after the exception")
                resumed = first_after(directory, 0)
                assert resumed is not None
                rows.append({"recovery_s": resumed - failed_at, "new_stage": False})
        finally:
            client.cancel()
            try:
                client.get_job_execution_result(timeout=60)
            except Exception:  # noqa: BLE001 - cancelled, as asked
                pass
    return [
        {"executor": executor, "failure": failure, "restart_delay_ms": restart_delay_ms, **row}
        for row in rows
    ]


def _sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _kill_once(
    client: Any,
    directory: Path,
    index: int,
    which: str,
    kill: Callable[[int], None] = _sigkill,
) -> dict[str, Any]:
    """SIGKILL a process of slot ``index`` (``which``: ``pid``, the one running its tasks,
    ``supervisor_pid``, the Spark task, or ``jvm_pid``, its executor; ``kill`` may take
    more with it, e.g. the executor's worker); seconds until records flow again."""
    _wait(lambda: client.get_job_status().name == "RUNNING", "the job did not run again")
    attempt = _latest_attempt(directory)
    executor = client._job_master.executor
    pool = getattr(executor, "_pool", None)
    victim = client.get_task_slots()[index][which]
    failed_at = time.time()
    kill(victim)
    _wait(lambda: first_after(directory, attempt, failed_at) is not None, "no record after the kill")
    resumed = first_after(directory, attempt, failed_at)
    assert resumed is not None
    return {"recovery_s": resumed - failed_at, "new_stage": getattr(executor, "_pool", None) is not pool}


def _worker_killer(cluster: StandaloneCluster) -> Callable[[int], None]:
    """Kills the worker that runs executor JVM ``pid`` (a machine lost); a new worker
    joins at once, as a cluster manager would replace the machine."""

    def kill(pid: int) -> None:
        cluster.kill_worker(cluster.worker_of_executor(pid))
        cluster.add_workers(1)

    return kill


def _executors(client: Any) -> int:
    """The job's Spark executors now (the driver's entry not counted)."""
    context = client._job_master.executor.session.sparkContext
    return len(list(context._jsc.sc().statusTracker().getExecutorInfos())) - 1


def _slots_ready(client: Any) -> bool:
    slots = client.get_task_slots()
    return client.get_job_status().name == "RUNNING" and len(slots) == 2 and all(s["alive"] for s in slots)


def _wait(condition: Callable[[], bool], failure: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(failure)
        time.sleep(0.02)


def run(
    executors: list[str],
    runs: int,
    kills: int,
    supervisor_kills: int = 2,
    master: str | None = None,
    standalone_workers: int = 0,
    jvm_kills: int = 0,
    worker_kills: int = 0,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``runs`` raised exceptions per executor, ``kills`` slot process kills,
    ``supervisor_kills`` Spark task kills and ``jvm_kills`` executor JVM kills on Spark
    (on a standalone cluster of ``standalone_workers`` workers started here, if not 0,
    where ``worker_kills`` kill a whole worker): the rows, and per case the median,
    minimum and maximum recovery."""
    if standalone_workers:
        with (
            tempfile.TemporaryDirectory(prefix="chandy-standalone-") as tmp,
            StandaloneCluster(Path(tmp)) as cluster,
        ):
            cluster.add_workers(standalone_workers)
            os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers' Python is this one
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            return _run(
                executors, runs, kills, supervisor_kills, cluster.url, jvm_kills, cluster, worker_kills
            )
    return _run(executors, runs, kills, supervisor_kills, master, jvm_kills, None, 0)


def _run(
    executors: list[str],
    runs: int,
    kills: int,
    supervisor_kills: int,
    master: str | None,
    jvm_kills: int,
    cluster: StandaloneCluster | None,
    worker_kills: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for executor in executors:
        for _ in range(runs):
            rows += measure_recovery(executor, "exception", master=master if executor == "spark" else None)
        if executor == "spark":
            rows += measure_recovery(
                executor,
                "kill",
                kills=kills,
                supervisor_kills=supervisor_kills,
                master=master,
                jvm_kills=jvm_kills,
                cluster_executors=len(cluster.workers) if cluster is not None else 0,
                cluster=cluster,
                worker_kills=worker_kills,
            )
    summary: dict[str, Any] = {}
    for case in dict.fromkeys((r["executor"], r["failure"]) for r in rows):
        of_case = [r for r in rows if (r["executor"], r["failure"]) == case]
        values = [r["recovery_s"] for r in of_case]
        summary[f"{case[0]} after {case[1]}"] = {
            "n": len(values),
            "median_s": statistics.median(values),
            "min_s": min(values),
            "max_s": max(values),
            "restart_delay_ms": sorted({r["restart_delay_ms"] for r in of_case}),
            "new_stages": sum(r["new_stage"] for r in of_case),
        }
    return rows, summary


def summary_lines(summary: dict[str, Any]) -> list[str]:
    return [
        f"{case}: median {s['median_s']:.2f} s, range {s['min_s']:.2f}-"
        f"{s['max_s']:.2f} s over {s['n']} (restart delay {s['restart_delay_ms']} ms, "
        f"{s['new_stages']} new Spark stages)"
        for case, s in summary.items()
    ]
