"""A slot lost while the job restarts is one more failure for the restart strategy.

The scenario of issue 11 on the Spark executor: parallelism 2, checkpoints every 300 ms,
a bounded keyed running count into the two-phase-commit FileSink. One slot process is
SIGKILLed while the job runs; then, while the job restarts, one of the *new* slot
processes is SIGKILLed too, at the first moment it can be seen (a new slot has just
registered: the stage was submitted and the other slot may still be registering) or once
every new slot has registered (the tasks are being deployed and restore their state).

Killing a slot's supervisor (the Spark task) costs the stage, so the restart's deployment
fails while it waits for the new stage's slots, or its tasks fail as they start; killing a
slot's child makes its supervisor fork another one. Either way the job must fail over
again and end FINISHED with every record committed exactly once. (Before the fix a
deployment that failed ended the job CANCELED, with "the Spark stage for the job's 2
slots failed", although the restart strategy allowed unlimited restarts.)

Each record ``i`` goes to key ``i % KEYS`` and is committed as ``key,i,count`` with the
running count of its key, so the output is exactly-once if and only if every id appears
once and each key's counts are exactly ``1..N/KEYS``.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from chandy import StreamExecutionEnvironment
from chandy.connectors import Encoder, FileSink
from chandy.messages.status import JobStatus
from chandy.runtime.job_client import JobClient
from tests.jobs import Throttle, release
from tests.test_end_to_end_exactly_once import RunningCount
from tests.test_file_sink import committed_lines
from tests.test_spark_executor import pid_alive, wait_for

pytestmark = pytest.mark.usefixtures("spark_session")

N = 60_000
KEYS = 30


def start_job(output: Path, gate: str) -> JobClient:
    """The job, paced until the test creates ``gate`` (once its kills are done)."""
    env = StreamExecutionEnvironment.get_execution_environment(executor="spark")
    env.set_parallelism(2)
    env.enable_checkpointing(300)
    env.configure({"restart-strategy.fixed-delay.delay": 0})
    (
        env.from_sequence(0, N - 1)
        .uid("source")
        .map(Throttle(0.0001, until=gate))
        .uid("throttle")
        .key_by(lambda i: i % KEYS)
        .process(RunningCount())
        .uid("count")
        .map(lambda row: f"{row['key']},{row['id']},{row['count']}")
        .uid("format")
        .sink_to(FileSink.for_row_format(str(output), Encoder.simple_string_encoder()).build())
        .uid("sink")
    )
    return env.execute_async("killed while restarting")


def process_parents() -> dict[int, int]:
    """Every process of this machine and its parent (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # it ended meanwhile
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def slot_children(spark_workers_parent: int) -> dict[int, int]:
    """Slot processes (children of the Spark Python workers that supervise them) and
    their supervisors."""
    parents = process_parents()
    workers = {pid for pid, parent in parents.items() if parent == spark_workers_parent}
    return {pid: parent for pid, parent in parents.items() if parent in workers}


def kill_at_fork(
    client: JobClient, spark_workers_parent: int, known: set[int], old_supervisors: set[int], process: str
) -> int:
    """SIGKILL the first slot process forked after ``known`` (or, for ``supervisor_pid``,
    its supervisor, which must be one of a new stage, not in ``old_supervisors``) at once:
    before it connected and registered; the pid killed."""
    deadline = time.monotonic() + 120
    while True:
        fresh = {
            pid: parent
            for pid, parent in slot_children(spark_workers_parent).items()
            if pid not in known and (process == "pid" or parent not in old_supervisors)
        }
        if fresh:
            child, supervisor = min(fresh.items())
            victim = supervisor if process == "supervisor_pid" else child
            os.kill(victim, signal.SIGKILL)
            return victim
        assert time.monotonic() < deadline and not client.is_done(), "no new slot process was forked"
        time.sleep(0.001)


def kill_once_registered(client: JobClient, known: set[int], process: str) -> int:
    """SIGKILL process ``process`` of a slot once every slot has a new registered process
    (the restart deploys its tasks, which restore their state); the pid killed."""
    deadline = time.monotonic() + 120
    while True:
        fresh = [s for s in client.get_task_slots() if s["alive"] and s["pid"] not in known]
        if len(fresh) == 2:
            victim = int(fresh[1][process])
            os.kill(victim, signal.SIGKILL)
            return victim
        assert time.monotonic() < deadline and not client.is_done(), "no new slot processes came up"
        time.sleep(0.002)


def assert_exactly_once(lines: list[str]) -> None:
    rows = [tuple(int(x) for x in line.split(",")) for line in lines]
    ids = [i for _, i, _ in rows]
    assert len(ids) == N, f"{len(ids)} rows for {N} records"
    assert len(set(ids)) == N, f"{N - len(set(ids))} records repeated"
    assert all(key == i % KEYS for key, i, _ in rows)
    per_key = Counter((key, count) for key, _, count in rows)
    assert sorted(per_key) == [(k, c) for k in range(KEYS) for c in range(1, N // KEYS + 1)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("process", "moment"),
    [
        ("supervisor_pid", "forked"),  # the new stage fails while its slots register
        ("supervisor_pid", "registered"),  # ... while the tasks deploy and restore
        ("pid", "forked"),  # a new slot process dies before it registered: forked again
    ],
    ids=["stage-lost-while-registering", "stage-lost-while-deploying", "child-lost-while-registering"],
)
def test_a_slot_killed_while_the_job_restarts_is_one_more_failover(
    tmp_path: Path, process: str, moment: str
) -> None:
    output, gate = tmp_path / "out", str(tmp_path / "release-throttle")
    client = start_job(output, gate)
    wait_for(
        lambda: (
            len(client.get_task_slots()) == 2
            and client.get_checkpoint_statistics()["counts"]["completed"] >= 2
        ),
        what="two completed checkpoints",
    )
    first = client.get_task_slots()
    spark_workers_parent = process_parents()[first[1]["supervisor_pid"]]
    known = set(slot_children(spark_workers_parent)) | {s["pid"] for s in first}
    os.kill(first[1][process], signal.SIGKILL)
    if moment == "forked":
        old_supervisors = {s["supervisor_pid"] for s in first}
        second = kill_at_fork(client, spark_workers_parent, known, old_supervisors, process)
    else:
        second = kill_once_registered(client, known, process)
    release(gate)  # the second kill is done: the rest of the input need not be paced

    client.get_job_execution_result(timeout=180)  # raises if the job did not finish
    assert client.get_job_status() is JobStatus.FINISHED
    # A lost stage fails whatever was under way: the deployment, or its new tasks. A child
    # lost before its tasks were deployed costs nothing more: its successor gets them.
    assert client.restarts >= (2 if process == "supervisor_pid" else 1)
    assert not pid_alive(second)
    assert_exactly_once(committed_lines(output))
