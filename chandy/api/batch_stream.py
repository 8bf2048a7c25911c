"""BatchStream and KeyedBatchStream: the vectorised (Arrow) half of the pipeline-building API.

A :class:`BatchStream` stands for a node whose output is ``pyarrow.RecordBatch``es rather than
lists of records (``StreamNode.columnar``): its operators run numpy / pyarrow.compute over
whole columns, so the interpreter is paid per batch, not per record. It sits beside
:class:`~chandy.api.datastream.DataStream`, not under it: a batch stream has no ``map`` or
``process`` (their functions take one record), and a record operator never receives a batch.
``DataStream.to_batches()`` and :meth:`BatchStream.to_records` cross between the two, so one
job may mix both; keys hash the same way on either path, so a key lands on one subtask
whichever path keyed it.

The names follow PySpark's batch APIs where they exist (``map_batches`` is ``mapInArrow``'s
shape, ``process_batches`` that of ``applyInPandasWithState``), PyFlink's everywhere else
(``key_by``, ``rebalance``, ``union``, ``sink_to``, ``execute_and_collect``). See
docs/batches.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from chandy.api.datastream import (
    DataStream,
    DataStreamSink,
    KeyedStream,
    _check_function,
    _Input,
    _Stream,
)
from chandy.connectors.arrow_schema import SchemaLike, check_schema
from chandy.core.connector import Sink
from chandy.core.functions import BatchAggregateFunction, KeyedBatchFunction, KeySelector, MapBatchesFunction
from chandy.core.output_tag import OutputTag
from chandy.core.time import to_millis
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.core.windows import (
    DynamicEventTimeSessionWindows,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
)
from chandy.errors import InvalidProgramError
from chandy.state.arrow_keys import INTERNAL_COLUMNS, KEY_COLUMN
from chandy.task.arrow_partitioners import (
    ArrowBroadcastPartitioner,
    ArrowForwardPartitioner,
    ArrowKeyGroupPartitioner,
    ArrowRebalancePartitioner,
    ArrowRescalePartitioner,
    ArrowShufflePartitioner,
)
from chandy.task.operators.base import StreamOperator
from chandy.task.operators.batch import (
    BatchesToRecordsOperator,
    KeyedBatchAggregateOperator,
    KeyedBatchProcessOperator,
    MapBatchesOperator,
)
from chandy.task.operators.batch_session_window import SESSION_COLUMNS, BatchSessionWindowOperator
from chandy.task.operators.batch_window import (
    BatchWindowOperator,
    BuiltinWindowAggregation,
    UserWindowAggregation,
    WindowAggregation,
)
from chandy.task.operators.timestamps import ColumnarTimestampsAndWatermarksOperator
from chandy.task.partitioners import StreamPartitioner

if TYPE_CHECKING:
    from chandy.api.environment import StreamExecutionEnvironment
    from chandy.runtime.collect import CollectIterator


#: The batch counterpart of a record method, where there is one (docs/batches.md's table).
_BATCH_COUNTERPARTS = {
    "map": "map_batches(fn)",
    "flat_map": "map_batches(fn)",
    "filter": "map_batches(fn) (return batch.filter(mask))",
    "process": "map_batches(fn)",
    "add_sink": "sink_to(batch_sink)",
}
_KEYED_BATCH_COUNTERPARTS = {
    **_BATCH_COUNTERPARTS,
    "process": "process_batches(fn, state_schema)",
    "reduce": "sum / count / min / max / mean (per batch) or process_batches(fn, state_schema)",
}


#: A record sink's batch twin, by the record sink's class name (docs/batches.md, Connectors).
_BATCH_SINK_TWINS = {
    "FileSink": (
        "its batch twin FileSink.for_bulk_format(path, ParquetBulkWriters.for_record_batches()).build()"
    ),
    "DeltaSink": "its batch twin DeltaSink.for_record_batches(table_uri, schema=None)",
    "KafkaSink": (
        "its batch twin, a KafkaSink built with "
        "set_record_serializer(KafkaRecordBatchSerializationSchema(topic, ...))"
    ),
}


def _record_method_error(stream: BatchStream, name: str) -> AttributeError:
    """The AttributeError for ``name`` on a batch stream: with the batch way when ``name``
    is a record stream's method, so a port from the record API is not left guessing."""
    keyed = isinstance(stream, KeyedBatchStream)
    record_class = KeyedStream if keyed else DataStream
    plain = f"'{type(stream).__name__}' object has no attribute '{name}'"
    if name.startswith("_") or not hasattr(record_class, name):
        return AttributeError(plain)
    counterpart = (_KEYED_BATCH_COUNTERPARTS if keyed else _BATCH_COUNTERPARTS).get(name)
    records = "to_records().key_by(...)" if keyed and name in vars(KeyedStream) else "to_records()"
    return AttributeError(
        f"{plain}: '{name}' is a record method ({record_class.__name__}.{name}), and a "
        f"{type(stream).__name__} carries Arrow batches: "
        + (f"use {counterpart}, or " if counterpart else "")
        + f"convert with {records}.{name}(...) (see docs/batches.md)"
    )


