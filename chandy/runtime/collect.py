"""``execute_and_collect()``: results streamed from the job to the caller.

The collect sink subtasks publish batches into a bounded :class:`CollectResultQueue`;
the caller's :class:`CollectIterator` takes them out. A full queue blocks the
sink, so a slow reader slows the job instead of buffering without bound. The
job runs on the thread of a :class:`JobClient` the iterator owns; closing the
iterator (or leaving its ``with`` block) cancels the job and waits for its end.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from chandy.errors import JobCancelledError, to_raise_again
from chandy.network.cancellation import TaskCancelledError
from chandy.runtime.job_client import JobClient

log = logging.getLogger(__name__)


class CollectResultQueue:
    """Bounded hand-over of result batches from sink subtasks to the client."""

    def __init__(self, capacity_batches: int = 16) -> None:
        self._cond = threading.Condition()
        self._batches: deque[list[Any]] = deque()
        self._capacity = capacity_batches
        self._ended = False
        self._error: BaseException | None = None
        self._closed = False
        self._last_token = -1

    def publish(
        self,
        collect_id: str,
        subtask_index: int,
        batch: list[Any],
        token: int | None,
        should_abort: Callable[[], bool],
    ) -> None:
        with self._cond:
            if token is not None and token <= self._last_token:
                return  # already delivered: a restore replayed it
            while len(self._batches) >= self._capacity:
                if self._closed or should_abort():
                    raise TaskCancelledError()
                self._cond.wait(0.1)
            if self._closed:
                raise TaskCancelledError()
            self._batches.append(batch)
            if token is not None:
                self._last_token = token
            self._cond.notify_all()

    def end(self, error: BaseException | None) -> None:
        """The job ended (with ``error`` if it failed): no more batches follow."""
        with self._cond:
            self._ended = True
            self._error = error
            self._cond.notify_all()

    def take(self) -> list[Any] | None:
        """The next batch; ``None`` once the job finished and everything was taken.
        Raises the job's error when it failed."""
        with self._cond:
            while not self._batches:
                if self._ended:
                    if self._error is not None:
                        raise to_raise_again(self._error)
                    return None
                self._cond.wait()
            batch = self._batches.popleft()
            self._cond.notify_all()
            return batch

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._batches.clear()
            self._cond.notify_all()


class CollectIterator(Iterator[Any]):
    """The records of a running job, in arrival order (PyFlink's ``CloseableIterator``).

    ``job_client`` gives the job's status and checkpoint statistics while it runs.
    """

    def __init__(self, job_client: JobClient, results: CollectResultQueue) -> None:
        self.job_client = job_client
        self._results = results
        self._current: deque[Any] = deque()
        self._done = False
        self._closed = False
        self._raised: BaseException | None = None  # the job's error, once handed to the reader

    def __iter__(self) -> CollectIterator:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        while not self._current:
            if self._done:
                raise StopIteration
            try:
                batch = self._results.take()
            except JobCancelledError:
                if self._closed:
                    raise StopIteration from None
                raise
            except BaseException as exc:
                self._raised = exc
                raise
            if batch is None:
                self._done = True
                raise StopIteration
            self._current.extend(batch)
        return self._current.popleft()

    def close(self) -> None:
        """Stop the job if it still runs and wait for it to end."""
        if self._closed:
            return
        self._closed = True
        self._current.clear()
        if not self.job_client.is_done():
            self.job_client.cancel()
            self._results.close()
        try:
            self.job_client.get_job_execution_result()
        except JobCancelledError:
            pass  # what closing asked for
        except Exception as exc:  # noqa: BLE001 - the reader asked to stop: not raised again
            if exc is not self._raised:  # the reader has not seen it: say why the job ended
                log.warning("The job behind a closed collect iterator failed: %s", exc)

    def __enter__(self) -> CollectIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
