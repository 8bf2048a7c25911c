"""The batch API (``BatchStream``, ``KeyedBatchStream``, ``to_batches`` / ``to_records``): the
graphs it builds, every error it raises at build time, and small jobs on the local executor.

The end-to-end runs compare against results computed here in plain Python, the way the
record path would compute them (a running sum per key in arrival order, ...).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chandy import BatchStream, KeyedBatchStream, Row, StreamExecutionEnvironment, WatermarkStrategy
from chandy.api.datastream import DataStream
from chandy.connectors.arrow_sources import ArrowNumberSequenceSource
from chandy.connectors.file_sink import FileSink, ParquetBulkWriters
from chandy.connectors.sinks import DiscardingSink
from chandy.core.functions import (
    KeyedBatchFunction,
    KeyedBatchState,
    MapBatchesFunction,
    MapFunction,
    ProcessWindowFunction,
)
from chandy.core.time import Time
from chandy.core.watermark_strategy import TimestampAssigner
from chandy.core.windows import TumblingEventTimeWindows
from chandy.errors import InvalidProgramError
from chandy.graph.stream_graph import StreamEdge, StreamNode
from chandy.state.arrow_keys import KEY_COLUMN
from chandy.task.arrow_partitioners import (
    ArrowBroadcastPartitioner,
    ArrowForwardPartitioner,
    ArrowKeyGroupPartitioner,
    ArrowRebalancePartitioner,
    ArrowRescalePartitioner,
    ArrowShufflePartitioner,
)
from chandy.task.operators.batch import (
    BatchesToRecordsOperator,
    KeyedBatchAggregateOperator,
    KeyedBatchProcessOperator,
    MapBatchesOperator,
    RecordsToBatchesOperator,
)


def local_env(parallelism: int = 2) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(
        {"chandy.rest.enabled": False}, executor="local"
    )
    env.set_parallelism(parallelism)
    return env


def node_of(stream: Any) -> StreamNode:
    assert stream._node is not None
    node: StreamNode = stream._node
    return node


def only_input(node: StreamNode) -> StreamEdge:
    assert len(node.in_edges) == 1, node.in_edges
    return node.in_edges[0]


def factory_of(node: StreamNode) -> functools.partial[Any]:
    factory = node.operator_factory
    assert isinstance(factory, functools.partial)
    return factory


def numbers(env: StreamExecutionEnvironment, end: int = 100) -> BatchStream:
    stream = env.from_source(ArrowNumberSequenceSource(1, end), source_name="numbers")
    assert isinstance(stream, BatchStream)
    return stream


def double(batch: pa.RecordBatch) -> dict[str, Any]:
    return {"value": pc.multiply(batch.column("value"), 2)}


# ---------------------------------------------------------------------------- graphs


def test_a_batch_source_gives_a_batch_stream_on_a_columnar_node() -> None:
    env = local_env()
    stream = numbers(env)
    node = node_of(stream)
    assert node.is_source and node.columnar and not node.assigns_timestamps
    # A record source still gives a record stream on a record node.
    records = env.from_sequence(1, 10)
    assert type(records) is DataStream and not node_of(records).columnar


def test_no_watermarks_is_accepted_on_a_batch_source() -> None:
    env = local_env()
    stream = env.from_source(ArrowNumberSequenceSource(1, 10), WatermarkStrategy.no_watermarks(), "numbers")
    assert isinstance(stream, BatchStream) and not node_of(stream).assigns_timestamps


def test_map_batches_is_a_columnar_node_fed_by_the_default_edge() -> None:
    env = local_env()
    mapped = numbers(env).map_batches(double)
    node = node_of(mapped)
    assert node.columnar and not node.keyed
    assert factory_of(node).func is MapBatchesOperator and factory_of(node).args == (double,)
    assert only_input(node).partitioner is None  # the job graph picks the columnar forward / rebalance


class Doubling(MapBatchesFunction):
    def map_batch(self, batch: Any) -> Any:
        return double(batch)


def test_map_batches_takes_a_map_batches_function() -> None:
    env = local_env()
    function = Doubling()
    assert factory_of(node_of(numbers(env).map_batches(function))).args == (function,)


def test_key_by_a_column_uses_the_arrow_key_group_partitioner_and_the_column_as_key() -> None:
    env = local_env()
    keyed = numbers(env).key_by("value")
    assert isinstance(keyed, KeyedBatchStream)
    summed = keyed.sum("value")
    node = node_of(summed)
    assert node.keyed and node.columnar and isinstance(summed, BatchStream)
    partitioner = only_input(node).partitioner
    assert isinstance(partitioner, ArrowKeyGroupPartitioner) and partitioner.columnar
    factory = factory_of(node)
    assert factory.func is KeyedBatchAggregateOperator
    assert factory.args == ("sum", "value", False, "value")


def key_of(batch: pa.RecordBatch) -> Any:
    return pc.bit_wise_and(batch.column("value"), 7)


def test_key_by_a_function_ships_the_keys_in_the_key_column() -> None:
    env = local_env()
    node = node_of(numbers(env).key_by(key_of).running_sum("value"))
    assert isinstance(only_input(node).partitioner, ArrowKeyGroupPartitioner)
    assert factory_of(node).args == ("sum", "value", True, KEY_COLUMN)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda k: k.sum("v"), ("sum", "v", False)),
        (lambda k: k.count(), ("count", None, False)),
        (lambda k: k.count("v"), ("count", "v", False)),
        (lambda k: k.running_count("v"), ("count", "v", True)),
        (lambda k: k.min("v"), ("min", "v", False)),
        (lambda k: k.max("v"), ("max", "v", False)),
        (lambda k: k.mean("v"), ("mean", "v", False)),
        (lambda k: k.running_sum("v"), ("sum", "v", True)),
        (lambda k: k.running_count(), ("count", None, True)),
        (lambda k: k.running_min("v"), ("min", "v", True)),
        (lambda k: k.running_max("v"), ("max", "v", True)),
        (lambda k: k.running_mean("v"), ("mean", "v", True)),
    ],
)
def test_every_keyed_aggregation_builds_its_operator(call: Any, expected: tuple[Any, ...]) -> None:
    env = local_env()
    node = node_of(call(numbers(env).key_by("k")))
    assert node.keyed and node.columnar
    assert factory_of(node).func is KeyedBatchAggregateOperator
    assert factory_of(node).args == (*expected, "k")


class CountPerKey(KeyedBatchFunction):
    def process_batch(self, batch: Any, state: KeyedBatchState) -> Any:
        counts = state["count"] + np.diff(state.offsets)
        state["count"] = counts
        return {"key": state.keys, "count": counts}


def test_process_batches_builds_a_keyed_operator_with_the_state_schema() -> None:
    env = local_env()
    function = CountPerKey()
    node = node_of(numbers(env).key_by("value").process_batches(function, {"count": pa.int64()}))
    assert node.keyed and node.columnar
    factory = factory_of(node)
    assert factory.func is KeyedBatchProcessOperator
    assert factory.args == (function, pa.schema([("count", pa.int64())]), "value")
    # A schema given as a pa.Schema, and types by their names, work the same way.
    schema = pa.schema([("total", pa.float64()), ("seen", pa.bool_())], metadata={"v": "2"})
    node = node_of(numbers(env).key_by("value").process_batches(function, schema))
    assert factory_of(node).args[1].equals(schema, check_metadata=True)
    schema = schema.remove_metadata()
    node = node_of(
        numbers(env).key_by("value").process_batches(function, {"total": "double", "seen": "bool"})
    )
    assert factory_of(node).args[1] == schema


@pytest.mark.parametrize(
    ("partition", "partitioner"),
    [
        (BatchStream.rebalance, ArrowRebalancePartitioner),
        (BatchStream.shuffle, ArrowShufflePartitioner),
        (BatchStream.forward, ArrowForwardPartitioner),
        (BatchStream.rescale, ArrowRescalePartitioner),
        (BatchStream.broadcast, ArrowBroadcastPartitioner),
    ],
)
def test_partitionings_use_the_arrow_partitioners(partition: Any, partitioner: type[Any]) -> None:
    env = local_env()
    node = node_of(partition(numbers(env)).map_batches(double))
    edge = only_input(node)
    assert type(edge.partitioner) is partitioner and edge.partitioner.columnar


def test_to_records_and_to_batches_cross_between_the_paths() -> None:
    env = local_env()
    records = numbers(env).to_records()
    assert type(records) is DataStream
    to_records = node_of(records)
    assert not to_records.columnar and factory_of_or_class(to_records) is BatchesToRecordsOperator
    schema = pa.schema([("value", pa.int64())])
    batches = records.map(lambda row: (row.value,)).to_batches(schema)
    assert isinstance(batches, BatchStream)
    to_batches = node_of(batches)
    assert to_batches.columnar and not to_batches.keyed
    assert factory_of(to_batches).func is RecordsToBatchesOperator and factory_of(to_batches).args == (
        schema,
    )
    assert factory_of(node_of(records.to_batches({"value": "int64"}))).args == (schema,)


def factory_of_or_class(node: StreamNode) -> Any:
    factory = node.operator_factory
    return factory.func if isinstance(factory, functools.partial) else factory


def test_union_of_batch_streams_feeds_one_node_from_each() -> None:
    env = local_env()
    first, second, third = numbers(env), numbers(env), numbers(env).map_batches(double)
    node = node_of(first.union(second, third).map_batches(double))
    assert {e.source.id for e in node.in_edges} == {node_of(s).id for s in (first, second, third)}


def test_the_job_graph_gives_batch_edges_columnar_partitioners() -> None:
    """Parallelism 1 -> 2 -> 2 (keyed) -> 1: the rebalance, the key groups and the rebalance into
    the to_records node are all batch edges (to_records chains with the print sink)."""
    env = local_env()
    source = numbers(env).set_parallelism(1)
    mapped = source.map_batches(double).set_parallelism(2)
    mapped.key_by("value").sum("value").to_records().set_parallelism(1).print().set_parallelism(1)
    job_graph = env._build_job_graph("graph", clear=False)
    columnar = {(e.partitioner.name, e.partitioner.columnar) for v in job_graph.vertices for e in v.inputs}
    assert all(is_columnar for _, is_columnar in columnar), columnar
    assert len(job_graph.vertices) == 4


# ---------------------------------------------------------------------------- errors


def test_a_record_sink_on_a_batch_stream_names_to_records() -> None:
    env = local_env()
    with pytest.raises(InvalidProgramError, match=r"DiscardingSink writes records.*to_records\(\)\.sink_to"):
        numbers(env).sink_to(DiscardingSink())
    with pytest.raises(InvalidProgramError, match=r"sink_to\(\) takes a Sink, got builtin_function"):
        numbers(env).sink_to(print)  # type: ignore[arg-type]
    numbers(env).to_records().sink_to(DiscardingSink())  # the way out works


def test_a_record_sink_with_a_batch_twin_names_the_twin(tmp_path: Path) -> None:
    """The record FileSink, DeltaSink and KafkaSink have batch twins; the error names them
    (it said only 'use a batch sink')."""
    from chandy.connectors.delta_sink import DeltaSink
    from chandy.connectors.file_sink import JsonLinesEncoder
    from chandy.connectors.kafka_common import SimpleStringSchema
    from chandy.connectors.kafka_sink import KafkaRecordSerializationSchema, KafkaSink

    env = local_env()
    file_sink = FileSink.for_row_format(str(tmp_path), JsonLinesEncoder()).build()
    with pytest.raises(
        InvalidProgramError,
        match=r"FileSink writes records.*"
        r"FileSink\.for_bulk_format\(path, ParquetBulkWriters\.for_record_batches\(\)\)",
    ):
        numbers(env).sink_to(file_sink)
    with pytest.raises(
        InvalidProgramError, match=r"DeltaSink writes records.*DeltaSink\.for_record_batches\("
    ):
        numbers(env).sink_to(DeltaSink(str(tmp_path / "delta")))
    kafka = (
        KafkaSink.builder()
        .set_bootstrap_servers("localhost:9")
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder()
            .set_topic("t")
            .set_value_serialization_schema(SimpleStringSchema())
            .build()
        )
        .build()
    )
    with pytest.raises(
        InvalidProgramError, match=r"KafkaSink writes records.*KafkaRecordBatchSerializationSchema\("
    ):
        numbers(env).sink_to(kafka)


def test_a_batch_sink_on_a_record_stream_names_to_batches(tmp_path: Path) -> None:
    env = local_env()
    sink = FileSink.for_bulk_format(str(tmp_path), ParquetBulkWriters.for_record_batches()).build()
    with pytest.raises(InvalidProgramError, match=r"FileSink is a batch sink.*\.to_batches\(\)\.sink_to"):
        env.from_sequence(1, 3).sink_to(sink)
    env.from_sequence(1, 3).to_batches().sink_to(sink)  # the way out works


def test_a_union_of_batch_and_record_streams_names_the_conversion() -> None:
    env = local_env()
    batches, records = numbers(env), env.from_sequence(1, 10)
    with pytest.raises(InvalidProgramError, match=r"got DataStream: it is a record stream.*to_batches\(\)"):
        batches.union(records)  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match=r"got BatchStream: a BatchStream carries.*to_records\(\)"):
        records.union(batches)  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match=r"connect\(\).*got BatchStream.*to_records\(\)"):
        records.connect(batches)  # type: ignore[call-overload]
    with pytest.raises(InvalidProgramError, match="different environments"):
        batches.union(numbers(local_env()))


def test_map_batches_rejects_what_is_not_a_batch_function() -> None:
    env = local_env()
    with pytest.raises(
        InvalidProgramError, match="map_batches\\(\\) takes a MapBatchesFunction or a callable, got int"
    ):
        numbers(env).map_batches(3)  # type: ignore[arg-type]

    class Mapper(MapFunction):
        def map(self, value: Any) -> Any:
            return value

    with pytest.raises(
        InvalidProgramError, match="got Mapper \\(a function class must implement 'map_batch'\\)"
    ):
        numbers(env).map_batches(Mapper())  # type: ignore[arg-type]


def test_a_function_class_that_does_not_define_its_method_is_refused() -> None:
    """A subclass with a misnamed method inherited the base's stub, which returned None (no
    output): the job ran and emitted nothing. It is refused, naming the method to define."""
    env = local_env()

    class MisnamedMap(MapBatchesFunction):
        def map(self, batch: Any) -> Any:
            return batch

    class MisnamedProcess(KeyedBatchFunction):
        def process(self, batch: Any, state: Any) -> Any:
            return batch

    class MisnamedRecordMap(MapFunction):
        def map_batch(self, value: Any) -> Any:
            return value

    with pytest.raises(InvalidProgramError, match="MisnamedMap does not define 'map_batch'"):
        numbers(env).map_batches(MisnamedMap())
    with pytest.raises(InvalidProgramError, match="MisnamedProcess does not define 'process_batch'"):
        numbers(env).key_by("value").process_batches(MisnamedProcess(), {"n": pa.int64()})
    with pytest.raises(InvalidProgramError, match="MisnamedRecordMap does not define 'map'"):
        env.from_sequence(1, 3).map(MisnamedRecordMap())
    numbers(env).map_batches(Doubling())  # a class that defines it is taken


def test_key_by_and_aggregations_reject_bad_columns() -> None:
    env = local_env()
    with pytest.raises(InvalidProgramError, match="key_by\\(\\) takes a KeySelector or a callable, got int"):
        numbers(env).key_by(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match="key_by\\(\\) takes the name of a column.*got ''"):
        numbers(env).key_by("")
    with pytest.raises(InvalidProgramError, match="internal column"):
        numbers(env).key_by(KEY_COLUMN)
    keyed = numbers(env).key_by("value")
    with pytest.raises(InvalidProgramError, match="sum\\(\\) takes the name of a column.*got 0"):
        keyed.sum(0)  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match="running_mean\\(\\) takes the name of a column"):
        keyed.running_mean(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state_schema", "message"),
    [
        ([("count", pa.int64())], "takes a pyarrow.Schema or a dict of column name to Arrow type"),
        ({}, "has no columns"),
        ({"count": int}, "column 'count' has type <class 'int'>: give a pyarrow type"),
        ({"count": "int65"}, "column 'count' has type 'int65'"),
        ({KEY_COLUMN: pa.int64()}, "internal column names"),
        ({"": pa.int64()}, "column names are non-empty strings"),
        (
            pa.schema([("a", pa.int64()), ("a", pa.int32())]),
            "names the column\\(s\\) \\['a'\\] more than once",
        ),
    ],
)
def test_process_batches_rejects_a_bad_state_schema(state_schema: Any, message: str) -> None:
    env = local_env()
    with pytest.raises(InvalidProgramError, match=message):
        numbers(env).key_by("value").process_batches(CountPerKey(), state_schema)


def test_process_batches_rejects_what_is_not_a_keyed_batch_function() -> None:
    env = local_env()
    with pytest.raises(
        InvalidProgramError, match="got Doubling \\(a function class must implement 'process_batch'\\)"
    ):
        numbers(env).key_by("value").process_batches(Doubling(), {"count": pa.int64()})  # type: ignore[arg-type]


def test_a_batch_source_refuses_a_strategy_without_a_timestamp_column_and_a_type_info() -> None:
    env = local_env()
    strategy = WatermarkStrategy.for_monotonous_timestamps()
    with pytest.raises(
        InvalidProgramError, match=r"does not say where their event time is.*with_timestamp_column"
    ):
        env.from_source(ArrowNumberSequenceSource(1, 10), strategy, "numbers")
    with pytest.raises(InvalidProgramError, match="a batch source's batches carry their own Arrow schema"):
        env.from_source(ArrowNumberSequenceSource(1, 10), None, "numbers", type_info=int)


def test_to_batches_rejects_a_bad_schema() -> None:
    env = local_env()
    with pytest.raises(InvalidProgramError, match="to_batches\\(schema\\) takes a pyarrow.Schema"):
        env.from_sequence(1, 3).to_batches("value int64")  # type: ignore[arg-type]


def test_every_schema_argument_takes_a_schema_or_a_dict_and_refuses_the_rest(tmp_path: Path) -> None:
    """to_batches and process_batches took a dict, the connectors only a pa.Schema (and
    DeltaSink failed obscurely in deltalake): every schema argument now takes both forms and
    refuses anything else with the one error naming them."""
    from deltalake import DeltaTable

    from chandy.connectors.delta_sink import DeltaSink
    from chandy.connectors.file_formats import CsvBatchFormat, JsonBatchFormat
    from chandy.connectors.kafka_source import KafkaRecordBatchDeserializer

    as_dict = {"k": "string", "v": pa.int64()}
    expected = pa.schema([("k", pa.string()), ("v", pa.int64())])
    takers: dict[str, Any] = {
        "CsvBatchFormat(schema)": lambda schema: CsvBatchFormat(schema=schema).schema,
        "JsonBatchFormat(schema)": lambda schema: JsonBatchFormat(schema=schema).schema,
        "ParquetBulkWriters(schema)": lambda schema: ParquetBulkWriters.for_record_batches(schema).schema,
        "KafkaRecordBatchDeserializer(schema)": lambda schema: (
            KafkaRecordBatchDeserializer.json(schema).schema
        ),
        "DeltaSink(schema)": lambda schema: DeltaSink.for_record_batches(str(tmp_path), schema).schema,
    }
    for what, take in takers.items():
        assert take(as_dict) == expected, what
        assert take(expected) is expected, what
        with pytest.raises(InvalidProgramError, match=r"takes a pyarrow.Schema or a dict of column name"):
            take([("k", "string")])
        with pytest.raises(InvalidProgramError, match=r"column 'v' has type 'int65'"):
            take({"v": "int65"})
    table = tmp_path / "delta"
    DeltaSink.for_record_batches(str(table), schema=as_dict).validate()  # creates the table
    assert DeltaTable(str(table)).schema().to_arrow().names == ["k", "v"]


def test_record_methods_on_a_batch_stream_name_the_batch_way() -> None:
    """A record method on a batch stream was a bare AttributeError; it names the batch
    counterpart or the conversion to records."""
    env = local_env()
    batches, keyed = numbers(env), numbers(env).key_by("value")
    with pytest.raises(
        AttributeError, match=r"'map' is a record method.*map_batches\(.*to_records\(\)\.map\("
    ):
        batches.map(lambda x: x)
    with pytest.raises(AttributeError, match=r"'filter' is a record method.*map_batches\("):
        batches.filter(lambda x: x)
    with pytest.raises(AttributeError, match=r"'add_sink' is a record method.*sink_to\(.*to_records\(\)"):
        batches.add_sink(print)
    with pytest.raises(
        AttributeError, match=r"'window_all' is a record method.*to_records\(\)\.window_all\("
    ):
        batches.window_all
    with pytest.raises(AttributeError, match=r"'process' is a record method.*process_batches\("):
        keyed.process
    with pytest.raises(AttributeError, match=r"'reduce' is a record method.*to_records\(\)\.key_by"):
        keyed.reduce
    with pytest.raises(AttributeError, match=r"'partition_custom' is a record method"):
        batches.partition_custom
    with pytest.raises(AttributeError, match=r"^'BatchStream' object has no attribute 'no_such_thing'$"):
        batches.no_such_thing
    assert not hasattr(batches, "no_such_thing") and hasattr(batches, "map_batches")


def test_operator_settings_on_a_partitioning_name_the_fix() -> None:
    env = local_env()
    with pytest.raises(InvalidProgramError, match="name\\(\\) applies to an operator"):
        numbers(env).rebalance().name("x")
    assert numbers(env).map_batches(double).name("doubled").uid("d").get_name() == "doubled"


# ---------------------------------------------------------------------------- local runs


def collect(stream: BatchStream | DataStream) -> list[Any]:
    result = stream.execute_and_collect(limit=1_000_000)
    assert isinstance(result, list)
    return result


def test_map_batches_runs_over_a_batch_source() -> None:
    env = local_env()
    rows = collect(numbers(env, 1000).map_batches(double))
    assert sorted(row.value for row in rows) == [2 * i for i in range(1, 1001)]
    assert all(isinstance(row, Row) for row in rows)


def keyed_input(
    env: StreamExecutionEnvironment, n: int, keys: int, seed: int
) -> tuple[BatchStream, list[tuple[int, int]]]:
    """``n`` random (key, value) rows, read in parallel as batches."""
    rng = np.random.default_rng(seed)
    pairs = [
        (int(k), int(v)) for k, v in zip(rng.integers(0, keys, n), rng.integers(-50, 50, n), strict=True)
    ]
    stream = env.from_collection(pairs).to_batches({"key": "int64", "value": "int64"})
    return stream, pairs


@pytest.mark.parametrize(
    ("build", "expected_rows"),
    [
        (lambda s: s.rebalance().map_batches(lambda b: b).set_parallelism(3), 100),
        (lambda s: s.shuffle().map_batches(lambda b: b).set_parallelism(3), 100),
        (lambda s: s.rescale().map_batches(lambda b: b).set_parallelism(4), 100),
        (lambda s: s.forward().map_batches(lambda b: b), 100),
        (lambda s: s.broadcast().map_batches(lambda b: b).set_parallelism(3), 300),
        # keyed edges into operators that are not keyed: no engine columns reach them
        (lambda s: s.key_by("value").map_batches(lambda b: b), 100),
        (lambda s: s.key_by(lambda b: pc.bit_wise_and(b["value"], 1)).to_records(), 100),
    ],
)
def test_every_partitioning_delivers_the_rows(build: Any, expected_rows: int) -> None:
    env = local_env()
    rows = collect(build(numbers(env, 100)))
    assert len(rows) == expected_rows
    assert {tuple(row.as_dict()) for row in rows} == {("value",)}
    assert sum(row.value for row in rows) == 5050 * expected_rows // 100


def test_union_of_batch_streams_of_other_parallelisms_runs() -> None:
    env = local_env()
    first = env.from_source(ArrowNumberSequenceSource(1, 50), source_name="first").set_parallelism(1)
    second = env.from_source(ArrowNumberSequenceSource(51, 100), source_name="second")
    assert isinstance(first, BatchStream) and isinstance(second, BatchStream)
    rows = collect(first.union(second).map_batches(lambda b: b).set_parallelism(3))
    assert sorted(row.value for row in rows) == list(range(1, 101))


def test_key_by_sum_gives_each_keys_total() -> None:
    env = local_env()
    stream, pairs = keyed_input(env, 3000, 37, seed=1)
    rows = collect(stream.rebalance().key_by("key").sum("value"))
    totals: dict[int, int] = defaultdict(int)
    for key, value in pairs:
        totals[key] += value
    last: dict[int, int] = {}
    for row in rows:  # one row per key per batch; each key's last row is its total
        last[row.key] = row.value
    assert last == totals


def test_key_by_running_sum_matches_the_record_path() -> None:
    """One row per input row with the key's sum up to it: per key, exactly the sequence the
    record path's key_by(...).sum(...) emits, whatever the batches and the parallelism."""
    env = local_env()
    stream, pairs = keyed_input(env, 3000, 37, seed=2)
    # One to_batches subtask: each key's rows reach its running sum in the collection's order.
    stream.set_parallelism(1)
    rows = collect(stream.key_by("key").running_sum("value").set_parallelism(3))
    expected: dict[int, list[int]] = defaultdict(list)
    sums: dict[int, int] = defaultdict(int)
    for key, value in pairs:
        sums[key] += value
        expected[key].append(sums[key])
    got: dict[int, list[int]] = defaultdict(list)
    for row in rows:
        got[row.key].append(row.value)
    assert got == expected


