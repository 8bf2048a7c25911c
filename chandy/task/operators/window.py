"""The window operator: ``KeyedStream.window(...)`` and ``DataStream.window_all(...)``.

Flink's ``WindowOperator``. Each record is put into windows by the assigner;
the contents of a pane (one key, one window) are keyed state *namespaced by the
window* (a reducing, aggregating or list state named ``window-contents``), as
is whatever the trigger keeps. The trigger's timers, and a cleanup timer at
``window.max_timestamp() + allowed_lateness`` (event time) or
``window.max_timestamp()`` (processing time), are registered with the key and
the window in an :class:`~chandy.task.timers.InternalTimerService`. All of it is
in the heap keyed state backend, so a checkpoint holds every open window and
timer and a restore (after rescaling, too) brings them back with their key group.

Lateness, as in Flink: a window is late once its cleanup time is at or below
the watermark; a record is not added to late windows, and a record every one of
whose windows was late (and whose own timestamp is late) goes to the late-data
side output, if one is set, else it is dropped. Within the allowed lateness a
record still joins its window, and the default trigger fires the window again.

Merging windows (sessions): a :class:`MergingWindowSet` per key, kept in keyed
state, maps each window the user sees to the window whose namespace holds its
contents; when windows merge their contents, trigger state and timers merge too.

Outputs carry ``window.max_timestamp()`` as their timestamp.

The fast path: tumbling or sliding event-time windows with the default trigger
and a bare ``reduce`` or ``aggregate`` (no window function) is by far the most
common window, and Flink's general machinery costs several Python calls per
record. For it the operator folds a whole batch in one loop, computing window
starts arithmetically and touching the state table directly (as
:class:`~chandy.task.operators.keyed.StreamGroupedReduce` does); a timer is
registered only when a pane is created, and a window's panes fire together
(:class:`PaneTimers`). Its panes and timers are still keyed state in the heap
backend (tables ``window-panes``, entries ``(key, window_start)``, and
``_timer_state/window-panes``), so they are checkpointed and rescaled like any
other; its results are those of the general path.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, cast

from chandy.core.functions import (
    AggregateFunction,
    Function,
    KeyedStateStore,
    ProcessAllWindowFunction,
    ProcessWindowFunction,
    RuntimeContext,
)
from chandy.core.output_tag import OutputTag
from chandy.core.state import (
    AggregatingState,
    AggregatingStateDescriptor,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    State,
    StateDescriptor,
    ValueState,
    ValueStateDescriptor,
)
from chandy.core.time import MAX_WATERMARK
from chandy.core.windows import (
    EventTimeTrigger,
    MergingWindowAssigner,
    SlidingEventTimeWindows,
    Trigger,
    TriggerResult,
    TumblingEventTimeWindows,
    Window,
    WindowAssigner,
)
from chandy.errors import InvalidProgramError
from chandy.state.heap import TIMER_STATE_PREFIX, HeapKeyedStateBackend, StateTable
from chandy.task.batches import KeyedBatch, TimestampedBatch
from chandy.task.operators.keyed import KeyedOperator
from chandy.task.processing_time import ProcessingTimeService
from chandy.task.timers import InternalTimer, InternalTimerService

#: The name of the state holding the windows' contents (Flink's ``window-contents``).
WINDOW_STATE_NAME = "window-contents"
#: The fast path's state: ``(key, window_start) -> accumulator`` per key group.
FAST_STATE_NAME = "window-panes"
#: The keyed state holding a key's merging window set (session windows).
MERGING_SET_STATE_NAME = "merging-window-set"
#: The name of the operator's timer service.
TIMER_SERVICE_NAME = "window-timers"

# Compared by identity per record (an enum's ``value`` is a slow property).
_CONTINUE, _FIRE, _PURGE, _FIRE_AND_PURGE = (
    TriggerResult.CONTINUE,
    TriggerResult.FIRE,
    TriggerResult.PURGE,
    TriggerResult.FIRE_AND_PURGE,
)


# ---------------------------------------------------------------------------------------------- functions


class InternalWindowFunction(ABC):
    """How a window's contents become outputs: the user's window function (or none), keyed
    or not (``window_all``), given the single value of a reduce/aggregate or every record."""

    #: True if ``process`` may yield ``(OutputTag, value)`` pairs for side outputs.
    has_side_outputs = False

    def __init__(self, user_function: Any = None) -> None:
        self.user_function = user_function

    def functions(self) -> list[Any]:
        """The user functions to open and close."""
        return [] if self.user_function is None else [self.user_function]

    @abstractmethod
    def process(
        self, key: Any, window: Window, context: WindowContext, contents: Any
    ) -> Iterable[Any] | None:
        """The outputs of one evaluation of ``window`` for ``key``."""

    def clear(self, window: Window, context: WindowContext) -> None:
        """The window is gone (its per-window state must go too)."""


class PassThroughWindowFunction(InternalWindowFunction):
    """``reduce(f)`` / ``aggregate(f)`` without a window function: the window's value itself."""

    def process(self, key: Any, window: Window, context: WindowContext, contents: Any) -> Iterable[Any]:
        return (contents,)


