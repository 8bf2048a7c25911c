"""Two-input operators: ``ConnectedStreams.map/flat_map/process`` (Flink's ``CoProcessOperator``
and ``KeyedCoProcessOperator``).

They are the one-input process operators with a second element method. Everything else is
the one-input operators' own machinery, inherited rather than repeated: the contexts
(``ctx.timestamp()`` is the record's timestamp, outputs keep it), side outputs (a produced
``(OutputTag, value)``), and for the keyed operator one keyed state backend and one timer
service (``user-timers``) that both inputs share. That sharing is the point of a
``KeyedCoProcessFunction``: a price update on input 2 writes the state an order on input 1
reads, because before each record the backend is pointed at the record's key, whichever
input it came from; and a timer registered while processing either input fires
``on_timer`` with that key. Event-time timers fire on the task's watermark, which for a
two-input task is the minimum over the channels of both inputs.

``CoMapFunction`` and ``CoFlatMapFunction`` run on the same operators through adapters, as in
PyFlink (``map1`` becomes an element method that yields its result unless it is ``None``;
``flat_map1`` one that ignores the context), so on keyed inputs they may use keyed state too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from chandy.core.functions import CoFlatMapFunction, CoMapFunction
from chandy.task.operators.base import TwoInputStreamOperator
from chandy.task.operators.process import KeyedProcessOperator, ProcessOperator

#: An element method as the process operators call it: ``(value, ctx) -> outputs``.
ElementCall = Callable[[Any, Any], Iterable[Any] | None]


def _map_call(map_fn: Callable[[Any], Any]) -> ElementCall:
    def call(value: Any, ctx: Any) -> Iterable[Any] | None:
        result = map_fn(value)
        return None if result is None else (result,)

    return call


def _flat_map_call(flat_map_fn: Callable[[Any], Iterable[Any] | None]) -> ElementCall:
    def call(value: Any, ctx: Any) -> Iterable[Any] | None:
        return flat_map_fn(value)

    return call


def co_element_calls(function: Any) -> tuple[ElementCall, ElementCall]:
    """The element methods of a two-input function, for input 1 and input 2."""
    if isinstance(function, CoMapFunction):
        return _map_call(function.map1), _map_call(function.map2)
    if isinstance(function, CoFlatMapFunction):
        return _flat_map_call(function.flat_map1), _flat_map_call(function.flat_map2)
    return function.process_element1, function.process_element2


class _TwoElementMethods(TwoInputStreamOperator):
    """What a process operator needs to take two inputs: an element method per input, the
    batch of each input through the one-input operator's ``_process`` with that method."""

    user_function: Any
    _process: Callable[[ElementCall, Any], None]

    def _resolve_calls(self) -> None:
        self._call1, self._call2 = co_element_calls(self.user_function)

    def process_batch1(self, records: Any) -> None:
        self._process(self._call1, records)

    def process_batch2(self, records: Any) -> None:
        self._process(self._call2, records)


class CoProcessOperator(_TwoElementMethods, ProcessOperator):
    """``connect(...).process(CoProcessFunction)`` (and ``map``/``flat_map``) on inputs that are
    not both keyed: the context answers time queries and refuses timers (they need a key)."""


# (mypy: the one-input process_batch of KeyedProcessOperator is refused by TwoInputStreamOperator's)
class KeyedCoProcessOperator(_TwoElementMethods, KeyedProcessOperator):  # type: ignore[misc]
    """``connect(...).process(KeyedCoProcessFunction)`` on two keyed inputs: records of both
    arrive as :class:`~chandy.task.batches.KeyedBatch` columns and share the keyed state and
    timers of their key; this operator is the triggerable of those timers (``on_timer``)."""
