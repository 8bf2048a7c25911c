"""The JobMaster: runs one job from deployment to its end, through failures.

All of its decisions happen on one thread (the caller of :meth:`JobMaster.run`),
fed by one queue: tasks report state changes and checkpoint acknowledgements
from their own threads (or, on Spark, through RPC), clients ask for statistics
or cancellation, and timers (the checkpoint scheduler, timeouts, restart
delays) fire; the JobMaster handles each in turn. The checkpoint coordinator
lives on this thread too, so it needs no locks.

On a task failure (or too many failed checkpoints) the restart strategy
decides: cancel every task, wait the restart delay, and deploy new attempts
that restore the latest completed checkpoint: sources rewind to their
positions, keyed state comes back per key group. Otherwise the job fails. A
deployment that fails (a Spark slot died while the new slots registered, the
state could not be assigned) is one more failure for the strategy, like a
task's: the job fails over again rather than ending.

Thread confinement is checked, not only documented: a :class:`MainThreadChecker`
bound to the loop's thread guards the entry points, and the coordinator shares
it. Nothing the loop does blocks without a bound (cancelled tasks get
:data:`CANCEL_TIMEOUT_S`, the I/O pool :attr:`JobMaster.io_shutdown_timeout_s`),
so the loop always gets back to its inbox.

Savepoints: :meth:`JobMaster.trigger_savepoint` and :meth:`JobMaster.stop_with_savepoint`
(any thread) hand the request to the loop, which asks the coordinator. A
stop-with-savepoint is Flink's synchronous savepoint: the tasks stop, the savepoint
completes, the sinks commit it and the tasks finish; the job ends FINISHED and only
then does the caller's future get the savepoint's path. If the savepoint fails the job
keeps running: once any task had been asked to stop, the job fails over to its latest
completed checkpoint (not counted against the restart strategy, as the failure is
the savepoint's, not the job's), otherwise periodic checkpoints simply resume; the
caller's future fails with the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import random
import threading
from collections import deque
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from chandy.checkpoint.completed_checkpoint import CompletedCheckpoint, CompletedCheckpointStore
from chandy.checkpoint.coordinator import CheckpointCoordinator, CheckpointCoordinatorConfiguration
from chandy.checkpoint.id_counter import CheckpointIDCounter
from chandy.checkpoint.operator_state import OperatorState
from chandy.checkpoint.pending_checkpoint import CheckpointPlan, TaskToAck
from chandy.checkpoint.recovery import choose_starting_point
from chandy.checkpoint.state_assignment import VertexToRestore, assign_states
from chandy.checkpoint.stats import CheckpointStatsTracker
from chandy.config import Configuration
from chandy.config.options import (
    CheckpointingMode,
    CheckpointingOptions,
    SavepointFormatType,
    StateRecoveryOptions,
    WebOptions,
)
from chandy.errors import (
    ConfigurationError,
    JobCancelledError,
    JobExecutionError,
    StorageError,
    find_unrecoverable,
)
from chandy.graph.execution_graph import ExecutionGraph, ExecutionVertex
from chandy.graph.job_graph import JobGraph
from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    CheckpointException,
    CheckpointFailureReason,
    CheckpointOptions,
    DeclineCheckpoint,
    EndOfInputReached,
)
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.metrics import MetricsReport
from chandy.messages.status import ExecutionState, JobStatus
from chandy.runtime.async_parts import TrackedExecutor
from chandy.runtime.executor import Deployment, Executor
from chandy.runtime.failure_report import FailoverReport
from chandy.runtime.job_result import JobExecutionResult
from chandy.runtime.metrics_store import JobMetricsStore
from chandy.runtime.restart_strategy import restart_strategy_from
from chandy.storage.checkpoint_storage import CheckpointStorage
from chandy.storage.filesystem import FilePermissions, ObjectStoreOptions
from chandy.storage.snapshot_key import snapshot_key
from chandy.task.deployment import TaskRestore, serialize_chain
from chandy.task.services import ResultPublisher, TaskFailure, TaskServices
from chandy.util.clock import Clock, SystemClock
from chandy.util.threads import MainThreadChecker
from chandy.util.timer import ScheduledAction, TimerQueue

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: How long cancelled tasks get to stop before the JobMaster gives up on them.
CANCEL_TIMEOUT_S = 30.0

#: How long the job's end waits for background I/O (deleting checkpoint files) to finish.
IO_SHUTDOWN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TaskStateUpdate:
    attempt_id: ExecutionAttemptID
    state: ExecutionState
    failure: TaskFailure | None


@dataclass(frozen=True)
class CancelJob:
    reason: str


@dataclass(frozen=True)
class GlobalFailure:
    """The job fails over for a reason that is not one task's (too many failed checkpoints)."""

    error: BaseException


@dataclass(frozen=True)
class RunOnMainThread:
    """A request from another thread, answered on the JobMaster thread."""

    action: Callable[[], Any]
    result: Future[Any]


@dataclass(frozen=True)
class _Wake:
    """Makes the loop look at its timers again."""


@dataclass(eq=False)
class _StopWithSavepoint:
    """A stop-with-savepoint in progress: the caller's future and the savepoint's."""

    result: Future[str]
    savepoint: Future[CompletedCheckpoint]
    drain: bool


@dataclass(frozen=True)
class _StopSavepointFailed:
    """The synchronous savepoint of ``stop`` failed: the job must go on running."""

    stop: _StopWithSavepoint
    error: BaseException


@dataclass(frozen=True)
class _RestartDue:
    """The restart delay after a failover has passed: deploy new attempts.

    A message rather than a timer action, so that a restart that fails is handled
    like any message: its outcome (fail over again, or fail the job) ends the loop
    through :meth:`JobMaster._handle`.
    """


@dataclass(frozen=True)
class RestoreSource:
    """What new attempts restore from."""

    checkpoint_id: int
    operator_states: dict[str, OperatorState]
    description: str