class ApplyWindowFunction(InternalWindowFunction):
    """A ``WindowFunction`` (``apply(key, window, inputs)``) or ``AllWindowFunction``
    (``apply(window, inputs)``), or a callable with the same arguments."""

    def __init__(self, user_function: Any, *, keyed: bool, single_value: bool) -> None:
        super().__init__(user_function)
        self._call: Callable[..., Any] = getattr(user_function, "apply", user_function)
        self._keyed = keyed
        self._single = single_value

    def process(
        self, key: Any, window: Window, context: WindowContext, contents: Any
    ) -> Iterable[Any] | None:
        inputs = (contents,) if self._single else contents
        if self._keyed:
            return cast("Iterable[Any] | None", self._call(key, window, inputs))
        return cast("Iterable[Any] | None", self._call(window, inputs))


class ProcessWindowFunctionCall(InternalWindowFunction):
    """A ``ProcessWindowFunction`` (``process(key, context, elements)``) or
    ``ProcessAllWindowFunction`` (``process(context, elements)``)."""

    has_side_outputs = True

    def __init__(self, user_function: Any, *, keyed: bool, single_value: bool) -> None:
        super().__init__(user_function)
        self._keyed = keyed
        self._single = single_value

    def process(
        self, key: Any, window: Window, context: WindowContext, contents: Any
    ) -> Iterable[Any] | None:
        elements = (contents,) if self._single else contents
        if self._keyed:
            return cast("Iterable[Any] | None", self.user_function.process(key, context, elements))
        return cast("Iterable[Any] | None", self.user_function.process(context, elements))

    def clear(self, window: Window, context: WindowContext) -> None:
        self.user_function.clear(context)


# ---------------------------------------------------------------------------------------------- contexts


def _namespaced(backend: HeapKeyedStateBackend, descriptor: StateDescriptor, window: Any) -> Any:
    state = backend.get_partitioned_state(descriptor, namespaced=True)
    state.set_current_namespace(window)  # type: ignore[attr-defined]
    return state


class _PerWindowStateStore(KeyedStateStore):
    """State of the current key *and window* (``ProcessWindowFunction.Context.window_state``)."""

    def __init__(self, backend: HeapKeyedStateBackend) -> None:
        self._backend = backend
        self.window: Any = None

    def _get(self, descriptor: StateDescriptor, kind: type) -> Any:
        state = _namespaced(self._backend, descriptor, self.window)
        if not isinstance(state, kind):
            raise InvalidProgramError(
                f"window state '{descriptor.name}' is {type(state).__name__}, not a {kind.__name__}"
            )
        return state

    def get_state(self, state_descriptor: ValueStateDescriptor) -> ValueState:
        return cast(ValueState, self._get(state_descriptor, ValueState))

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        return cast(ListState, self._get(state_descriptor, ListState))

    def get_map_state(self, state_descriptor: MapStateDescriptor) -> MapState:
        return cast(MapState, self._get(state_descriptor, MapState))

    def get_reducing_state(self, state_descriptor: ReducingStateDescriptor) -> ReducingState:
        return cast(ReducingState, self._get(state_descriptor, ReducingState))

    def get_aggregating_state(self, state_descriptor: AggregatingStateDescriptor) -> AggregatingState:
        return cast(AggregatingState, self._get(state_descriptor, AggregatingState))


class WindowContext(ProcessWindowFunction.Context[Any], ProcessAllWindowFunction.Context[Any]):
    """What a process window function sees: the window, time, per-window and per-key state."""

    def __init__(self, operator: WindowOperator) -> None:
        self._operator = operator
        self._window_store = _PerWindowStateStore(operator.backend)
        self._window: Any = None

    def set_window(self, window: Any) -> None:
        self._window = window
        self._window_store.window = window

    def window(self) -> Any:
        return self._window

    def current_processing_time(self) -> int:
        return self._operator.timer_service.current_processing_time()

    def current_watermark(self) -> int:
        return self._operator.timer_service.current_watermark()

    def window_state(self) -> KeyedStateStore:
        if self._operator.is_merging:
            # Flink refuses it too: the state of a window would be lost when it merges.
            raise InvalidProgramError(
                "per-window state is not available with merging windows (sessions); "
                "use global_state() or the window's contents"
            )
        return self._window_store

    def global_state(self) -> KeyedStateStore:
        runtime_context = self._operator.runtime_context
        assert runtime_context is not None
        return runtime_context


