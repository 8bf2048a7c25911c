"""The batch path's operators (chandy/task/operators/batch.py), driven by hand.

Keyed operators run on a real ColumnarKeyedStateBackend, and a "restore" goes through the
whole snapshot protocol (synchronous part, serializer, checkpoint storage, restore), so state
carrying over between batches is checked the way a task would carry it. Every aggregation is
compared with a plain-Python model of Flink/Spark SQL's semantics (nulls skipped; a key
without a value yet aggregates to null) on randomized batches.
"""

from __future__ import annotations

import math
import platform
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chandy.core.functions import KeyedBatchFunction, KeyedBatchState, MapBatchesFunction
from chandy.core.types import Row
from chandy.errors import UnrecoverableError
from chandy.state.arrow_keys import KEY_COLUMN, KEY_GROUP_COLUMN, key_groups_of
from chandy.state.columnar import ColumnarKeyedStateBackend
from chandy.state.handles import KeyedStateHandle
from chandy.state.heap import HeapKeyedStateBackend
from chandy.state.key_groups import KeyGroupRange
from chandy.storage.checkpoint_storage import CheckpointStorage, StateReader
from chandy.task.batches import TimestampedBatch
from chandy.task.operators.base import StateInitializationContext, StreamOperator
from chandy.task.operators.batch import (
    AGGREGATE_FUNCTIONS,
    BatchesToRecordsOperator,
    KeyedBatchAggregateOperator,
    KeyedBatchProcessOperator,
    MapBatchesOperator,
    RecordsToBatchesOperator,
    _stable_order,
    to_record_batch,
)
from chandy.task.runtime_context import StreamingRuntimeContext

MAX_PARALLELISM = 128


def runtime_context(backend: Any = None) -> StreamingRuntimeContext:
    return StreamingRuntimeContext(
        job_id="job",
        job_name="batch operators",
        task_name="task",
        operator_name="operator",
        subtask_index=0,
        parallelism=1,
        max_parallelism=MAX_PARALLELISM,
        attempt_number=0,
        job_parameters={},
        keyed_state_backend=backend,
    )


def new_backend(key_group_range: KeyGroupRange | None = None) -> ColumnarKeyedStateBackend:
    return ColumnarKeyedStateBackend(
        key_group_range or KeyGroupRange(0, MAX_PARALLELISM - 1), MAX_PARALLELISM
    )


class Driver:
    """One subtask of an operator: output collected batch by batch, watermarks too, and for
    a keyed one a columnar backend for ``key_group_range`` (every key group by default),
    restored from ``restore_from`` (checkpointed handles of any subtasks: a rescale takes the
    key groups of its range). :meth:`restore` checkpoints and restores into a fresh operator
    (made by ``make``) and backend, as a task does after a failure."""

    def __init__(
        self,
        make: Callable[[], StreamOperator],
        tmp_path: Path | None = None,
        key_group_range: KeyGroupRange | None = None,
        restore_from: tuple[KeyedStateHandle, ...] = (),
    ) -> None:
        self.make = make
        self.storage = CheckpointStorage(str(tmp_path / "checkpoints"), "job") if tmp_path else None
        self.key_group_range = key_group_range or KeyGroupRange(0, MAX_PARALLELISM - 1)
        self.checkpoint_id = 0
        self.output: list[Any] = []
        self.watermarks: list[int] = []
        self._start(restore_from)

    def _start(self, restore_from: tuple[KeyedStateHandle, ...]) -> None:
        self.backend = ColumnarKeyedStateBackend(self.key_group_range, MAX_PARALLELISM)
        if restore_from:
            self.backend.restore(restore_from, StateReader())
        self.operator = self.make()
        self.operator.setup(
            runtime_context(self.backend if self.operator.keyed else None), self.output.append
        )
        self.operator.emit_watermark = self.watermarks.append
        self.operator.initialize_state(StateInitializationContext(self.operator.operator_state_backend, None))
        self.operator.open()

    def process(self, batch: Any) -> None:
        self.operator.process_batch(batch)

    def checkpoint(self) -> tuple[KeyedStateHandle, ...]:
        """The whole snapshot protocol: synchronous part, serializer steps, write, release."""
        assert self.storage is not None, "a Driver that checkpoints needs tmp_path"
        self.checkpoint_id += 1
        snapshot = self.backend.snapshot(self.checkpoint_id)
        try:
            serializer = snapshot.serializer()
            while not serializer.step(None):
                pass
            return serializer.result().write(self.storage, self.checkpoint_id, None).handles
        finally:
            snapshot.release()

    def restore(self) -> None:
        """Checkpoint the backend, drop operator and backend, restore both from the checkpoint."""
        handles = self.checkpoint()
        self.operator.close()
        self._start(handles)

    def rows(self) -> list[dict[str, Any]]:
        return [row for batch in self.output for row in batch.to_pylist()]


def keyed(columns: dict[str, Any], key: str | None = None, keys: Any = None) -> pa.RecordBatch:
    """A batch as a keyed edge delivers it: by column ``key``, or by the function keys
    ``keys`` (in KEY_COLUMN), with every row's key group last."""
    batch = pa.record_batch(columns)
    if keys is not None:
        batch = batch.append_column(KEY_COLUMN, pa.array(keys))
        column = batch.column(KEY_COLUMN)
    else:
        assert key is not None
        column = batch.column(key)
    return batch.append_column(KEY_GROUP_COLUMN, pa.array(key_groups_of(column, MAX_PARALLELISM)))


# ------------------------------------------------------------------------------- the model


def fold(function: str, state: tuple[Any, int], value: Any) -> tuple[Any, int]:
    """One value into ``(accumulator, non-null values)``: SQL's aggregates, nulls skipped."""
    acc, n = state
    if value is None:
        return state
    if function in ("sum", "mean"):
        return (value if acc is None else acc + value), n + 1
    if function == "min":
        return (value if acc is None else min(acc, value)), n + 1
    if function == "max":
        return (value if acc is None else max(acc, value)), n + 1
    return acc, n + 1  # count


