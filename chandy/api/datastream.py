"""DataStream, KeyedStream and DataStreamSink: the pipeline-building API.

A stream is a handle on one node of the environment's StreamGraph plus the
partitioning of the edge that the *next* operator will hang off it. Partitioning
calls (``key_by``, ``rebalance``, ...) and ``union`` create no node: they only
change how the next operator is connected, as in Flink.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self, overload

from chandy.core.connector import Sink, TwoPhaseCommittingSink
from chandy.core.functions import (
    FilterFunction,
    FlatMapFunction,
    Function,
    KeyedProcessFunction,
    KeySelector,
    MapFunction,
    Partitioner,
    ProcessFunction,
    ReduceFunction,
    SinkFunction,
)
from chandy.core.output_tag import OutputTag
from chandy.core.state import MapStateDescriptor
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.errors import InvalidProgramError
from chandy.graph.stream_graph import ChainingStrategy, StreamNode
from chandy.task.operators.base import StreamOperator
from chandy.task.operators.keyed import (
    FieldAggregation,
    KeyedFilter,
    KeyedFlatMap,
    KeyedMap,
    MaxByFunction,
    MaxFunction,
    MinByFunction,
    MinFunction,
    StreamGroupedReduce,
    SumFunction,
)
from chandy.task.operators.process import KeyedProcessOperator, ProcessOperator
from chandy.task.operators.sink import CollectSinkOperator, SinkFunctionOperator, SinkWriterOperator
from chandy.task.operators.timestamps import TimestampsAndWatermarksOperator
from chandy.task.operators.udf import StreamFilter, StreamFlatMap, StreamMap
from chandy.task.partitioners import (
    BroadcastPartitioner,
    CustomPartitionerWrapper,
    ForwardPartitioner,
    KeyGroupStreamPartitioner,
    RebalancePartitioner,
    RescalePartitioner,
    ShufflePartitioner,
    StreamPartitioner,
)

if TYPE_CHECKING:
    from chandy.api.batch_stream import BatchStream
    from chandy.api.broadcast_stream import BroadcastConnectedStream, BroadcastStream
    from chandy.api.connected_streams import ConnectedStreams
    from chandy.api.environment import StreamExecutionEnvironment
    from chandy.api.windowed_stream import AllWindowedStream, WindowedStream
    from chandy.connectors.arrow_schema import SchemaLike
    from chandy.core.windows import WindowAssigner
    from chandy.runtime.collect import CollectIterator

#: An input of the next operator: a node, the partitioning of the edge, and the side
#: output tag the edge carries (``None``: the node's main output).
_Input = tuple[StreamNode, StreamPartitioner | None, str | None]


def _batch_hint(stream: Any, fix: str) -> str:
    """The way out when a batch stream was passed where records are expected."""
    from chandy.api.batch_stream import BatchStream

    if isinstance(stream, BatchStream):
        return f": a BatchStream carries Arrow batches, not records; {fix}"
    return ""


def refuse_timers_without_key(func: Any, operation: str, keyed_kind: str) -> None:
    """A function on a stream that is not keyed that overrides ``on_timer``: its timers
    could never be set (they need a key), so the job would fail at its first timer, and
    restart into the same failure. Refused now, naming the function and the fix."""
    on_timer = getattr(type(func), "on_timer", None)
    if on_timer is None or not callable(on_timer):
        return
    name = type(func).__name__
    raise InvalidProgramError(
        f"{operation}: {name} defines on_timer, but this stream is not keyed and timers need a "
        f"key: call key_by(...) first and make {name} a {keyed_kind} "
        f"(ds.key_by(lambda r: <its key>).process({name}()))"
    )


def _check_function(func: Any, base: type[Function], method: str, operation: str) -> Any:
    if isinstance(func, base):
        # Function is no ABC, so a subclass that misnames its method (``map`` for
        # ``map_batch``) could be instantiated, and the inherited abstract stub returned None
        # ("no output"): the job ran and emitted nothing. Refuse it here, naming the method.
        if getattr(getattr(type(func), method, None), "__isabstractmethod__", False):
            raise InvalidProgramError(
                f"{operation}(): {type(func).__name__} does not define '{method}', the method "
                f"{base.__name__} calls; rename its method to '{method}'"
            )
        return func
    if callable(func) and not isinstance(func, Function):
        return func
    raise InvalidProgramError(
        f"{operation}() takes a {base.__name__} or a callable, got {type(func).__name__}"
        + (f" (a function class must implement '{method}')" if isinstance(func, Function) else "")
    )


class _NodeHandle:
    """Settings that apply to the operator a stream or sink stands for."""

    def __init__(self, env: StreamExecutionEnvironment, node: StreamNode | None) -> None:
        self._env = env
        self._node = node

    def _operator(self, what: str) -> StreamNode:
        if self._node is None:
            raise InvalidProgramError(
                f"{what} applies to an operator, but this stream is a partitioning or a union of "
                "streams; call it on the stream an operator (map, process, ...) returned"
            )
        return self._node

    def name(self, name: str) -> Any:
        """Name the operator (shown in plans, logs and errors)."""
        self._operator("name()").name = str(name)
        return self

    def get_name(self) -> str:
        return self._operator("get_name()").name

    def uid(self, uid: str) -> Any:
        """A stable id for the operator's state: keep it when changing the pipeline so
        that checkpoints and savepoints still restore into this operator."""
        if not isinstance(uid, str) or not uid:
            raise InvalidProgramError("uid() takes a non-empty string")
        self._operator("uid()").uid = uid
        return self

    def set_parallelism(self, parallelism: int) -> Any:
        if not isinstance(parallelism, int) or parallelism < 1:
            raise InvalidProgramError(f"parallelism must be a positive integer, got {parallelism!r}")
        self._operator("set_parallelism()").parallelism = parallelism
        return self

    def set_max_parallelism(self, max_parallelism: int) -> Any:
        if not isinstance(max_parallelism, int) or not 1 <= max_parallelism <= 32768:
            raise InvalidProgramError(
                f"max parallelism must be an integer in [1, 32768], got {max_parallelism!r}"
            )
        self._operator("set_max_parallelism()").max_parallelism = max_parallelism
        return self

    def disable_chaining(self) -> Any:
        """Run this operator in a task of its own."""
        self._operator("disable_chaining()").chaining = ChainingStrategy.NEVER
        return self

    def start_new_chain(self) -> Any:
        """Start a new chain at this operator (it may still chain with its successors)."""
        self._operator("start_new_chain()").chaining = ChainingStrategy.HEAD
        return self


class _Stream(_NodeHandle):
    """What a record stream and a batch stream share: the inputs the next operator hangs off."""

    def __init__(
        self, env: StreamExecutionEnvironment, node: StreamNode | None, inputs: list[_Input]
    ) -> None:
        super().__init__(env, node)
        self._inputs = inputs

    @classmethod
    def _of(cls, env: StreamExecutionEnvironment, node: StreamNode) -> Self:
        return cls(env, node, [(node, None, None)])

    def get_execution_environment(self) -> StreamExecutionEnvironment:
        return self._env

    def _add_operator(
        self,
        name: str,
        factory: Callable[[], StreamOperator],
        *,
        keyed: bool = False,
        is_sink: bool = False,
        output_type: Any = None,
        columnar: bool = False,
    ) -> StreamNode:
        graph = self._env._stream_graph
        node = graph.add_node(name, factory, keyed=keyed, is_sink=is_sink)
        node.output_type = output_type
        node.columnar = columnar
        for source, partitioner, tag in self._inputs:
            graph.add_edge(source, node, partitioner, tag)
        return node

    def _sink_to(self, sink: Sink) -> DataStreamSink:
        """The sink node writing to ``sink`` (checked by the caller to take this stream's items)."""
        sink.validate()
        self._env._sinks.append(sink)  # configured with the job's final configuration at execute()
        if isinstance(sink, TwoPhaseCommittingSink):
            self._env._two_phase_sinks.append(type(sink).__name__)
        node = self._add_operator(
            f"Sink: {type(sink).__name__}", functools.partial(SinkWriterOperator, sink), is_sink=True
        )
        return DataStreamSink(self._env, node)


class DataStream(_Stream):
    """A stream of records (PyFlink's ``DataStream``)."""

    # ------------------------------------------------------------ operators

    def _add_two_input_operator(
        self,
        second: list[_Input],
        name: str,
        factory: Callable[[], StreamOperator],
        *,
        keyed: bool = False,
        output_type: Any = None,
    ) -> StreamNode:
        """A node reading this stream as its first input and ``second`` as its second (the
        node's operator is a ``TwoInputStreamOperator``): what ``connect`` builds on."""
        graph = self._env._stream_graph
        node = graph.add_node(name, factory, keyed=keyed)
        node.output_type = output_type
        for type_number, inputs in ((1, self._inputs), (2, second)):
            for source, partitioner, tag in inputs:
                graph.add_edge(source, node, partitioner, tag, type_number)
        return node

    def map(self, func: MapFunction | Callable[[Any], Any], output_type: Any = None) -> DataStream:
        """One output per input record."""
        func = _check_function(func, MapFunction, "map", "map")
        return DataStream._of(
            self._env, self._add_operator("Map", functools.partial(StreamMap, func), output_type=output_type)
        )

    def flat_map(self, func: FlatMapFunction | Callable[[Any], Any], output_type: Any = None) -> DataStream:
        """Any number of outputs per input record (yield them, or return an iterable)."""
        func = _check_function(func, FlatMapFunction, "flat_map", "flat_map")
        return DataStream._of(
            self._env,
            self._add_operator("FlatMap", functools.partial(StreamFlatMap, func), output_type=output_type),
        )

    def filter(self, func: FilterFunction | Callable[[Any], bool]) -> DataStream:
        """Keep the records for which ``func`` is true."""
        func = _check_function(func, FilterFunction, "filter", "filter")
        return DataStream._of(
            self._env,
            self._add_operator(
                "Filter", functools.partial(StreamFilter, func), output_type=self._output_type()
            ),
        )

    def process(
        self, func: ProcessFunction | Callable[[Any, Any], Any], output_type: Any = None
    ) -> DataStream:
        """Apply a ProcessFunction (``process_element(value, ctx)`` yields outputs)."""
        if isinstance(func, KeyedProcessFunction):
            raise InvalidProgramError(
                f"process(): {type(func).__name__} is a KeyedProcessFunction, which needs a keyed "
                "stream (its keyed state, timers and get_current_key() are per key): call "
                f"key_by(...) first, ds.key_by(lambda r: <its key>).process({type(func).__name__}())"
            )
        func = _check_function(func, ProcessFunction, "process_element", "process")
        refuse_timers_without_key(func, "process()", "KeyedProcessFunction")
        return DataStream._of(
            self._env,
            self._add_operator("Process", functools.partial(ProcessOperator, func), output_type=output_type),
        )

    def assign_timestamps_and_watermarks(self, watermark_strategy: WatermarkStrategy) -> DataStream:
        """Give every record an event timestamp and generate watermarks from them (replacing
        any event time the stream had; prefer a strategy on ``from_source``, which keeps
        per-source watermarks)."""
        if not isinstance(watermark_strategy, WatermarkStrategy):
            raise InvalidProgramError(
                "assign_timestamps_and_watermarks() takes a WatermarkStrategy, got "
                f"{type(watermark_strategy).__name__}"
            )
        if watermark_strategy.timestamp_column is not None:
            raise InvalidProgramError(
                f"{watermark_strategy!r} reads timestamps from a column of Arrow batches, and this "
                "DataStream carries records: use with_timestamp_assigner(...) here, or call "
                "assign_timestamps_and_watermarks on a BatchStream (to_batches() first)"
            )
        node = self._add_operator(
            "Timestamps/Watermarks",
            functools.partial(TimestampsAndWatermarksOperator, watermark_strategy),
            output_type=self._output_type(),
        )
        node.assigns_timestamps = True
        return DataStream._of(self._env, node)

    def get_side_output(self, output_tag: OutputTag) -> DataStream:
        """The records this operator's function emitted as ``(output_tag, value)``."""
        if not isinstance(output_tag, OutputTag):
            raise InvalidProgramError(
                f"get_side_output() takes an OutputTag, got {type(output_tag).__name__}"
            )
        node = self._operator("get_side_output()")
        node.side_output_types[output_tag.tag_id] = output_tag.type_info
        return DataStream(self._env, None, [(node, None, output_tag.tag_id)])

    # ------------------------------------------------------------ partitioning

    def _repartition(self, partitioner: StreamPartitioner) -> DataStream:
        return DataStream(self._env, None, [(node, partitioner, tag) for node, _, tag in self._inputs])

    def key_by(self, key_selector: KeySelector | Callable[[Any], Any], key_type: Any = None) -> KeyedStream:
        """Partition by key: every record with the same key goes to the same subtask,
        where keyed state is scoped to that key."""
        key_selector = _check_function(key_selector, KeySelector, "get_key", "key_by")
        select = key_selector.get_key if isinstance(key_selector, KeySelector) else key_selector
        return KeyedStream(
            self._env, [(node, KeyGroupStreamPartitioner(select), tag) for node, _, tag in self._inputs]
        )

    def rebalance(self) -> DataStream:
        """Round-robin over the next operator's subtasks."""
        return self._repartition(RebalancePartitioner())

    def shuffle(self) -> DataStream:
        """A random subtask per record."""
        return self._repartition(ShufflePartitioner())

    @overload
    def broadcast(self) -> DataStream: ...

    @overload
    def broadcast(
        self,
        broadcast_state_descriptor: MapStateDescriptor,
        *other_broadcast_state_descriptors: MapStateDescriptor,
    ) -> BroadcastStream: ...

    def broadcast(
        self,
        broadcast_state_descriptor: MapStateDescriptor | None = None,
        *other_broadcast_state_descriptors: MapStateDescriptor,
    ) -> DataStream | BroadcastStream:
        """Every record to every subtask of the next operator. With ``MapStateDescriptor``s
        (PyFlink's overload): a :class:`BroadcastStream` to ``connect`` a stream to, whose
        operator keeps one broadcast state per descriptor."""
        stream = self._repartition(BroadcastPartitioner())
        if broadcast_state_descriptor is None and not other_broadcast_state_descriptors:
            return stream
        from chandy.api.broadcast_stream import BroadcastStream

        descriptors = [broadcast_state_descriptor, *other_broadcast_state_descriptors]
        for descriptor in descriptors:
            if not isinstance(descriptor, MapStateDescriptor):
                raise InvalidProgramError(
                    "broadcast() takes MapStateDescriptors (a broadcast state is a map), got "
                    f"{type(descriptor).__name__}"
                )
        return BroadcastStream(stream, descriptors)  # type: ignore[arg-type]

    def forward(self) -> DataStream:
        """Subtask i to subtask i; the next operator must have the same parallelism."""
        return self._repartition(ForwardPartitioner())

    def rescale(self) -> DataStream:
        """Round-robin over a subset of the next operator's subtasks (Flink's pointwise
        distribution): with parallelism 2 here and 4 there, each subtask feeds two; with 4
        here and 2 there, two subtasks feed each. Fewer connections than ``rebalance``."""
        return self._repartition(RescalePartitioner())

    def partition_custom(
        self,
        partitioner: Partitioner | Callable[[Any, int], int],
        key_selector: KeySelector | Callable[[Any], Any],
    ) -> DataStream:
        """Send each record to the subtask ``partitioner.partition(key, num_partitions)``
        chooses for its key (``key_selector``); ``num_partitions`` is the next operator's
        parallelism. Unlike ``key_by`` the stream is not keyed afterwards."""
        partitioner = _check_function(partitioner, Partitioner, "partition", "partition_custom")
        key_selector = _check_function(key_selector, KeySelector, "get_key", "partition_custom")
        return self._repartition(CustomPartitionerWrapper(partitioner, key_selector))

    def union(self, *streams: DataStream) -> DataStream:
        """One stream with the records of this and every other stream."""
        inputs = list(self._inputs)
        for stream in streams:
            if not isinstance(stream, DataStream):
                raise InvalidProgramError(
                    f"union() takes DataStreams, got {type(stream).__name__}"
                    + _batch_hint(stream, "union it after its to_records()")
                )
            if stream._env is not self._env:
                raise InvalidProgramError("union() of streams from different environments")
            inputs.extend(stream._inputs)
        return DataStream(self._env, None, inputs)

    @overload
    def connect(self, ds: DataStream) -> ConnectedStreams: ...

    @overload
    def connect(self, ds: BroadcastStream) -> BroadcastConnectedStream: ...

    def connect(self, ds: DataStream | BroadcastStream) -> ConnectedStreams | BroadcastConnectedStream:
        """Connect this stream (the first input) and ``ds`` (the second), possibly of different
        types, for one operator that sees both (``map(CoMapFunction)``, ``flat_map``,
        ``process``) and may share state between them. Two keyed streams connect keyed.
        With a :class:`BroadcastStream` (``rules.broadcast(descriptor)``): a
        :class:`BroadcastConnectedStream`, processed by a broadcast process function."""
        from chandy.api.broadcast_stream import BroadcastConnectedStream, BroadcastStream
        from chandy.api.connected_streams import ConnectedStreams

        if not isinstance(ds, (DataStream, BroadcastStream)):
            raise InvalidProgramError(
                f"connect() takes a DataStream or a BroadcastStream, got {type(ds).__name__}"
                + _batch_hint(ds, "connect its to_records()")
            )
        if isinstance(ds, BroadcastStream):
            return BroadcastConnectedStream(self, ds)
        return ConnectedStreams(self, ds)

    def window_all(self, window_assigner: WindowAssigner[Any, Any]) -> AllWindowedStream:
        """Windows over the whole stream (not per key), evaluated by one subtask."""
        from chandy.api.windowed_stream import AllWindowedStream

        return AllWindowedStream(self, window_assigner)

    def count_window_all(self, size: int, slide: int = 0) -> AllWindowedStream:
        """Windows of ``size`` records of the whole stream, one every ``slide`` records
        (tumbling when ``slide`` is 0)."""
        from chandy.api.windowed_stream import AllWindowedStream
        from chandy.core.windows import CountSlidingWindowAssigner, CountTumblingWindowAssigner

        if slide == 0:
            return AllWindowedStream(self, CountTumblingWindowAssigner(size))
        return AllWindowedStream(self, CountSlidingWindowAssigner(size, slide))

    # ------------------------------------------------------------ the batch path

    def to_batches(self, schema: SchemaLike | None = None) -> BatchStream:
        """This stream's records as Arrow record batches: a :class:`BatchStream` for vectorised
        operators (``map_batches``, ``key_by(column).sum(...)``, ...); ``to_records()`` comes back.

        Records may be tuples, ``Row``s, dicts or plain values (a column named ``value``);
        without a ``schema`` the column types are inferred per batch, so give one when a
        column could be all nulls or its type must not vary. The records of one input batch
        become one record batch, so latency is what it is on the record path. Event timestamps
        stay behind (watermarks go on): see docs/batches.md."""
        from chandy.api.batch_stream import BatchStream
        from chandy.connectors.arrow_schema import check_schema
        from chandy.task.operators.batch import RecordsToBatchesOperator

        if schema is not None:
            schema = check_schema(schema, "to_batches(schema)")
        node = self._add_operator(
            "Records to Batches", functools.partial(RecordsToBatchesOperator, schema), columnar=True
        )
        return BatchStream._of(self._env, node)

    def _output_type(self) -> Any:
        """The declared type of this stream's records (``None``: undeclared, or the inputs'
        types differ)."""
        types = [
            node.output_type if tag is None else node.side_output_types.get(tag)
            for node, _, tag in self._inputs
        ]
        return types[0] if all(t == types[0] for t in types) else None

    # ------------------------------------------------------------ sinks

    def print(self, sink_identifier: str | None = None) -> DataStreamSink:
        """Write every record to stdout (``"2> record"`` with several subtasks)."""
        from chandy.connectors.sinks import PrintSink

        node = self._add_operator(
            "Print to Std. Out",
            functools.partial(SinkWriterOperator, PrintSink(sink_identifier, type_info=self._output_type())),
            is_sink=True,
        )
        return DataStreamSink(self._env, node)

    def add_sink(self, sink_func: SinkFunction | Callable[[Any], None]) -> DataStreamSink:
        """A sink that calls ``sink_func.invoke(value, context)`` (or ``sink_func(value)``)."""
        sink_func = _check_function(sink_func, SinkFunction, "invoke", "add_sink")
        node = self._add_operator("Sink", functools.partial(SinkFunctionOperator, sink_func), is_sink=True)
        return DataStreamSink(self._env, node)

    def sink_to(self, sink: Sink) -> DataStreamSink:
        """Write to a :class:`~chandy.core.connector.Sink` (file, Kafka, ...)."""
        if not isinstance(sink, Sink):
            raise InvalidProgramError(f"sink_to() takes a Sink, got {type(sink).__name__}")
        if sink.columnar:
            raise InvalidProgramError(
                f"{type(sink).__name__} is a batch sink (it writes Arrow record batches), and this "
                "stream carries records: write them with .to_batches().sink_to(sink), or use the "
                "sink's record form"
            )
        return self._sink_to(sink)

    def execute_and_collect(
        self, job_execution_name: str | None = None, limit: int | None = None
    ) -> CollectIterator | list[Any]:
        """Run the job and return its records: an iterator (close it, or use ``with``,
        to stop an unbounded job), or with ``limit`` a list of the first ``limit``."""
        collect_id = uuid.uuid4().hex
        node = self._add_operator(
            "Collect Sink", functools.partial(CollectSinkOperator, collect_id), is_sink=True
        )
        node.parallelism = 1
        iterator = self._env._execute_and_collect(job_execution_name)
        if limit is None:
            return iterator
        if limit < 0:
            raise InvalidProgramError(f"limit must be >= 0, got {limit}")
        with iterator:
            result: list[Any] = []
            for record in iterator:
                if len(result) >= limit:
                    break
                result.append(record)
            return result


class KeyedStream(DataStream):
    """A stream partitioned by key; operators on it may use keyed state."""

    def __init__(self, env: StreamExecutionEnvironment, inputs: list[_Input]) -> None:
        super().__init__(env, None, inputs)

    def _keyed(self, name: str, factory: Callable[[], StreamOperator], output_type: Any = None) -> DataStream:
        return DataStream._of(
            self._env, self._add_operator(name, factory, keyed=True, output_type=output_type)
        )

    def map(self, func: MapFunction | Callable[[Any], Any], output_type: Any = None) -> DataStream:
        func = _check_function(func, MapFunction, "map", "map")
        return self._keyed("Map", functools.partial(KeyedMap, func), output_type)

    def flat_map(self, func: FlatMapFunction | Callable[[Any], Any], output_type: Any = None) -> DataStream:
        func = _check_function(func, FlatMapFunction, "flat_map", "flat_map")
        return self._keyed("FlatMap", functools.partial(KeyedFlatMap, func), output_type)

    def filter(self, func: FilterFunction | Callable[[Any], bool]) -> DataStream:
        func = _check_function(func, FilterFunction, "filter", "filter")
        return self._keyed("Filter", functools.partial(KeyedFilter, func), self._output_type())

    def process(
        self,
        func: KeyedProcessFunction | Callable[[Any, Any], Any],  # type: ignore[override]
        output_type: Any = None,
    ) -> DataStream:
        """Apply a KeyedProcessFunction, with keyed state through its runtime context."""
        if isinstance(func, ProcessFunction):
            raise InvalidProgramError("a KeyedStream takes a KeyedProcessFunction, not a ProcessFunction")
        func = _check_function(func, KeyedProcessFunction, "process_element", "process")
        return self._keyed("KeyedProcess", functools.partial(KeyedProcessOperator, func), output_type)

    def reduce(self, func: ReduceFunction | Callable[[Any, Any], Any]) -> DataStream:
        """A running fold per key: emits the new value for every record."""
        func = _check_function(func, ReduceFunction, "reduce", "reduce")
        return self._keyed("Keyed Reduce", functools.partial(StreamGroupedReduce, func), self._output_type())

    def sum(self, position_to_sum: int | str = 0) -> DataStream:
        """A running sum per key of one field (tuple index, dict key or attribute);
        for plain numbers, of the records themselves."""
        return self._aggregate("Keyed Sum", SumFunction(position_to_sum))

    def min(self, position_to_min: int | str = 0) -> DataStream:
        """A running minimum per key of one field; the other fields stay those of the key's
        first record (use ``min_by`` for the record holding the minimum)."""
        return self._aggregate("Keyed Min", MinFunction(position_to_min))

    def max(self, position_to_max: int | str = 0) -> DataStream:
        """A running maximum per key of one field; the other fields stay those of the key's
        first record (use ``max_by`` for the record holding the maximum)."""
        return self._aggregate("Keyed Max", MaxFunction(position_to_max))

    def min_by(self, position_to_min_by: int | str = 0) -> DataStream:
        """Per key, the record with the smallest value of one field so far (the first such
        record on a tie)."""
        return self._aggregate("Keyed MinBy", MinByFunction(position_to_min_by))

    def max_by(self, position_to_max_by: int | str = 0) -> DataStream:
        """Per key, the record with the largest value of one field so far (the first such
        record on a tie)."""
        return self._aggregate("Keyed MaxBy", MaxByFunction(position_to_max_by))

    def _aggregate(self, name: str, aggregation: FieldAggregation) -> DataStream:
        return self._keyed(name, functools.partial(StreamGroupedReduce, aggregation), self._output_type())

    def window(self, window_assigner: WindowAssigner[Any, Any]) -> WindowedStream:
        """Windows per key: records are grouped by key and by the windows the assigner puts
        them in; a trigger (the assigner's default unless set) decides when each fires."""
        from chandy.api.windowed_stream import WindowedStream

        return WindowedStream(self, window_assigner)

    def count_window(self, size: int, slide: int = 0) -> WindowedStream:
        """Windows of ``size`` records per key, one every ``slide`` records (tumbling when
        ``slide`` is 0)."""
        from chandy.api.windowed_stream import WindowedStream
        from chandy.core.windows import CountSlidingWindowAssigner, CountTumblingWindowAssigner

        if slide == 0:
            return WindowedStream(self, CountTumblingWindowAssigner(size))
        return WindowedStream(self, CountSlidingWindowAssigner(size, slide))


class DataStreamSink(_NodeHandle):
    """The end of a stream; configure the sink operator through it."""
