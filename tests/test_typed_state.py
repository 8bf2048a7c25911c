"""Typed state is written as data, and every other pickle a restore reads is restricted.

A state whose descriptor declares PyFlink ``Types`` is written without pickle (its key
groups say which type wrote them) and restored without pickle, on both backends and both
executors; a restore whose declared type cannot read the state fails once, naming both
types; savepoints written before typed state restore. Pickled state, restored, goes through
the restricted unpickler: the job's own classes come back, a gadget never runs. The
backend-level tests use real backends and real RocksDB databases; the job tests run real
jobs on the local executor and on Spark (docs/security.md, docs/state-backends.md).
"""

from __future__ import annotations

import datetime
import decimal
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

from chandy import JobExecutionError, StreamExecutionEnvironment
from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.config.options import SavepointFormatType
from chandy.core.state import (
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    StateTtlConfig,
    ValueState,
    ValueStateDescriptor,
)
from chandy.core.time import Time
from chandy.core.types import Instant, Row, RowKind, Types
from chandy.errors import UnrecoverableError
from chandy.state.codec import decode, decode_from
from chandy.state.handles import ByteStreamStateHandle
from chandy.state.heap import HeapKeyedStateBackend, IncompatibleStateTypeError, SerializedKeyedState
from chandy.state.key_group_format import MAGIC, read_key_group
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.state.operator_state import OperatorStateBackend
from chandy.state.rocksdb.layout import META_COLUMN_FAMILY, parse_catalogue_entry, state_id, table_prefix
from chandy.state.typed import StateSerializer, StateValueTypeError, compatible, type_of_spec
from chandy.state.unpickling import UnpicklingPolicy
from chandy.storage.checkpoint_storage import StateReader
from chandy.storage.snapshot_key import environment_key
from tests.jobs import HoldingSequence
from tests.state_backends import on_rocksdb_too
from tests.test_checkpointing_e2e import checkpointing_env, retained_checkpoint_of_cancelled_job
from tests.test_restore import fails_at_once
from tests.test_rocksdb_canonical import handle_of, heap_snapshot, in_memory, rocksdb_backend  # noqa: F401
from tests.test_snapshot_security import handles, poison, restore, split
from tests.typed_jobs import KeepsAGadget, N, Point, Tally, expected_summaries, summary_job
from tests.unaligned_jobs import wait_for

MAX_PARALLELISM = 128
ALL = KeyGroupRange(0, MAX_PARALLELISM - 1)
FIXTURES = Path(__file__).parent / "data" / "before-typed-state"


def refuse(pickled: bytes) -> Any:
    raise AssertionError(f"a typed state's bytes hold a pickle: {pickled[:40]!r}")


def at(backend: Any, key: Any) -> None:
    backend.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))


# ---------------------------------------------------------------------- the serializers


VALUES: list[tuple[Any, list[Any]]] = [
    (Types.LONG(), [0, -(2**63), 2**63 - 1, 2**80, True]),
    (Types.INT(), [7]),
    (Types.DOUBLE(), [1.5, float("inf"), 3]),
    (Types.STRING(), ["", "héllo \udcff"]),
    (Types.BOOLEAN(), [False]),
    (Types.BIG_DEC(), [decimal.Decimal("-1.250"), 4]),
    (Types.SQL_DATE(), [datetime.date(2024, 2, 29)]),
    (Types.SQL_TIME(), [datetime.time(23, 59, 1, 5)]),
    (Types.SQL_TIMESTAMP(), [datetime.datetime(2024, 1, 2, 3, 4, 5, 6)]),
    (Types.INSTANT(), [Instant(1_700_000_000, 999)]),
    (Types.PRIMITIVE_ARRAY(Types.BYTE()), [b"\x00\xff", [1, 2]]),
    (Types.BASIC_ARRAY(Types.STRING()), [["a", None]]),
    (Types.LIST(Types.TUPLE([Types.STRING(), Types.LONG()])), [[("a", 1), ["b", 2]], ()]),
    (Types.MAP(Types.STRING(), Types.LIST(Types.DOUBLE())), [{"k": [1.0, None]}, {}]),
    (Types.TUPLE([Types.STRING(), Types.LONG()]), [("a", 1), ["b", None], Point("c", 2)]),
    (Types.ROW([Types.LONG(), Types.STRING()]), [Row(1, "x"), (2, "y")]),
    (Types.ROW_NAMED(["a", "b"], [Types.LONG(), Types.STRING()]), [Row(a=1, b="x")]),
    (Types.TUPLE([Types.STRING(), Types.PICKLED_BYTE_ARRAY()]), [("a", {"anything": {1}})]),
]