def result(function: str, state: tuple[Any, int]) -> Any:
    acc, n = state
    if function == "count":
        return n
    if function == "mean":
        return None if n == 0 else acc / n
    return acc


def same(expected: Any, actual: Any) -> bool:
    if expected is None or actual is None:
        return expected is actual
    if isinstance(expected, float) or isinstance(actual, float):
        return math.isclose(expected, actual, rel_tol=1e-9, abs_tol=1e-6)
    return bool(expected == actual)


def contiguous_groups(keys: list[Any]) -> list[Any]:
    """The keys of consecutive runs; each key must have one run (the rows are grouped)."""
    runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert len(runs) == len(set(runs)), f"the rows of a key are not together: {keys}"
    return runs


KEYS = {
    "small ints": st.integers(-3, 12),  # counted directly from the smallest key
    "spread ints": st.sampled_from([-(2**62), -7, 0, 2**40, 2**62]),  # hashed (span too wide)
    "strings": st.sampled_from(["", "a", "b", "ü", "long key " * 3]),
    # 0.0 and -0.0 are one key in Python and on the record path (equal, one hash).
    "floats": st.sampled_from([0.0, -0.0, 1.5, -2.25, 1e300]),
}
VALUES = {
    "int": st.none() | st.integers(-(2**40), 2**40),
    "float": st.none() | st.floats(-1e6, 1e6, allow_nan=False),
}


def batches_of(key_kind: str, value_kind: str) -> st.SearchStrategy[list[list[tuple[Any, Any]]]]:
    rows = st.lists(st.tuples(KEYS[key_kind], VALUES[value_kind]), min_size=1, max_size=40)
    return st.lists(rows, min_size=1, max_size=4)


def as_batch(rows: list[tuple[Any, Any]], value_kind: str) -> pa.RecordBatch:
    keys = [k for k, _ in rows]
    values = pa.array([v for _, v in rows], type=pa.int64() if value_kind == "int" else pa.float64())
    return keyed({"k": keys, "v": values, "tag": list(range(len(rows)))}, "k")


#: Every aggregate function on every value and key kind.
CASES = pytest.mark.parametrize(
    ("function", "value_kind", "key_kind"),
    [(f, v, k) for f in AGGREGATE_FUNCTIONS for v in sorted(VALUES) for k in sorted(KEYS)],
)
States = dict[Any, tuple[Any, int]]


def against_model(
    function: str,
    value_kind: str,
    key_kind: str,
    running: bool,
    check_batch: Callable[[list[tuple[Any, Any]], pa.RecordBatch, States], None],
) -> None:
    """Randomized batches through one operator; ``check_batch(rows, output, states)`` checks
    each batch's output, folding the rows into the model's ``states`` (carried over)."""

    @settings(max_examples=25, derandomize=True, deadline=None, database=None)
    @given(batches_of(key_kind, value_kind))
    def check(batches: list[list[tuple[Any, Any]]]) -> None:
        driver = Driver(lambda: KeyedBatchAggregateOperator(function, "v", running, "k"))
        states: States = defaultdict(lambda: (None, 0))
        for rows in batches:
            driver.output.clear()
            driver.process(as_batch(rows, value_kind))
            (out,) = driver.output
            check_batch(rows, out, states)

    check()


@CASES
def test_running_aggregates_match_the_model(function: str, value_kind: str, key_kind: str) -> None:
    """Every input row comes out once, its key's rows together and in arrival order, the
    aggregated column replaced by the key's aggregate so far (count: a count column added),
    state carrying over from batch to batch."""

    def check_batch(rows: list[tuple[Any, Any]], out: pa.RecordBatch, states: States) -> None:
        expected_by_key: dict[Any, list[tuple[int, Any, Any]]] = defaultdict(list)
        for tag, (key, value) in enumerate(rows):
            states[key] = fold(function, states[key], value)
            expected_by_key[key].append((tag, value, result(function, states[key])))
        got = out.to_pylist()
        assert out.schema.names == (["k", "v", "tag", "count"] if function == "count" else ["k", "v", "tag"])
        for key in contiguous_groups([r["k"] for r in got]):
            mine = [r for r in got if r["k"] == key]
            expected = expected_by_key.pop(key)
            assert [r["tag"] for r in mine] == [tag for tag, _, _ in expected]  # arrival order
            for row, (_, value, aggregate) in zip(mine, expected, strict=True):
                if function == "count":
                    assert row["v"] == value and row["count"] == aggregate
                else:
                    assert same(aggregate, row["v"]), (key, mine, expected)
        assert not expected_by_key

    against_model(function, value_kind, key_kind, True, check_batch)


@CASES
def test_aggregates_emit_each_key_of_a_batch_once(function: str, value_kind: str, key_kind: str) -> None:
    """One row per distinct key of the batch, with the key's aggregate after the batch."""

    def check_batch(rows: list[tuple[Any, Any]], out: pa.RecordBatch, states: States) -> None:
        for key, value in rows:
            states[key] = fold(function, states[key], value)
        name = "count" if function == "count" else "v"
        assert out.schema.names == ["k", name]
        got = out.to_pylist()
        # A float key comes out as its canonical form (-0.0 as 0.0).
        canonical = {k + 0.0 if isinstance(k, float) else k for k, _ in rows}
        assert sorted(map(repr, (r["k"] for r in got))) == sorted(map(repr, canonical))
        for row in got:
            assert same(result(function, states[row["k"]]), row[name]), (row, states[row["k"]])

    against_model(function, value_kind, key_kind, False, check_batch)


