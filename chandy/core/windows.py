"""Windows, window assigners and triggers (PyFlink's ``pyflink.datastream.window``).

A :class:`WindowAssigner` puts each record into zero or more windows; the
records of one key and one window form a *pane*. A :class:`Trigger` decides
when a pane is evaluated (``FIRE``) and when it is dropped (``PURGE``). The
window operator keeps each pane's contents and the trigger's state as keyed
state *namespaced by the window*, so they are checkpointed, restored and
rescaled with the key, and registers the trigger's timers with the key and the
window.

Names, signatures and semantics follow PyFlink (and Flink's Java classes behind
it). Sizes and offsets are given as a :class:`~chandy.core.time.Time`, a
:class:`~chandy.core.time.Duration` or an int of milliseconds.
"""

from __future__ import annotations

import enum
import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable
from typing import Any, Generic, TypeVar, cast

from chandy.core.functions import ReduceFunction, RuntimeContext
from chandy.core.state import (
    ReducingState,
    ReducingStateDescriptor,
    State,
    StateDescriptor,
    ValueStateDescriptor,
)
from chandy.core.time import MAX_WATERMARK, MIN_TIMESTAMP, to_millis

__all__ = [
    "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger",
    "CountSlidingWindowAssigner",
    "CountTrigger",
    "CountTumblingWindowAssigner",
    "CountWindow",
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EventTimeSessionWindows",
    "EventTimeTrigger",
    "GlobalWindow",
    "GlobalWindows",
    "MergingWindowAssigner",
    "NeverTrigger",
    "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "SessionWindowTimeGapExtractor",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TimeWindow",
    "Trigger",
    "TriggerResult",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "Window",
    "WindowAssigner",
]

T = TypeVar("T")
W = TypeVar("W", bound="Window")
W2 = TypeVar("W2")


# ---------------------------------------------------------------------------------------------- windows


class Window(ABC):
    """A finite bucket of records. Every record of a window has arrived once the watermark
    passes :meth:`max_timestamp` (for time windows; count and global windows never end)."""

    __slots__ = ()

    @abstractmethod
    def max_timestamp(self) -> int:
        """The largest timestamp that still belongs to this window."""


class TimeWindow(Window):
    """The time interval ``[start, end)``."""

    __slots__ = ("start", "end", "_hash")

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end
        # Windows are dictionary keys (state namespaces, timers) hashed several times each.
        self._hash = hash((start, end))

    def max_timestamp(self) -> int:
        return self.end - 1

    def intersects(self, other: TimeWindow) -> bool:
        """True if this window and ``other`` overlap or touch (sessions that touch merge)."""
        return self.start <= other.end and self.end >= other.start

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window that covers both this window and ``other``."""
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))

    @staticmethod
    def get_window_start_with_offset(timestamp: int, offset: int, window_size: int) -> int:
        """The start of the window of size ``window_size``, shifted by ``offset``, that
        holds ``timestamp`` (correct for negative timestamps too: Python's ``%`` floors)."""
        return timestamp - (timestamp - offset) % window_size

    @staticmethod
    def merge_windows(
        windows: Iterable[TimeWindow], callback: MergingWindowAssigner.MergeCallback[TimeWindow]
    ) -> None:
        """Merge overlapping windows: calls ``callback.merge(to_be_merged, merge_result)`` once
        for every group of two or more windows that overlap (what session windows do)."""
        merged: list[tuple[TimeWindow, set[TimeWindow]]] = []
        current: TimeWindow | None = None
        members: set[TimeWindow] = set()
        for candidate in sorted(windows, key=lambda w: (w.start, w.end)):
            if current is None:
                current, members = candidate, {candidate}
            elif current.intersects(candidate):
                current = current.cover(candidate)
                members.add(candidate)
            else:
                merged.append((current, members))
                current, members = candidate, {candidate}
        if current is not None:
            merged.append((current, members))
        for result, to_merge in merged:
            if len(to_merge) > 1:
                callback.merge(to_merge, result)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is TimeWindow and other.start == self.start and other.end == self.end
        )

    def __lt__(self, other: TimeWindow) -> bool:
        if not isinstance(other, TimeWindow):
            raise TypeError(f"a TimeWindow compares only with a TimeWindow, not {other!r}")
        return (self.start, self.end) < (other.start, other.end)

    def __le__(self, other: TimeWindow) -> bool:
        return self == other or self < other

    def __repr__(self) -> str:
        return f"TimeWindow(start={self.start}, end={self.end})"

    def __reduce__(self) -> tuple[type, tuple[int, int]]:
        return TimeWindow, (self.start, self.end)