def _check_column(column: Any, operation: str) -> str:
    if not isinstance(column, str) or not column:
        raise InvalidProgramError(
            f"{operation}() takes the name of a column of the batches (a non-empty string), got {column!r}"
        )
    if column in INTERNAL_COLUMNS:
        raise InvalidProgramError(f"{operation}(): {column!r} is an internal column of chandy's")
    return column


def _optional_column(column: Any, operation: str) -> str | None:
    return None if column is None else _check_column(column, operation)


class BatchStream(_Stream):
    """A stream of Arrow record batches (the batch path; see the module's docstring)."""

    if not TYPE_CHECKING:  # hidden from mypy, which would then accept any attribute

        def __getattr__(self, name: str) -> Any:
            # Only for names normal lookup did not find: a record method gets a hint.
            raise _record_method_error(self, name)

    # ------------------------------------------------------------ operators

    def _batch_operator(
        self,
        name: str,
        factory: Callable[[], StreamOperator],
        *,
        keyed: bool = False,
        timestamp_column: str | None = None,
    ) -> BatchStream:
        node = self._add_operator(name, factory, keyed=keyed, columnar=True)
        node.timestamp_column = timestamp_column
        return BatchStream._of(self._env, node)

    def _timestamp_column(self) -> str | None:
        """The column holding this stream's event time (``with_timestamp_column`` at its source
        or ``assign_timestamps_and_watermarks``, kept through ``map_batches`` and partitionings;
        a union has one when all its inputs name the same; a window's late side output keeps
        its input's), else ``None``."""
        columns = {
            node.timestamp_column if tag is None else node.side_output_timestamp_columns.get(tag)
            for node, _, tag in self._inputs
        }
        return columns.pop() if len(columns) == 1 else None

    def assign_timestamps_and_watermarks(self, watermark_strategy: WatermarkStrategy) -> BatchStream:
        """Take event time from a column of the batches and generate watermarks from it
        (replacing any event time the stream had): ``watermark_strategy`` names the column
        with ``with_timestamp_column("ts")`` (int64 epoch milliseconds or an Arrow timestamp).
        Prefer the strategy on ``from_source``, which keeps per-source-subtask watermarks."""
        if not isinstance(watermark_strategy, WatermarkStrategy):
            raise InvalidProgramError(
                "assign_timestamps_and_watermarks() takes a WatermarkStrategy, got "
                f"{type(watermark_strategy).__name__}"
            )
        column = watermark_strategy.timestamp_column
        if column is None or watermark_strategy.create_timestamp_extractor() is not None:
            raise InvalidProgramError(
                f"a BatchStream's assign_timestamps_and_watermarks() takes a strategy that names the "
                f"batches' event-time column, got {watermark_strategy!r}: add "
                ".with_timestamp_column('ts') (a per-record TimestampAssigner is never called on "
                "the batch path)"
            )
        stream = self._batch_operator(
            "Timestamps/Watermarks",
            functools.partial(ColumnarTimestampsAndWatermarksOperator, watermark_strategy),
            timestamp_column=_check_column(column, "with_timestamp_column"),
        )
        assert stream._node is not None
        stream._node.assigns_timestamps = True
        return stream

    def get_side_output(self, output_tag: OutputTag) -> BatchStream:
        """The rows this operator sent to the side output ``output_tag`` (a window's late rows,
        ``side_output_late_data``), as a batch stream."""
        if not isinstance(output_tag, OutputTag):
            raise InvalidProgramError(
                f"get_side_output() takes an OutputTag, got {type(output_tag).__name__}"
            )
        node = self._operator("get_side_output()")
        return BatchStream(self._env, None, [(node, None, output_tag.tag_id)])

    def map_batches(self, func: MapBatchesFunction | Callable[[pa.RecordBatch], Any]) -> BatchStream:
        """Apply ``func`` to every record batch (PySpark's ``mapInArrow``): it returns a
        ``pyarrow.RecordBatch`` or ``Table``, a dict of column name to array, a pandas
        ``DataFrame`` (with pandas installed: it is not a dependency), or ``None`` for no
        output; any number of rows and any columns. ``func`` always gets a ``RecordBatch``."""
        func = _check_function(func, MapBatchesFunction, "map_batch", "map_batches")
        return self._batch_operator(
            "MapBatches",
            functools.partial(MapBatchesOperator, func),
            timestamp_column=self._timestamp_column(),  # the rows' event time, if func keeps the column
        )

    def to_records(self) -> DataStream:
        """Back to the record path: one ``Row`` per row of each batch, with the columns as
        named fields (``row.total`` or ``row[1]``), for the record API's operators. On a
        stream with event time (``with_timestamp_column``) every record carries its row's
        timestamp, for the record path's event-time windows and timers."""
        column = self._timestamp_column()
        node = self._add_operator("Batches to Records", functools.partial(BatchesToRecordsOperator, column))
        node.assigns_timestamps = column is not None
        return DataStream._of(self._env, node)

    # ------------------------------------------------------------ partitioning

    def _repartition(self, partitioner: StreamPartitioner) -> BatchStream:
        return BatchStream(self._env, None, [(node, partitioner, tag) for node, _, tag in self._inputs])

    def key_by(self, key: str | KeySelector | Callable[[pa.RecordBatch], Any]) -> KeyedBatchStream:
        """Partition by key: every row with the same key goes to the same subtask, the one the
        record path's ``key_by`` sends the same key to. ``key`` names a column, or is a
        function of the batch returning one key per row (an Arrow or numpy array)."""
        if isinstance(key, str):
            partitioner = ArrowKeyGroupPartitioner(_check_column(key, "key_by"))
            key_column = key
        else:
            key = _check_function(key, KeySelector, "get_key", "key_by")
            select = key.get_key if isinstance(key, KeySelector) else key
            partitioner = ArrowKeyGroupPartitioner(select)
            key_column = KEY_COLUMN
        return KeyedBatchStream(
            self._env, [(node, partitioner, tag) for node, _, tag in self._inputs], key_column
        )

    def rebalance(self) -> BatchStream:
        """Batches round-robin over the next operator's subtasks."""
        return self._repartition(ArrowRebalancePartitioner())

    def shuffle(self) -> BatchStream:
        """Each row to a random subtask of the next operator (the batch is split)."""
        return self._repartition(ArrowShufflePartitioner())

    def forward(self) -> BatchStream:
        """Subtask i to subtask i; the next operator must have the same parallelism."""
        return self._repartition(ArrowForwardPartitioner())

    def rescale(self) -> BatchStream:
        """Batches round-robin over a subset of the next operator's subtasks (as the record
        path's ``rescale``)."""
        return self._repartition(ArrowRescalePartitioner())

    def broadcast(self) -> BatchStream:
        """Every batch to every subtask of the next operator."""
        return self._repartition(ArrowBroadcastPartitioner())

    def union(self, *streams: BatchStream) -> BatchStream:
        """One stream with the batches of this and every other batch stream (their schemas
        may differ; the next operator sees each batch as it was)."""
        inputs: list[_Input] = list(self._inputs)
        for stream in streams:
            if not isinstance(stream, BatchStream):
                hint = (
                    ": it is a record stream; convert it with to_batches() first"
                    if isinstance(stream, DataStream)
                    else ""
                )
                raise InvalidProgramError(f"union() takes BatchStreams, got {type(stream).__name__}{hint}")
            if stream._env is not self._env:
                raise InvalidProgramError("union() of streams from different environments")
            inputs.extend(stream._inputs)
        return BatchStream(self._env, None, inputs)

    # ------------------------------------------------------------ sinks

    def sink_to(self, sink: Sink) -> DataStreamSink:
        """Write the batches to a batch sink (``sink.columnar``: its writer takes whole
        record batches). A record sink goes after ``to_records()``."""
        if not isinstance(sink, Sink):
            raise InvalidProgramError(f"sink_to() takes a Sink, got {type(sink).__name__}")
        if not sink.columnar:
            twin = next(
                (
                    _BATCH_SINK_TWINS[c.__name__]
                    for c in type(sink).__mro__
                    if c.__name__ in _BATCH_SINK_TWINS
                ),
                "a batch sink",
            )
            raise InvalidProgramError(
                f"{type(sink).__name__} writes records, and a BatchStream carries Arrow batches: "
                f"use {twin} (see docs/batches.md), or write rows with .to_records().sink_to(sink)"
            )
        return self._sink_to(sink)

    def print(self, sink_identifier: str | None = None) -> DataStreamSink:
        """Write every row to stdout, as ``to_records().print()`` does."""
        return self.to_records().print(sink_identifier)

    def execute_and_collect(
        self, job_execution_name: str | None = None, limit: int | None = None
    ) -> CollectIterator | list[Any]:
        """Run the job and return its rows (``Row``s, as ``to_records()`` makes them): an
        iterator, or with ``limit`` a list of the first ``limit``."""
        return self.to_records().execute_and_collect(job_execution_name, limit)