@pytest.mark.parametrize(("declared", "values"), VALUES, ids=[repr(t) for t, _ in VALUES])
def test_every_declared_type_round_trips_as_data(declared: Any, values: list[Any]) -> None:
    serializer = StateSerializer("s", "value", declared)
    assert type_of_spec(serializer.spec) == declared
    data_only = "Pickled" not in serializer.spec
    for value in values:
        restored = decode(serializer.encode(value), refuse if data_only else pickle.loads)
        expected = tuple(value) if type(value) is Point else value  # a named tuple's fields
        assert restored == expected and type(restored) is type(expected), (value, restored)


def test_a_row_keeps_its_names_and_kind() -> None:
    row = Row.of_kind(RowKind.UPDATE_AFTER, a=1, b="x")
    serializer = StateSerializer("s", "value", Types.ROW_NAMED(["a", "b"], [Types.LONG(), Types.STRING()]))
    restored = decode(serializer.encode(row), refuse)
    assert restored == row and restored.b == "x" and restored.get_row_kind() is RowKind.UPDATE_AFTER


@pytest.mark.parametrize(
    ("declared", "value", "shown"),
    [
        (Types.LONG(), "7", "'7' (a str) where Long is declared"),
        (Types.STRING(), 7, "7 (a int) where String is declared"),
        (Types.TUPLE([Types.STRING(), Types.LONG()]), ("a", 1, 2), "TupleTypeInfo(String, Long) is declared"),
        (Types.LIST(Types.DOUBLE()), [1.0, "x"], "'x' (a str) where Double is declared"),
        (Types.SQL_DATE(), datetime.time(1), "(a datetime.time) where DateTypeInfo is declared"),
    ],
)
def test_a_value_that_does_not_fit_its_type_fails_naming_the_state_and_both_types(
    declared: Any, value: Any, shown: str
) -> None:
    with pytest.raises(StateValueTypeError) as error:
        StateSerializer("count", "value", declared).encode(value)
    message = str(error.value)
    assert "state 'count' is declared as" in message and shown in message
    assert "PICKLED_BYTE_ARRAY" in message and isinstance(error.value, UnrecoverableError)


def test_compatibility_is_by_family() -> None:
    assert compatible(Types.INT(), Types.LONG()) and compatible(Types.FLOAT(), Types.DOUBLE())
    assert compatible(Types.CHAR(), Types.STRING())
    assert compatible(Types.LIST(Types.INT()), Types.BASIC_ARRAY(Types.LONG()))
    assert compatible(Types.ROW([Types.LONG()]), Types.ROW_NAMED(["n"], [Types.INT()]))
    assert compatible(Types.PICKLED_BYTE_ARRAY(), Types.STRING())  # pickled holds anything
    assert not compatible(Types.LONG(), Types.STRING())
    assert not compatible(Types.LONG(), Types.DOUBLE())
    assert not compatible(Types.TUPLE([Types.LONG()]), Types.TUPLE([Types.LONG(), Types.LONG()]))
    assert not compatible(Types.TUPLE([Types.LONG()]), Types.ROW([Types.LONG()]))
    assert not compatible(Types.MAP(Types.STRING(), Types.LONG()), Types.MAP(Types.LONG(), Types.LONG()))


# ---------------------------------------------------------------------- the backends


COUNT = ValueStateDescriptor("count", Types.LONG())
NAMES = ListStateDescriptor("names", Types.STRING())
PRICES = MapStateDescriptor("prices", Types.STRING(), Types.DOUBLE())
LAST = ValueStateDescriptor("last", Types.ROW_NAMED(["value", "parity"], [Types.LONG(), Types.STRING()]))
KEPT = ValueStateDescriptor("kept")  # no type: pickled