class CountWindow(Window):
    """A count window, identified by its id (the ``id``-th window of its key)."""

    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = id

    def max_timestamp(self) -> int:
        return MAX_WATERMARK

    def __hash__(self) -> int:
        return hash(("CountWindow", self.id))

    def __eq__(self, other: object) -> bool:
        return type(other) is CountWindow and other.id == self.id

    def __repr__(self) -> str:
        return f"CountWindow(id={self.id})"

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return CountWindow, (self.id,)


class GlobalWindow(Window):
    """The one window of :class:`GlobalWindows`: every record of a key is in it."""

    __slots__ = ()

    @staticmethod
    def get() -> GlobalWindow:
        """The one global window (every record of a key falls in it)."""
        return _GLOBAL_WINDOW

    def max_timestamp(self) -> int:
        return MAX_WATERMARK

    def __eq__(self, other: object) -> bool:
        return type(other) is GlobalWindow

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "GlobalWindow"

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return GlobalWindow, ()


_GLOBAL_WINDOW = GlobalWindow()


# ---------------------------------------------------------------------------------------------- triggers


class TriggerResult(enum.Enum):
    """What a trigger asks for: evaluate the window (fire), drop its contents (purge), both
    or neither. A fire on a window without contents emits nothing."""

    CONTINUE = (False, False)
    FIRE_AND_PURGE = (True, True)
    FIRE = (True, False)
    PURGE = (False, True)

    def is_fire(self) -> bool:
        """Whether the window is evaluated (its function called)."""
        return bool(self.value[0])

    def is_purge(self) -> bool:
        """Whether the window's contents are dropped."""
        return bool(self.value[1])


class Trigger(ABC, Generic[T, W]):
    """Decides when a pane (the records of one key in one window) is evaluated.

    One trigger object serves every key and window, so it must keep no state in
    attributes: what it needs to remember goes into ``ctx.get_partitioned_state``,
    which is scoped to the key and window at hand (and checkpointed with them).
    A trigger used with a merging assigner (sessions) must return True from
    :meth:`can_merge` and implement :meth:`on_merge`.
    """

    class TriggerContext(ABC):
        """Timers and state of the current key and window, for a trigger."""

        @abstractmethod
        def get_current_processing_time(self) -> int:
            """The current processing time, in milliseconds since the epoch."""

        @abstractmethod
        def get_current_watermark(self) -> int:
            """The operator's current event-time watermark."""

        @abstractmethod
        def register_processing_time_timer(self, time: int) -> None:
            """Call :meth:`Trigger.on_processing_time` once processing time reaches ``time``."""

        @abstractmethod
        def register_event_time_timer(self, time: int) -> None:
            """Call :meth:`Trigger.on_event_time` once the watermark reaches ``time``."""

        @abstractmethod
        def delete_processing_time_timer(self, time: int) -> None:
            """Remove this window's processing-time timer at ``time``."""

        @abstractmethod
        def delete_event_time_timer(self, time: int) -> None:
            """Remove this window's event-time timer at ``time``."""

        @abstractmethod
        def get_partitioned_state(self, state_descriptor: StateDescriptor) -> State:
            """State scoped to the current key and window."""

    class OnMergeContext(TriggerContext):
        """What :meth:`Trigger.on_merge` gets: can also merge the merged windows' state."""

        @abstractmethod
        def merge_partitioned_state(self, state_descriptor: StateDescriptor) -> None:
            """Fold the state of the windows being merged into the resulting window
            (reducing, aggregating and list state)."""

    @abstractmethod
    def on_element(self, element: T, timestamp: int, window: W, ctx: Trigger.TriggerContext) -> TriggerResult:
        """Called for every record added to a pane."""

    @abstractmethod
    def on_processing_time(self, time: int, window: W, ctx: Trigger.TriggerContext) -> TriggerResult:
        """A processing-time timer this trigger registered fired."""

    @abstractmethod
    def on_event_time(self, time: int, window: W, ctx: Trigger.TriggerContext) -> TriggerResult:
        """An event-time timer this trigger registered fired."""

    def can_merge(self) -> bool:
        """True if this trigger supports merging windows (implements :meth:`on_merge`)."""
        return False

    def on_merge(self, window: W, ctx: Trigger.OnMergeContext) -> None:
        """Windows were merged into ``window``: set up timers (and state) for it."""
        raise TypeError(f"{type(self).__name__} does not support merging windows")

    @abstractmethod
    def clear(self, window: W, ctx: Trigger.TriggerContext) -> None:
        """The window is gone: delete the timers and state this trigger holds for it."""


