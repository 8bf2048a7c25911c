"""Operators on a keyed stream: records arrive as a :class:`KeyedBatch`.

Before each record reaches user code the operator points the keyed state
backend at the record's key (two attribute writes), so ``state.value()`` inside
the function reads that key's value.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, cast

from chandy.core.types import Row
from chandy.state.heap import HeapKeyedStateBackend
from chandy.task.batches import KeyedBatch, TimestampedBatch
from chandy.task.operators.base import UdfOperator, resolve_call


class KeyedOperator(UdfOperator):
    keyed = True

    @property
    def backend(self) -> HeapKeyedStateBackend:
        assert self.runtime_context is not None
        backend = self.runtime_context.keyed_state_backend
        assert isinstance(backend, HeapKeyedStateBackend)
        return backend


class KeyedMap(KeyedOperator):
    """``KeyedStream.map``: a map whose function may use keyed state."""

    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "map")

    def process_batch(self, records: KeyedBatch) -> None:  # type: ignore[override]
        backend = self.backend
        call = self._call
        out: list[Any] = []
        append = out.append
        for kg, key, value in zip(records.key_groups, records.keys, records.values, strict=True):
            backend.current_key = key
            backend.current_index = kg
            append(call(value))
        timestamps = records.timestamps
        self.output(out if timestamps is None else TimestampedBatch(out, timestamps))


class KeyedFlatMap(KeyedOperator):
    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "flat_map")

    def process_batch(self, records: KeyedBatch) -> None:  # type: ignore[override]
        backend = self.backend
        call = self._call
        if records.timestamps is not None:
            self._process_timestamped(records)
            return
        out: list[Any] = []
        extend = out.extend
        for kg, key, value in zip(records.key_groups, records.keys, records.values, strict=True):
            backend.current_key = key
            backend.current_index = kg
            produced = call(value)
            if produced is not None:
                extend(produced)
        if out:
            self.output(out)

    def _process_timestamped(self, records: KeyedBatch) -> None:
        backend = self.backend
        call = self._call
        out: list[Any] = []
        out_ts: list[int | None] = []
        assert records.timestamps is not None
        for kg, key, value, t in zip(
            records.key_groups, records.keys, records.values, records.timestamps, strict=True
        ):
            backend.current_key = key
            backend.current_index = kg
            produced = call(value)
            if produced is not None:
                before = len(out)
                out.extend(produced)
                out_ts.extend([t] * (len(out) - before))
        if out:
            self.output(TimestampedBatch(out, out_ts))


class KeyedFilter(KeyedOperator):
    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "filter")

    def process_batch(self, records: KeyedBatch) -> None:  # type: ignore[override]
        backend = self.backend
        call = self._call
        out: list[Any] = []
        append = out.append
        timestamps = records.timestamps
        if timestamps is not None:
            kept_ts: list[int | None] = []
            for kg, key, value, t in zip(
                records.key_groups, records.keys, records.values, timestamps, strict=True
            ):
                backend.current_key = key
                backend.current_index = kg
                if call(value):
                    append(value)
                    kept_ts.append(t)
            if out:
                self.output(TimestampedBatch(out, kept_ts))
            return
        for kg, key, value in zip(records.key_groups, records.keys, records.values, strict=True):
            backend.current_key = key
            backend.current_index = kg
            if call(value):
                append(value)
        if out:
            self.output(out)


class StreamGroupedReduce(KeyedOperator):
    """``KeyedStream.reduce``: a running fold per key, emitting every new value.

    Keeps its value in a keyed value state named ``_reduce`` (so it is
    checkpointed and rescaled like any keyed state) but touches the state table
    directly in its loop: no handle call per record.
    """

    STATE_NAME = "_reduce"

    def open(self) -> None:
        super().open()
        from chandy.core.state import ValueStateDescriptor

        self.backend.get_partitioned_state(ValueStateDescriptor(self.STATE_NAME))
        self._table = self.backend.tables[self.STATE_NAME]
        # Indexed only by the key groups of this subtask's records, which are in range: never None.
        self._maps = cast("list[dict[Any, Any]]", self._table.maps)
        self._call: Callable[[Any, Any], Any] = resolve_call(self.user_function, "reduce")

    def process_batch(self, records: KeyedBatch) -> None:  # type: ignore[override]
        maps = self._maps
        call = self._call
        out: list[Any] = []
        append = out.append
        table = self._table
        if table.cow is None:
            for kg, key, value in zip(records.key_groups, records.keys, records.values, strict=True):
                m = maps[kg]
                old = m.get(key)
                new = value if old is None else call(old, value)
                m[key] = new
                append(new)
        else:  # a snapshot is being written: the fold must not change what it shares
            privatize = table.privatize
            for kg, key, value in zip(records.key_groups, records.keys, records.values, strict=True):
                m = maps[kg]
                old = privatize(m, key)
                new = value if old is None else call(old, value)
                m[key] = new
                append(new)
        timestamps = records.timestamps
        self.output(out if timestamps is None else TimestampedBatch(out, timestamps))


class FieldAggregation(ABC):
    """The folds behind ``KeyedStream.sum/min/max/min_by/max_by(position)``: they read one
    field of a record (tuple or list index, named tuple or ``Row`` position or name, dict
    key, attribute name) and build new records rather than changing the one they got, which may also have
    gone elsewhere (Flink's object-reuse contract). A record of a basic type (a number, a
    string, ...) is its own field 0, as in PyFlink; any other position on it is an error."""

    operation = "?"

    def __init__(self, position: int | str) -> None:
        if isinstance(position, bool) or not isinstance(position, (int, str)):
            raise TypeError(
                f"{self.operation}() takes a field position (int) or name (str), got {position!r}"
            )
        self.position = position

    def _error(self, record: Any, why: str) -> TypeError:
        return TypeError(
            f"{self.operation}({self.position!r}) on a record of type {type(record).__name__}: {why}. "
            "Use a tuple/list with an int position, a Row or dict with a position or name, an object "
            "with an attribute name, or a plain value with position 0"
        )

    def field(self, record: Any) -> Any:
        """The aggregated field of ``record``."""
        position = self.position
        if isinstance(record, (tuple, list)):
            if isinstance(position, int):
                return record[position]
            if position in getattr(record, "_fields", ()):  # a named tuple's field by name
                return getattr(record, position)
            raise self._error(record, "a tuple or list field is chosen by an int position")
        if isinstance(record, (Row, dict)):
            return record[position]
        if isinstance(position, str) and hasattr(record, position):
            return getattr(record, position)
        if position == 0:
            return record
        if isinstance(position, str):
            raise self._error(record, f"it has no attribute {position!r}")
        raise self._error(record, "a plain value has only field 0 (itself)")

    def replaced(self, record: Any, value: Any) -> Any:
        """A copy of ``record`` whose aggregated field is ``value``."""
        position = self.position
        if isinstance(record, tuple):
            if hasattr(record, "_replace") and hasattr(record, "_fields"):  # named tuple
                name = position if isinstance(position, str) else record._fields[position]
                return record._replace(**{name: value})
            assert isinstance(position, int)  # field() checked it
            if position < 0:  # counted from the end, as field() reads it
                position += len(record)
            return (*record[:position], value, *record[position + 1 :])
        if isinstance(record, (list, dict)):
            fields = copy.copy(record)
            fields[position] = value  # type: ignore[index]
            return fields
        if isinstance(record, Row):  # PyFlink's rows: by position or field name, a new row
            row = copy.copy(record)
            row[position] = value
            return row
        if isinstance(position, str) and hasattr(record, position):
            result = copy.copy(record)
            setattr(result, position, value)
            return result
        return value  # a plain value is its own field

    @abstractmethod
    def __call__(self, acc: Any, value: Any) -> Any:
        """The key's new aggregate from its aggregate so far and the next record."""


