"""What only the Spark executor has: slot processes that die, secrets, slot counts. (spark-submit:
tests/test_cli.py and tests/test_standalone_cluster.py.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from chandy import ConfigurationError, JobExecutionError, StreamExecutionEnvironment
from chandy.core.functions import MapFunction, RuntimeContext
from tests.jobs import CountingFilter, CountingMap, KeyedCounter, Throttle, final_counts, release
from tests.probes import Probe

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("spark_session")


def spark_env(parallelism: int = 2, **config: Any) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor="spark")
    env.set_parallelism(parallelism)
    env.configure(config)
    return env


def wait_for(predicate: Any, timeout_s: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_exactly_once_when_a_slot_process_is_killed() -> None:
    n, keys = 200_000, 100
    probe = Probe()
    gate = os.path.join(probe.directory, "release-throttle")
    env = spark_env(2, **{"restart-strategy.fixed-delay.delay": 0})
    env.enable_checkpointing(100)
    results = (
        env.from_sequence(0, n - 1)
        .uid("source")
        .filter(CountingFilter("filter", probe))
        .uid("filter")
        .map(Throttle(0.00002, until=gate))
        .uid("throttle")
        .shuffle()
        .map(CountingMap("map", probe))
        .uid("map")
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .uid("counter")
        .execute_and_collect("killed slot")
    )
    out: list[Any] = []
    reader = threading.Thread(target=lambda: out.extend(results), daemon=True)
    reader.start()
    client = results.job_client
    wait_for(lambda: client.get_job_status().name == "RUNNING" and client.get_task_slots(), what="slots")
    wait_for(
        lambda: client.get_checkpoint_statistics()["counts"]["completed"] >= 2,
        what="two completed checkpoints",
    )
    victim = client.get_task_slots()[1]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: client.restarts >= 1, what="the failover")
    release(gate)  # the rest, replayed from the checkpoint, need not be paced
    reader.join(180)
    assert not reader.is_alive()
    assert client.restarts >= 1
    assert [o for o in out if o[0] == "overflow"] == []
    assert sorted(out) == [(k, n // keys) for k in range(keys)]
    for name in ("filter", "map"):
        assert sum(final_counts(probe, name).values()) == n, name
    assert not pid_alive(victim)


class LogsSomething(MapFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        import logging

        logging.getLogger("user.job").warning(
            "hello from subtask %d", runtime_context.get_index_of_this_subtask()
        )

    def map(self, value: Any) -> Any:
        return value


def test_slot_logs_reach_the_driver_with_the_slot_index(caplog: pytest.LogCaptureFixture) -> None:
    env = spark_env(2)
    env.from_sequence(0, 100).map(LogsSomething()).print()
    env.execute("logs")
    messages = [r.getMessage() for r in caplog.records if r.name == "user.job"]
    assert "[slot 0, attempt 1] hello from subtask 0" in messages
    assert "[slot 1, attempt 1] hello from subtask 1" in messages


@pytest.mark.parametrize(
    ("master", "directory", "refused"),
    [
        ("local[4]", "/tmp/checkpoints", False),
        ("local-cluster[2,2,1024]", "/tmp/checkpoints", False),  # one host
        ("spark://master:7077", "/tmp/checkpoints", True),
        ("yarn", "relative/dir", True),
        ("spark://master:7077", "file:///mnt/nfs/checkpoints", False),  # declared shared
        ("k8s://https://api:6443", "s3://bucket/checkpoints", False),
        ("spark://master:7077", None, False),
    ],
)
def test_a_local_checkpoint_path_is_refused_on_a_multi_host_cluster(
    master: str, directory: str | None, refused: bool
) -> None:
    from chandy.runtime.spark.executor import check_storage_reachable

    if refused:
        with pytest.raises(ConfigurationError, match="execution.checkpointing.dir.*hdfs://"):
            check_storage_reachable(master, directory)
    else:
        check_storage_reachable(master, directory)


def test_a_peer_without_the_secret_is_refused_and_the_job_goes_on(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    n, keys = 100_000, 10
    gate = str(tmp_path / "release-throttle")
    env = spark_env(2)
    results = (
        env.from_sequence(0, n - 1)
        .map(Throttle(0.00005, until=gate))  # running while the intruders knock
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .execute_and_collect("secrets")
    )
    out: list[Any] = []
    reader = threading.Thread(target=lambda: out.extend(results), daemon=True)
    reader.start()
    client = results.job_client
    wait_for(lambda: len(client.get_task_slots()) == 2, what="slots")
    executor = client._job_master.executor
    targets = [executor.driver_address, client.get_task_slots()[0]["data_address"]]
    for address in targets:
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as intruder:
            intruder.recv(32)  # the server's challenge
            intruder.sendall(os.urandom(64))  # a wrong answer (and a pickle bomb, if it were read)
            intruder.settimeout(10)
            assert intruder.recv(1) == b""  # disconnected
    release(gate)
    reader.join(120)
    assert sorted(out) == [(k, n // keys) for k in range(keys)]  # unaffected
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "refused a control connection" in text
    assert "refused a data connection" in text


def test_a_function_whose_module_the_executors_cannot_import_fails_the_job_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module only the driver can import (as a job's helper module is on a laptop until
    # it is shipped): cloudpickle sends its functions by reference, by module name.
    (tmp_path / "only_on_the_driver.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_on_the_driver  # type: ignore[import-not-found]

    env = spark_env()
    env.configure(
        {
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 5,
            "restart-strategy.fixed-delay.delay": 0,
        }
    )
    env.from_sequence(0, 99).map(only_on_the_driver.double).print()
    client = env.execute_async("helper module not shipped")
    with pytest.raises(JobExecutionError) as info:
        client.get_job_execution_result(timeout=120)
    message = str(info.value)
    assert "No module named 'only_on_the_driver'" in message
    assert "spark.submit.pyFiles" in message
    assert client.restarts == 0  # a restart would only repeat it
    # the slots were not lost: the next job runs in the same session
    assert sorted(spark_env().from_sequence(0, 9).map(lambda x: 2 * x).execute_and_collect()) == list(
        range(0, 20, 2)
    )


def test_closing_the_executor_does_not_wait_out_the_heartbeat_watch() -> None:
    # Every job on Spark ends with SparkExecutor.close(), which joins the executor's threads;
    # the heartbeat watch slept a whole second between looks, so each job ended up to 1 s late
    # (0.5 s on average: a sixth of a short job's time).
    from chandy.config.configuration import Configuration
    from chandy.runtime.spark.executor import SparkExecutor

    executor = SparkExecutor(Configuration())
    executor._ensure_session_and_server(2)  # starts the accept loop and the heartbeat watch
    watch = next(t for t in executor._threads if t.name == "chandy heartbeat watch")
    started = time.monotonic()
    executor.close()
    assert time.monotonic() - started < 0.5
    assert not watch.is_alive()


def test_a_job_needing_more_slots_than_spark_has_fails_fast() -> None:
    env = spark_env(6)  # the shared session is local[4]
    env.from_sequence(0, 10).print()
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as info:
        env.execute()
    assert time.monotonic() - started < 30
    assert "needs 6 slots" in str(info.value) and "has 4 task slots" in str(info.value)


def _run_script(
    name: str, *args: str, timeout: float = 300, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    env.pop("PYSPARK_PYTHON", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "tests" / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_ctrl_c_cancels_the_job_cleanly_and_keeps_retained_checkpoints(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYSPARK_PYTHON", None)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "scripts" / "endless_job.py"), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        slots = json.loads(proc.stdout.readline())  # printed once a checkpoint completed
        assert len(slots) == 2 and all(pid_alive(s["pid"]) for s in slots)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    assert code != 0 and "KeyboardInterrupt" in stderr
    wait_for(lambda: not any(pid_alive(s["pid"]) for s in slots), 30, "slot processes to end")
    assert list(tmp_path.glob("*/chk-*/_metadata")), "RETAIN_ON_CANCELLATION kept no checkpoint"


def _objects_a_full_collection_walks(_: int) -> tuple[int, int]:
    import gc

    return gc.get_freeze_count(), len(gc.get_objects())


def test_a_slot_leaves_its_long_lived_objects_out_of_garbage_collections() -> None:
    # PySpark's, chandy's and the job's objects (about 38,000) are frozen before the tasks
    # start, so a full collection, which stops every task of the slot while it runs,
    # walks only what the tasks made (5-18 ms down to 0.06 ms on the reference machine).
    env = spark_env()
    seen = list(env.from_sequence(0, 1).map(_objects_a_full_collection_walks).execute_and_collect())
    assert len(seen) == 2
    for frozen, walked in seen:
        assert frozen > 10_000
        assert walked < frozen // 10


@pytest.mark.slow
def test_reused_python_workers_supervise_the_next_jobs_slots_and_their_replacements() -> None:
    done = _run_script("reused_workers.py", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    first, second = report["first"], report["second"]
    assert first["exact"] and second["exact"]
    assert second["supervisors"] == first["supervisors"]  # the same workers, reused
    assert second["restarts"] == 1 and second["same_stage"]