def test_state_carries_over_a_restore_of_the_backend(tmp_path: Path) -> None:
    """Running sums, means and maxima over many keys and batches, the backend checkpointed
    and restored into a new operator between batches: the same results as without."""
    rng = np.random.default_rng(7)
    batches = []
    for _ in range(6):
        keys = rng.integers(0, 300, 500)
        values = rng.integers(-1000, 1000, 500)
        batches.append(keyed({"k": keys, "v": values}, "k"))
    for function in ("sum", "mean", "max", "count"):
        plain = Driver(running(function))
        restored = Driver(running(function), tmp_path / function)
        for batch in batches:
            plain.process(batch)
            restored.process(batch)
            restored.restore()
        assert restored.rows() == plain.rows()
        assert restored.checkpoint_id == len(batches)


def test_state_rescales_by_key_group(tmp_path: Path) -> None:
    """Three batches on one subtask, checkpointed, restored at parallelism 2 (each subtask
    takes the key groups of its range), three more batches split between the subtasks by key
    group as the partitioner would: every key's running sums are those of one subtask alone."""
    rng = np.random.default_rng(11)
    batches = [
        keyed({"k": rng.integers(0, 300, 400), "v": rng.integers(-50, 50, 400)}, "k") for _ in range(6)
    ]
    alone = Driver(running("sum"))
    for batch in batches:
        alone.process(batch)
    before = Driver(running("sum"), tmp_path)
    for batch in batches[:3]:
        before.process(batch)
    handles = before.checkpoint()
    after = [
        Driver(
            running("sum"),
            key_group_range=KeyGroupRange.of_operator(MAX_PARALLELISM, 2, i),
            restore_from=handles,
        )
        for i in range(2)
    ]
    for batch in batches[3:]:
        groups = np.asarray(batch.column(KEY_GROUP_COLUMN))
        for subtask in after:
            mine = (groups >= subtask.key_group_range.start) & (groups <= subtask.key_group_range.end)
            assert mine.any()
            subtask.process(batch.filter(pa.array(mine)))
    assert all(s.backend.num_keys("_batch_sum") < 300 for s in after)
    assert per_key(before.rows() + after[0].rows() + after[1].rows()) == per_key(alone.rows())


def per_key(rows: list[dict[str, Any]]) -> dict[Any, list[Any]]:
    """Each key's values in the order they came out."""
    by_key: dict[Any, list[Any]] = defaultdict(list)
    for row in rows:
        by_key[row["k"]].append(row["v"])
    return dict(by_key)


def running(function: str) -> Callable[[], StreamOperator]:
    return lambda: KeyedBatchAggregateOperator(function, "v", True, "k")


def test_process_function_state_survives_a_restore(tmp_path: Path) -> None:
    driver = Driver(lambda: KeyedBatchProcessOperator(numbering, NUMBERING_STATE, "k"), tmp_path)
    driver.process(keyed({"k": ["a", "b", "a"]}, "k"))
    driver.restore()
    driver.process(keyed({"k": ["b", "a"]}, "k"))
    assert sorted((r["k"], r["n"]) for r in driver.rows()) == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("b", 0),
        ("b", 1),
    ]


# ------------------------------------------------------------------ aggregate edge cases


def run(operator: StreamOperator, *batches: pa.RecordBatch) -> list[dict[str, Any]]:
    driver = Driver(lambda: operator)
    for batch in batches:
        driver.process(batch)
    return driver.rows()


def test_a_key_with_only_nulls_aggregates_to_null_until_a_value_arrives() -> None:
    first = keyed({"k": [1, 1, 2], "v": pa.array([None, None, 5], pa.int64())}, "k")
    second = keyed({"k": [1], "v": pa.array([3], pa.int64())}, "k")
    for function in ("sum", "min", "max", "mean"):
        rows = run(KeyedBatchAggregateOperator(function, "v", True, "k"), first, second)
        assert [(r["k"], r["v"]) for r in rows] == [(1, None), (1, None), (2, 5), (1, 3)], function
        totals = run(KeyedBatchAggregateOperator(function, "v", False, "k"), first, second)
        assert [(r["k"], r["v"]) for r in totals] == [(1, None), (2, 5), (1, 3)], function
    counts = run(KeyedBatchAggregateOperator("count", "v", False, "k"), first, second)
    assert counts == [{"k": 1, "count": 0}, {"k": 2, "count": 1}, {"k": 1, "count": 1}]


def test_a_column_of_nulls_only_is_no_value_whatever_its_arrow_type() -> None:
    """A batch whose column holds only nulls may come typed ``null`` (Arrow infers it from
    records without a schema): it adds nothing, as nulls of the column's type would."""
    ints = keyed({"k": [1, 2], "v": [5, 7]}, "k")
    nulls = keyed({"k": [1, 3], "v": [None, None]}, "k")
    assert nulls.schema.field("v").type == pa.null()
    for function, first, then in [("sum", 5, 5), ("max", 5, 5), ("mean", 5.0, 5.0), ("count", 1, 1)]:
        rows = run(KeyedBatchAggregateOperator(function, "v", False, "k"), ints, nulls)
        name = "count" if function == "count" else "v"
        assert [(r["k"], r[name]) for r in rows[2:]] == [(1, then), (3, 0 if function == "count" else None)]
        running_rows = run(KeyedBatchAggregateOperator(function, "v", True, "k"), ints, nulls)
        assert running_rows[2][name] == first and running_rows[3][name] == (
            0 if function == "count" else None
        )
    (only_nulls,) = outputs(KeyedBatchAggregateOperator("min", "v", True, "k"), nulls)
    assert only_nulls.column("v").to_pylist() == [None, None]


