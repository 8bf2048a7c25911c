"""The JobMaster's control plane under faults, on the local executor with real task threads.

Cancellation must end a job within seconds however many cancels arrive and whatever the
job is doing (running, failing over, waiting to restart, feeding a collect iterator). A
deployment that fails is one more failure for the restart strategy, never a cancel. What
the JobMaster hands to its I/O pool is logged when it fails and never holds the job's end
forever, and its main-thread entry points refuse other threads.

Some tests hold the JobMaster thread in a request (:func:`job_master_held`) so that
messages queue up behind it: that makes "a second cancel arrives while the first is
being handled" happen every time instead of by luck.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.core.functions import MapFunction
from chandy.errors import InvalidCheckpointError, JobCancelledError, JobExecutionError
from chandy.messages.status import JobStatus
from chandy.runtime.job_client import JobClient
from chandy.runtime.job_master import JobMaster
from chandy.runtime.local_executor import LocalDeployment, LocalExecutor
from chandy.util.threads import WrongThreadError
from tests.jobs import CountingMap, FailOnceMap, Throttle, final_counts
from tests.probes import Probe

#: Restarts that never come during a test: a job waiting for one is "in its restart delay".
NEVER_MS = 600_000


class FailWhenFlagged(MapFunction):
    """Raises once the test creates the flag file; removes it first, so a new attempt runs on."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def map(self, value: Any) -> Any:
        if os.path.exists(self.flag):
            os.remove(self.flag)
            raise RuntimeError("failure injected by the test")
        return value


class FailingDeploys(LocalExecutor):
    """The local executor, except that the deployments numbered in ``failing`` (from 1)
    raise, as the Spark executor's does when a slot dies while the new slots register."""

    def __init__(self, failing: Sequence[int]) -> None:
        super().__init__()
        self.failing = set(failing)
        self.deploys = 0

    def deploy(self, *args: Any, **kwargs: Any) -> LocalDeployment:
        self.deploys += 1
        if self.deploys in self.failing:
            raise JobExecutionError(f"deployment {self.deploys} failed: a slot died while registering")
        return super().deploy(*args, **kwargs)


def local_env(parallelism: int = 1, **config: Any) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(parallelism)
    env.configure(config)
    return env


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def task_threads() -> set[threading.Thread]:
    """The threads of running subtasks (named "chandy <task> (i/n)")."""
    return {t for t in threading.enumerate() if t.name.startswith("chandy ") and t.name.endswith(")")}


def start_endless_job(env: StreamExecutionEnvironment, flag: str | None = None) -> JobClient:
    """A job that runs until cancelled (1 ms per record); fails once ``flag`` exists. Batches of
    10 records: a cancel (or the flag) takes effect after 10 paced records, not 1024."""
    env.configure({"chandy.network.batch-size": 10})
    stream = env.from_sequence(0, 10**9).map(Throttle(0.001))
    if flag is not None:
        stream = stream.map(FailWhenFlagged(flag))
    stream.add_sink(lambda value: None)
    client = env.execute_async("endless")
    wait_for(lambda: client.get_job_status() is JobStatus.RUNNING, "the job to run")
    return client


def assert_cancelled_within(client: JobClient, seconds: float) -> None:
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(timeout=seconds)
    assert client.get_job_status() is JobStatus.CANCELED


