"""Porting a PyFlink job means replacing ``pyflink`` by ``chandy`` in its imports.

The names PyFlink's own event-time and window examples import resolve under the
same paths in chandy, to chandy's own classes; ``Types`` describes as PyFlink's
does (same ``repr``, same equality) and every API that takes a type in PyFlink
takes it here; ``Row`` behaves as PyFlink's.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import importlib
import inspect
import pickle
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from chandy.core.types import (
    Instant,
    LocalTimeTypeInfo,
    Row,
    RowKind,
    RowTypeInfo,
    TypeInformation,
    Types,
    format_as_flink,
    to_declared_type,
)
from chandy.errors import ConfigurationError

ROOT = Path(__file__).resolve().parent.parent

#: What PyFlink 2.3's examples ``event_time_timer.py``, ``state_access.py`` and ``windowing/*.py``
#: import (copied here, so the test runs without PyFlink installed).
EXAMPLE_IMPORTS: dict[str, list[str]] = {
    "common": ["Types", "WatermarkStrategy", "Time", "Duration", "Encoder"],
    "common.typeinfo": ["Types"],
    "common.watermark_strategy": ["TimestampAssigner"],
    "datastream": [
        "StreamExecutionEnvironment",
        "ProcessWindowFunction",
        "WindowFunction",
    ],
    "datastream.functions": ["KeyedProcessFunction", "RuntimeContext"],
    "datastream.state": ["ValueStateDescriptor", "StateTtlConfig"],
    "datastream.window": [
        "TumblingEventTimeWindows",
        "SlidingEventTimeWindows",
        "EventTimeSessionWindows",
        "SessionWindowTimeGapExtractor",
        "TimeWindow",
        "CountWindow",
    ],
    "datastream.connectors.file_system": ["FileSink", "OutputFileConfig", "RollingPolicy"],
}

#: More names a ported event-time job uses, under PyFlink's paths.
EVENT_TIME_IMPORTS: dict[str, list[str]] = {
    "common": ["Row", "RowKind", "TypeInformation", "Configuration", "Instant"],
    "common.time": ["Duration", "Time", "Instant"],
    "common.types": ["Row", "RowKind"],
    "datastream": ["KeyedStream", "DataStream", "OutputTag", "TimeDomain", "TimerService", "ProcessFunction"],
    "datastream.output_tag": ["OutputTag"],
    "datastream.time_domain": ["TimeDomain"],
    "datastream.timerservice": ["TimerService"],
    "datastream.functions": [
        "AggregateFunction",
        "AllWindowFunction",
        "ProcessAllWindowFunction",
        "ProcessFunction",
        "ReduceFunction",
        "WindowFunction",
    ],
    "datastream.state": ["ListStateDescriptor", "MapStateDescriptor", "ReducingStateDescriptor"],
    "metrics": ["MetricGroup", "Metric", "Counter", "Meter", "Distribution"],
    "datastream.window": [
        "TumblingProcessingTimeWindows",
        "SlidingProcessingTimeWindows",
        "ProcessingTimeSessionWindows",
        "GlobalWindows",
        "CountTumblingWindowAssigner",
        "CountSlidingWindowAssigner",
        "Trigger",
        "TriggerResult",
        "EventTimeTrigger",
        "ProcessingTimeTrigger",
        "CountTrigger",
        "PurgingTrigger",
    ],
}

#: The names of connected streams (``DataStream.connect``), under PyFlink's paths.
CONNECT_IMPORTS: dict[str, list[str]] = {
    "datastream": [
        "ConnectedStreams",
        "CoMapFunction",
        "CoFlatMapFunction",
        "CoProcessFunction",
        "KeyedCoProcessFunction",
    ],
    "datastream.data_stream": ["ConnectedStreams"],
    "datastream.functions": [
        "CoMapFunction",
        "CoFlatMapFunction",
        "CoProcessFunction",
        "KeyedCoProcessFunction",
    ],
}

#: The names of async I/O, under PyFlink's paths (PyFlink's examples/datastream/asyncio/
#: remote_model_inference.py imports the ``datastream`` ones).
ASYNC_IMPORTS: dict[str, list[str]] = {
    "datastream": ["AsyncDataStream", "AsyncFunction", "AsyncRetryStrategy", "AsyncRetryPredicate"],
    "datastream.async_data_stream": ["AsyncDataStream"],
    "datastream.functions": ["AsyncFunction", "AsyncRetryStrategy", "AsyncRetryPredicate"],
    "datastream.async_retry_strategies": [
        "NO_RETRY_STRATEGY",
        "NoRetryStrategy",
        "FixedDelayRetryStrategy",
        "ExponentialBackoffDelayRetryStrategy",
        "RetryPredicate",
    ],
    "datastream.async_retry_predicates": [
        "empty_result_predicate",
        "has_exception_predicate",
        "exception_type_predicate",
    ],
}

#: Where each name is defined in chandy (the re-export must be that very object).
HOME = {
    "Types": "chandy.core.types",
    "Row": "chandy.core.types",
    "RowKind": "chandy.core.types",
    "TypeInformation": "chandy.core.types",
    "Instant": "chandy.core.types",
    "WatermarkStrategy": "chandy.core.watermark_strategy",
    "TimestampAssigner": "chandy.core.watermark_strategy",
    "Duration": "chandy.core.time",
    "Time": "chandy.core.time",
    "TimeDomain": "chandy.core.time",
    "OutputTag": "chandy.core.output_tag",
    "StreamExecutionEnvironment": "chandy.api.environment",
    "KeyedProcessFunction": "chandy.core.functions",
    "KeyedCoProcessFunction": "chandy.core.functions",
    "CoMapFunction": "chandy.core.functions",
    "ConnectedStreams": "chandy.api.connected_streams",
    "ProcessWindowFunction": "chandy.core.functions",
    "ValueStateDescriptor": "chandy.core.state",
    "StateTtlConfig": "chandy.core.state",
    "TumblingEventTimeWindows": "chandy.core.windows",
    "TimeWindow": "chandy.core.windows",
    "MetricGroup": "chandy.core.metrics",
    "Counter": "chandy.core.metrics",
    "AsyncDataStream": "chandy.api.async_data_stream",
    "AsyncFunction": "chandy.core.functions",
    "AsyncRetryStrategy": "chandy.core.async_retry",
    "NO_RETRY_STRATEGY": "chandy.core.async_retry",
    "exception_type_predicate": "chandy.core.async_retry",
}


def _imports(table: dict[str, list[str]]) -> list[tuple[str, str]]:
    return [(f"chandy.{module}", name) for module, names in table.items() for name in names]


@pytest.mark.parametrize(
    ("module", "name"),
    _imports(EXAMPLE_IMPORTS)
    + _imports(EVENT_TIME_IMPORTS)
    + _imports(CONNECT_IMPORTS)
    + _imports(ASYNC_IMPORTS),
    ids=lambda v: v,
)
def test_a_pyflink_import_resolves_under_chandy(module: str, name: str) -> None:
    value = getattr(importlib.import_module(module), name)
    assert value is not None
    if name in HOME:
        assert value is getattr(importlib.import_module(HOME[name]), name), f"{module}.{name} is a copy"


@pytest.mark.parametrize(
    "module",
    [
        "chandy",
        "chandy.common",
        "chandy.common.typeinfo",
        "chandy.common.types",
        "chandy.common.time",
        "chandy.common.watermark_strategy",
        "chandy.common.configuration",
        "chandy.common.serialization",
        "chandy.datastream",
        "chandy.datastream.functions",
        "chandy.datastream.window",
        "chandy.datastream.state",
        "chandy.datastream.output_tag",
        "chandy.datastream.time_domain",
        "chandy.datastream.timerservice",
        "chandy.datastream.data_stream",
        "chandy.datastream.stream_execution_environment",
        "chandy.datastream.checkpoint_config",
        "chandy.datastream.checkpointing_mode",
        "chandy.datastream.connectors",
        "chandy.datastream.connectors.file_system",
        "chandy.datastream.connectors.kafka",
        "chandy.datastream.connectors.number_seq",
        "chandy.datastream.async_data_stream",
        "chandy.datastream.async_retry_strategies",
        "chandy.datastream.async_retry_predicates",
        "chandy.metrics",
    ],
)
def test_every_name_a_module_exports_resolves(module: str) -> None:
    """A lazy re-export that points at the wrong module fails here, not in a user's job."""
    loaded = importlib.import_module(module)
    for name in loaded.__all__:
        assert getattr(loaded, name) is not None, f"{module}.{name}"


