"""The source operator: pulls batches from a :class:`SourceReader` on the task thread."""

from __future__ import annotations

import enum
from typing import Any

from chandy.core.connector import Source, SourceReader, SourceReaderContext
from chandy.core.state import ListStateDescriptor
from chandy.core.time import MAX_WATERMARK
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.errors import InvalidProgramError
from chandy.task.operators.base import (
    StateInitializationContext,
    StateSnapshotContext,
    StreamOperator,
)
from chandy.task.operators.timestamps import WatermarkEmitter, auto_watermark_interval


class InputStatus(enum.Enum):
    MORE_AVAILABLE = "MORE_AVAILABLE"
    NOTHING_AVAILABLE = "NOTHING_AVAILABLE"
    END_OF_INPUT = "END_OF_INPUT"


def check_columnar_watermarks(source: Source, watermark_strategy: WatermarkStrategy | None) -> None:
    """A batch source (``Source.columnar``) takes its rows' event time from a column of its
    batches (``WatermarkStrategy.with_timestamp_column``), never from a per-record assigner;
    a record source takes no timestamp column. Anything else fails here, when the job is
    built, naming the way out."""
    if watermark_strategy is None:
        return
    column = watermark_strategy.timestamp_column
    if not source.columnar:
        if column is not None:
            raise InvalidProgramError(
                f"{type(source).__name__} produces records, and {watermark_strategy!r} reads "
                f"timestamps from a column of Arrow batches: for records use "
                "with_timestamp_assigner(...), or read the source's batch counterpart"
            )
        return
    if watermark_strategy.create_timestamp_extractor() is not None:
        raise InvalidProgramError(
            f"{type(source).__name__} produces Arrow record batches, and {watermark_strategy!r} has "
            "a per-record TimestampAssigner, which the batch path never calls: name the batches' "
            "event-time column instead, with WatermarkStrategy...with_timestamp_column('ts') "
            "(int64 epoch milliseconds or an Arrow timestamp column)"
        )
    if column is None and (
        watermark_strategy.emits_watermarks or watermark_strategy.idle_timeout_ms is not None
    ):
        raise InvalidProgramError(
            f"{type(source).__name__} produces Arrow record batches, and {watermark_strategy!r} does "
            "not say where their event time is: add .with_timestamp_column('ts') naming the "
            "column (int64 epoch milliseconds or an Arrow timestamp), or use "
            "WatermarkStrategy.no_watermarks()"
        )


class SourceOperator(StreamOperator):
    """Head of a source task. ``emit_next`` is the task's default action.

    The reader's splits, with their read positions, are the operator's
    split-distribute list state: a checkpoint stores them, a restore (at any
    parallelism) deals them out again, and each reader resumes exactly where
    the checkpoint left it.
    """

    SPLITS_STATE = ListStateDescriptor("SourceReaderState")
    SHARED_STATE = ListStateDescriptor("SourceReaderSharedState")

    def __init__(self, source: Source, watermark_strategy: WatermarkStrategy | None = None) -> None:
        super().__init__()
        check_columnar_watermarks(source, watermark_strategy)
        self.source = source
        # A batch source's strategy without a timestamp column is no_watermarks() (checked
        # above): nothing to assign.
        if source.columnar and (watermark_strategy is None or watermark_strategy.timestamp_column is None):
            watermark_strategy = None
        self.watermark_strategy = watermark_strategy
        self.reader: SourceReader | None = None
        self._restored_splits: list[Any] | None = None
        self._watermarks: WatermarkEmitter | None = None

    def initialize_state(self, context: StateInitializationContext) -> None:
        self._splits_state = context.get_list_state(self.SPLITS_STATE)
        self._shared_state = context.get_union_list_state(self.SHARED_STATE)
        self._restored_shared: list[Any] | None = None
        if context.is_operator_restored():
            self._restored_splits = list(self._splits_state.get())
            self._restored_shared = list(self._shared_state.get())

    def open(self) -> None:
        ctx = self.runtime_context
        assert ctx is not None
        index = ctx.get_index_of_this_subtask()
        parallelism = ctx.get_number_of_parallel_subtasks()
        self.reader = self.source.create_reader(
            SourceReaderContext(index, parallelism, ctx.get_attempt_number())
        )
        if self._restored_shared is not None:
            self.reader.restore_shared_state(self._restored_shared)
        if self._restored_splits is not None:
            splits = self._restored_splits
        else:
            splits = self.source.create_splits(parallelism)[index::parallelism]
        self.reader.add_splits(splits)
        if self.watermark_strategy is not None:
            assert self.processing_time_service is not None
            self._watermarks = WatermarkEmitter(
                self.watermark_strategy,
                auto_watermark_interval(self),
                self.processing_time_service,
                self.emit_watermark,
                self.emit_watermark_status,
            )
            self._watermarks.start()

    def emit_next(self, max_records: int) -> InputStatus:
        """Poll the reader once and emit what it gave (with timestamps, under a strategy)."""
        assert self.reader is not None
        batch = self.reader.poll_next(max_records)
        if batch is None:
            return InputStatus.END_OF_INPUT
        if not batch:
            return InputStatus.NOTHING_AVAILABLE
        watermarks = self._watermarks
        if watermarks is None:
            self.output(batch)
        elif self.source.columnar:
            self.output(watermarks.assign_columnar(batch))
        else:
            self.output(watermarks.assign(batch))
        return InputStatus.MORE_AVAILABLE

    def end_input(self) -> None:
        """The reader ended: MAX_WATERMARK goes out first, so that every event-time window and
        timer downstream fires before the end of the stream (and before the final checkpoint)."""
        if self._watermarks is not None:
            self._watermarks.end_of_input()
        else:
            self.process_watermark(MAX_WATERMARK)

    def stop(self, drain: bool) -> None:
        """Stop-with-savepoint, before its snapshot: the task polls the reader no more. With
        ``drain`` (advance to the end of event time) MAX_WATERMARK goes out first, exactly
        as at the end of the input, so every event-time window and timer downstream fires
        before the savepoint's barrier; without it event time stays where it is and the
        pending windows are in the savepoint, to fire after the restore. The reader is not
        ended: a restore resumes it from the positions the savepoint records."""
        if drain:
            self.end_input()
        elif self._watermarks is not None:
            self._watermarks.stop()

    def snapshot_state(self, context: StateSnapshotContext) -> None:
        assert self.reader is not None
        self._splits_state.update(self.reader.snapshot_state(context.get_checkpoint_id()))
        self._shared_state.update(self.reader.snapshot_shared_state(context.get_checkpoint_id()))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.reader is not None:
            self.reader.notify_checkpoint_complete(checkpoint_id)

    @property
    def idle_wait_s(self) -> float:
        return self.reader.idle_wait_s if self.reader is not None else 0.01

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