class KeyedBatchStream(BatchStream):
    """A batch stream partitioned by key: keyed aggregations and ``process_batches``, with
    columnar keyed state (checkpointed per key group, restored and rescaled like the record
    path's). The other batch operators (``map_batches``, ``sink_to``, ...) work as on any
    batch stream, on batches partitioned by key."""

    def __init__(self, env: StreamExecutionEnvironment, inputs: list[_Input], key_column: str) -> None:
        super().__init__(env, None, inputs)
        self._key_column = key_column

    def _keyed_aggregate(self, name: str, function: str, column: str | None, running: bool) -> BatchStream:
        return self._batch_operator(
            name,
            functools.partial(KeyedBatchAggregateOperator, function, column, running, self._key_column),
            keyed=True,
        )

    # One row per distinct key of each batch, with the key's aggregate after that batch.

    def sum(self, column: str) -> BatchStream:
        """Per batch, one row per key of the batch: the key and the sum of ``column`` over
        every row of that key so far (the column keeps its name).

        Porting from PyFlink: its ``KeyedStream.sum`` emits one record per input record;
        that is :meth:`running_sum` here. This one is the per-batch total per key."""
        return self._keyed_aggregate("Keyed Batch Sum", "sum", _check_column(column, "sum"), False)

    def count(self, column: str | None = None) -> BatchStream:
        """Per batch, one row per key of the batch: the key and its rows so far (a ``count``
        column); with a ``column``, its non-null values so far (still in a ``count`` column)."""
        return self._keyed_aggregate("Keyed Batch Count", "count", _optional_column(column, "count"), False)

    def min(self, column: str) -> BatchStream:
        """Per batch, one row per key of the batch: the key and the smallest ``column`` so far.

        Porting from PyFlink: its ``KeyedStream.min`` emits one record per input record;
        that is :meth:`running_min` here."""
        return self._keyed_aggregate("Keyed Batch Min", "min", _check_column(column, "min"), False)

    def max(self, column: str) -> BatchStream:
        """Per batch, one row per key of the batch: the key and the largest ``column`` so far.

        Porting from PyFlink: its ``KeyedStream.max`` emits one record per input record;
        that is :meth:`running_max` here."""
        return self._keyed_aggregate("Keyed Batch Max", "max", _check_column(column, "max"), False)

    def mean(self, column: str) -> BatchStream:
        """Per batch, one row per key of the batch: the key and the mean of ``column`` so far."""
        return self._keyed_aggregate("Keyed Batch Mean", "mean", _check_column(column, "mean"), False)

    # One row per input row, as the record path's KeyedStream.sum: the row with the aggregate.

    def running_sum(self, column: str) -> BatchStream:
        """One row per input row, ``column`` replaced by its key's sum up to and including
        that row (the record path's ``key_by(...).sum(...)``); rows come grouped by key, in
        arrival order within a key."""
        return self._keyed_aggregate(
            "Keyed Batch Running Sum", "sum", _check_column(column, "running_sum"), True
        )

    def running_count(self, column: str | None = None) -> BatchStream:
        """One row per input row, with a ``count`` column appended: the key's rows up to and
        including it (with a ``column``: its non-null values up to there)."""
        return self._keyed_aggregate(
            "Keyed Batch Running Count", "count", _optional_column(column, "running_count"), True
        )

    def running_min(self, column: str) -> BatchStream:
        """One row per input row, ``column`` replaced by its key's minimum so far."""
        return self._keyed_aggregate(
            "Keyed Batch Running Min", "min", _check_column(column, "running_min"), True
        )

    def running_max(self, column: str) -> BatchStream:
        """One row per input row, ``column`` replaced by its key's maximum so far."""
        return self._keyed_aggregate(
            "Keyed Batch Running Max", "max", _check_column(column, "running_max"), True
        )

    def running_mean(self, column: str) -> BatchStream:
        """One row per input row, ``column`` replaced by its key's mean so far."""
        return self._keyed_aggregate(
            "Keyed Batch Running Mean", "mean", _check_column(column, "running_mean"), True
        )

    def process_batches(
        self,
        func: KeyedBatchFunction | Callable[[pa.RecordBatch, Any], Any],
        state_schema: SchemaLike,
    ) -> BatchStream:
        """A vectorised keyed function with columnar state (PySpark's
        ``applyInPandasWithState``, for every key of a batch at once): ``func(batch, state)``
        gets the batch grouped by key and a :class:`~chandy.core.functions.KeyedBatchState`
        over ``state_schema``'s columns (one value per key; numbers and booleans are numpy
        columns, other types numpy arrays of objects), and returns the rows to emit, as
        ``map_batches`` functions do."""
        func = _check_function(func, KeyedBatchFunction, "process_batch", "process_batches")
        schema = check_schema(state_schema, "process_batches(state_schema)")
        return self._batch_operator(
            "Keyed Batch Process",
            functools.partial(KeyedBatchProcessOperator, func, schema, self._key_column),
            keyed=True,
        )

    # ------------------------------------------------------------ windows

    def window(self, window_assigner: WindowAssigner[Any, Any]) -> WindowedBatchStream:
        """Event-time windows of each key (``TumblingEventTimeWindows.of(...)``,
        ``SlidingEventTimeWindows.of(...)`` or ``EventTimeSessionWindows.with_gap(...)``),
        computed per batch in numpy; end it with ``sum``, ``count``, ``min``, ``max``,
        ``mean`` or ``aggregate`` (on sessions a function with ``merge``). The stream must
        carry event time: a
        watermark strategy with ``with_timestamp_column`` on its batch source or in
        ``assign_timestamps_and_watermarks``."""
        if isinstance(window_assigner, DynamicEventTimeSessionWindows):
            raise InvalidProgramError(
                f"a KeyedBatchStream's window() takes sessions of one gap "
                f"(EventTimeSessionWindows.with_gap(...)), got {window_assigner!r}; for a gap taken "
                "from each record convert with to_records().key_by(...).window(...)"
            )
        if not isinstance(
            window_assigner, (TumblingEventTimeWindows, SlidingEventTimeWindows, EventTimeSessionWindows)
        ):
            raise InvalidProgramError(
                f"a KeyedBatchStream's window() takes TumblingEventTimeWindows, "
                f"SlidingEventTimeWindows or EventTimeSessionWindows, got {window_assigner!r}; for "
                "other windows (processing time, count, global) convert with "
                "to_records().key_by(...).window(...)"
            )
        column = self._timestamp_column()
        if column is None:
            raise InvalidProgramError(
                f"window({window_assigner!r}) needs event time, and this batch stream has none: give "
                "its batch source a strategy naming the event-time column, env.from_source(source, "
                "WatermarkStrategy.for_bounded_out_of_orderness(...).with_timestamp_column('ts'), "
                "name), or call assign_timestamps_and_watermarks(...) with one before key_by()"
            )
        return WindowedBatchStream(self, window_assigner, column)


