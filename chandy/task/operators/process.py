"""Process operators: ``DataStream.process(ProcessFunction)`` and
``KeyedStream.process(KeyedProcessFunction)``, with their contexts, timers and side outputs.

Timestamps: ``ctx.timestamp()`` is the record's timestamp and every output keeps
it (Flink's ``TimestampedCollector``). The batch type is checked once per batch:
a plain list has no timestamps, takes the loop it always took and emits a
plain list; a timestamped batch takes a loop that also sets the context's
timestamp and repeats it for each output.

Timers (keyed only) live in an :class:`~chandy.task.timers.InternalTimerService`
named ``user-timers`` (Flink's name). It is created in ``open`` when the
function overrides ``on_timer`` or the restored state holds timers, otherwise
on the first registration, so a function without timers carries no timer
tables and its watermarks cost one attribute check. An event-time timer's
outputs carry the timer's timestamp; a processing-time timer's carry none.

Side outputs: a produced ``(OutputTag, value)`` goes to that tag's side output
(dropped when nobody consumes the tag, as in Flink). Each output batch is first
checked by loops in C (:func:`_may_be_tagged`); only a batch that may hold such
a pair is examined value by value in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any

from chandy.core.functions import (
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    ProcessFunction,
    TimerService,
)
from chandy.core.output_tag import OutputTag
from chandy.core.time import TimeDomain
from chandy.errors import NotKeyedError
from chandy.task.batches import KeyedBatch, TimestampedBatch
from chandy.task.operators.base import Emit, StreamOperator, UdfOperator, resolve_call
from chandy.task.operators.keyed import KeyedOperator
from chandy.task.processing_time import ProcessingTimeService
from chandy.task.timers import InternalTimer, InternalTimerService

#: The name of a process function's timer service (Flink's).
USER_TIMERS = "user-timers"

#: The ``on_timer`` methods that do nothing: a function that keeps one needs no timer tables.
_DEFAULT_ON_TIMERS = (
    KeyedProcessFunction.on_timer,
    KeyedCoProcessFunction.on_timer,
    KeyedBroadcastProcessFunction.on_timer,
)


def _processing_time_service(operator: StreamOperator) -> ProcessingTimeService:
    service = operator.processing_time_service
    if service is None:
        raise RuntimeError(
            f"operator '{operator.name}' has no processing-time service: the operator chain "
            "sets processing_time_service before open (a harness must set it too)"
        )
    return service


def _is_tagged(v: Any) -> bool:
    return type(v) is tuple and len(v) == 2 and type(v[0]) is OutputTag


_first = itemgetter(0)


def _may_be_tagged(out: list[Any]) -> bool:
    """False when no value of ``out`` can be ``(OutputTag, value)``, decided by loops in C
    (about 10 ns a value; 30 when all are tuples): a batch without side outputs is not
    examined value by value in Python."""
    types = set(map(type, out))
    if tuple not in types:
        return False
    if len(types) > 1:
        return True
    try:
        return OutputTag in map(type, map(_first, out))
    except IndexError:  # an empty tuple
        return True


class _SideOutputRouter:
    """Emits a batch of produced values: ``(OutputTag, value)`` pairs to their side
    outputs, the rest to the main output."""

    __slots__ = ("_operator",)

    def __init__(self, operator: StreamOperator) -> None:
        self._operator = operator

    def emit(self, out: list[Any], out_ts: list[int | None] | None) -> None:
        """Emit ``out`` (with ``out_ts``, or as a plain list when ``None``)."""
        output = self._operator.output
        if not _may_be_tagged(out):
            output(out if out_ts is None else TimestampedBatch(out, out_ts))
            return
        main: list[Any] = []
        main_ts: list[int | None] = []
        sides: dict[str, tuple[list[Any], list[int | None]]] = {}
        for i, v in enumerate(out):
            if _is_tagged(v):
                side = sides.get(v[0].tag_id)
                if side is None:
                    side = sides[v[0].tag_id] = ([], [])
                side[0].append(v[1])
                side[1].append(None if out_ts is None else out_ts[i])
            else:
                main.append(v)
                main_ts.append(None if out_ts is None else out_ts[i])
        if main:
            output(main if out_ts is None else TimestampedBatch(main, main_ts))
        side_outputs: dict[str, Emit] = self._operator.side_outputs
        for tag_id, (values, timestamps) in sides.items():
            emit = side_outputs.get(tag_id)
            if emit is not None:
                emit(values if out_ts is None else TimestampedBatch(values, timestamps))


def _run_timestamped(
    call: Any, ctx: Any, values: list[Any], timestamps: list[int | None]
) -> tuple[list[Any], list[int | None]]:
    """``process_element`` over values with timestamps (no keys): outputs keep their input's."""
    out: list[Any] = []
    out_ts: list[int | None] = []
    extend, extend_ts = out.extend, out_ts.extend
    for value, t in zip(values, timestamps, strict=True):
        ctx._timestamp = t
        produced = call(value, ctx)
        if produced is not None:
            before = len(out)
            extend(produced)
            extend_ts([t] * (len(out) - before))
    return out, out_ts