def fill(backend: Any, keys: range) -> None:
    count, names, prices, last, kept = (
        backend.get_partitioned_state(d) for d in (COUNT, NAMES, PRICES, LAST, KEPT)
    )
    for key in keys:
        at(backend, key)
        count.update(key * 10)
        names.add_all([f"n{key}", "x"])
        prices.put_all({"a": key / 2, "b": 1.0})
        last.update(Row(value=key, parity="even" if key % 2 == 0 else "odd"))
        kept.update(Tally(key, -key))


def check(backend: Any, keys: range | list[int]) -> None:
    count, names, prices, last, kept = (
        backend.get_partitioned_state(d) for d in (COUNT, NAMES, PRICES, LAST, KEPT)
    )
    assert isinstance(count, ValueState) and isinstance(names, ListState) and isinstance(prices, MapState)
    for key in keys:
        at(backend, key)
        assert count.value() == key * 10
        assert list(names.get()) == [f"n{key}", "x"]
        assert dict(prices.items()) == {"a": key / 2, "b": 1.0}
        assert last.value() == Row(value=key, parity="even" if key % 2 == 0 else "odd")  # type: ignore[attr-defined]
        assert kept.value() == Tally(key, -key)  # type: ignore[attr-defined]


def typed_payloads(serialized: SerializedKeyedState) -> dict[str, str]:
    """Every state's recorded type (``""``: pickled) over the snapshot's key groups, checking
    that a typed state's bytes decode without a single pickle."""
    found: dict[str, str] = {}
    for start, end in serialized.ranges:
        blob = serialized.payload[start:end]
        if not blob:
            continue
        assert blob.startswith(MAGIC)
        for name, (_, values, spec) in read_key_group(blob, "test", JOB).items():
            found[name] = spec or ""
            assert values
    return found


JOB = UnpicklingPolicy(user_modules=frozenset({"tests.typed_jobs"}))
ROW_SPEC = '["Row",["Long","String"],["value","parity"]]'


def test_the_heap_writes_typed_state_as_data_and_restores_it_rescaled() -> None:
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    fill(heap, range(200))
    serialized = heap_snapshot(heap)
    assert typed_payloads(serialized) == {
        "count": '"Long"',
        "names": '"String"',
        "prices": '["Map","String","Double"]',
        "last": ROW_SPEC,
        "kept": "",
    }
    halves = [KeyGroupRange(0, 63), KeyGroupRange(64, 127)]
    restored = []
    for half in halves:
        backend = HeapKeyedStateBackend(half, MAX_PARALLELISM)
        backend.restore([handle_of(serialized)], StateReader(), JOB)
        restored.append(backend)
    for backend, half in zip(restored, halves, strict=True):
        check(backend, [k for k in range(200) if assign_to_key_group(k, MAX_PARALLELISM) in half])


def test_a_snapshot_of_typed_state_only_is_read_without_any_class() -> None:
    """The default policy resolves no class of any job: typed state needs none."""
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    count, last = heap.get_partitioned_state(COUNT), heap.get_partitioned_state(LAST)
    for key in range(50):
        at(heap, key)
        count.update(key)  # type: ignore[attr-defined]
        last.update(Row(value=key, parity="?"))  # type: ignore[attr-defined]
    restored = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    restored.restore([handle_of(heap_snapshot(heap))], StateReader(), UnpicklingPolicy())
    at(restored, 7)
    assert restored.get_partitioned_state(LAST).value() == Row(value=7, parity="?")  # type: ignore[attr-defined]


def test_rocksdb_keeps_typed_values_as_data_records_their_type_and_restores_them(
    rocksdb_backend: Any,  # noqa: F811 - the fixture of tests/test_rocksdb_canonical.py
) -> None:
    backend = rocksdb_backend()
    fill(backend, range(100))
    backend.flush()
    meta = backend.db.get_column_family(META_COLUMN_FAMILY)
    catalogue = {k.decode(): parse_catalogue_entry(v) for k, v in meta.items()}
    assert catalogue["count"] == ("value", '"Long"') and catalogue["kept"] == ("value", None)
    assert catalogue["prices"] == ("map", '["Map","String","Double"]')
    for name in ("count", "names", "prices", "last"):
        for key in range(100):
            prefix = table_prefix(assign_to_key_group(key, MAX_PARALLELISM), state_id(name))
            for _, data in backend.db.items(from_key=prefix):
                if not _.startswith(prefix):
                    break
                decode(data, refuse)  # no pickle anywhere in a typed state's values
    # its canonical snapshot restores on the heap, typed, and back into RocksDB
    snapshot = backend.snapshot(canonical=True)
    try:
        serialized = in_memory(snapshot.serialize())
    finally:
        snapshot.release()
    assert typed_payloads(serialized)["names"] == '"String"'
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    heap.restore([handle_of(serialized)], StateReader(), JOB)
    check(heap, range(100))
    again = rocksdb_backend()
    again.restore([handle_of(heap_snapshot(heap))], StateReader(), JOB)
    check(again, range(100))
    restored_meta = again.db.get_column_family(META_COLUMN_FAMILY)
    assert (
        parse_catalogue_entry(restored_meta.get(b"last"))[1] == '["Row",["Long","String"],["value","parity"]]'
    )


