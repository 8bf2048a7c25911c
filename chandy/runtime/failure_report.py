"""What a user sees of a job's failovers: the error once, then one line per repeat.

A job that restarts under its restart strategy used to show one line per failure,
the error's first line and nothing of where it came from, so a bug in a function
looked like a job restarting for no reason, forever. Now the first failure prints
the user's full traceback with the attempt number, the restart to come and where
to look (the restart strategy's key, the REST API's ``/jobs/<id>/exceptions``, the
dashboard's Exceptions tab); a failure with the same error again prints one short
line with the attempt number and the next delay; a different error prints its
traceback again. The output goes through :mod:`logging` at WARNING, which Python
prints on stderr even when the program configured no logging.
"""

from __future__ import annotations

import logging
import re
import traceback
from pathlib import Path

from chandy.runtime.restart_strategy import RestartBackoffTimeStrategy, describe_delay
from chandy.task.services import TaskFailure

log = logging.getLogger("chandy.runtime.failover")

#: Addresses of objects (``<Foo object at 0x7f...>``) differ between attempts of the same error.
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def _signature(failure: TaskFailure | None, error: BaseException) -> str:
    """What makes two failures "the same error": the exception's type and its traceback
    (the frames and the message), without object addresses. The subtask does not count:
    a bad record fails whichever subtask it reaches."""
    if failure is not None:
        text = f"{failure.exception_type}\n{failure.traceback_text}"
    else:
        cause = error.__cause__ or error
        text = f"{type(cause).__name__}\n{_traceback_of(cause)}"
    return _ADDRESS.sub("0x?", text)


def _traceback_of(error: BaseException) -> str:
    if error.__traceback__ is None:
        return f"{type(error).__name__}: {error}"
    return "".join(traceback.format_exception(error)).rstrip("\n")


class FailoverReport:
    """Formats and logs each failover of one job (on the JobMaster's thread)."""

    def __init__(self, job_name: str, job_id: str, rest_url: str | None) -> None:
        self.job_name = job_name
        self.job_id = job_id
        self.rest_url = rest_url.rstrip("/") if rest_url else None
        self._last: str | None = None

    def _where_to_look(self) -> str:
        if self.rest_url is None:
            return (
                f"every failure is listed by the REST API at /jobs/{self.job_id}/exceptions and in "
                "the dashboard's Exceptions tab (the REST server is off here: chandy.rest.enabled)"
            )
        return (
            f"every failure is listed at {self.rest_url}/jobs/{self.job_id}/exceptions and in the "
            f"dashboard's Exceptions tab ({self.rest_url}/#/jobs/{self.job_id})"
        )

    def restarting(
        self,
        attempt: int,
        error: BaseException,
        failure: TaskFailure | None,
        strategy: RestartBackoffTimeStrategy,
        delay_ms: int,
        restart: int,
    ) -> None:
        """Attempt ``attempt`` failed with ``error``; restart number ``restart`` follows in
        ``delay_ms``."""
        of = f" of {strategy.max_attempts}" if strategy.max_attempts is not None else ""
        next_step = f"restart {restart}{of} in {describe_delay(delay_ms)}"
        headline = str(error).splitlines()[0] if str(error) else type(error).__name__
        signature = _signature(failure, error)
        if signature == self._last:
            log.warning(
                "Job '%s' failed again on attempt %d with the same error (%s); %s.",
                self.job_name,
                attempt,
                _short(headline, self.job_name),
                next_step,
            )
            return
        self._last = signature
        log.warning(
            "Job '%s' (%s) failed on attempt %d: %s\n%s\n%s (restart-strategy.type: %s). "
            "Later failures with this same error print one line each; %s. A bug in the job "
            "fails it the same way on every attempt: fix it, or set restart-strategy.type: none "
            "to stop at the first failure.",
            self.job_name,
            self.job_id,
            attempt,
            _short(headline, self.job_name),
            _trace(failure, error),
            next_step[0].upper() + next_step[1:],
            strategy.describe(),
            self._where_to_look(),
        )

    def giving_up(
        self,
        attempt: int,
        error: BaseException,
        failure: TaskFailure | None,
        strategy: RestartBackoffTimeStrategy,
    ) -> None:
        """Attempt ``attempt`` failed and the strategy allows no more restarts: the job fails
        with ``error``, which its caller raises (with its traceback), so one line here."""
        if attempt <= 1:
            return  # nothing restarted: the raised error says everything
        same = _signature(failure, error) == self._last
        log.warning(
            "Job '%s' failed on attempt %d%s (%s); no restarts left (%s): the job fails.",
            self.job_name,
            attempt,
            " with the same error" if same else "",
            _short(str(error).splitlines()[0] if str(error) else type(error).__name__, self.job_name),
            strategy.describe(),
        )


def _short(headline: str, job_name: str) -> str:
    """The error's first line without the ``job '<name>' failed: `` it starts with."""
    return headline.removeprefix(f"job '{job_name}' failed: ")


def _trace(failure: TaskFailure | None, error: BaseException) -> str:
    """The user's traceback: the task's (formatted where it was raised, also in a Spark
    slot), else the cause's; without the frames of chandy's task loop above the user's."""
    if failure is not None and failure.traceback_text:
        return _from_user_frames(failure.traceback_text.rstrip("\n"))
    return _from_user_frames(_traceback_of(error.__cause__ or error))


#: The directory of the chandy package: its frames are the task's machinery, not the user's.
_CHANDY_DIR = str(Path(__file__).resolve().parent.parent)


def _from_user_frames(text: str) -> str:
    """``text`` (formatted tracebacks) with the leading frames of each traceback that are
    chandy's (the mailbox loop, the operator calling the function) replaced by one line:
    the user's own frames are what says where the error is. A traceback of chandy's frames
    only is kept whole. The REST API keeps the full text."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        i += 1
        if not out[-1].startswith("Traceback (most recent call last):"):
            continue
        frames: list[list[str]] = []
        while i < len(lines) and lines[i].startswith("  ") and not lines[i].startswith("    "):
            frame = [lines[i]]
            i += 1
            while i < len(lines) and lines[i].startswith("    "):
                frame.append(lines[i])
                i += 1
            frames.append(frame)
        ours = 0
        while ours < len(frames) and frames[ours][0].startswith(f'  File "{_CHANDY_DIR}'):
            ours += 1
        if 0 < ours < len(frames):
            out.append(f"  [{ours} frames of chandy's task left out]")
            frames = frames[ours:]
        out.extend(line for frame in frames for line in frame)
    return "\n".join(out)
