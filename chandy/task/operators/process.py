"""Process operators: ``DataStream.process(ProcessFunction)`` and
``KeyedStream.process(KeyedProcessFunction)``, with their contexts."""

from __future__ import annotations

from typing import Any

from chandy.core.functions import KeyedProcessFunction, ProcessFunction, TimerService
from chandy.errors import InvalidProgramError
from chandy.task.batches import KeyedBatch
from chandy.task.operators.base import UdfOperator, resolve_call
from chandy.task.operators.keyed import KeyedOperator


class _NoTimestampContext(ProcessFunction.Context):
    __slots__ = ()

    def timestamp(self) -> int | None:
        return None

    def timer_service(self) -> TimerService:
        raise InvalidProgramError("timers are being built; timer_service() is not available yet")


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


class _KeyedContext(KeyedProcessFunction.Context):
    __slots__ = ("_backend",)

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def timestamp(self) -> int | None:
        return None

    def get_current_key(self) -> Any:
        return self._backend.get_current_key()

    def timer_service(self) -> TimerService:
        raise InvalidProgramError("timers are being built; timer_service() is not available yet")


class KeyedProcessOperator(KeyedOperator):
    """``KeyedStream.process(KeyedProcessFunction)``."""

    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "process_element")
        self._context = _KeyedContext(self.backend)

    def process_batch(self, records: KeyedBatch) -> None:  # type: ignore[override]
        backend = self.backend
        call, ctx = self._call, self._context
        out: list[Any] = []
        extend = out.extend
        for kg, key, value in zip(records.key_groups, records.keys, records.values, strict=True):
            backend.current_key = key
            backend.current_index = kg
            produced = call(value, ctx)
            if produced is not None:
                extend(produced)
        if out:
            self.output(out)