class _TriggerContext(Trigger.OnMergeContext):
    """The trigger's view of the current key and window: its timers and its state."""

    def __init__(self, operator: WindowOperator) -> None:
        self._operator = operator
        self._timers = operator.timer_service
        self._backend = operator.backend
        self.window: Any = None
        self.merged_windows: Collection[Any] = ()

    def get_current_processing_time(self) -> int:
        return self._timers.current_processing_time()

    def get_current_watermark(self) -> int:
        return self._timers.current_watermark()

    def register_processing_time_timer(self, time: int) -> None:
        self._timers.register_processing_time_timer(self.window, time)

    def register_event_time_timer(self, time: int) -> None:
        self._timers.register_event_time_timer(self.window, time)

    def delete_processing_time_timer(self, time: int) -> None:
        self._timers.delete_processing_time_timer(self.window, time)

    def delete_event_time_timer(self, time: int) -> None:
        self._timers.delete_event_time_timer(self.window, time)

    def get_partitioned_state(self, state_descriptor: StateDescriptor) -> State:
        return cast(State, _namespaced(self._backend, state_descriptor, self.window))

    def merge_partitioned_state(self, state_descriptor: StateDescriptor) -> None:
        if self.merged_windows:
            state = _namespaced(self._backend, state_descriptor, self.window)
            merge = getattr(state, "merge_namespaces", None)
            if merge is None:
                raise InvalidProgramError(
                    f"trigger state '{state_descriptor.name}' is {type(state).__name__}, which cannot "
                    "merge: a merging trigger keeps reducing, aggregating or list state"
                )
            merge(self.window, self.merged_windows)


class _AssignerContext(WindowAssigner.WindowAssignerContext):
    def __init__(self, operator: WindowOperator) -> None:
        self._operator = operator

    def get_current_processing_time(self) -> int:
        return self._operator.timer_service.current_processing_time()

    def get_runtime_context(self) -> RuntimeContext:
        runtime_context = self._operator.runtime_context
        assert runtime_context is not None
        return runtime_context


class _MergeCollector(MergingWindowAssigner.MergeCallback[Any]):
    def __init__(self) -> None:
        self.results: list[tuple[Any, set[Any]]] = []

    def merge(self, to_be_merged: Iterable[Any], merge_result: Any) -> None:
        self.results.append((merge_result, set(to_be_merged)))


class MergingWindowSet:
    """The windows of one key of a merging assigner, and where each keeps its contents.

    ``mapping[window] = state_window``: the window a user sees may have grown by
    merging, while its contents stay in the namespace of one of the windows it
    came from (so merging moves the contents of the others only). Flink's
    ``MergingWindowSet``, kept in keyed state and written back by :meth:`persist`
    only when it changed.
    """

    def __init__(self, assigner: MergingWindowAssigner[Any, Any], state: ValueState) -> None:
        self._assigner = assigner
        self._state = state
        stored = state.value()
        self.mapping: dict[Any, Any] = dict(stored) if stored else {}
        self._initial = dict(self.mapping)

    def persist(self) -> None:
        if self.mapping != self._initial:
            self._state.update(dict(self.mapping) if self.mapping else None)
            self._initial = dict(self.mapping)

    def get_state_window(self, window: Any) -> Any:
        return self.mapping.get(window)

    def retire_window(self, window: Any) -> None:
        if self.mapping.pop(window, None) is None:
            raise KeyError(f"window {window!r} is not in the set of windows in flight")

    def add_window(
        self, new_window: Any, merge: Callable[[Any, Collection[Any], Any, list[Any]], None]
    ) -> Any:
        """Add ``new_window``, merging it (and others) as the assigner says; returns the
        window ``new_window`` ended up in. ``merge(result, merged_windows,
        state_window, merged_state_windows)`` is called for every merge, before the
        state windows of ``merged_windows`` are dropped from the set."""
        collector = _MergeCollector()
        self._assigner.merge_windows([*self.mapping, new_window], collector)
        result_window = new_window
        merged_new_window = False
        for merge_result, merged_windows in collector.results:
            if new_window in merged_windows:
                merged_new_window = True
                merged_windows.discard(new_window)
                result_window = merge_result
            # the contents stay in the namespace of one of the windows merged (any one)
            merged_state_window = self.mapping[next(iter(merged_windows))]
            merged_state_windows = [self.mapping.pop(w) for w in merged_windows if w in self.mapping]
            self.mapping[merge_result] = merged_state_window
            merged_state_windows.remove(merged_state_window)
            # a window merged into itself alone (the new one only extended nothing) needs no merge
            if merge_result not in merged_windows or len(merged_windows) != 1:
                merge(merge_result, merged_windows, merged_state_window, merged_state_windows)
        if not collector.results or (result_window == new_window and not merged_new_window):
            self.mapping.setdefault(result_window, result_window)
        return result_window