def test_process_batches_keeps_columnar_state_per_key() -> None:
    env = local_env()
    stream, pairs = keyed_input(env, 2000, 11, seed=3)
    rows = collect(stream.key_by("key").process_batches(CountPerKey(), {"count": pa.int64()}))
    counts: dict[int, int] = defaultdict(int)
    for key, _ in pairs:
        counts[key] += 1
    last = {row.key: row["count"] for row in rows}
    assert last == counts


def test_key_by_a_function_counts_per_computed_key() -> None:
    """The keys a function of the batch computed travel with the rows; the totals name
    their key column ``key``."""
    env = local_env()
    rows = collect(numbers(env, 1000).key_by(lambda b: pc.bit_wise_and(b["value"], 3)).count())
    assert {tuple(row.as_dict()) for row in rows} == {("key", "count")}
    assert {row.key: row["count"] for row in rows} == {0: 250, 1: 250, 2: 250, 3: 250}


class LastName(KeyedBatchFunction):
    """Keeps each key's last name (a string column: numpy objects) and counts its rows."""

    def process_batch(self, batch: Any, state: KeyedBatchState) -> Any:
        names = batch["name"].to_numpy(zero_copy_only=False)
        state["last"] = names[state.offsets[1:] - 1]
        state["rows"] = state["rows"] + np.diff(state.offsets)
        return {"key": state.keys, "last": state["last"], "rows": state["rows"]}