def test_the_async_retry_modules_import_from_the_package_as_in_pyflink() -> None:
    """PyFlink's asyncio example: ``from pyflink.datastream import async_retry_predicates``."""
    namespace: dict[str, Any] = {}
    exec("from chandy.datastream import async_retry_predicates, async_retry_strategies", namespace)
    assert namespace["async_retry_predicates"].exception_type_predicate(TimeoutError(), TimeoutError)
    assert namespace["async_retry_strategies"].NO_RETRY_STRATEGY.can_retry(1) is False


def test_an_unknown_name_is_an_attribute_error_naming_the_module() -> None:
    import chandy.datastream

    # PyFlink has StateTtlConfig in pyflink.datastream.state only, not in pyflink.datastream.
    with pytest.raises(AttributeError, match=r"'chandy.datastream' has no attribute 'StateTtlConfig'"):
        _ = chandy.datastream.StateTtlConfig  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        from chandy.datastream.state import TtlValue  # type: ignore[attr-defined]  # noqa: F401


def test_importing_a_function_class_does_not_import_the_runtime() -> None:
    """``chandy.datastream`` loads names on first use: a user's module that only defines
    functions stays light (and has no import cycle with the API)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from chandy.datastream.functions import KeyedProcessFunction\n"
        "from chandy.datastream import ProcessWindowFunction\n"
        "from chandy.common import Types, Row, WatermarkStrategy\n"
        "print(sorted(m for m in sys.modules if m.startswith(('chandy.api', 'chandy.runtime'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- Types


@pytest.mark.parametrize(
    ("type_info", "printed"),
    [
        # What PyFlink 2.3 prints for the same calls.
        (Types.STRING(), "String"),
        (Types.INT(), "Integer"),
        (Types.LONG(), "Long"),
        (Types.FLOAT(), "Float"),
        (Types.DOUBLE(), "Double"),
        (Types.BOOLEAN(), "Boolean"),
        (Types.BYTE(), "Byte"),
        (Types.SHORT(), "Short"),
        (Types.CHAR(), "Char"),
        (Types.BIG_INT(), "BigInteger"),
        (Types.BIG_DEC(), "BigDecimal"),
        (Types.INSTANT(), "Instant"),
        (Types.SQL_DATE(), "DateTypeInfo"),
        (Types.SQL_TIME(), "TimeTypeInfo"),
        (Types.SQL_TIMESTAMP(), "TimestampTypeInfo"),
        (Types.PICKLED_BYTE_ARRAY(), "PickledByteArrayTypeInfo"),
        (Types.TUPLE([Types.STRING(), Types.INT()]), "TupleTypeInfo(String, Integer)"),
        (Types.ROW([Types.INT(), Types.LONG()]), "RowTypeInfo(Integer, Long)"),
        (
            Types.ROW_NAMED(["id", "name"], [Types.INT(), Types.STRING()]),
            "RowTypeInfo(id: Integer, name: String)",
        ),
        (Types.MAP(Types.STRING(), Types.LONG()), "MapTypeInfo<String, Long>"),
        (Types.LIST(Types.DOUBLE()), "ListTypeInfo<Double>"),
        (Types.PRIMITIVE_ARRAY(Types.BYTE()), "PrimitiveArrayTypeInfo<Byte>"),
        (Types.BASIC_ARRAY(Types.INT()), "BasicArrayTypeInfo<Integer>"),
        (Types.OBJECT_ARRAY(Types.STRING()), "ObjectArrayTypeInfo<String>"),
        (LocalTimeTypeInfo(LocalTimeTypeInfo.TimeType.LOCAL_DATE_TIME), "LocalTimeTypeInfo<LOCAL_DATE_TIME>"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_types_print_as_pyflink_prints_them(type_info: TypeInformation, printed: str) -> None:
    assert repr(type_info) == printed
    assert isinstance(type_info, TypeInformation)


def test_types_are_equal_when_they_describe_the_same_type() -> None:
    nested = Types.TUPLE([Types.STRING(), Types.LIST(Types.ROW([Types.INT()]))])
    assert nested == Types.TUPLE([Types.STRING(), Types.LIST(Types.ROW([Types.INT()]))])
    assert hash(nested) == hash(Types.TUPLE([Types.STRING(), Types.LIST(Types.ROW([Types.INT()]))]))
    assert Types.TUPLE([Types.STRING()]) != Types.TUPLE([Types.INT()])
    assert Types.TUPLE([Types.INT()]) != Types.ROW([Types.INT()])
    assert Types.PRIMITIVE_ARRAY(Types.INT()) != Types.BASIC_ARRAY(Types.INT())
    assert Types.MAP(Types.STRING(), Types.INT()) != Types.MAP(Types.INT(), Types.STRING())
    assert Types.INT() != "Integer"
    # PyFlink: a row type's equality looks at the field types, not the names.
    assert Types.ROW_NAMED(["a"], [Types.INT()]) == Types.ROW([Types.INT()])


def test_row_type_names_fields_as_flink_does() -> None:
    named = Types.ROW_NAMED(["id", "name"], [Types.INT(), Types.STRING()])
    assert isinstance(named, RowTypeInfo)
    assert named.get_field_names() == ["id", "name"]
    assert named.get_field_index("name") == 1
    assert named.get_field_types() == [Types.INT(), Types.STRING()]
    unnamed = Types.ROW([Types.INT(), Types.STRING()])
    assert isinstance(unnamed, RowTypeInfo)
    assert unnamed.get_field_names() == ["f0", "f1"]
    assert unnamed.get_field_index("f0") == -1
    with pytest.raises(ValueError, match="one name per field type"):
        Types.ROW_NAMED(["id"], [Types.INT(), Types.STRING()])


def test_type_information_survives_pickling() -> None:
    """Type information rides along with functions and descriptors shipped to slots."""
    for type_info in (Types.TUPLE([Types.STRING(), Types.MAP(Types.INT(), Types.LIST(Types.LONG()))]),):
        assert pickle.loads(pickle.dumps(type_info)) == type_info
        assert cloudpickle.loads(cloudpickle.dumps(type_info)) == type_info


def test_instant_counts_milliseconds_from_the_epoch() -> None:
    assert Instant.of_epoch_milli(1_500).to_epoch_milli() == 1_500
    assert Instant.of_epoch_milli(-1).to_epoch_milli() == -1
    assert Instant.of_epoch_milli(-1) == Instant(-1, 999_000_000)
    assert repr(Instant.of_epoch_milli(1_500)) == "Instant<1, 500000000>"


# ---------------------------------------------------------------------------- every typed API takes its type

#: PyFlink 2.3's public methods with a type parameter (read from its data_stream.py and
#: stream_execution_environment.py), on the classes chandy has.
TYPED_PARAMETERS = [
    ("chandy.api.datastream", "DataStream", "map", "output_type"),
    ("chandy.api.datastream", "DataStream", "flat_map", "output_type"),
    ("chandy.api.datastream", "DataStream", "process", "output_type"),
    ("chandy.api.datastream", "DataStream", "key_by", "key_type"),
    ("chandy.api.datastream", "KeyedStream", "map", "output_type"),
    ("chandy.api.datastream", "KeyedStream", "flat_map", "output_type"),
    ("chandy.api.datastream", "KeyedStream", "process", "output_type"),
    ("chandy.api.datastream", "KeyedStream", "key_by", "key_type"),
    ("chandy.api.environment", "StreamExecutionEnvironment", "from_collection", "type_info"),
    ("chandy.api.environment", "StreamExecutionEnvironment", "from_source", "type_info"),
    ("chandy.api.windowed_stream", "WindowedStream", "reduce", "output_type"),
    ("chandy.api.windowed_stream", "WindowedStream", "aggregate", "accumulator_type"),
    ("chandy.api.windowed_stream", "WindowedStream", "aggregate", "output_type"),
    ("chandy.api.windowed_stream", "WindowedStream", "apply", "output_type"),
    ("chandy.api.windowed_stream", "WindowedStream", "process", "output_type"),
    ("chandy.api.windowed_stream", "AllWindowedStream", "reduce", "output_type"),
    ("chandy.api.windowed_stream", "AllWindowedStream", "aggregate", "accumulator_type"),
    ("chandy.api.windowed_stream", "AllWindowedStream", "aggregate", "output_type"),
    ("chandy.api.windowed_stream", "AllWindowedStream", "apply", "output_type"),
    ("chandy.api.windowed_stream", "AllWindowedStream", "process", "output_type"),
]


@pytest.mark.parametrize(("module", "cls", "method", "parameter"), TYPED_PARAMETERS, ids=lambda v: v)
def test_every_api_pyflink_gives_a_type_takes_it(module: str, cls: str, method: str, parameter: str) -> None:
    signature = inspect.signature(getattr(getattr(importlib.import_module(module), cls), method))
    assert parameter in signature.parameters, f"{cls}.{method}{signature} has no {parameter!r}"
    assert signature.parameters[parameter].default is None, f"{cls}.{method}: {parameter} must be optional"


def test_a_job_typed_as_in_pyflink_runs_and_its_types_change_nothing() -> None:
    """Types given everywhere PyFlink takes them only describe: the results are the untyped job's."""
    from chandy.datastream import StreamExecutionEnvironment

    def run(typed: bool) -> list[object]:
        def t(type_info: TypeInformation) -> TypeInformation | None:
            return type_info if typed else None

        env = StreamExecutionEnvironment.get_execution_environment(executor="local")
        env.set_parallelism(2)
        pairs = Types.TUPLE([Types.STRING(), Types.INT()])
        words = env.from_collection([("a", 1), ("b", 2), ("a", 3)], type_info=t(pairs))
        totals = (
            words.map(lambda p: (p[0], p[1] * 10), output_type=t(pairs))
            .flat_map(lambda p: [p, p], output_type=t(pairs))
            .key_by(lambda p: p[0], key_type=t(Types.STRING()))
            .reduce(lambda x, y: (x[0], x[1] + y[1]))
            .map(
                lambda p: Row(word=p[0], total=p[1]),
                output_type=t(Types.ROW_NAMED(["word", "total"], [Types.STRING(), Types.INT()])),
            )
        )
        return sorted(totals.execute_and_collect(limit=100), key=lambda r: (r.word, r.total))

    assert run(typed=True) == run(typed=False)
    assert [r.total for r in run(typed=True) if r.word == "a"] == [10, 20, 50, 80]


