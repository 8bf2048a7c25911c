"""CheckpointFailureManager: counts consecutive checkpoint failures, fails the job past a limit."""

from __future__ import annotations

import logging
from collections.abc import Callable

from chandy.messages.checkpoint import CheckpointException, CheckpointFailureReason

log = logging.getLogger(__name__)

#: Failures that say something is wrong with checkpointing itself (Flink counts these).
COUNTED_REASONS = frozenset(
    {
        CheckpointFailureReason.IO_EXCEPTION,
        CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION,
        CheckpointFailureReason.CHECKPOINT_DECLINED,
        CheckpointFailureReason.CHECKPOINT_EXPIRED,
        CheckpointFailureReason.FINALIZE_CHECKPOINT_FAILURE,  # e.g. _metadata could not be written
    }
)


class CheckpointFailureManager:
    """Declines, timeouts and write failures count; more than ``tolerable`` in a row
    (without a successful checkpoint in between) fails the job over."""

    def __init__(self, tolerable: int, fail_job: Callable[[BaseException], None]) -> None:
        if tolerable < 0:
            raise ValueError("the tolerable number of failed checkpoints must be >= 0")
        self.tolerable = tolerable
        self._fail_job = fail_job
        self.continuous_failure_counter = 0
        self._counted: set[int] = set()
        self._last_succeeded = -1

    def handle_checkpoint_exception(self, exception: CheckpointException, checkpoint_id: int | None) -> None:
        if exception.reason not in COUNTED_REASONS:
            return
        if checkpoint_id is not None:
            if checkpoint_id < self._last_succeeded or checkpoint_id in self._counted:
                return  # older than a success, or already counted once
            self._counted.add(checkpoint_id)
        self.continuous_failure_counter += 1
        if self.continuous_failure_counter > self.tolerable:
            log.warning(
                "Checkpoint %s failed (%s); %d consecutive failures exceed the tolerable "
                "%d: failing the job over.",
                checkpoint_id,
                exception.reason.name,
                self.continuous_failure_counter,
                self.tolerable,
            )
            self._fail_job(CheckpointToleranceExceeded(exception, self.tolerable))

    def handle_checkpoint_success(self, checkpoint_id: int) -> None:
        self.continuous_failure_counter = 0
        self._counted.clear()
        self._last_succeeded = max(self._last_succeeded, checkpoint_id)


class CheckpointToleranceExceeded(Exception):
    """Raised into the job's failover when checkpoints failed too often in a row."""

    def __init__(self, last: CheckpointException, tolerable: int) -> None:
        super().__init__(
            f"Exceeded checkpoint tolerable failure threshold ({tolerable}). The latest checkpoint "
            f"failed due to {last.reason.name}: {last}. Raise "
            "execution.checkpointing.tolerable-failed-checkpoints or fix the cause."
        )
        self.last = last