class _MainThreadTimer:
    """Timers that fire on the JobMaster thread (its loop waits for the next one)."""

    def __init__(self, clock: Clock, wake: Callable[[], None]) -> None:
        self.clock = clock
        self.queue = TimerQueue()
        self._wake = wake

    def schedule(self, delay_ms: float, action: Callable[[], None]) -> ScheduledAction:
        entry = ScheduledAction(self.clock.now_ms() + max(0.0, delay_ms), action)
        self.queue.push(entry)
        self._wake()
        return entry

    def seconds_to_next(self) -> float | None:
        due = self.queue.next_due_ms()
        return None if due is None else max(0.0, (due - self.clock.now_ms()) / 1000)

    def run_due(self) -> None:
        while (entry := self.queue.pop_due(self.clock.now_ms())) is not None:
            if not entry.cancelled:
                entry.action()


class JobMaster:
    """Owns the ExecutionGraph of one job and drives it to a terminal status."""

    def __init__(
        self,
        job_graph: JobGraph,
        executor: Executor,
        *,
        results: ResultPublisher | None = None,
        clock: Clock | None = None,
        rest_url: str | None = None,
    ) -> None:
        self.job_graph = job_graph
        self.executor = executor
        self.clock = clock or SystemClock()
        self.config = Configuration(job_graph.config)
        self.execution_graph = ExecutionGraph(job_graph, self.clock)
        #: The loop's thread, bound when :meth:`run` starts; the coordinator shares it.
        self._main_thread = MainThreadChecker(f"JobMaster of job {job_graph.job_id}")
        self._inbox: queue.Queue[Any] = queue.Queue()
        # Messages met while cancelled tasks settled that must still be handled (a
        # cancel, a due restart): the loop takes these before the inbox.
        self._deferred: deque[Any] = deque()
        # Set once the loop reads no more requests. Under the lock, a request is either
        # queued before (and answered by the loop or its last drain) or answered at once.
        self._loop_lock = threading.Lock()
        self._loop_ended = False
        self._io_pending: dict[Future[Any], Callable[[], object]] = {}
        #: How long the job's end waits for background I/O before leaving it behind.
        self.io_shutdown_timeout_s = IO_SHUTDOWN_TIMEOUT_S
        self.timer = _MainThreadTimer(self.clock, lambda: self._inbox.put(_Wake()))
        self.restart_strategy = restart_strategy_from(self.config, self.clock)
        self.restarts = 0
        #: What the user sees of each failover (``rest_url``: where the REST API serves the job).
        self._failover_report = FailoverReport(job_graph.job_name, job_graph.job_id, rest_url)
        self._ended_sources: set[ExecutionAttemptID] = set()
        #: Every source ended but the final checkpoint was refused while a task still started.
        self._final_checkpoint_awaits_tasks = False
        self._deployment: Deployment | None = None
        self._initial_restore: RestoreSource | None = None
        self._async_executor: ThreadPoolExecutor | None = None
        self._task_async_parts: TrackedExecutor | None = None
        self.checkpoint_storage: CheckpointStorage | None = None
        self.coordinator: CheckpointCoordinator | None = None
        #: Always there, as in Flink: without an interval it takes only savepoints (and the
        #: checkpoints a client asks for); periodic checkpoints need the interval.
        self._create_checkpoint_coordinator()
        self._stop: _StopWithSavepoint | None = None
        #: The checkpoint storage was refused at submission: the job's end leaves it alone.
        self._storage_refused = False
        self.services = TaskServices(
            results=results,
            checkpoint_responder=self,
            checkpoint_storage=self.checkpoint_storage,
            async_executor=self._task_async_parts,
            metrics=self,
        )
        #: What the tasks report (records, busy/backpressured time, watermarks) and the job's
        #: gauges; read by the REST API, Prometheus and the status line (see its docstring).
        self.metrics = JobMetricsStore(
            self.execution_graph,
            self.clock,
            lambda: self.coordinator.stats if self.coordinator is not None else None,
            lambda: self.restarts,
        )

    @property
    def job_id(self) -> str:
        return self.job_graph.job_id

    @property
    def retained_checkpoint(self) -> str | None:
        """Where the latest checkpoint the job's end kept is (its retention policy decides),
        to resume from; ``None`` while the job runs, or when none was kept."""
        retained = self.coordinator.retained_at_shutdown if self.coordinator is not None else []
        return retained[-1].external_pointer if retained else None

    def _create_checkpoint_coordinator(self) -> None:
        config = self.config
        directory = config.get(CheckpointingOptions.DIRECTORY)
        kind = config.get(CheckpointingOptions.STORAGE) or ("filesystem" if directory else "jobmanager")
        if kind == "filesystem" and not directory:
            raise ConfigurationError(
                "execution.checkpointing.storage is 'filesystem' but execution.checkpointing.dir "
                "is not set: set it to a directory (or URI) every executor can write"
            )
        self.checkpoint_storage = CheckpointStorage(
            directory if kind == "filesystem" else None,
            self.job_id,
            create_subdir=config.get(CheckpointingOptions.CREATE_SUBDIR),
            inline_threshold=config.get(CheckpointingOptions.INLINE_THRESHOLD),
            permissions=FilePermissions(
                config.get(CheckpointingOptions.FILE_PERMISSIONS),
                config.get(CheckpointingOptions.DIR_PERMISSIONS),
            ),
            # The driver's s3.* keys and AWS_* variables, shipped to every task with the storage.
            object_store=ObjectStoreOptions.from_configuration(config),
        )
        coordinator_config = CheckpointCoordinatorConfiguration(
            interval_ms=config.get(CheckpointingOptions.INTERVAL),
            timeout_ms=config.get(CheckpointingOptions.TIMEOUT),
            min_pause_ms=config.get(CheckpointingOptions.MIN_PAUSE),
            max_concurrent=config.get(CheckpointingOptions.MAX_CONCURRENT),
            tolerable_failures=config.get(CheckpointingOptions.TOLERABLE_FAILURES),
            retention=config.get(CheckpointingOptions.EXTERNALIZED_RETENTION),
            exactly_once=config.get(CheckpointingOptions.MODE) is CheckpointingMode.EXACTLY_ONCE,
            unaligned=config.get(CheckpointingOptions.UNALIGNED),
            aligned_checkpoint_timeout_ms=config.get(CheckpointingOptions.ALIGNED_CHECKPOINT_TIMEOUT),
        )
        self.coordinator = CheckpointCoordinator(
            self.job_id,
            coordinator_config,
            plan_calculator=self._checkpoint_plan,
            gateway=self,
            storage=self.checkpoint_storage,
            completed_store=CompletedCheckpointStore(
                config.get(CheckpointingOptions.NUM_RETAINED), self._run_io
            ),
            id_counter=CheckpointIDCounter(),
            stats=CheckpointStatsTracker(config.get(WebOptions.CHECKPOINTS_HISTORY)),
            clock=self.clock,
            timer=self.timer,
            fail_job=lambda error: self._inbox.put(GlobalFailure(error)),
            vertex_names={v.id: v.name for v in self.job_graph.vertices},
            rng=random.Random(),
            io_executor=self._run_io,
            main_thread=self._main_thread,
            metadata_writer=self._write_metadata,
        )
        self.execution_graph.register_job_status_listener(self.coordinator.job_status_listener)
        self._async_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chandy-checkpoint-async")
        self._task_async_parts = TrackedExecutor(self._async_executor)

    def _run_io(self, action: Callable[[], object]) -> None:
        """Deleting files is slow and never urgent: off the JobMaster thread.

        A failure is logged with what failed (its files may be left behind) and goes
        no further: a deletion never fails the job, let alone kills the JobMaster.
        """
        if self._submit_io(action, self._io_done) is not None:
            return
        try:
            action()
        except Exception:  # logged: a deletion never fails the job
            log.exception("Job %s: I/O action %s failed.", self.job_id, _describe(action))

    def _write_metadata(self, write: Callable[[], str | None]) -> Future[str | None]:
        """Run a checkpoint's ``_metadata`` write on the I/O pool (Flink's I/O executor):
        an object store that hangs must hold neither the checkpoint timeout, which fires on
        the JobMaster thread, nor the REST and client requests answered there."""
        future: Future[str | None] | None = self._submit_io(write, self._forget_io)
        if future is not None:
            return future
        done: Future[str | None] = Future()
        try:
            done.set_result(write())
        except Exception as exc:  # noqa: BLE001 - the coordinator fails the checkpoint with it
            done.set_exception(exc)
        return done

    def _submit_io(self, action: Callable[[], _T], done: Callable[[Future[Any]], None]) -> Future[_T] | None:
        """``action`` on the I/O pool, tracked until ``done`` (the job's end waits for it a
        bounded time); ``None`` once the pool is shut down (the job is over: run it here)."""
        pool = self._async_executor
        if pool is None:
            return None
        try:
            future = pool.submit(action)
        except RuntimeError:
            return None
        with self._loop_lock:
            self._io_pending[future] = action
        future.add_done_callback(done)
        return future

    def _forget_io(self, future: Future[Any]) -> None:
        """A ``_metadata`` write ended: the coordinator reports its failure, if any."""
        with self._loop_lock:
            self._io_pending.pop(future, None)

    def _io_done(self, future: Future[object]) -> None:
        with self._loop_lock:
            action = self._io_pending.pop(future, None)
        error = None if future.cancelled() else future.exception()
        if error is not None:
            log.error(
                "Job %s: I/O action %s failed.",
                self.job_id,
                _describe(action) if action is not None else "?",
                exc_info=(type(error), error, error.__traceback__),
            )

    # -- called from other threads ---------------------------------------------

    def notify_task_state(
        self, attempt_id: ExecutionAttemptID, state: ExecutionState, failure: TaskFailure | None = None
    ) -> None:
        """TaskStateListener: a task changed state (any thread)."""
        self._inbox.put(TaskStateUpdate(attempt_id, state, failure))

    def acknowledge_checkpoint(self, message: AcknowledgeCheckpoint) -> None:
        """CheckpointResponder: a task finished its part of a checkpoint (any thread)."""
        self._inbox.put(message)

    def decline_checkpoint(self, message: DeclineCheckpoint) -> None:
        self._inbox.put(message)

    def report_end_of_input(self, message: EndOfInputReached) -> None:
        self._inbox.put(message)

    def report_metrics(self, report: MetricsReport) -> None:
        """MetricsListener: tasks' metrics (any thread); stored at once, the loop never sees them."""
        self.metrics.report(report)

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Cancel the job (any thread); :meth:`run` then raises :class:`JobCancelledError`.

        A second cancel, or one after the job ended, changes nothing."""
        self._inbox.put(CancelJob(reason))

    def call(self, action: Callable[[], _T]) -> Future[_T]:
        """Run ``action`` on the JobMaster thread (any thread); the future has its result.

        Once the job has ended the loop reads no more requests, and nothing it owns
        changes any more: the action then runs at once, on the caller's thread."""
        request = RunOnMainThread(action, Future())
        with self._loop_lock:
            if not self._loop_ended:
                self._inbox.put(request)
                return request.result
        _answer(request)
        return request.result

    # -- savepoints (any thread) -------------------------------------------------

    def trigger_savepoint(
        self,
        savepoint_directory: str | None = None,
        format_type: SavepointFormatType = SavepointFormatType.DEFAULT,
    ) -> Future[str]:
        """Take a savepoint of the running job (any thread); the future gets its directory
        (``<dir>/savepoint-<job>-<random>``), or fails with the reason. ``None`` directory:
        ``execution.checkpointing.savepoint-dir``."""
        result: Future[str] = Future()
        directory = self._savepoint_directory(savepoint_directory, result)
        if directory is not None:
            self._request_on_main_thread(
                lambda: self._start_savepoint(directory, format_type, result), result
            )
        return result

    def stop_with_savepoint(
        self,
        advance_to_end_of_event_time: bool = False,
        savepoint_directory: str | None = None,
        format_type: SavepointFormatType = SavepointFormatType.DEFAULT,
    ) -> Future[str]:
        """Stop the job with a synchronous savepoint (any thread): sources stop (with
        ``advance_to_end_of_event_time``, Flink's drain, they emit MAX_WATERMARK first so
        every event-time window and timer fires), the savepoint completes, every sink
        commits it and the tasks finish. The future gets the savepoint's directory once
        the job is FINISHED; if the savepoint fails the job keeps running and the future
        fails with the reason."""
        result: Future[str] = Future()
        directory = self._savepoint_directory(savepoint_directory, result)
        if directory is not None:
            self._request_on_main_thread(
                lambda: self._start_stop(directory, format_type, advance_to_end_of_event_time, result), result
            )
        return result

    def _savepoint_directory(self, directory: str | None, result: Future[str]) -> str | None:
        chosen = directory or self.config.get(CheckpointingOptions.SAVEPOINT_DIRECTORY)
        if chosen is None:
            result.set_exception(
                ConfigurationError(
                    f"no savepoint directory for job {self.job_id}: pass one with the request "
                    "(trigger_savepoint(savepoint_directory=...), stop_with_savepoint("
                    "savepoint_directory=...), 'flink savepoint JOBID DIR', 'flink stop "
                    "--savepointPath DIR') or set execution.checkpointing.savepoint-dir in the "
                    "job's configuration"
                )
            )
        return chosen

    def _request_on_main_thread(self, action: Callable[[], None], result: Future[str]) -> None:
        def failed(answer: Future[None]) -> None:
            error = answer.exception()
            if error is not None and not result.done():
                result.set_exception(error)

        self.call(action).add_done_callback(failed)

    def _not_running(self, what: str) -> CheckpointException:
        state = self.execution_graph.state
        return CheckpointException(
            CheckpointFailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING,
            f"cannot {what} of job {self.job_id}: it is {state.value}, not RUNNING"
            + (", try again once it runs" if not state.is_globally_terminal else ""),
        )

    def _start_savepoint(self, directory: str, format_type: SavepointFormatType, result: Future[str]) -> None:
        coordinator = self.coordinator
        if self.execution_graph.state is not JobStatus.RUNNING or coordinator is None:
            result.set_exception(self._not_running("take a savepoint"))
            return
        savepoint = coordinator.trigger_savepoint(directory, format_type)

        def done(future: Future[CompletedCheckpoint]) -> None:
            error = future.exception()
            if error is not None:
                result.set_exception(error)
            else:
                path = future.result().external_pointer
                assert path is not None  # a savepoint always has its directory
                result.set_result(path)

        savepoint.add_done_callback(done)

    def _start_stop(
        self, directory: str, format_type: SavepointFormatType, drain: bool, result: Future[str]
    ) -> None:
        coordinator = self.coordinator
        if self.execution_graph.state is not JobStatus.RUNNING or coordinator is None:
            result.set_exception(self._not_running("stop with a savepoint"))
            return
        if self._stop is not None:
            result.set_exception(
                CheckpointException(
                    CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS,
                    f"job {self.job_id} is already being stopped with a savepoint",
                )
            )
            return
        log.info(
            "Stopping job %s (%s) with a savepoint into %s%s.",
            self.job_graph.job_name,
            self.job_id,
            directory,
            " (drain: advancing to the end of event time)" if drain else "",
        )
        savepoint = coordinator.trigger_savepoint(directory, format_type, synchronous=True, drain=drain)
        stop = self._stop = _StopWithSavepoint(result, savepoint, drain)

        def done(future: Future[CompletedCheckpoint]) -> None:
            error = future.exception()
            if error is not None:  # handled by the loop, as a message (never inside the coordinator)
                self._inbox.put(_StopSavepointFailed(stop, error))

        savepoint.add_done_callback(done)

    def _stop_savepoint_failed(self, message: _StopSavepointFailed) -> Any:
        """The stop's savepoint failed: the job goes on; the caller learns why."""
        stop, error = message.stop, message.error
        if self._stop is not stop:
            return _CONTINUE  # the stop was abandoned already (a failover, the job's end)
        self._stop = None
        eg = self.execution_graph
        touched = not (
            isinstance(error, CheckpointException)
            and (error.reason.is_pre_flight or error.reason is CheckpointFailureReason.IO_EXCEPTION)
        )
        outcome: Any = _CONTINUE
        if eg.state is JobStatus.RUNNING and touched:
            # Sources stopped (and with drain fired every window): only a restore from the
            # latest checkpoint puts the job back in a consistent state.
            failure = JobExecutionError(
                f"job '{self.job_graph.job_name}': the savepoint of a stop-with-savepoint failed "
                f"({error}); the job keeps running, restarted from its latest completed checkpoint",
                self.job_id,
            )
            failure.__cause__ = error
            outcome = self._failover(failure, None, counted=False)
            what = (
                "the job keeps running: it restarts from its latest completed checkpoint "
                "(from its start if it has none)"
            )
        elif eg.state is JobStatus.RUNNING and self.coordinator is not None:
            self.coordinator.restart_checkpoint_scheduler_if_configured()
            what = "the job keeps running, no task was stopped"
        else:
            what = f"the job is {eg.state.value}"
        log.warning("Stop-with-savepoint of job %s failed (%s): %s", self.job_id, what, error)
        stop.result.set_exception(_stop_failure(error, what))
        return outcome

    def _abandon_stop(self, why: str) -> None:
        """The job leaves the stop's path (a failover, its end): the caller learns why."""
        stop, self._stop = self._stop, None
        if stop is None or stop.result.done():
            return
        savepoint = stop.savepoint
        if savepoint.done() and savepoint.exception() is None:
            path = savepoint.result().external_pointer
            stop.result.set_exception(
                JobExecutionError(
                    f"the savepoint of the stop of job {self.job_id} completed at {path}, but {why}",
                    self.job_id,
                )
            )
            return
        error = savepoint.exception() if savepoint.done() else None
        stop.result.set_exception(_stop_failure(error, why))

    def _settle_stop_at_end(self, final_status: JobStatus) -> None:
        """The job ended: a stop's future gets its savepoint once the job is FINISHED."""
        stop = self._stop
        if stop is None:
            return
        savepoint = stop.savepoint
        if final_status is JobStatus.FINISHED and savepoint.done() and savepoint.exception() is None:
            self._stop = None
            path = savepoint.result().external_pointer
            assert path is not None
            log.info("Job %s stopped with savepoint %s.", self.job_id, path)
            stop.result.set_result(path)
            return
        self._abandon_stop(f"the job ended {final_status.value} instead of FINISHED")

    # -- the gateway to the tasks (coordinator -> deployment) --------------------

    def trigger_checkpoint(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int, options: CheckpointOptions
    ) -> bool:
        self._main_thread.assert_main_thread()
        deployment = self._deployment
        return deployment is not None and deployment.trigger_checkpoint(
            attempt_id, checkpoint_id, timestamp, options
        )

    def notify_checkpoint_complete(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        self._main_thread.assert_main_thread()
        if self._deployment is not None:
            self._deployment.notify_checkpoint_complete(attempt_id, checkpoint_id, timestamp)

    def notify_checkpoint_aborted(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        self._main_thread.assert_main_thread()
        if self._deployment is not None:
            self._deployment.notify_checkpoint_aborted(attempt_id, checkpoint_id, timestamp)

    def _checkpoint_plan(self) -> CheckpointPlan:
        """Running sources are triggered, running tasks acknowledge; finished tasks (they
        read and committed all their input) are recorded as finished.

        A running task whose every upstream task has finished is triggered too (Flink's
        FLIP-147 plan): no barrier can reach it any more, and it may still be busy ending
        its input (a slow ``finish()``, async requests in flight), so without a trigger of
        its own the checkpoint would wait for it until its timeout. The task takes such a
        checkpoint once its input has ended, after the records already in its channels."""
        self._main_thread.assert_main_thread()
        eg = self.execution_graph
        to_trigger, to_wait, finished = [], [], []
        upstream_of: dict[ExecutionAttemptID, tuple[ExecutionAttemptID, ...]] = {}
        for ev in eg.all_execution_vertices():
            execution = ev.current_execution
            vertex = ev.job_vertex
            task = TaskToAck(
                execution.attempt_id,
                vertex.id,
                ev.subtask_index,
                vertex.parallelism,
                vertex.max_parallelism,
                tuple(vertex.operator_ids),
                tuple(vertex.operator_uids),
                tuple(op.name for op in vertex.operators),
            )
            if execution.state is ExecutionState.FINISHED:
                finished.append(task)
                continue
            if execution.state is not ExecutionState.RUNNING:
                raise CheckpointException(
                    CheckpointFailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING,
                    f"task {ev.name_with_subtask} is {execution.state.value}",
                )
            running_upstream = () if vertex.is_source else self._running_upstream(ev)
            if vertex.is_source or not running_upstream:
                to_trigger.append(execution.attempt_id)
            else:
                upstream_of[execution.attempt_id] = running_upstream
            to_wait.append(task)
        if not to_trigger:
            raise CheckpointException(
                CheckpointFailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING, "every source has finished"
            )
        return CheckpointPlan(
            tuple(to_trigger),
            tuple(to_wait),
            tuple(t.attempt_id for t in to_wait),
            tuple(finished),
            upstream_of,
        )

    def _running_upstream(self, ev: ExecutionVertex) -> tuple[ExecutionAttemptID, ...]:
        """The attempts of the subtasks feeding ``ev``'s input channels that have not finished
        (each once): the tasks whose barriers ``ev`` waits for."""
        eg = self.execution_graph
        job_graph = eg.job_graph
        running: dict[ExecutionAttemptID, None] = {}
        for channel in eg.input_channel_ids(ev.job_vertex, ev.subtask_index):
            producer_vertex = job_graph.edges[channel.edge_index].source_vertex_id
            producer = eg.vertices[producer_vertex][channel.producer_subtask].current_execution
            if producer.state is not ExecutionState.FINISHED:
                running[producer.attempt_id] = None
        return tuple(running)

    # -- the JobMaster thread ----------------------------------------------------

    def run(self) -> JobExecutionResult:
        """Deploy, drive the job to its end, return the result or raise why it failed.

        A bad restore path or unusable checkpoint storage is reported here, before
        any task runs, as :class:`~chandy.errors.InvalidCheckpointError` or
        :class:`~chandy.errors.StorageError`; the job is then FAILED, not retried.
        A deployment that fails is a failure like a task's: the restart strategy decides.
        """
        self._main_thread.bind_to_current_thread()
        eg = self.execution_graph
        start_ms = self.clock.now_ms()
        final_status = JobStatus.FAILED
        try:
            try:
                self._prepare_restore_and_storage()
            except Exception as exc:
                # Refused before any task ran: a restart would only repeat it.
                self._storage_refused = isinstance(exc, StorageError)
                eg.transition_state(JobStatus.CREATED, JobStatus.FAILED, exc)
                raise
            log.info(
                "Submitting job %s (%s): %d tasks in %d vertices.",
                self.job_graph.job_name,
                self.job_id,
                sum(v.parallelism for v in self.job_graph.vertices),
                len(self.job_graph.vertices),
            )
            outcome = self._deploy_first()
            if outcome is _CONTINUE:
                outcome = self._await_end()
            final_status = eg.state
        except BaseException:
            if not eg.state.is_globally_terminal:
                # KeyboardInterrupt or a bug here: never leave tasks running behind.
                self._cancel_tasks()
                eg.transition_state(eg.state, JobStatus.CANCELED)
            final_status = eg.state
            raise
        finally:
            self._shutdown(final_status)
        runtime = self.clock.now_ms() - start_ms
        if outcome is None:
            return JobExecutionResult(self.job_id, self.job_graph.job_name, runtime, self.restarts)
        raise outcome

    def _shutdown(self, final_status: JobStatus) -> None:
        """Stop the coordinator, end the loop (requests are answered at once from now on),
        then give background I/O a bounded time to finish.

        The tasks' checkpoint writes still running (a cancelled task finishes its write, then
        deletes it) end first: the coordinator's shutdown tidies the job's directory, and a
        write racing that would leave an aborted ``chk-N`` behind."""
        if self._task_async_parts is not None:
            still_running = self._task_async_parts.wait_for_running(self.io_shutdown_timeout_s)
            if still_running:
                log.warning(
                    "Job %s: %d checkpoint writes of its tasks still run %.0f s after the job ended; "
                    "what they leave in the checkpoint directory is not tidied.",
                    self.job_id,
                    still_running,
                    self.io_shutdown_timeout_s,
                )
        if self.coordinator is not None:
            try:
                # A _metadata already written completes its checkpoint rather than being
                # aborted by the end of the job (a client may have seen it, and cancelled).
                self.coordinator.finish_finalizing(self.io_shutdown_timeout_s)
                self.coordinator.shutdown(final_status, tidy=not self._storage_refused)
            except Exception:  # logged: the job's own outcome matters more
                log.exception("Job %s: shutting down the checkpoint coordinator failed.", self.job_id)
        self._end_loop()
        self._settle_stop_at_end(final_status)
        pool = self._async_executor
        if pool is None:
            return
        pool.shutdown(wait=False)  # what was submitted still runs
        with self._loop_lock:
            pending = dict(self._io_pending)
        _, not_done = futures.wait(pending, timeout=self.io_shutdown_timeout_s)
        if not_done:
            log.warning(
                "Job %s: %d I/O actions still run %.0f s after the job ended; they are left to "
                "finish in the background (a filesystem may hang): %s.",
                self.job_id,
                len(not_done),
                self.io_shutdown_timeout_s,
                ", ".join(_describe(pending[f]) for f in not_done),
            )

    def _end_loop(self) -> None:
        """The loop is over: from now on requests are answered on the caller's thread."""
        self._main_thread.release()
        with self._loop_lock:
            self._loop_ended = True
        self._deferred.clear()
        while True:  # requests queued after the loop's last look at its inbox
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, RunOnMainThread):
                _answer(message)

    def _prepare_restore_and_storage(self) -> None:
        for vertex in self.job_graph.vertices:  # every executor ships these: refuse early
            serialize_chain(vertex.name, tuple(vertex.operators))
        self.executor.prepare(
            self.job_graph.max_parallelism_of_any_vertex,
            self.checkpoint_storage.base_uri if self.checkpoint_storage else None,
            self.job_graph.job_name,
        )
        if self.checkpoint_storage is not None:
            self.checkpoint_storage.initialize()
        # Signs what the job writes and authenticates what it restores (docs/security.md).
        key = snapshot_key(self.config)
        if self.checkpoint_storage is not None:
            self.checkpoint_storage.snapshot_key = key
        # A driver restart's own checkpoints, else execution.state-recovery.path (claim mode).
        start = choose_starting_point(
            self.config,
            self.checkpoint_storage,
            self.coordinator.checkpoint_props if self.coordinator is not None else None,
            key,
        )
        if start is None:
            return
        checkpoint = start.checkpoint
        directory = checkpoint.external_pointer or f"checkpoint {checkpoint.checkpoint_id}"
        restore = RestoreSource(checkpoint.checkpoint_id, checkpoint.operator_states, directory)
        self._assignments(restore)  # refuse an incompatible checkpoint now, with a clear error
        if self.coordinator is not None:
            self.coordinator.restore_from(
                checkpoint.checkpoint_id,
                checkpoint.master_states,
                is_savepoint=start.is_savepoint,
                external_pointer=checkpoint.external_pointer,
                restored=start.to_store,
                next_checkpoint_id=start.next_checkpoint_id,
            )
        log.info("Job %s starts from checkpoint %d at %s.", self.job_id, checkpoint.checkpoint_id, directory)
        self._initial_restore = restore

    def _assignments(self, restore: RestoreSource) -> dict[tuple[int, int], Any]:
        vertices = [
            VertexToRestore(
                v.id,
                v.name,
                v.parallelism,
                v.max_parallelism,
                tuple(v.operator_ids),
                tuple(op.name for op in v.operators),
                tuple(v.operator_uids),
                tuple(op.keyed for op in v.operators),
                inputs=tuple(
                    (upstream.operator_ids[0], upstream.parallelism)
                    for upstream in (self.job_graph.vertex(edge.source_vertex_id) for edge in v.inputs)
                ),
            )
            for v in self.job_graph.vertices
        ]
        return assign_states(
            restore.operator_states,
            vertices,
            allow_non_restored_state=self.config.get(StateRecoveryOptions.IGNORE_UNCLAIMED_STATE),
            source=restore.description,
        )

    def _deploy_first(self) -> Any:
        """The first deployment; the job is RUNNING once it succeeded."""
        try:
            self._deploy(self._initial_restore)
        except Exception as exc:  # noqa: BLE001 - one more failure for the restart strategy
            return self._failover(self._deployment_error(exc, self._initial_restore), None)
        self.execution_graph.transition_state(JobStatus.CREATED, JobStatus.RUNNING)
        return _CONTINUE

    def _deploy(self, restore: RestoreSource | None) -> None:
        """Deploy the current attempts (restoring ``restore``); raises if that failed, with
        those attempts marked FAILED."""
        self._main_thread.assert_main_thread()
        eg = self.execution_graph
        try:
            assignments = self._assignments(restore) if restore is not None else {}
            descriptors = []
            for ev in eg.all_execution_vertices():
                tdd = eg.deployment_descriptor(ev)
                if restore is not None:
                    state = assignments[(ev.job_vertex.id, ev.subtask_index)]
                    tdd = dataclasses.replace(tdd, task_restore=TaskRestore(restore.checkpoint_id, state))
                descriptors.append(tdd)
                ev.current_execution.state = ExecutionState.DEPLOYING
            self._deployment = self.executor.deploy(eg, descriptors, self, self.services)
        except Exception:
            for execution in eg.current_executions():
                if not execution.state.is_terminal:
                    execution.state = ExecutionState.FAILED
            raise

    def _deployment_error(self, error: Exception, restore: RestoreSource | None) -> JobExecutionError:
        source = f" restoring checkpoint {restore.checkpoint_id}" if restore is not None else ""
        wrapped = JobExecutionError(
            f"job '{self.job_graph.job_name}' failed: deploying its tasks{source} failed: "
            f"{type(error).__name__}: {error}",
            self.job_id,
        )
        wrapped.__cause__ = error
        return wrapped

    def _await_end(self) -> JobExecutionError | None:
        """Handle inbox messages and timers until the job is terminal; the error to raise."""
        while True:
            if self._deferred:
                message = self._deferred.popleft()
            else:
                try:
                    message = self._inbox.get(timeout=self.timer.seconds_to_next())
                except queue.Empty:
                    message = None
            self.timer.run_due()
            if message is None or isinstance(message, _Wake):
                continue
            outcome = self._handle(message)
            if outcome is not _CONTINUE:
                error: JobExecutionError | None = outcome  # what _handle ends the job with
                return error

    def _handle(self, message: Any) -> Any:
        self._main_thread.assert_main_thread()
        eg = self.execution_graph
        if isinstance(message, TaskStateUpdate):
            if not eg.update_execution_state(message.attempt_id, message.state, message.failure):
                return _CONTINUE
            if message.state is ExecutionState.FAILED and eg.state is JobStatus.RUNNING:
                return self._failover(_job_error(self.job_graph, message), message.failure)
            if message.state is ExecutionState.FINISHED and eg.all_in_state(ExecutionState.FINISHED):
                eg.transition_state(JobStatus.RUNNING, JobStatus.FINISHED)
                return None
            if (
                message.state is ExecutionState.RUNNING
                and self._final_checkpoint_awaits_tasks
                and all(
                    e.state in (ExecutionState.RUNNING, ExecutionState.FINISHED)
                    for e in eg.current_executions()
                )
            ):
                self._trigger_final_checkpoint()
            return _CONTINUE
        if isinstance(message, AcknowledgeCheckpoint):
            if self.coordinator is not None:
                self.coordinator.receive_acknowledge_message(message)
            return _CONTINUE
        if isinstance(message, DeclineCheckpoint):
            if self.coordinator is not None:
                self.coordinator.receive_decline_message(message)
            return _CONTINUE
        if isinstance(message, EndOfInputReached):
            self._source_ended(message.attempt_id)
            return _CONTINUE
        if isinstance(message, GlobalFailure):
            if eg.state is JobStatus.RUNNING:
                error = JobExecutionError(
                    f"job '{self.job_graph.job_name}' failed: {message.error}", self.job_id
                )
                error.__cause__ = message.error
                return self._failover(error, None)
            return _CONTINUE
        if isinstance(message, RunOnMainThread):
            _answer(message)
            return _CONTINUE
        if isinstance(message, _RestartDue):
            return self._restart()
        if isinstance(message, _StopSavepointFailed):
            return self._stop_savepoint_failed(message)
        if isinstance(message, CancelJob):
            log.info("Cancelling job %s (%s): %s.", self.job_graph.job_name, self.job_id, message.reason)
            eg.transition_state(eg.state, JobStatus.CANCELLING)
            self._cancel_tasks()
            eg.transition_state(JobStatus.CANCELLING, JobStatus.CANCELED)
            return JobCancelledError(
                f"job '{self.job_graph.job_name}' was cancelled: {message.reason}", self.job_id
            )
        raise TypeError(f"unexpected message {message!r}")

    def _source_ended(self, attempt_id: ExecutionAttemptID) -> None:
        """When every source has read all its input, take the final checkpoint now rather
        than at the next tick: the job finishes as soon as it completes."""
        self._main_thread.assert_main_thread()
        eg = self.execution_graph
        if eg.execution(attempt_id) is None or self.coordinator is None:
            return
        self._ended_sources.add(attempt_id)
        sources = [ev.current_execution for ev in eg.all_execution_vertices() if ev.job_vertex.is_source]
        if all(e.attempt_id in self._ended_sources or e.state is ExecutionState.FINISHED for e in sources):
            self._trigger_final_checkpoint()

    def _trigger_final_checkpoint(self) -> None:
        """Ask for the final checkpoint. A task still starting (its ``open()`` is slow, a
        small source ended first) refuses it before any task is asked; it is then asked
        for again once every task runs (see :meth:`_handle`), not at the next periodic
        tick, which may be minutes away."""
        assert self.coordinator is not None
        future = self.coordinator.trigger_checkpoint(is_periodic=False)
        error = future.exception() if future.done() else None
        self._final_checkpoint_awaits_tasks = (
            isinstance(error, CheckpointException)
            and error.reason is CheckpointFailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING
        )

    # -- failure and restart -----------------------------------------------------

    def _failover(
        self, error: JobExecutionError, failure: TaskFailure | None, *, counted: bool = True
    ) -> Any:
        """A task, the checkpoints or a deployment failed: restart after the strategy's
        delay, or fail the job. Runs from RUNNING, from CREATED (the first deployment
        failed) and from RESTARTING (a restart's deployment failed). ``counted=False``: a
        restart the strategy neither counts nor may refuse (a failed stop-with-savepoint)."""
        self._main_thread.assert_main_thread()
        eg = self.execution_graph
        current = eg.state
        if failure is not None and failure.exception is not None:
            error.__cause__ = failure.exception
        self._abandon_stop(f"the job failed over before it finished: {str(error).splitlines()[0]}")
        if counted:
            self.restart_strategy.notify_failure(error)
        if failure is not None:
            unrecoverable = failure.unrecoverable
        else:
            unrecoverable = counted and find_unrecoverable(error.__cause__) is not None
        attempt = self.restarts + 1
        if unrecoverable or (counted and not self.restart_strategy.can_restart()):
            eg.transition_state(current, JobStatus.FAILING, error)
            self._cancel_tasks()
            eg.transition_state(JobStatus.FAILING, JobStatus.FAILED, error)
            if not unrecoverable:
                self._failover_report.giving_up(attempt, error, failure, self.restart_strategy)
            return error
        delay_ms = self.restart_strategy.get_backoff_time_ms()
        self._failover_report.restarting(
            attempt, error, failure, self.restart_strategy, delay_ms, self.restarts + 1
        )
        if current is JobStatus.RESTARTING:
            eg.failure_cause = error  # a restart failed: still restarting, for a new reason
        else:
            eg.transition_state(current, JobStatus.RESTARTING, error)
        if self.coordinator is not None:
            self.coordinator.abort_pending_checkpoints(CheckpointFailureReason.JOB_FAILOVER_REGION)
        self._cancel_tasks()
        self._final_checkpoint_awaits_tasks = False  # new attempts report their own ends
        self.restarts += 1
        # Measured from the failure (the exponential strategy counts the time cancelling took).
        self.timer.schedule(
            self.restart_strategy.get_backoff_time_ms(), lambda: self._inbox.put(_RestartDue())
        )
        return _CONTINUE

    def _restart(self) -> Any:
        """Deploy new attempts from the latest checkpoint; RUNNING only once that worked.
        A failure here fails over again (or fails the job): the outcome for the loop."""
        self._main_thread.assert_main_thread()
        eg = self.execution_graph
        if eg.state is not JobStatus.RESTARTING:
            return _CONTINUE  # cancelled during the delay
        eg.reset_all_for_new_execution()
        restore = self._initial_restore
        try:
            if self.coordinator is not None:
                latest = self.coordinator.restore_latest_checkpointed_state()
                if latest is not None:
                    restore = RestoreSource(
                        latest.checkpoint_id,
                        latest.operator_states,
                        latest.external_pointer or f"checkpoint {latest.checkpoint_id}",
                    )
            log.info(
                "Restarting job %s (attempt %d) from %s.",
                self.job_id,
                self.restarts,
                f"checkpoint {restore.checkpoint_id}" if restore else "the beginning",
            )
            self._deploy(restore)
        except Exception as exc:  # noqa: BLE001 - one more failure for the restart strategy
            return self._failover(self._deployment_error(exc, restore), None)
        eg.transition_state(JobStatus.RESTARTING, JobStatus.RUNNING)
        return _CONTINUE

    def _cancel_tasks(self) -> None:
        """Cancel the current deployment and wait (bounded) for its tasks to stop."""
        self._main_thread.assert_main_thread()
        deployment = self._deployment
        if deployment is None:
            return
        deployment.cancel()
        if not deployment.wait_stopped(CANCEL_TIMEOUT_S):
            log.warning(
                "Job %s: not every cancelled task stopped within %.0f s; going on without them.",
                self.job_id,
                CANCEL_TIMEOUT_S,
            )
        # Handle what the cancelled tasks sent: their states, and their checkpoint
        # messages (so the coordinator deletes state nobody will reference). Only what
        # is queued now: whatever arrives later, the loop handles.
        for _ in range(self._inbox.qsize()):
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._settle_after_cancel(message)

    def _settle_after_cancel(self, message: Any) -> None:
        if isinstance(message, TaskStateUpdate):
            self.execution_graph.update_execution_state(message.attempt_id, message.state, message.failure)
        elif isinstance(message, AcknowledgeCheckpoint):
            if self.coordinator is not None:
                self.coordinator.receive_acknowledge_message(message)
        elif isinstance(message, RunOnMainThread):
            _answer(message)
        elif isinstance(message, (CancelJob, _RestartDue, _StopSavepointFailed)):
            self._deferred.append(message)  # for the loop, once this failover or cancel settled
        else:
            # Declines, ended inputs and global failures are about the tasks just
            # cancelled; a wake-up only makes the loop look at its timers, as it will.
            log.debug("Job %s: dropped %r of cancelled tasks.", self.job_id, message)


_CONTINUE = object()


def _answer(request: RunOnMainThread) -> None:
    """Run a request's action and complete its future (unless its caller cancelled it)."""
    if not request.result.set_running_or_notify_cancel():
        return
    try:
        request.result.set_result(request.action())
    except Exception as exc:  # noqa: BLE001 - handed to the caller
        request.result.set_exception(exc)


def _stop_failure(error: BaseException | None, what: str) -> CheckpointException:
    """The error a failed stop-with-savepoint's caller gets: the savepoint's reason, and
    what became of the job."""
    reason = error.reason if isinstance(error, CheckpointException) else CheckpointFailureReason.JOB_FAILURE
    detail = error.cause if isinstance(error, CheckpointException) else error
    exception = CheckpointException(
        reason, f"stop-with-savepoint failed{f' ({detail})' if detail else ''}; {what}"
    )
    exception.__cause__ = error
    return exception


def _describe(action: Callable[..., object]) -> str:
    """An I/O action for a log line: its function, and the checkpoint it concerns if known."""
    if isinstance(action, functools.partial):
        return _describe(action.func)
    owner = getattr(action, "__self__", action)
    name = getattr(action, "__qualname__", None) or type(action).__qualname__
    checkpoint_id = getattr(owner, "checkpoint_id", None)
    return f"{name} (checkpoint {checkpoint_id})" if checkpoint_id is not None else name


def _job_error(job_graph: JobGraph, update: TaskStateUpdate) -> JobExecutionError:
    failure = update.failure
    vertex = job_graph.vertex(update.attempt_id.vertex_id)
    where = f"{vertex.name} ({update.attempt_id.subtask_index + 1}/{vertex.parallelism})"
    if failure is None:
        return JobExecutionError(f"job '{job_graph.job_name}' failed: task {where} failed", job_graph.job_id)
    operator = f" in operator '{failure.operator_name}'" if failure.operator_name else ""
    message = (
        f"job '{job_graph.job_name}' failed: {failure.exception_type}: {failure.message}"
        f"{operator} of task {where}"
    )
    if failure.exception is None or failure.exception.__traceback__ is None:
        # raised in another process: the traceback text is all there is of where
        message += f"\n\nTask traceback:\n{failure.traceback_text}"
    return JobExecutionError(message, job_graph.job_id)
