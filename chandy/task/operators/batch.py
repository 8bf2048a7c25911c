"""Operators of the batch (Arrow) path: every item they get and emit is a ``pyarrow.RecordBatch``.

The point of the batch path is to stop paying the interpreter per record, so nothing here
runs Python per row or per key: a batch is grouped by key with one dictionary encoding (a
hash of every key, in C; integer keys of a small span are counted instead, by their offset
from the batch's smallest) and one stable radix sort of the group ids, keyed state is read
and written a whole column at a time (:mod:`chandy.state.columnar`), only for the batch's
distinct keys, and the aggregations are numpy scans over the grouped values.

Grouping. The rows of a key come out together, in their arrival order (Flink's order per
key); the keys come in the order of their first row in the batch, or ascending for integer
keys of a small span (no order between keys is promised). Both the running aggregations
and :class:`KeyedBatchProcessOperator` emit in that grouped order. The engine's columns on
a keyed edge (:data:`~chandy.state.arrow_keys.KEY_GROUP_COLUMN`, and
:data:`~chandy.state.arrow_keys.KEY_COLUMN` for ``key_by(fn)``) are read here and never
reach user code or the output.

Nulls in an aggregated column are skipped, as SQL aggregates do (Flink SQL, Spark SQL):
``sum`` / ``min`` / ``max`` / ``mean`` of a key that has seen only nulls is null, and
``count(column)`` counts the non-null values (``count()`` counts rows). Integers (and
booleans) are summed as int64 (wrapping on overflow, like Java's ``long``), floats as float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chandy.core.types import Row, RowKind
from chandy.errors import BatchColumnError, BatchTypeError, BatchValueError
from chandy.state.arrow_keys import INTERNAL_COLUMNS, KEY_COLUMN, KEY_GROUP_COLUMN
from chandy.state.columnar import ColumnarKeyedState, ColumnarKeyedStateBackend, ColumnarStateView
from chandy.task.batches import TimestampedBatch
from chandy.task.operators.base import StreamOperator, UdfOperator, resolve_call
from chandy.task.operators.timestamps import batch_timestamps
from chandy.util.memory import keep_freed_heap

#: What the functions of the batch path may return, for the errors that name it.
_RETURNABLE = (
    "a pyarrow.RecordBatch, a pyarrow.Table, a dict of column name to array (numpy, Arrow or list), "
    "a pandas DataFrame, or None for no output"
)


def to_record_batch(result: Any) -> pa.RecordBatch | None:
    """What a batch function returned, as one ``RecordBatch`` (``None`` for no output).

    Accepts a ``RecordBatch`` (as is), a ``Table`` (its chunks combined into one batch), a
    dict of columns (numpy arrays, Arrow arrays or lists, all of one length) and a pandas
    ``DataFrame`` (recognised without importing pandas, which the batch path does not need).
    """
    if result is None or isinstance(result, pa.RecordBatch):
        return result
    if isinstance(result, pa.Table):
        batches = result.combine_chunks().to_batches()
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=result.schema)
        return batches[0]
    if isinstance(result, dict):
        columns = {
            name: column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
            for name, column in result.items()
        }
        lengths = {name: len(column) for name, column in columns.items()}
        if len(set(lengths.values())) > 1:
            raise BatchValueError(f"the columns of a returned dict must have one length, got {lengths}")
        return pa.RecordBatch.from_pydict(columns)
    if type(result).__name__ == "DataFrame" and hasattr(result, "to_dict") and hasattr(result, "columns"):
        return pa.RecordBatch.from_pandas(result, preserve_index=False)
    raise BatchTypeError(f"a batch function returned {_a(type(result).__qualname__)}; return {_RETURNABLE}")


def _a(noun: str) -> str:
    """``noun`` with its indefinite article ("an int", "a str")."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _rows(operator: StreamOperator, batch: Any) -> int:
    """The rows of ``batch``, which must be a ``RecordBatch``: a batch of records (a list)
    here is a wiring mistake, named instead of failing on a missing attribute."""
    if type(batch) is not pa.RecordBatch:
        raise BatchTypeError(
            f"{operator.name} takes Arrow record batches and got {_a(type(batch).__name__)}: its input "
            "must be a batch stream (turn a DataStream into one with to_batches())"
        )
    rows: int = batch.num_rows
    return rows