def test_min_and_max_keep_the_column_type_and_its_extremes() -> None:
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    batch = keyed({"k": [1, 2, 1], "v": pa.array([big, small, 0], pa.int64())}, "k")
    assert [r["v"] for r in run(KeyedBatchAggregateOperator("min", "v", True, "k"), batch)] == [big, 0, small]
    assert [r["v"] for r in run(KeyedBatchAggregateOperator("max", "v", True, "k"), batch)] == [
        big,
        big,
        small,
    ]
    for kind in (pa.int8(), pa.uint32(), pa.float32()):
        typed = keyed({"k": [1, 1], "v": pa.array([3, 2], kind)}, "k")
        for function in ("min", "max"):
            (out,) = outputs(KeyedBatchAggregateOperator(function, "v", True, "k"), typed)
            assert out.schema.field("v").type == kind
    floats = keyed({"k": [1, 1, 1], "v": [-math.inf, 2.0, math.inf]}, "k")
    assert [r["v"] for r in run(KeyedBatchAggregateOperator("max", "v", True, "k"), floats)] == [
        -math.inf,
        2.0,
        math.inf,
    ]


def outputs(operator: StreamOperator, *batches: pa.RecordBatch) -> list[pa.RecordBatch]:
    driver = Driver(lambda: operator)
    for batch in batches:
        driver.process(batch)
    return driver.output


def test_sums_widen_and_means_are_floats() -> None:
    batch = keyed({"k": [1, 1], "v": pa.array([2**31 - 1, 2**31 - 1], pa.int32())}, "k")
    (out,) = outputs(KeyedBatchAggregateOperator("sum", "v", True, "k"), batch)
    assert out.schema.field("v").type == pa.int64() and out.column("v").to_pylist() == [2**31 - 1, 2**32 - 2]
    floats = keyed({"k": [1], "v": pa.array([1.5], pa.float32())}, "k")
    (out,) = outputs(KeyedBatchAggregateOperator("sum", "v", False, "k"), floats)
    assert out.schema.field("v").type == pa.float64()
    (out,) = outputs(KeyedBatchAggregateOperator("mean", "v", True, "k"), batch)
    assert out.schema.field("v").type == pa.float64() and out.column("v").to_pylist() == [2**31 - 1] * 2
    bools = keyed({"k": [1, 1, 1], "v": [True, False, True]}, "k")
    assert [r["v"] for r in run(KeyedBatchAggregateOperator("sum", "v", True, "k"), bools)] == [1, 1, 2]


def test_count_without_a_column_counts_rows_and_with_one_its_values() -> None:
    batch = keyed({"k": ["x", "y", "x"], "v": pa.array([None, 1, 2], pa.int64())}, "k")
    rows = run(KeyedBatchAggregateOperator("count", None, True, "k"), batch)
    assert [(r["k"], r["count"]) for r in rows] == [("x", 1), ("x", 2), ("y", 1)]
    rows = run(KeyedBatchAggregateOperator("count", "v", True, "k"), batch)
    assert [(r["k"], r["count"]) for r in rows] == [("x", 0), ("x", 1), ("y", 1)]
    strings = keyed({"k": [1, 1], "s": pa.array(["a", None])}, "k")
    assert run(KeyedBatchAggregateOperator("count", "s", False, "k"), strings) == [{"k": 1, "count": 1}]


def test_keys_computed_by_a_function_never_reach_the_output() -> None:
    batch = keyed({"v": [1, 2, 3, 4]}, keys=["odd", "even", "odd", "even"])
    running = run(KeyedBatchAggregateOperator("sum", "v", True, KEY_COLUMN), batch)
    assert running == [{"v": 1}, {"v": 4}, {"v": 2}, {"v": 6}]
    totals = run(KeyedBatchAggregateOperator("sum", "v", False, KEY_COLUMN), batch)
    assert totals == [{"key": "odd", "v": 4}, {"key": "even", "v": 6}]


def test_a_null_key_is_one_key() -> None:
    """A null key is a key like any other (the record path's None), for int and string keys."""
    for keys in (pa.array([1, None, 1, None], pa.int64()), pa.array(["a", None, "a", None])):
        rows = run(
            KeyedBatchAggregateOperator("sum", "v", True, "k"), keyed({"k": keys, "v": [1, 2, 3, 4]}, "k")
        )
        assert per_key(rows) == {keys[0].as_py(): [1, 4], None: [2, 6]}


def nan(payload: int) -> float:
    """A quiet NaN with ``payload`` in its low mantissa bits (0: numpy's and Arrow's NaN)."""
    value: float = np.array([0x7FF8000000000000 | payload], dtype=np.uint64).view(np.float64)[0]
    return value


@pytest.mark.parametrize("arrow_type", [pa.float64(), pa.float32()])
def test_float_keys_equal_in_python_are_one_group_and_one_slot(arrow_type: pa.DataType) -> None:
    """0.0 and -0.0 are one key (as on the record path: equal, one key group), and so are
    NaNs whatever their bits (the state keeps one NaN key): Arrow's dictionary encoding tells
    them apart, and two groups sharing one slot lost one group's updates."""
    zeros = pa.array(np.array([0.0, -0.0, 0.0, -0.0]), arrow_type)
    assert len(set(key_groups_of(zeros, MAX_PARALLELISM).tolist())) == 1  # the partitioner agrees
    batch = keyed({"k": zeros, "v": [1, 10, 100, 1000]}, "k")
    assert run(KeyedBatchAggregateOperator("sum", "v", False, "k"), batch) == [{"k": 0.0, "v": 1111}]
    assert [r["v"] for r in run(KeyedBatchAggregateOperator("sum", "v", True, "k"), batch)] == [
        1,
        11,
        111,
        1111,
    ]
    counted = run(
        KeyedBatchAggregateOperator("count", None, False, "k"),
        keyed({"k": pa.array([0.0, -0.0], arrow_type), "v": [1, 10]}, "k"),
        keyed({"k": pa.array([0.0], arrow_type), "v": [100]}, "k"),
    )
    assert counted == [{"k": 0.0, "count": 2}, {"k": 0.0, "count": 3}]
    nans = pa.array(np.array([nan(0), nan(1), nan(0), 2.0, nan(1)]), pa.float64())
    rows = run(
        KeyedBatchAggregateOperator("sum", "v", False, "k"), keyed({"k": nans, "v": [1, 2, 4, 8, 16]}, "k")
    )
    assert [(math.isnan(r["k"]), r["v"]) for r in rows] == [(True, 23), (False, 8)]