class PaneTimers:
    """The fast path's timers: one per pane, at its window's end (then at its cleanup time).

    A table in the keyed state backend holds them, ``{(timestamp, key, window_start):
    None}`` per key group, in the layout of the timer service's tables, so they are
    snapshotted, restored and rescaled with the panes. What differs is the firing order:
    all panes of a window end at the same timestamp, so beside the table an index maps
    each timestamp to its panes, and a heap orders the distinct timestamps. Firing a
    window is a walk over one list, instead of a heap pop, a timer object and a callback
    per pane. The index is rebuilt from the table when the operator opens (after a restore).
    """

    __slots__ = ("_table", "_maps", "_due", "_heap")

    def __init__(self, table: StateTable) -> None:
        self._table = table
        # Indexed only by key groups of this subtask: never None.
        self._maps = cast("list[dict[Any, None]]", table.maps)
        self._due: dict[int, list[tuple[int, Any, int]]] = {}
        self._heap: list[int] = []
        for kg, timers in table.key_group_maps():
            for timestamp, key, start in timers:
                self._index(timestamp, kg, key, start)

    def _index(self, timestamp: int, kg: int, key: Any, start: int) -> None:
        panes = self._due.get(timestamp)
        if panes is None:
            self._due[timestamp] = panes = []
            heapq.heappush(self._heap, timestamp)
        panes.append((kg, key, start))

    def register(self, kg: int, key: Any, start: int, timestamp: int) -> None:
        timers = self._maps[kg]
        timer = (timestamp, key, start)
        if timer not in timers:
            timers[timer] = None
            self._index(timestamp, kg, key, start)

    def register_new(self, panes: list[tuple[int, Any, int]], end_offset: int) -> None:
        """Timers at ``start + end_offset`` for ``(key_group, key, window_start)`` panes that
        were just created (so have none yet): the hot loop's batch of registrations."""
        maps, due = self._maps, self._due
        last_timestamp: int | None = None
        entries: list[tuple[int, Any, int]] = []
        for pane in panes:
            kg, key, start = pane
            timestamp = start + end_offset
            maps[kg][(timestamp, key, start)] = None
            if timestamp != last_timestamp:
                found = due.get(timestamp)
                if found is None:
                    due[timestamp] = found = []
                    heapq.heappush(self._heap, timestamp)
                entries, last_timestamp = found, timestamp
            entries.append(pane)

    def pop_due(self, up_to: int) -> Iterator[tuple[int, int, Any, int]]:
        """Remove and yield ``(timestamp, key_group, key, window_start)`` of every timer at or
        before ``up_to``, earliest first (timers registered meanwhile included)."""
        heap, due, maps = self._heap, self._due, self._maps
        while heap and heap[0] <= up_to:
            timestamp = heapq.heappop(heap)
            for kg, key, start in due.pop(timestamp):
                timers = maps[kg]
                timer = (timestamp, key, start)
                if timer in timers:
                    del timers[timer]
                    yield timestamp, kg, key, start

    def __len__(self) -> int:
        return len(self._table)


# ---------------------------------------------------------------------------------------------- operator