class EventTimeTrigger(Trigger[Any, TimeWindow]):
    """Fires once the watermark passes the end of the window (the default of event-time
    assigners); a record arriving after that (within the allowed lateness) fires at once."""

    def on_element(
        self, element: Any, timestamp: int, window: TimeWindow, ctx: Trigger.TriggerContext
    ) -> TriggerResult:
        if window.max_timestamp() <= ctx.get_current_watermark():
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: TimeWindow, ctx: Trigger.TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: TimeWindow, ctx: Trigger.TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if time == window.max_timestamp() else TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: Trigger.OnMergeContext) -> None:
        # Flink: only if the watermark has not passed the merged window yet (else it
        # would fire at once with a timer that is already late).
        if window.max_timestamp() > ctx.get_current_watermark():
            ctx.register_event_time_timer(window.max_timestamp())

    def clear(self, window: TimeWindow, ctx: Trigger.TriggerContext) -> None:
        ctx.delete_event_time_timer(window.max_timestamp())

    @staticmethod
    def create() -> EventTimeTrigger:
        """The event-time windows' default trigger: fire once the watermark passes the window's end."""
        return EventTimeTrigger()

    def __repr__(self) -> str:
        return "EventTimeTrigger()"


class ProcessingTimeTrigger(Trigger[Any, TimeWindow]):
    """Fires once processing time passes the end of the window (the default of
    processing-time assigners)."""

    def on_element(
        self, element: Any, timestamp: int, window: TimeWindow, ctx: Trigger.TriggerContext
    ) -> TriggerResult:
        ctx.register_processing_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: TimeWindow, ctx: Trigger.TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE

    def on_event_time(self, time: int, window: TimeWindow, ctx: Trigger.TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: Trigger.OnMergeContext) -> None:
        if window.max_timestamp() > ctx.get_current_processing_time():
            ctx.register_processing_time_timer(window.max_timestamp())

    def clear(self, window: TimeWindow, ctx: Trigger.TriggerContext) -> None:
        ctx.delete_processing_time_timer(window.max_timestamp())

    @staticmethod
    def create() -> ProcessingTimeTrigger:
        """The processing-time windows' default trigger: fire once the clock passes the window's end."""
        return ProcessingTimeTrigger()

    def __repr__(self) -> str:
        return "ProcessingTimeTrigger()"


class _Min(ReduceFunction):
    def reduce(self, value1: Any, value2: Any) -> Any:
        return min(value1, value2)


class _ContinuousTrigger(Trigger[Any, TimeWindow]):
    """Fires every ``interval`` (and, for event time, at the window's end); the next fire
    time is kept in a reducing state named ``fire-time``, as in Flink."""

    def __init__(self, interval: Any) -> None:
        self.interval = to_millis(interval, "the interval of a continuous trigger")
        if self.interval <= 0:
            raise ValueError(f"a continuous trigger needs an interval > 0, got {self.interval}")
        self.state_desc = ReducingStateDescriptor("fire-time", _Min())

    def _fire_time(self, ctx: Trigger.TriggerContext) -> ReducingState:
        return cast(ReducingState, ctx.get_partitioned_state(self.state_desc))

    @abstractmethod
    def _register(self, time: int, ctx: Trigger.TriggerContext) -> None:
        """Register the timer of ``time`` in this trigger's time domain."""

    @abstractmethod
    def _delete(self, time: int, ctx: Trigger.TriggerContext) -> None:
        """Delete the timer of ``time`` in this trigger's time domain."""

    def _register_next(self, time: int, window: TimeWindow, ctx: Trigger.TriggerContext) -> None:
        next_fire = min(time + self.interval, window.max_timestamp())
        self._fire_time(ctx).add(next_fire)
        self._register(next_fire, ctx)

    def _on_timer(self, time: int, window: TimeWindow, ctx: Trigger.TriggerContext) -> TriggerResult:
        fire_time = self._fire_time(ctx)
        if fire_time.get() == time:
            fire_time.clear()
            self._register_next(time, window, ctx)
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: Trigger.OnMergeContext) -> None:
        ctx.merge_partitioned_state(self.state_desc)
        next_fire = self._fire_time(ctx).get()
        if next_fire is not None:
            self._register(next_fire, ctx)

    def clear(self, window: TimeWindow, ctx: Trigger.TriggerContext) -> None:
        fire_time = self._fire_time(ctx)
        timestamp = fire_time.get()
        if timestamp is not None:
            self._delete(timestamp, ctx)
            fire_time.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}.of({self.interval})"


