"""What kind of snapshot a checkpoint is, and when its files may be deleted."""

from __future__ import annotations

from dataclasses import dataclass

from chandy.config.options import ExternalizedCheckpointRetention, SavepointFormatType
from chandy.messages.checkpoint import CheckpointType
from chandy.messages.status import JobStatus


@dataclass(frozen=True)
class CheckpointProperties:
    """Flink's ``CheckpointProperties``: type plus the discard policy per job end."""

    checkpoint_type: CheckpointType
    #: Triggered even when the pre-checks (max concurrent, min pause) would refuse.
    forced: bool
    discard_subsumed: bool
    discard_finished: bool
    discard_cancelled: bool
    discard_failed: bool
    #: How a savepoint stores its state (``None`` for checkpoints). For chandy's heap
    #: backend NATIVE and CANONICAL are the same bytes; the choice is recorded in ``_metadata``.
    savepoint_format: SavepointFormatType | None = None

    @property
    def is_savepoint(self) -> bool:
        return self.checkpoint_type.is_savepoint

    @property
    def is_synchronous(self) -> bool:
        return self.checkpoint_type.is_synchronous

    @staticmethod
    def for_checkpoint(retention: ExternalizedCheckpointRetention) -> CheckpointProperties:
        """A periodic checkpoint; ``retention`` decides what survives the job."""
        keep_cancelled = retention is ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION
        keep_failed = retention is not ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS
        return CheckpointProperties(
            CheckpointType.CHECKPOINT,
            forced=False,
            discard_subsumed=True,
            discard_finished=True,
            discard_cancelled=not keep_cancelled,
            discard_failed=not keep_failed,
        )

    @staticmethod
    def for_savepoint(
        synchronous: bool = False, format_type: SavepointFormatType = SavepointFormatType.CANONICAL
    ) -> CheckpointProperties:
        """A user-triggered savepoint: forced past the pre-checks, never subsumed, never
        deleted by the job (its files belong to the user). ``synchronous``: the savepoint of
        a stop-with-savepoint, after which the tasks finish."""
        kind = CheckpointType.SYNC_SAVEPOINT if synchronous else CheckpointType.SAVEPOINT
        return CheckpointProperties(
            kind,
            forced=True,
            discard_subsumed=False,
            discard_finished=False,
            discard_cancelled=False,
            discard_failed=False,
            savepoint_format=format_type,
        )

    @property
    def is_used_for_recovery(self) -> bool:
        """Whether the completed snapshot joins the completed-checkpoint store and commits
        side effects (sinks' transactions) on completion.

        Flink 1.15's rule: checkpoints and the synchronous savepoint of a stop-with-savepoint
        do; an intermediate savepoint does neither. The job does not fail over to it (the
        user may move or delete it at any time), so committing its transactions would
        commit records that a failover to an older checkpoint replays: duplicates."""
        return not self.is_savepoint or self.is_synchronous

    def discard_on_job_end(self, status: JobStatus) -> bool:
        """Whether a retained checkpoint is deleted when the job ends with ``status``."""
        return {
            JobStatus.FINISHED: self.discard_finished,
            JobStatus.CANCELED: self.discard_cancelled,
            JobStatus.FAILED: self.discard_failed,
        }.get(status, False)