def _user_columns(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` without the engine's keyed-edge columns."""
    names = batch.schema.names
    if not any(name in INTERNAL_COLUMNS for name in names):
        return batch
    return batch.select([i for i, name in enumerate(names) if name not in INTERNAL_COLUMNS])


# ---------------------------------------------------------------------------- non-keyed


class MapBatchesOperator(UdfOperator):
    """``BatchStream.map_batches(fn)``: ``fn(batch)`` per batch (a :class:`MapBatchesFunction`
    or a plain callable); emits what it returns when that has rows."""

    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "map_batch")

    def process_batch(self, records: Any) -> None:
        if _rows(self, records) == 0:
            return
        out = to_record_batch(self._call(records))
        if out is not None and out.num_rows:
            self.output(out)


_MAPPING_ERROR = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError)


class RecordsToBatchesOperator(StreamOperator):
    """``DataStream.to_batches(schema)``: each batch of records becomes one ``RecordBatch``.

    A record is a tuple (a named tuple's fields give the column names) or a ``Row`` (a named
    row's fields give them), a dict (its keys do: every key of any record of the batch), or
    anything else, which is a scalar in one column, ``value``. Unnamed fields are ``f0``,
    ``f1``, ... (Flink's names). Without a ``schema`` the column types are inferred from each
    batch, so a stream whose types vary (an int column that is sometimes null in a whole
    batch, say) should give one. Timestamps are dropped: a RecordBatch carries none.

    Named fields meet the columns by name (the schema's, else the first record's), unnamed
    ones by position; a dict key or a named field that no column has is refused, not dropped:
    it is a field lost silently, most often to a misspelled name. A dict may lack a key (null).
    """

    def __init__(self, schema: pa.Schema | None = None) -> None:
        super().__init__()
        self.schema = schema

    def process_batch(self, records: Any) -> None:
        values = records.values if type(records) is TimestampedBatch else records
        if values:
            self.output(records_to_batch(values, self.schema))


def _records_error(record: Any, schema: pa.Schema | None, cause: object) -> BatchTypeError:
    if schema is None:
        fix = "give to_batches() a schema (the column types were inferred from the records)"
    else:
        fix = f"make the records fit the schema, or give to_batches() a schema they fit (it got {schema})"
    return BatchTypeError(f"the record {record!r} cannot become a row of an Arrow batch: {cause}; {fix}")


def _kind(record: Any) -> type:
    """What makes the columns: fields by position (tuples and Rows, which may be mixed), a
    dict's keys, or the record itself (a scalar)."""
    if isinstance(record, (tuple, Row)):
        return tuple
    if isinstance(record, dict):
        return dict
    return object


def records_to_batch(values: list[Any], schema: pa.Schema | None = None) -> pa.RecordBatch:
    """One ``RecordBatch`` of ``values`` (see :class:`RecordsToBatchesOperator`)."""
    first = values[0]
    kind = _kind(first)
    if kind is not object and len(set(map(type, values))) > 1 and any(_kind(v) is not kind for v in values):
        odd = values[next(i for i, v in enumerate(values) if _kind(v) is not kind)]
        raise _records_error(odd, schema, f"the batch mixes {kind.__name__}s with {type(odd).__name__}s")
    if kind is dict:
        if schema is not None:  # a key the schema does not name would be lost (a misspelled name?)
            unknown = set().union(*values).difference(schema.names)
            if unknown:
                odd = next(v for v in values if not unknown.isdisjoint(v))
                missing = [k for k in odd if k in unknown]
                raise _records_error(odd, schema, f"its keys {missing} are not in the schema {schema.names}")
        try:
            if schema is None:  # every key of every record is a column (null where a record lacks it)
                keys = dict.fromkeys(name for value in values for name in value)
                return pa.RecordBatch.from_pydict({name: [v.get(name) for v in values] for name in keys})
            return pa.RecordBatch.from_pylist(values, schema=schema)
        except _MAPPING_ERROR as e:
            raise _records_error(_first_misfit(values, schema, dict.items), schema, e) from e
    if kind is object:
        field = _scalar_field(schema)
        try:
            column = pa.array(values, type=field.type if schema is not None else None)
        except _MAPPING_ERROR as e:
            raise _records_error(_first_misfit(values, schema, _scalar_fields), schema, e) from e
        return pa.RecordBatch.from_arrays(
            [column],
            schema=pa.schema([field]) if schema is not None else None,
            names=None if schema is not None else [field.name],
        )
    names = list(schema.names) if schema is not None else getattr(first, "_fields", None)
    if names:
        values = _by_name(values, names, schema)
    width = len(first)
    if len(set(map(len, values))) > 1:
        odd = next(v for v in values if len(v) != width)
        raise _records_error(
            odd, schema, f"it has {len(odd)} fields where the batch's first record has {width}"
        )
    columns = list(zip(*values, strict=True)) if width else []
    if schema is None:
        names = getattr(first, "_fields", None) or [f"f{i}" for i in range(width)]
        try:
            arrays = [pa.array(column) for column in columns]
        except _MAPPING_ERROR as e:
            raise _records_error(_first_misfit(values, None, enumerate), None, e) from e
        return pa.RecordBatch.from_arrays(arrays, names=list(names))
    if len(schema) != width:
        raise _records_error(first, schema, f"it has {width} fields and the schema {len(schema)}")
    try:
        arrays = [pa.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)]
    except _MAPPING_ERROR as e:
        raise _records_error(_first_misfit(values, schema, enumerate), schema, e) from e
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _by_name(values: list[Any], names: list[str], schema: pa.Schema | None) -> list[Any]:
    """``values`` with each named record (a named ``Row``, a named tuple) in the order of
    ``names`` (the schema's, or else the first record's), matched by name: by position, a
    record named otherwise would be renamed silently. Unnamed records go by position."""
    out = values
    for i, value in enumerate(values):
        fields = getattr(value, "_fields", None)
        if not fields or fields is names or list(fields) == names:
            continue
        if len(fields) != len(names) or set(fields) != set(names):
            raise _records_error(
                value, schema, f"its fields {list(fields)} are not the columns {names} (matched by name)"
            )
        if out is values:
            out = list(values)
        out[i] = tuple(value[list(fields).index(name)] for name in names)
    return out


def _scalar_fields(record: Any) -> list[tuple[int, Any]]:
    return [(0, record)]


def _scalar_field(schema: pa.Schema | None) -> pa.Field:
    if schema is None:
        return pa.field("value", pa.null())
    if len(schema) != 1:
        raise BatchTypeError(
            f"records that are plain values make one column, but the schema has {len(schema)}: {schema}"
        )
    return schema.field(0)


def _first_misfit(values: list[Any], schema: pa.Schema | None, fields: Callable[[Any], Any]) -> Any:
    """The first record with a field that does not convert to its column's type: the
    schema's, or (without one) the type of the first non-null value of the column. The
    error path only: a field at a time. ``fields(record)`` gives ``(column, value)`` pairs."""
    declared: dict[Any, Any] = {}
    if schema is not None:
        declared = {field.name: field.type for field in schema} | dict(enumerate(schema.types))
    for value in values:
        for column, field in fields(value):
            if field is None or (schema is not None and column not in declared):
                continue
            try:
                if column in declared:
                    pa.array([field], type=declared[column])
                else:
                    declared[column] = pa.array([field]).type
            except _MAPPING_ERROR:
                return value
    return values[0]


class BatchesToRecordsOperator(StreamOperator):
    """``BatchStream.to_records()``: every row of a batch becomes a named :class:`Row`
    (the engine's keyed-edge columns dropped). On a stream with event time
    (``timestamp_column``), each record carries its row's timestamp, so an event-time
    window on the record path works without assigning timestamps again."""

    def __init__(self, timestamp_column: str | None = None) -> None:
        super().__init__()
        self.timestamp_column = timestamp_column

    def process_batch(self, records: Any) -> None:
        if not _rows(self, records):
            return
        rows = batch_to_rows(records)
        if self.timestamp_column is None:
            self.output(rows)
            return
        timestamps = batch_timestamps(records, self.timestamp_column, "to_records()").tolist()
        self.output(TimestampedBatch(rows, timestamps))


def batch_to_rows(batch: pa.RecordBatch) -> list[Row]:
    """One named ``Row`` per row of ``batch`` (without its internal columns).

    Rows are built by setting their four slots directly, with one field-name list shared by
    the batch's rows (a Row never changes its list in place; ``set_field_names`` replaces
    it): ``Row(*values)`` and ``set_field_names`` per row cost three times as much (1.5 us
    against 0.5 a row), which a job mixing the record and batch APIs pays on every row."""
    batch = _user_columns(batch)
    names = list(batch.schema.names)
    if not names:
        return [Row() for _ in range(batch.num_rows)]
    new = object.__new__
    slot = vars(Row)  # the slot descriptors
    set_fields, set_values = slot["_fields"].__set__, slot["_values"].__set__
    set_from_dict, set_kind = slot["_from_dict"].__set__, slot["_row_kind"].__set__
    insert = RowKind.INSERT
    rows: list[Row] = []
    append = rows.append
    for values in zip(*(column.to_pylist() for column in batch.columns), strict=True):
        row = new(Row)
        set_fields(row, names)
        set_values(row, list(values))
        set_from_dict(row, False)
        set_kind(row, insert)
        append(row)
    return rows


# ---------------------------------------------------------------------------- keyed: grouping


def _stable_order(ids: np.ndarray, bound: int) -> np.ndarray:
    """The permutation that sorts ``ids`` (ints in ``[0, bound)``) stably: numpy sorts 8- and
    16-bit ints stably by radix (2.4 ns a row for 32k rows against 50 for int32's timsort), so
    ids below 2**16 take one radix pass and larger ones two (low half, then high half)."""
    if bound <= 1 << 8:
        return np.argsort(ids.astype(np.uint8, copy=False), kind="stable")
    if bound <= 1 << 16:
        return np.argsort(ids.astype(np.uint16, copy=False), kind="stable")
    low = np.argsort((ids & 0xFFFF).astype(np.uint16), kind="stable")
    high = np.argsort((ids[low] >> 16).astype(np.uint16), kind="stable")
    return low[high]


@dataclass
class _Grouped:
    """A keyed batch's rows by key: group ``g`` is the key ``keys[g]``, with state slot
    ``slots[g]`` and ``counts[g]`` rows, which are ``order[starts[g]:ends[g]]`` of the batch
    in arrival order.

    ``ids`` labels every row (in batch order) with a number below ``bound``; group ``g``'s
    label is ``labels[g]`` (``None``: the labels are the groups' numbers, ``0..len(keys)``).
    Labels increase with the group number, so sorting rows by label groups them in order."""

    ids: np.ndarray
    bound: int
    labels: np.ndarray | None
    keys: pa.Array
    slots: np.ndarray
    counts: np.ndarray
    _order: np.ndarray | None = None

    @property
    def order(self) -> np.ndarray:
        if self._order is None:
            self._order = _stable_order(self.ids, self.bound)
        return self._order

    @property
    def ends(self) -> np.ndarray:
        return np.cumsum(self.counts)

    def per_group(self, per_label: np.ndarray) -> np.ndarray:
        """An array indexed by label (length ``bound``) as one indexed by group."""
        return per_label if self.labels is None else per_label[self.labels]


#: Integer keys spanning at most this many values (or 4 per row of the batch) are grouped by
#: their offset from the batch's smallest key, without hashing.
_DIRECT_SPAN = 1 << 16


def _group(batch: pa.RecordBatch, key_column: str, state: ColumnarKeyedState, sort: bool) -> _Grouped:
    """Group ``batch`` by ``key_column`` and find (or make) the state slot of every key.

    Integer keys without nulls whose span (largest minus smallest) is small label each row
    by ``key - smallest``: groups in key order, found by counting (9 ns a row less than
    hashing for 32k rows). Other keys are dictionary-encoded (one hash per row, in C): the
    dictionary is the distinct keys in the order of their first row, the indices label the
    rows. Only the distinct keys go to the state's slot lookup, with their key groups.
    ``sort``: the caller needs the rows in group order (:attr:`_Grouped.order`)."""
    keys = _column(batch, key_column)
    if pa.types.is_dictionary(keys.type):
        keys = keys.dictionary_decode()
    rows = len(keys)
    labels: np.ndarray | None = None
    if pa.types.is_integer(keys.type) and keys.null_count == 0:
        values = keys.to_numpy()
        low, high = int(values.min()), int(values.max())
        span = high - low + 1
        if span <= max(_DIRECT_SPAN, 4 * rows):
            # Subtract in a type that cannot overflow: int64 for signed keys (int8's 127 - -128
            # wraps), the keys' own for unsigned ones (whose smallest may not fit an int64).
            signed = values.dtype.kind == "i"
            offsets = values.astype(np.int64, copy=False) - low if signed else values - values.dtype.type(low)
            ids = offsets.astype(np.int32 if span > _DIRECT_SPAN else np.uint16)
            per_label = np.bincount(ids, minlength=span)
            labels = np.flatnonzero(per_label)
            counts = per_label[labels]
            if len(labels) == span:
                labels = None
            wide = np.dtype(np.int64 if signed else np.uint64)
            present = labels if labels is not None else np.arange(span)
            distinct = pa.array(present.astype(wide) + wide.type(low)).cast(keys.type)
            return _grouped_with_slots(batch, state, ids, span, labels, distinct, counts, sort)
    if pa.types.is_floating(keys.type):
        keys = _canonical_floats(keys)
    encoded = pc.dictionary_encode(keys, null_encoding="encode")
    ids = encoded.indices.to_numpy(zero_copy_only=False)
    distinct = encoded.dictionary
    counts = np.bincount(ids, minlength=len(distinct))
    return _grouped_with_slots(batch, state, ids, len(distinct), None, distinct, counts, sort)


def _canonical_floats(keys: pa.Array) -> pa.Array:
    """Float keys with -0.0 as 0.0 and every NaN as one NaN.

    Arrow's dictionary encoding compares bits, but 0.0 and -0.0 are one key in Python and on
    the record path (equal, and ``stable_hash`` gives them one key group), and the columnar
    state keeps one NaN key: two groups for what the state holds in one slot would lose one
    group's updates. (NaN keys of different bits are hashed by their bits on both paths, as
    ``stable_hash`` does, so they may reach different subtasks; within a subtask they are one key.)"""
    half = pa.types.is_float16(keys.type)
    work = keys.cast(pa.float32()) if half else keys  # Arrow has no float16 arithmetic
    zero = pa.scalar(0.0, work.type)
    canonical = pc.if_else(pc.is_nan(work), pa.scalar(math.nan, work.type), pc.add(work, zero))  # -0 + 0 = 0
    return canonical.cast(keys.type) if half else canonical


def _grouped_with_slots(
    batch: pa.RecordBatch,
    state: ColumnarKeyedState,
    ids: np.ndarray,
    bound: int,
    labels: np.ndarray | None,
    distinct: pa.Array,
    counts: np.ndarray,
    sort: bool,
) -> _Grouped:
    grouped = _Grouped(ids, bound, labels, distinct, np.empty(0, dtype=np.int64), counts)
    row_key_groups = _column(batch, KEY_GROUP_COLUMN).to_numpy(zero_copy_only=False)
    if sort:  # the first row of each group, in the order the running path needs anyway
        key_groups = row_key_groups[grouped.order[grouped.ends - counts]]
    else:  # every row of a key has the key's key group: whichever row's write lands is right
        key_groups = np.empty(bound, dtype=np.int32)
        key_groups[ids] = row_key_groups
        key_groups = grouped.per_group(key_groups)
    grouped.slots = np.asarray(state.slots_of(distinct, key_groups), dtype=np.int64)
    return grouped


def _column(batch: pa.RecordBatch, name: str, operation: str = "a keyed batch operator") -> pa.Array:
    index = batch.schema.get_field_index(name)
    if index < 0:
        if name == KEY_GROUP_COLUMN:
            raise BatchTypeError(
                f"a keyed batch operator got a batch without the {KEY_GROUP_COLUMN} column: its input must "
                "be a keyed batch edge (key_by on a BatchStream, partitioned by ArrowKeyGroupPartitioner)"
            )
        raise BatchColumnError(
            f"{operation}: the batch has no column {name!r}; its columns are "
            f"{_user_columns(batch).schema.names}"
        )
    return batch.column(index)


def _columnar_backend(operator: StreamOperator) -> ColumnarKeyedStateBackend:
    assert operator.runtime_context is not None
    backend = operator.runtime_context.keyed_state_backend
    if not isinstance(backend, ColumnarKeyedStateBackend):
        raise BatchTypeError(
            f"operator '{operator.name}' keeps columnar keyed state but its keyed state backend is "
            f"{type(backend).__name__}: the chain creates a ColumnarKeyedStateBackend for an operator "
            "with columnar_state = True (a harness must pass one)"
        )
    return backend


def _running_int_sum(
    values: np.ndarray, starts: np.ndarray, prior: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Running sums of grouped int64 ``values`` (in place) starting from ``prior`` per group,
    and every group's final sum, with one cumulative sum over the whole batch: the first
    value of each group is corrected by the difference between its prior and the previous
    group's final sum, so the global running sum restarts at each group. int64 arithmetic
    wraps, so the corrections cancel exactly whatever the other groups' sums are."""
    final = prior + np.add.reduceat(values, starts)
    correction = prior.copy()
    correction[1:] -= final[:-1]
    values[starts] += correction
    return np.cumsum(values, out=values), final


def _segmented_scan(op: np.ufunc, values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Running ``op`` (associative: min, max, add) of grouped ``values`` within each group,
    in place: Hillis and Steele's scan, log2 of the longest group passes over the batch,
    each combining a row with the row ``step`` before it when that row is of its group.
    Used where a global scan cannot be corrected per group (min, max; float sums, where a
    correction would carry every other group's rounding error into this one's)."""
    rank = np.arange(len(values)) - np.repeat(starts, counts)
    longest = int(counts.max())
    step = 1
    while step < longest:
        combined = op(values[step:], values[:-step])
        np.copyto(values[step:], combined, where=rank[step:] >= step)
        step *= 2
    return values


#: The aggregate functions of :class:`KeyedBatchAggregateOperator`.
AGGREGATE_FUNCTIONS = ("sum", "count", "min", "max", "mean")
_ACC = "acc"
_COUNT = "count"


def _identity(function: str, dtype: np.dtype[Any]) -> int | float:
    """The accumulator of a key without values (what combining with it leaves unchanged)."""
    if function == "min":
        return float("inf") if dtype.kind == "f" else int(np.iinfo(np.int64).max)
    if function == "max":
        return float("-inf") if dtype.kind == "f" else int(np.iinfo(np.int64).min)
    return 0


@dataclass
class _Aggregated:
    """The aggregated column of a batch as the aggregation reads it."""

    column: pa.Array | None  # None for count()
    #: The values as int64 / float64, nulls replaced by the function's identity (None for count).
    values: np.ndarray | None
    #: Where the column is not null (None: everywhere).
    valid: np.ndarray | None


def aggregated_values(
    batch: pa.RecordBatch, function: str, column_name: str | None, call_text: str, dtype: np.dtype[Any] | None
) -> _Aggregated:
    """Column ``column_name`` of ``batch`` as aggregate ``function`` reads it: int64 for
    integers and booleans, float64 for floats, nulls replaced by the function's identity
    and marked in ``valid``. ``dtype``: the accumulator's type so far (for a column of only
    nulls); ``call_text`` names the call in errors."""
    if column_name is None:
        return _Aggregated(None, None, None)
    column = _column(batch, column_name, call_text)
    valid = None
    if column.null_count:
        valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    if function == "count":
        return _Aggregated(column, None, valid)
    kind = column.type
    if pa.types.is_null(kind):  # only nulls (typed so by inference): no value, in the state's type
        dtype = dtype or np.dtype(np.int64)
        values = np.full(len(column), _identity(function, dtype), dtype=dtype)
        return _Aggregated(None, values, np.zeros(len(column), dtype=bool))
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        dtype = np.dtype(np.int64)
    elif pa.types.is_floating(kind):
        dtype = np.dtype(np.float64)
    else:
        raise BatchTypeError(
            f"{call_text} aggregates numbers, but column {column_name!r} is "
            f"{kind}: cast it first (map_batches), or use count()"
        )
    if valid is not None:
        column = pc.fill_null(column, False if pa.types.is_boolean(kind) else 0)
    values = column.to_numpy(zero_copy_only=False).astype(dtype, copy=valid is not None)
    if valid is not None:
        values[~valid] = _identity(function, dtype)
    return _Aggregated(column, values, valid)


def accumulate(
    function: str, grouped: _Grouped, state: ColumnarKeyedState, aggregated: _Aggregated
) -> tuple[np.ndarray, np.ndarray]:
    """Add a grouped batch to the state's ``count`` (non-null values) and ``acc`` columns
    for its keys, in numpy; returns each key's new aggregate (the count for count) and count."""
    values, valid = aggregated.values, aggregated.valid
    ids, slots = grouped.ids, grouped.slots
    count = state.column(_COUNT)
    counts = grouped.counts
    if valid is not None:
        counts = grouped.per_group(np.bincount(ids[valid], minlength=grouped.bound))
    new_count = count[slots] + counts
    count[slots] = new_count
    result: np.ndarray = new_count
    if values is not None:
        acc = state.column(_ACC)
        op = _OPS.get(function, np.add)
        batch_acc = np.full(grouped.bound, _identity(function, values.dtype), dtype=values.dtype)
        op.at(batch_acc, ids, values)
        result = op(acc[slots], grouped.per_group(batch_acc))
        acc[slots] = result
    return result, new_count


def aggregate_column(
    function: str, column_type: pa.DataType | None, result: np.ndarray, counts: np.ndarray | None
) -> pa.Array:
    """An aggregate as an output column: null where the key has no value yet (``counts`` of
    values so far is 0; ``None``: every row has one), a mean divided out, a min or max in
    the input's type (``column_type``, when known)."""
    if function == "count":
        return pa.array(result)
    mask = None
    if counts is not None:
        no_value = counts == 0
        mask = no_value if no_value.any() else None
    if function == "mean":
        assert counts is not None
        result = np.divide(result, np.maximum(counts, 1), dtype=np.float64)
        return pa.array(result, mask=mask)
    out = pa.array(result, mask=mask)
    if function in ("min", "max") and column_type is not None and out.type != column_type:
        out = out.cast(column_type)
    return out


#: The numpy combination of each aggregate function's accumulator (sum, count, mean: add).
_OPS = {"min": np.minimum, "max": np.maximum}


class KeyedBatchAggregateOperator(StreamOperator):
    """``KeyedBatchStream.sum / count / min / max / mean`` and their ``running_`` versions.

    State per key (columnar): the accumulator (``acc``: int64 or float64, the sum for sum and
    mean, the extreme so far for min and max) and the number of non-null values so far
    (``count``), which says whether the key has a value yet and divides the mean.

    Non-running: per batch one row per distinct key of the batch, ``(key, aggregate)``, the
    key column named as the input's (``key`` for ``key_by(fn)``), the aggregate named like the
    aggregated column (``count`` for count). Running: one row per input row, the input's
    columns with the aggregated one replaced by the key's aggregate up to and including that
    row (count: a ``count`` column appended), grouped by key in arrival order per key: the
    record path's ``KeyedStream.sum`` over rows, with one difference, SQL's (an aggregate
    ``OVER`` the key's rows so far): every row keeps its own other columns, where Flink's
    ``sum`` / ``min`` / ``max`` keep those of the key's first record (which would mean keeping
    whole rows in state).
    """

    keyed = True
    columnar_state = True

    def __init__(self, function: str, column: str | None, running: bool, key_column: str) -> None:
        super().__init__()
        if function not in AGGREGATE_FUNCTIONS:
            raise ValueError(
                f"unknown batch aggregate function {function!r}; use one of {', '.join(AGGREGATE_FUNCTIONS)}"
            )
        if column is None and function != "count":
            raise ValueError(f"{function}() aggregates a column: name it ({function}('column'))")
        self.function = function
        self.column = column
        self.running = running
        self.key_column = key_column
        self.name = f"{'running_' if running else ''}{function}({column or ''})"
        #: The call as the user wrote it, for errors: running_sum('v').
        self._call_text = (
            f"{'running_' if running else ''}{function}({'' if column is None else repr(column)})"
        )
        self.state_name = f"_batch_{function}"
        self._output_name = _COUNT if function == "count" else column
        self._state: ColumnarKeyedState | None = None
        self._dtype: np.dtype[Any] | None = None

    def open(self) -> None:
        keep_freed_heap()
        self._backend = _columnar_backend(self)

    def _values(self, batch: pa.RecordBatch) -> _Aggregated:
        """The aggregated column of ``batch`` as the aggregation reads it."""
        return aggregated_values(batch, self.function, self.column, self._call_text, self._dtype)

    def _state_for(self, dtype: np.dtype[Any] | None) -> ColumnarKeyedState:
        """The state, made on the first batch, when the accumulator's type is known."""
        if self._state is not None:
            if dtype is not None and dtype != self._dtype:
                raise BatchTypeError(
                    f"{self.name}: column {self.column!r} was {self._dtype} and is now {dtype}; "
                    "give the column one type: a schema for to_batches() (without one each batch's "
                    "types are inferred from its records), or a cast in map_batches"
                )
            return self._state
        fields = [pa.field(_COUNT, pa.int64())]
        defaults: dict[str, Any] = {_COUNT: 0}
        if dtype is not None:
            fields.insert(0, pa.field(_ACC, pa.from_numpy_dtype(dtype)))
            defaults[_ACC] = _identity(self.function, dtype)
        self._state = self._backend.get_columnar_state(self.state_name, pa.schema(fields), defaults)
        self._dtype = dtype
        return self._state

    def process_batch(self, records: Any) -> None:
        if _rows(self, records) == 0:
            return
        aggregated = self._values(records)
        values = aggregated.values
        state = self._state_for(None if values is None else values.dtype)
        grouped = _group(records, self.key_column, state, sort=self.running)
        if self.running:
            self.output(self._running(records, grouped, state, aggregated))
        else:
            self.output(self._totals(grouped, state, aggregated))

    def _op(self) -> np.ufunc:
        return _OPS.get(self.function, np.add)

    def _totals(
        self, grouped: _Grouped, state: ColumnarKeyedState, aggregated: _Aggregated
    ) -> pa.RecordBatch:
        """One row per distinct key: its aggregate after this batch (no sort needed)."""
        result, new_count = accumulate(self.function, grouped, state, aggregated)
        key_name = "key" if self.key_column == KEY_COLUMN else self.key_column
        self._refuse_name_twice(key_name, "key")
        out = self._output_column(aggregated.column, result, new_count)
        return pa.RecordBatch.from_arrays([grouped.keys, out], names=[key_name, self._output_name])

    def _running(
        self, batch: pa.RecordBatch, grouped: _Grouped, state: ColumnarKeyedState, aggregated: _Aggregated
    ) -> pa.RecordBatch:
        """One row per input row, grouped by key: the key's aggregate up to that row."""
        column, values, valid = aggregated.column, aggregated.values, aggregated.valid
        order, slots, counts = grouped.order, grouped.slots, grouped.counts
        starts = grouped.ends - counts
        count = state.column(_COUNT)
        running_count: np.ndarray | None = None
        if valid is None and self.function not in ("count", "mean"):
            count[slots] += counts  # every row has a value: no null to mask, no count to emit
        else:
            ones = np.ones(len(order), dtype=np.int64) if valid is None else valid[order].astype(np.int64)
            running_count, count[slots] = _running_int_sum(ones, starts, count[slots])
        result = running_count
        if values is not None:
            acc = state.column(_ACC)
            ordered = values[order]
            if self.function in ("sum", "mean") and ordered.dtype.kind == "i":
                result, final = _running_int_sum(ordered, starts, acc[slots])
            else:
                op = self._op()
                ordered[starts] = op(ordered[starts], acc[slots])  # the scan starts from the prior
                result = _segmented_scan(op, ordered, starts, counts)
                final = result[grouped.ends - 1]
            acc[slots] = final
        assert result is not None
        out = self._output_column(column, result, running_count)
        user = _user_columns(batch)
        names = user.schema.names
        indices = pa.array(order)
        replaced = -1 if self.function == "count" else names.index(self.column)
        arrays = [out if i == replaced else c.take(indices) for i, c in enumerate(user.columns)]
        if replaced < 0:
            if _COUNT in names:
                self._refuse_name_twice(_COUNT, "input")
            return pa.RecordBatch.from_arrays([*arrays, out], names=[*names, _COUNT])
        return pa.RecordBatch.from_arrays(arrays, names=names)

    def _refuse_name_twice(self, name: str, other: str) -> None:
        """Refuse an output with two columns named ``name``: the aggregate's and the ``other``
        (the key's, or one of the input's). A reader that goes by name (a Row's field, a
        dict, a sink's schema) would see only one of them, the other lost silently."""
        if name != self._output_name:
            return
        raise BatchValueError(
            f"{self._call_text}: the output would have two columns named {name!r}, the {other} "
            f"column and the aggregate; rename the {other} column first (map_batches, e.g. "
            f"lambda b: b.rename_columns([...]))"
            + (", or key by a renamed copy of it" if other == "key" else "")
        )

    def _output_column(
        self, column: pa.Array | None, result: np.ndarray, counts: np.ndarray | None
    ) -> pa.Array:
        """The aggregate as the output's column (see :func:`aggregate_column`)."""
        return aggregate_column(self.function, None if column is None else column.type, result, counts)


# ---------------------------------------------------------------------------- keyed: user function


class KeyedBatchProcessOperator(UdfOperator):
    """``KeyedBatchStream.process_batches(fn, state_schema)``: ``fn`` gets each batch grouped
    by key (the engine's columns removed) and the columnar state of its keys, a
    :class:`~chandy.state.columnar.ColumnarStateView`; what it returns is emitted."""

    keyed = True
    columnar_state = True

    #: The name of the function's columnar state.
    STATE_NAME = "_process_batches"

    def __init__(self, fn: Any, state_schema: pa.Schema, key_column: str) -> None:
        super().__init__(fn)
        self.state_schema = state_schema
        self.key_column = key_column
        self._state: ColumnarKeyedState | None = None

    def open(self) -> None:
        keep_freed_heap()
        self._state = _columnar_backend(self).get_columnar_state(self.STATE_NAME, self.state_schema)
        super().open()
        self._call = resolve_call(self.user_function, "process_batch")

    def process_batch(self, records: Any) -> None:
        if _rows(self, records) == 0:
            return
        state = self._state
        assert state is not None, "process_batch before open"
        grouped = _group(records, self.key_column, state, sort=True)
        order = grouped.order
        ends = grouped.ends
        offsets = np.zeros(len(ends) + 1, dtype=np.int64)
        offsets[1:] = ends
        group_ids = np.repeat(np.arange(len(ends), dtype=np.int64), grouped.counts)
        view = ColumnarStateView(state, grouped.slots, offsets, group_ids, grouped.keys)
        out = to_record_batch(self._call(_user_columns(records).take(pa.array(order)), view))
        if out is not None and out.num_rows:
            self.output(out)
