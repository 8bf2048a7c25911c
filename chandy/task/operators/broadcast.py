"""Broadcast process operators: ``stream.connect(rules.broadcast(descriptor)).process(...)``
(Flink's ``CoBroadcastWithNonKeyedOperator`` and ``CoBroadcastWithKeyedOperator``).

Input 1 is the element side (a non-keyed stream, or a keyed one arriving as
:class:`~chandy.task.batches.KeyedBatch` columns); input 2 is the broadcast side, whose
every record reaches every subtask. They are the one-input process operators with a second
element method, so the element side is exactly ``process`` / ``KeyedStream.process``
(timestamps, side outputs, and on the keyed side keyed state and the ``user-timers``
timer service) with a context that also reads the broadcast state; the broadcast side runs
``process_broadcast_element`` through the same non-keyed loop with a context that writes it.

Broadcast state lives in the operator state backend (``get_broadcast_state``), one map per
descriptor given to ``broadcast``, declared in ``initialize_state`` so that a restored copy
is there before the first record and an unused state is still checkpointed (empty). The
element side gets read-only views: only the broadcast side, which every subtask processes in
full, may change the state, which keeps the copies alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from chandy.core.functions import (
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
    TimerService,
)
from chandy.core.state import MapStateDescriptor, StateDescriptor
from chandy.errors import InvalidProgramError, NotKeyedError
from chandy.state.operator_state import HeapBroadcastState, ImmutableBroadcastState
from chandy.task.operators.base import StateInitializationContext, TwoInputStreamOperator, resolve_call
from chandy.task.operators.keyed import KeyedOperator
from chandy.task.operators.process import (
    KeyedProcessOperator,
    ProcessOperator,
    _KeyedContext,
    _NonKeyedTimerService,
    _SideOutputRouter,
    run_process,
)


class _BroadcastStates:
    """The context methods over the operator's broadcast states (by name)."""

    __slots__ = ()
    _states: dict[str, HeapBroadcastState]
    _operator_name: str

    def _state(self, state_descriptor: MapStateDescriptor) -> HeapBroadcastState:
        name = getattr(state_descriptor, "name", None)
        state = self._states.get(name) if isinstance(name, str) else None
        if state is None:
            raise InvalidProgramError(
                f"operator '{self._operator_name}' has no broadcast state {name!r}: it has "
                f"{sorted(self._states)}. Check the descriptor's name, or pass its "
                "MapStateDescriptor to broadcast(...) so the state is created"
            )
        return state


class _BaseContext(_BroadcastStates):
    """Timestamp and time queries, as every broadcast process function's context has them."""

    __slots__ = ("_timestamp", "_time", "_states", "_operator_name")

    def __init__(self, operator: BroadcastProcessOperator | KeyedBroadcastProcessOperator) -> None:
        self._timestamp: int | None = None
        self._time = _NonKeyedTimerService(operator)
        self._states = operator.broadcast_states
        self._operator_name = operator.name

    def timestamp(self) -> int | None:
        return self._timestamp

    def current_processing_time(self) -> int:
        return self._time.current_processing_time()

    def current_watermark(self) -> int:
        return self._time.current_watermark()

    def get_current_key(self) -> Any:
        """There is no current key here (a non-keyed stream's function, or
        ``process_broadcast_element``, which sees every key): a clear error that fails the
        job once, not an AttributeError that restarts it forever."""
        raise NotKeyedError(
            f"ctx.get_current_key() called in operator '{self._operator_name}' where there is no "
            "current key: a BroadcastProcessFunction's stream is not keyed (connect a keyed "
            "stream, key_by(...), and use a KeyedBroadcastProcessFunction), and "
            "process_broadcast_element sees every key (reach keyed state there with "
            "ctx.apply_to_keyed_state)"
        )


class _ReadOnlyContext(_BaseContext, BroadcastProcessFunction.ReadOnlyContext):
    """``process_element``'s context of a ``BroadcastProcessFunction``."""

    __slots__ = ()

    def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> ImmutableBroadcastState:
        return self._state(state_descriptor).read_only


