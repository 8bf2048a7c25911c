"""The tasks' asynchronous checkpoint parts, tracked so the job's end can wait for them.

On the local executor the tasks write their checkpoint state on the JobMaster's pool. A
task that is cancelled in the middle of that write finishes it (and then deletes what it
wrote) after the job is already CANCELED; if the coordinator tidied the job's directory at
that moment, the write would race the deletion and leave an aborted ``chk-N`` behind (a
directory a later run under the same job id has to skip). Flink closes such a write's
stream on cancellation; here the job's end simply waits, bounded, for the writes still
running before it tidies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class TrackedExecutor(Executor):
    """Submits to ``delegate`` and remembers what has not finished yet. The delegate
    belongs to whoever created it (its ``shutdown`` is theirs to call)."""

    def __init__(self, delegate: Executor) -> None:
        self._delegate = delegate
        self._lock = threading.Lock()
        self._running: set[Future[Any]] = set()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future = self._delegate.submit(fn, *args, **kwargs)
        with self._lock:
            self._running.add(future)
        future.add_done_callback(self._finished)
        return future

    def _finished(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.discard(future)

    def wait_for_running(self, timeout_s: float) -> int:
        """Wait until what was submitted so far has finished; how many still run after
        ``timeout_s`` (a filesystem may hang: the caller logs and goes on)."""
        with self._lock:
            running = set(self._running)
        _, not_done = futures.wait(running, timeout=timeout_s)
        return len(not_done)
