"""The exceptions chandy raises to its users.

Every error a user can cause names its cause and the fix in its message. The
classes are few on purpose: callers catch by kind (bad configuration, a job that
failed, a checkpoint that cannot be used), the message carries the detail.
"""

from __future__ import annotations


class ChandyError(Exception):
    """Base class of every error chandy raises on purpose."""


class ConfigurationError(ChandyError, ValueError):
    """A configuration value or combination is invalid.

    Raised before anything runs (at ``execute()`` at the latest), with the key,
    the offending value and the allowed values in the message.
    """


class InvalidProgramError(ChandyError, ValueError):
    """The pipeline itself is malformed: no operators, a bad key selector, ..."""


class JobExecutionError(ChandyError):
    """The job failed; ``__cause__`` is the first exception that failed it.

    When the failure came from a user function the message names the operator and
    the subtask, and carries the user's traceback, so it reads the same whether
    the function ran in this process or on a Spark executor.
    """

    def __init__(self, message: str, job_id: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobCancelledError(JobExecutionError):
    """The job was cancelled before it finished (``close()`` on a collect iterator, Ctrl-C)."""


class UnrecoverableError(ChandyError):
    """A failure that a restart would only repeat: the job fails at once instead of
    restarting under its restart strategy.

    Raise it (or a subclass) from a function or connector when the cause is in the
    job's definition or its environment's setup, such as a topic that does not
    exist, rather than a transient condition such as an unreachable server.
    """


class InvalidCheckpointError(UnrecoverableError):
    """A checkpoint or savepoint cannot be used: missing, incomplete, corrupt or incompatible.

    The message names the path and what to do instead.
    """


class StorageError(ChandyError):
    """Checkpoint storage cannot be reached, read or written; the message names the path."""