class _BroadcastContext(
    _BaseContext, BroadcastProcessFunction.Context, KeyedBroadcastProcessFunction.Context
):
    """``process_broadcast_element``'s context (of both functions): the broadcast state is
    writable; in the keyed operator, keyed state is reached through ``apply_to_keyed_state``."""

    __slots__ = ("_operator",)

    def __init__(self, operator: BroadcastProcessOperator | KeyedBroadcastProcessOperator) -> None:
        super().__init__(operator)
        self._operator = operator

    def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> HeapBroadcastState:
        return self._state(state_descriptor)

    def apply_to_keyed_state(
        self, state_descriptor: StateDescriptor, function: Callable[[Any, Any], Any]
    ) -> None:
        operator = self._operator
        if not isinstance(operator, KeyedOperator):
            raise NotKeyedError(
                f"apply_to_keyed_state needs keyed state, and operator '{operator.name}' is not "
                "keyed: connect a KeyedStream (key_by(...)) to the broadcast stream and use a "
                "KeyedBroadcastProcessFunction"
            )
        if not callable(function):
            raise InvalidProgramError(
                f"apply_to_keyed_state takes a function (key, state) -> None, got {type(function).__name__}"
            )
        operator.backend.apply_to_all_keys(state_descriptor, function)


class _KeyedReadOnlyContext(_BroadcastStates, _KeyedContext, KeyedBroadcastProcessFunction.OnTimerContext):
    """``process_element``'s and ``on_timer``'s context of a ``KeyedBroadcastProcessFunction``:
    the keyed process context (key, timestamp, timers, time domain) with read-only broadcast
    state."""

    __slots__ = ("_states", "_operator_name")

    def __init__(self, operator: KeyedBroadcastProcessOperator, timer_service: TimerService) -> None:
        super().__init__(operator.backend, timer_service)
        self._states = operator.broadcast_states
        self._operator_name = operator.name

    def current_processing_time(self) -> int:
        return self._timer_service.current_processing_time()

    def current_watermark(self) -> int:
        return self._timer_service.current_watermark()

    def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> ImmutableBroadcastState:
        return self._state(state_descriptor).read_only


class _BroadcastSide(TwoInputStreamOperator):
    """The broadcast input of both operators: the states, ``process_broadcast_element`` and
    the dispatch of the two inputs (input 1 through the one-input operator's ``_process``)."""

    user_function: Any
    _call: Callable[[Any, Any], Any]
    _router: _SideOutputRouter
    _process: Callable[[Callable[[Any, Any], Any], Any], None]

    def _declare(self, descriptors: Sequence[MapStateDescriptor]) -> None:
        # DataStream.broadcast checked that they are MapStateDescriptors.
        self.descriptors = tuple(descriptors)
        #: The operator's broadcast states by name (declared in ``initialize_state``).
        self.broadcast_states: dict[str, HeapBroadcastState] = {}

    def initialize_state(self, context: StateInitializationContext) -> None:
        super().initialize_state(context)
        backend = self.operator_state_backend
        for descriptor in self.descriptors:
            self.broadcast_states[descriptor.name] = backend.get_broadcast_state(descriptor)

    def open(self) -> None:
        super().open()
        self._call_broadcast = resolve_call(self.user_function, "process_broadcast_element")
        self._broadcast_context = _BroadcastContext(self)  # type: ignore[arg-type]

    def process_batch1(self, records: Any) -> None:
        self._process(self._call, records)

    def process_batch2(self, records: Any) -> None:
        run_process(self._call_broadcast, self._broadcast_context, records, self._router)


class BroadcastProcessOperator(_BroadcastSide, ProcessOperator):
    """``DataStream.connect(broadcast_stream).process(BroadcastProcessFunction)``."""

    def __init__(self, user_function: Any, descriptors: Sequence[MapStateDescriptor]) -> None:
        ProcessOperator.__init__(self, user_function)
        self._declare(descriptors)

    def _make_context(self) -> _ReadOnlyContext:
        return _ReadOnlyContext(self)


# (mypy: the one-input process_batch of KeyedProcessOperator is refused by TwoInputStreamOperator's)
class KeyedBroadcastProcessOperator(_BroadcastSide, KeyedProcessOperator):  # type: ignore[misc]
    """``KeyedStream.connect(broadcast_stream).process(KeyedBroadcastProcessFunction)``; the
    triggerable of the element side's timers."""

    def __init__(self, user_function: Any, descriptors: Sequence[MapStateDescriptor]) -> None:
        KeyedProcessOperator.__init__(self, user_function)
        self._declare(descriptors)

    def _make_context(self, timer_service: TimerService) -> _KeyedReadOnlyContext:
        return _KeyedReadOnlyContext(self, timer_service)
