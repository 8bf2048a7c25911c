"""Stateless per-record operators: map, flat_map, filter, process."""

from __future__ import annotations

from typing import Any

from chandy.core.functions import ProcessFunction
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


class _NoTimestampContext(ProcessFunction.Context):
    __slots__ = ()

    def timestamp(self) -> int | None:
        return None


class ProcessOperator(UdfOperator):
    """``DataStream.process(ProcessFunction)``."""

    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "process_element")
        self._context = _NoTimestampContext()

    def process_batch(self, records: list[Any]) -> None:
        call, ctx = self._call, self._context
        out: list[Any] = []
        extend = out.extend
        for r in records:
            produced = call(r, ctx)
            if produced is not None:
                extend(produced)
        if out:
            self.output(out)
