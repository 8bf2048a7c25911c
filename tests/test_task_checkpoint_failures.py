"""How a subtask's checkpoint fails: the synchronous part fails the task, the asynchronous
part declines, and no failure goes unreported.

Flink's rules (``SubtaskCheckpointCoordinatorImpl``, ``AsyncCheckpointRunnable``):

* the synchronous part (an operator's ``snapshot_state``, a sink writer's
  ``prepare_commit``) fails the task: the operator stopped half way, so its state may be
  half-written and the task cannot go on from it. The checkpoint is declined; the JobMaster
  fails over to the last completed checkpoint, and the output stays exactly-once;
* the asynchronous part (writing state files) only declines: the task's state is intact.

The single-task tests run one real :class:`StreamTask` on a thread with a recording
responder in place of the coordinator; the job tests run whole jobs on the local executor
with ``tolerable-failed-checkpoints`` well above zero, so that only the task failure, not
the failure count, can make the job fail over.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.connectors.file_sink import Encoder, FileSink, FileSinkWriter
from chandy.core.connector import SinkWriterContext
from chandy.core.functions import (
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedProcessFunction,
    MapFunction,
    RuntimeContext,
)
from chandy.core.state import ListStateDescriptor, ValueStateDescriptor
from chandy.graph.execution_graph import ExecutionGraph
from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    CheckpointFailureReason,
    CheckpointOptions,
    DeclineCheckpoint,
    EndOfInputReached,
)
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.status import ExecutionState
from chandy.network.barrier_handler import AlignmentMetrics
from chandy.runtime.local_executor import LocalExecutor
from chandy.task.services import TaskFailure, TaskServices
from chandy.task.stream_task import StreamTask
from tests.jobs import KeyedCounter, Throttle
from tests.probes import Probe

# ---------------------------------------------------------------------- user code that fails


class SnapshotFailsOnce(MapFunction, CheckpointedFunction):
    """Counts its records in operator state; its first ``snapshot_state`` after
    ``fail_after`` records (over all attempts and subtasks) raises."""

    def __init__(self, probe: Probe, fail_after: int = 0) -> None:
        self.probe = probe
        self.fail_after = fail_after
        self.count = 0

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        self.state = context.get_operator_state_store().get_list_state(ListStateDescriptor("count"))
        self.count = sum(self.state.get()) if context.is_restored() else 0

    def map(self, value: Any) -> Any:
        self.count += 1
        return value

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        if self.count >= self.fail_after and self.probe.add("snapshot failures") == 1:
            raise RuntimeError(f"snapshot_state of checkpoint {context.get_checkpoint_id()} failed")
        self.state.update([self.count])


class PrepareCommitFailsOnce(FileSink):
    """A FileSink whose writer's first ``prepare_commit`` with parts to commit fails after it
    closed them: half way, as a full disk or a lost mount would stop it. A task that went on
    from there would have dropped those parts, and their records, for good."""

    def __init__(self, base_path: str, probe: Probe) -> None:
        super().__init__(base_path, encoder=Encoder.simple_string_encoder())
        self.probe = probe

    def create_writer(self, context: SinkWriterContext) -> FileSinkWriter:
        return _PrepareCommitFailsOnceWriter(self, context)


class _PrepareCommitFailsOnceWriter(FileSinkWriter):
    sink: PrepareCommitFailsOnce

    def prepare_commit(self, checkpoint_id: int | None) -> list[Any]:
        committables = super().prepare_commit(checkpoint_id)
        if checkpoint_id is not None and committables and self.sink.probe.add("prepare failures") == 1:
            raise OSError(f"prepare_commit of checkpoint {checkpoint_id} failed after closing its parts")
        return committables


# ---------------------------------------------------------------------- one task on a thread


class RecordingResponder:
    """The coordinator's side of a task's checkpoint answers (CheckpointResponder)."""

    def __init__(self) -> None:
        self.acks: list[AcknowledgeCheckpoint] = []
        self.declines: list[DeclineCheckpoint] = []
        self.ended_inputs = 0

    def acknowledge_checkpoint(self, message: AcknowledgeCheckpoint) -> None:
        self.acks.append(message)

    def decline_checkpoint(self, message: DeclineCheckpoint) -> None:
        self.declines.append(message)

    def report_end_of_input(self, message: EndOfInputReached) -> None:
        self.ended_inputs += 1


class RecordingListener:
    """The JobMaster's side of a task's state changes (TaskStateListener)."""

    def __init__(self) -> None:
        self.states: list[tuple[ExecutionState, TaskFailure | None]] = []
        self.finished: set[ExecutionAttemptID] = set()

    def notify_task_state(
        self, attempt_id: ExecutionAttemptID, state: ExecutionState, failure: TaskFailure | None = None
    ) -> None:
        self.states.append((state, failure))
        if state is ExecutionState.FINISHED:
            self.finished.add(attempt_id)


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def build_source_task(
    env: StreamExecutionEnvironment, services: TaskServices
) -> tuple[StreamTask, RecordingListener]:
    """The task of the job built on ``env``: one chained task of parallelism 1."""
    job_graph = env._build_job_graph("one task")
    graph = ExecutionGraph(job_graph)
    (vertex,) = graph.all_execution_vertices()
    listener = RecordingListener()
    return StreamTask(graph.deployment_descriptor(vertex), [], [], services, listener), listener


@contextmanager
def running_source_task(
    env: StreamExecutionEnvironment, services: TaskServices
) -> Iterator[tuple[StreamTask, RecordingListener]]:
    """The job built on ``env`` must be one chained task of parallelism 1; it runs on a thread
    until the block ends (then it is cancelled, if still running)."""
    task, listener = build_source_task(env, services)
    thread = threading.Thread(target=task.invoke, name="task under test", daemon=True)
    thread.start()
    try:
        wait_for(lambda: task.state is not ExecutionState.INITIALIZING, "the task to start")
        yield task, listener
    finally:
        task.cancel()
        thread.join(30)
        assert not thread.is_alive()


def one_task_env() -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    env.enable_checkpointing(60_000)  # the tests trigger checkpoints themselves
    return env


#: For a paced source: a triggered checkpoint's barrier waits behind 10 records, not 1024.
SMALL_BATCHES = {"chandy.network.batch-size": 10}


def test_a_failing_snapshot_state_fails_the_task_and_declines_the_checkpoint() -> None:
    probe = Probe()
    env = one_task_env()
    env.configure(SMALL_BATCHES)
    env.from_sequence(0, 10**9).map(Throttle(0.0005)).map(SnapshotFailsOnce(probe)).add_sink(lambda v: None)
    responder = RecordingResponder()
    with running_source_task(env, TaskServices(checkpoint_responder=responder)) as (task, listener):
        wait_for(lambda: task.state is ExecutionState.RUNNING, "the task to run")
        task.trigger_checkpoint_async(1, 0, CheckpointOptions())
        wait_for(lambda: task.state is ExecutionState.FAILED, "the task to fail")
    assert [(d.checkpoint_id, d.reason) for d in responder.declines] == [
        (1, CheckpointFailureReason.TASK_CHECKPOINT_FAILURE)
    ]
    assert responder.declines[0].message == "RuntimeError: snapshot_state of checkpoint 1 failed"
    assert responder.acks == []
    state, failure = listener.states[-1]
    assert state is ExecutionState.FAILED and failure is not None
    assert isinstance(failure.exception, RuntimeError)  # the user's own exception ...
    assert failure.operator_name is not None and "Map" in failure.operator_name  # ... and where
    assert "took its snapshot of checkpoint 1" in failure.traceback_text


def test_a_checkpoint_whose_asynchronous_part_cannot_start_is_declined_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pool that writes state files is shut down (the job is going away): the checkpoint
    was neither acknowledged nor declined, and nothing was logged."""
    probe = Probe()
    env = one_task_env()
    env.configure(SMALL_BATCHES)
    env.from_sequence(0, 10**9).map(Throttle(0.0005)).map(SnapshotFailsOnce(probe, 10**9)).add_sink(
        lambda v: None
    )
    responder = RecordingResponder()
    pool = ThreadPoolExecutor(max_workers=1)
    pool.shutdown()
    services = TaskServices(checkpoint_responder=responder, async_executor=pool)
    with caplog.at_level(logging.WARNING, logger="chandy.task.checkpointing"):
        with running_source_task(env, services) as (task, _):
            wait_for(lambda: task.state is ExecutionState.RUNNING, "the task to run")
            task.trigger_checkpoint_async(7, 0, CheckpointOptions())
            wait_for(lambda: bool(responder.declines), "a decline")
            assert task.state is ExecutionState.RUNNING  # the asynchronous part fails nothing
    (decline,) = responder.declines
    assert (decline.checkpoint_id, decline.reason) == (7, CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION)
    assert "shutdown" in decline.message
    assert responder.acks == []
    assert any("checkpoint 7" in r.getMessage() for r in caplog.records), caplog.text


