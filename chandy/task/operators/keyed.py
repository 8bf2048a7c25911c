"""Operators on a keyed stream: records arrive as a :class:`KeyedBatch`.

Before each record reaches user code the operator points the keyed state
backend at the record's key (two attribute writes), so ``state.value()`` inside
the function reads that key's value.
"""

from __future__ import annotations

import copy
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


class SumFunction:
    """The fold behind ``KeyedStream.sum(position)``: adds one field, keeps the others
    from the first record (Flink's semantics). Plain numbers are added directly."""

    def __init__(self, position: int | str) -> None:
        self.position = position

    def __call__(self, acc: Any, value: Any) -> Any:
        position = self.position
        if isinstance(acc, (int, float, complex)) and not isinstance(acc, bool):
            return acc + value
        if isinstance(acc, tuple):
            if not isinstance(position, int):
                raise TypeError(f"sum({position!r}): a tuple field is chosen by an int position")
            summed = acc[position] + value[position]
            if hasattr(acc, "_replace") and hasattr(acc, "_fields"):  # named tuple
                return acc._replace(**{acc._fields[position]: summed})
            return (*acc[:position], summed, *acc[position + 1 :])
        if isinstance(acc, list):
            if not isinstance(position, int):
                raise TypeError(f"sum({position!r}): a list field is chosen by an int position")
            items = list(acc)
            items[position] = acc[position] + value[position]
            return items
        if isinstance(acc, Row):  # PyFlink's rows: by position or field name, a new row
            row = copy.copy(acc)
            row[position] = acc[position] + value[position]
            return row
        if isinstance(acc, dict):
            fields = dict(acc)
            fields[position] = acc[position] + value[position]
            return fields
        if isinstance(position, str) and hasattr(acc, position):
            result = copy.copy(acc)
            setattr(result, position, getattr(acc, position) + getattr(value, position))
            return result
        raise TypeError(
            f"sum({position!r}) cannot add records of type {type(acc).__name__}: "
            "use a number, a tuple/list with an int position, a dict with a key, "
            "or an object with an attribute name"
        )