class WindowOperator(KeyedOperator):
    """Flink's ``WindowOperator`` (see the module docstring)."""

    def __init__(
        self,
        assigner: WindowAssigner[Any, Any],
        trigger: Trigger[Any, Any],
        window_state_descriptor: StateDescriptor,
        window_function: InternalWindowFunction,
        *,
        allowed_lateness: int = 0,
        late_data_output_tag: OutputTag | None = None,
        functions: Iterable[Any] = (),
    ) -> None:
        super().__init__(window_function)
        if allowed_lateness < 0:
            raise InvalidProgramError(f"allowed lateness must be >= 0 ms, got {allowed_lateness}")
        if isinstance(assigner, MergingWindowAssigner) and not trigger.can_merge():
            raise InvalidProgramError(
                f"{assigner!r} merges windows, but {type(trigger).__name__} cannot merge: "
                "use a trigger whose can_merge() is True"
            )
        self.assigner = assigner
        self.trigger = trigger
        self.window_state_descriptor = window_state_descriptor
        self.window_function = window_function
        self.allowed_lateness = allowed_lateness
        self.late_data_output_tag = late_data_output_tag
        self._functions = [*functions, *window_function.functions()]
        self._is_event_time = assigner.is_event_time()
        self._merging = isinstance(assigner, MergingWindowAssigner)
        self.is_merging = self._merging
        #: Outputs and their timestamps, collected until the batch (or watermark) is done.
        self._out_values: list[Any] = []
        self._out_timestamps: list[int | None] = []
        self._fast = (
            type(assigner) in (TumblingEventTimeWindows, SlidingEventTimeWindows)
            and type(trigger) is EventTimeTrigger
            and type(window_function) is PassThroughWindowFunction
            and isinstance(window_state_descriptor, (ReducingStateDescriptor, AggregatingStateDescriptor))
        )

    @property
    def timer_service(self) -> InternalTimerService:
        return self._timer_service

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        super().open()
        runtime_context = self.runtime_context
        assert runtime_context is not None
        for function in self._functions:
            if isinstance(function, Function):
                function.open(runtime_context)
        backend = self.backend
        if self.processing_time_service is None:
            self.processing_time_service = ProcessingTimeService()
        self._timer_service = InternalTimerService(
            TIMER_SERVICE_NAME, backend, self.processing_time_service, self
        )
        if self._fast:
            self._open_fast_path()
        else:
            self._window_state = cast(
                Any, backend.get_partitioned_state(self.window_state_descriptor, namespaced=True)
            )
            self._trigger_context = _TriggerContext(self)
            self._window_context = WindowContext(self)
            self._assigner_context = _AssignerContext(self)
            if self._merging:
                self._merging_state = cast(
                    ValueState, backend.get_partitioned_state(ValueStateDescriptor(MERGING_SET_STATE_NAME))
                )

    def close(self) -> None:
        for function in self._functions:
            if isinstance(function, Function):
                function.close()
        super().close()

    # ------------------------------------------------------------------ time

    def _cleanup_time(self, window: Window) -> int:
        """When a window's state goes: its end plus the allowed lateness (event time), its
        end (processing time); never for a window that ends at the end of time."""
        max_timestamp = window.max_timestamp()
        if not self._is_event_time:
            return max_timestamp
        return min(max_timestamp + self.allowed_lateness, MAX_WATERMARK)

    def _is_window_late(self, window: Window) -> bool:
        return self._is_event_time and self._cleanup_time(window) <= self._timer_service.current_watermark()

    def process_watermark(self, timestamp: int) -> None:
        self.current_watermark = timestamp
        self._timer_service.advance_watermark(timestamp)
        if self._fast:
            self._fire_fast(timestamp)
        self._flush()
        self.emit_watermark(timestamp)

    # ------------------------------------------------------------------ output

    def _flush(self) -> None:
        if self._out_values:
            values, timestamps = self._out_values, self._out_timestamps
            self._out_values, self._out_timestamps = [], []
            self.output(TimestampedBatch(values, timestamps))

    def _emit_late(self, values: list[Any], timestamps: list[int | None]) -> None:
        tag = self.late_data_output_tag
        late_output = None if tag is None else self.side_outputs.get(tag.tag_id)
        if values and late_output is not None:
            late_output(TimestampedBatch(values, timestamps))

    def _emit_window_contents(self, key: Any, window: Window, contents: Any) -> None:
        context = self._window_context
        context.set_window(window)
        produced = self.window_function.process(key, window, context, contents)
        if produced is None:
            return
        timestamp = window.max_timestamp()
        values, timestamps = self._out_values, self._out_timestamps
        if not self.window_function.has_side_outputs:
            for value in produced:
                values.append(value)
                timestamps.append(timestamp)
            return
        for value in produced:
            if type(value) is tuple and len(value) == 2 and isinstance(value[0], OutputTag):
                side = self.side_outputs.get(value[0].tag_id)
                if side is not None:
                    side(TimestampedBatch([value[1]], [timestamp]))
            else:
                values.append(value)
                timestamps.append(timestamp)

    # ------------------------------------------------------------------ the general path

    def process_batch(self, records: KeyedBatch) -> None:  # type: ignore[override]
        if self._fast:
            self._process_fast(records)
        else:
            self._process_general(records)
        self._flush()

    def _process_general(self, records: KeyedBatch) -> None:
        backend = self.backend
        assign = self.assigner.assign_windows
        assigner_context = self._assigner_context
        timestamps = records.timestamps
        if timestamps is None:
            timestamps = [None] * len(records.values)
        late_values: list[Any] = []
        late_timestamps: list[int | None] = []
        watermark = self._timer_service.current_watermark
        add = self._add_merging if self._merging else self._add
        for kg, key, value, timestamp in zip(
            records.key_groups, records.keys, records.values, timestamps, strict=True
        ):
            backend.current_key = key
            backend.current_index = kg
            windows = assign(value, timestamp, assigner_context)
            if (
                not add(key, value, timestamp, windows)
                and self._is_event_time
                and timestamp is not None
                and timestamp + self.allowed_lateness <= watermark()
            ):
                late_values.append(value)
                late_timestamps.append(timestamp)
        self._emit_late(late_values, late_timestamps)

    def _on_element(self, key: Any, window: Any, state_window: Any, value: Any, timestamp: Any) -> None:
        """Add ``value`` to ``window`` (whose contents are in ``state_window``) and act on the trigger."""
        state = self._window_state
        state.set_current_namespace(state_window)
        state.add(value)
        trigger_context = self._trigger_context
        trigger_context.window = window
        result = self.trigger.on_element(value, timestamp, window, trigger_context)
        if result is not _CONTINUE:
            self._act(result, key, window, state)
        self._register_cleanup_timer(window)

    def _act(self, result: TriggerResult, key: Any, window: Any, state: Any) -> None:
        """What a trigger asked for: evaluate the window (if it has contents), drop them, or both."""
        if result is _FIRE or result is _FIRE_AND_PURGE:
            contents = state.get()
            if contents is not None:
                self._emit_window_contents(key, window, contents)
        if result is _PURGE or result is _FIRE_AND_PURGE:
            state.clear()

    def _add(self, key: Any, value: Any, timestamp: Any, windows: Collection[Any]) -> bool:
        """Put ``value`` into its (non-merging) windows; False if every one was late."""
        added = False
        for window in windows:
            if self._is_window_late(window):
                continue
            added = True
            self._on_element(key, window, window, value, timestamp)
        return added

    def _add_merging(self, key: Any, value: Any, timestamp: Any, windows: Collection[Any]) -> bool:
        merging_set = MergingWindowSet(
            cast(MergingWindowAssigner[Any, Any], self.assigner), self._merging_state
        )
        added = False
        for window in windows:
            actual = merging_set.add_window(window, self._merge_function)
            if self._is_window_late(actual):
                merging_set.retire_window(actual)
                continue
            added = True
            self._on_element(key, actual, merging_set.get_state_window(actual), value, timestamp)
        merging_set.persist()
        return added

    def _merge_function(
        self,
        merge_result: Any,
        merged_windows: Collection[Any],
        state_window: Any,
        merged_state_windows: list[Any],
    ) -> None:
        timer_service = self._timer_service
        if self._is_event_time and self._cleanup_time(merge_result) <= timer_service.current_watermark():
            raise InvalidProgramError(
                f"merging windows into {merge_result!r} would end an event-time window before the "
                f"current watermark ({timer_service.current_watermark()}): the assigner must not "
                "shrink windows"
            )
        if (
            not self._is_event_time
            and merge_result.max_timestamp() <= timer_service.current_processing_time()
        ):
            raise InvalidProgramError(
                f"merging windows into {merge_result!r} would end a processing-time window before "
                "the current processing time: the assigner must not shrink windows"
            )
        trigger_context = self._trigger_context
        trigger_context.window = merge_result
        trigger_context.merged_windows = merged_windows
        self.trigger.on_merge(merge_result, trigger_context)
        trigger_context.merged_windows = ()
        for merged in merged_windows:
            trigger_context.window = merged
            self.trigger.clear(merged, trigger_context)
            self._delete_cleanup_timer(merged)
        if merged_state_windows:
            self._window_state.merge_namespaces(state_window, merged_state_windows)

    def _register_cleanup_timer(self, window: Window) -> None:
        cleanup = self._cleanup_time(window)
        if cleanup == MAX_WATERMARK:
            return  # no timer at the end of time (Flink)
        if self._is_event_time:
            self._timer_service.register_event_time_timer(window, cleanup)
        else:
            self._timer_service.register_processing_time_timer(window, cleanup)

    def _delete_cleanup_timer(self, window: Window) -> None:
        cleanup = self._cleanup_time(window)
        if cleanup == MAX_WATERMARK:
            return
        if self._is_event_time:
            self._timer_service.delete_event_time_timer(window, cleanup)
        else:
            self._timer_service.delete_processing_time_timer(window, cleanup)

    def on_event_time(self, timer: InternalTimer) -> None:
        self._on_timer(timer, event_time=True)

    def on_processing_time(self, timer: InternalTimer) -> None:
        self._on_timer(timer, event_time=False)
        self._flush()  # outside of a watermark or a batch: nothing else will flush it

    def _on_timer(self, timer: InternalTimer, *, event_time: bool) -> None:
        window = timer.namespace
        state = self._window_state
        merging_set: MergingWindowSet | None = None
        if self._merging:
            merging_set = MergingWindowSet(
                cast(MergingWindowAssigner[Any, Any], self.assigner), self._merging_state
            )
            state_window = merging_set.get_state_window(window)
            if state_window is None:
                # a timer of a window merged away since (Flink: not deleted, ignored)
                return
            state.set_current_namespace(state_window)
        else:
            state.set_current_namespace(window)
        trigger_context = self._trigger_context
        trigger_context.window = window
        if event_time:
            result = self.trigger.on_event_time(timer.timestamp, window, trigger_context)
        else:
            result = self.trigger.on_processing_time(timer.timestamp, window, trigger_context)
        if result is not _CONTINUE:
            self._act(result, timer.key, window, state)
        if event_time == self._is_event_time and timer.timestamp == self._cleanup_time(window):
            self._clear_all_state(window, merging_set)
        if merging_set is not None:
            merging_set.persist()

    def _clear_all_state(self, window: Any, merging_set: MergingWindowSet | None) -> None:
        self._window_state.clear()
        trigger_context = self._trigger_context
        trigger_context.window = window
        self.trigger.clear(window, trigger_context)
        context = self._window_context
        context.set_window(window)
        self.window_function.clear(window, context)
        if merging_set is not None:
            merging_set.retire_window(window)

    # ------------------------------------------------------------------ the fast path

    def _open_fast_path(self) -> None:
        descriptor = self.window_state_descriptor
        assigner = cast(TumblingEventTimeWindows | SlidingEventTimeWindows, self.assigner)
        self._size = assigner.size
        self._slide = assigner.slide
        self._offset = assigner.offset
        if isinstance(descriptor, ReducingStateDescriptor):
            self._reduce: Callable[[Any, Any], Any] | None = descriptor.reduce_function
            self._aggregate: AggregateFunction | None = None
            fast_descriptor: StateDescriptor = ReducingStateDescriptor(
                FAST_STATE_NAME, descriptor.reduce_function
            )
        else:
            assert isinstance(descriptor, AggregatingStateDescriptor)
            self._reduce = None
            self._aggregate = descriptor.agg_function
            fast_descriptor = AggregatingStateDescriptor(FAST_STATE_NAME, descriptor.agg_function)
        self.backend.get_partitioned_state(fast_descriptor, namespaced=True)
        self._table = self.backend.tables[FAST_STATE_NAME]
        # Indexed only by the key groups of this subtask's records, which are in range: never None.
        self._maps = cast("list[dict[Any, Any]]", self._table.maps)
        self._pane_timers = PaneTimers(self.backend.get_timer_table(f"{TIMER_STATE_PREFIX}{FAST_STATE_NAME}"))

    def _no_timestamps(self) -> InvalidProgramError:
        return InvalidProgramError(
            f"{self.assigner!r} windows by event time, but records arrive without timestamps: call "
            "data_stream.assign_timestamps_and_watermarks(...) before the window (or use a "
            "processing-time assigner)"
        )

    def _process_fast(self, records: KeyedBatch) -> None:
        timestamps = records.timestamps
        if timestamps is None:
            if not records.values:
                return
            raise self._no_timestamps()
        try:
            if self._reduce is not None and self._slide == self._size and self._table.cow is None:
                self._fast_tumbling_reduce(records, timestamps)
            else:
                self._fast_general(records, timestamps)
        except TypeError:
            if None in timestamps:
                raise self._no_timestamps() from None
            raise

    def _fast_tumbling_reduce(self, records: KeyedBatch, timestamps: list[Any]) -> None:
        """The hottest loop: one window per record, a reduce, no snapshot in flight."""
        size, offset = self._size, self._offset
        # a window starting at or before this has ended (the watermark passed its max timestamp)
        ended_bound = self._timer_service.current_watermark() - size + 1
        maps = self._maps
        reduce = cast("Callable[[Any, Any], Any]", self._reduce)
        new_panes: list[tuple[int, Any, int]] = []
        created = new_panes.append
        first = min(timestamps)  # a TypeError for a missing timestamp: the caller names the fix
        start = first - (first - offset) % size
        if start > ended_bound and max(timestamps) < start + size:
            # The whole batch falls into one open window (the common case: a batch spans
            # milliseconds of event time, a window seconds): no window arithmetic per record.
            for kg, key, value in zip(records.key_groups, records.keys, records.values, strict=True):
                m = maps[kg]
                k = (key, start)
                old = m.get(k)
                if old is None:
                    m[k] = value
                    created((kg, key, start))
                else:
                    m[k] = reduce(old, value)
            if new_panes:
                self._pane_timers.register_new(new_panes, size - 1)
            return
        late_values: list[Any] = []
        late_timestamps: list[int | None] = []
        for kg, key, value, ts in zip(
            records.key_groups, records.keys, records.values, timestamps, strict=True
        ):
            start = ts - (ts - offset) % size
            if start <= ended_bound:  # rare: late, or within the allowed lateness
                if not self._fast_after_end(kg, key, value, start, ended_bound):
                    late_values.append(value)
                    late_timestamps.append(ts)
                continue
            m = maps[kg]
            k = (key, start)
            old = m.get(k)
            if old is None:
                m[k] = value
                created((kg, key, start))
            else:
                m[k] = reduce(old, value)
        if new_panes:
            self._pane_timers.register_new(new_panes, size - 1)
        self._emit_late(late_values, late_timestamps)

    def _fast_after_end(self, kg: int, key: Any, value: Any, start: int, ended_bound: int) -> bool:
        """A record for the ended window at ``start``: False if the window is late (past its
        cleanup), else add it and fire the window again (what EventTimeTrigger does)."""
        if start <= ended_bound - self.allowed_lateness:
            return False
        m = self._maps[kg]
        k = (key, start)
        old = m.get(k) if self._table.cow is None else self._table.privatize(m, k)
        max_timestamp = start + self._size - 1
        if old is None:
            self._pane_timers.register(kg, key, start, max_timestamp + self.allowed_lateness)
        aggregate = self._aggregate
        if aggregate is None:
            m[k] = new = value if old is None else cast("Callable[[Any, Any], Any]", self._reduce)(old, value)
            self._out_values.append(new)
        else:
            m[k] = new = aggregate.add(value, aggregate.create_accumulator() if old is None else old)
            self._out_values.append(aggregate.get_result(new))
        self._out_timestamps.append(max_timestamp)
        return True

    def _fast_general(self, records: KeyedBatch, timestamps: list[Any]) -> None:
        """Tumbling or sliding, reduce or aggregate, with or without a snapshot in flight."""
        size, slide, offset, lateness = self._size, self._slide, self._offset, self.allowed_lateness
        watermark = self._timer_service.current_watermark()
        ended_bound = watermark - size + 1
        maps = self._maps
        reduce = self._reduce
        aggregate: Any = self._aggregate
        table = self._table
        privatize = table.privatize if table.cow is not None else None
        new_panes: list[tuple[int, Any, int]] = []
        created = new_panes.append
        late_values: list[Any] = []
        late_timestamps: list[int | None] = []
        for kg, key, value, ts in zip(
            records.key_groups, records.keys, records.values, timestamps, strict=True
        ):
            added = False
            m = maps[kg]
            # the windows from the latest start down
            for start in range(ts - (ts - offset) % slide, ts - size, -slide):
                if start <= ended_bound:
                    if not self._fast_after_end(kg, key, value, start, ended_bound):
                        break  # late, and so is every earlier window
                    added = True
                    continue
                added = True
                k = (key, start)
                old = m.get(k) if privatize is None else privatize(m, k)
                if old is None:
                    created((kg, key, start))
                if reduce is not None:
                    m[k] = value if old is None else reduce(old, value)
                else:
                    m[k] = aggregate.add(value, aggregate.create_accumulator() if old is None else old)
            if not added and ts + lateness <= watermark:
                late_values.append(value)
                late_timestamps.append(ts)
        if new_panes:
            self._pane_timers.register_new(new_panes, size - 1)
        self._emit_late(late_values, late_timestamps)

    def _fire_fast(self, watermark: int) -> None:
        """Emit every pane whose window ended at or before ``watermark``; drop those whose
        cleanup time came (the same moment unless there is an allowed lateness)."""
        maps, size, lateness, aggregate = self._maps, self._size, self.allowed_lateness, self._aggregate
        out_values, out_timestamps = self._out_values, self._out_timestamps
        register = self._pane_timers.register
        for timestamp, kg, key, start in self._pane_timers.pop_due(watermark):
            max_timestamp = start + size - 1
            if timestamp == max_timestamp:
                acc = maps[kg].get((key, start))
                if acc is not None:
                    out_values.append(acc if aggregate is None else aggregate.get_result(acc))
                    out_timestamps.append(max_timestamp)
                if lateness:
                    register(kg, key, start, min(max_timestamp + lateness, MAX_WATERMARK))
                    continue
            maps[kg].pop((key, start), None)

    def num_timers(self) -> int:
        """How many timers this subtask holds (for tests and metrics)."""
        service = self._timer_service
        pending = service.num_event_time_timers() + service.num_processing_time_timers()
        return pending + (len(self._pane_timers) if self._fast else 0)

    def num_panes(self) -> int:
        """How many (key, window) panes this subtask holds (for tests and metrics)."""
        if self._fast:
            return len(self._table)
        return self.backend.num_keys(WINDOW_STATE_NAME)
