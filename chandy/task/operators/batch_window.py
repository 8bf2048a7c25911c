"""Event-time windows on the batch (Arrow) path: ``KeyedBatchStream.window(assigner)``.

What the record path's :class:`~chandy.task.operators.window.WindowOperator` does per
record, this operator does per batch, in numpy: every row's windows come from its
event-time column (``WatermarkStrategy.with_timestamp_column``), the rows of a batch are
split by window (a radix sort of the window index when a batch spans several), and each
window's rows are grouped by key and added to that window's accumulators in one pass.

State. Each pending window is one :class:`~chandy.state.columnar.ColumnarKeyedState`
(named after the window's start), one slot per key of the window: the accumulator's columns
and ``fired`` (whether that key's window has been emitted). The keyed state backend
snapshots it per key group, so a restore at another parallelism reads the windows of its own
key groups only, and the set of pending windows is the set of restored states: a restore
fires what was pending when the watermark passes it again.

Timers are not per key: the operator keeps the pending windows' starts and, when the
watermark reaches a window's end (``end - 1 <= watermark``), emits every key of the window
in one batch, windows in the order of their end (the order the record path's timers fire
in), before forwarding the watermark. Lateness as in Flink: a row joins only its windows
whose cleanup time (``end - 1 + allowed_lateness``) is after the watermark; within the
allowed lateness a row for a window that already fired updates it and the window is emitted
again for the keys the batch touched (once per batch, with every late row of the batch in
it, where the record path emits once per late record); a row none of whose windows is open
goes to the late side output when there is one, else it is dropped. A window's state goes at
its cleanup time.

Restores. The watermark starts over after a restore, so a late row for a window that fired
before the checkpoint usually arrives before the watermark passes that window again: its
keys' ``fired`` markers are cleared, and they fire again (with the row) when it does; keys
without such a row keep their marker and are not emitted twice. ``min`` / ``max`` keep the
input column's type through a restore: it is in the accumulator field's metadata.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import pyarrow as pa

from chandy.core.functions import BatchAggregateFunction
from chandy.core.output_tag import OutputTag
from chandy.core.time import MAX_WATERMARK, MIN_TIMESTAMP
from chandy.errors import BatchTypeError, BatchValueError
from chandy.state.arrow_keys import KEY_COLUMN, KEY_GROUP_COLUMN
from chandy.state.columnar import ColumnarKeyedState, ColumnarKeyedStateBackend
from chandy.task.operators.base import StreamOperator
from chandy.task.operators.batch import (
    _ACC,
    _COUNT,
    _Aggregated,
    _column,
    _columnar_backend,
    _group,
    _Grouped,
    _identity,
    _rows,
    _stable_order,
    _user_columns,
    accumulate,
    aggregate_column,
    aggregated_values,
    to_record_batch,
)
from chandy.task.operators.timestamps import batch_timestamps
from chandy.util.memory import keep_freed_heap

#: The name of a window's columnar state is this prefix and the window's start.
WINDOW_STATE_PREFIX = "_batch_window@"
#: The state column saying a key's window has been emitted (so a restore does not emit it twice).
_FIRED = "fired"
#: The metadata key of the accumulator field holding the output column's Arrow type (a
#: serialized one-field schema): a restored window's ``min`` / ``max`` emits the input
#: column's type even when it fires before any batch tells the operator that type.
OUTPUT_TYPE_METADATA = b"chandy.output_type"
#: The output's window columns.
WINDOW_START, WINDOW_END = "window_start", "window_end"


class WindowAggregation(ABC):
    """What a batch window computes per (key, window): its accumulator columns, how a batch's
    rows update them, and the output columns of a fired window."""

    #: The call as written, for errors ("sum('value')").
    call_text = "aggregate"

    def prepare(self, batch: pa.RecordBatch) -> Any:
        """What :meth:`add` needs of a whole batch (computed once, taken per window)."""
        return _user_columns(batch)

    def take(self, prepared: Any, rows: np.ndarray) -> Any:
        """The part of ``prepared`` for ``rows`` (indices into the batch)."""
        return prepared.take(pa.array(rows))

    @abstractmethod
    def schema(self, prepared: Any) -> tuple[list[pa.Field], dict[str, Any]]:
        """The accumulator's fields and their starting values (the first batch decides)."""

    def adopt(self, schema: pa.Schema) -> dict[str, Any]:
        """A restored window's state has ``schema``: take it as the accumulator's, return the defaults."""
        return self.schema_defaults(schema)

    def annotate(self, fields: list[pa.Field]) -> list[pa.Field]:
        """``fields`` with what the aggregation learnt since they were made (for new windows)."""
        return fields

    @abstractmethod
    def schema_defaults(self, schema: pa.Schema) -> dict[str, Any]:
        """The starting values of the accumulator columns of ``schema``."""

    @abstractmethod
    def add(self, state: ColumnarKeyedState, grouped: _Grouped, prepared: Any) -> None:
        """Add one window's rows of a batch (grouped by key) to their keys' accumulators."""

    @abstractmethod
    def results(self, state: ColumnarKeyedState, slots: np.ndarray) -> list[tuple[str, pa.Array]]:
        """The output columns (name, values) of the keys in ``slots``."""