class ContinuousEventTimeTrigger(_ContinuousTrigger):
    """Fires every ``interval`` of event time while the window is open, and at its end."""

    @staticmethod
    def of(interval: Any) -> ContinuousEventTimeTrigger:
        """A trigger that fires early results every ``interval`` of event time (as the watermark passes), and
        at the window's end."""
        return ContinuousEventTimeTrigger(interval)

    def _register(self, time: int, ctx: Trigger.TriggerContext) -> None:
        ctx.register_event_time_timer(time)

    def _delete(self, time: int, ctx: Trigger.TriggerContext) -> None:
        ctx.delete_event_time_timer(time)

    def on_element(
        self, element: Any, timestamp: int, window: TimeWindow, ctx: Trigger.TriggerContext
    ) -> TriggerResult:
        if window.max_timestamp() <= ctx.get_current_watermark():
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.max_timestamp())
        if self._fire_time(ctx).get() is None:
            self._register_next(timestamp - timestamp % self.interval, window, ctx)
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: TimeWindow, ctx: Trigger.TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: TimeWindow, ctx: Trigger.TriggerContext) -> TriggerResult:
        if time == window.max_timestamp():
            return TriggerResult.FIRE
        return self._on_timer(time, window, ctx)

    def on_merge(self, window: TimeWindow, ctx: Trigger.OnMergeContext) -> None:
        super().on_merge(window, ctx)
        if window.max_timestamp() > ctx.get_current_watermark():
            ctx.register_event_time_timer(window.max_timestamp())


class ContinuousProcessingTimeTrigger(_ContinuousTrigger):
    """Fires every ``interval`` of processing time while the window has contents."""

    @staticmethod
    def of(interval: Any) -> ContinuousProcessingTimeTrigger:
        """A trigger that fires early results every ``interval`` of processing time, and at the window's
        end."""
        return ContinuousProcessingTimeTrigger(interval)

    def _register(self, time: int, ctx: Trigger.TriggerContext) -> None:
        ctx.register_processing_time_timer(time)

    def _delete(self, time: int, ctx: Trigger.TriggerContext) -> None:
        ctx.delete_processing_time_timer(time)

    def on_element(
        self, element: Any, timestamp: int, window: TimeWindow, ctx: Trigger.TriggerContext
    ) -> TriggerResult:
        if self._fire_time(ctx).get() is None:
            now = ctx.get_current_processing_time()
            self._register_next(now - now % self.interval, window, ctx)
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: TimeWindow, ctx: Trigger.TriggerContext) -> TriggerResult:
        return self._on_timer(time, window, ctx)

    def on_event_time(self, time: int, window: TimeWindow, ctx: Trigger.TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE


class CountTrigger(Trigger[Any, Window]):
    """Fires once a pane holds ``window_size`` records (counted in a reducing state)."""

    def __init__(self, window_size: int) -> None:
        if window_size <= 0:
            raise ValueError(f"CountTrigger needs a count > 0, got {window_size}")
        self._window_size = window_size
        self._count_state_descriptor = ReducingStateDescriptor("count", operator.add)

    @staticmethod
    def of(window_size: int) -> CountTrigger:
        """A trigger that fires once a window holds ``window_size`` records."""
        return CountTrigger(window_size)

    def on_element(
        self, element: Any, timestamp: int, window: Window, ctx: Trigger.TriggerContext
    ) -> TriggerResult:
        count = cast(ReducingState, ctx.get_partitioned_state(self._count_state_descriptor))
        count.add(1)
        if count.get() >= self._window_size:
            count.clear()
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Window, ctx: Trigger.TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Window, ctx: Trigger.TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: Trigger.OnMergeContext) -> None:
        ctx.merge_partitioned_state(self._count_state_descriptor)

    def clear(self, window: Window, ctx: Trigger.TriggerContext) -> None:
        ctx.get_partitioned_state(self._count_state_descriptor).clear()

    def __repr__(self) -> str:
        return f"CountTrigger({self._window_size})"