def run_process(call: Callable[[Any, Any], Any], ctx: Any, records: Any, router: _SideOutputRouter) -> None:
    """``call(value, ctx)`` over a non-keyed batch, the outputs emitted through ``router``: a
    plain list takes the plain loop, a timestamped batch the loop that sets the context's
    timestamp and keeps it on the outputs. ``DataStream.process`` runs its function through
    this, and so does the broadcast side of a broadcast process function (with its context)."""
    if type(records) is not list:
        timed: TimestampedBatch = records
        out, out_ts = _run_timestamped(call, ctx, timed.values, timed.timestamps)
        if out:
            router.emit(out, out_ts)
        return
    ctx._timestamp = None
    out = []
    extend = out.extend
    for r in records:
        produced = call(r, ctx)
        if produced is not None:
            extend(produced)
    if out:
        router.emit(out, None)


# ---------------------------------------------------------------------- non-keyed


class _TimeQueries(TimerService):
    """The time queries every process function's timer service answers from its operator."""

    __slots__ = ("_operator",)

    def __init__(self, operator: StreamOperator) -> None:
        self._operator = operator

    def current_processing_time(self) -> int:
        return _processing_time_service(self._operator).get_current_processing_time()

    def current_watermark(self) -> int:
        return self._operator.current_watermark


class _NonKeyedTimerService(_TimeQueries):
    """Time queries only: timers need a key (Flink: "Setting timers is only supported on a
    keyed stream")."""

    __slots__ = ()

    def _refuse(self) -> NotKeyedError:
        return NotKeyedError(
            f"Setting timers is only supported on a keyed stream (operator '{self._operator.name}' "
            "is not keyed): call key_by(...) before process(...) and use a KeyedProcessFunction "
            "(connected streams: connect two keyed streams, or key_by(k1, k2), and use a "
            "KeyedCoProcessFunction)"
        )

    def register_processing_time_timer(self, timestamp: int) -> None:
        raise self._refuse()

    def register_event_time_timer(self, timestamp: int) -> None:
        raise self._refuse()

    def delete_processing_time_timer(self, timestamp: int) -> None:
        raise self._refuse()

    def delete_event_time_timer(self, timestamp: int) -> None:
        raise self._refuse()


class _ProcessContext(ProcessFunction.Context):
    __slots__ = ("_timestamp", "_timer_service")

    def __init__(self, timer_service: TimerService) -> None:
        self._timestamp: int | None = None
        self._timer_service = timer_service

    def timestamp(self) -> int | None:
        return self._timestamp

    def timer_service(self) -> TimerService:
        return self._timer_service

    def get_current_key(self) -> Any:
        """Not part of a ``ProcessFunction.Context``: a function written for a keyed stream
        (PyFlink's ``KeyedProcessFunction``) meets this instead of an AttributeError that
        would restart the job forever."""
        raise NotKeyedError(
            "ctx.get_current_key() called in a function on a stream that is not keyed (there is "
            "no current key): call key_by(...) before process(...) and use a KeyedProcessFunction "
            "(connected streams: connect two keyed streams and use a KeyedCoProcessFunction)"
        )


class ProcessOperator(UdfOperator):
    """``DataStream.process(ProcessFunction)``."""

    def open(self) -> None:
        super().open()
        self._resolve_calls()
        self._context = self._make_context()
        self._router = _SideOutputRouter(self)

    def _make_context(self) -> Any:
        """The context of ``process_element`` (the broadcast operator's offers more)."""
        return _ProcessContext(_NonKeyedTimerService(self))

    def _resolve_calls(self) -> None:
        """Find the user function's element method(s); the two-input operators (``connect``)
        override this and share everything else."""
        self._call = resolve_call(self.user_function, "process_element")

    def process_batch(self, records: list[Any]) -> None:
        self._process(self._call, records)

    def _process(self, call: Callable[[Any, Any], Any], records: list[Any]) -> None:
        run_process(call, self._context, records, self._router)


# ---------------------------------------------------------------------- keyed