def test_int_keys_of_every_width_and_span_group_correctly() -> None:
    """Narrow, signed and unsigned keys, and a span wider than 2**16 that is still counted
    directly (two radix passes), against the same keys as strings (always hashed)."""
    rng = np.random.default_rng(3)
    cases = [
        pa.array(rng.integers(-128, 128, 3000), pa.int8()),
        pa.array(rng.integers(2**64 - 500, 2**64, 3000, dtype=np.uint64), pa.uint64()),
        pa.array(rng.integers(0, 150_000, 40_000), pa.int64()),  # 40k rows: span 150k < 4 x rows
        pa.array(rng.integers(0, 2**40, 3000), pa.int64()),  # too wide: hashed
    ]
    for keys in cases:
        values = rng.integers(0, 100, len(keys))
        as_ints = run(
            KeyedBatchAggregateOperator("sum", "v", True, "k"), keyed({"k": keys, "v": values}, "k")
        )
        strings = pa.array([str(k) for k in keys.to_pylist()])
        as_strings = run(
            KeyedBatchAggregateOperator("sum", "v", True, "s"),
            keyed({"s": strings, "v": values}, "s"),
        )
        by_int: dict[str, list[int]] = defaultdict(list)
        for row in as_ints:
            by_int[str(row["k"])].append(row["v"])
        by_string: dict[str, list[int]] = defaultdict(list)
        for row in as_strings:
            by_string[row["s"]].append(row["v"])
        assert by_int == by_string
        contiguous_groups([row["k"] for row in as_ints])


#: A fresh interpreter that opens a keyed batch operator's heap tuning before any large free
#: (the dynamic mmap threshold still at 128 KiB), then allocates and frees a 65,536-row int64
#: column (512 KiB) 500 times; prints the minor page faults that took.
_HEAP_PROBE = """
import resource
import numpy as np
from chandy.util.memory import keep_freed_heap
keep_freed_heap()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(500):
    column = np.ones(65536, dtype=np.int64)
    del column
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the heap tuning is glibc's (mallopt)")
def test_heap_tuning_keeps_batch_sized_columns_on_the_heap() -> None:
    """M_TOP_PAD alone also turns glibc's dynamic mmap threshold off, leaving it at 128 KiB:
    every 512 KiB column was then mmapped and unmapped, faulting in its 128 pages each time
    (about 300 instead of 17 us an array). With the threshold set too, the column reuses
    the heap: a few faults in all, not 128 an array."""
    probe = subprocess.run(
        [sys.executable, "-c", _HEAP_PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    faults = int(probe.stdout.strip())
    assert faults < 500, f"{faults} minor faults for 500 allocations of 512 KiB: the columns were mmapped"


@pytest.mark.parametrize("bound", [1, 200, 256, 257, 65_536, 65_537, 1 << 20])
def test_stable_order_sorts_ids_of_any_bound_stably(bound: int) -> None:
    ids = np.random.default_rng(bound).integers(0, bound, 5000).astype(np.int32)
    assert np.array_equal(_stable_order(ids, bound), np.argsort(ids, kind="stable"))


def test_bad_aggregations_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="unknown batch aggregate function 'avg'; use one of sum, count"):
        KeyedBatchAggregateOperator("avg", "v", False, "k")
    with pytest.raises(ValueError, match=r"sum\(\) aggregates a column"):
        KeyedBatchAggregateOperator("sum", None, False, "k")
    strings = keyed({"k": [1], "s": ["x"]}, "k")
    ints, floats = keyed({"k": [1], "v": [1]}, "k"), keyed({"k": [1], "v": [1.5]}, "k")
    # mistakes of the job's definition: the error is the built-in type and unrecoverable (a
    # restart would run the same definition over the same batches and fail the same way)
    for kind, match, operator, batches in (
        (
            TypeError,
            "^sum\\('s'\\) aggregates numbers, but column 's' is string",
            ("sum", "s", False),
            [strings],
        ),
        (TypeError, "^running_sum\\('s'\\) aggregates numbers", ("sum", "s", True), [strings]),
        (
            KeyError,
            r"^sum\('w'\): the batch has no column 'w'; its columns are \['k', 's'\]$",
            ("sum", "w", False),
            [strings],
        ),
        (KeyError, r"^running_max\('w'\): the batch has no column 'w'", ("max", "w", True), [strings]),
        (
            TypeError,
            f"without the {KEY_GROUP_COLUMN} column",
            ("sum", "v", False),
            [pa.record_batch({"k": [1], "v": [1]})],
        ),
        (
            TypeError,
            "column 'v' was int64 and is now float64; give the column one type",
            ("sum", "v", False),
            [ints, floats],
        ),
    ):
        with pytest.raises(kind, match=match) as refused:
            run(KeyedBatchAggregateOperator(*operator, "k"), *batches)
        assert isinstance(refused.value, UnrecoverableError), refused.value


def test_aggregates_refuse_to_output_two_columns_of_one_name() -> None:
    """An output row with two columns of one name (Row(count=1, count=1)) loses one to every
    reader that goes by name; the operator refuses it and names the column and the fix."""
    for operator, batch, column in (
        (("count", None, True, "k"), keyed({"k": [1, 1], "count": [5, 6]}, "k"), "count"),
        (("count", "v", True, "k"), keyed({"k": [1], "v": [2], "count": [5]}, "k"), "count"),
        (("count", None, False, "count"), keyed({"count": [1, 2]}, "count"), "count"),
        (("sum", "v", False, "v"), keyed({"v": [7]}, "v"), "v"),
        (("max", "key", False, KEY_COLUMN), keyed({"key": [3]}, keys=[1]), "key"),
    ):
        with pytest.raises(ValueError, match=f"two columns named '{column}'.*map_batches") as refused:
            run(KeyedBatchAggregateOperator(*operator), batch)
        assert isinstance(refused.value, UnrecoverableError), refused.value
    # where the names differ, the same operators run
    assert run(KeyedBatchAggregateOperator("count", None, False, "k"), keyed({"k": [1, 1]}, "k")) == [
        {"k": 1, "count": 2}
    ]


def test_batch_operators_refuse_record_batches() -> None:
    for make in (
        lambda: KeyedBatchAggregateOperator("sum", "v", True, "k"),
        lambda: KeyedBatchProcessOperator(numbering, NUMBERING_STATE, "k"),
        lambda: MapBatchesOperator(lambda b: b),
        BatchesToRecordsOperator,
    ):
        driver = Driver(make)
        with pytest.raises(
            TypeError, match="takes Arrow record batches and got a list: .* to_batches"
        ) as got:
            driver.process([1, 2])
        assert isinstance(got.value, UnrecoverableError)


def test_a_keyed_batch_operator_needs_the_columnar_backend() -> None:
    operator = KeyedBatchAggregateOperator("sum", "v", False, "k")
    heap = HeapKeyedStateBackend(KeyGroupRange(0, MAX_PARALLELISM - 1), MAX_PARALLELISM)
    operator.setup(runtime_context(heap), lambda batch: None)
    with pytest.raises(
        TypeError, match="HeapKeyedStateBackend: the chain creates a ColumnarKeyedStateBackend"
    ):
        operator.open()


def test_watermarks_pass_through_unchanged() -> None:
    for make in (
        lambda: KeyedBatchAggregateOperator("sum", "v", True, "k"),
        lambda: MapBatchesOperator(lambda b: b),
        RecordsToBatchesOperator,
        BatchesToRecordsOperator,
    ):
        driver = Driver(make)
        driver.operator.process_watermark(42)
        assert driver.watermarks == [42]


# ------------------------------------------------------------------ user keyed batch functions

NUMBERING_STATE = pa.schema([("seen", pa.int64())])


def numbering(batch: pa.RecordBatch, state: KeyedBatchState) -> dict[str, Any]:
    """Numbers each key's rows across batches: the state holds how many it has seen."""
    seen = state["seen"]
    offsets = np.asarray(state.offsets)
    within = np.arange(batch.num_rows) - np.repeat(offsets[:-1], np.diff(offsets))
    state["seen"] = seen + np.diff(offsets)
    return {"k": batch.column("k"), "n": seen[np.asarray(state.group_ids)] + within}


