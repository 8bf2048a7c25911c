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


def find_unrecoverable(error: BaseException | None) -> UnrecoverableError | None:
    """The :class:`UnrecoverableError` in ``error``'s chain (``error`` itself, then its
    ``__cause__``, or its ``__context__`` where Python would print it), or ``None``.

    The chain, not only the error: a function that catches an unrecoverable error and
    raises its own (``raise MyError(...) from exc``) does not make the cause go away, and
    Flink decides the same way (``ExecutionFailureHandler.isUnrecoverableError`` looks for
    a non-recoverable throwable along the causes).
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UnrecoverableError):
            return error
        seen.add(id(error))
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return None


class BatchTypeError(UnrecoverableError, TypeError):
    """A batch operation got a value of the wrong type from the job's own definition: a batch
    function that returned an int, a sum over a string column, records on a batch edge.

    The same batches meet the same functions after a restart, so the job fails at once. It is
    a ``TypeError`` too, so code that caught the built-in type keeps working.
    """


class BatchValueError(UnrecoverableError, ValueError):
    """A batch operation got a value of the right type but the wrong shape or content from the
    job's own definition: a key function returning one key too few, columns of two lengths.

    Unrecoverable for the reason :class:`BatchTypeError` is; a ``ValueError`` too.
    """


class BatchColumnError(UnrecoverableError, KeyError):
    """A batch operation names a column its batches do not have (``key_by("nope")``).

    Unrecoverable for the reason :class:`BatchTypeError` is; a ``KeyError`` too (the type a
    missing column raised before), but printed as its message, not as a quoted key.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NotKeyedError(UnrecoverableError, InvalidProgramError):
    """Keyed state, a timer or the current key asked for where the stream is not keyed: a
    function's ``get_state`` in an operator after no ``key_by``, ``ctx.timer_service()``'s
    timers in a ``ProcessFunction``, ``ctx.get_current_key()`` in a non-keyed context.

    The job's definition is what is wrong, and every attempt would meet it again, so the
    job fails once with the message (what was asked, by which operator, and ``key_by``)
    instead of restarting. An :class:`InvalidProgramError` too, as it was before.
    """


class InvalidCheckpointError(UnrecoverableError):
    """A checkpoint or savepoint cannot be used: missing, incomplete, corrupt or incompatible.

    The message names the path and what to do instead.
    """


class UntrustedCheckpointError(InvalidCheckpointError):
    """A checkpoint or savepoint this deployment's snapshot key does not authenticate:
    unsigned, signed with another key, or modified after it was signed.

    Restoring it would unpickle state nobody vouches for, which runs code, so it is
    refused before anything of it is decoded. The message names the path, why, and both
    ways out: the key it was written with, or ``execution.state-recovery.trust-snapshot``
    (``chandy run --trust-snapshot``) for a snapshot whose origin is trusted deliberately.
    """


class StorageError(ChandyError):
    """Checkpoint storage cannot be reached, read or written; the message names the path."""


def to_raise_again(error: BaseException) -> BaseException:
    """A copy of a kept exception (a job's failure, kept by its client) to raise to a caller.

    Raising the kept object itself would add the caller's frames to its traceback, and a
    finished frame keeps its caller's frame, so every local variable up the caller's stack
    (a program's environment, and through it the REST server it owns) would live as long
    as the job is kept. The copy has the same type, message, cause and traceback up to
    the raise; an exception that cannot be copied is raised as it is.
    """
    import copy

    try:
        fresh = copy.copy(error)
    except Exception:  # noqa: BLE001 - a class whose arguments do not rebuild it
        return error
    if type(fresh) is not type(error) or fresh.args != error.args:
        return error
    fresh.__cause__ = error.__cause__
    fresh.__context__ = error.__context__
    fresh.__suppress_context__ = error.__suppress_context__
    return fresh.with_traceback(error.__traceback__)