# ---------------------------------------------------------------------------- Row


def test_row_fields_by_position() -> None:
    row = Row(1, "a")
    assert (row[0], row[1], row[-1], row[0:2]) == (1, "a", "a", [1, "a"])
    assert list(row) == [1, "a"] and len(row) == 2
    assert "a" in row and "b" not in row
    assert repr(row) == "<Row(1, 'a')>"
    with pytest.raises(TypeError, match="named fields"):
        row.as_dict()
    with pytest.raises(KeyError, match="positional"):
        row["id"]
    with pytest.raises(AttributeError):
        _ = row.id


def test_row_fields_by_name() -> None:
    row = Row(id=1, name="a")
    assert (row.id, row.name, row["name"], row[0]) == (1, "a", "a", 1)
    assert row.as_dict() == {"id": 1, "name": "a"}
    assert "name" in row and "a" not in row
    assert repr(row) == "Row(id=1, name='a')"
    with pytest.raises(AttributeError, match="no field 'age'"):
        _ = row.age
    with pytest.raises(ValueError, match="'age' is not a field"):
        row["age"]
    with pytest.raises(ValueError, match="positional or named"):
        Row(1, name="a")


def test_a_row_class_makes_named_rows() -> None:
    person = Row("name", "age")
    assert repr(person) == "<Row('name', 'age')>"
    assert "name" in person
    alice = person("Alice", 11)
    assert alice == Row(name="Alice", age=11)
    assert (alice.name, alice.age) == ("Alice", 11)
    with pytest.raises(ValueError, match="expected 2 values"):
        person("Alice", 11, "extra")