@contextmanager
def job_master_held(client: JobClient) -> Iterator[None]:
    """Keep the JobMaster thread busy in a request until the block ends."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait(60)

    client._job_master.call(hold)
    assert entered.wait(30), "the JobMaster never took the request"
    try:
        yield
    finally:
        release.set()


# -- cancellation --------------------------------------------------------------------------


def test_two_cancels_from_two_threads_end_the_job_within_seconds() -> None:
    client = start_endless_job(local_env())
    both = threading.Barrier(2)

    def cancel() -> None:
        both.wait()
        client.cancel()

    cancellers = [threading.Thread(target=cancel) for _ in range(2)]
    for thread in cancellers:
        thread.start()
    for thread in cancellers:
        thread.join()
    assert_cancelled_within(client, 10)


def test_a_second_cancel_queued_behind_the_first_ends_the_job_within_seconds() -> None:
    client = start_endless_job(local_env())
    with job_master_held(client):
        client.cancel()
        client.cancel()
    assert_cancelled_within(client, 10)
    client.cancel()  # the job has ended: nothing to do, nothing raised


def test_a_cancel_that_arrives_while_the_job_fails_over_ends_it(tmp_path: Path) -> None:
    flag = str(tmp_path / "fail")
    env = local_env(
        **{"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": NEVER_MS}
    )
    before = task_threads()
    client = start_endless_job(env, flag)
    wait_for(lambda: len(task_threads() - before) == 1, "the task thread")
    (task,) = task_threads() - before
    with job_master_held(client):
        Path(flag).touch()
        task.join(30)  # the task failed and reported it: the failover is queued first
        assert not task.is_alive()
        client.cancel()
    assert_cancelled_within(client, 10)
    assert client.restarts == 1


def test_a_cancel_during_the_restart_delay_ends_the_job(tmp_path: Path) -> None:
    flag = str(tmp_path / "fail")
    env = local_env(
        **{"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": NEVER_MS}
    )
    client = start_endless_job(env, flag)
    Path(flag).touch()
    wait_for(lambda: client.get_job_status() is JobStatus.RESTARTING, "the failover")
    client.cancel()
    assert_cancelled_within(client, 10)


def test_cancel_inside_a_collect_iterator_then_leaving_the_with_block_ends_the_job() -> None:
    env = local_env(2, **{"chandy.network.batch-size": 10})  # the first result and the cancel: 10 ms, not 1 s
    iterators: list[Any] = []

    def read_one_then_cancel() -> None:
        stream = env.from_sequence(0, 10**9).map(Throttle(0.001))
        with stream.execute_and_collect() as results:
            iterators.append(results)
            next(results)
            results.job_client.cancel()

    reader = threading.Thread(target=read_one_then_cancel, daemon=True)
    reader.start()
    reader.join(20)
    assert not reader.is_alive(), "leaving the with block after a cancel hangs"
    client = iterators[0].job_client
    assert client.is_done()
    assert client.get_job_status() is JobStatus.CANCELED


# -- failures while deploying ----------------------------------------------------------------


def run_job(
    env: StreamExecutionEnvironment, executor: LocalExecutor, name: str = "job"
) -> tuple[JobMaster, Any]:
    """Run the job defined on ``env`` with ``executor``: (its JobMaster, result or error)."""
    job_master = JobMaster(env._build_job_graph(name), executor)
    try:
        return job_master, job_master.run()
    except JobExecutionError as error:
        return job_master, error


def restarting_env(attempts: int) -> StreamExecutionEnvironment:
    """Parallelism 2, checkpoints every 20 ms, ``attempts`` restarts without delay."""
    env = local_env(
        2,
        **{
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": attempts,
            "restart-strategy.fixed-delay.delay": 0,
        },
    )
    env.enable_checkpointing(20)
    return env


def counting_job(env: StreamExecutionEnvironment, probe: Probe, n: int, fail_once: bool) -> None:
    """A bounded job whose operator state counts every record (exactly once if it sums to n);
    with ``fail_once`` it is slow enough (~0.1 ms a record) to fail after some checkpoints."""
    stream = env.from_sequence(0, n - 1).uid("source").map(CountingMap("map", probe)).uid("map")
    if fail_once:
        stream = stream.map(Throttle(0.0001)).uid("throttle")
        stream = stream.map(FailOnceMap("fail", probe, n // env.get_parallelism(), seed=7)).uid("fail")
    stream.add_sink(lambda value: None)


def run_counting_job(
    attempts: int, failing_deploys: Sequence[int], fail_once: bool, n: int = 20_000
) -> tuple[JobMaster, FailingDeploys, Probe, Any]:
    """:func:`counting_job` under :func:`restarting_env`, on :class:`FailingDeploys`."""
    probe, env = Probe(), restarting_env(attempts)
    counting_job(env, probe, n, fail_once)
    executor = FailingDeploys(failing_deploys)
    job_master, outcome = run_job(env, executor)
    return job_master, executor, probe, outcome


def causes(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None:
        chain.append(current)
        current = current.__cause__
    return chain


def test_a_failed_first_deployment_is_restarted_by_the_restart_strategy() -> None:
    job_master, executor, probe, result = run_counting_job(2, [1], fail_once=False)
    assert not isinstance(result, BaseException), result
    assert job_master.execution_graph.state is JobStatus.FINISHED
    assert (executor.deploys, result.restarts) == (2, 1)
    assert sum(final_counts(probe, "map").values()) == 20_000


@pytest.mark.slow
def test_failed_deployments_during_restarts_are_restarted_until_one_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    job_master, executor, probe, result = run_counting_job(3, [2, 3], fail_once=True)
    assert not isinstance(result, BaseException), result
    assert job_master.execution_graph.state is JobStatus.FINISHED
    # the task failure, then two failed deployments: three restarts, the fourth deploy runs
    assert (executor.deploys, result.restarts) == (4, 3)
    restored = [
        r.getMessage() for r in caplog.records if "deploying its tasks restoring checkpoint" in r.getMessage()
    ]
    assert len(restored) == 2, "the failed deployments were restoring a checkpoint"
    for name in ("map", "fail"):
        assert sum(final_counts(probe, name).values()) == 20_000, name


def test_a_failed_deployment_beyond_the_restart_attempts_fails_the_job_with_its_cause() -> None:
    job_master, executor, _, error = run_counting_job(1, [2], fail_once=True)
    assert isinstance(error, JobExecutionError) and not isinstance(error, JobCancelledError), error
    assert job_master.execution_graph.state is JobStatus.FAILED
    assert any("deployment 2 failed" in str(cause) for cause in causes(error)), causes(error)
    assert executor.deploys == 2


def test_a_failed_first_deployment_without_restarts_fails_the_job_with_its_cause() -> None:
    env = local_env(1)
    counting_job(env, Probe(), 100, fail_once=False)
    job_master, error = run_job(env, FailingDeploys([1]))
    assert isinstance(error, JobExecutionError) and not isinstance(error, JobCancelledError), error
    assert job_master.execution_graph.state is JobStatus.FAILED
    assert any("deployment 1 failed" in str(cause) for cause in causes(error)), causes(error)


def test_a_bad_restore_path_fails_at_once_and_is_not_retried(tmp_path: Path) -> None:
    env = local_env(1, **{"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": 0})
    env.enable_checkpointing(100)
    env.set_restore_path(str(tmp_path / "nope" / "chk-3"))
    counting_job(env, Probe(), 100, fail_once=False)
    executor = FailingDeploys([])
    job_master = JobMaster(env._build_job_graph("bad restore"), executor)
    with pytest.raises(InvalidCheckpointError, match="does not exist"):
        job_master.run()
    assert executor.deploys == 0
    assert job_master.execution_graph.state is JobStatus.FAILED


# -- the I/O pool ----------------------------------------------------------------------------


def checkpointing_job_master() -> JobMaster:
    env = local_env(1)
    env.enable_checkpointing(1000)
    env.from_sequence(0, 10).add_sink(lambda value: None)
    return JobMaster(env._build_job_graph("io"), LocalExecutor())


class DeleteCheckpointFiles:
    """An I/O action as the coordinator hands over: deletes a checkpoint's files."""

    def __init__(self, checkpoint_id: int, fail: bool = False, hold: threading.Event | None = None) -> None:
        self.checkpoint_id = checkpoint_id
        self.fail = fail
        self.hold = hold

    def __call__(self) -> None:
        if self.hold is not None:
            self.hold.wait(60)
        if self.fail:
            raise OSError(f"chk-{self.checkpoint_id}/state: permission denied")