class _KeyedTimerService(_TimeQueries):
    """A process function's view of its operator's timers, for the current key."""

    __slots__ = ()
    _operator: KeyedProcessOperator

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._operator.internal_timer_service().register_processing_time_timer(None, timestamp)

    def register_event_time_timer(self, timestamp: int) -> None:
        self._operator.internal_timer_service().register_event_time_timer(None, timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._operator.internal_timer_service().delete_processing_time_timer(None, timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._operator.internal_timer_service().delete_event_time_timer(None, timestamp)


class _KeyedContext(KeyedProcessFunction.OnTimerContext):
    """The context of ``process_element`` and (with a time domain) of ``on_timer``."""

    __slots__ = ("_backend", "_timestamp", "_timer_service", "_time_domain")

    def __init__(self, backend: Any, timer_service: TimerService) -> None:
        self._backend = backend
        self._timestamp: int | None = None
        self._timer_service = timer_service
        self._time_domain = TimeDomain.EVENT_TIME

    def timestamp(self) -> int | None:
        return self._timestamp

    def get_current_key(self) -> Any:
        return self._backend.current_key

    def timer_service(self) -> TimerService:
        return self._timer_service

    def time_domain(self) -> TimeDomain:
        return self._time_domain


class KeyedProcessOperator(KeyedOperator):
    """``KeyedStream.process(KeyedProcessFunction)``; the triggerable of its timers."""

    def open(self) -> None:
        super().open()
        self._resolve_calls()
        timer_service = _KeyedTimerService(self)
        self._context = self._make_context(timer_service)
        self._timer_context = self._make_context(timer_service)
        self._router = _SideOutputRouter(self)
        on_timer = getattr(self.user_function, "on_timer", None)
        if getattr(type(self.user_function), "on_timer", None) in _DEFAULT_ON_TIMERS:
            on_timer = None  # the default does nothing
        self._on_timer = on_timer
        #: Outputs of event-time timers firing in one watermark, emitted as one batch.
        self._fired: list[Any] = []
        self._fired_ts: list[int | None] = []
        self._timers: InternalTimerService | None = None
        if on_timer is not None or InternalTimerService.has_timers(self.backend, USER_TIMERS):
            self.internal_timer_service()

    def _make_context(self, timer_service: TimerService) -> _KeyedContext:
        """The context of ``process_element`` and ``on_timer`` (the keyed broadcast
        operator's offers more)."""
        return _KeyedContext(self.backend, timer_service)

    def internal_timer_service(self) -> InternalTimerService:
        """The operator's timers, created on first use (restored ones at ``open``)."""
        timers = self._timers
        if timers is None:
            timers = self._timers = InternalTimerService(
                USER_TIMERS, self.backend, _processing_time_service(self), self
            )
        return timers

    def _resolve_calls(self) -> None:
        """As :meth:`ProcessOperator._resolve_calls`."""
        self._call = resolve_call(self.user_function, "process_element")

    def process_batch(self, records: KeyedBatch) -> None:  # type: ignore[override]
        self._process(self._call, records)

    def _process(self, call: Callable[[Any, Any], Any], records: KeyedBatch) -> None:
        if records.timestamps is not None:
            self._process_timestamped(call, records, records.timestamps)
            return
        backend = self.backend
        ctx = self._context
        ctx._timestamp = None
        out: list[Any] = []
        extend = out.extend
        for kg, key, value in zip(records.key_groups, records.keys, records.values, strict=True):
            backend.current_key = key
            backend.current_index = kg
            produced = call(value, ctx)
            if produced is not None:
                extend(produced)
        if out:
            self._router.emit(out, None)

    def _process_timestamped(
        self, call: Callable[[Any, Any], Any], records: KeyedBatch, timestamps: list[int | None]
    ) -> None:
        backend = self.backend
        ctx = self._context
        out: list[Any] = []
        out_ts: list[int | None] = []
        extend, extend_ts = out.extend, out_ts.extend
        for kg, key, value, t in zip(
            records.key_groups, records.keys, records.values, timestamps, strict=True
        ):
            backend.current_key = key
            backend.current_index = kg
            ctx._timestamp = t
            produced = call(value, ctx)
            if produced is not None:
                before = len(out)
                extend(produced)
                extend_ts([t] * (len(out) - before))
        if out:
            self._router.emit(out, out_ts)

    def process_watermark(self, timestamp: int) -> None:
        """Fire the event-time timers the watermark passed (their outputs as one batch),
        then forward the watermark."""
        self.current_watermark = timestamp
        timers = self._timers
        if timers is not None:
            timers.advance_watermark(timestamp)
            if self._fired:
                out, out_ts = self._fired, self._fired_ts
                self._fired, self._fired_ts = [], []
                self._router.emit(out, out_ts)
        self.emit_watermark(timestamp)

    def _call_on_timer(self, timer: InternalTimer, domain: TimeDomain) -> Iterable[Any] | None:
        on_timer = self._on_timer
        if on_timer is None:
            return None
        ctx = self._timer_context
        ctx._timestamp = timer.timestamp
        ctx._time_domain = domain
        result: Iterable[Any] | None = on_timer(timer.timestamp, ctx)
        return result

    def on_event_time(self, timer: InternalTimer) -> None:
        produced = self._call_on_timer(timer, TimeDomain.EVENT_TIME)
        if produced is not None:
            before = len(self._fired)
            self._fired.extend(produced)
            self._fired_ts.extend([timer.timestamp] * (len(self._fired) - before))

    def on_processing_time(self, timer: InternalTimer) -> None:
        produced = self._call_on_timer(timer, TimeDomain.PROCESSING_TIME)
        if produced is not None:
            out = list(produced)
            if out:  # no timestamps: a plain list
                self._router.emit(out, None)