def test_state_writes_of_the_wrong_shape_or_type_fail_the_job_once() -> None:
    """A process_batches function that writes one value per row instead of per key, strings
    into a number column, or a mask of the wrong length does so on every run: the errors are
    the built-in types and unrecoverable, so a restart strategy does not repeat them forever."""
    batch = keyed({"k": [1, 1, 2]}, "k")

    def per_row(b: pa.RecordBatch, state: KeyedBatchState) -> None:
        state["seen"] = np.zeros(b.num_rows)

    def strings(b: pa.RecordBatch, state: KeyedBatchState) -> None:
        state["seen"] = np.array(["x"] * len(state.keys))

    def mask(b: pa.RecordBatch, state: KeyedBatchState) -> None:
        state.clear(np.ones(b.num_rows, dtype=bool))

    for function, kind, match in (
        (per_row, ValueError, "2 values expected .* shape \\(3,\\)"),
        (strings, TypeError, "holds int64 and got <U1 values"),
        (mask, ValueError, "one boolean per key of the batch \\(2\\)"),
    ):
        with pytest.raises(kind, match=match) as refused:
            run(KeyedBatchProcessOperator(function, NUMBERING_STATE, "k"), batch)
        assert isinstance(refused.value, UnrecoverableError), refused.value


class Recording(KeyedBatchFunction):
    """Records what it was given; emits the batch it got."""

    def __init__(self) -> None:
        self.calls: list[tuple[pa.RecordBatch, list[Any], list[int], list[int]]] = []
        self.opened = self.closed = False

    def open(self, runtime_context: Any) -> None:
        self.opened = True

    def close(self) -> None:
        self.closed = True

    def process_batch(self, batch: Any, state: KeyedBatchState) -> Any:
        self.calls.append(
            (
                batch,
                state.keys.to_pylist(),
                list(np.asarray(state.offsets)),
                list(np.asarray(state.group_ids)),
            )
        )
        return batch


def test_the_user_function_sees_grouped_batches_without_engine_columns() -> None:
    function = Recording()
    driver = Driver(lambda: KeyedBatchProcessOperator(function, NUMBERING_STATE, "k"))
    assert function.opened
    driver.process(keyed({"k": ["b", "a", "b", "c", "a"], "v": [1, 2, 3, 4, 5]}, "k"))
    ((batch, keys, offsets, group_ids),) = function.calls
    assert batch.schema.names == ["k", "v"]
    runs = contiguous_groups(batch.column("k").to_pylist())
    assert runs == keys and offsets[0] == 0 and offsets[-1] == 5
    for g, key in enumerate(keys):
        rows = batch.slice(offsets[g], offsets[g + 1] - offsets[g]).to_pylist()
        assert {r["k"] for r in rows} == {key}
        assert [r["v"] for r in rows] == sorted(r["v"] for r in rows)  # arrival order
    assert group_ids == [keys.index(k) for k in batch.column("k").to_pylist()]
    assert driver.output == [batch]
    driver.operator.close()
    assert function.closed


def test_function_keys_are_the_states_keys_and_stay_hidden() -> None:
    function = Recording()
    driver = Driver(lambda: KeyedBatchProcessOperator(function, NUMBERING_STATE, KEY_COLUMN))
    driver.process(keyed({"v": [1, 2, 3]}, keys=[10, 20, 10]))
    ((batch, keys, _, _),) = function.calls
    assert batch.schema.names == ["v"] and sorted(keys) == [10, 20]