def test_state_pickled_before_typed_state_restores_and_is_written_typed_once_declared() -> None:
    # the heap's format before typed state: one pickle per key group
    legacy = pickle.dumps(
        {"count": ("value", {1: 10, 2: 20}), "kept": ("value", {1: Tally(1, 2)})}, protocol=5
    )
    kg = assign_to_key_group(1, MAX_PARALLELISM)
    ranges = tuple((0, len(legacy)) if g == kg else (0, 0) for g in ALL)
    old = SerializedKeyedState(ALL, legacy, ranges, (("count", "value"), ("kept", "value")))
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    heap.restore([handle_of(old)], StateReader(), JOB)
    count = heap.get_partitioned_state(COUNT)
    at(heap, 1)
    assert count.value() == 10  # type: ignore[attr-defined]
    assert typed_payloads(heap_snapshot(heap))["count"] == '"Long"'


def test_a_declared_type_that_cannot_read_the_restored_state_is_refused_naming_both() -> None:
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    fill(heap, range(10))
    serialized = heap_snapshot(heap)
    restored = HeapKeyedStateBackend(ALL, MAX_PARALLELISM, owner="operator 'Summary' (uid 'summary')")
    restored.restore([handle_of(serialized)], StateReader(), JOB)
    restored.get_partitioned_state(ValueStateDescriptor("count", Types.INT()))  # the same family
    with pytest.raises(IncompatibleStateTypeError) as error:
        restored.get_partitioned_state(ListStateDescriptor("names", Types.LONG()))
    message = str(error.value)
    assert "operator 'Summary' (uid 'summary') cannot restore state 'names'" in message
    assert "written as String" in message and "declares it as Long" in message
    assert (error.value.written, error.value.declared) == ("String", "Long")


def test_a_typed_state_holding_a_value_of_another_type_fails_the_snapshot_naming_it() -> None:
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    count = heap.get_partitioned_state(COUNT)
    at(heap, 1)
    count.update("ten")  # type: ignore[attr-defined]
    with pytest.raises(StateValueTypeError, match="state 'count' is declared as Long"):
        heap_snapshot(heap)


def test_typed_state_with_a_time_to_live_stores_its_timestamps_as_data() -> None:
    descriptor = ListStateDescriptor("recent", Types.STRING())
    descriptor.enable_time_to_live(StateTtlConfig.new_builder(Time.seconds(60)).build())
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    recent = heap.get_partitioned_state(descriptor)
    at(heap, "k")
    recent.add("a")  # type: ignore[attr-defined]
    serialized = heap_snapshot(heap)
    assert typed_payloads(serialized) == {"recent": '"String"'}
    restored = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    restored.restore([handle_of(serialized)], StateReader())
    at(restored, "k")
    assert list(restored.get_partitioned_state(descriptor).get()) == ["a"]  # type: ignore[attr-defined]


def test_typed_operator_and_broadcast_state_are_data_and_untyped_stays_pickled() -> None:
    backend = OperatorStateBackend()
    backend.get_list_state(ListStateDescriptor("offsets", Types.LONG())).update([1, 2])
    backend.get_list_state(ListStateDescriptor("anything")).update([Tally(1, 1)])
    rules = backend.get_broadcast_state(MapStateDescriptor("rules", Types.STRING(), Types.DOUBLE()))
    rules.put("a", 1.5)
    snapshot = backend.snapshot()
    assert snapshot is not None
    payload, metas = snapshot
    for name in ("offsets", "rules"):
        for start, end in metas[name].elements:
            decode_from(payload[start:end], 0, refuse)  # data
    start, end = metas["anything"].elements[0]
    assert payload[start] == 0x80  # a pickle
    restored = OperatorStateBackend()
    restored.restore([(metas, ByteStreamStateHandle("operator", payload))], StateReader().read, JOB)
    assert restored.states["offsets"].elements == [1, 2]
    assert restored.states["anything"].elements == [Tally(1, 1)]
    assert restored.broadcast_states["rules"].entries == {"a": 1.5}