class PurgingTrigger(Trigger[Any, Window]):
    """Turns any trigger into a purging one: each FIRE of the nested trigger becomes
    FIRE_AND_PURGE (the window's contents are dropped after each evaluation)."""

    def __init__(self, nested_trigger: Trigger[Any, Any]) -> None:
        self.nested_trigger = nested_trigger

    @staticmethod
    def of(nested_trigger: Trigger[Any, Any]) -> PurgingTrigger:
        """Wrap ``nested_trigger`` so that every firing also purges the window's contents."""
        return PurgingTrigger(nested_trigger)

    @staticmethod
    def _purging(result: TriggerResult) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if result.is_fire() else result

    def on_element(
        self, element: Any, timestamp: int, window: Window, ctx: Trigger.TriggerContext
    ) -> TriggerResult:
        return self._purging(self.nested_trigger.on_element(element, timestamp, window, ctx))

    def on_event_time(self, time: int, window: Window, ctx: Trigger.TriggerContext) -> TriggerResult:
        return self._purging(self.nested_trigger.on_event_time(time, window, ctx))

    def on_processing_time(self, time: int, window: Window, ctx: Trigger.TriggerContext) -> TriggerResult:
        return self._purging(self.nested_trigger.on_processing_time(time, window, ctx))

    def clear(self, window: Window, ctx: Trigger.TriggerContext) -> None:
        self.nested_trigger.clear(window, ctx)

    def can_merge(self) -> bool:
        return self.nested_trigger.can_merge()

    def on_merge(self, window: Window, ctx: Trigger.OnMergeContext) -> None:
        self.nested_trigger.on_merge(window, ctx)

    def __repr__(self) -> str:
        return f"PurgingTrigger({self.nested_trigger!r})"


class NeverTrigger(Trigger[Any, GlobalWindow]):
    """Never fires: the default of :class:`GlobalWindows` (set a trigger of your own)."""

    def on_element(
        self, element: Any, timestamp: int, window: GlobalWindow, ctx: Trigger.TriggerContext
    ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_processing_time(
        self, time: int, window: GlobalWindow, ctx: Trigger.TriggerContext
    ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: GlobalWindow, ctx: Trigger.TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: GlobalWindow, ctx: Trigger.OnMergeContext) -> None:
        return None

    def clear(self, window: GlobalWindow, ctx: Trigger.TriggerContext) -> None:
        return None


# ---------------------------------------------------------------------------------------------- assigners


def _no_timestamp_error(assigner: WindowAssigner[Any, Any]) -> ValueError:
    return ValueError(
        f"{assigner!r} windows by event time, but a record has no timestamp: call "
        "data_stream.assign_timestamps_and_watermarks(...) before the window (or use a "
        "processing-time assigner)"
    )


class WindowAssigner(ABC, Generic[T, W]):
    """Puts each record into zero or more windows."""

    class WindowAssignerContext(ABC):
        """What an assigner may ask: the processing time, the runtime context (keyed state)."""

        @abstractmethod
        def get_current_processing_time(self) -> int:
            """The current processing time, in milliseconds since the epoch (what processing-time assigners
            use)."""

        @abstractmethod
        def get_runtime_context(self) -> RuntimeContext:
            """The runtime context of the window operator's subtask."""

    @abstractmethod
    def assign_windows(
        self, element: T, timestamp: int | None, context: WindowAssigner.WindowAssignerContext
    ) -> Collection[W]:
        """The windows ``element`` (with event timestamp ``timestamp``) belongs to."""

    @abstractmethod
    def get_default_trigger(self, env: Any = None) -> Trigger[T, W]:
        """The trigger used unless ``WindowedStream.trigger`` sets another."""

    @abstractmethod
    def is_event_time(self) -> bool:
        """True if records are assigned by their event timestamps."""


class MergingWindowAssigner(WindowAssigner[T, W]):
    """An assigner whose windows may merge (sessions)."""

    class MergeCallback(ABC, Generic[W2]):
        """How a merging assigner reports merges: ``merge(windows, result)`` for each group of windows that
        become one."""

        @abstractmethod
        def merge(self, to_be_merged: Iterable[W2], merge_result: W2) -> None:
            """The windows ``to_be_merged`` become the one window ``merge_result``."""

    @abstractmethod
    def merge_windows(self, windows: Iterable[W], callback: MergingWindowAssigner.MergeCallback[W]) -> None:
        """Say (through ``callback``) which of ``windows`` merge into which."""


def _size_and_offset(kind: str, size: Any, offset: Any, period_name: str, period: Any) -> tuple[int, int]:
    size_ms = to_millis(size, f"the size of {kind}")
    offset_ms = 0 if offset is None else to_millis(offset, f"the offset of {kind}")
    period_ms = to_millis(period, f"the {period_name} of {kind}")
    if size_ms <= 0 or period_ms <= 0 or abs(offset_ms) >= period_ms:
        raise ValueError(
            f"{kind} needs size > 0, {period_name} > 0 and abs(offset) < {period_name}; "
            f"got size={size_ms}, {period_name}={period_ms}, offset={offset_ms}"
        )
    return size_ms, offset_ms


class _TumblingWindows(WindowAssigner[Any, TimeWindow]):
    """Fixed-size, non-overlapping windows of ``size`` ms, shifted by ``offset``."""

    _EVENT_TIME = True

    def __init__(self, size: Any, offset: Any = 0) -> None:
        self.size, self.offset = _size_and_offset(type(self).__name__, size, offset, "size", size)
        self.slide = self.size

    def _window_of(self, timestamp: int) -> list[TimeWindow]:
        start = timestamp - (timestamp - self.offset) % self.size
        return [TimeWindow(start, start + self.size)]

    def is_event_time(self) -> bool:
        return self._EVENT_TIME

    def get_default_trigger(self, env: Any = None) -> Trigger[Any, TimeWindow]:
        return EventTimeTrigger() if self._EVENT_TIME else ProcessingTimeTrigger()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.size}, {self.offset})"


