"""The JobMaster: runs one job from deployment to its end.

All of its decisions happen on one thread (the caller of :meth:`JobMaster.run`),
fed by a queue: tasks report state changes from their own threads (or, on
Spark, through RPC) and the JobMaster handles them in order. A task failure
cancels every other task; a job whose tasks have all finished is FINISHED.
"""

from __future__ import annotations

import logging
import queue
from dataclasses import dataclass

from chandy.errors import JobCancelledError, JobExecutionError
from chandy.graph.execution_graph import ExecutionGraph, JobStatus
from chandy.graph.job_graph import JobGraph
from chandy.runtime.executor import Deployment, Executor
from chandy.runtime.job_result import JobExecutionResult
from chandy.task.deployment import ExecutionAttemptID, ExecutionState
from chandy.task.services import ResultPublisher, TaskFailure, TaskServices
from chandy.util.clock import Clock, SystemClock

log = logging.getLogger(__name__)

#: How long cancelled tasks get to stop before the JobMaster gives up on them.
CANCEL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TaskStateUpdate:
    attempt_id: ExecutionAttemptID
    state: ExecutionState
    failure: TaskFailure | None


@dataclass(frozen=True)
class CancelJob:
    reason: str


class JobMaster:
    """Owns the ExecutionGraph of one job and drives it to a terminal status."""

    def __init__(self, job_graph: JobGraph, executor: Executor, *,
                 results: ResultPublisher | None = None, clock: Clock | None = None) -> None:
        self.job_graph = job_graph
        self.executor = executor
        self.clock = clock or SystemClock()
        self.execution_graph = ExecutionGraph(job_graph, self.clock)
        self.services = TaskServices(results=results)
        self._inbox: queue.Queue[TaskStateUpdate | CancelJob] = queue.Queue()
        self._deployment: Deployment | None = None

    @property
    def job_id(self) -> str:
        return self.job_graph.job_id

    # -- called from other threads ---------------------------------------------

    def notify_task_state(self, attempt_id: ExecutionAttemptID, state: ExecutionState,
                          failure: TaskFailure | None = None) -> None:
        """TaskStateListener: a task changed state (any thread)."""
        self._inbox.put(TaskStateUpdate(attempt_id, state, failure))

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Cancel the job (any thread); :meth:`run` then raises :class:`JobCancelledError`."""
        self._inbox.put(CancelJob(reason))

    # -- the JobMaster thread ----------------------------------------------------

    def run(self) -> JobExecutionResult:
        """Deploy, wait for the end, return the result or raise why the job failed."""
        eg = self.execution_graph
        start_ms = self.clock.now_ms()
        log.info("Submitting job %s (%s): %d tasks in %d vertices.", self.job_graph.job_name,
                 self.job_id, sum(v.parallelism for v in self.job_graph.vertices),
                 len(self.job_graph.vertices))
        eg.transition_state(JobStatus.CREATED, JobStatus.RUNNING)
        try:
            self._deploy()
            outcome = self._await_end()
        except BaseException:
            # KeyboardInterrupt or a bug here: never leave tasks running behind.
            self._cancel_tasks()
            eg.transition_state(eg.state, JobStatus.CANCELED)
            raise
        runtime = self.clock.now_ms() - start_ms
        if outcome is None:
            return JobExecutionResult(self.job_id, self.job_graph.job_name, runtime)
        raise outcome

    def _deploy(self) -> None:
        eg = self.execution_graph
        descriptors = [eg.deployment_descriptor(ev) for ev in eg.all_execution_vertices()]
        for ev in eg.all_execution_vertices():
            ev.current_execution.state = ExecutionState.DEPLOYING
        self._deployment = self.executor.deploy(eg, descriptors, self, self.services)

    def _await_end(self) -> JobExecutionError | None:
        """Handle inbox messages until the job is terminal; the error to raise, if any."""
        eg = self.execution_graph
        while True:
            message = self._inbox.get()
            if isinstance(message, CancelJob):
                log.info("Cancelling job %s (%s): %s.", self.job_graph.job_name, self.job_id,
                         message.reason)
                eg.transition_state(JobStatus.RUNNING, JobStatus.CANCELLING)
                self._cancel_tasks()
                eg.transition_state(JobStatus.CANCELLING, JobStatus.CANCELED)
                return JobCancelledError(f"job '{self.job_graph.job_name}' was cancelled: "
                                         f"{message.reason}", self.job_id)
            if not eg.update_execution_state(message.attempt_id, message.state, message.failure):
                continue
            if message.state is ExecutionState.FAILED:
                return self._fail(message)
            if message.state is ExecutionState.FINISHED and eg.all_in_state(ExecutionState.FINISHED):
                eg.transition_state(JobStatus.RUNNING, JobStatus.FINISHED)
                return None

    def _fail(self, update: TaskStateUpdate) -> JobExecutionError:
        eg = self.execution_graph
        failure = update.failure
        error = _job_error(self.job_graph, update, eg)
        eg.transition_state(JobStatus.RUNNING, JobStatus.FAILING, error)
        self._cancel_tasks()
        eg.transition_state(JobStatus.FAILING, JobStatus.FAILED, error)
        if failure is not None and failure.exception is not None:
            error.__cause__ = failure.exception
        return error

    def _cancel_tasks(self) -> None:
        if self._deployment is None:
            return
        self._deployment.cancel()
        self._deployment.wait_stopped(CANCEL_TIMEOUT_S)
        # Drain the reports of the cancelled tasks so that they are not read later.
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(message, TaskStateUpdate):
                self.execution_graph.update_execution_state(message.attempt_id, message.state,
                                                            message.failure)


def _job_error(job_graph: JobGraph, update: TaskStateUpdate, eg: ExecutionGraph) -> JobExecutionError:
    failure = update.failure
    vertex = job_graph.vertex(update.attempt_id.vertex_id)
    where = f"{vertex.name} ({update.attempt_id.subtask_index + 1}/{vertex.parallelism})"
    if failure is None:
        return JobExecutionError(f"job '{job_graph.job_name}' failed: task {where} failed",
                                 job_graph.job_id)
    operator = f" in operator '{failure.operator_name}'" if failure.operator_name else ""
    message = (f"job '{job_graph.job_name}' failed: {failure.exception_type}: {failure.message}"
               f"{operator} of task {where}")
    if failure.exception is None:  # raised in another process: its traceback is all we have
        message += f"\n\nTask traceback:\n{failure.traceback_text}"
    return JobExecutionError(message, job_graph.job_id)
