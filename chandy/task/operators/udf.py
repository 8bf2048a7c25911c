"""Stateless per-record operators: map, flat_map, filter."""

from __future__ import annotations

from typing import Any

from chandy.task.operators.base import UdfOperator, resolve_call


class StreamMap(UdfOperator):
    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "map")

    def process_batch(self, records: list[Any]) -> None:
        call = self._call
        self.output([call(r) for r in records])


class StreamFlatMap(UdfOperator):
    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "flat_map")

    def process_batch(self, records: list[Any]) -> None:
        call = self._call
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
        out = [r for r in records if call(r)]
        if out:
            self.output(out)
