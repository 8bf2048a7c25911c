"""CheckpointCoordinator: triggers checkpoints, collects acknowledgements, completes them.

Single-threaded by design. Every method runs on the JobMaster's thread, and
everything time-related (the periodic trigger, the timeout canceller,
continuations of master hooks) goes through the injected :class:`Timer`,
which in a running job is the JobMaster's own loop and in tests a
:class:`~chandy.util.timer.ManualTimer`. No locks, and every scenario can be
driven event by event.

The path, in Flink's words (``docs/design.md`` walks it step by step):

1. ``start_checkpoint_scheduler`` (called by the job-status listener when the
   job is RUNNING) schedules ``trigger_checkpoint(periodic)`` after a random
   initial delay, then at a fixed rate.
2. A request is queued; the pre-checks decide when it runs: at most
   ``max_concurrent`` pending checkpoints and ``min_pause`` since the last
   completion (savepoints skip both; a periodic request that is too early is
   dropped, any other waits for the pause to end), and every task RUNNING.
3. Triggering: new id, a :class:`PendingCheckpoint` waiting for every task, a
   timeout canceller, master hooks, then every source subtask is asked to
   checkpoint (through the gateway). A trigger that raises or cannot be
   delivered fails the checkpoint at once, not at its timeout. The barrier names
   the base, the latest completed checkpoint: the only one whose shared files the
   tasks may reuse; the registry keeps them while the checkpoint is pending.
4. Acknowledgements arrive: SUCCESS / DUPLICATE / UNKNOWN / DISCARDED; the state
   of unknown, late or discarded acks is deleted (what the task wrote for that
   checkpoint, never shared files it references from earlier ones).
5. Fully acknowledged: register its shared files (:class:`SharedStateRegistry`),
   write ``_metadata``, add to the store (which subsumes older checkpoints: the
   shared files no retained checkpoint references any more are deleted on the I/O
   executor); only once the store holds it is it completed: the caller's future,
   the reset failure counter, aborting older pendings (never savepoints), the log
   line, the notice to every task. If any step fails, the checkpoint is discarded
   (with the shared files it uploaded) and the tasks are told it aborted.
6. Declines, timeouts and failures abort the pending checkpoint and are counted
   by the :class:`CheckpointFailureManager`, which fails the job over past the
   tolerable number.

Savepoints (``trigger_savepoint``) take the same path with Flink 1.15's rules: forced
past the pre-checks; written into a directory of their own (``<dir>/savepoint-...``,
created at the trigger, every state file inside it); never subsumed, never deleted
(a failed one's partial directory is, it is not a savepoint). An intermediate
savepoint neither joins the completed store (failover never goes back to it: the user
may move or delete it) nor is confirmed to the tasks (sinks commit nothing for it);
its failures are not counted against the tolerable number. The synchronous savepoint
of a stop-with-savepoint stops the periodic scheduler first, and once complete it is
stored and confirmed like a checkpoint: the tasks commit its transactions and finish.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass

from chandy.checkpoint.completed_checkpoint import CompletedCheckpoint, CompletedCheckpointStore
from chandy.checkpoint.failure_manager import CheckpointFailureManager
from chandy.checkpoint.hooks import MasterTriggerRestoreHook
from chandy.checkpoint.id_counter import CheckpointIDCounter
from chandy.checkpoint.metadata import MasterState
from chandy.checkpoint.pending_checkpoint import (
    CheckpointPlan,
    PendingCheckpoint,
    TaskAcknowledgeResult,
)
from chandy.checkpoint.properties import CheckpointProperties
from chandy.checkpoint.shared_state import SharedStateRegistry, delete_shared_files
from chandy.checkpoint.stats import CheckpointStatsTracker
from chandy.config.options import CheckpointingOptions, ExternalizedCheckpointRetention, SavepointFormatType
from chandy.errors import ConfigurationError, StorageError
from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    AlignmentType,
    CheckpointException,
    CheckpointFailureReason,
    CheckpointOptions,
    DeclineCheckpoint,
    TaskCheckpointGateway,
)
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.status import JobStatus
from chandy.state.handles import FileStateHandle
from chandy.state.snapshot import TaskStateSnapshot
from chandy.storage.checkpoint_storage import SHARED_DIR, CheckpointStorage, shared_dir_of
from chandy.util.clock import Clock
from chandy.util.threads import MainThreadChecker
from chandy.util.timer import Cancellable, Timer

log = logging.getLogger(__name__)

_RECENTLY_EXPIRED = 16
#: How long the deletion of a subsumed checkpoint's shared files waits for the checkpoint's
#: own deletion (queued before it on the I/O executor) to finish.
DISCARD_WAIT_S = 60.0


def _run_inline(action: Callable[[], object]) -> None:
    """The default I/O executor: runs a deletion here, and a failure is logged, never
    raised, so it cannot stop an abort or a completion half-way (files may be left behind)."""
    try:
        action()
    except Exception:  # see the docstring
        log.warning("A checkpoint I/O action failed; files may be left behind.", exc_info=True)


@dataclass(frozen=True)
class CheckpointCoordinatorConfiguration:
    #: ``None``: no periodic checkpoints (the scheduler is never started).
    interval_ms: int | None
    timeout_ms: int = 600_000
    min_pause_ms: int = 0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    retention: ExternalizedCheckpointRetention = ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS
    exactly_once: bool = True
    max_queued_requests: int = 1000
    #: ``execution.checkpointing.unaligned.enabled``.
    unaligned: bool = False
    #: ``execution.checkpointing.aligned-checkpoint-timeout``: with ``unaligned``, 0 makes every
    #: checkpoint unaligned; a positive value starts each aligned and lets a task switch.
    aligned_checkpoint_timeout_ms: int = 0

    def __post_init__(self) -> None:
        if self.interval_ms is not None:  # savepoints alone are aligned whatever the settings
            check_unaligned_settings(self.unaligned, self.exactly_once, self.max_concurrent)
        if self.aligned_checkpoint_timeout_ms < 0:
            raise ConfigurationError(
                f"invalid value for '{CheckpointingOptions.ALIGNED_CHECKPOINT_TIMEOUT.key}': "
                f"{self.aligned_checkpoint_timeout_ms} ms. Allowed: 0 (every checkpoint unaligned) or more."
            )

    def alignment_of(self, props: CheckpointProperties) -> tuple[AlignmentType, int | None]:
        """How the barriers of a checkpoint with ``props`` align, and its aligned-checkpoint
        timeout (Flink's ``CheckpointOptions.forConfig``): AT_LEAST_ONCE tracks; savepoints are
        always aligned (FORCED_ALIGNED when unaligned checkpoints are enabled, so the tasks know
        not to switch); a checkpoint with unaligned checkpoints enabled is UNALIGNED from the
        start when the timeout is 0, else ALIGNED with the timeout."""
        if not self.exactly_once:
            return AlignmentType.AT_LEAST_ONCE, None
        if props.is_savepoint:
            return (AlignmentType.FORCED_ALIGNED if self.unaligned else AlignmentType.ALIGNED), None
        if not self.unaligned:
            return AlignmentType.ALIGNED, None
        if self.aligned_checkpoint_timeout_ms == 0:
            return AlignmentType.UNALIGNED, None
        return AlignmentType.ALIGNED, self.aligned_checkpoint_timeout_ms


def check_unaligned_settings(unaligned: bool, exactly_once: bool, max_concurrent: int) -> None:
    """Refuse unaligned checkpoints with settings they cannot work with (Flink's rules): they
    need EXACTLY_ONCE (AT_LEAST_ONCE barriers never block, there is nothing to overtake) and one
    checkpoint at a time (a task persists the in-flight data of one checkpoint only)."""
    if not unaligned:
        return
    enabled = f"{CheckpointingOptions.UNALIGNED.key} is true"
    if not exactly_once:
        raise ConfigurationError(
            f"{enabled} but {CheckpointingOptions.MODE.key} is AT_LEAST_ONCE: unaligned checkpoints "
            "need EXACTLY_ONCE. Set the mode to EXACTLY_ONCE, or disable unaligned checkpoints."
        )
    if max_concurrent != 1:
        raise ConfigurationError(
            f"{enabled} but {CheckpointingOptions.MAX_CONCURRENT.key} is {max_concurrent}: unaligned "
            "checkpoints run one at a time. Set it to 1, or disable unaligned checkpoints."
        )


@dataclass(eq=False)
class CheckpointTriggerRequest:
    props: CheckpointProperties
    is_periodic: bool
    future: Future[CompletedCheckpoint]
    #: A savepoint's target directory (its own ``savepoint-...`` directory goes inside).
    target_location: str | None = None
    #: Stop-with-savepoint with drain: sources emit MAX_WATERMARK before the barrier.
    drain: bool = False

    def fail(self, exception: CheckpointException) -> None:
        if not self.future.done():
            self.future.set_exception(exception)


class CheckpointCoordinator:
    """Coordinates the checkpoints of one job."""

    def __init__(
        self,
        job_id: str,
        config: CheckpointCoordinatorConfiguration,
        *,
        plan_calculator: Callable[[], CheckpointPlan],
        gateway: TaskCheckpointGateway,
        storage: CheckpointStorage,
        completed_store: CompletedCheckpointStore,
        id_counter: CheckpointIDCounter,
        stats: CheckpointStatsTracker,
        clock: Clock,
        timer: Timer,
        fail_job: Callable[[BaseException], None],
        vertex_names: dict[int, str] | None = None,
        master_hooks: Sequence[MasterTriggerRestoreHook] = (),
        rng: random.Random | None = None,
        io_executor: Callable[[Callable[[], object]], object] | None = None,
        main_thread: MainThreadChecker | None = None,
        metadata_writer: Callable[[Callable[[], str | None]], Future[str | None]] | None = None,
    ) -> None:
        self.job_id = job_id
        #: The owner's thread (the JobMaster's loop). Unbound by default: a test drives the
        #: coordinator from its own thread. Asserted at every entry point, because the
        #: coordinator's state has no locks and a call from another thread would race.
        self._main_thread = main_thread or MainThreadChecker("CheckpointCoordinator")
        self.config = config
        self._plan_calculator = plan_calculator
        self._gateway = gateway
        self.storage = storage
        self.completed_store = completed_store
        #: Where shared state files may be deleted: the job's own ``shared/`` and that of
        #: every checkpoint it claimed (a path in a checkpoint's metadata never widens it).
        self._shared_roots: set[str] = set()
        if storage.is_persistent:
            self._shared_roots.add(storage.fs.join(storage.job_dir, SHARED_DIR))
        self.id_counter = id_counter
        self.stats = stats
        self.clock = clock
        self.timer = timer
        self.failure_manager = CheckpointFailureManager(config.tolerable_failures, fail_job)
        self.shared_state_registry = SharedStateRegistry()
        self.vertex_names = vertex_names or {}
        #: Deletes state files of aborted checkpoints (a pool in a job; inline in tests).
        self._io: Callable[[Callable[[], object]], object] = io_executor or _run_inline
        #: Writes ``_metadata`` off this thread and returns the write's future (the JobMaster's
        #: I/O pool); ``None``: here, inline (tests on manual time). Off the thread, a storage
        #: that hangs holds neither the timeout canceller nor the JobMaster's other work.
        self._metadata_writer = metadata_writer
        #: Checkpoints whose ``_metadata`` write is in flight, until its continuation ran.
        self._finalizing: dict[int, tuple[PendingCheckpoint, Future[str | None]]] = {}
        self.master_hooks = {h.get_identifier(): h for h in master_hooks}
        if len(self.master_hooks) != len(master_hooks):
            raise ValueError("master hook identifiers must be unique")
        self._rng = rng or random.Random()
        # Triggering more often than the min pause allows would only produce refusals.
        self._base_interval_ms = (
            None if config.interval_ms is None else max(config.interval_ms, config.min_pause_ms)
        )
        self.checkpoint_props = CheckpointProperties.for_checkpoint(config.retention)
        self.pending_checkpoints: dict[int, PendingCheckpoint] = {}
        self._queue: deque[CheckpointTriggerRequest] = deque()
        #: Runs the queue again when the min pause ends (a manual request is waiting).
        self._queue_wakeup: Cancellable | None = None
        #: True while the queue is being worked through: an abort or completion further
        #: down the stack leaves the next request to that loop instead of nesting another.
        self._executing_queue = False
        self._is_triggering = False
        self._periodic_scheduling = False
        self._periodic_handle: Cancellable | None = None
        self._last_completion_ms: int | None = None
        self._recently_expired: deque[int] = deque(maxlen=_RECENTLY_EXPIRED)
        self.latest_completed_checkpoint_id = -1
        #: The first checkpoint id this coordinator triggered: directories from here on are
        #: its own to tidy at the end (lower ones may hold the checkpoint it restored).
        self._first_own_checkpoint_id: int | None = None
        #: What each pending checkpoint's barrier carries (type, savepoint directory, drain).
        self._options: dict[int, CheckpointOptions] = {}
        #: Directories of savepoints that failed: deleted when they failed, and again at
        #: shutdown in case a task that was still writing brought a file back.
        self._failed_savepoint_locations: list[tuple[int, str]] = []
        #: Completed savepoints: the user's, whatever the store and the end of the job tidy.
        self._completed_savepoint_ids: set[int] = set()
        #: Checkpoints the store subsumed without deleting them (a NO_CLAIM restore).
        self._kept_subsumed: list[CompletedCheckpoint] = []
        #: Subsumed checkpoints whose deletion is queued or running: their shared files go after.
        self._being_discarded: dict[int, CompletedCheckpoint] = {}
        self.shutdown_called = False
        #: The completed checkpoints the job's end kept on disk (its retention policy), oldest
        #: first; set by :meth:`shutdown`, so the console can name the one to resume from.
        self.retained_at_shutdown: list[CompletedCheckpoint] = []

    # ------------------------------------------------------------------ scheduler

    @property
    def is_periodic_checkpointing_configured(self) -> bool:
        return self.config.interval_ms is not None

    @property
    def is_periodic_checkpointing_started(self) -> bool:
        return self._periodic_scheduling

    def start_checkpoint_scheduler(self) -> None:
        """Periodic triggers from now on: a random initial delay, then a fixed rate."""
        self._main_thread.assert_main_thread()
        if self.shutdown_called:
            raise RuntimeError("the checkpoint coordinator is shut down")
        if self.config.interval_ms is None:
            raise RuntimeError("periodic checkpointing is not configured")
        self.stop_checkpoint_scheduler()
        self._periodic_scheduling = True
        assert self._base_interval_ms is not None
        initial = self._rng.randint(self.config.min_pause_ms, self._base_interval_ms)
        self._schedule_periodic(initial)

    def stop_checkpoint_scheduler(self) -> None:
        self._main_thread.assert_main_thread()
        self._periodic_scheduling = False
        if self._periodic_handle is not None:
            self._periodic_handle.cancel()
            self._periodic_handle = None

    def _schedule_periodic(self, delay_ms: float) -> None:
        assert self._base_interval_ms is not None
        interval = self._base_interval_ms

        def tick() -> None:
            self._main_thread.assert_main_thread()
            if not self._periodic_scheduling:
                return
            self._periodic_handle = self.timer.schedule(interval, tick)  # fixed rate
            try:
                self.trigger_checkpoint(is_periodic=True)
            except Exception:
                log.exception("periodic checkpoint trigger failed")

        self._periodic_handle = self.timer.schedule(delay_ms, tick)

    def _reschedule_periodic(self, delay_ms: float) -> None:
        """Move the next periodic trigger (the min pause is not over yet)."""
        if self._periodic_scheduling:
            if self._periodic_handle is not None:
                self._periodic_handle.cancel()
            self._schedule_periodic(delay_ms)

    def job_status_listener(
        self, job_id: str, status: JobStatus, timestamp: int, error: BaseException | None
    ) -> None:
        """Flink's ``CheckpointCoordinatorDeActivator``: on while RUNNING, off otherwise.

        Without an interval there is nothing to schedule: the coordinator then only takes
        savepoints (and the checkpoints a client asks for)."""
        self._main_thread.assert_main_thread()
        if status is JobStatus.RUNNING:
            if self.is_periodic_checkpointing_configured:
                self.start_checkpoint_scheduler()
        else:
            self.stop_checkpoint_scheduler()

    # ------------------------------------------------------------------ triggering

    def trigger_savepoint(
        self,
        target_directory: str,
        format_type: SavepointFormatType = SavepointFormatType.CANONICAL,
        *,
        synchronous: bool = False,
        drain: bool = False,
    ) -> Future[CompletedCheckpoint]:
        """Take a savepoint into a new directory under ``target_directory``; the future
        completes with it (its ``external_pointer`` is the directory) or fails with a
        :class:`CheckpointException` naming why.

        ``synchronous`` makes it the savepoint of a stop-with-savepoint (Flink's
        ``SYNC_SAVEPOINT``): the periodic scheduler stops first (and waiting periodic
        requests are dropped) so that no checkpoint follows the stop; the tasks finish once
        it completes. If it fails, whoever stops the job restarts the scheduler (the
        JobMaster: it fails the job over, which restarts it, or starts it again itself).
        ``drain`` (synchronous only): sources emit MAX_WATERMARK before the barrier.
        """
        self._main_thread.assert_main_thread()
        if drain and not synchronous:
            raise ValueError("drain applies only to a synchronous savepoint (stop-with-savepoint)")
        if synchronous:
            self.stop_checkpoint_scheduler()
            for request in [r for r in self._queue if r.is_periodic]:
                self._queue.remove(request)
                request.fail(CheckpointException(CheckpointFailureReason.PERIODIC_SCHEDULER_SHUTDOWN))
        props = CheckpointProperties.for_savepoint(synchronous, SavepointFormatType(format_type.value))
        return self.trigger_checkpoint(props=props, target_location=target_directory, drain=drain)

    def restart_checkpoint_scheduler_if_configured(self) -> None:
        """After a stop-with-savepoint failed without a failover: periodic checkpoints again."""
        self._main_thread.assert_main_thread()
        if self.is_periodic_checkpointing_configured and not self.shutdown_called:
            self.start_checkpoint_scheduler()

    def trigger_checkpoint(
        self,
        is_periodic: bool = False,
        props: CheckpointProperties | None = None,
        target_location: str | None = None,
        *,
        drain: bool = False,
    ) -> Future[CompletedCheckpoint]:
        """Request a checkpoint; the future completes with it once the store holds it, or
        fails with a :class:`CheckpointException` naming why.

        A request that is not forced waits in the queue while ``max_concurrent``
        checkpoints are pending or the min pause since the last completion lasts (a
        periodic one that is too early is dropped instead: the next tick comes).
        """
        self._main_thread.assert_main_thread()
        request = CheckpointTriggerRequest(
            props or self.checkpoint_props, is_periodic, Future(), target_location, drain
        )
        if self.shutdown_called:
            request.fail(CheckpointException(CheckpointFailureReason.CHECKPOINT_COORDINATOR_SHUTDOWN))
            return request.future
        if is_periodic and not self._periodic_scheduling:
            request.fail(CheckpointException(CheckpointFailureReason.PERIODIC_SCHEDULER_SHUTDOWN))
            return request.future
        if is_periodic and any(r.is_periodic for r in self._queue):
            # Ticks do not pile up while checkpoints are slow: one periodic request waits.
            request.fail(CheckpointException(CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS))
            return request.future
        if len(self._queue) >= self.config.max_queued_requests:
            request.fail(CheckpointException(CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS))
            return request.future
        self._queue.append(request)
        self._execute_queued_requests()
        return request.future

    def _choose_request(self) -> CheckpointTriggerRequest | None:
        """The request to trigger now, or ``None`` (Flink's ``CheckpointRequestDecider``).

        Forced requests (savepoints) go first and are not throttled. Otherwise at most
        ``max_concurrent`` checkpoints are pending, and ``min_pause`` must have passed
        since the last completion: a periodic request that comes too early is dropped and
        the next tick moved to the end of the pause; any other request waits in the queue
        and a timer runs the queue when the pause ends.
        """
        if self._is_triggering or not self._queue:
            return None
        # savepoints first, then requests someone waits for, then the periodic one
        first = min(self._queue, key=lambda r: (not r.props.forced, r.is_periodic))
        if not first.props.forced:
            if len(self.pending_checkpoints) >= self.config.max_concurrent:
                return None
            wait = self._min_pause_remaining_ms()
            if wait > 0:
                if first.is_periodic:
                    self._queue.remove(first)
                    first.fail(CheckpointException(CheckpointFailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS))
                    self._reschedule_periodic(wait)
                else:
                    self._schedule_queue_wakeup(wait)
                return None
        self._queue.remove(first)
        return first

    def _min_pause_remaining_ms(self) -> int:
        if self._last_completion_ms is None:
            return 0
        return self._last_completion_ms + self.config.min_pause_ms - self.clock.now_ms()

    def _schedule_queue_wakeup(self, delay_ms: int) -> None:
        self._cancel_queue_wakeup()
        self._queue_wakeup = self.timer.schedule(delay_ms, self._on_queue_wakeup)

    def _cancel_queue_wakeup(self) -> None:
        if self._queue_wakeup is not None:
            self._queue_wakeup.cancel()
            self._queue_wakeup = None

    def _on_queue_wakeup(self) -> None:
        self._main_thread.assert_main_thread()  # a timer action
        self._queue_wakeup = None
        if not self.shutdown_called:
            self._execute_queued_requests()

    def _execute_queued_requests(self) -> None:
        if self._executing_queue:
            return  # the loop below us on the stack looks at the queue again when we return
        self._executing_queue = True
        try:
            while (request := self._choose_request()) is not None:
                self._start_triggering(request)
        finally:
            self._executing_queue = False

    def _start_triggering(self, request: CheckpointTriggerRequest) -> None:
        try:
            plan = self._plan_calculator()
        except CheckpointException as exc:
            request.fail(exc)
            return
        except Exception as exc:  # a bug in planning fails this request, not the queue
            log.warning("Could not plan a checkpoint of job %s.", self.job_id, exc_info=True)
            failure = CheckpointException(
                CheckpointFailureReason.TRIGGER_CHECKPOINT_FAILURE, f"could not plan the checkpoint: {exc!r}"
            )
            failure.__cause__ = exc
            request.fail(failure)
            return
        location = None
        if request.props.is_savepoint and request.target_location is not None:
            try:
                location = self.storage.init_savepoint_location(request.target_location)
            except Exception as exc:  # noqa: BLE001 - fails this savepoint, before any task knows of it
                log.warning(
                    "Could not create a savepoint directory under %s for job %s: %r",
                    request.target_location,
                    self.job_id,
                    exc,
                )
                failure = CheckpointException(
                    CheckpointFailureReason.IO_EXCEPTION,
                    f"cannot create the savepoint directory under '{request.target_location}' "
                    f"({type(exc).__name__}: {exc}); choose a directory this job can write, "
                    "reachable from every executor",
                )
                failure.__cause__ = exc
                request.fail(failure)
                return
        timestamp = self.clock.now_ms()
        try:
            checkpoint_id = self.id_counter.get_and_increment()
        except Exception as exc:  # noqa: BLE001 - any counter failure fails this trigger only
            if location is not None:  # the savepoint's directory is empty: nothing to keep
                self._io(lambda: self.storage.discard_checkpoint(-1, location))
            request.fail(CheckpointException(CheckpointFailureReason.TRIGGER_CHECKPOINT_FAILURE, exc))
            return
        if self._first_own_checkpoint_id is None:
            self._first_own_checkpoint_id = checkpoint_id
        pending = PendingCheckpoint(
            self.job_id,
            checkpoint_id,
            timestamp,
            plan,
            tuple(self.master_hooks),
            request.props,
            self.storage,
            self._discard_state,
            self._io,
            target_location=location,
        )
        base = self._base_for(request.props)
        alignment, aligned_timeout = self.config.alignment_of(request.props)
        self._options[checkpoint_id] = CheckpointOptions(
            request.props.checkpoint_type,
            location,
            self.config.exactly_once,
            drain=request.drain,
            format_type=(request.props.savepoint_format or SavepointFormatType.CANONICAL).value,
            base_checkpoint_id=base,
            alignment=alignment,
            aligned_checkpoint_timeout_ms=aligned_timeout,
        )
        if base is not None:
            self.shared_state_registry.hold_base(checkpoint_id, base)
        self.pending_checkpoints[checkpoint_id] = pending
        self._chain_request(request, pending)
        self.stats.report_pending_checkpoint(checkpoint_id, timestamp, request.props, self._vertices_of(plan))
        canceller = self.timer.schedule(self.config.timeout_ms, lambda: self._expire(pending))
        if not pending.set_canceller_handle(canceller):
            canceller.cancel()
        log.info(
            "Triggering checkpoint %d (type=%s) @ %d for job %s.",
            checkpoint_id,
            request.props.checkpoint_type.value,
            timestamp,
            self.job_id,
        )
        self._is_triggering = True
        self._snapshot_master_state(pending)

    def _base_for(self, props: CheckpointProperties) -> int | None:
        """The base of a new checkpoint: the latest completed one, the only checkpoint whose
        shared files its tasks may reference (``CheckpointOptions.base_checkpoint_id``).
        ``None`` for a savepoint (every file of it is its own) and when the latest is a
        savepoint (nothing of it is in shared/)."""
        if props.is_savepoint:
            return None
        latest = self.completed_store.get_latest_checkpoint()
        if latest is None or latest.props.is_savepoint:
            return None
        return latest.checkpoint_id

    def _chain_request(self, request: CheckpointTriggerRequest, pending: PendingCheckpoint) -> None:
        def done(future: Future[CompletedCheckpoint]) -> None:
            if request.future.done():
                return
            exception = future.exception()
            if exception is None:
                request.future.set_result(future.result())
            else:
                request.future.set_exception(exception)

        pending.completion_future.add_done_callback(done)

    def _vertices_of(self, plan: CheckpointPlan) -> dict[int, tuple[str, int]]:
        return {
            t.vertex_id: (self.vertex_names.get(t.vertex_id, str(t.vertex_id)), t.parallelism)
            for t in plan.tasks_to_wait_for
        }

    def _snapshot_master_state(self, pending: PendingCheckpoint) -> None:
        """Ask every master hook for its state; trigger the tasks once all have answered."""
        if not self.master_hooks:
            self._trigger_tasks(pending)
            return
        remaining = set(self.master_hooks)

        def on_hook_done(identifier: str, future: Future[bytes | None]) -> None:
            # runs on the coordinator's thread (hopped there through the timer)
            self._main_thread.assert_main_thread()
            if pending.disposed:
                return
            error = future.exception()
            if error is not None:
                self._abort_pending(
                    pending,
                    CheckpointException(
                        CheckpointFailureReason.TRIGGER_CHECKPOINT_FAILURE,
                        f"master hook '{identifier}' failed: {error!r}",
                    ),
                )
                return
            data = future.result()
            pending.acknowledge_master_state(
                identifier, None if data is None else MasterState(identifier, data)
            )
            remaining.discard(identifier)
            if not remaining:
                self._trigger_tasks(pending)

        for identifier, hook in self.master_hooks.items():
            try:
                result = hook.trigger_checkpoint(pending.checkpoint_id, pending.checkpoint_timestamp)
            except Exception as exc:  # noqa: BLE001 - reported as a trigger failure
                failed: Future[bytes | None] = Future()
                failed.set_exception(exc)
                result = failed
            if result is None:
                result = Future()
                result.set_result(None)

            def schedule_done(f: Future[bytes | None], name: str = identifier) -> None:
                self.timer.schedule(0, lambda: on_hook_done(name, f))

            result.add_done_callback(schedule_done)

    def _trigger_tasks(self, pending: PendingCheckpoint) -> None:
        if pending.disposed:
            return
        if not self._deliver_trigger(pending, pending.plan.tasks_to_trigger):
            return
        pending.triggering = False
        self._is_triggering = False
        if pending.is_fully_acknowledged and not pending.disposed:
            self._complete_pending_checkpoint(pending)
        self._execute_queued_requests()

    def _deliver_trigger(self, pending: PendingCheckpoint, attempt_ids: Sequence[ExecutionAttemptID]) -> bool:
        """Send the checkpoint to ``attempt_ids``; False (the checkpoint aborted) if one could
        not be reached."""
        options = self._options[pending.checkpoint_id]
        for attempt_id in attempt_ids:
            try:
                delivered = self._gateway.trigger_checkpoint(
                    attempt_id, pending.checkpoint_id, pending.checkpoint_timestamp, options
                )
            except Exception as exc:  # noqa: BLE001 - fails this checkpoint, at once
                failure = CheckpointException(
                    CheckpointFailureReason.TRIGGER_CHECKPOINT_FAILURE,
                    f"could not trigger task {attempt_id}: {exc!r}",
                )
                failure.__cause__ = exc
                self._abort_trigger(pending, failure)
                return False
            if not delivered:
                # Nothing could carry the trigger (no deployment, the slot is gone): the task
                # will never acknowledge, so waiting for the timeout would only stall
                # checkpointing. A task that finished meanwhile still takes the trigger and
                # declines it itself.
                self._abort_trigger(
                    pending,
                    CheckpointException(
                        CheckpointFailureReason.TASK_CHECKPOINT_FAILURE,
                        f"the trigger could not be delivered to task {attempt_id} "
                        "(it has no slot or its slot is gone)",
                    ),
                )
                return False
        return True

    def _abort_trigger(self, pending: PendingCheckpoint, failure: CheckpointException) -> None:
        log.warning(
            "Checkpoint %d of job %s failed while triggering: %s", pending.checkpoint_id, self.job_id, failure
        )
        self._abort_pending(pending, failure)

    # ------------------------------------------------------------------ messages

    def receive_acknowledge_message(self, message: AcknowledgeCheckpoint) -> bool:
        """A task acknowledged; True if the message belonged to a pending checkpoint."""
        self._main_thread.assert_main_thread()
        if self.shutdown_called or message is None:
            return False
        if message.job_id != self.job_id:
            log.error(
                "Received acknowledge message for job %s, but this coordinator runs job %s.",
                message.job_id,
                self.job_id,
            )
            return False
        checkpoint_id = message.checkpoint_id
        pending = self.pending_checkpoints.get(checkpoint_id)
        if pending is None:
            if checkpoint_id in self._recently_expired:
                log.warning(
                    "Received late acknowledgement from task %s for checkpoint %d, which already expired.",
                    message.attempt_id,
                    checkpoint_id,
                )
            else:
                log.debug(
                    "Received acknowledgement for unknown checkpoint %d from task %s.",
                    checkpoint_id,
                    message.attempt_id,
                )
            self._discard_state(message.state)
            return False
        if pending.disposed:
            raise RuntimeError(f"pending checkpoint {checkpoint_id} is discarded but not removed")
        result = pending.acknowledge_task(message.attempt_id, message.state, message.metrics)
        if result is TaskAcknowledgeResult.SUCCESS:
            task = next(
                (t for t in pending.plan.tasks_to_wait_for if t.attempt_id == message.attempt_id), None
            )
            if task is not None:
                self.stats.report_subtask(
                    checkpoint_id, task.vertex_id, task.subtask_index, self.clock.now_ms(), message.metrics
                )
            log.debug(
                "Received acknowledgement of checkpoint %d from task %s.", checkpoint_id, message.attempt_id
            )
            unreachable = pending.take_tasks_whose_upstream_ended()
            if unreachable:
                # The tasks feeding them had ended before the trigger reached them: no barrier
                # will come, so these take the checkpoint on a trigger of their own.
                log.info(
                    "Checkpoint %d: triggering %d task(s) whose upstream tasks have all finished.",
                    checkpoint_id,
                    len(unreachable),
                )
                if not self._deliver_trigger(pending, unreachable):
                    return True
            if pending.is_fully_acknowledged and not pending.triggering:
                self._complete_pending_checkpoint(pending)
        elif result is TaskAcknowledgeResult.DUPLICATE:
            log.debug(
                "Duplicate acknowledgement of checkpoint %d from task %s.", checkpoint_id, message.attempt_id
            )
        elif result is TaskAcknowledgeResult.UNKNOWN:
            log.warning(
                "Checkpoint %d acknowledged by task %s, which it does not wait for; its state is discarded.",
                checkpoint_id,
                message.attempt_id,
            )
            self._discard_state(message.state)
        else:
            self._discard_state(message.state)
        return True

    def receive_decline_message(self, message: DeclineCheckpoint) -> None:
        self._main_thread.assert_main_thread()
        if self.shutdown_called or message.job_id != self.job_id:
            return
        pending = self.pending_checkpoints.get(message.checkpoint_id)
        if pending is None or pending.disposed:
            log.debug(
                "Decline of checkpoint %d from task %s for no pending checkpoint.",
                message.checkpoint_id,
                message.attempt_id,
            )
            return
        log.info(
            "Decline checkpoint %d by task %s of job %s: %s %s",
            message.checkpoint_id,
            message.attempt_id,
            self.job_id,
            message.reason.name,
            message.message,
        )
        self._abort_pending(
            pending,
            CheckpointException(message.reason, f"declined by task {message.attempt_id}: {message.message}"),
        )

    # ------------------------------------------------------------------ completion

    def _complete_pending_checkpoint(self, pending: PendingCheckpoint) -> None:
        """Finalize, store, and only then call the checkpoint completed (Flink's
        ``completePendingCheckpoint``).

        Until the store holds it, nothing may treat the checkpoint as completed: not the
        caller's future, not the tasks (sinks commit their transactions on the notice),
        not the failure counter, not ``latest_completed_checkpoint_id``. A failure at any
        step leaves the previous checkpoint the latest, with nothing half-registered.

        ``_metadata`` is written by the metadata writer, off this thread, when there is one:
        the checkpoint stays pending meanwhile (its timeout still runs, an abort still
        applies) and :meth:`_metadata_written` goes on, back on this thread.
        """
        checkpoint_id = pending.checkpoint_id
        if not pending.props.is_savepoint and pending.acknowledged_tasks <= pending.ended_tasks:
            # Every task had finished before the checkpoint reached it (the plan still saw one
            # running): it holds no state, and nothing waits for it. Flink triggers none once
            # every task finished; here it is not completed, so that the latest completed
            # checkpoint stays the final one, which holds the job's last state.
            log.info(
                "Checkpoint %d of job %s is not completed: every task had finished.",
                checkpoint_id,
                self.job_id,
            )
            self._abort_pending(
                pending,
                CheckpointException(CheckpointFailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING),
                notify_failure_manager=False,
            )
            return
        # A savepoint's files are its own (none in shared/): it is never registered.
        registers = not pending.props.is_savepoint
        try:
            if registers:
                self.shared_state_registry.register_checkpoint(
                    checkpoint_id, pending.operator_states.values()
                )
            data = pending.serialized_metadata()
            inline = data is None or self._metadata_writer is None
            pointer = pending.write_metadata(data) if inline and data is not None else None
        except Exception as exc:  # noqa: BLE001 - the checkpoint fails, the job does not
            self._fail_finalizing(pending, exc)
            return
        if inline:
            self._finish_completion(pending, pointer)
            return
        assert data is not None and self._metadata_writer is not None
        pending.finalizing = True
        write = self._metadata_writer(lambda: pending.write_metadata(data))
        self._finalizing[pending.checkpoint_id] = (pending, write)

        def written(future: Future[str | None]) -> None:  # any thread: hop to ours
            self.timer.schedule(0, lambda: self._metadata_written(pending, future))

        write.add_done_callback(written)

    def _metadata_written(self, pending: PendingCheckpoint, write: Future[str | None]) -> None:
        """The metadata writer finished: complete the checkpoint, or fail it."""
        self._main_thread.assert_main_thread()  # a timer action
        if self._finalizing.pop(pending.checkpoint_id, None) is None:
            return  # handled already (finish_finalizing at the job's end)
        pending.finalizing = False
        error = write.exception()
        if pending.disposed:
            # Aborted meanwhile (expired, failed over, shut down): the abort deleted the
            # checkpoint's directory, perhaps before this write put _metadata there.
            if error is None:
                checkpoint_id, location = pending.checkpoint_id, pending.target_location
                log.info(
                    "Checkpoint %d of job %s wrote its _metadata after it was aborted; deleting it.",
                    checkpoint_id,
                    self.job_id,
                )
                self._io(lambda: self.storage.discard_checkpoint(checkpoint_id, location))
            return
        if error is not None:
            assert isinstance(error, Exception)
            self._fail_finalizing(pending, error)
            return
        self._finish_completion(pending, write.result())

    def finish_finalizing(self, timeout_s: float) -> None:
        """At the job's end, before :meth:`shutdown`: wait up to ``timeout_s`` for the
        ``_metadata`` writes in flight and complete their checkpoints here.

        Whoever sees a checkpoint's ``_metadata`` may take it as retained (and cancel the job):
        so a write that lands is not aborted by the end of the job a moment later, as it
        would be if the shutdown came before the write's continuation. A write still running
        after ``timeout_s`` (a hanging store) is aborted with the rest."""
        self._main_thread.assert_main_thread()
        if not self._finalizing:
            return
        writes = {write: pending for pending, write in self._finalizing.values()}
        done, _ = futures.wait(writes, timeout=timeout_s)
        for write in sorted(done, key=lambda w: writes[w].checkpoint_id):
            self._metadata_written(writes[write], write)

    def _fail_finalizing(self, pending: PendingCheckpoint, exc: Exception) -> None:
        # The abort deletes what it uploaded (shared files included): forget it only.
        self.shared_state_registry.unregister_checkpoint(pending.checkpoint_id)
        log.warning("Could not finalize checkpoint %d of job %s: %r", pending.checkpoint_id, self.job_id, exc)
        self._abort_pending(
            pending, CheckpointException(CheckpointFailureReason.FINALIZE_CHECKPOINT_FAILURE, exc)
        )

    def _finish_completion(self, pending: PendingCheckpoint, pointer: str | None) -> None:
        """``_metadata`` is durable at ``pointer`` (or the storage is memory): store the
        checkpoint, then complete it."""
        checkpoint_id = pending.checkpoint_id
        completed = pending.complete(pointer, self.clock.now_ms())
        self.pending_checkpoints.pop(checkpoint_id, None)
        self._options.pop(checkpoint_id, None)
        used_for_recovery = pending.props.is_used_for_recovery
        if used_for_recovery:
            try:
                subsumed = self.completed_store.add_checkpoint(completed)
            except Exception as exc:  # noqa: BLE001 - the checkpoint fails, the job does not
                self._fail_storing(pending, completed, exc)
                return
            self._subsumed(subsumed)
            self.latest_completed_checkpoint_id = max(self.latest_completed_checkpoint_id, checkpoint_id)
        self._release_base(checkpoint_id, "completed")  # registered above: it holds what it reused
        # Record the completion before dropping subsumed checkpoints: dropping runs queued
        # requests, and the min pause must count from this completion.
        self._last_completion_ms = self.clock.now_ms()
        self.failure_manager.handle_checkpoint_success(checkpoint_id)
        if pending.props.is_savepoint:
            self._completed_savepoint_ids.add(checkpoint_id)
        pending.mark_stored(completed)
        if used_for_recovery:
            self._drop_subsumed_checkpoints(checkpoint_id)
            self._notify_tasks(  # first: sinks commit on this
                self._gateway.notify_checkpoint_complete, pending, completed.timestamp, "complete"
            )
        stats = self.stats.report_completed(
            checkpoint_id, completed.completion_timestamp, completed.external_pointer
        )
        size = stats.state_size if stats is not None else completed.state_size
        log.info(
            "Completed %s %d for job %s (%d bytes in %d ms)%s.",
            "checkpoint" if not pending.props.is_savepoint else pending.props.checkpoint_type.value.lower(),
            checkpoint_id,
            self.job_id,
            size,
            completed.duration_ms,
            f" at {completed.external_pointer}" if pending.props.is_savepoint else "",
        )
        self._execute_queued_requests()

    def _fail_storing(
        self, pending: PendingCheckpoint, completed: CompletedCheckpoint, error: Exception
    ) -> None:
        """The store refused a finalized checkpoint: it never completed.

        Discard its files and ``_metadata`` (nothing references them), tell the tasks it
        was aborted, count the failure, and go on with the queue (Flink's
        ``addCompletedCheckpointToStoreAndSubsumeOldest``).
        """
        checkpoint_id = completed.checkpoint_id
        log.warning(
            "Could not store completed checkpoint %d of job %s: %r; it is discarded.",
            checkpoint_id,
            self.job_id,
            error,
        )
        exception = CheckpointException(CheckpointFailureReason.FINALIZE_CHECKPOINT_FAILURE, error)
        exception.__cause__ = error
        location = pending.target_location
        if location is None:
            self._io(completed.discard)  # chk-N; the shared files it uploaded go below
            self._release_shared_state([completed], "refused by the store")
        else:  # a stop-with-savepoint's savepoint: its own directory, not chk-N
            self._failed_savepoint_locations.append((checkpoint_id, location))
            self._io(lambda: self.storage.discard_checkpoint(checkpoint_id, location))
        self._release_base(checkpoint_id, "was refused by the store")
        pending.fail_storing(exception)
        if pending.props.is_savepoint:
            self.stats.report_failed(checkpoint_id, self.clock.now_ms(), str(exception))
        else:
            self._report_failure(checkpoint_id, exception)
        self._notify_tasks(
            self._gateway.notify_checkpoint_aborted, pending, pending.checkpoint_timestamp, "aborted"
        )
        if not self.shutdown_called:
            self._execute_queued_requests()

    def _subsumed(self, subsumed: Sequence[CompletedCheckpoint]) -> None:
        """The store dropped these: the deleted ones free their shared files; one the job may
        not delete (a NO_CLAIM restore) stays on disk and is remembered, so that tidying
        ``shared/`` at the end never takes a file it references."""
        self._kept_subsumed += [c for c in subsumed if not c.props.discard_subsumed]
        discarded = [c for c in subsumed if c.props.discard_subsumed]  # the store queued their deletion
        self._being_discarded = {
            c.checkpoint_id: c
            for c in (*self._being_discarded.values(), *discarded)
            if not c.discard_finished.is_set()
        }
        self._release_shared_state(discarded, "subsumed", after_discard=True)

    def _release_shared_state(
        self,
        discarded: Sequence[CompletedCheckpoint],
        why: str,
        *,
        inline: bool = False,
        after_discard: bool = False,
    ) -> None:
        """Unregister checkpoints whose files are deleted and delete the shared files no
        registered checkpoint references any more: on the I/O executor (``inline`` at
        shutdown, so the job's directory can be tidied after), best effort and logged. A
        checkpoint that was never registered (a savepoint, a NO_CLAIM restore) frees nothing.
        ``after_discard``: the checkpoints' own deletion is queued, and goes first."""
        unused = [
            h for c in discarded for h in self.shared_state_registry.unregister_checkpoint(c.checkpoint_id)
        ]
        if not unused:
            return
        ids = ", ".join(str(c.checkpoint_id) for c in discarded)
        which = f"checkpoint {ids} was" if len(discarded) == 1 else f"checkpoints {ids} were"
        self._delete_unused(
            unused,
            f"no retained checkpoint references them since {which} {why}",
            inline,
            after=discarded if after_discard else (),
        )

    def _release_base(self, checkpoint_id: int, outcome: str) -> None:
        """Checkpoint ``checkpoint_id`` is no longer pending: if its base was subsumed while its
        tasks could still reference the base's files, those no retained checkpoint references
        go now (what this checkpoint reuses, if it completed, is registered by now)."""
        base = self.shared_state_registry.base_of(checkpoint_id)
        unused = self.shared_state_registry.release_base(checkpoint_id)
        if unused:
            subsumed = self._being_discarded.get(base) if base is not None else None
            self._delete_unused(
                unused,
                f"no retained checkpoint references them since checkpoint {base} was subsumed and "
                f"checkpoint {checkpoint_id}, whose tasks could reuse them, {outcome}",
                after=() if subsumed is None else (subsumed,),
            )

    def _delete_unused(
        self,
        unused: list[FileStateHandle],
        reason: str,
        inline: bool = False,
        after: Sequence[CompletedCheckpoint] = (),
    ) -> None:
        """Delete shared files, but only once the checkpoints ``after`` are gone from disk
        (their deletion was queued first on the same FIFO I/O executor): a crash in between
        must not leave a ``chk-N`` whose ``_metadata`` names deleted files, which a driver
        restart would find broken and keep for good."""

        def delete() -> None:
            for checkpoint in after:
                if not checkpoint.discard_finished.wait(DISCARD_WAIT_S):
                    log.warning(
                        "Job %s: checkpoint %d is still being deleted after %.0f s; its shared "
                        "files are kept (the end of the job tidies them).",
                        self.job_id,
                        checkpoint.checkpoint_id,
                        DISCARD_WAIT_S,
                    )
                    return
            delete_shared_files(unused, self.job_id, reason, self._shared_roots, self.storage.object_store)

        if inline:
            _run_inline(delete)
        else:
            self._io(delete)

    def _notify_tasks(
        self,
        notify: Callable[[ExecutionAttemptID, int, int], None],
        pending: PendingCheckpoint,
        timestamp: int,
        outcome: str,
    ) -> None:
        """Tell every task to commit to how the checkpoint ended, each on its own.

        Notices are fire-and-forget (RPCs in Flink): one that cannot be sent is logged and
        does not stop the others, nor the completion or abort it belongs to. A task that
        missed a completion commits at the next one; a broken connection to a task is
        detected and failed over by the JobMaster, not here.
        """
        for attempt_id in pending.plan.tasks_to_commit_to:
            try:
                notify(attempt_id, pending.checkpoint_id, timestamp)
            except Exception:  # see the docstring
                log.warning(
                    "Could not notify task %s that checkpoint %d of job %s is %s.",
                    attempt_id,
                    pending.checkpoint_id,
                    self.job_id,
                    outcome,
                    exc_info=True,
                )

    def _drop_subsumed_checkpoints(self, checkpoint_id: int) -> None:
        for older_id in sorted(self.pending_checkpoints):
            older = self.pending_checkpoints[older_id]
            if older_id < checkpoint_id and older.can_be_subsumed():
                self._abort_pending(
                    older,
                    CheckpointException(CheckpointFailureReason.CHECKPOINT_SUBSUMED),
                    notify_failure_manager=False,
                )

    # ------------------------------------------------------------------ aborting

    def _expire(self, pending: PendingCheckpoint) -> None:
        self._main_thread.assert_main_thread()  # a timer action
        if pending.disposed:
            return
        waiting = sorted(
            pending.not_yet_acknowledged_tasks.values(), key=lambda t: (t.vertex_id, t.subtask_index)
        )
        names = [
            f"{' -> '.join(t.operator_names) or 'vertex ' + str(t.vertex_id)} "
            f"({t.subtask_index + 1}/{t.parallelism})"
            for t in waiting
        ]
        log.info(
            "Checkpoint %d of job %s expired before completing; %d subtask(s) had not acknowledged it%s.",
            pending.checkpoint_id,
            self.job_id,
            len(names),
            (": " + ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else ""))
            if names
            else "",
        )
        self._recently_expired.append(pending.checkpoint_id)
        self._abort_pending(pending, CheckpointException(CheckpointFailureReason.CHECKPOINT_EXPIRED))

    def _abort_pending(
        self, pending: PendingCheckpoint, exception: CheckpointException, notify_failure_manager: bool = True
    ) -> None:
        if pending.disposed:
            return
        was_triggering = pending.triggering
        if pending.finalizing:  # registered before its _metadata write; the abort deletes its files
            self.shared_state_registry.unregister_checkpoint(pending.checkpoint_id)
        pending.abort(exception.reason, exception.cause)
        self.pending_checkpoints.pop(pending.checkpoint_id, None)
        self._options.pop(pending.checkpoint_id, None)
        self._release_base(pending.checkpoint_id, "was aborted")
        if pending.target_location is not None:
            self._failed_savepoint_locations.append((pending.checkpoint_id, pending.target_location))
        if pending.props.is_savepoint:
            # Flink: a savepoint's failure is the requester's to handle, never the job's.
            notify_failure_manager = False
        if notify_failure_manager:
            self._report_failure(pending.checkpoint_id, exception)
        else:
            self.stats.report_failed(pending.checkpoint_id, self.clock.now_ms(), str(exception))
        self._notify_tasks(
            self._gateway.notify_checkpoint_aborted, pending, pending.checkpoint_timestamp, "aborted"
        )
        if was_triggering:
            self._is_triggering = False
        if not self.shutdown_called:
            self._execute_queued_requests()

    def _report_failure(self, checkpoint_id: int, exception: CheckpointException) -> None:
        self.stats.report_failed(checkpoint_id, self.clock.now_ms(), str(exception))
        self.failure_manager.handle_checkpoint_exception(exception, checkpoint_id)

    def abort_pending_checkpoints(self, reason: CheckpointFailureReason) -> None:
        """Abort every pending checkpoint (the job fails over, or stops); one whose
        ``_metadata`` write already returned completes instead (its continuation had only
        not run yet).

        Queued requests go first: aborting a pending checkpoint frees a slot, and a
        queued request must not use it to trigger tasks that are about to be cancelled.
        """
        self._main_thread.assert_main_thread()
        # A _metadata that already landed completes its checkpoint (nothing waits here).
        self.finish_finalizing(0)
        self._cancel_queue_wakeup()
        queued, self._queue = list(self._queue), deque()
        for request in queued:
            request.fail(CheckpointException(reason))
        while self.pending_checkpoints:
            pending = self.pending_checkpoints[min(self.pending_checkpoints)]
            self._abort_pending(pending, CheckpointException(reason), notify_failure_manager=False)

    def _discard_state(self, state: TaskStateSnapshot | None) -> None:
        if state is not None:  # files exist with persistent storage, and for savepoints
            handles = state.file_handles()
            if handles:
                self._io(lambda: self.storage.discard_handles(handles))

    # ------------------------------------------------------------------ restore & shutdown

    def restore_latest_checkpointed_state(self) -> CompletedCheckpoint | None:
        """The latest completed checkpoint (hooks restored, ids continued), or ``None``."""
        self._main_thread.assert_main_thread()
        latest = self.completed_store.get_latest_checkpoint()
        if latest is None:
            return None
        self.restore_from(
            latest.checkpoint_id,
            latest.master_states,
            is_savepoint=latest.props.is_savepoint,
            external_pointer=latest.external_pointer,
        )
        return latest

    def restore_from(
        self,
        checkpoint_id: int,
        master_states: list[MasterState],
        *,
        is_savepoint: bool,
        external_pointer: str | None,
        restored: Sequence[CompletedCheckpoint] = (),
        next_checkpoint_id: int | None = None,
    ) -> None:
        """Continue after ``checkpoint_id``: ids, master hooks, statistics.

        At the job's start, ``restored`` (oldest first, the restored checkpoint last) join
        the completed store, as Flink's ``restoreSavepoint`` adds the savepoint to it: a
        failover before the first new checkpoint restores it again, and the store subsumes
        it (deleting it only if its properties say the job owns it: CLAIM, or a driver
        restart's own checkpoints). ``next_checkpoint_id`` continues the ids after every
        ``chk-N`` on disk when that is above ``checkpoint_id``.
        """
        self._main_thread.assert_main_thread()
        self.id_counter.set_count(max(checkpoint_id + 1, next_checkpoint_id or 0))
        for checkpoint in restored:
            # Registered if the job may delete it (CLAIM, a driver restart's own checkpoints),
            # so its shared files go once unused; never a NO_CLAIM one, never a savepoint.
            savepoint = is_savepoint and checkpoint.checkpoint_id == checkpoint_id
            if checkpoint.props.discard_subsumed and not savepoint:
                self.shared_state_registry.register_checkpoint(
                    checkpoint.checkpoint_id, checkpoint.operator_states.values(), restored=True
                )
                if checkpoint.external_pointer is not None:
                    self._shared_roots.add(shared_dir_of(checkpoint.external_pointer))
        for checkpoint in restored:
            subsumed = self.completed_store.add_checkpoint(checkpoint)
            self._subsumed(subsumed)
        by_name = {m.name: m.data for m in master_states}
        for identifier, hook in self.master_hooks.items():
            hook.restore_checkpoint(checkpoint_id, by_name.get(identifier))
        self.stats.report_restored(checkpoint_id, self.clock.now_ms(), is_savepoint, external_pointer)
        log.info(
            "Restoring job %s from checkpoint %d (%s).",
            self.job_id,
            checkpoint_id,
            external_pointer or "in memory",
        )

    def shutdown(self, job_status: JobStatus, *, tidy: bool = True) -> None:
        """The job ended: stop, abort what is pending, discard per retention policy.

        ``tidy=False``: the storage was refused at submission (unreachable, wrong
        credentials), nothing was written there, and going through it again would only add
        more errors of the same cause to the one the job failed with."""
        self._main_thread.assert_main_thread()
        if self.shutdown_called:
            return
        self.stop_checkpoint_scheduler()
        self.abort_pending_checkpoints(CheckpointFailureReason.CHECKPOINT_COORDINATOR_SHUTDOWN)
        self.shutdown_called = True
        if not tidy:
            self.completed_store.shutdown(job_status)
            return
        kept = self.completed_store.get_all_checkpoints()  # a copy: shutdown clears the store
        self.completed_store.shutdown(job_status)
        self._release_shared_state(
            [c for c in kept if c.discarded], f"discarded at the job's end ({job_status.value})", inline=True
        )
        self.retained_at_shutdown = [c for c in kept if not c.discarded and c.external_pointer is not None]
        retained = {c.checkpoint_id for c in kept if not c.discarded} | self._completed_savepoint_ids
        self._discard_orphaned_checkpoint_dirs(retained)
        self._discard_orphaned_shared_files([c for c in kept if not c.discarded] + self._kept_subsumed)
        for checkpoint_id, location in self._failed_savepoint_locations:
            self.storage.discard_checkpoint(checkpoint_id, location)
        self._failed_savepoint_locations.clear()
        self.storage.discard_job_dir_if_empty()

    def _discard_orphaned_checkpoint_dirs(self, retained: set[int]) -> None:
        """Delete the ``chk-N`` directories of this run that no retained checkpoint owns.

        An aborted checkpoint's directory is deleted when it is aborted, but a task that
        was cancelled (or whose slot process was killed) in the middle of its asynchronous
        part may still write its state file there afterwards, and no acknowledgement will
        ever arrive to discard it. Once the job has ended nothing writes any more, so what
        is left of this run's checkpoints beyond the retained ones is garbage. Directories
        below the first id this coordinator triggered are left alone: they may hold the
        checkpoint the job was restored from.
        """
        first = self._first_own_checkpoint_id
        if first is None or not self.storage.is_persistent:
            return
        try:
            orphans = [i for i in self.storage.checkpoint_ids_on_disk() if i >= first and i not in retained]
        except OSError as exc:
            log.warning("Could not list the checkpoints of job %s to tidy them: %s", self.job_id, exc)
            return
        for checkpoint_id in orphans:
            log.info("Deleting what is left of checkpoint %d of job %s.", checkpoint_id, self.job_id)
            self.storage.discard_checkpoint(checkpoint_id)

    def _discard_orphaned_shared_files(self, retained: Sequence[CompletedCheckpoint]) -> None:
        """Delete the files in the job's ``shared/`` that no retained checkpoint references.

        The registry deletes a shared file when the last retained checkpoint referencing it
        goes; a file no completed checkpoint ever referenced escapes it: the upload of a task
        killed half-way (a SIGKILLed slot process or driver) that nothing acknowledged. Once
        the job has ended nothing uploads any more, so such files are garbage. Only when every
        ``chk-N`` in the job's directory is a retained checkpoint this coordinator holds: one
        it does not know (an unreadable one, or one a failed deletion left) may reference any
        file there, and then nothing is swept. Nor when jobs share one directory
        (``execution.checkpointing.create-subdir: false``): another job may be uploading there.
        Best effort, like every deletion here.
        """
        storage = self.storage
        if not storage.is_persistent or not storage.create_subdir:
            return
        fs = storage.fs
        shared_dir = fs.join(storage.job_dir, SHARED_DIR)
        try:
            if not fs.is_dir(shared_dir):
                return
            own = {
                c.checkpoint_id
                for c in retained
                if (c.external_pointer or "").rstrip("/")
                == storage.checkpoint_dir(c.checkpoint_id).rstrip("/")
            }
            unknown = set(storage.checkpoint_ids_on_disk()) - own
            if unknown:
                log.info(
                    "Job %s: shared/ is not tidied: checkpoint(s) %s on disk may reference its files.",
                    self.job_id,
                    ", ".join(map(str, sorted(unknown))),
                )
                return
            # By file name (a random one per upload), not by path: a path spelled another way
            # (a moved or restored checkpoint's) must never make a referenced file look unused.
            referenced = {
                handle.path.rstrip("/").rsplit("/", 1)[-1]
                for checkpoint in retained
                for state in checkpoint.operator_states.values()
                for subtask in state.subtask_states.values()
                for handle in subtask.shared_handles()
                if isinstance(handle, FileStateHandle)
            }
            orphans = [
                FileStateHandle(fs.join(shared_dir, name), 0, "")
                for name in fs.list_dir(shared_dir)
                if name not in referenced
            ]
        except (OSError, StorageError) as exc:
            log.warning("Could not list the shared files of job %s to tidy them: %s", self.job_id, exc)
            return
        delete_shared_files(
            orphans,
            self.job_id,
            "no checkpoint referenced them (uploads that never completed)",
            self._shared_roots,
            storage.object_store,
        )

    @property
    def number_of_pending_checkpoints(self) -> int:
        return len(self.pending_checkpoints)
