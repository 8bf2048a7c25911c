"""Checkpoint messages: failure reasons, options carried by barriers, metrics, acks, declines."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Protocol

from chandy.messages.ids import ExecutionAttemptID
from chandy.state.snapshot import TaskStateSnapshot


class CheckpointFailureReason(enum.Enum):
    """Why a checkpoint did not complete (Flink's ``CheckpointFailureReason`` names)."""

    PERIODIC_SCHEDULER_SHUTDOWN = "Periodic checkpoint scheduler is shut down."
    TOO_MANY_CHECKPOINT_REQUESTS = "The maximum number of queued checkpoint requests exceeded"
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = (
        "The minimum time between checkpoints is still pending. Checkpoint will be triggered later."
    )
    NOT_ALL_REQUIRED_TASKS_RUNNING = "Not all required tasks are currently running."
    IO_EXCEPTION = "An Exception occurred while triggering the checkpoint (IO exception)."
    CHECKPOINT_ASYNC_EXCEPTION = "Asynchronous task checkpoint failed."
    CHECKPOINT_EXPIRED = "Checkpoint expired before completing."
    CHECKPOINT_SUBSUMED = "Checkpoint has been subsumed."
    CHECKPOINT_DECLINED = "Checkpoint was declined."
    CHECKPOINT_DECLINED_TASK_NOT_READY = "Checkpoint was declined (tasks not ready)"
    CHECKPOINT_DECLINED_TASK_CLOSING = "Checkpoint was declined (task is closing)"
    CHECKPOINT_DECLINED_SUBSUMED = (
        "Checkpoint was canceled because a barrier from newer checkpoint was received."
    )
    CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER = "Task received cancellation from one of its inputs"
    CHECKPOINT_DECLINED_INPUT_END_OF_STREAM = "Checkpoint was declined because one input stream is finished"
    CHECKPOINT_COORDINATOR_SHUTDOWN = "CheckpointCoordinator shutdown."
    CHECKPOINT_COORDINATOR_SUSPEND = "Checkpoint Coordinator is suspending."
    JOB_FAILURE = "The job has failed."
    JOB_FAILOVER_REGION = "FailoverRegion is restarting."
    TASK_FAILURE = "Task has failed."
    TASK_CHECKPOINT_FAILURE = "Task local checkpoint failure."
    UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE = "Unknown task for the checkpoint to notify."
    FINALIZE_CHECKPOINT_FAILURE = "Failure to finalize checkpoint."
    TRIGGER_CHECKPOINT_FAILURE = "Trigger checkpoint failure."

    @property
    def message(self) -> str:
        return self.value

    @property
    def is_pre_flight(self) -> bool:
        """Failures before any task was asked to checkpoint (never counted against the job)."""
        return self in _PRE_FLIGHT


_PRE_FLIGHT = frozenset(
    {
        CheckpointFailureReason.PERIODIC_SCHEDULER_SHUTDOWN,
        CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS,
        CheckpointFailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS,
        CheckpointFailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING,
        CheckpointFailureReason.CHECKPOINT_COORDINATOR_SHUTDOWN,
    }
)


class CheckpointException(Exception):
    """A checkpoint failed for ``reason``."""

    def __init__(self, reason: CheckpointFailureReason, cause: BaseException | str | None = None) -> None:
        detail = f": {cause}" if cause else ""
        super().__init__(f"{reason.name} - {reason.message}{detail}")
        self.reason = reason
        self.cause = cause


class CheckpointType(enum.Enum):
    """What a snapshot is for (Flink's checkpoint types, shown in stats)."""

    CHECKPOINT = "CHECKPOINT"
    SAVEPOINT = "SAVEPOINT"
    SYNC_SAVEPOINT = "SYNC_SAVEPOINT"

    @property
    def is_savepoint(self) -> bool:
        return self is not CheckpointType.CHECKPOINT

    @property
    def is_synchronous(self) -> bool:
        return self is CheckpointType.SYNC_SAVEPOINT


class AlignmentType(enum.Enum):
    """How the barriers of a checkpoint are aligned at a task with inputs (Flink's names)."""

    #: Tracked, never blocking (AT_LEAST_ONCE).
    AT_LEAST_ONCE = "AT_LEAST_ONCE"
    #: Aligned: a channel that delivered the barrier waits for the others. With
    #: ``aligned_checkpoint_timeout_ms`` set it may switch to UNALIGNED at a task.
    ALIGNED = "ALIGNED"
    #: The first barrier overtakes the queued data, which is persisted as channel state.
    UNALIGNED = "UNALIGNED"
    #: Aligned although unaligned checkpoints are enabled: savepoints.
    FORCED_ALIGNED = "FORCED_ALIGNED"


@dataclass(frozen=True, slots=True)
class CheckpointOptions:
    """Travels with every barrier: what kind of snapshot, and how to align for it."""

    checkpoint_type: CheckpointType = CheckpointType.CHECKPOINT
    #: Where the snapshot goes when not the default location (savepoints).
    target_location: str | None = None
    #: Exactly-once aligned (True) or at-least-once tracked (False).
    exactly_once: bool = True
    #: A synchronous savepoint (stop-with-savepoint) with drain: sources emit MAX_WATERMARK
    #: before the barrier, so every window and event-time timer fires into the savepoint.
    drain: bool = False
    #: "CANONICAL" (backend-independent) or "NATIVE" (the backend's own format); savepoints only.
    format_type: str = "CANONICAL"
    #: The coordinator's latest completed checkpoint when it triggered this one (``None``: there
    #: is none, and for savepoints): the only checkpoint whose shared files an incremental
    #: snapshot may reference. A task may not have heard yet that it completed (the notice is
    #: an RPC, the barrier overtakes it in the data channels), and the checkpoint it last heard
    #: of may already be subsumed, its files deleted; the coordinator keeps this one's files
    #: until the checkpoint naming it completes or aborts.
    base_checkpoint_id: int | None = None
    #: How tasks with inputs align this checkpoint's barriers.
    alignment: AlignmentType = AlignmentType.ALIGNED
    #: ALIGNED only: after this many milliseconds since the checkpoint started (the barrier's
    #: timestamp), a task still aligning switches to unaligned. ``None``: never.
    aligned_checkpoint_timeout_ms: int | None = None

    @property
    def is_unaligned(self) -> bool:
        """Barriers overtake the data in the channels; the task persists what they overtook."""
        return self.alignment is AlignmentType.UNALIGNED

    @property
    def is_timeoutable(self) -> bool:
        """Aligned, but a task still aligning when the timeout passes goes unaligned."""
        return self.alignment is AlignmentType.ALIGNED and self.aligned_checkpoint_timeout_ms is not None

    @property
    def is_priority(self) -> bool:
        """The barrier travels as a priority event: ahead of the queued data and without credit
        (unaligned), or announced ahead of it and acted on in order (timeoutable)."""
        return self.is_unaligned or self.is_timeoutable

    def to_unaligned(self) -> CheckpointOptions:
        """These options after an alignment timeout: unaligned from here on downstream."""
        return dataclasses.replace(
            self, alignment=AlignmentType.UNALIGNED, aligned_checkpoint_timeout_ms=None
        )


@dataclass(slots=True)
class CheckpointMetrics:
    """What a subtask measured while taking its part of a checkpoint."""

    #: Bytes read from not-yet-blocked channels between first and last barrier.
    bytes_processed_during_alignment: int = 0
    #: First barrier to last barrier at this subtask.
    alignment_duration_ns: int = 0
    #: Barrier creation (at the sources) to the first barrier at this subtask.
    checkpoint_start_delay_ns: int = 0
    sync_duration_ms: int = 0
    async_duration_ms: int = 0
    #: Bytes of state written for this checkpoint.
    checkpointed_size: int = 0
    #: Full size of the state (equal to checkpointed_size until incremental snapshots).
    state_size: int = 0
    #: The checkpoint was unaligned at this subtask (from the start, or after an alignment timeout).
    unaligned: bool = False
    #: Bytes of in-flight data (channel state) written with this checkpoint by this subtask.
    bytes_persisted_during_alignment: int = 0


@dataclass(frozen=True)
class AcknowledgeCheckpoint:
    job_id: str
    attempt_id: ExecutionAttemptID
    checkpoint_id: int
    metrics: CheckpointMetrics = field(default_factory=CheckpointMetrics)
    #: ``None`` for a stateless subtask (nothing is assigned to it on restore).
    state: TaskStateSnapshot | None = None


@dataclass(frozen=True)
class DeclineCheckpoint:
    job_id: str
    attempt_id: ExecutionAttemptID
    checkpoint_id: int
    reason: CheckpointFailureReason
    message: str = ""


@dataclass(frozen=True)
class EndOfInputReached:
    """A source subtask read all its input and waits for a final checkpoint to complete."""

    job_id: str
    attempt_id: ExecutionAttemptID


class CheckpointResponder(Protocol):
    """Task -> coordinator: how a subtask answers a checkpoint."""

    def acknowledge_checkpoint(self, message: AcknowledgeCheckpoint) -> None: ...

    def decline_checkpoint(self, message: DeclineCheckpoint) -> None: ...

    def report_end_of_input(self, message: EndOfInputReached) -> None:
        """A bounded source ended: a final checkpoint lets two-phase-commit sinks commit."""
        ...


class TaskCheckpointGateway(Protocol):
    """Coordinator -> tasks: trigger, confirm, abort (one way, never waits for the task)."""

    def trigger_checkpoint(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int, options: CheckpointOptions
    ) -> bool:
        """Ask a source subtask to start checkpoint ``checkpoint_id``; False if it is unknown."""
        ...

    def notify_checkpoint_complete(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None: ...

    def notify_checkpoint_aborted(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None: ...