def test_row_values_change_but_names_do_not() -> None:
    row = Row(id=1, name="a")
    row[0] = 2
    row["name"] = "b"
    assert row == Row(id=2, name="b")
    with pytest.raises(AttributeError, match="not as attributes"):
        row.name = "c"


def test_row_as_dict_recursive() -> None:
    row = Row(key=1, value=Row(name="a", tags=[Row(t="x")]))
    assert row.as_dict() == {"key": 1, "value": Row(name="a", tags=[Row(t="x")])}
    assert row.as_dict(recursive=True) == {"key": 1, "value": {"name": "a", "tags": [{"t": "x"}]}}


def test_row_kind() -> None:
    row = Row(1, "a")
    assert row.get_row_kind() is RowKind.INSERT
    row.set_row_kind(RowKind.UPDATE_AFTER)
    assert row.get_row_kind() is RowKind.UPDATE_AFTER
    assert row != Row(1, "a"), "the kind is part of a row's value"
    assert Row.of_kind(RowKind.DELETE, 1, "a").get_row_kind() is RowKind.DELETE
    assert [str(kind) for kind in RowKind] == ["+I", "-U", "+U", "-D"]
    with pytest.raises(TypeError, match="RowKind"):
        row.set_row_kind("+I")  # type: ignore[arg-type]


def test_row_equality_and_hash() -> None:
    assert Row(1, "a") == Row(1, "a") and Row(1, "a") != Row("a", 1)
    assert Row(id=1, name="a") == Row(name="a", id=1), "named rows compare by name, as PyFlink's"
    assert Row(id=1) != Row(1), "named and positional rows differ"
    assert Row(1, "a") != (1, "a")
    assert hash(Row(1, "a")) == hash((1, "a"))
    assert hash(Row(id=1, name="a")) == hash(Row(name="a", id=1))
    counts = {Row(1, "a"): 1, Row(id=1, name="a"): 2}
    assert counts[Row(1, "a")] == 1 and counts[Row(name="a", id=1)] == 2


def test_row_get_fields_by_names() -> None:
    row = Row(id=1, name="a", age=3)
    assert row.get_fields_by_names(["age", "id"]) == [3, 1]
    with pytest.raises(ValueError, match=r"\['x'\] do not exist"):
        row.get_fields_by_names(["x"])
    row2 = Row(1, "a")
    row2.set_field_names(["id", "name"])
    assert row2.name == "a"