class TumblingEventTimeWindows(_TumblingWindows):
    """Tumbling windows by the records' event timestamps.

    ``key_by(...).window(TumblingEventTimeWindows.of(Time.seconds(5)))``.
    """

    @staticmethod
    def of(size: Any, offset: Any = None) -> TumblingEventTimeWindows:
        """``size`` (and ``offset``, e.g. ``Time.hours(-8)`` for days in UTC+8) as a
        Time, a Duration or milliseconds."""
        return TumblingEventTimeWindows(size, offset)

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssigner.WindowAssignerContext
    ) -> list[TimeWindow]:
        if timestamp is None or timestamp <= MIN_TIMESTAMP:
            raise _no_timestamp_error(self)
        return self._window_of(timestamp)


class TumblingProcessingTimeWindows(_TumblingWindows):
    """Tumbling windows by the processing time at which records arrive."""

    _EVENT_TIME = False

    @staticmethod
    def of(size: Any, offset: Any = None) -> TumblingProcessingTimeWindows:
        """Back-to-back processing-time windows of ``size``, aligned to the epoch plus ``offset``."""
        return TumblingProcessingTimeWindows(size, offset)

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssigner.WindowAssignerContext
    ) -> list[TimeWindow]:
        return self._window_of(context.get_current_processing_time())


class _SlidingWindows(WindowAssigner[Any, TimeWindow]):
    """Windows of ``size`` ms starting every ``slide`` ms (a record is in ``size/slide`` of them)."""

    _EVENT_TIME = True

    def __init__(self, size: Any, slide: Any, offset: Any = 0) -> None:
        self.size, self.offset = _size_and_offset(type(self).__name__, size, offset, "slide", slide)
        self.slide = to_millis(slide, "the slide")
        self._pane_size = math.gcd(self.size, self.slide)

    def _windows_of(self, timestamp: int) -> list[TimeWindow]:
        size, slide = self.size, self.slide
        last_start = timestamp - (timestamp - self.offset) % slide
        return [TimeWindow(start, start + size) for start in range(last_start, timestamp - size, -slide)]

    def is_event_time(self) -> bool:
        return self._EVENT_TIME

    def get_default_trigger(self, env: Any = None) -> Trigger[Any, TimeWindow]:
        return EventTimeTrigger() if self._EVENT_TIME else ProcessingTimeTrigger()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.size}, {self.slide}, {self.offset})"


class SlidingEventTimeWindows(_SlidingWindows):
    """Sliding windows by the records' event timestamps.

    ``key_by(...).window(SlidingEventTimeWindows.of(Time.minutes(1), Time.seconds(10)))``.
    """

    @staticmethod
    def of(size: Any, slide: Any, offset: Any = None) -> SlidingEventTimeWindows:
        """Event-time windows of ``size`` starting every ``slide`` (a record falls in size/slide of them),
        aligned to the epoch plus ``offset``."""
        return SlidingEventTimeWindows(size, slide, offset)

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssigner.WindowAssignerContext
    ) -> list[TimeWindow]:
        if timestamp is None or timestamp <= MIN_TIMESTAMP:
            raise _no_timestamp_error(self)
        return self._windows_of(timestamp)


class SlidingProcessingTimeWindows(_SlidingWindows):
    """Sliding windows by the processing time at which records arrive."""

    _EVENT_TIME = False

    @staticmethod
    def of(size: Any, slide: Any, offset: Any = None) -> SlidingProcessingTimeWindows:
        """Processing-time windows of ``size`` starting every ``slide``, aligned to the epoch plus
        ``offset``."""
        return SlidingProcessingTimeWindows(size, slide, offset)

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssigner.WindowAssignerContext
    ) -> list[TimeWindow]:
        return self._windows_of(context.get_current_processing_time())


