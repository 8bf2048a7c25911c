"""WatermarkStrategy and TimestampAssigner: how a stream gets event time (PyFlink's names).

A strategy says where each record's timestamp comes from (a
:class:`TimestampAssigner`, or the timestamp the record already carries) and how
watermarks follow the timestamps. The built-in generators are the ones PyFlink
offers (monotonous, bounded out-of-orderness, none); they observe a whole
batch of timestamps at a time (one ``max()`` in C per batch instead of a Python
call per record), and are asked for a watermark every
``pipeline.auto-watermark-interval`` milliseconds.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from chandy.core.time import MIN_TIMESTAMP, Duration, to_millis


class TimestampAssigner(abc.ABC):
    """Assigns an event timestamp (milliseconds since the epoch) to each record."""

    @abc.abstractmethod
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        """The timestamp of ``value``; ``record_timestamp`` is the one it carries already,
        or the smallest int (``MIN_TIMESTAMP``) when it carries none."""


class WatermarkGenerator:
    """Follows the timestamps a source subtask emits and says what watermark they allow.

    ``on_timestamps`` sees every batch's timestamps (never empty, never ``None`` items);
    ``current_watermark`` is asked periodically. The watermark emitted is only
    forwarded when it advances, so a generator may return the same value again.
    """

    __slots__ = ("_max_timestamp", "_delay")

    def __init__(self, out_of_orderness_ms: int) -> None:
        self._delay = out_of_orderness_ms
        #: Starts so low that the first watermark, before any record, is MIN_TIMESTAMP.
        self._max_timestamp = MIN_TIMESTAMP + out_of_orderness_ms + 1

    def on_timestamps(self, timestamps: list[int]) -> None:
        """Called with the timestamps of each batch a subtask emits, so the next watermark can follow the
        largest seen."""
        top = max(timestamps)
        self._max_timestamp = max(self._max_timestamp, top)

    def current_watermark(self) -> int:
        """Flink's bounded out-of-orderness rule: everything up to ``max - delay - 1`` is complete."""
        return self._max_timestamp - self._delay - 1