class SumFunction(FieldAggregation):
    """``sum(position)``: adds the field, keeps the other fields from the first record
    (Flink's semantics). Plain numbers are added directly."""

    operation = "sum"

    def __call__(self, acc: Any, value: Any) -> Any:
        if type(acc) is int or type(acc) is float:  # the common case, without the field lookups
            if self.position != 0:
                raise self._error(acc, "a plain value has only field 0 (itself)")
            return acc + value
        return self.replaced(acc, self.field(acc) + self.field(value))


class MinFunction(FieldAggregation):
    """``min(position)``: the smallest value of the field so far; the other fields stay
    those of the key's first record (Flink's semantics: it is not the record holding the
    minimum, for that use ``min_by``)."""

    operation = "min"

    def __call__(self, acc: Any, value: Any) -> Any:
        new = self.field(value)
        return self.replaced(acc, new) if new < self.field(acc) else acc


class MaxFunction(FieldAggregation):
    """``max(position)``: :class:`MinFunction` for the largest value."""

    operation = "max"

    def __call__(self, acc: Any, value: Any) -> Any:
        new = self.field(value)
        return self.replaced(acc, new) if new > self.field(acc) else acc


class MinByFunction(FieldAggregation):
    """``min_by(position)``: the whole record with the smallest field so far; on a tie the
    first such record stays (Flink's default)."""

    operation = "min_by"

    def __call__(self, acc: Any, value: Any) -> Any:
        return value if self.field(value) < self.field(acc) else acc


class MaxByFunction(FieldAggregation):
    """``max_by(position)``: :class:`MinByFunction` for the largest field."""

    operation = "max_by"

    def __call__(self, acc: Any, value: Any) -> Any:
        return value if self.field(value) > self.field(acc) else acc