class SessionWindowTimeGapExtractor(ABC):
    """Gives each record's session gap (dynamic session windows)."""

    @abstractmethod
    def extract(self, element: Any) -> int:
        """The session gap after ``element``, in milliseconds (> 0)."""


def _gap_function(extractor: SessionWindowTimeGapExtractor | Callable[[Any], Any]) -> Callable[[Any], Any]:
    if isinstance(extractor, SessionWindowTimeGapExtractor):
        return extractor.extract
    if callable(extractor):
        return extractor
    raise TypeError(
        f"a session gap extractor is a SessionWindowTimeGapExtractor or a callable, not {extractor!r}"
    )


class _SessionWindows(MergingWindowAssigner[Any, TimeWindow]):
    """A window ``[t, t + gap)`` per record; overlapping windows of a key merge into a session."""

    _EVENT_TIME = True

    def __init__(self, session_gap: Any = None, extractor: Any = None) -> None:
        self._extract: Callable[[Any], Any] | None = None
        if extractor is not None:
            self._extract = _gap_function(extractor)
            self._session_gap = 0
        else:
            self._session_gap = to_millis(session_gap, f"the gap of {type(self).__name__}")
            if self._session_gap <= 0:
                raise ValueError(f"{type(self).__name__} needs a gap > 0, got {self._session_gap}")

    @property
    def session_gap(self) -> int:
        """The gap in milliseconds (0 for a dynamic gap, which each record gives)."""
        return self._session_gap

    def _window_at(self, element: Any, timestamp: int) -> list[TimeWindow]:
        gap = self._session_gap
        if self._extract is not None:
            gap = to_millis(self._extract(element), "a dynamic session gap")
            if gap <= 0:
                raise ValueError(
                    f"a dynamic session gap must be > 0, the extractor gave {gap} for {element!r}"
                )
        return [TimeWindow(timestamp, timestamp + gap)]

    def merge_windows(
        self, windows: Iterable[TimeWindow], callback: MergingWindowAssigner.MergeCallback[TimeWindow]
    ) -> None:
        TimeWindow.merge_windows(windows, callback)

    def is_event_time(self) -> bool:
        return self._EVENT_TIME

    def get_default_trigger(self, env: Any = None) -> Trigger[Any, TimeWindow]:
        return EventTimeTrigger() if self._EVENT_TIME else ProcessingTimeTrigger()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({'dynamic' if self._extract is not None else self._session_gap})"


class EventTimeSessionWindows(_SessionWindows):
    """Sessions by event time: records of a key less than ``gap`` apart are one window.

    ``key_by(...).window(EventTimeSessionWindows.with_gap(Time.minutes(10)))``.
    """

    @staticmethod
    def with_gap(size: Any) -> EventTimeSessionWindows:
        """Event-time sessions: a key's records closer than ``size`` to each other fall in one window."""
        return EventTimeSessionWindows(size)

    @staticmethod
    def with_dynamic_gap(
        extractor: SessionWindowTimeGapExtractor | Callable[[Any], Any],
    ) -> DynamicEventTimeSessionWindows:
        """Event-time sessions whose gap is taken from each record by ``extractor`` (milliseconds)."""
        return DynamicEventTimeSessionWindows(extractor)

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssigner.WindowAssignerContext
    ) -> list[TimeWindow]:
        if timestamp is None or timestamp <= MIN_TIMESTAMP:
            raise _no_timestamp_error(self)
        return self._window_at(element, timestamp)


class DynamicEventTimeSessionWindows(EventTimeSessionWindows):
    """Event-time sessions whose gap each record gives (through an extractor)."""

    def __init__(self, session_window_time_gap_extractor: Any) -> None:
        super().__init__(extractor=session_window_time_gap_extractor)

    @staticmethod
    def with_dynamic_gap(
        extractor: SessionWindowTimeGapExtractor | Callable[[Any], Any],
    ) -> DynamicEventTimeSessionWindows:
        """Event-time sessions whose gap is taken from each record by ``extractor`` (milliseconds)."""
        return DynamicEventTimeSessionWindows(extractor)


class ProcessingTimeSessionWindows(_SessionWindows):
    """Sessions by processing time: a window ends ``gap`` after its key's last arrival."""

    _EVENT_TIME = False

    @staticmethod
    def with_gap(size: Any) -> ProcessingTimeSessionWindows:
        """Processing-time sessions: a key's records that arrive closer than ``size`` to each other fall in
        one window."""
        return ProcessingTimeSessionWindows(size)

    @staticmethod
    def with_dynamic_gap(
        extractor: SessionWindowTimeGapExtractor | Callable[[Any], Any],
    ) -> DynamicProcessingTimeSessionWindows:
        """Processing-time sessions whose gap is taken from each record by ``extractor`` (milliseconds)."""
        return DynamicProcessingTimeSessionWindows(extractor)

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssigner.WindowAssignerContext
    ) -> list[TimeWindow]:
        return self._window_at(element, context.get_current_processing_time())


