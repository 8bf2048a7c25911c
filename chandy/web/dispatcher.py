"""The Dispatcher: the jobs of one environment, as the REST API sees them.

Flink's Dispatcher keeps every job it ran, finished ones too, so a client can
still ask how a job ended. chandy's does the same for one
``StreamExecutionEnvironment``: each ``execute``/``execute_async`` registers its
JobMaster here before the job starts. The dispatcher also remembers the
savepoints and stops clients triggered (Flink's trigger ids) until the client has
fetched their outcome: ``env.execute()`` keeps the server up for that after the
job ended, because Flink's CLI polls for a stop's result after the job finished.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import traceback
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

from chandy.messages.status import JobStatus
from chandy.runtime.job_master import JobMaster

log = logging.getLogger(__name__)

#: Failures kept per job for ``/jobs/:jobid/exceptions`` (Flink's ``web.exception-history-size``).
EXCEPTION_HISTORY_SIZE = 16


@dataclass(frozen=True)
class ExceptionEntry:
    """One failure of a job (a failover or its end), for Flink's exception history."""

    timestamp: int
    exception_name: str
    stacktrace: str


@dataclass
class SavepointTrigger:
    """A savepoint or stop-with-savepoint a client asked for (Flink's trigger id)."""

    trigger_id: str
    future: Future[str]
    fetched: bool = False


class DispatchedJob:
    """A job of the environment: its JobMaster, failures and savepoint triggers."""

    def __init__(self, job_master: JobMaster, notify: threading.Condition) -> None:
        self.job_master = job_master
        self._notify = notify
        self._exceptions: deque[ExceptionEntry] = deque(maxlen=EXCEPTION_HISTORY_SIZE)
        self._last_error: BaseException | None = None
        self.triggers: dict[str, SavepointTrigger] = {}
        job_master.execution_graph.register_job_status_listener(self._on_status)

    @property
    def job_id(self) -> str:
        return self.job_master.job_id

    @property
    def job_name(self) -> str:
        return self.job_master.job_graph.job_name

    def _on_status(self, job_id: str, status: JobStatus, timestamp: int, error: BaseException | None) -> None:
        """Runs on the JobMaster thread at every status change; a failover (RESTARTING) or
        the job's failure brings the error (FAILING and FAILED bring the same one)."""
        if error is None or error is self._last_error:
            return
        self._last_error = error
        entry = ExceptionEntry(
            timestamp,
            type(error.__cause__ or error).__qualname__,
            "".join(traceback.format_exception(error)),
        )
        with self._notify:
            self._exceptions.appendleft(entry)

    def exceptions(self) -> list[ExceptionEntry]:
        """Newest first."""
        with self._notify:
            return list(self._exceptions)


class Dispatcher:
    """Every job one environment ran or runs, in submission order (thread-safe)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._jobs: dict[str, DispatchedJob] = {}

    def submit(self, job_master: JobMaster) -> DispatchedJob:
        """Register a job before it starts (its status listener must see every change)."""
        job = DispatchedJob(job_master, self._condition)
        with self._condition:
            self._jobs[job.job_id] = job
        return job

    def job(self, job_id: str) -> DispatchedJob | None:
        with self._condition:
            return self._jobs.get(job_id)

    def jobs(self) -> list[DispatchedJob]:
        with self._condition:
            return list(self._jobs.values())

    # ------------------------------------------------------------------ savepoint triggers

    def add_trigger(self, job: DispatchedJob, future: Future[str], trigger_id: str | None = None) -> str:
        """Remember a savepoint or stop a client triggered; its id (``trigger_id`` if the
        client chose one, as Flink's ``triggerId`` lets it, else a new one)."""
        trigger_id = trigger_id or secrets.token_hex(16)
        with self._condition:
            job.triggers[trigger_id] = SavepointTrigger(trigger_id, future)

        def done(_: Future[str]) -> None:
            with self._condition:
                self._condition.notify_all()

        future.add_done_callback(done)
        return trigger_id

    def fetch_trigger(self, job: DispatchedJob, trigger_id: str) -> SavepointTrigger | None:
        """The trigger; once its outcome is known, it counts as fetched by the client."""
        with self._condition:
            trigger = job.triggers.get(trigger_id)
            if trigger is not None and trigger.future.done() and not trigger.fetched:
                trigger.fetched = True
                self._condition.notify_all()
            return trigger

    def await_results(self, timeout_s: float) -> bool:
        """Wait until every triggered savepoint or stop has completed and a client fetched
        its outcome, at most ``timeout_s``; whether that happened."""
        deadline = time.monotonic() + timeout_s
        with self._condition:
            while True:
                pending = [
                    t.trigger_id
                    for job in self._jobs.values()
                    for t in job.triggers.values()
                    if not t.fetched
                ]
                if not pending:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning(
                        "No client fetched the outcome of savepoint trigger(s) %s within %.1f s "
                        "(chandy.rest.await-results-timeout); stopping the REST server anyway.",
                        ", ".join(pending),
                        timeout_s,
                    )
                    return False
                self._condition.wait(remaining)