def test_state_written_by_the_function_persists_to_the_next_batch() -> None:
    driver = Driver(lambda: KeyedBatchProcessOperator(numbering, NUMBERING_STATE, "k"))
    driver.process(keyed({"k": ["a", "b", "a"]}, "k"))
    driver.process(keyed({"k": ["a", "c", "b", "a"]}, "k"))
    by_key: dict[str, list[int]] = defaultdict(list)
    for row in driver.rows():
        by_key[row["k"]].append(row["n"])
    assert by_key == {"a": [0, 1, 2, 3], "b": [0, 1], "c": [0]}


@pytest.mark.parametrize("key_kind", sorted(KEYS))
def test_user_function_state_matches_the_model(key_kind: str) -> None:
    """Randomized batches: each key's rows are numbered 0, 1, 2, ... across batches, in
    arrival order, from the count the function keeps in columnar state."""

    @settings(max_examples=30, derandomize=True, deadline=None, database=None)
    @given(batches_of(key_kind, "int"))
    def check(batches: list[list[tuple[Any, Any]]]) -> None:
        driver = Driver(lambda: KeyedBatchProcessOperator(numbering, NUMBERING_STATE, "k"))
        for rows in batches:
            driver.process(as_batch(rows, "int"))
        expected: dict[Any, list[int]] = defaultdict(list)
        for key, _ in (row for rows in batches for row in rows):
            expected[key].append(len(expected[key]))
        assert per_key([{"k": r["k"], "v": r["n"]} for r in driver.rows()]) == expected

    check()


def test_cleared_keys_start_again_as_new() -> None:
    """``is_new`` marks keys without state; ``clear`` drops a key's state, so it is new again."""
    seen: list[list[tuple[Any, bool]]] = []

    def forget_at_two(batch: pa.RecordBatch, state: KeyedBatchState) -> None:
        seen.append(list(zip(state.keys.to_pylist(), state.is_new().tolist(), strict=True)))
        state["seen"] = state["seen"] + np.diff(np.asarray(state.offsets))
        state.clear(state["seen"] >= 2)

    driver = Driver(lambda: KeyedBatchProcessOperator(forget_at_two, NUMBERING_STATE, "k"))
    for keys in (["a", "b", "a"], ["a", "b"], ["a", "b"]):
        driver.process(keyed({"k": keys}, "k"))
    assert seen == [[("a", True), ("b", True)], [("a", True), ("b", False)], [("a", False), ("b", True)]]
    assert driver.backend.num_keys(KeyedBatchProcessOperator.STATE_NAME) == 1


def test_a_function_returning_nothing_or_no_rows_emits_nothing() -> None:
    for returned in (None, pa.record_batch({"x": pa.array([], pa.int64())})):
        driver = Driver(lambda r=returned: KeyedBatchProcessOperator(lambda b, s: r, NUMBERING_STATE, "k"))  # type: ignore[misc]
        driver.process(keyed({"k": [1]}, "k"))
        assert driver.output == []


# ----------------------------------------------------------------------------- map_batches


class FakeDataFrame:
    """Not a pandas DataFrame (pandas is not installed): to_record_batch must not take it for one."""

    columns = ("x",)


def test_to_record_batch_takes_every_documented_return_type() -> None:
    expected = pa.record_batch({"x": [1, 2, 3]})
    assert to_record_batch(expected) is expected
    assert to_record_batch(None) is None
    chunked = pa.Table.from_batches([expected.slice(0, 1), expected.slice(1)])
    assert chunked.column("x").num_chunks == 2
    assert expected.equals(to_record_batch(chunked))
    empty = to_record_batch(expected.schema.empty_table())
    assert empty is not None and empty.num_rows == 0 and empty.schema == expected.schema
    for column in (np.array([1, 2, 3]), [1, 2, 3], pa.array([1, 2, 3]), pa.chunked_array([[1], [2, 3]])):
        assert expected.equals(to_record_batch({"x": column}))
    with pytest.raises(ValueError, match=r"one length, got \{'x': 3, 'y': 1\}") as lengths:
        to_record_batch({"x": [1, 2, 3], "y": [1]})
    assert isinstance(lengths.value, UnrecoverableError)  # the job's definition: a restart repeats it
    for wrong, noun in (([1, 2, 3], "a list"), (7, "an int"), (FakeDataFrame(), "a FakeDataFrame")):
        with pytest.raises(TypeError, match=f"returned {noun}; return a pyarrow.RecordBatch") as returned:
            to_record_batch(wrong)
        assert isinstance(returned.value, UnrecoverableError)


def test_map_batches_emits_what_has_rows() -> None:
    class Doubler(MapBatchesFunction):
        def open(self, runtime_context: Any) -> None:
            self.factor = 2

        def map_batch(self, batch: Any) -> Any:
            return {"x": np.asarray(batch.column("x")) * self.factor}

    driver = Driver(lambda: MapBatchesOperator(Doubler()))
    driver.process(pa.record_batch({"x": [1, 2]}))
    driver.process(pa.record_batch({"x": pa.array([], pa.int64())}))  # no rows: not called
    assert driver.rows() == [{"x": 2}, {"x": 4}]
    filtered = Driver(lambda: MapBatchesOperator(lambda b: b.filter(pa.array([False] * b.num_rows))))
    filtered.process(pa.record_batch({"x": [1, 2]}))
    nothing = Driver(lambda: MapBatchesOperator(lambda b: None))
    nothing.process(pa.record_batch({"x": [1, 2]}))
    assert filtered.output == nothing.output == []
    wrong = Driver(lambda: MapBatchesOperator(lambda b: b.to_pylist()))
    with pytest.raises(TypeError, match="a batch function returned a list"):
        wrong.process(pa.record_batch({"x": [1]}))


# -------------------------------------------------------------------- records <-> batches


class Point(NamedTuple):
    x: int
    y: str