class NoWatermarksGenerator(WatermarkGenerator):
    """Never emits a watermark (pure processing-time jobs)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(0)

    def on_timestamps(self, timestamps: list[int]) -> None:
        return None

    def current_watermark(self) -> int:
        return MIN_TIMESTAMP


class WatermarkStrategy:
    """Builds the timestamp assigner and the watermark generator of a stream.

    Use the factory methods (``for_monotonous_timestamps()``,
    ``for_bounded_out_of_orderness(Duration)``, ``no_watermarks()``) and enrich the
    result with ``with_timestamp_assigner`` and ``with_idleness``. Each ``with_*``
    returns the strategy itself, as PyFlink's do.
    """

    def __init__(self, out_of_orderness_ms: int | None) -> None:
        #: ``None``: no watermarks at all.
        self._out_of_orderness_ms = out_of_orderness_ms
        self._timestamp_assigner: TimestampAssigner | Callable[[Any, int], int] | None = None
        self._idle_timeout_ms: int | None = None
        self._timestamp_column: str | None = None

    @staticmethod
    def for_monotonous_timestamps() -> WatermarkStrategy:
        """Timestamps only grow: the watermark follows the latest one."""
        return WatermarkStrategy(0)

    @staticmethod
    def for_bounded_out_of_orderness(max_out_of_orderness: Duration | int) -> WatermarkStrategy:
        """A record is at most ``max_out_of_orderness`` older than the newest seen before it."""
        delay = to_millis(max_out_of_orderness, "for_bounded_out_of_orderness(max_out_of_orderness)")
        if delay < 0:
            raise ValueError(f"max out-of-orderness must not be negative, got {delay} ms")
        return WatermarkStrategy(delay)

    @staticmethod
    def no_watermarks() -> WatermarkStrategy:
        """No watermarks (records may still get timestamps from an assigner)."""
        return WatermarkStrategy(None)

    def with_timestamp_assigner(
        self, timestamp_assigner: TimestampAssigner | Callable[[Any, int], int]
    ) -> WatermarkStrategy:
        """Take each record's timestamp from ``timestamp_assigner.extract_timestamp(value,
        record_timestamp)`` (a plain two-argument callable works too)."""
        if not isinstance(timestamp_assigner, TimestampAssigner) and not callable(timestamp_assigner):
            raise TypeError(
                "with_timestamp_assigner() takes a TimestampAssigner or a callable "
                f"(value, record_timestamp) -> int, got {type(timestamp_assigner).__name__}"
            )
        if self._timestamp_column is not None:
            raise ValueError(
                f"this strategy already reads timestamps from column {self._timestamp_column!r} "
                "(with_timestamp_column): a strategy takes a per-record timestamp assigner or a "
                "timestamp column, not both"
            )
        self._timestamp_assigner = timestamp_assigner
        return self

    def with_timestamp_column(self, column: str) -> WatermarkStrategy:
        """Take each row's timestamp from ``column`` of the Arrow batches (a chandy
        extension, for batch streams: the batch path's counterpart of a timestamp assigner,
        as Flink SQL's ``WATERMARK FOR ts`` and Spark's ``window("ts", ...)`` name a column).
        The column holds int64 milliseconds since the epoch or an Arrow timestamp; the
        watermark follows the largest value of each batch, computed in one vectorised pass.
        The stream remembers the column, so an event-time window downstream reads it."""
        if not isinstance(column, str) or not column:
            raise TypeError(
                f"with_timestamp_column() takes a column name (a non-empty string), got {column!r}"
            )
        if self._timestamp_assigner is not None:
            raise ValueError(
                "this strategy already has a per-record timestamp assigner "
                "(with_timestamp_assigner): a strategy takes a per-record timestamp assigner or a "
                "timestamp column, not both"
            )
        self._timestamp_column = column
        return self

    def with_idleness(self, idle_timeout: Duration | int) -> WatermarkStrategy:
        """Mark the source subtask idle when it emits nothing for ``idle_timeout``, so that
        it does not hold back the watermark of the operators downstream."""
        timeout = to_millis(idle_timeout, "with_idleness(idle_timeout)")
        if timeout <= 0:
            raise ValueError(f"the idle timeout must be positive, got {timeout} ms")
        self._idle_timeout_ms = timeout
        return self

    def with_watermark_alignment(self, *args: Any, **kwargs: Any) -> WatermarkStrategy:
        """Watermark alignment (pausing sources that run ahead) is not supported: a clear
        error at build time rather than a job that silently ignores it."""
        from chandy.errors import InvalidProgramError

        raise InvalidProgramError(
            "with_watermark_alignment() is not supported by chandy yet; remove it (sources "
            "are not paused when they run ahead of the others)"
        )

    # -- what the runtime uses -------------------------------------------------

    @property
    def emits_watermarks(self) -> bool:
        """Whether the strategy generates watermarks at all (``no_watermarks()`` does not)."""
        return self._out_of_orderness_ms is not None

    @property
    def idle_timeout_ms(self) -> int | None:
        """After how many milliseconds without records a source subtask is marked idle (``with_idleness``), or
        ``None``."""
        return self._idle_timeout_ms

    @property
    def timestamp_column(self) -> str | None:
        """The column of the batches holding event time (``with_timestamp_column``), or ``None``."""
        return self._timestamp_column

    def create_timestamp_extractor(self) -> Callable[[Any, int], int] | None:
        """The per-record ``(value, record_timestamp) -> timestamp`` call, or ``None`` to keep
        the timestamp each record carries."""
        assigner = self._timestamp_assigner
        if assigner is None:
            return None
        if isinstance(assigner, TimestampAssigner):
            return assigner.extract_timestamp
        return assigner

    def create_watermark_generator(self) -> WatermarkGenerator:
        """Called by the runtime in every subtask that assigns timestamps: a new generator that turns the
        timestamps seen into watermarks."""
        if self._out_of_orderness_ms is None:
            return NoWatermarksGenerator()
        return WatermarkGenerator(self._out_of_orderness_ms)

    def __repr__(self) -> str:
        if self._out_of_orderness_ms is None:
            kind = "no_watermarks()"
        elif self._out_of_orderness_ms == 0:
            kind = "for_monotonous_timestamps()"
        else:
            kind = f"for_bounded_out_of_orderness({self._out_of_orderness_ms} ms)"
        column = (
            "" if self._timestamp_column is None else f".with_timestamp_column({self._timestamp_column!r})"
        )
        return f"WatermarkStrategy.{kind}{column}"