@pytest.mark.parametrize(
    "dumps", [pickle.dumps, cloudpickle.dumps, copy.deepcopy], ids=["pickle", "cloudpickle", "deepcopy"]
)
def test_rows_survive_pickling_with_names_and_kind(dumps: object) -> None:
    """Rows cross TCP channels between Spark slots and sit in snapshots, both pickled."""
    named = Row.of_kind(RowKind.UPDATE_BEFORE, id=1, name="a")
    positional = Row(1, [2, 3])
    for row in (named, positional):
        copied = dumps(row) if dumps is copy.deepcopy else pickle.loads(dumps(row))  # type: ignore[operator]
        assert copied == row
        assert copied.get_row_kind() is row.get_row_kind()
        assert repr(copied) == repr(row)


# ---------------------------------------------------------------------------- printing as PyFlink prints

_TUPLE6 = Types.TUPLE(
    [Types.STRING(), Types.INT(), Types.LONG(), Types.DOUBLE(), Types.FLOAT(), Types.BOOLEAN()]
)

#: ``(value, type, line)``: what PyFlink 2.3 printed for ``env.from_collection([value],
#: type_info=type).print()`` (run on its local mini cluster).
PRINTED_BY_PYFLINK = [
    (("hi", 1, 2, 0.1, 110.1, True), _TUPLE6, "(hi,1,2,0.1,110.1,true)"),
    (("x", -5, 10**12, 1e7, 16.1, False), _TUPLE6, "(x,-5,1000000000000,1.0E7,16.1,false)"),
    ((None, 0, 0, 1e-4, 1e10, True), _TUPLE6, "(null,0,0,1.0E-4,1.0E10,true)"),
    (("a b", 7, -3, 123456.789, 0.5, False), _TUPLE6, "(a b,7,-3,123456.789,0.5,false)"),
    (("q", 1, 1, float("nan"), float("inf"), True), _TUPLE6, "(q,1,1,NaN,Infinity,true)"),
    (("q", 1, 1, 1e-3, 1e-3, True), _TUPLE6, "(q,1,1,0.001,0.001,true)"),
    (("q", 1, 1, 9999999.0, 1234567.0, True), _TUPLE6, "(q,1,1,9999999.0,1234567.0,true)"),
    (("q", 1, 1, 2.5e-5, 12345678.0, True), _TUPLE6, "(q,1,1,2.5E-5,1.2345678E7,true)"),
    *[
        (value, Types.DOUBLE(), line)
        for value, line in [
            (0.1, "0.1"),
            (1e7, "1.0E7"),
            (1e-4, "1.0E-4"),
            (123456.789, "123456.789"),
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (1e21, "1.0E21"),
            (1e300, "1.0E300"),
            (100.0, "100.0"),
            (1234567.125, "1234567.125"),
        ]
    ],
    *[
        (value, Types.FLOAT(), line)
        for value, line in [
            (0.1, "0.1"),
            (16.1, "16.1"),
            (110.1, "110.1"),
            (1e10, "1.0E10"),
            (20.1, "20.1"),
            (1e-5, "1.0E-5"),
            (123456.7, "123456.7"),
            (0.3333333333, "0.33333334"),
        ]
    ],
    (Row(1, "a"), Types.ROW([Types.INT(), Types.STRING()]), "+I[1,a]"),
    (Row(2, None), Types.ROW([Types.INT(), Types.STRING()]), "+I[2,None]"),
    (Row(id=1, name="a"), Types.ROW_NAMED(["id", "name"], [Types.INT(), Types.STRING()]), "+I[1,a]"),
    ({"a": 1}, Types.MAP(Types.STRING(), Types.INT()), "{a=1}"),
    (
        ("a", Row(1, "x")),
        Types.TUPLE([Types.STRING(), Types.ROW([Types.INT(), Types.STRING()])]),
        "(a,+I[1, x])",
    ),
    (("a", [1, 2]), Types.TUPLE([Types.STRING(), Types.LIST(Types.INT())]), "(a,[1, 2])"),
    (
        ("a", [1, 2], [3, 4], ["x", None]),
        Types.TUPLE(
            [
                Types.STRING(),
                Types.PRIMITIVE_ARRAY(Types.INT()),
                Types.BASIC_ARRAY(Types.INT()),
                Types.OBJECT_ARRAY(Types.STRING()),
            ]
        ),
        "(a,[1, 2],[3, 4],[x, null])",
    ),
    (datetime.date(2024, 1, 2), Types.SQL_DATE(), "2024-01-02"),
    (datetime.time(3, 4, 5), Types.SQL_TIME(), "03:04:05"),
    (datetime.datetime(2024, 1, 2, 3, 4, 5, 600000), Types.SQL_TIMESTAMP(), "2024-01-02 03:04:05.6"),
    (datetime.datetime(2024, 1, 2, 3, 4, 5), Types.SQL_TIMESTAMP(), "2024-01-02 03:04:05.0"),
    (decimal.Decimal("1.50"), Types.BIG_DEC(), "1.50"),
    (10**30, Types.BIG_INT(), "1000000000000000000000000000000"),
    (True, Types.BOOLEAN(), "true"),
    (False, Types.BOOLEAN(), "false"),
    (-3, Types.BYTE(), "-3"),
    (300, Types.SHORT(), "300"),
    (10**15, Types.LONG(), "1000000000000000"),
    ("hello world", Types.STRING(), "hello world"),
    (("a", 1), None, "('a', 1)"),
    ({"k": [1, 2.5]}, Types.PICKLED_BYTE_ARRAY(), "{'k': [1, 2.5]}"),
    (Row(1, "a"), None, "<Row(1, 'a')>"),
    (Row(id=1), None, "Row(id=1)"),
]


@pytest.mark.parametrize(
    ("value", "type_info", "line"), PRINTED_BY_PYFLINK, ids=[c[2] for c in PRINTED_BY_PYFLINK]
)
def test_values_print_as_pyflink_prints_them(
    value: object, type_info: TypeInformation | None, line: str
) -> None:
    assert format_as_flink(value, type_info) == line


