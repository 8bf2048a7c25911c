"""chandy on a real Spark standalone cluster (a master and two workers on loopback, started
from the PySpark wheel's ``spark-class``): ``chandy run --master spark://...`` (which is
``spark-submit --master spark://...`` with chandy's settings) runs the job on the cluster's
workers, not in a local session, and the job recovers exactly once from a killed slot
process, a killed executor JVM and a killed worker (a replacement joins). That
spark-submit's own master and application name stand is tested with ``local[3]`` in
tests/test_cli.py."""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.standalone_cluster import StandaloneCluster

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "scripts" / "cluster_job.py"
log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with StandaloneCluster(tmp_path_factory.mktemp("standalone")) as cluster:
        cluster.add_workers(3)  # the job needs 2 slots: one spare
        yield cluster


def submit_env() -> dict[str, str]:
    """What a user sets on a single host: the executors' Python is this one (it has chandy)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


#: How long the test waits for the job's next phase. The job gives up on a phase after its
#: own 150 s and says where it stuck; this bound only catches a job that cannot say so.
PHASE_WAIT_S = 200


class Phases:
    """The job's JSON lines, read on a thread of their own so that waiting for the next one is
    bounded: a job that hangs fails the test with its log, instead of running into pytest's
    timeout, which ends the test before it can show why."""

    def __init__(self, process: subprocess.Popen[str], job_log: Path) -> None:
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._job_log = job_log
        self._job_out = job_log.with_name("job.out")
        self._reader = threading.Thread(target=self._read, args=(process,), name="job stdout", daemon=True)
        self._reader.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        # spark-submit hands the driver's stderr to its own stdout: kept beside the phases
        with self._job_out.open("w") as out:
            for line in process.stdout:
                if line.startswith('{"phase"'):
                    self._lines.put(json.loads(line))
                out.write(line)
                out.flush()
        self._lines.put(None)  # the job ended

    def next(self, expected: str) -> dict[str, Any]:
        """The job's next phase, which must be ``expected``."""
        try:
            phase = self._lines.get(timeout=PHASE_WAIT_S)
        except queue.Empty:
            phase = {"phase": f"nothing for {PHASE_WAIT_S} s"}
        if phase is None or phase["phase"] != expected:
            pytest.fail(
                f"expected the job's {expected!r} phase, got {phase}; the driver's output ends:\n"
                + self._job_out.read_text()[-8000:]
                + "\nspark-submit's stderr ends:\n"
                + self._job_log.read_text()[-4000:]
            )
        return phase


def app_named(cluster: StandaloneCluster, name: str, which: str) -> dict[str, Any]:
    apps = [a for a in cluster.state()[which] if a["name"] == name]
    assert apps, cluster.state()
    return apps[-1]


@pytest.mark.slow
@pytest.mark.timeout(3 * PHASE_WAIT_S)
def test_chandy_run_on_the_cluster_recovers_exactly_once_from_slot_executor_and_worker_kills(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # the job's stderr goes to a file: a pipe nobody reads while the job runs fills up with
    # Spark's reports of the lost executor and worker, and then blocks the job
    job_log = tmp_path / "job.log"
    stderr = job_log.open("w")
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("chandy")),
            "run",
            "--master",
            cluster.url,
            "-D",
            "spark.app.name=chaos-on-a-cluster",
            str(JOB),
            str(tmp_path),
            "--faults",
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=submit_env(),
        cwd=tmp_path,
    )
    try:
        events = Phases(process, job_log)
        events.next("running")
        # on the cluster, not in a local session: the master lists it, with the core of each worker
        app = app_named(cluster, "chaos-on-a-cluster", "activeapps")
        assert app["cores"] == 3
        for worker in cluster.workers:
            assert [e["appid"] for e in worker.state()["executors"]] == [app["id"]]
        # the spare executor too runs chandy's Python daemon already: a slot moved there after
        # an executor is lost forks from it, without starting an interpreter and importing chandy
        deadline = time.monotonic() + 120
        while not all(
            any("chandy.runtime.spark.daemon" in d for d in w.python_daemons()) for w in cluster.workers
        ):
            assert time.monotonic() < deadline, [w.python_daemons() for w in cluster.workers]
            time.sleep(0.2)
        kill = events.next("kill-worker")
        worker = cluster.worker_of_executor(kill["jvm_pid"])
        killed = time.monotonic()
        cluster.kill_worker(worker)
        cluster.add_workers(1)  # the replacement machine joins
        log.info("worker replaced %.1f s after the kill", time.monotonic() - killed)
        (tmp_path / "worker-replaced").touch()
        done = events.next("done")
        log.info("recoveries (kill -> next completed checkpoint, s): %s", done["recoveries"])
        assert done["exact"] is True, done
        assert done["restarts"] >= 3  # one per fault
        assert done["slot_kill_kept_the_stage"] is True  # its supervisor forked the next one
        assert done["jvm_kill_replaced_the_stage"] is True
        assert process.wait(120) == 0, job_log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stderr.close()
        log.info("the job's stderr, last lines:\n%s", job_log.read_text()[-5000:])
