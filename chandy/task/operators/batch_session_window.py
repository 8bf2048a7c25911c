"""Event-time session windows on the batch (Arrow) path:
``KeyedBatchStream.window(EventTimeSessionWindows.with_gap(...))``.

Semantics are Flink's ``MergingWindowSet`` as the record path's window operator has them:
a row opens ``[ts, ts + gap)``, sessions of a key that overlap or touch merge, a session
fires when the watermark reaches ``end - 1`` and is dropped at ``end - 1 + allowed_lateness``.
A row whose own window is past its cleanup time still joins when it touches a session that
exists when it arrives (a pending one, or one an earlier row of the batch made or extended);
otherwise it is late (side output or dropped). A row joining a session the watermark has
passed emits the merged session again (once per batch here, once per record there).

Vectorised per batch: the batch's rows and the pending sessions of its keys are sorted by
(key, start), runs that touch are found with a running maximum of the end, and their
accumulators combine with ``reduceat`` (sum, count and mean add, min and max take the
extreme), or, for ``aggregate(fn, ...)``, with ``fn.merge`` over every run at once: the
vectorised merge. A user aggregate gives each row an accumulator of its own first
(``create_accumulator``, then one ``add`` with a group per row), as the record path's
``MergingWindowSet`` adds each record to a window of its own and merges it.

Whether a row whose own window is late joins depends on the rows before it; that is
decided in rounds (each round a sorted search over the joined rows), as many rounds as the
longest chain of such rows that save each other, usually one or two.

State. A key's sessions are in columnar keyed states ``_batch_session#0``, ``#1``, ... (its
first session in ``#0``, the next in ``#1``; a key with ``k`` sessions has state in ``k`` of
them): start, end, the accumulator and ``fired``. Being keyed state, they are snapshotted per
key group and restored (at any parallelism) with the rest. The watermark starts over after a
restore: a session that fired before it and takes a late row fires again when the watermark
passes it; one that takes none keeps its ``fired`` marker and is not emitted twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from chandy.core.output_tag import OutputTag
from chandy.core.time import MAX_WATERMARK
from chandy.errors import BatchTypeError, BatchValueError
from chandy.state.arrow_keys import KEY_GROUP_COLUMN
from chandy.state.columnar import ColumnarKeyedState, ColumnarKeyedStateBackend
from chandy.task.operators.batch import (
    _ACC,
    _COUNT,
    _OPS,
    _Aggregated,
    _columnar_backend,
    _group,
    _rows,
)
from chandy.task.operators.batch_window import (
    WINDOW_END,
    WINDOW_START,
    BuiltinWindowAggregation,
    KeyedBatchWindowOperator,
    UserWindowAggregation,
    _index,
)
from chandy.task.operators.timestamps import batch_timestamps
from chandy.util.memory import keep_freed_heap

#: The name of the state holding every key's ``k``-th session is this prefix and ``k``.
SESSION_STATE_PREFIX = "_batch_session#"
_START, _END, _FIRED = "start", "end", "fired"
#: A session's own state columns, beside its accumulator's (a user aggregate's columns must
#: not take these names).
SESSION_COLUMNS = (_START, _END, _COUNT, _FIRED)

#: Combines the accumulators of merging sessions: the accumulator columns of sessions sorted
#: by (key, start), the index of each merged session's first, and each one's merged session.
Accumulator = dict[str, np.ndarray]
Combine = Callable[[Accumulator, np.ndarray, np.ndarray], Accumulator]


class _Sessions:
    """Sessions as parallel arrays: the key's group number in the batch (or its slot), start,
    end, accumulator columns (none for ``count()``), count of values, and whether it has fired."""

    def __init__(
        self,
        key: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        acc: dict[str, np.ndarray],
        count: np.ndarray,
        fired: np.ndarray,
    ) -> None:
        self.key, self.start, self.end, self.acc, self.count, self.fired = key, start, end, acc, count, fired

    def take(self, rows: np.ndarray) -> _Sessions:
        return _Sessions(
            self.key[rows],
            self.start[rows],
            self.end[rows],
            {name: values[rows] for name, values in self.acc.items()},
            self.count[rows],
            self.fired[rows],
        )

    @staticmethod
    def concat(parts: list[_Sessions]) -> _Sessions:
        return _Sessions(
            np.concatenate([p.key for p in parts]),
            np.concatenate([p.start for p in parts]),
            np.concatenate([p.end for p in parts]),
            {name: np.concatenate([p.acc[name] for p in parts]) for name in parts[0].acc},
            np.concatenate([p.count for p in parts]),
            np.concatenate([p.fired for p in parts]),
        )


def _composite(key: np.ndarray, ts: np.ndarray, low: int, span: int) -> np.ndarray:
    """(key, time) as one sortable int64: ``key * span + ts - low`` (``span`` exceeds every
    ``ts - low``; keys are a batch's group numbers)."""
    if len(key) and (int(key.max()) + 1) * span >= 2**63:
        raise BatchValueError(
            f"session windows: one batch's event times and pending sessions span {span} ms over "
            f"{int(key.max()) + 1} keys, too wide to sort as one int64; send smaller batches "
            "(chandy.network.arrow-batch-size) or event times closer together"
        )
    combined: np.ndarray = key.astype(np.int64) * span + (ts - low)
    return combined


def joined_rows(
    key: np.ndarray, ts: np.ndarray, gap: int, late_before: int, pending: _Sessions
) -> np.ndarray:
    """Which rows join a session, as the record path decides it one row at a time: a row whose
    window ends after ``late_before`` always; another only when its window touches a pending
    session of its key or the window of an earlier row that joined (``pending`` are disjoint)."""
    own_late = ts + gap - 1 <= late_before
    joined = ~own_late
    late = np.flatnonzero(own_late)
    if not len(late):
        return joined
    lk, lt = key[late], ts[late]
    if len(pending.key):
        order = np.lexsort((pending.start, pending.key))
        sk, ss, se = pending.key[order], pending.start[order], pending.end[order]
        low = min(int(ss.min()), int(ts.min())) - gap
        span = max(int(se.max()), int(ts.max()) + gap) - low + 1
        # The last session of the key starting at or before the row's window ends touches it
        # if it ends at or after the row (sessions of a key are disjoint).
        last = (
            np.searchsorted(_composite(sk, ss, low, span), _composite(lk, lt + gap, low, span), "right") - 1
        )
        at = np.maximum(last, 0)
        touches = (last >= 0) & (sk[at] == lk) & (se[at] >= lt)
        joined[late[touches]] = True
    low = int(ts.min()) - gap
    span = int(ts.max()) + 2 * gap - low + 1
    n = len(ts)
    while True:  # rounds: rows saved by rows saved in the round before
        waiting = late[~joined[late]]
        if not len(waiting):
            return joined
        rows = np.flatnonzero(joined)
        combined = _composite(key[rows], ts[rows], low, span)
        order = np.argsort(combined, kind="stable")
        combined, rows = combined[order], rows[order]
        wk, wt = key[waiting], ts[waiting]
        lo = np.searchsorted(combined, _composite(wk, wt - gap, low, span), "left")
        hi = np.searchsorted(combined, _composite(wk, wt + gap, low, span), "right")
        earliest = np.full(len(waiting), n, dtype=np.int64)
        some = hi > lo
        if some.any():
            bounds = np.column_stack((lo[some], hi[some])).ravel()
            earliest[some] = np.minimum.reduceat(np.append(rows, n), bounds)[::2]
        saved = waiting[earliest < waiting]
        if not len(saved):
            return joined
        joined[saved] = True


def merge_sessions(
    sessions: _Sessions, touched: np.ndarray, combine: Combine
) -> tuple[_Sessions, np.ndarray]:
    """Merge the sessions of each key that overlap or touch (their accumulators by
    ``combine``); returns the merged sessions (by key, then start) and which of them hold a
    ``touched`` one (a row of the batch)."""
    order = np.lexsort((sessions.start, sessions.key))
    s = sessions.take(order)
    touched = touched[order]
    low = int(s.start.min())
    span = int(s.end.max()) - low + 1
    running_end = np.maximum.accumulate(_composite(s.key, s.end, low, span))
    first = np.ones(len(s.key), dtype=bool)
    first[1:] = _composite(s.key[1:], s.start[1:], low, span) > running_end[:-1]
    bounds = np.flatnonzero(first)
    merged = _Sessions(
        s.key[bounds],
        s.start[bounds],
        np.maximum.reduceat(s.end, bounds),
        combine(s.acc, bounds, np.cumsum(first) - 1) if s.acc else {},
        np.add.reduceat(s.count, bounds),
        np.logical_and.reduceat(s.fired, bounds),  # a session no row touched: its own marker
    )
    return merged, np.logical_or.reduceat(touched, bounds)


def builtin_combine(op: np.ufunc) -> Combine:
    """``sum / count / min / max / mean``: the accumulator's one column reduced with ``op``."""

    def combine(acc: Accumulator, bounds: np.ndarray, group_ids: np.ndarray) -> Accumulator:
        return {name: op.reduceat(values, bounds) for name, values in acc.items()}

    return combine


def user_combine(aggregation: UserWindowAggregation) -> Combine:
    """``aggregate(fn, ...)``: ``fn.merge``, its answer checked (every column, one value a session)."""

    def combine(acc: Accumulator, bounds: np.ndarray, group_ids: np.ndarray) -> Accumulator:
        groups = len(bounds)
        merged = aggregation.function.merge(acc, group_ids, groups)
        names = aggregation.accumulator_schema.names
        if not isinstance(merged, dict) or set(names) - set(merged):
            raise BatchTypeError(
                f"{aggregation.call_text}: merge() must return a dict with every accumulator column {names}"
            )
        out = {name: np.asarray(merged[name]) for name in names}
        wrong = {name: len(values) for name, values in out.items() if values.shape != (groups,)}
        if wrong:
            raise BatchValueError(
                f"{aggregation.call_text}: merge() returned {wrong} values for {groups} groups; return "
                "one value per group in every column"
            )
        return out

    return combine


class BatchSessionWindowOperator(KeyedBatchWindowOperator):
    """Event-time session windows over keyed record batches (see the module)."""

    def __init__(
        self,
        gap: int,
        aggregation: BuiltinWindowAggregation | UserWindowAggregation,
        key_column: str,
        timestamp_column: str,
        allowed_lateness: int = 0,
        late_data_output_tag: OutputTag | None = None,
    ) -> None:
        super().__init__(aggregation, key_column, timestamp_column, allowed_lateness, late_data_output_tag)
        self.gap = gap
        self.aggregation: BuiltinWindowAggregation | UserWindowAggregation = aggregation
        self._combine: Combine = (
            user_combine(aggregation)
            if isinstance(aggregation, UserWindowAggregation)
            else builtin_combine(_OPS.get(aggregation.function, np.add))
        )
        #: The accumulator's columns in the session states (``acc`` for the built-ins, none
        #: for ``count()``, the accumulator schema's for a user aggregate).
        self._acc_names: list[str] = []
        #: The session states, ``k``-th sessions in ``_states[k]``.
        self._states: list[ColumnarKeyedState] = []
        self._schema: pa.Schema | None = None
        self._defaults: dict[str, Any] = {}
        self._backend: ColumnarKeyedStateBackend | None = None

    def open(self) -> None:
        keep_freed_heap()
        self._open_aggregation()
        backend = self._backend = _columnar_backend(self)
        restored = sorted(
            int(name[len(SESSION_STATE_PREFIX) :])
            for name in backend.states
            if name.startswith(SESSION_STATE_PREFIX)
        )
        for k in restored:
            schema = backend.states[f"{SESSION_STATE_PREFIX}{k}"].schema
            if self._schema is None:
                self._adopt(schema)
        for k in range(max(restored, default=-1) + 1):
            self._state(k)

    def _adopt(self, schema: pa.Schema) -> None:
        self._schema = schema
        self._defaults = {**self.aggregation.adopt(schema), _START: 0, _END: 0, _FIRED: False}
        self._acc_names = [name for name in schema.names if name not in SESSION_COLUMNS]

    def _state(self, k: int) -> ColumnarKeyedState:
        while len(self._states) <= k:
            assert self._backend is not None and self._schema is not None
            name = f"{SESSION_STATE_PREFIX}{len(self._states)}"
            self._states.append(self._backend.get_columnar_state(name, self._schema, self._defaults))
        return self._states[k]

    # ------------------------------------------------------------------ rows

    def process_batch(self, records: Any) -> None:
        if _rows(self, records) == 0:
            return
        batch: pa.RecordBatch = records
        ts = batch_timestamps(batch, self.timestamp_column, self.name)
        prepared = self.aggregation.prepare(batch)
        if self._schema is None:
            fields, _ = self.aggregation.schema(prepared)
            if isinstance(self.aggregation, UserWindowAggregation):
                fields = [*fields, pa.field(_COUNT, pa.int64())]
            schema = pa.schema(
                [
                    pa.field(_START, pa.int64()),
                    pa.field(_END, pa.int64()),
                    *fields,
                    pa.field(_FIRED, pa.bool_()),
                ]
            )
            self._adopt(schema)
        keyed = batch.select([_index(batch, self.key_column, self.name), _index(batch, KEY_GROUP_COLUMN)])
        first = self._state(0)
        grouped = _group(keyed, self.key_column, first, sort=False)
        key = grouped.ids
        if grouped.labels is not None:  # labels -> group numbers
            numbers = np.zeros(grouped.bound, dtype=np.int64)
            numbers[grouped.labels] = np.arange(len(grouped.labels))
            key = numbers[key]
        key = key.astype(np.int64)
        groups = len(grouped.slots)
        key_groups = first.key_groups_of_slots(grouped.slots)
        # The pending sessions of the batch's keys, and each key's slot in every state.
        slots = [grouped.slots]
        present = [~first.is_new(grouped.slots)]
        for state in self._states[1:]:
            found = state.slots_of(grouped.keys, key_groups, distinct=True)
            slots.append(found)
            present.append(~state.is_new(found))
        pending = _Sessions.concat(
            [
                self._read(state, np.flatnonzero(p), s)
                for state, p, s in zip(self._states, present, slots, strict=True)
            ]
        )
        watermark = self.current_watermark
        joined = joined_rows(key, ts, self.gap, watermark - self.allowed_lateness, pending)
        if not joined.all():
            self._emit_late(batch, ~joined)
        rows = np.flatnonzero(joined)
        acc, counts = self._row_accumulators(prepared, rows)
        added = _Sessions(
            key[rows],
            ts[rows],
            ts[rows] + self.gap,
            acc,
            counts,
            np.zeros(len(rows), dtype=bool),
        )
        both = _Sessions.concat([pending, added])
        touched = np.concatenate([np.zeros(len(pending.key), dtype=bool), np.ones(len(rows), dtype=bool)])
        if len(both.key):
            merged, touched = merge_sessions(both, touched, self._combine)
            due = touched & (merged.end - 1 <= watermark)
            merged.fired = np.where(touched, due, merged.fired)
        else:
            merged, due = both, touched
        self._write(merged, groups, slots, key_groups, grouped.keys)
        if due.any():
            emitted = merged.take(np.flatnonzero(due))
            self._emit(grouped.keys.take(pa.array(emitted.key)), emitted)

    def _row_accumulators(self, prepared: Any, rows: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Each joined row as a session of its own: its accumulator and its count of values. A
        user aggregate's come from ``create_accumulator`` and one ``add`` with a group per row."""
        if isinstance(self.aggregation, UserWindowAggregation):
            state = self._state(0)
            n = len(rows)
            acc = {}
            for name in self._acc_names:
                default = state.defaults_of(name, n)
                acc[name] = default if isinstance(default, np.ndarray) else np.full(n, default)
            updated = self.aggregation.added(
                acc, self.aggregation.take(prepared, rows), np.arange(n, dtype=np.int64)
            )
            return {name: np.asarray(updated[name]) for name in acc}, np.ones(n, dtype=np.int64)
        aggregated: _Aggregated = prepared
        values, valid = aggregated.values, aggregated.valid
        counts = np.ones(len(rows), dtype=np.int64) if valid is None else valid[rows].astype(np.int64)
        return ({} if values is None else {_ACC: values[rows]}), counts

    def _read(self, state: ColumnarKeyedState, groups: np.ndarray, slots: np.ndarray) -> _Sessions:
        at = slots[groups]
        return _Sessions(
            groups,
            state.column(_START)[at],
            state.column(_END)[at],
            {name: state.column(name)[at] for name in self._acc_names},
            state.column(_COUNT)[at],
            state.column(_FIRED)[at],
        )

    def _write(
        self,
        merged: _Sessions,
        groups: int,
        slots: list[np.ndarray],
        key_groups: np.ndarray,
        keys: pa.Array,
    ) -> None:
        """Store every key's merged sessions (by start) in states ``#0``, ``#1``, ...; drop the
        keys from the states where they have no session any more."""
        per_key = np.bincount(merged.key, minlength=groups)
        offsets = np.cumsum(per_key) - per_key
        rank = np.arange(len(merged.key)) - offsets[merged.key]
        most = int(per_key.max()) if groups else 0
        for k in range(max(most, len(self._states))):
            state = self._state(k)
            if k < len(slots):
                at = slots[k]
            else:
                at = state.slots_of(keys, key_groups, distinct=True)
                slots.append(at)
            mine = np.flatnonzero(rank == k)
            owners = merged.key[mine]
            target = at[owners]
            state.column(_START)[target] = merged.start[mine]
            state.column(_END)[target] = merged.end[mine]
            for name, values in merged.acc.items():
                state.column(name)[target] = values[mine]
            state.column(_COUNT)[target] = merged.count[mine]
            state.column(_FIRED)[target] = merged.fired[mine]
            without = np.ones(groups, dtype=bool)
            without[owners] = False
            if without.any():
                state.remove(at[without])

    # ------------------------------------------------------------------ firing

    def _emit(self, keys: pa.Array, sessions: _Sessions) -> None:
        """One row per session: key, session bounds, aggregate (a user aggregate's columns)."""
        aggregation = self.aggregation
        results: list[tuple[str, pa.Array]]
        if isinstance(aggregation, UserWindowAggregation):
            results = aggregation.results_of(sessions.acc, len(sessions.key))
        else:
            acc = sessions.count if aggregation.function == "count" else sessions.acc[_ACC]
            assert aggregation.output_name is not None
            results = [(aggregation.output_name, aggregation.result_column(acc, sessions.count))]
        names = [self._key_name, WINDOW_START, WINDOW_END, *(name for name, _ in results)]
        if len(set(names)) < len(names):
            raise BatchValueError(
                f"{self.name}: the output would repeat a column name ({names}); rename the key column"
            )
        arrays = [keys, pa.array(sessions.start), pa.array(sessions.end), *(values for _, values in results)]
        self.output(pa.RecordBatch.from_arrays(arrays, names=names))

    def process_watermark(self, timestamp: int) -> None:
        """Fire every session the watermark completes (in the order of their ends), drop those
        past their allowed lateness, then forward the watermark."""
        self.current_watermark = timestamp
        firing: list[tuple[pa.Array, _Sessions]] = []
        for state in self._states:
            live = state.live_slots()
            if not len(live):
                continue
            end = state.column(_END)[live]
            fired = state.column(_FIRED)
            due = live[(end - 1 <= timestamp) & ~fired[live]]
            if len(due):
                fired[due] = True
                firing.append((state.key_array(due), self._read(state, np.arange(len(due)), due)))
            gone = live[np.minimum(end - 1 + self.allowed_lateness, MAX_WATERMARK) <= timestamp]
            if len(gone):
                state.remove(gone)
        if firing:
            keys = pa.concat_arrays([k for k, _ in firing])
            sessions = _Sessions.concat([s for _, s in firing])
            order = np.argsort(sessions.end, kind="stable")
            self._emit(keys.take(pa.array(order)), sessions.take(order))
        self.emit_watermark(timestamp)
