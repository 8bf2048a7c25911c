"""Stateless per-record operators: map, flat_map, filter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chandy.task.batches import TimestampedBatch
from chandy.task.operators.base import UdfOperator, resolve_call


class StreamMap(UdfOperator):
    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "map")

    def process_batch(self, records: list[Any]) -> None:
        call = self._call
        if type(records) is list:
            self.output([call(r) for r in records])
        else:  # each output keeps its input's timestamp
            timed: TimestampedBatch = records  # type: ignore[assignment]
            self.output(TimestampedBatch([call(r) for r in timed.values], timed.timestamps))


class StreamFlatMap(UdfOperator):
    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "flat_map")

    def process_batch(self, records: list[Any]) -> None:
        call = self._call
        if type(records) is not list:
            produced = flat_map_timestamped(call, records.values, records.timestamps)  # type: ignore[attr-defined]
            if produced:
                self.output(produced)
            return
        out: list[Any] = []
        extend = out.extend
        for r in records:
            produced = call(r)
            if produced is not None:
                extend(produced)
        if out:
            self.output(out)


class StreamFilter(UdfOperator):
    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "filter")

    def process_batch(self, records: list[Any]) -> None:
        call = self._call
        if type(records) is not list:
            kept = filter_timestamped(call, records.values, records.timestamps)  # type: ignore[attr-defined]
            if kept:
                self.output(kept)
            return
        out = [r for r in records if call(r)]
        if out:
            self.output(out)


def flat_map_timestamped(
    call: Callable[[Any], Any], values: list[Any], timestamps: list[int | None]
) -> TimestampedBatch:
    """``flat_map`` over a timestamped batch: every output keeps its input's timestamp."""
    out: list[Any] = []
    out_ts: list[int | None] = []
    extend, extend_ts = out.extend, out_ts.extend
    for r, t in zip(values, timestamps, strict=True):
        produced = call(r)
        if produced is not None:
            before = len(out)
            extend(produced)
            extend_ts([t] * (len(out) - before))
    return TimestampedBatch(out, out_ts)


def filter_timestamped(
    call: Callable[[Any], Any], values: list[Any], timestamps: list[int | None]
) -> TimestampedBatch:
    """``filter`` over a timestamped batch."""
    out: list[Any] = []
    out_ts: list[int | None] = []
    for r, t in zip(values, timestamps, strict=True):
        if call(r):
            out.append(r)
            out_ts.append(t)
    return TimestampedBatch(out, out_ts)