def test_java_time_types_print_as_java_prints_them() -> None:
    """The ``java.time`` layouts (PyFlink 2.3's ``Types`` has no factory for them to run)."""
    local = LocalTimeTypeInfo.TimeType
    assert format_as_flink(datetime.date(2024, 1, 2), LocalTimeTypeInfo(local.LOCAL_DATE)) == "2024-01-02"
    assert format_as_flink(datetime.time(3, 4), LocalTimeTypeInfo(local.LOCAL_TIME)) == "03:04"
    assert (
        format_as_flink(datetime.time(3, 4, 5, 600000), LocalTimeTypeInfo(local.LOCAL_TIME)) == "03:04:05.600"
    )
    assert (
        format_as_flink(
            datetime.datetime(2024, 1, 2, 3, 4, 0, 123456), LocalTimeTypeInfo(local.LOCAL_DATE_TIME)
        )
        == "2024-01-02T03:04:00.123456"
    )
    assert format_as_flink(Instant.of_epoch_milli(1_500), Types.INSTANT()) == "1970-01-01T00:00:01.500Z"
    assert format_as_flink(Instant.of_epoch_milli(0), Types.INSTANT()) == "1970-01-01T00:00:00Z"


def test_print_writes_a_typed_stream_as_pyflink_does(capsys: pytest.CaptureFixture[str]) -> None:
    """The declared type follows the stream through operators that keep it (filter, key_by,
    reduce, timestamps) and is replaced by each ``output_type``; untyped streams print ``str``."""
    from chandy.datastream import OutputTag, StreamExecutionEnvironment

    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    typed = env.from_collection(
        [("hi", 1, 0.5, True), ("ho", 2, 1e7, False)],
        type_info=Types.TUPLE([Types.STRING(), Types.INT(), Types.DOUBLE(), Types.BOOLEAN()]),
    )
    typed.print("source")
    typed.filter(lambda t: t[1] > 1).key_by(lambda t: t[0]).reduce(lambda a, b: a).print("kept")
    typed.map(lambda t: Row(t[1], t[0]), output_type=Types.ROW([Types.INT(), Types.STRING()])).print("row")
    typed.map(lambda t: t[1] * 1.5, output_type=Types.DOUBLE()).print("double")
    typed.map(lambda t: t[:2]).print("untyped")
    odd = OutputTag("odd", Types.TUPLE([Types.STRING(), Types.INT()]))
    split = typed.process(lambda t, ctx: [(odd, t[:2])] if t[1] % 2 else [t[0]], output_type=Types.STRING())
    split.print("even")
    split.get_side_output(odd).print("odd")
    env.execute()

    lines = sorted(capsys.readouterr().out.splitlines())
    assert lines == [
        "double> 1.5",
        "double> 3.0",
        "even> ho",
        "kept> (ho,2,1.0E7,false)",
        "odd> (hi,1)",
        "row> +I[1,hi]",
        "row> +I[2,ho]",
        "source> (hi,1,0.5,true)",
        "source> (ho,2,1.0E7,false)",
        "untyped> ('hi', 1)",
        "untyped> ('ho', 2)",
    ]


def test_window_functions_take_pyflinks_type_parameters() -> None:
    """PyFlink's examples subscript the window functions as PyFlink declares them
    (``ProcessWindowFunction[IN, OUT, KEY, W]``, its ``Context[W]``); a different arity
    fails at class definition, before the job even starts."""
    from chandy.datastream import AggregateFunction, ProcessWindowFunction, WindowFunction
    from chandy.datastream.functions import AllWindowFunction, ProcessAllWindowFunction
    from chandy.datastream.window import CountWindow, TimeWindow

    class Count(ProcessWindowFunction[tuple, tuple, str, TimeWindow]):
        def process(self, key: str, context: ProcessWindowFunction.Context[TimeWindow], elements: Any) -> Any:
            return [(key, len(list(elements)))]

    class Sum(WindowFunction[tuple, tuple, str, CountWindow]):
        def apply(self, key: str, window: CountWindow, inputs: Any) -> Any:
            return [(key, sum(i[0] for i in inputs))]

    class AllCount(ProcessAllWindowFunction[tuple, int, TimeWindow]):
        def process(self, context: ProcessAllWindowFunction.Context[TimeWindow], elements: Any) -> Any:
            return [len(list(elements))]

    class AllSum(AllWindowFunction[tuple, int, TimeWindow]):
        def apply(self, window: TimeWindow, inputs: Any) -> Any:
            return [sum(i[0] for i in inputs)]

    class Average(AggregateFunction):
        def create_accumulator(self) -> Any:
            return (0, 0)

        def add(self, value: Any, accumulator: Any) -> Any:
            return accumulator[0] + value, accumulator[1] + 1

        def get_result(self, accumulator: Any) -> Any:
            return accumulator[0] / accumulator[1]

        def merge(self, acc_a: Any, acc_b: Any) -> Any:
            return acc_a[0] + acc_b[0], acc_a[1] + acc_b[1]

    assert Sum().apply("k", CountWindow(0), [(1,), (2,)]) == [("k", 3)]
    assert AllSum().apply(TimeWindow(0, 5), [(1,), (2,)]) == [3]
    assert Count and AllCount and Average().get_result((3, 2)) == 1.5