def test_process_batches_keeps_state_of_other_types_as_objects() -> None:
    env = local_env()
    records = [(i % 5, f"name-{i}") for i in range(200)]
    stream = env.from_collection(records).to_batches({"key": "int64", "name": "string"})
    stream.set_parallelism(1)  # one input channel: each key's rows arrive in the collection's order
    rows = collect(stream.key_by("key").process_batches(LastName(), {"last": "string", "rows": "int64"}))
    latest = {row.key: (row.last, row.rows) for row in rows}
    assert latest == {k: (f"name-{195 + k}", 40) for k in range(5)}


def test_to_batches_and_to_records_round_trip_rows() -> None:
    env = local_env()
    records = [Row(name=f"n{i}", value=i, ok=i % 2 == 0) for i in range(500)]
    stream = env.from_collection(records).to_batches().map_batches(lambda b: b).to_records()
    rows = collect(stream)
    assert sorted((r.name, r.value, r.ok) for r in rows) == sorted((r.name, r.value, r.ok) for r in records)


class SecondField(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return int(value[1])


class TsColumn(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return int(value.ts)


def test_an_event_time_window_after_a_batch_section() -> None:
    """docs/batches.md's recipe: event time on the record path, a batch section, then the
    timestamps assigned again from a column after to_records(), before the window."""
    env = local_env()
    data = [(f"k{i % 3}", i * 100) for i in range(100)]
    records = env.from_collection(data).assign_timestamps_and_watermarks(
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(SecondField())
    )
    batches = records.to_batches({"key": "string", "ts": "int64"}).map_batches(lambda b: b)
    rows = batches.to_records().assign_timestamps_and_watermarks(
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(TsColumn())
    )
    counts = (
        rows.map(lambda r: (r.key, r.ts // 1000))
        .key_by(lambda t: t[0])
        .window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .process(CountWindow())
    )
    result = collect(counts)
    expected: dict[tuple[str, int], int] = defaultdict(int)
    for key, ts in data:
        expected[(key, ts // 1000)] += 1
    assert sorted(result) == sorted((key, second, n) for (key, second), n in expected.items())


class CountWindow(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: Any) -> Any:
        items = list(elements)
        yield key, items[0][1], len(items)


def test_print_writes_rows(capfd: pytest.CaptureFixture[str]) -> None:
    env = local_env(1)
    numbers(env, 3).print()
    env.execute("print rows")
    assert capfd.readouterr().out.splitlines() == ["Row(value=1)", "Row(value=2)", "Row(value=3)"]
