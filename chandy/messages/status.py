"""The status of a job and of one execution attempt of a subtask (Flink's names).

They sit here, beside the messages that carry them, so every layer that
reasons about status (the checkpoint coordinator's job-status listener, the
tasks, the JobMaster, the executors) compares enum members, never strings.
"""

from __future__ import annotations

import enum


class JobStatus(enum.Enum):
    """A job's state, Flink's: ``CREATED``, ``RUNNING``, ``FAILING``, ``RESTARTING``, ``CANCELLING``,
    ``FINISHED``, ``CANCELED`` or ``FAILED``; compared by identity, never as strings."""

    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"
    RESTARTING = "RESTARTING"

    @property
    def is_globally_terminal(self) -> bool:
        """Whether the job has ended for good (finished, cancelled or failed) and will not run again."""
        return self in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)


class ExecutionState(enum.Enum):
    """The life of one execution attempt of a subtask (Flink's names)."""

    CREATED = "CREATED"
    SCHEDULED = "SCHEDULED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        """Whether the subtask attempt has ended (finished, cancelled or failed)."""
        return self in (ExecutionState.FINISHED, ExecutionState.CANCELED, ExecutionState.FAILED)