class DynamicProcessingTimeSessionWindows(ProcessingTimeSessionWindows):
    """Processing-time sessions whose gap each record gives (through an extractor)."""

    def __init__(self, session_window_time_gap_extractor: Any) -> None:
        super().__init__(extractor=session_window_time_gap_extractor)

    @staticmethod
    def with_dynamic_gap(
        extractor: SessionWindowTimeGapExtractor | Callable[[Any], Any],
    ) -> DynamicProcessingTimeSessionWindows:
        """Processing-time sessions whose gap is taken from each record by ``extractor`` (milliseconds)."""
        return DynamicProcessingTimeSessionWindows(extractor)


class GlobalWindows(WindowAssigner[Any, GlobalWindow]):
    """Every record of a key in one window, which never fires unless a trigger is set."""

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssigner.WindowAssignerContext
    ) -> list[GlobalWindow]:
        return [_GLOBAL_WINDOW]

    @staticmethod
    def create() -> GlobalWindows:
        """One window per key that never ends: give it a trigger (``CountTrigger``, say), or it never
        fires."""
        return GlobalWindows()

    def get_default_trigger(self, env: Any = None) -> Trigger[Any, GlobalWindow]:
        return NeverTrigger()

    def is_event_time(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "GlobalWindows()"


class CountTumblingWindowAssigner(WindowAssigner[Any, CountWindow]):
    """Windows of ``window_size`` records per key (``KeyedStream.count_window(size)``): the
    key's record count is keyed state, so windows continue across restores."""

    def __init__(self, window_size: int) -> None:
        if window_size <= 0:
            raise ValueError(f"a count window needs a size > 0, got {window_size}")
        self._window_size = window_size
        self._count_descriptor = ValueStateDescriptor("tumble-count-assigner")

    @staticmethod
    def of(window_size: int) -> CountTumblingWindowAssigner:
        """Back-to-back windows of ``window_size`` records of a key (``count_window(size)``)."""
        return CountTumblingWindowAssigner(window_size)

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssigner.WindowAssignerContext
    ) -> list[CountWindow]:
        count_state = context.get_runtime_context().get_state(self._count_descriptor)
        count = count_state.value() or 0
        count_state.update(count + 1)
        return [CountWindow(count // self._window_size)]

    def get_default_trigger(self, env: Any = None) -> Trigger[Any, Any]:
        return PurgingTrigger(CountTrigger(self._window_size))

    def is_event_time(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"CountTumblingWindowAssigner({self._window_size})"


class CountSlidingWindowAssigner(WindowAssigner[Any, CountWindow]):
    """Windows of ``window_size`` records per key, one starting every ``window_slide``
    records (``KeyedStream.count_window(size, slide)``)."""

    def __init__(self, window_size: int, window_slide: int) -> None:
        if window_size <= 0 or window_slide <= 0:
            raise ValueError(
                f"a sliding count window needs size > 0 and slide > 0, got {window_size}, {window_slide}"
            )
        self._window_size = window_size
        self._window_slide = window_slide
        self._count_descriptor = ValueStateDescriptor("slide-count-assigner")

    @staticmethod
    def of(window_size: int, window_slide: int) -> CountSlidingWindowAssigner:
        """Windows of the last ``window_size`` records of a key, one every ``window_slide`` records
        (``count_window(size, slide)``)."""
        return CountSlidingWindowAssigner(window_size, window_slide)

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssigner.WindowAssignerContext
    ) -> list[CountWindow]:
        count_state = context.get_runtime_context().get_state(self._count_descriptor)
        count = count_state.value() or 0
        count_state.update(count + 1)
        size, slide = self._window_size, self._window_slide
        last_id = count // slide
        windows = []
        # window ``i`` holds the records numbered [i * slide, i * slide + size)
        while last_id >= 0 and last_id * slide + size - 1 >= count:
            windows.append(CountWindow(last_id))
            last_id -= 1
        return windows

    def get_default_trigger(self, env: Any = None) -> Trigger[Any, Any]:
        return PurgingTrigger(CountTrigger(self._window_size))

    def is_event_time(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"CountSlidingWindowAssigner({self._window_size}, {self._window_slide})"
