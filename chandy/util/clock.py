"""Injectable time.

Coordinator, barrier and task logic never call :mod:`time` directly; they take a
:class:`Clock`. Production code gets :class:`SystemClock`; tests get
:class:`ManualClock` and drive every timeout and interval by hand, without sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """Where the time comes from."""

    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (what timestamps and stats show)."""
        ...

    def monotonic_ns(self) -> int:
        """Monotonic nanoseconds (what durations are measured with)."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()


class ManualClock:
    """A clock that only moves when a test tells it to."""

    def __init__(self, start_ms: int = 1_000_000) -> None:
        self._ns = start_ms * 1_000_000

    def now_ms(self) -> int:
        return self._ns // 1_000_000

    def monotonic_ns(self) -> int:
        return self._ns

    def advance_ms(self, ms: float) -> None:
        """Move time forward by ``ms`` milliseconds."""
        if ms < 0:
            raise ValueError("time only moves forward")
        self._ns += int(ms * 1_000_000)


def monotonic_ns_of(clock: Clock) -> Callable[[], int]:
    """``clock.monotonic_ns`` as a plain callable for hot loops: the builtin itself for the
    system clock (a method call in between costs about as much as the clock read)."""
    return time.monotonic_ns if type(clock) is SystemClock else clock.monotonic_ns