#: ``(record, type_info, what a function after PyFlink's from_collection(records, type_info)
#: receives)``: PyFlink hands a typed collection to Java and back, which turns a tuple into a
#: Row with the type's field names, a list into a tuple, a FLOAT into a 32-bit float.
RECEIVED_AFTER_FROM_COLLECTION = [
    ((1, "a"), Types.ROW([Types.INT(), Types.STRING()]), "Row(f0=1, f1='a')"),
    ((1, "a"), Types.ROW_NAMED(["id", "name"], [Types.INT(), Types.STRING()]), "Row(id=1, name='a')"),
    (
        Row(name="a", id=1),
        Types.ROW_NAMED(["id", "name"], [Types.INT(), Types.STRING()]),
        "Row(id=1, name='a')",
    ),
    ([1, "a"], Types.TUPLE([Types.INT(), Types.STRING()]), "(1, 'a')"),
    (0.1, Types.FLOAT(), "0.10000000149011612"),
    (0.1, Types.DOUBLE(), "0.1"),
    ((1, None), Types.ROW([Types.INT(), Types.STRING()]), "Row(f0=1, f1=None)"),
    ((1, "a"), None, "(1, 'a')"),
    ((1, "a"), Types.PICKLED_BYTE_ARRAY(), "(1, 'a')"),
]


def test_a_declared_row_type_keeps_the_row_kind() -> None:
    deleted = to_declared_type(Row.of_kind(RowKind.DELETE, 1, "a"), Types.ROW([Types.INT(), Types.STRING()]))
    assert repr(deleted) == "Row(f0=1, f1='a')" and deleted.get_row_kind() is RowKind.DELETE  # as PyFlink


def test_declared_containers_convert_their_elements() -> None:
    """Where PyFlink 2.3's from_collection cannot take them at all (it fails to build the
    job), chandy converts the elements as it converts a record of their type."""
    nested = Types.TUPLE([Types.STRING(), Types.LIST(Types.ROW([Types.INT(), Types.FLOAT()]))])
    assert repr(to_declared_type(("k", [(1, 2.5)]), nested)) == "('k', [Row(f0=1, f1=2.5)])"
    pairs = Types.MAP(Types.STRING(), Types.TUPLE([Types.INT(), Types.STRING()]))
    assert to_declared_type({"a": [1, "x"]}, pairs) == {"a": (1, "x")}


def test_from_collection_gives_functions_what_pyflink_gives_them() -> None:
    """PyFlink's own basic_operations.py reads ``data.info`` from tuples it declared as
    ``Types.ROW_NAMED(["id", "info"], ...)``: the declared type turns them into rows."""
    from chandy.datastream import StreamExecutionEnvironment

    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    streams = [
        env.from_collection([record], type_info=t).map(repr)
        for record, t, _ in RECEIVED_AFTER_FROM_COLLECTION
    ]
    received = streams[0].union(*streams[1:]).execute_and_collect(limit=100)
    assert sorted(received) == sorted(expected for _, _, expected in RECEIVED_AFTER_FROM_COLLECTION)


def test_sum_adds_a_field_of_rows_by_position_or_name() -> None:
    """PyFlink's ``sum`` works on a stream of rows; the other fields are the first row's."""
    from chandy.datastream import StreamExecutionEnvironment

    rows = Types.ROW_NAMED(["k", "v", "note"], [Types.STRING(), Types.INT(), Types.STRING()])
    for position in (1, "v"):
        env = StreamExecutionEnvironment.get_execution_environment(executor="local")
        env.set_parallelism(1)
        sums = (
            env.from_collection([("a", 1, "first"), ("a", 2, "second"), ("b", 5, "only")], type_info=rows)
            .key_by(lambda r: r.k)
            .sum(position)
        )
        assert sorted(sums.execute_and_collect(limit=10), key=lambda r: (r.k, r.v)) == [
            Row(k="a", v=1, note="first"),
            Row(k="a", v=3, note="first"),
            Row(k="b", v=5, note="only"),
        ], position


def test_get_config_sets_the_auto_watermark_interval_as_pyflink_does() -> None:
    """PyFlink jobs tune watermarks with ``env.get_config().set_auto_watermark_interval(ms)``;
    it writes the key ``env.configure`` would, so both spellings are one setting."""
    from chandy.common import ExecutionConfig
    from chandy.config.options import PipelineOptions
    from chandy.datastream import StreamExecutionEnvironment

    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    config = env.get_config()
    assert isinstance(config, ExecutionConfig)
    assert config.get_auto_watermark_interval() == 200, "Flink's default"
    assert config.set_auto_watermark_interval(50) is config
    assert env.get_config().get_auto_watermark_interval() == 50
    assert env.get_configuration().get(PipelineOptions.AUTO_WATERMARK_INTERVAL) == 50
    env.configure({"pipeline.auto-watermark-interval": "0 ms"})
    assert env.get_config().get_auto_watermark_interval() == 0
    with pytest.raises(ConfigurationError, match="auto-watermark-interval"):
        config.set_auto_watermark_interval(-1)


def test_a_row_can_be_a_key_as_in_pyflink() -> None:
    """PyFlink jobs key by several fields with ``key_by(lambda r: Row(r.a, r.b),
    key_type=Types.ROW([...]))``: equal rows are one key, in every process."""
    import subprocess
    import sys

    from chandy.datastream import StreamExecutionEnvironment
    from chandy.state.key_groups import stable_hash

    code = "from chandy.core.types import Row\nfrom chandy.state.key_groups import stable_hash\n"
    code += "print(stable_hash(Row(1, 'a')), stable_hash(Row(id=1, name='a')))"
    other_process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other_process.stdout.split() == [
        str(stable_hash(Row(1, "a"))),
        str(stable_hash(Row(name="a", id=1))),
    ]

    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    rows = Types.ROW_NAMED(["city", "kind", "n"], [Types.STRING(), Types.STRING(), Types.INT()])
    records = [("oslo", "a", 1), ("oslo", "b", 2), ("rome", "a", 3), ("oslo", "a", 4), ("rome", "a", 5)]
    totals = (
        env.from_collection(records, type_info=rows)
        .key_by(lambda r: Row(r.city, r.kind), key_type=Types.ROW([Types.STRING(), Types.STRING()]))
        .reduce(lambda a, b: Row(city=a.city, kind=a.kind, n=a.n + b.n))
    )
    finals: dict[tuple[str, str], int] = {}
    for row in totals.execute_and_collect(limit=10):
        finals[(row.city, row.kind)] = max(finals.get((row.city, row.kind), 0), row.n)
    assert finals == {("oslo", "a"): 5, ("oslo", "b"): 2, ("rome", "a"): 8}