class BuiltinWindowAggregation(WindowAggregation):
    """``sum / count / min / max / mean(column)`` (``count()`` counts rows): the keyed batch
    aggregations' accumulators and null rules, per window."""

    def __init__(self, function: str, column: str | None) -> None:
        self.function = function
        self.column = column
        self.call_text = f"window(...).{function}({'' if column is None else repr(column)})"
        self.output_name = _COUNT if function == "count" else column
        self._dtype: np.dtype[Any] | None = None
        self._column_type: pa.DataType | None = None

    def prepare(self, batch: pa.RecordBatch) -> _Aggregated:
        aggregated = aggregated_values(batch, self.function, self.column, self.call_text, self._dtype)
        if aggregated.column is not None:
            self._column_type = aggregated.column.type
        values = aggregated.values
        if values is not None and self._dtype is not None and values.dtype != self._dtype:
            raise BatchTypeError(
                f"{self.call_text}: column {self.column!r} was {self._dtype} and is now {values.dtype}; "
                "give the column one type (a cast in map_batches, or a schema for to_batches())"
            )
        return aggregated

    def take(self, prepared: _Aggregated, rows: np.ndarray) -> _Aggregated:
        values, valid = prepared.values, prepared.valid
        return _Aggregated(
            prepared.column,
            None if values is None else values[rows],
            None if valid is None else valid[rows],
        )

    def schema(self, prepared: _Aggregated) -> tuple[list[pa.Field], dict[str, Any]]:
        fields = [pa.field(_COUNT, pa.int64())]
        if prepared.values is not None:
            self._dtype = prepared.values.dtype
            fields.insert(0, pa.field(_ACC, pa.from_numpy_dtype(self._dtype)))
        return self.annotate(fields), self.schema_defaults(pa.schema(fields))

    def annotate(self, fields: list[pa.Field]) -> list[pa.Field]:
        """The accumulator field with the output column's type in its metadata, once known
        (a first batch of only nulls, or a window restored from a state without it, does not
        tell it)."""
        if self._column_type is None:
            return fields
        typed = pa.schema([pa.field(self.output_name or _ACC, self._column_type)])
        return [
            f.with_metadata({OUTPUT_TYPE_METADATA: typed.serialize().to_pybytes()})
            if f.name == _ACC and OUTPUT_TYPE_METADATA not in (f.metadata or {})
            else f
            for f in fields
        ]

    def adopt(self, schema: pa.Schema) -> dict[str, Any]:
        if _ACC in schema.names:
            acc = schema.field(_ACC)
            self._dtype = np.dtype(acc.type.to_pandas_dtype())
            typed = (acc.metadata or {}).get(OUTPUT_TYPE_METADATA)
            if typed is not None and self._column_type is None:
                self._column_type = pa.ipc.read_schema(pa.py_buffer(typed)).field(0).type
        return self.schema_defaults(schema)

    def schema_defaults(self, schema: pa.Schema) -> dict[str, Any]:
        defaults: dict[str, Any] = {_COUNT: 0}
        if _ACC in schema.names:
            defaults[_ACC] = _identity(self.function, np.dtype(schema.field(_ACC).type.to_pandas_dtype()))
        return defaults

    def add(self, state: ColumnarKeyedState, grouped: _Grouped, prepared: _Aggregated) -> None:
        accumulate(self.function, grouped, state, prepared)

    def results(self, state: ColumnarKeyedState, slots: np.ndarray) -> list[tuple[str, pa.Array]]:
        counts = state.column(_COUNT)[slots]
        result = counts if self.function == "count" else state.column(_ACC)[slots]
        assert self.output_name is not None
        return [(self.output_name, self.result_column(result, counts))]

    def result_column(self, result: np.ndarray, counts: np.ndarray) -> pa.Array:
        """The output column of accumulators ``result`` (the counts for count) and ``counts``."""
        return aggregate_column(self.function, self._column_type, result, counts)


