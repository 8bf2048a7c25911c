"""Time values of the event-time API: durations, PyFlink's ``Time``, time domains, bounds.

Timestamps and watermarks are integers: milliseconds since the epoch, as in
Flink. A record without a timestamp carries ``None``.
"""

from __future__ import annotations

import enum
from typing import Any

#: The smallest timestamp (Flink's ``Long.MIN_VALUE``): the watermark before any has arrived.
MIN_TIMESTAMP = -(2**63)
#: The largest timestamp (Flink's ``Long.MAX_VALUE``): the watermark at the end of input,
#: which fires every event-time window and timer.
MAX_WATERMARK = 2**63 - 1


class TimeDomain(enum.Enum):
    """Whether a firing timer was set in event time or in processing time (PyFlink's)."""

    EVENT_TIME = 0
    PROCESSING_TIME = 1


class Duration:
    """A span of time (PyFlink's ``Duration``), held in milliseconds."""

    __slots__ = ("_millis",)

    def __init__(self, millis: int) -> None:
        if not isinstance(millis, int) or isinstance(millis, bool):
            raise TypeError(f"a Duration is a whole number of milliseconds, got {millis!r}")
        self._millis = millis

    @staticmethod
    def of_millis(millis: int) -> Duration:
        """A duration of ``millis`` milliseconds."""
        return Duration(int(millis))

    @staticmethod
    def of_seconds(seconds: int) -> Duration:
        """A duration of ``seconds`` seconds."""
        return Duration(int(seconds * 1000))

    @staticmethod
    def of_minutes(minutes: int) -> Duration:
        """A duration of ``minutes`` minutes."""
        return Duration(int(minutes * 60_000))

    @staticmethod
    def of_hours(hours: int) -> Duration:
        """A duration of ``hours`` hours."""
        return Duration(int(hours * 3_600_000))

    @staticmethod
    def of_days(days: int) -> Duration:
        """A duration of ``days`` days."""
        return Duration(int(days * 86_400_000))

    @staticmethod
    def of_nanos(nanos: int) -> Duration:
        """A duration of ``nanos`` nanoseconds (kept in milliseconds, as every time in chandy is)."""
        return Duration(int(nanos // 1_000_000))

    def to_milliseconds(self) -> int:
        """The duration in milliseconds."""
        return self._millis

    def to_millis(self) -> int:
        """The duration in milliseconds (PyFlink's name)."""
        return self._millis

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and other._millis == self._millis

    def __hash__(self) -> int:
        return hash(self._millis)

    def __repr__(self) -> str:
        return f"Duration.of_millis({self._millis})"


class Time:
    """A span of time for window sizes (PyFlink's ``Time``), held in milliseconds."""

    __slots__ = ("_millis",)

    def __init__(self, milliseconds: int) -> None:
        self._millis = int(milliseconds)

    def to_milliseconds(self) -> int:
        """The span in milliseconds."""
        return self._millis

    @staticmethod
    def milliseconds(milliseconds: int) -> Time:
        """A time span of ``milliseconds`` milliseconds."""
        return Time(milliseconds)

    @staticmethod
    def seconds(seconds: int) -> Time:
        """A time span of ``seconds`` seconds."""
        return Time(seconds * 1000)

    @staticmethod
    def minutes(minutes: int) -> Time:
        """A time span of ``minutes`` minutes."""
        return Time(minutes * 60_000)

    @staticmethod
    def hours(hours: int) -> Time:
        """A time span of ``hours`` hours."""
        return Time(hours * 3_600_000)

    @staticmethod
    def days(days: int) -> Time:
        """A time span of ``days`` days."""
        return Time(days * 86_400_000)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Time) and other._millis == self._millis

    def __hash__(self) -> int:
        return hash(self._millis)

    def __repr__(self) -> str:
        return f"Time.milliseconds({self._millis})"


def to_millis(value: Any, what: str) -> int:
    """Milliseconds of a :class:`Duration`, a :class:`Time` or an int (PyFlink accepts all
    three in window assigners); anything else is a clear error naming ``what``."""
    if isinstance(value, (Duration, Time)):
        return value.to_milliseconds()
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"{what} must be a Duration, a Time or milliseconds (int), got {value!r}")
