"""The processing-time service of one task: callbacks at wall-clock times, run by the task thread.

Flink fires processing-time timers from a timer thread that enqueues a mail;
here the task's mailbox loop asks the service between batches whether anything
is due (one comparison per batch) and bounds its idle sleep by the next due
time. Callbacks therefore run on the task thread, never concurrently with
records, and no extra thread exists. The clock is injectable: tests drive a
:class:`~chandy.util.clock.ManualClock` and call :meth:`fire_due`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

from chandy.util.clock import Clock, SystemClock


class ScheduledCallback:
    """A registered callback; :meth:`cancel` keeps it from running."""

    __slots__ = ("timestamp", "callback", "cancelled")

    def __init__(self, timestamp: int, callback: Callable[[int], None]) -> None:
        self.timestamp = timestamp
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ProcessingTimeService:
    """Wall-clock callbacks of one task (Flink's ``ProcessingTimeService``)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._heap: list[tuple[int, int, ScheduledCallback]] = []
        self._sequence = itertools.count()
        #: Due time of the earliest live callback, or ``None``: what the task loop checks.
        self.next_due_ms: int | None = None
        self._quiesced = False

    def get_current_processing_time(self) -> int:
        """Milliseconds since the epoch."""
        return self.clock.now_ms()

    def register_timer(self, timestamp: int, callback: Callable[[int], None]) -> ScheduledCallback:
        """Run ``callback(timestamp)`` on the task thread once processing time reaches
        ``timestamp`` (at once, at the next check, if it already has)."""
        entry = ScheduledCallback(timestamp, callback)
        if not self._quiesced:
            heapq.heappush(self._heap, (timestamp, next(self._sequence), entry))
            if self.next_due_ms is None or timestamp < self.next_due_ms:
                self.next_due_ms = timestamp
        return entry

    def fire_due(self) -> int:
        """Run every callback due now, in due order (including ones they register for now);
        returns how many ran."""
        ran = 0
        heap = self._heap
        now = self.clock.now_ms()
        while heap and heap[0][0] <= now:
            _, _, entry = heapq.heappop(heap)
            if entry.cancelled or self._quiesced:
                continue
            entry.callback(entry.timestamp)
            ran += 1
        self._update_next_due()
        return ran

    def _update_next_due(self) -> None:
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        self.next_due_ms = heap[0][0] if heap and not self._quiesced else None

    def delay_until_next_ms(self) -> float | None:
        """Milliseconds until the next callback is due (0 if overdue), ``None`` if none is."""
        due = self.next_due_ms
        if due is None:
            return None
        return max(0.0, due - self.clock.now_ms())

    def quiesce(self) -> None:
        """No callback runs any more (the task is finishing, as Flink quiesces its timer
        service: processing-time timers still pending at the end of input do not fire)."""
        self._quiesced = True
        self._heap.clear()
        self.next_due_ms = None


class ProcessingTimeTimer:
    """A :class:`chandy.util.timer.Timer` whose actions run on the task thread, through the
    task's :class:`ProcessingTimeService`.

    The barrier handler's alignment timeout uses it: the task loop fires due callbacks
    before it checks its outputs, so the timeout fires while the task is backpressured too,
    which is when aligned checkpoints take long."""

    __slots__ = ("_service",)

    def __init__(self, service: ProcessingTimeService) -> None:
        self._service = service

    def schedule(self, delay_ms: float, action: Callable[[], None]) -> ScheduledCallback:
        due = self._service.clock.now_ms() + math.ceil(max(0.0, delay_ms))
        return self._service.register_timer(due, lambda _timestamp: action())
