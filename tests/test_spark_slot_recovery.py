"""Killed slot processes on Spark: a slot's child is re-forked by its supervisor in the
same barrier stage; a killed supervisor costs the stage, which is resubmitted. Both
keep exactly-once output, and the driver's threads stay bounded through them."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.errors import JobCancelledError
from chandy.runtime.job_client import JobClient
from tests.jobs import CountingFilter, KeyedCounter, Throttle, final_counts, release
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too
from tests.test_spark_executor import pid_alive, wait_for

pytestmark = pytest.mark.usefixtures("spark_session")


def start_counting_job(n: int, keys: int, probe: Probe, delay_s: float) -> tuple[JobClient, list[Any], Any]:
    """Paced by ``delay_s`` per record until the test releases :func:`throttle_gate`."""
    env = StreamExecutionEnvironment.get_execution_environment(executor="spark")
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    env.configure({"restart-strategy.fixed-delay.delay": 0})
    results = (
        env.from_sequence(0, n - 1)
        .uid("source")
        .filter(CountingFilter("filter", probe))
        .uid("filter")
        .map(Throttle(delay_s, until=throttle_gate(probe)))
        .uid("throttle")
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .uid("counter")
        .execute_and_collect("slot recovery")
    )
    out: list[Any] = []

    def read() -> None:
        try:
            out.extend(results)
        except JobCancelledError:
            pass  # the test cancels an endless job

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return results.job_client, out, reader


def throttle_gate(probe: Probe) -> str:
    """The file that ends the pacing of the job ``probe`` belongs to."""
    return os.path.join(probe.directory, "release-throttle")


def running_job(
    n: int, keys: int, delay_s: float, checkpoints: int
) -> tuple[JobClient, list[Any], threading.Thread, Probe]:
    """A counting job on the Spark executor, once it runs and completed ``checkpoints``."""
    probe = Probe()
    client, out, reader = start_counting_job(n, keys, probe, delay_s)
    wait_for(
        lambda: running_with_slots(client) and completed_checkpoints(client) >= checkpoints,
        what="checkpoints",
    )
    return client, out, reader, probe


def assert_finished_exactly_once(
    client: JobClient, out: list[Any], reader: threading.Thread, probe: Probe, n: int, keys: int
) -> None:
    """Once the test has done what needed the job running: the rest of its input unpaced."""
    release(throttle_gate(probe))
    reader.join(180)
    assert not reader.is_alive()
    assert client.get_job_status().name == "FINISHED"
    assert sorted(out) == [(k, n // keys) for k in range(keys)]
    assert sum(final_counts(probe, "filter").values()) == n


def driver_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("chandy")]


def running_with_slots(client: JobClient, count: int = 2) -> bool:
    slots = client.get_task_slots()
    return (
        client.get_job_status().name == "RUNNING" and len(slots) == count and all(s["alive"] for s in slots)
    )


def completed_checkpoints(client: JobClient) -> int:
    return int(client.get_checkpoint_statistics()["counts"]["completed"])


def kill_and_wait_back(client: JobClient, index: int, key: str) -> dict[str, Any]:
    """SIGKILL one process of slot ``index`` (``pid``: the slot's child; ``supervisor_pid``:
    the Spark task itself), then wait until the job runs again and checkpoints."""
    before = client.get_task_slots()[index]
    restarts = client.restarts
    victim = before[key]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: client.restarts > restarts, what="the failover")
    wait_for(
        lambda: running_with_slots(client) and client.get_task_slots()[index]["pid"] != before["pid"],
        what="the slot to be back",
    )
    done = completed_checkpoints(client)
    wait_for(lambda: completed_checkpoints(client) > done, what="a checkpoint after the restart")
    wait_for(lambda: not pid_alive(victim), 10, "the killed process to be reaped")
    return before


@pytest.mark.slow
@on_rocksdb_too()  # new ones restore from shared/
def test_a_killed_slot_child_is_replaced_in_the_same_stage_exactly_once() -> None:
    n, keys = 150_000, 50
    client, out, reader, probe = running_job(n, keys, 0.00002, 2)
    executor = client._job_master.executor
    pool = executor._pool
    first = client.get_task_slots()
    for index in (1, 0):
        killed = kill_and_wait_back(client, index, "pid")
        now = client.get_task_slots()[index]
        assert now["supervisor_pid"] == killed["supervisor_pid"]  # the Spark task lived on
        assert now["jvm_pid"] == killed["jvm_pid"]
        assert now["incarnation"] == killed["incarnation"] + 1
    assert executor._pool is pool  # no new Spark stage was submitted
    assert_finished_exactly_once(client, out, reader, probe, n, keys)
    assert client.restarts == 2
    # the job ended: no slot process (child or supervisor) is left behind
    for slot in first:
        wait_for(lambda s=slot: not pid_alive(s["supervisor_pid"]), 30, "supervisors to end")
    assert not any(pid_alive(s["pid"]) for s in client.get_task_slots())


@pytest.mark.slow
def test_threads_stay_bounded_through_child_kills_and_a_stage_resubmission() -> None:
    n, keys = 2_000_000, 20
    client, out, reader, _ = running_job(n, keys, 0.00005, 1)
    executor = client._job_master.executor
    baseline = len(executor._threads)
    chandy_threads = len(driver_threads())
    pool = executor._pool
    kill_and_wait_back(client, 1, "pid")
    kill_and_wait_back(client, 0, "pid")
    killed = kill_and_wait_back(client, 1, "supervisor_pid")  # the Spark task: the stage goes
    assert executor._pool is not pool
    assert not pid_alive(killed["pid"])  # the supervisor's child died with it
    kill_and_wait_back(client, 0, "pid")
    live = [t for t in executor._threads if t.is_alive()]
    assert len(executor._threads) <= baseline + 2, [t.name for t in executor._threads]
    assert len(live) <= baseline + 2, [t.name for t in live]
    # with each slot connection's sender and results threads, joined by their owners
    assert len(driver_threads()) <= chandy_threads + 4, driver_threads()
    client.cancel()
    reader.join(60)
    assert not reader.is_alive()
    assert [o for o in out if o[0] == "overflow"] == []  # nothing was counted twice


@pytest.mark.slow
def test_slot_processes_killed_together_and_again_during_the_restart_recover_exactly_once() -> None:
    n, keys = 150_000, 50
    client, out, reader, probe = running_job(n, keys, 0.00002, 2)
    executor = client._job_master.executor
    pool = executor._pool
    first = client.get_task_slots()
    for slot in first:  # both at once
        os.kill(slot["pid"], signal.SIGKILL)
    # and slot 1's next process as soon as it is up, before the job runs again
    wait_for(lambda: client.get_task_slots()[1]["pid"] != first[1]["pid"], what="slot 1's next process")
    second = client.get_task_slots()[1]
    os.kill(second["pid"], signal.SIGKILL)
    wait_for(lambda: client.get_task_slots()[1]["incarnation"] >= 2, what="slot 1's third process")
    assert_finished_exactly_once(client, out, reader, probe, n, keys)
    assert executor._pool is pool
    assert not any(pid_alive(s["pid"]) for s in [*first, second])


@pytest.mark.slow
def test_a_slot_declared_lost_by_many_threads_at_once_is_lost_once(caplog: pytest.LogCaptureFixture) -> None:
    # The reader, the sender, the heartbeat watch and the stage's thread can all find the
    # same slot gone at the same moment; its tasks must fail once, and the pool stay whole.
    n, keys = 100_000, 50
    client, out, reader, probe = running_job(n, keys, 0.00002, 1)
    executor = client._job_master.executor
    pool = executor._pool
    slot = pool.current()[0]
    start = threading.Barrier(8)

    def declare() -> None:
        start.wait()
        executor._slot_lost(pool, slot, "declared lost by the test")

    threads = [threading.Thread(target=declare) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert_finished_exactly_once(client, out, reader, probe, n, keys)
    lost = [
        r
        for r in caplog.records
        if "declared lost by the test" in r.getMessage() and "is lost" in r.getMessage()
    ]
    assert len(lost) == 1
    assert client.restarts == 1
    assert executor._pool is pool
    assert client.get_task_slots()[0]["incarnation"] == 1  # the process the driver dropped was replaced