class WindowedBatchStream:
    """``KeyedBatchStream.window(assigner)``: a keyed event-time window over record batches
    (PyFlink's ``WindowedStream`` names: ``allowed_lateness``, ``side_output_late_data``,
    ``aggregate``), ended by an aggregation. Its output has one row per (key, window) fired:
    the key column (named as the key column, ``key`` for ``key_by(fn)``), ``window_start``
    and ``window_end`` (int64 epoch milliseconds, end exclusive), then the aggregate."""

    def __init__(
        self,
        keyed_stream: KeyedBatchStream,
        window_assigner: TumblingEventTimeWindows | SlidingEventTimeWindows | EventTimeSessionWindows,
        timestamp_column: str,
    ) -> None:
        self._keyed_stream = keyed_stream
        self._window_assigner = window_assigner
        self._timestamp_column = timestamp_column
        self._allowed_lateness = 0
        self._late_data_output_tag: OutputTag | None = None

    def allowed_lateness(self, time_ms: Any) -> WindowedBatchStream:
        """How long after a window's end rows may still join it (and emit it again for their
        keys); later rows are dropped, or go to ``side_output_late_data``. Milliseconds, a
        Time or a Duration; 0 by default."""
        lateness = to_millis(time_ms, "allowed_lateness")
        if lateness < 0:
            raise InvalidProgramError(f"the allowed lateness cannot be negative, got {lateness}")
        self._allowed_lateness = lateness
        return self

    def side_output_late_data(self, output_tag: OutputTag) -> WindowedBatchStream:
        """Send rows that arrive after their windows' end plus the allowed lateness to the side
        output ``output_tag``: ``result.get_side_output(output_tag)`` is a BatchStream of them."""
        if not isinstance(output_tag, OutputTag):
            raise InvalidProgramError(
                f"side_output_late_data() takes an OutputTag, got {type(output_tag).__name__}"
            )
        self._late_data_output_tag = output_tag
        return self

    def _build(self, aggregation: WindowAggregation) -> BatchStream:
        assigner = self._window_assigner
        keyed = self._keyed_stream
        factory: Callable[[], StreamOperator]
        if isinstance(assigner, EventTimeSessionWindows):
            assert isinstance(aggregation, (BuiltinWindowAggregation, UserWindowAggregation))
            factory = functools.partial(
                BatchSessionWindowOperator,
                assigner.session_gap,
                aggregation,
                keyed._key_column,
                self._timestamp_column,
                self._allowed_lateness,
                self._late_data_output_tag,
            )
        else:
            size = assigner.size
            slide = assigner.slide if isinstance(assigner, SlidingEventTimeWindows) else size
            factory = functools.partial(
                BatchWindowOperator,
                size,
                slide,
                assigner.offset,
                aggregation,
                keyed._key_column,
                self._timestamp_column,
                self._allowed_lateness,
                self._late_data_output_tag,
            )
        windowed = keyed._batch_operator(
            f"Window({assigner!r}, {aggregation.call_text})", factory, keyed=True
        )
        if self._late_data_output_tag is not None:  # the late rows are the input's, event time and all
            assert windowed._node is not None
            windowed._node.side_output_timestamp_columns[self._late_data_output_tag.tag_id] = (
                self._timestamp_column
            )
        return windowed

    def _builtin(self, function: str, column: str | None) -> BatchStream:
        return self._build(BuiltinWindowAggregation(function, column))

    def sum(self, column: str) -> BatchStream:
        """Per (key, window): the sum of ``column`` (int64 for integers, float64 for floats;
        nulls skipped, null when a window of a key has only nulls), in a column of its name."""
        return self._builtin("sum", _check_column(column, "sum"))

    def count(self, column: str | None = None) -> BatchStream:
        """Per (key, window): its rows (with a ``column``, its non-null values), in ``count``."""
        return self._builtin("count", _optional_column(column, "count"))

    def min(self, column: str) -> BatchStream:
        """Per (key, window): the smallest ``column``, in the column's type."""
        return self._builtin("min", _check_column(column, "min"))

    def max(self, column: str) -> BatchStream:
        """Per (key, window): the largest ``column``, in the column's type."""
        return self._builtin("max", _check_column(column, "max"))

    def mean(self, column: str) -> BatchStream:
        """Per (key, window): the mean of ``column`` (float64)."""
        return self._builtin("mean", _check_column(column, "mean"))

    def aggregate(
        self, aggregate_function: BatchAggregateFunction, accumulator_schema: SchemaLike
    ) -> BatchStream:
        """Per (key, window): your vectorised aggregate, a
        :class:`~chandy.core.functions.BatchAggregateFunction` whose accumulator has the
        columns of ``accumulator_schema`` (a ``pyarrow.Schema`` or a dict of name to type);
        the output columns are what its ``get_result`` returns."""
        if not isinstance(aggregate_function, BatchAggregateFunction):
            raise InvalidProgramError(
                "a WindowedBatchStream's aggregate() takes a BatchAggregateFunction (vectorised "
                f"create_accumulator / add / get_result), got {type(aggregate_function).__name__}"
            )
        schema = check_schema(accumulator_schema, "aggregate(accumulator_schema)")
        if isinstance(self._window_assigner, EventTimeSessionWindows):
            name = type(aggregate_function).__name__
            if not aggregate_function.defines_merge():
                raise InvalidProgramError(
                    f"aggregate({name}) on batch session windows needs {name}.merge(accumulator, "
                    "group_ids, groups): sessions of a key merge when a row bridges them, and so "
                    "must their accumulators; define merge (see BatchAggregateFunction.merge), or "
                    "use sum / count / min / max / mean"
                )
            taken = sorted(set(schema.names) & set(SESSION_COLUMNS))
            if taken:
                raise InvalidProgramError(
                    f"aggregate({name}) on batch session windows: accumulator column(s) {taken} "
                    f"would share a name with the session's own state columns {list(SESSION_COLUMNS)}; "
                    "rename them in accumulator_schema"
                )
        return self._build(UserWindowAggregation(aggregate_function, schema))
