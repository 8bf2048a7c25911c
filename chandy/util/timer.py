"""Injectable timers: schedule an action after a delay, cancel it.

The checkpoint coordinator never sleeps and never starts threads: it asks a
:class:`Timer` to run an action later (the periodic trigger, a timeout
canceller, a continuation). In a running job the JobMaster's main loop is the
timer, so every action runs on the JobMaster thread. In tests
:class:`ManualTimer` runs actions only when the test advances its clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Protocol

from chandy.util.clock import ManualClock


class Cancellable(Protocol):
    def cancel(self) -> None: ...

    @property
    def cancelled(self) -> bool: ...


class Timer(Protocol):
    def schedule(self, delay_ms: float, action: Callable[[], None]) -> Cancellable:
        """Run ``action`` once, ``delay_ms`` from now, on the owner's thread."""
        ...


class ScheduledAction:
    """A scheduled action; cancelling it means it will not run."""

    __slots__ = ("due_ms", "action", "cancelled", "description")

    def __init__(self, due_ms: float, action: Callable[[], None], description: str = "") -> None:
        self.due_ms = due_ms
        self.action = action
        self.cancelled = False
        self.description = description

    def cancel(self) -> None:
        self.cancelled = True

    def __repr__(self) -> str:
        return f"ScheduledAction(due={self.due_ms}, {getattr(self.action, '__name__', self.action)})"


class TimerQueue:
    """Due actions in time order; the JobMaster loop and :class:`ManualTimer` both use it."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, ScheduledAction]] = []
        self._sequence = itertools.count()

    def push(self, entry: ScheduledAction) -> None:
        heapq.heappush(self._heap, (entry.due_ms, next(self._sequence), entry))

    def next_due_ms(self) -> float | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: float) -> ScheduledAction | None:
        due = self.next_due_ms()
        if due is None or due > now_ms:
            return None
        return heapq.heappop(self._heap)[2]

    def pending(self) -> list[ScheduledAction]:
        return [entry for _, _, entry in sorted(self._heap) if not entry.cancelled]


class ManualTimer:
    """A timer for tests: actions run when the test moves time forward or asks for them."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self._queue = TimerQueue()

    def schedule(self, delay_ms: float, action: Callable[[], None]) -> ScheduledAction:
        entry = ScheduledAction(self.clock.now_ms() + max(0.0, delay_ms), action)
        self._queue.push(entry)
        return entry

    def pending(self) -> list[ScheduledAction]:
        """Scheduled actions that have not run and were not cancelled, in due order."""
        return self._queue.pending()

    def run_due(self) -> int:
        """Run every action due now (including ones they schedule for now); returns the count."""
        ran = 0
        while (entry := self._queue.pop_due(self.clock.now_ms())) is not None:
            if not entry.cancelled:
                entry.action()
                ran += 1
        return ran

    def advance(self, ms: float) -> int:
        """Move time forward step by step, running each action at its due time."""
        target = self.clock.now_ms() + ms
        ran = self.run_due()
        while True:
            due = self._queue.next_due_ms()
            if due is None or due > target:
                break
            self.clock.advance_ms(due - self.clock.now_ms())
            ran += self.run_due()
        self.clock.advance_ms(target - self.clock.now_ms())
        return ran + self.run_due()

    def run_all_pending(self) -> int:
        """Run everything scheduled now, whatever its due time (time does not move)."""
        ran = 0
        for entry in self._queue.pending():
            if not entry.cancelled:
                entry.cancel()
                entry.action()
                ran += 1
        return ran