# ---------------------------------------------------------------------- jobs


def format_of(state_backend: str) -> SavepointFormatType:
    """Savepoints of the heap canonical, of RocksDB native (its database files as they are)."""
    return SavepointFormatType.CANONICAL if state_backend == "hashmap" else SavepointFormatType.NATIVE


def savepoint_of(
    tmp_path: Path, executor: str, format_type: SavepointFormatType, count_type: Any = None
) -> Path:
    """Run :func:`summary_job` until its first checkpoint, then stop it with a savepoint
    (no key is complete yet: its sources hold a quarter of the way)."""
    env = checkpointing_env(executor=executor, interval_ms=50)
    results = summary_job(env, N // 8, count_type).execute_and_collect("typed state, first run")
    client = results.job_client
    wait_for(lambda: client.get_checkpoint_statistics()["counts"]["completed"] > 0, "a checkpoint")
    future = client.stop_with_savepoint(
        savepoint_directory=str(tmp_path / "savepoints"), format_type=format_type
    )
    location = Path(future.result(120))
    assert list(results) == []
    return location


def restored_run(location: Path, executor: str, parallelism: int = 3, **config: Any) -> list[Any]:
    env = restored_summary_env(location, executor, parallelism, **config)
    return sorted(summary_job(env, None).execute_and_collect("typed state, restored"))


def restored_summary_env(
    location: Path, executor: str, parallelism: int, **config: Any
) -> StreamExecutionEnvironment:
    env = checkpointing_env(executor=executor, parallelism=parallelism, interval_ms=50, **config)
    env.set_restore_path(str(location))
    return env


def typed_states_in(location: Path) -> dict[str, str]:
    """The types a canonical savepoint records for the summary's states, checking on the way
    that every typed state's key groups decode without a pickle."""
    metadata, _ = load_checkpoint_metadata(str(location), environment_key())
    reader = StateReader()
    found: dict[str, str] = {}
    for operator in metadata.operator_states:
        for subtask in operator.subtask_states.values():
            for handle in subtask.managed_keyed_state:
                for _, byte_range in handle.key_groups():  # type: ignore[attr-defined]
                    if byte_range[1] > byte_range[0]:
                        blob = reader.read(handle.delegate, byte_range)
                        for name, (_, _, spec) in read_key_group(blob, "test", JOB).items():
                            found[name] = spec or ""
    return found


@on_rocksdb_too(executor=("local", "spark"))
def test_typed_state_round_trips_through_a_savepoint_and_a_restore_at_another_parallelism(
    tmp_path: Path, executor: str, state_backend: str
) -> None:
    """Canonical savepoints on the heap (their bytes checked), native ones on RocksDB (its
    database files, restored as they are); either way the restored run reads every value
    back with the type it stored, the dataclass and the named tuple of the job's own module
    too, and finishes every key with the totals of the whole sequence."""
    location = savepoint_of(tmp_path, executor, format_of(state_backend))
    if state_backend == "hashmap":
        assert typed_states_in(location) == {
            "count": '"Long"',
            "seen": '"String"',
            "sums": '["Map","String","Double"]',
            "last": ROW_SPEC,
            "tally": "",
            "point": "",
        }
    assert restored_run(location, executor) == expected_summaries()


@on_rocksdb_too(executor="local")
def test_an_incompatible_declared_type_fails_the_job_once_naming_the_state_and_both_types(
    tmp_path: Path, executor: str, state_backend: str
) -> None:
    location = savepoint_of(tmp_path, executor, format_of(state_backend))
    env = restored_summary_env(location, executor, 2)
    summary_job(env, None, Types.STRING()).print()
    error = fails_at_once(env, "uid 'summary'", "state 'count'", "written as Long", "declares it as String")
    if executor == "local":
        assert isinstance(error.__cause__, IncompatibleStateTypeError)


@pytest.mark.parametrize(
    ("fixture", "executor", "backend"),
    [
        ("canonical", "local", "hashmap"),
        ("canonical", "spark", "hashmap"),
        ("canonical", "local", "rocksdb"),
        ("native", "local", "rocksdb"),
    ],
)
def test_a_savepoint_written_before_typed_state_restores(
    tmp_path: Path, fixture: str, executor: str, backend: str, request: pytest.FixtureRequest
) -> None:
    """Written by chandy 22b6db5 (tests/scripts/make_savepoints_before_typed_state.py): every
    state pickled, in the old key-group format and, natively, the old RocksDB values. The job
    now declares types; the run reads the old values and finishes every key."""
    if executor == "spark":
        request.getfixturevalue("spark_session")
    location = tmp_path / "savepoint"
    shutil.copytree(FIXTURES / fixture, location)
    config: dict[str, Any] = {}
    if backend == "rocksdb":
        config = {
            "state.backend.type": "rocksdb",
            "state.backend.rocksdb.localdir": str(tmp_path / "rocksdb"),
        }
    assert restored_run(location, executor, **config) == expected_summaries()


# ---------------------------------------------------------------------- gadgets


@on_rocksdb_too(executor=("local", "spark"))
def test_a_gadget_in_a_snapshots_pickled_state_is_refused_and_never_runs(
    tmp_path: Path, executor: str, state_backend: str
) -> None:
    """A job's state holds an object that pickles as ``os.system("touch marker")`` (what a
    crafted snapshot would hold, here in a savepoint this deployment signed). Before, the
    restore ran the command (the heap: at once; RocksDB: at the first read of the key). Now
    the restricted unpickler refuses it: the job fails once, naming the state and the call."""
    marker = tmp_path / "ran-the-gadget"
    env = checkpointing_env(executor=executor, interval_ms=50)
    collected = gadget_job(env, marker, hold_after=10).execute_and_collect("keeps a gadget")
    client = collected.job_client
    wait_for(lambda: client.get_checkpoint_statistics()["counts"]["completed"] > 0, "a checkpoint")
    target = str(tmp_path / "sp")
    future = client.stop_with_savepoint(savepoint_directory=target, format_type=format_of(state_backend))
    location = Path(future.result(120))
    assert "stored" in list(collected)
    assert not marker.exists()

    # the restored run reads on to number 30: the gadget's key again, whose state is read
    env = restored_summary_env(location, executor, 2)
    gadget_job(env, marker, hold_after=None).print()
    fails_at_once(env, "uid 'keeper'", "state 'kept'", "names posix.system", "allowed-pickle-modules")
    assert not marker.exists()


def gadget_job(env: StreamExecutionEnvironment, marker: Path, hold_after: int | None) -> Any:
    """0..99 into :class:`KeepsAGadget`: numbers 5 (in the first run) and 30 (in the restored
    one) are the key "gadget", the others keys 0..2."""
    numbers = env.from_source(HoldingSequence(0, 99, hold_after), source_name="numbers").uid("numbers")
    stream = numbers.map(lambda x: "gadget" if x in (5, 30) else x % 3)
    return stream.key_by(lambda v: v).process(KeepsAGadget(str(marker))).uid("keeper")


@on_rocksdb_too(executor="local", incremental=False)
def test_a_trusted_crafted_snapshot_is_refused_by_the_restricted_unpickler(
    tmp_path: Path, executor: str, state_backend: str
) -> None:
    """``--trust-snapshot`` lets an unsigned snapshot through the signature check; its state
    is still only unpickled as data: the crafted pickle in every handle (keyed and operator
    state) is refused and the marker never appears."""
    retained = retained_checkpoint_of_cancelled_job(tmp_path / "checkpoints")
    marker = tmp_path / "ran-the-attackers-code"
    poison(retained, marker)
    assert handles(split((retained / "_metadata").read_bytes())[1])
    with pytest.raises(JobExecutionError) as error:
        restore(retained, executor, **{"execution.state-recovery.trust-snapshot": True})
    message = str(error.value)
    assert "names pathlib.Path.touch" in message and "allowed-pickle-modules" in message
    assert not marker.exists()