def test_a_task_that_is_not_running_declines_a_checkpoint_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = one_task_env()
    env.from_sequence(0, 10).add_sink(lambda v: None)
    responder = RecordingResponder()
    task, _ = build_source_task(env, TaskServices(checkpoint_responder=responder))
    with caplog.at_level(logging.INFO, logger="chandy.task.stream_task"):
        task.perform_checkpoint(3, 0, CheckpointOptions(), AlignmentMetrics())
    assert [(d.checkpoint_id, d.reason) for d in responder.declines] == [
        (3, CheckpointFailureReason.CHECKPOINT_DECLINED_TASK_NOT_READY)
    ]
    assert any("declines checkpoint 3: the task is DEPLOYING" in r.getMessage() for r in caplog.records)


class KeepEveryKey(KeyedProcessFunction):
    """One value of keyed state per key: enough state that serializing it takes many steps."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen"))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        self.seen.update(value)
        return ()


@pytest.mark.slow
def test_a_task_waits_for_its_final_checkpoint_even_while_it_is_being_serialized() -> None:
    """The keyed task reads barrier 1 with a large state, so serializing it takes many short
    steps (mails between batches). The source's end of data came before the barrier, so
    checkpoint 1 is the keyed task's final checkpoint too: it must not end (and drop the rest
    of the steps) when the source's end of partition arrives, but serialize, acknowledge and
    end only once checkpoint 1 completed (Flink's FLIP-147: every task waits for a
    checkpoint taken after its operators finished)."""
    keys = 300_000
    env = one_task_env()
    env.from_sequence(0, keys - 1).key_by(lambda x: x).process(KeepEveryKey()).add_sink(lambda v: None)
    job_graph = env._build_job_graph("two tasks")
    graph = ExecutionGraph(job_graph)
    source_vertex, keyed_vertex = sorted(graph.all_execution_vertices(), key=lambda v: v.job_vertex.id)
    responder = RecordingResponder()
    listener = RecordingListener()
    deployment = LocalExecutor().deploy(
        graph,
        [graph.deployment_descriptor(v) for v in (source_vertex, keyed_vertex)],
        listener,
        TaskServices(checkpoint_responder=responder),
    )
    try:
        source = source_vertex.current_execution.attempt_id
        keyed = keyed_vertex.current_execution.attempt_id
        wait_for(lambda: responder.ended_inputs >= 1, "the source to read all its input")
        deployment.trigger_checkpoint(source, 1, 0, CheckpointOptions())
        wait_for(lambda: any(a.attempt_id == source for a in responder.acks), "the source's ack")
        assert not listener.finished  # neither ends before checkpoint 1 completed
        wait_for(lambda: any(a.attempt_id == keyed for a in responder.acks), "the keyed task's ack", 120)
        assert not listener.finished
        deployment.notify_checkpoint_complete(source, 1, 0)
        deployment.notify_checkpoint_complete(keyed, 1, 0)
        wait_for(lambda: listener.finished == {source, keyed}, "both tasks to finish", timeout_s=120)
        # A later checkpoint (a stop-with-savepoint) reaching the source just as it ended: it
        # answers as a finished task, acknowledged with no state, instead of failing it.
        deployment.trigger_checkpoint(source, 2, 0, CheckpointOptions())
        wait_for(lambda: any(a.checkpoint_id == 2 for a in responder.acks), "the finished source's answer")
    finally:
        deployment.cancel()
        deployment.wait_stopped(30)
    assert [a.checkpoint_id for a in responder.acks if a.attempt_id == keyed] == [1]
    assert responder.declines == []
    (late,) = [a for a in responder.acks if a.checkpoint_id == 2]
    assert late.attempt_id == source and late.state is not None
    assert all(s.finished and s.state_size == 0 for s in late.state.subtask_states.values())


# ---------------------------------------------------------------------- whole jobs


def failover_env() -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    env.enable_checkpointing(50)
    env.configure(
        {
            "restart-strategy.fixed-delay.delay": 50,
            # only the task failure can make the job fail over, not the count of failed checkpoints
            "execution.checkpointing.tolerable-failed-checkpoints": 5,
        }
    )
    return env


@pytest.mark.slow
def test_a_job_whose_snapshot_state_raises_fails_over_and_counts_exactly_once() -> None:
    n, keys = 20_000, 20
    probe = Probe()
    env = failover_env()
    results = (
        env.from_sequence(0, n - 1)
        .map(Throttle(0.00005))
        .map(SnapshotFailsOnce(probe, fail_after=1000))
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .execute_and_collect("snapshot fails")
    )
    with results:
        out = list(results)
    assert probe.get("snapshot failures") >= 1  # the failure happened ...
    assert results.job_client.restarts >= 1  # ... failed the task, and the job failed over
    assert sorted(out) == [(k, n // keys) for k in range(keys)]  # every key once, count exact


@pytest.mark.slow
def test_a_file_sink_whose_prepare_commit_fails_half_way_still_writes_every_record_once(
    tmp_path: Path,
) -> None:
    n = 20_000
    probe = Probe(str(tmp_path / "probe"))
    out = tmp_path / "out"
    env = failover_env()
    env.from_sequence(0, n - 1).map(Throttle(0.00005)).sink_to(PrepareCommitFailsOnce(str(out), probe))
    result = env.execute("prepare_commit fails")
    assert probe.get("prepare failures") >= 1
    lines = [
        line
        for path in out.rglob("*")
        if path.is_file() and not path.name.startswith((".", "_"))
        for line in path.read_text().splitlines()
    ]
    assert sorted(map(int, lines)) == list(range(n))  # nothing lost with the dropped parts, nothing twice
    assert result.restarts >= 1  # the task failed, and the job failed over
    assert not [p.name for p in out.rglob(".*") if p.is_file()]  # no leftovers
    assert os.listdir(out)
