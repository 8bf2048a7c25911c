"""The console of a job that ``env.execute()`` runs: how it ends on Ctrl-C and SIGTERM,
what is printed instead of a traceback nobody can act on, and where ``chandy run
--detached`` learns the job's REST address.

chandy owns the console of the job it runs, as Flink's CLI does:

* **Ctrl-C** (SIGINT) cancels the job in order (its tasks, then the slots, then the
  checkpoint coordinator, which keeps or deletes checkpoints by their retention policy)
  and prints one line: that the job was cancelled, the checkpoint kept to resume from (or
  why there is none, and how to keep one) and the command that resumes it. The
  ``KeyboardInterrupt`` still propagates, so a program (or a notebook) that catches it goes
  on, and one that does not dies of SIGINT as a shell expects (exit status 130), without a
  traceback: the line said everything.
* **SIGTERM** (``timeout``, a supervisor, ``kill``) ends the same way, then stops the Spark
  session (so Spark's JVM and Python workers are not left to print about a driver that is
  gone) and exits with status 143 (128 + SIGTERM). Only a process whose SIGTERM handler is
  the default gets this; one that installed its own keeps it.
* A job **cancelled by a request** (``chandy cancel``, the REST API) makes ``execute()`` raise
  :class:`~chandy.errors.JobCancelledError`, as Flink's client does; a program that does not
  catch it ends with one line saying so (the JobMaster logs the cancel at INFO), not a
  traceback: a cancel is not a failure.
* A :class:`SetupError` nothing catches (Spark cannot start: no Java) is its message alone.

The one-line endings come from ``sys.excepthook``, chained in front of whatever hook the
process has, and only for the exceptions described here.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

from chandy.config.options import CheckpointingOptions, ExternalizedCheckpointRetention
from chandy.errors import ConfigurationError, JobCancelledError
from chandy.runtime.status_line import dashboard_link

if TYPE_CHECKING:
    from chandy.runtime.job_master import JobMaster

#: How ``chandy run --detached`` hears the job's REST address: a file the job writes one
#: line into (the URL, or ``-`` without a REST server), once, whole. A file and not an
#: inherited pipe, because with ``--master`` spark-submit's JVM sits between the two and
#: passes the environment on, but no file descriptors.
ANNOUNCE_FILE_ENV = "CHANDY_ANNOUNCE_FILE"

#: How ``chandy run --master ...`` finds the job's driver to pass Ctrl-C on to: a file the
#: driver writes its process id into when a job starts. spark-submit's JVM sits between the
#: two and passes the environment on (but no inherited file descriptors), and the JVM must
#: not get the SIGINT itself: it would stop the Spark context under the job's own cancel.
DRIVER_PID_FILE_ENV = "CHANDY_DRIVER_PID_FILE"

#: The attribute that marks an exception whose ending the console already reported.
_REPORTED = "_chandy_console_reported"

_hook_lock = threading.Lock()


class SetupError(ConfigurationError):
    """The machine is not set up for what the job asks (Spark without Java): fixed outside
    the program. When nothing catches it the console prints its message alone: a traceback
    would point into chandy and Spark, not at the cause."""


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM while ``execute()`` runs: unwinds the job like
    Ctrl-C, then ends the process with status 143 (it is a ``SystemExit``)."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def write(line: str) -> None:
    """One line for the user on stderr (the console's own output; logs stay in logging)."""
    try:
        sys.stderr.write(line.rstrip("\n") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # no console left to tell
        pass


def _excepthook(
    previous: Callable[[type[BaseException], BaseException, TracebackType | None], object],
) -> Callable[[type[BaseException], BaseException, TracebackType | None], None]:
    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if getattr(error, _REPORTED, False):
            return  # the console printed its line when the job ended
        if isinstance(error, JobCancelledError):
            write(f"chandy: {error}.")
            return
        if isinstance(error, SetupError):
            write(f"Error: {error}")
            return
        previous(kind, error, tb)

    hook.chandy_console = True  # type: ignore[attr-defined]
    return hook


def install_excepthook() -> None:
    """Put the console's hook in front of the process's ``sys.excepthook`` (once)."""
    with _hook_lock:
        if not getattr(sys.excepthook, "chandy_console", False):
            sys.excepthook = _excepthook(sys.excepthook)


def mark_reported(error: BaseException) -> None:
    """The console has said how the job ended: an uncaught ``error`` adds no traceback."""
    with contextlib.suppress(AttributeError, TypeError):
        setattr(error, _REPORTED, True)
    install_excepthook()


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM raises :class:`Terminated` there,
    so the job unwinds as on Ctrl-C instead of the process vanishing mid-job. A second
    SIGTERM kills at once (the default is back after the first). Elsewhere, or with a
    handler of the program's own, this does nothing."""
    try:
        ours = (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        )
    except ValueError:  # not the main interpreter
        ours = False
    if not ours:
        yield
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated()

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is terminate:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _program() -> str:
    """The job file as the user would type it again."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    return shlex.quote(argv0) if argv0.endswith(".py") else "job.py"


def interrupted_line(job_master: JobMaster, how: str) -> str:
    """The one line that ends a job cancelled by ``how`` (``Ctrl-C``, ``SIGTERM``): what is
    kept to resume from and how, or why nothing is and how to keep it next time."""
    graph = job_master.job_graph
    head = f"chandy: job '{graph.job_name}' ({graph.job_id}) cancelled ({how})"
    config = job_master.config
    path = job_master.retained_checkpoint
    if path is not None:
        return (
            f"{head}; its latest checkpoint is kept at {path}: resume with "
            f"`chandy run -s {shlex.quote(path)} {_program()}` "
            "(or execution.state-recovery.path set to it)"
        )
    if config.get(CheckpointingOptions.INTERVAL) is None:
        return f"{head}; no checkpoint to resume from: checkpointing is off (env.enable_checkpointing(ms))"
    retention = config.get(CheckpointingOptions.EXTERNALIZED_RETENTION)
    if retention is not ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION:
        return (
            f"{head}; its checkpoints were deleted (execution.checkpointing.externalized-checkpoint-"
            f"retention is {retention.name}): to keep the latest for a resume, set it to "
            "RETAIN_ON_CANCELLATION (-D execution.checkpointing.externalized-checkpoint-retention="
            "RETAIN_ON_CANCELLATION, with execution.checkpointing.dir)"
        )
    return f"{head}; no checkpoint had completed yet, so there is none to resume from"


def _write_whole(path: str, text: str) -> None:
    """``text`` into ``path`` through a temporary file renamed over it, so that a reader
    polling ``path`` never sees half of it; a directory gone meanwhile (the reader gave up)
    is not an error."""
    with contextlib.suppress(OSError):
        temporary = f"{path}.{os.getpid()}"
        with open(temporary, "w") as file:
            file.write(text)
        os.replace(temporary, path)


def announce_driver() -> None:
    """Tell ``chandy run --master`` (if it started this driver) which process to send Ctrl-C
    and SIGTERM to, now that a job runs here: its id into the file the variable names."""
    path = os.environ.get(DRIVER_PID_FILE_ENV)
    if path:
        _write_whole(path, str(os.getpid()))


def announce_rest_address(url: str | None, job_name: str, job_id: str) -> None:
    """Tell ``chandy run --detached`` (if it started this process) where the REST API is,
    and say it in the job's output (its log): the port may not be the one asked for."""
    path = os.environ.pop(ANNOUNCE_FILE_ENV, None)
    if path is None:
        return
    if url is not None:
        dashboard = dashboard_link(url, job_id)
        write(f"chandy: job '{job_name}' ({job_id}): REST API at {url}, dashboard {dashboard}")
    _write_whole(path, f"{url or '-'}\n")