def records_to_batch(records: Any, schema: pa.Schema | None = None) -> pa.RecordBatch:
    driver = Driver(lambda: RecordsToBatchesOperator(schema))
    driver.process(records)
    (batch,) = driver.output
    return batch


def test_records_become_one_batch_named_as_flink_names_fields() -> None:
    assert records_to_batch([(1, "a"), (2, "b")]).to_pydict() == {"f0": [1, 2], "f1": ["a", "b"]}
    assert records_to_batch([Point(1, "a")]).to_pydict() == {"x": [1], "y": ["a"]}
    assert records_to_batch([Row(x=1, y="a"), Row(x=2, y=None)]).to_pydict() == {
        "x": [1, 2],
        "y": ["a", None],
    }
    assert records_to_batch([Row(1, "a")]).to_pydict() == {"f0": [1], "f1": ["a"]}
    assert records_to_batch([{"x": 1}, {"x": 2, "y": "b"}]).to_pydict() == {"x": [1, 2], "y": [None, "b"]}
    assert records_to_batch([1.5, 2.5]).to_pydict() == {"value": [1.5, 2.5]}
    assert records_to_batch([[1], [2, 3]]).to_pydict() == {"value": [[1], [2, 3]]}  # a list is a value
    timed = TimestampedBatch([(1, "a")], [1000])
    assert records_to_batch(timed).to_pydict() == {"f0": [1], "f1": ["a"]}
    empty = Driver(RecordsToBatchesOperator)
    empty.process([])
    assert empty.output == []


def test_a_schema_types_and_names_the_columns() -> None:
    schema = pa.schema([("id", pa.int32()), ("name", pa.string())])
    batch = records_to_batch([(1, "a"), Row(2, None)], schema)
    assert batch.schema == schema and batch.to_pydict() == {"id": [1, 2], "name": ["a", None]}
    one = pa.schema([("n", pa.int16())])
    assert records_to_batch([1, 2], one).schema == one


def test_named_records_meet_the_schema_by_name_and_lose_no_field() -> None:
    """A dict key or a named field the schema does not name was dropped (a misspelled schema
    name gave an all-null column and lost the real field), and named Rows were matched by
    position, renamed silently. Names are matched by name; a name that matches nothing is
    refused, naming it; unnamed tuples go by position."""
    schema = pa.schema([("id", pa.int32()), ("name", pa.string())])
    for records in ([{"id": 1, "name": "a", "extra": 0}], [{"id": 1, "nmae": "a"}]):
        with pytest.raises(
            TypeError, match=r"keys \['(extra|nmae)'\] are not in the schema \['id', 'name'\]"
        ) as refused:
            records_to_batch(records, schema)
        assert isinstance(refused.value, UnrecoverableError)
    # by name, whatever the order; a dict may lack a key (null), as before
    swapped = records_to_batch([Row(name="a", id=1), Row(id=2, name="b"), (3, "c")], schema)
    assert swapped.to_pydict() == {"id": [1, 2, 3], "name": ["a", "b", "c"]}
    assert records_to_batch([{"id": 1}], schema).to_pydict() == {"id": [1], "name": [None]}
    with pytest.raises(TypeError, match=r"Row\(key='a', n=1\).*\['key', 'n'\].*\['id', 'name'\]"):
        records_to_batch([Row(key="a", n=1)], schema)
    # without a schema the first named record's names are the columns: the others must match
    assert records_to_batch([Row(x=1, y="a"), Row(y="b", x=2)]).to_pydict() == {"x": [1, 2], "y": ["a", "b"]}
    with pytest.raises(TypeError, match=r"Row\(x=2, z='b'\)"):
        records_to_batch([Row(x=1, y="a"), Row(x=2, z="b")])


def test_records_that_do_not_fit_name_the_record_and_the_fix() -> None:
    schema = pa.schema([("id", pa.int32()), ("name", pa.string())])
    with pytest.raises(TypeError, match=r"the record \(2, 3\) cannot become a row.*fit the schema"):
        records_to_batch([(1, "a"), (2, 3)], schema)
    with pytest.raises(
        TypeError, match=r"the record \('x', 'y'\) cannot become a row.*give to_batches\(\) a schema"
    ):
        records_to_batch([(1, "a"), ("x", "y")])
    with pytest.raises(
        TypeError, match=r"the record \(1,\) .* 1 fields where the batch's first record has 2"
    ):
        records_to_batch([(1, "a"), (1,)])
    with pytest.raises(TypeError, match=r"the record \{'x': 1\} .* mixes tuples with dicts"):
        records_to_batch([(1, "a"), {"x": 1}])
    with pytest.raises(TypeError, match="it has 2 fields and the schema 1"):
        records_to_batch([(1, "a")], pa.schema([("id", pa.int32())]))
    with pytest.raises(TypeError, match="plain values make one column, but the schema has 2"):
        records_to_batch([1], schema)
    with pytest.raises(TypeError, match=r"the record \{'id': 'x'\} cannot become a row"):
        records_to_batch([{"id": 1}, {"id": "x"}], pa.schema([("id", pa.int64())]))


def test_batches_become_named_rows_and_back() -> None:
    records = [Row(id=1, name="a", score=0.5), Row(id=2, name=None, score=1.5)]
    batch = records_to_batch(records)
    driver = Driver(BatchesToRecordsOperator)
    driver.process(keyed(batch.to_pydict(), "id"))  # the engine's columns are dropped
    (rows,) = driver.output
    assert rows == records and [r.name for r in rows] == ["a", None]
    assert records_to_batch(rows).equals(batch)
    rows[0].set_field_names(["x", "y", "z"])  # the rows of a batch share nothing mutable
    rows[0]["x"] = 7
    assert rows[1].as_dict() == {"id": 2, "name": None, "score": 1.5} and rows[0].as_dict()["x"] == 7
    empty = Driver(BatchesToRecordsOperator)
    empty.process(batch.slice(0, 0))
    assert empty.output == []