class UserWindowAggregation(WindowAggregation):
    """``aggregate(fn, accumulator_schema)`` with a :class:`~chandy.core.functions.BatchAggregateFunction`."""

    def __init__(self, function: BatchAggregateFunction, accumulator_schema: pa.Schema) -> None:
        self.function = function
        self.accumulator_schema = accumulator_schema
        self.call_text = f"window(...).aggregate({type(function).__name__})"
        self._defaults: dict[str, Any] = {}

    def open(self) -> None:
        defaults = self.function.create_accumulator()
        if not isinstance(defaults, dict):
            raise BatchTypeError(
                f"{self.call_text}: create_accumulator() returned {type(defaults).__name__}; return a "
                "dict of accumulator column to starting value"
            )
        self._defaults = defaults

    def schema(self, prepared: Any) -> tuple[list[pa.Field], dict[str, Any]]:
        return list(self.accumulator_schema), self.schema_defaults(self.accumulator_schema)

    def schema_defaults(self, schema: pa.Schema) -> dict[str, Any]:
        return {name: value for name, value in self._defaults.items() if name in schema.names}

    def add(self, state: ColumnarKeyedState, grouped: _Grouped, prepared: pa.RecordBatch) -> None:
        slots = grouped.slots
        names = self.accumulator_schema.names
        accumulator = {name: state.column(name)[slots] for name in names}
        group_ids = grouped.ids
        if grouped.labels is not None:  # labels -> group numbers
            numbers = np.zeros(grouped.bound, dtype=np.int64)
            numbers[grouped.labels] = np.arange(len(grouped.labels))
            group_ids = numbers[group_ids]
        updated = self.added(accumulator, prepared, group_ids)
        for name in names:
            column = state.column(name)
            column[slots] = updated[name]

    def added(self, accumulator: dict[str, np.ndarray], rows: Any, group_ids: np.ndarray) -> dict[str, Any]:
        """``add(accumulator, rows, group_ids)``: the updated columns (``accumulator`` itself when
        ``add`` updated it in place), checked to hold every accumulator column."""
        returned = self.function.add(accumulator, rows, group_ids)
        updated = accumulator if returned is None else returned
        names = self.accumulator_schema.names
        if not isinstance(updated, dict) or set(names) - set(updated):
            raise BatchTypeError(
                f"{self.call_text}: add() must update the accumulator in place (and return None) or "
                f"return a dict with every accumulator column {names}"
            )
        return updated

    def results(self, state: ColumnarKeyedState, slots: np.ndarray) -> list[tuple[str, pa.Array]]:
        accumulator = {name: state.column(name)[slots] for name in self.accumulator_schema.names}
        return self.results_of(accumulator, len(slots))

    def results_of(self, accumulator: dict[str, np.ndarray], keys: int) -> list[tuple[str, pa.Array]]:
        """The output columns of ``keys`` accumulators (``get_result``, its answer checked)."""
        out = to_record_batch(self.function.get_result(accumulator))
        if out is None or out.num_rows != keys:
            rows = 0 if out is None else out.num_rows
            raise BatchValueError(
                f"{self.call_text}: get_result() returned {rows} rows for {keys} keys; return "
                "one value per key in every column"
            )
        return list(zip(out.schema.names, out.columns, strict=True))


class KeyedBatchWindowOperator(StreamOperator):
    """What the batch window operators share: the key and event-time columns, the allowed
    lateness, and the late side output."""

    keyed = True
    columnar_state = True

    def __init__(
        self,
        aggregation: WindowAggregation,
        key_column: str,
        timestamp_column: str,
        allowed_lateness: int,
        late_data_output_tag: OutputTag | None,
    ) -> None:
        super().__init__()
        self.aggregation = aggregation
        self.key_column = key_column
        self.timestamp_column = timestamp_column
        self.allowed_lateness = allowed_lateness
        self.late_data_output_tag = late_data_output_tag
        self.name = aggregation.call_text
        self._key_name = "key" if key_column == KEY_COLUMN else key_column

    def _open_aggregation(self) -> None:
        """Open a user aggregate's function (``aggregate(fn, ...)``); the built-ins need nothing."""
        if isinstance(self.aggregation, UserWindowAggregation):
            assert self.runtime_context is not None
            self.aggregation.function.open(self.runtime_context)  # a BatchAggregateFunction
            self.aggregation.open()

    def close(self) -> None:
        if isinstance(self.aggregation, UserWindowAggregation):
            self.aggregation.function.close()

    def _emit_late(self, batch: pa.RecordBatch, late: np.ndarray) -> None:
        """The rows of ``batch`` where ``late`` is True to the late side output, if there is one."""
        tag = self.late_data_output_tag
        late_output = None if tag is None else self.side_outputs.get(tag.tag_id)
        if late_output is not None:
            late_output(_user_columns(batch).filter(pa.array(late)))