def test_a_failed_io_action_is_logged_with_what_failed(caplog: pytest.LogCaptureFixture) -> None:
    job_master = checkpointing_job_master()
    job_master._run_io(DeleteCheckpointFiles(7, fail=True))
    job_master._run_io(DeleteCheckpointFiles(8))
    job_master._shutdown(JobStatus.FINISHED)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "DeleteCheckpointFiles" in errors[0].getMessage()
    assert errors[0].exc_info is not None and "chk-7/state" in str(errors[0].exc_info[1])


def test_an_io_action_failing_after_shutdown_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    job_master = checkpointing_job_master()
    job_master._shutdown(JobStatus.FINISHED)
    job_master._run_io(DeleteCheckpointFiles(9, fail=True))  # runs at once, in this thread
    assert any("chk-9/state" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


def test_a_hanging_io_action_does_not_hold_the_job_end_forever(caplog: pytest.LogCaptureFixture) -> None:
    job_master = checkpointing_job_master()
    job_master.io_shutdown_timeout_s = 0.2
    hold = threading.Event()
    job_master._run_io(DeleteCheckpointFiles(3, hold=hold))
    started = time.monotonic()
    job_master._shutdown(JobStatus.FINISHED)
    assert time.monotonic() - started < 5
    assert any(
        "DeleteCheckpointFiles" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
    )
    hold.set()


# -- thread confinement ------------------------------------------------------------------------


def test_main_thread_entry_points_refuse_other_threads_while_the_job_runs() -> None:
    client = start_endless_job(local_env())
    job_master = client._job_master
    attempt = job_master.execution_graph.current_executions()[0].attempt_id
    with pytest.raises(WrongThreadError, match="JobMaster"):
        job_master.notify_checkpoint_complete(attempt, 1, 0)
    with pytest.raises(WrongThreadError, match="JobMaster"):
        job_master._cancel_tasks()
    client.cancel()
    assert_cancelled_within(client, 10)
    assert job_master.call(lambda: job_master.execution_graph.state).result(1) is JobStatus.CANCELED


def test_job_status_is_answered_by_the_job_master_thread() -> None:
    client = start_endless_job(local_env())
    with job_master_held(client):
        with pytest.raises(TimeoutError, match="JobMaster"):
            client.get_job_status(timeout=0.2)
    assert client.get_job_status(timeout=10) is JobStatus.RUNNING
    client.cancel()
    assert_cancelled_within(client, 10)


def test_requests_after_the_job_ended_are_answered_at_once() -> None:
    env = local_env(1)
    env.from_sequence(0, 10).add_sink(lambda value: None)
    job_master = JobMaster(env._build_job_graph("short"), LocalExecutor())
    job_master.run()
    assert job_master.call(lambda: job_master.execution_graph.state).result(1) is JobStatus.FINISHED


class SlowToOpen(MapFunction):
    """A map whose task takes ``seconds`` to start: a small bounded source ends before it runs."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def open(self, runtime_context: Any) -> None:
        time.sleep(self.seconds)

    def map(self, value: Any) -> Any:
        return value


def test_a_source_that_ends_before_every_task_runs_still_gets_its_final_checkpoint_at_once() -> None:
    """The final checkpoint is asked for when every source ended; a task downstream still
    opening refuses it (not all tasks running). It must be asked for again once every task
    runs, not at the next periodic tick (ten minutes here: the job hung that long)."""
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor="local")
    env.enable_checkpointing(600_000)
    env.from_collection(list(range(100))).rebalance().map(SlowToOpen(1.0)).print()
    client = env.execute_async("final checkpoint after a slow open")
    try:
        result = client.get_job_execution_result(timeout=60)
    finally:
        client.cancel()
    assert result.get_job_id() == client.get_job_id()
    assert client.get_job_status() is JobStatus.FINISHED
