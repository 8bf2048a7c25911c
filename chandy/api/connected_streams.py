"""ConnectedStreams: two streams, possibly of different types, processed by one operator
(PyFlink's ``ConnectedStreams``, from ``ds1.connect(ds2)``).

The operator is a two-input operator with one function instance for both inputs, so the two
may share state: typically rules or reference data arrive on one input and are applied to
the records of the other. Connecting two keyed streams (or calling ``key_by(k1, k2)``) makes
the operator keyed: the records of both inputs are partitioned by their key, the same key
meets on the same subtask, and keyed state and timers are shared by both inputs.

As in PyFlink, ``map`` and ``flat_map`` run on the process operators through adapters, so on
keyed inputs a ``CoMapFunction`` may use keyed state; the operator names are PyFlink's
("Co-Map", "Co-Flat Map", "Co-Process", "Keyed Co-Process").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from chandy.api.datastream import DataStream, KeyedStream, refuse_timers_without_key
from chandy.core.functions import (
    CoFlatMapFunction,
    CoMapFunction,
    CoProcessFunction,
    KeyedCoProcessFunction,
    KeySelector,
)
from chandy.errors import InvalidProgramError
from chandy.task.operators.co_process import CoProcessOperator, KeyedCoProcessOperator


class ConnectedStreams:
    """Two connected streams: ``stream1`` feeds the first input (``map1``,
    ``process_element1``, ...), ``stream2`` the second."""

    def __init__(self, stream1: DataStream, stream2: DataStream) -> None:
        for stream in (stream1, stream2):
            if not isinstance(stream, DataStream):
                raise InvalidProgramError(
                    f"connect() takes a DataStream (or a BroadcastStream), got {type(stream).__name__}"
                )
        if stream1._env is not stream2._env:
            raise InvalidProgramError(
                "connect() of streams from different environments: build both streams "
                "from the same StreamExecutionEnvironment"
            )
        self.stream1 = stream1
        self.stream2 = stream2

    def key_by(
        self,
        key_selector1: KeySelector | Callable[[Any], Any],
        key_selector2: KeySelector | Callable[[Any], Any],
        key_type: Any = None,
    ) -> ConnectedStreams:
        """Partition both inputs by key (``key_selector1`` on the first, ``key_selector2`` on
        the second): records with equal keys meet on the same subtask and share keyed state
        and timers there. Keyed inputs are keyed anew."""
        return ConnectedStreams(
            self.stream1.key_by(key_selector1, key_type), self.stream2.key_by(key_selector2, key_type)
        )

    def map(self, func: CoMapFunction, output_type: Any = None) -> DataStream:
        """``func.map1`` for each record of the first input, ``func.map2`` for each of the
        second; each result is one output (``None``: none, as in PyFlink)."""
        if not isinstance(func, CoMapFunction):
            raise InvalidProgramError(
                f"ConnectedStreams.map() takes a CoMapFunction (map1/map2), got {type(func).__name__}"
            )
        return self._transform("Co-Map", func, output_type)

    def flat_map(self, func: CoFlatMapFunction, output_type: Any = None) -> DataStream:
        """``func.flat_map1`` / ``func.flat_map2`` yield any number of outputs per record of the
        first / second input."""
        if not isinstance(func, CoFlatMapFunction):
            raise InvalidProgramError(
                "ConnectedStreams.flat_map() takes a CoFlatMapFunction (flat_map1/flat_map2), "
                f"got {type(func).__name__}"
            )
        return self._transform("Co-Flat Map", func, output_type)

    def process(
        self, func: CoProcessFunction | KeyedCoProcessFunction, output_type: Any = None
    ) -> DataStream:
        """Apply a ``CoProcessFunction``, or on two keyed inputs a ``KeyedCoProcessFunction``
        (keyed state and timers shared by both inputs, ``on_timer``)."""
        if not isinstance(func, (CoProcessFunction, KeyedCoProcessFunction)):
            raise InvalidProgramError(
                "ConnectedStreams.process() takes a CoProcessFunction or a KeyedCoProcessFunction, "
                f"got {type(func).__name__}"
            )
        if isinstance(func, KeyedCoProcessFunction) and not self._is_keyed_stream():
            raise InvalidProgramError(
                "A KeyedCoProcessFunction can only be used when both connected streams are keyed: "
                "connect two KeyedStreams, or call key_by(key_selector1, key_selector2) on the "
                "ConnectedStreams first"
            )
        if not self._is_keyed_stream():
            refuse_timers_without_key(func, "ConnectedStreams.process()", "KeyedCoProcessFunction")
        return self._transform(
            "Keyed Co-Process" if self._is_keyed_stream() else "Co-Process", func, output_type
        )

    def _is_keyed_stream(self) -> bool:
        return isinstance(self.stream1, KeyedStream) and isinstance(self.stream2, KeyedStream)

    def _transform(self, name: str, func: Any, output_type: Any) -> DataStream:
        keyed = self._is_keyed_stream()
        operator = KeyedCoProcessOperator if keyed else CoProcessOperator
        node = self.stream1._add_two_input_operator(
            self.stream2._inputs,
            name,
            functools.partial(operator, func),
            keyed=keyed,
            output_type=output_type,
        )
        return DataStream._of(self.stream1._env, node)