@pytest.mark.parametrize(
    ("value", "type_info"),
    [
        (7, Types.TUPLE([Types.INT()])),
        ("text", Types.TUPLE([Types.STRING()])),
        ({"a": 1}, Types.ROW([Types.INT()])),
        (3, Types.LIST(Types.INT())),
        ([1], Types.MAP(Types.INT(), Types.INT())),
        ("yes", Types.BOOLEAN()),
        ("1.5", Types.DOUBLE()),
        (True, Types.FLOAT()),
        ("10:00", LocalTimeTypeInfo(LocalTimeTypeInfo.TimeType.LOCAL_TIME)),
    ],
    ids=repr,
)
def test_a_value_that_does_not_fit_its_declared_type_prints_as_str(
    value: object, type_info: TypeInformation
) -> None:
    """PyFlink would fail to serialize it; chandy never converts, so the job runs, and
    printing it must not be what fails."""
    assert format_as_flink(value, type_info) == str(value)


#: The operators and partitionings of issue 14's "more operators" part, with PyFlink 2.3's
#: parameter names (copied from pyflink/datastream/data_stream.py): a ported job that passes
#: them by keyword must run unchanged.
OPERATOR_SIGNATURES: list[tuple[str, str, list[str]]] = [
    ("KeyedStream", "min", ["position_to_min"]),
    ("KeyedStream", "max", ["position_to_max"]),
    ("KeyedStream", "min_by", ["position_to_min_by"]),
    ("KeyedStream", "max_by", ["position_to_max_by"]),
    ("KeyedStream", "sum", ["position_to_sum"]),
    ("DataStream", "rescale", []),
    ("DataStream", "partition_custom", ["partitioner", "key_selector"]),
]


@pytest.mark.parametrize(("cls", "method", "parameters"), OPERATOR_SIGNATURES, ids=lambda v: str(v))
def test_more_operators_have_pyflinks_parameter_names(cls: str, method: str, parameters: list[str]) -> None:
    stream_class = getattr(importlib.import_module("chandy.datastream"), cls)
    assert list(inspect.signature(getattr(stream_class, method)).parameters)[1:] == parameters


@pytest.mark.parametrize("module", ["chandy.datastream", "chandy.datastream.functions"])
def test_partitioner_resolves_under_pyflinks_paths(module: str) -> None:
    from chandy.core.functions import Partitioner

    assert getattr(importlib.import_module(module), "Partitioner") is Partitioner


#: Issue 14's broadcast state, under PyFlink 2.3's paths (pyflink/datastream/__init__.py,
#: functions.py, state.py and data_stream.py export these).
BROADCAST_IMPORTS: dict[str, list[str]] = {
    "datastream": [
        "BroadcastStream",
        "BroadcastConnectedStream",
        "BroadcastProcessFunction",
        "KeyedBroadcastProcessFunction",
    ],
    "datastream.functions": [
        "BaseBroadcastProcessFunction",
        "BroadcastProcessFunction",
        "KeyedBroadcastProcessFunction",
    ],
    "datastream.state": ["ReadOnlyBroadcastState", "BroadcastState", "MapStateDescriptor"],
    "datastream.data_stream": ["BroadcastStream", "BroadcastConnectedStream"],
}
BROADCAST_HOME = {
    "BroadcastStream": "chandy.api.broadcast_stream",
    "BroadcastConnectedStream": "chandy.api.broadcast_stream",
    "BaseBroadcastProcessFunction": "chandy.core.functions",
    "BroadcastProcessFunction": "chandy.core.functions",
    "KeyedBroadcastProcessFunction": "chandy.core.functions",
    "ReadOnlyBroadcastState": "chandy.core.state",
    "BroadcastState": "chandy.core.state",
    "MapStateDescriptor": "chandy.core.state",
}


@pytest.mark.parametrize(("module", "name"), _imports(BROADCAST_IMPORTS), ids=lambda v: v)
def test_broadcast_state_names_resolve_under_pyflinks_paths(module: str, name: str) -> None:
    home = importlib.import_module(BROADCAST_HOME[name])
    assert getattr(importlib.import_module(module), name) is getattr(home, name)


#: PyFlink 2.3's parameter names of the broadcast API (pyflink/datastream/data_stream.py and
#: functions.py): a ported job that passes them by keyword runs unchanged.
BROADCAST_SIGNATURES: list[tuple[str, str, str, list[str]]] = [
    (
        "chandy.datastream",
        "DataStream",
        "broadcast",
        ["broadcast_state_descriptor", "other_broadcast_state_descriptors"],
    ),
    ("chandy.datastream", "DataStream", "connect", ["ds"]),
    ("chandy.datastream", "BroadcastConnectedStream", "process", ["func", "output_type"]),
    ("chandy.datastream", "BroadcastProcessFunction", "process_element", ["value", "ctx"]),
    ("chandy.datastream", "BroadcastProcessFunction", "process_broadcast_element", ["value", "ctx"]),
    ("chandy.datastream", "KeyedBroadcastProcessFunction", "on_timer", ["timestamp", "ctx"]),
    ("chandy.datastream.state", "OperatorStateStore", "get_broadcast_state", ["state_descriptor"]),
]


@pytest.mark.parametrize(
    ("module", "cls", "method", "parameters"), BROADCAST_SIGNATURES, ids=lambda v: str(v)
)
def test_the_broadcast_api_has_pyflinks_parameter_names(
    module: str, cls: str, method: str, parameters: list[str]
) -> None:
    owner = getattr(importlib.import_module(module), cls)
    assert list(inspect.signature(getattr(owner, method)).parameters)[1:] == parameters
