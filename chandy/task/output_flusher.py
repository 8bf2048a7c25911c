"""The output flusher: what a busy task produced leaves within the buffer timeout.

Flink sends a record at the latest ``execution.buffer-timeout`` (100 ms by default) after it
was produced, however long its task stays busy: each record writer has an ``OutputFlusher``
thread that flushes the writer's partly filled buffers every timeout, and Flink's buffers are
built for that (the flush only publishes what the task thread already wrote, thread-safely).

chandy batches the same way, and a task thread sends what is due itself whenever it can look:
before it sleeps (idle), after every input batch, and between the chunks of a slow batch
(:mod:`chandy.task.chunked_input`). It cannot look while it is inside one long call, a user
function taking seconds for one record, or a batch function for one batch; so, as in Flink, a
thread of its own does then. One :class:`OutputFlusher` per task (not per writer, as Flink has
it: Python threads cost more) wakes when the oldest pending record of any of the task's
writers is due, and sends every buffer that has waited long enough
(:meth:`RecordWriter.flush_if_waited`), under the writer's lock.

The alternatives were weighed against the hot path and the guarantee:

* a flush by mail, or a check in the emit path, costs no thread, but runs only when the task
  thread returns from the operators: useless inside one long call, which is the case that
  needs it;
* a thread that asks the task thread to flush (a flag) has the same hole;
* so the flusher sends, itself. That makes the writer shared by two threads; its lock is
  taken once per emitted batch (about 50 ns per 1,024 records, not measurable), and the
  flusher never waits: not for the lock (if the task thread holds it, it is sending anyway),
  nor for credit (a channel without credit keeps its buffer; under backpressure nothing
  leaves sooner in Flink either). It never touches the task's wakeup, which has one waiter.

The deadline is split in two halves: a chunk of a slow batch is expected to take at most half
the timeout, and a record waits in its writer at most the other half (``max_wait_ns``), so a
record produced anywhere in a chunk leaves within the timeout. The thread wakes at the next
deadline, at least every ``max_wait_ns`` (50 ms by default: 20 wakeups a second per task, a
few microseconds each). A timeout of 0 needs no thread: the task thread flushes after every
record; nor does -1, which flushes only full batches.

If a send fails on the flusher's thread (the consumer is gone, a record cannot be encoded),
the flusher stops and hands the error to its ``on_failure`` (the task fails with it at its
next mail) and keeps it as :attr:`OutputFlusher.failure` for the task to raise when it stops
the flusher, before it would send the end of its partitions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from chandy.task.record_writer import RecordWriter

log = logging.getLogger(__name__)

#: After a flush that could not send everything due (the lock was busy, a channel had no
#: credit), the next try comes after this share of ``max_wait_ns``: soon, but without spinning
#: while the task thread is backpressured.
RETRY_SHARE = 5


class OutputFlusher:
    """Sends what a task's writers held ``max_wait_ns`` or longer; a thread the task owns."""

    def __init__(
        self,
        writers: Sequence[RecordWriter],
        max_wait_ns: int,
        now_ns: Callable[[], int],
        name: str,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        if max_wait_ns <= 0:
            raise ValueError(f"an output flusher needs a positive wait, got {max_wait_ns} ns")
        self._writers = list(writers)
        self._max_wait_ns = max_wait_ns
        self._now_ns = now_ns
        self._name = name
        self._on_failure = on_failure
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        #: What made the flusher stop early (a failed send), for the task to raise.
        self.failure: BaseException | None = None

    def flush_due(self) -> int:
        """Send every writer's buffers if its oldest record waited ``max_wait_ns``; return the
        nanoseconds until the next record falls due (``max_wait_ns`` when nothing is pending)."""
        max_wait = self._max_wait_ns
        now = self._now_ns()
        wait = max_wait
        for writer in self._writers:
            since = writer.pending_since_ns
            if not since:
                continue
            waited = now - since
            if waited < max_wait:
                wait = min(wait, max_wait - waited)
            elif not writer.flush_if_waited(now, max_wait):
                wait = min(wait, max_wait // RETRY_SHARE)
        return max(wait, 1)

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is not None:
            raise RuntimeError(f"the output flusher of {self._name} was started already")
        self._thread = threading.Thread(target=self._run, name=f"OutputFlusher for {self._name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it: it is in no flush once this returns."""
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        wait_ns = self._max_wait_ns
        while not self._stopped.wait(wait_ns / 1e9):
            try:
                wait_ns = self.flush_due()
            except BaseException as exc:  # noqa: BLE001 - handed to the task, which fails with it
                log.debug("the output flusher of %s stops: %r", self._name, exc)
                self.failure = exc
                if self._on_failure is not None:
                    self._on_failure(exc)
                return
