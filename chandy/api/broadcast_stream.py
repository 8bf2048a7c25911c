"""BroadcastStream and BroadcastConnectedStream: a stream with broadcast state, connected to
another (PyFlink's, from ``stream.connect(rules.broadcast(descriptor, ...))``).

``broadcast(descriptor, ...)`` sends every record of the rules stream to every subtask of
the next operator and declares the broadcast states (one map per ``MapStateDescriptor``)
that operator keeps. ``connect`` then joins it with the element stream, keyed or not, and
``process`` applies a ``BroadcastProcessFunction`` or ``KeyedBroadcastProcessFunction``:
input 1 of a two-input operator is the element stream (partitioned as it is: keyed
streams keep their key groups), input 2 the broadcast one. ``docs/broadcast-state.md``
explains the design.
"""

from __future__ import annotations

import functools
from typing import Any

from chandy.api.datastream import DataStream, KeyedStream, refuse_timers_without_key
from chandy.core.functions import BroadcastProcessFunction, KeyedBroadcastProcessFunction
from chandy.core.state import MapStateDescriptor
from chandy.errors import InvalidProgramError
from chandy.task.operators.broadcast import BroadcastProcessOperator, KeyedBroadcastProcessOperator


class BroadcastStream:
    """A stream whose records go to every subtask of the operator it is connected to, with
    the broadcast states that operator keeps (PyFlink's ``BroadcastStream``).

    No operator applies to it directly: connect a stream to it (``ds.connect(broadcast_stream)``)."""

    def __init__(
        self, input_stream: DataStream, broadcast_state_descriptors: list[MapStateDescriptor]
    ) -> None:
        names = [d.name for d in broadcast_state_descriptors]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise InvalidProgramError(
                f"broadcast() got two MapStateDescriptors named {duplicated}: each broadcast state "
                "needs a name of its own"
            )
        #: The stream with broadcast partitioning (``input_stream.broadcast()``).
        self.input_stream = input_stream
        self.broadcast_state_descriptors = list(broadcast_state_descriptors)


class BroadcastConnectedStream:
    """A stream (keyed or not) connected with a :class:`BroadcastStream` (PyFlink's
    ``BroadcastConnectedStream``): ``process`` applies a broadcast process function."""

    def __init__(self, non_broadcast_stream: DataStream, broadcast_stream: BroadcastStream) -> None:
        if non_broadcast_stream._env is not broadcast_stream.input_stream._env:
            raise InvalidProgramError(
                "connect() of streams from different environments: build both streams "
                "from the same StreamExecutionEnvironment"
            )
        self.non_broadcast_stream = non_broadcast_stream
        self.broadcast_stream = broadcast_stream
        self.broadcast_state_descriptors = broadcast_stream.broadcast_state_descriptors

    def _is_keyed_stream(self) -> bool:
        return isinstance(self.non_broadcast_stream, KeyedStream)

    def process(
        self,
        func: BroadcastProcessFunction[Any, Any, Any] | KeyedBroadcastProcessFunction[Any, Any, Any, Any],
        output_type: Any = None,
    ) -> DataStream:
        """Apply ``func``: ``process_element`` to each element of the connected stream (with
        read-only broadcast state), ``process_broadcast_element`` to each broadcast element
        on every subtask (writing the broadcast state). A keyed stream takes a
        ``KeyedBroadcastProcessFunction``, a non-keyed one a ``BroadcastProcessFunction``."""
        keyed = self._is_keyed_stream()
        operator: type[BroadcastProcessOperator | KeyedBroadcastProcessOperator]
        if isinstance(func, BroadcastProcessFunction):
            if keyed:
                raise InvalidProgramError(
                    "BroadcastProcessFunction should be applied to non-keyed DataStream: this stream "
                    "is keyed, so use a KeyedBroadcastProcessFunction (with keyed state and timers)"
                )
            refuse_timers_without_key(
                func, "BroadcastConnectedStream.process()", "KeyedBroadcastProcessFunction"
            )
            name, operator = "Co-Process-Broadcast", BroadcastProcessOperator
        elif isinstance(func, KeyedBroadcastProcessFunction):
            if not keyed:
                raise InvalidProgramError(
                    "KeyedBroadcastProcessFunction should be applied to keyed DataStream: call "
                    "key_by(...) before connect(...), or use a BroadcastProcessFunction"
                )
            name, operator = "Keyed-Co-Process-Broadcast", KeyedBroadcastProcessOperator
        else:
            raise InvalidProgramError(
                "BroadcastConnectedStream.process() takes a BroadcastProcessFunction or a "
                f"KeyedBroadcastProcessFunction, got {type(func).__name__}"
            )
        node = self.non_broadcast_stream._add_two_input_operator(
            self.broadcast_stream.input_stream._inputs,
            name,
            functools.partial(operator, func, tuple(self.broadcast_state_descriptors)),
            keyed=keyed,
            output_type=output_type,
        )
        return DataStream._of(self.non_broadcast_stream._env, node)
