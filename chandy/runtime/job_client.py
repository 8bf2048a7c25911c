"""JobClient: a handle on a job started with ``execute_async()`` (PyFlink's ``JobClient``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from chandy.config.options import SavepointFormatType
from chandy.errors import to_raise_again
from chandy.messages.status import JobStatus
from chandy.runtime.job_master import JobMaster
from chandy.runtime.job_result import JobExecutionResult

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class JobClient:
    """Status, checkpoint statistics, cancellation and the result of a running job.

    The job runs on a thread this client owns; :meth:`get_job_execution_result`
    joins it. Queries are answered on the JobMaster's own thread, so they see a
    consistent view.
    """

    def __init__(
        self, job_master: JobMaster, on_end: Callable[[BaseException | None], None] | None = None
    ) -> None:
        """``on_end(error)`` runs on the job's thread once it ended (``error`` is ``None``
        when it finished), before :meth:`get_job_execution_result` returns."""
        self._job_master = job_master
        self._on_end = on_end
        self._result: JobExecutionResult | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chandy job {job_master.job_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._job_master.run()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever asks for the result
            self._error = exc
        finally:
            try:
                if self._on_end is not None:
                    self._on_end(self._error)
            except BaseException as exc:  # noqa: BLE001 - the end must be signalled whatever it raised
                log.warning("Cleaning up after job %s failed: %r", self._job_master.job_id, exc)
                if self._error is None:
                    self._error = exc
            finally:
                self._done.set()

    def get_job_id(self) -> str:
        """The job's id (32 hex digits), as the REST API, ``chandy list`` and the checkpoint directory name
        it."""
        return self._job_master.job_id

    def get_job_status(self, timeout: float | None = 60.0) -> JobStatus:
        """The job's status, answered by the JobMaster thread (the only one that changes
        it); once the job has ended, its terminal status at once.

        The JobMaster may hold its thread for a while (Spark starting the slots of a
        deployment, cancelled tasks stopping), hence the generous ``timeout``."""
        execution_graph = self._job_master.execution_graph
        return self._ask(lambda: execution_graph.state, timeout)

    def cancel(self) -> None:
        """Cancel the job; :meth:`get_job_execution_result` then raises ``JobCancelledError``."""
        if not self._done.is_set():
            self._job_master.cancel("cancelled through the JobClient")

    def trigger_savepoint(
        self,
        savepoint_directory: str | None = None,
        format_type: SavepointFormatType = SavepointFormatType.DEFAULT,
    ) -> Future[str]:
        """Take a savepoint (PyFlink's ``trigger_savepoint``); the future gets its directory.

        The savepoint goes into a new ``savepoint-<job>-<random>`` directory under
        ``savepoint_directory`` (default: ``execution.checkpointing.savepoint-dir``; with
        neither the future fails with a ``ConfigurationError``). It is self-contained:
        move it anywhere and restore it with ``execution.state-recovery.path``. chandy
        never deletes it. The job goes on running."""
        return self._job_master.trigger_savepoint(savepoint_directory, format_type)

    def stop_with_savepoint(
        self,
        advance_to_end_of_event_time: bool = False,
        savepoint_directory: str | None = None,
        format_type: SavepointFormatType = SavepointFormatType.DEFAULT,
    ) -> Future[str]:
        """Stop the job with a savepoint (PyFlink's ``stop_with_savepoint``); the future gets
        the savepoint's directory once the job is FINISHED.

        Sources stop reading, the savepoint is taken, every two-phase-commit sink commits
        it and the tasks finish, without ending their input: restoring the savepoint
        continues the job where it stopped. ``advance_to_end_of_event_time`` (drain) emits
        MAX_WATERMARK before the savepoint, so every event-time window and timer fires
        first. If the savepoint fails the job keeps running and the future fails with
        the reason."""
        return self._job_master.stop_with_savepoint(
            advance_to_end_of_event_time, savepoint_directory, format_type
        )

    def get_job_execution_result(self, timeout: float | None = None) -> JobExecutionResult:
        """Wait for the job's end: its result, or the error it failed with."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.get_job_id()} still runs after {timeout} s")
        if self._error is not None:
            raise to_raise_again(self._error)
        assert self._result is not None
        return self._result

    def _ask(self, action: Callable[[], _T], timeout: float | None) -> _T:
        """``action``'s result from the JobMaster thread (at once if the job has ended)."""
        answer = self._job_master.call(action)
        try:
            return answer.result(timeout)
        except TimeoutError:
            if answer.done():
                raise  # the action's own error
            raise TimeoutError(
                f"the JobMaster of job {self.get_job_id()} did not answer within {timeout} s "
                "(it may be deploying tasks or waiting for cancelled ones to stop)"
            ) from None

    def get_checkpoint_statistics(self, timeout: float = 10.0) -> dict[str, Any]:
        """Flink's ``GET /jobs/:jobid/checkpoints`` body: counts, summary, latest, history."""
        coordinator = self._job_master.coordinator
        assert coordinator is not None  # every job has one (savepoints need it)
        return self._ask(coordinator.stats.to_json, timeout)

    def trigger_checkpoint(self, timeout: float = 60.0) -> int:
        """Take a checkpoint now (beside the periodic ones, if any); returns its id once complete."""
        coordinator = self._job_master.coordinator
        assert coordinator is not None  # every job has one
        future = self._ask(lambda: coordinator.trigger_checkpoint(is_periodic=False), timeout)
        return future.result(timeout).checkpoint_id

    @property
    def restarts(self) -> int:
        """How many times the job has failed over and restarted from a checkpoint so far."""
        return self._job_master.restarts

    def get_task_slots(self) -> list[dict[str, Any]]:
        """Where the job's tasks run: one entry per Spark slot (index, host, pid of the
        Python worker, pid of its executor JVM, data address); empty on the local executor."""
        return self._job_master.executor.slots()

    def is_done(self) -> bool:
        """Whether the job has ended (finished, cancelled or failed)."""
        return self._done.is_set()
