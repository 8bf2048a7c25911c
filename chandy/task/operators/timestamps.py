"""Where event time starts: timestamp assignment and periodic watermark generation.

Both the source operator (``from_source(source, watermark_strategy, name)``) and
``assign_timestamps_and_watermarks(strategy)`` put a :class:`WatermarkEmitter`
in front of their output. Per batch it computes the timestamps (one call of the
user's assigner per record, the only per-record cost) and shows them to the
watermark generator in one call; every ``pipeline.auto-watermark-interval`` a
processing-time callback on the task thread asks the generator for a watermark
and forwards it if it advanced. Idleness (``with_idleness``): when no record
came for the idle timeout, the output is marked idle (downstream leaves it out
of the watermark minimum) until the next record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chandy.core.time import MAX_WATERMARK, MIN_TIMESTAMP
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.errors import BatchColumnError, BatchTypeError, BatchValueError
from chandy.task.batches import TimestampedBatch
from chandy.task.operators.base import StreamOperator
from chandy.task.processing_time import ProcessingTimeService


class WatermarkEmitter:
    """Timestamps and watermarks for one operator's output (Flink's ``SourceOutputWithWatermarks``
    and ``TimestampsAndWatermarksOperator`` in one)."""

    def __init__(
        self,
        strategy: WatermarkStrategy,
        interval_ms: int,
        timers: ProcessingTimeService,
        emit_watermark: Callable[[int], None],
        emit_status: Callable[[bool], None],
    ) -> None:
        self._extract = strategy.create_timestamp_extractor()
        self._timestamp_column = strategy.timestamp_column
        self._generator = strategy.create_watermark_generator()
        self._emits_watermarks = strategy.emits_watermarks
        self._idle_timeout = strategy.idle_timeout_ms
        self._interval = interval_ms
        self._timers = timers
        self._emit_watermark = emit_watermark
        self._emit_status = emit_status
        self.last_watermark = MIN_TIMESTAMP
        self.idle = False
        self._last_record_ms = timers.get_current_processing_time()
        self._stopped = False

    def start(self) -> None:
        """Begin the periodic watermark callbacks (after the operator opened)."""
        if self._emits_watermarks and self._interval > 0:
            self._timers.register_timer(
                self._timers.get_current_processing_time() + self._interval, self._on_periodic
            )

    def assign(self, batch: Any) -> TimestampedBatch:
        """The batch with its records' timestamps; marks the output active again if it was idle."""
        if type(batch) is list:
            values: list[Any] = batch
            carried: list[int | None] | None = None
        else:
            values, carried = batch.values, batch.timestamps
        extract = self._extract
        if extract is not None:
            if carried is None:
                timestamps: list[int | None] = [extract(v, MIN_TIMESTAMP) for v in values]
            else:
                timestamps = [
                    extract(v, MIN_TIMESTAMP if t is None else t)
                    for v, t in zip(values, carried, strict=True)
                ]
        else:
            timestamps = carried if carried is not None else [None] * len(values)
        if values:
            known = timestamps if extract is not None else [t for t in timestamps if t is not None]
            self._saw_records(known)  # type: ignore[arg-type]
        return TimestampedBatch(values, timestamps)

    def assign_columnar(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A record batch under a strategy with a timestamp column: the batch itself (its
        column is its timestamps); the generator sees the column's largest value only, one
        vectorised pass, which is all a bounded out-of-orderness generator keeps of a batch."""
        if batch.num_rows:
            assert self._timestamp_column is not None
            timestamps = batch_timestamps(batch, self._timestamp_column, "the watermark strategy")
            self._saw_records([int(timestamps.max())])
        return batch

    def _saw_records(self, timestamps: list[int]) -> None:
        """Records went out (with these timestamps): the output is active, the generator follows."""
        if self._idle_timeout is not None:
            self._last_record_ms = self._timers.get_current_processing_time()
            if self.idle:
                self.idle = False
                self._emit_status(False)
        if timestamps:
            self._generator.on_timestamps(timestamps)

    def _on_periodic(self, due: int) -> None:
        if self._stopped:
            return
        now = self._timers.get_current_processing_time()
        if (
            self._idle_timeout is not None
            and not self.idle
            and now - self._last_record_ms >= self._idle_timeout
        ):
            self.idle = True
            self._emit_status(True)
        if not self.idle:
            self.emit(self._generator.current_watermark())
        self._timers.register_timer(now + self._interval, self._on_periodic)

    def emit(self, watermark: int) -> None:
        """Forward ``watermark`` if it advances (an idle output becomes active first, as Flink's
        ``WatermarkToDataOutput`` does)."""
        if watermark <= self.last_watermark:
            return
        if self.idle:
            self.idle = False
            self._emit_status(False)
        self.last_watermark = watermark
        self._emit_watermark(watermark)

    def end_of_input(self) -> None:
        """Input ended: MAX_WATERMARK fires every event-time window and timer downstream."""
        self._stopped = True
        self.emit(MAX_WATERMARK)

    def stop(self) -> None:
        """No periodic watermark any more (a stop-with-savepoint without drain: event time
        must not advance past what the savepoint recorded)."""
        self._stopped = True


def batch_timestamps(batch: pa.RecordBatch, column: str, reader: str) -> np.ndarray:
    """The event timestamps of ``batch``'s rows from ``column`` (``with_timestamp_column``),
    as int64 epoch milliseconds: an integer column as is, an Arrow timestamp converted from
    its unit. ``reader`` (who reads it) goes into the error of a missing column, of a column
    of another type, and of a null timestamp, each naming the column and the way out."""
    index = batch.schema.get_field_index(column)
    if index < 0:
        raise BatchColumnError(
            f"{reader} reads event time from column {column!r} (with_timestamp_column), but the "
            f"batch has no such column; its columns are {batch.schema.names}. Keep the column in "
            "map_batches, or name the right one in with_timestamp_column()"
        )
    values = batch.column(index)
    kind = values.type
    if values.null_count:
        raise BatchValueError(
            f"{reader}: the event-time column {column!r} has {values.null_count} null value(s); "
            "every row needs a timestamp: fill or filter them out in map_batches before"
        )
    if pa.types.is_timestamp(kind):
        if kind.unit != "ms":
            values = pc.cast(values, pa.timestamp("ms", kind.tz), safe=False)  # floor to ms
        values = values.view(pa.int64())
    elif pa.types.is_integer(kind):
        if kind != pa.int64():
            values = values.cast(pa.int64())
    else:
        raise BatchTypeError(
            f"{reader}: the event-time column {column!r} is {kind}; it must hold int64 epoch "
            "milliseconds or an Arrow timestamp: cast it in map_batches (e.g. "
            "pc.cast(batch['ts'], pa.timestamp('ms')))"
        )
    result: np.ndarray = values.to_numpy(zero_copy_only=False)
    return result


def auto_watermark_interval(operator: StreamOperator) -> int:
    """``pipeline.auto-watermark-interval`` of the job the operator runs in (milliseconds)."""
    from chandy.config import Configuration
    from chandy.config.options import PipelineOptions

    assert operator.runtime_context is not None
    option = PipelineOptions.AUTO_WATERMARK_INTERVAL
    value = operator.runtime_context.get_job_parameter(option.key)
    return Configuration({} if value is None else {option.key: value}).get(option)


class TimestampsAndWatermarksOperator(StreamOperator):
    """``DataStream.assign_timestamps_and_watermarks(strategy)``.

    Like Flink's, it replaces event time: watermarks and idleness from upstream are
    dropped, except the end-of-input watermark, which passes so that a bounded job
    still fires everything downstream.
    """

    def __init__(self, strategy: WatermarkStrategy) -> None:
        super().__init__()
        self.strategy = strategy
        self._emitter: WatermarkEmitter | None = None

    def open(self) -> None:
        assert self.processing_time_service is not None
        self._emitter = WatermarkEmitter(
            self.strategy,
            auto_watermark_interval(self),
            self.processing_time_service,
            self.emit_watermark,
            self.emit_watermark_status,
        )
        self._emitter.start()

    def process_batch(self, records: Any) -> None:
        assert self._emitter is not None
        self.output(self._emitter.assign(records))

    def process_watermark(self, timestamp: int) -> None:
        if timestamp == MAX_WATERMARK and self._emitter is not None:
            self._emitter.end_of_input()

    def process_watermark_status(self, idle: bool) -> None:
        return None

    def end_input(self) -> None:
        if self._emitter is not None:
            self._emitter.end_of_input()


class ColumnarTimestampsAndWatermarksOperator(TimestampsAndWatermarksOperator):
    """``BatchStream.assign_timestamps_and_watermarks(strategy)`` (a strategy with a
    timestamp column): the batches pass unchanged; watermarks follow the column."""

    def process_batch(self, records: Any) -> None:
        assert self._emitter is not None
        self.output(self._emitter.assign_columnar(records))