class BatchWindowOperator(KeyedBatchWindowOperator):
    """Tumbling and sliding event-time windows over keyed record batches (see the module)."""

    def __init__(
        self,
        size: int,
        slide: int,
        offset: int,
        aggregation: WindowAggregation,
        key_column: str,
        timestamp_column: str,
        allowed_lateness: int = 0,
        late_data_output_tag: OutputTag | None = None,
    ) -> None:
        super().__init__(aggregation, key_column, timestamp_column, allowed_lateness, late_data_output_tag)
        self.size, self.slide, self.offset = size, slide, offset
        #: Pending windows by start: their state.
        self._windows: dict[int, ColumnarKeyedState] = {}
        #: Windows whose on-time firing happened in this run (only the cleanup is left).
        self._fired: set[int] = set()
        #: Restored windows with keys emitted before the checkpoint (allowed lateness kept them).
        self._fired_before_restore: set[int] = set()
        self._fields: list[pa.Field] | None = None
        self._defaults: dict[str, Any] = {}
        self._backend: ColumnarKeyedStateBackend | None = None

    def open(self) -> None:
        keep_freed_heap()
        self._open_aggregation()
        backend = self._backend = _columnar_backend(self)
        for name, state in list(backend.states.items()):  # restored windows
            if not name.startswith(WINDOW_STATE_PREFIX):
                continue
            if not state.num_keys:
                backend.drop_columnar_state(name)
                continue
            defaults = self.aggregation.adopt(state.schema)
            defaults[_FIRED] = False
            start = int(name[len(WINDOW_STATE_PREFIX) :])
            restored = self._windows[start] = backend.get_columnar_state(name, state.schema, defaults)
            if restored.column(_FIRED)[restored.live_slots()].any():
                self._fired_before_restore.add(start)
            self._fields = [f for f in state.schema if f.name != _FIRED]
            self._defaults = defaults

    # ------------------------------------------------------------------ rows

    def _window_state(self, start: int, prepared: Any) -> ColumnarKeyedState:
        state = self._windows.get(start)
        if state is not None:
            return state
        if self._fields is None:
            fields, defaults = self.aggregation.schema(prepared)
            self._fields = fields
            self._defaults = {**defaults, _FIRED: False}
        else:
            self._fields = self.aggregation.annotate(self._fields)
        assert self._backend is not None
        schema = pa.schema([*self._fields, pa.field(_FIRED, pa.bool_())])
        state = self._backend.get_columnar_state(f"{WINDOW_STATE_PREFIX}{start}", schema, self._defaults)
        self._windows[start] = state
        return state

    def process_batch(self, records: Any) -> None:
        if _rows(self, records) == 0:
            return
        batch: pa.RecordBatch = records
        timestamps = batch_timestamps(batch, self.timestamp_column, self.name)
        watermark = self.current_watermark
        size, slide = self.size, self.slide
        # Every row's latest window (its start), then the earlier ones of a sliding window.
        last = timestamps - np.mod(timestamps - self.offset, slide)
        # A window starting at or before this is late (its cleanup time is not after the watermark).
        open_after = max(watermark - self.allowed_lateness - size + 1, MIN_TIMESTAMP)
        late = last <= open_after
        any_late = bool(late.any())
        if any_late:
            self._emit_late(batch, late)
        rows: np.ndarray | None = None  # None: every row
        starts = last
        if any_late or slide != size:
            pairs_rows, pairs_starts = [], []
            for j in range(math.ceil(size / slide)):
                start_j = last - j * slide if j else last
                keep = (start_j > timestamps - size) & (start_j > open_after)
                pairs_rows.append(np.flatnonzero(keep))
                pairs_starts.append(start_j[keep])
            rows = np.concatenate(pairs_rows)
            starts = np.concatenate(pairs_starts)
            if not len(rows):
                return
        prepared = self.aggregation.prepare(batch)
        keyed = _Keyed(
            batch.select([_index(batch, self.key_column, self.name), _index(batch, KEY_GROUP_COLUMN)])
        )
        low = int(starts.min())
        high = int(starts.max())
        if low == high:
            self._add(low, keyed, prepared, rows)
            return
        index = (starts - low) // slide
        bound = (high - low) // slide + 1
        order = _stable_order(index, bound)
        counts = np.bincount(index, minlength=bound)
        ends = np.cumsum(counts)
        for w in np.flatnonzero(counts).tolist():
            picked = order[ends[w] - counts[w] : ends[w]]
            self._add(low + w * slide, keyed, prepared, picked if rows is None else rows[picked])

    def _add(self, start: int, keyed: _Keyed, prepared: Any, rows: np.ndarray | None) -> None:
        """Add the batch's ``rows`` (all without) to window ``start``; emit it again for those
        keys if it has fired already (a late row within the allowed lateness)."""
        state = self._window_state(start, prepared)
        if rows is not None:
            prepared = self.aggregation.take(prepared, rows)
        grouped = _group(keyed.rows(rows), self.key_column, state, sort=False)
        self.aggregation.add(state, grouped, prepared)
        if start + self.size - 1 <= self.current_watermark:
            self._emit(start, state, grouped.slots)
        elif start in self._fired_before_restore:
            # Not complete by this run's watermark (it starts over after a restore), yet
            # fired before the checkpoint: these keys fire again when the watermark passes.
            state.column(_FIRED)[grouped.slots] = False

    # ------------------------------------------------------------------ firing

    def _emit(self, start: int, state: ColumnarKeyedState, slots: np.ndarray) -> None:
        """One row per key in ``slots`` of window ``start``: key, window bounds, aggregate."""
        fired = state.column(_FIRED)
        fired[slots] = True
        results = self.aggregation.results(state, slots)
        n = len(slots)
        names = [self._key_name, WINDOW_START, WINDOW_END, *(name for name, _ in results)]
        if len(set(names)) < len(names):
            raise BatchValueError(
                f"{self.name}: the output would repeat a column name ({names}); rename the key "
                "column or the aggregate's columns"
            )
        arrays = [
            state.key_array(slots),
            pa.array(np.full(n, start, dtype=np.int64)),
            pa.array(np.full(n, start + self.size, dtype=np.int64)),
            *(array for _, array in results),
        ]
        self.output(pa.RecordBatch.from_arrays(arrays, names=names))

    def process_watermark(self, timestamp: int) -> None:
        """Fire every pending window the watermark completes (by end), clean up those past
        their allowed lateness, then forward the watermark."""
        self.current_watermark = timestamp
        size, lateness = self.size, self.allowed_lateness
        for start in sorted(self._windows):
            max_timestamp = start + size - 1
            if max_timestamp > timestamp:
                break
            state = self._windows[start]
            if start not in self._fired:
                self._fired.add(start)
                slots = state.live_slots()
                if lateness:  # a restored window may hold keys emitted before the checkpoint
                    slots = slots[~state.column(_FIRED)[slots]]
                if len(slots):
                    self._emit(start, state, slots)
            if min(max_timestamp + lateness, MAX_WATERMARK) <= timestamp:
                del self._windows[start]
                self._fired.discard(start)
                self._fired_before_restore.discard(start)
                assert self._backend is not None
                self._backend.drop_columnar_state(state.name)
        self.emit_watermark(timestamp)


class _Keyed:
    """A batch's key and key-group columns, from which each window takes its rows: by numpy
    indexing for integer keys without nulls (in a profile of W5v, Arrow's ``take`` of these
    two columns cost about 1 ms a call), else by ``take``."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch
        keys = batch.column(0)
        self._numpy: list[np.ndarray] | None = None
        if pa.types.is_integer(keys.type) and not keys.null_count:
            self._numpy = [keys.to_numpy(), batch.column(1).to_numpy()]

    def rows(self, rows: np.ndarray | None) -> pa.RecordBatch:
        batch = self.batch
        if rows is None:
            return batch
        if self._numpy is None:
            return batch.take(pa.array(rows))
        keys, key_groups = self._numpy
        return pa.RecordBatch.from_arrays(
            [pa.array(keys[rows]), pa.array(key_groups[rows])], schema=batch.schema
        )


def _index(batch: pa.RecordBatch, name: str, operation: str = "a keyed batch operator") -> int:
    _column(batch, name, operation)  # the error naming a missing column
    index: int = batch.schema.get_field_index(name)
    return index
