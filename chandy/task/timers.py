"""Timers of keyed operators: event time and processing time, per key and namespace.

Flink's ``InternalTimerServiceImpl``. A timer is ``(timestamp, key, namespace)``:
the namespace is ``None`` for a process function's timers and the window for a
window operator's. Registering the same timer twice keeps one.

Where timers live: in the keyed state backend, as two tables per service
(``_timer_state/event_<name>`` and ``_timer_state/processing_<name>``) whose
per-key-group dictionaries hold ``{(timestamp, key, namespace): None}``. The
tables are therefore snapshotted copy-on-write with the barrier, written per key
group, and restored after rescaling on the subtask that owns each timer's key
group, without any timer-specific checkpoint code. The tables are the truth;
the order of firing comes from a heap beside them, rebuilt from the tables when
the service is created (after a restore). Deleting a timer removes it from its
table only: the heap entry left behind is skipped when it surfaces, and the
heap is rebuilt once such entries outnumber the live timers, so a function that
moves a timeout timer on every record does not grow it without bound.

Event-time timers fire in :meth:`InternalTimerService.advance_watermark`, every
timer at or before the new watermark, in timestamp order. Processing-time timers
fire from the task's :class:`~chandy.task.processing_time.ProcessingTimeService`,
on the task thread between batches; only the earliest due time is registered
there, and the next one once it has fired (or sooner, if an earlier timer is
added). Before each callback the backend is pointed at the timer's key and key
group, so state handles and timers registered in the callback apply to that key.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

from chandy.core.time import MIN_TIMESTAMP
from chandy.state.heap import TIMER_STATE_PREFIX, HeapKeyedStateBackend, StateTable
from chandy.task.processing_time import ProcessingTimeService, ScheduledCallback


@dataclass(frozen=True, slots=True)
class InternalTimer:
    """A timer that fires: when, for which key, in which namespace."""

    timestamp: int
    key: Any
    namespace: Any  # None for process functions; a Window for window operators


class Triggerable(Protocol):
    """What a timer service calls back (the operator that owns it)."""

    def on_event_time(self, timer: InternalTimer) -> None: ...

    def on_processing_time(self, timer: InternalTimer) -> None: ...


#: A heap entry: (timestamp, registration sequence, key group, key, namespace). The
#: sequence breaks ties so that keys and namespaces are never compared.
_Entry = tuple[int, int, int, Any, Any]

#: What a timer table's ``pop`` returns for a timer that is not (any more) there.
_DELETED = object()

#: The heap is rebuilt from the tables once it holds this many more entries than live timers.
_COMPACT_SLACK = 64


class _TimerQueue:
    """One time domain's timers: the table (truth, snapshotted) and the firing order."""

    __slots__ = ("table", "maps", "heap", "_sequence", "size")

    def __init__(self, table: StateTable, sequence: Iterator[int]) -> None:
        self.table = table
        # Indexed only by key groups in the backend's range: never None.
        self.maps = cast("list[dict[Any, None]]", table.maps)
        self._sequence = sequence
        self.heap: list[_Entry] = []
        self.size = 0
        self.rebuild()

    def rebuild(self) -> None:
        """The heap anew from the table: after a restore, or to drop deleted entries."""
        heap: list[_Entry] = []
        sequence = self._sequence
        for kg, timers in self.table.key_group_maps():
            for timestamp, key, namespace in timers:
                heap.append((timestamp, next(sequence), kg, key, namespace))
        heapq.heapify(heap)
        self.heap = heap
        self.size = len(heap)

    def add(self, key_group: int, key: Any, namespace: Any, timestamp: int) -> bool:
        """Add a timer; False if it was already there."""
        timers = self.maps[key_group]
        timer = (timestamp, key, namespace)
        if timer in timers:
            return False
        timers[timer] = None
        heapq.heappush(self.heap, (timestamp, next(self._sequence), key_group, key, namespace))
        self.size += 1
        return True

    def remove(self, key_group: int, key: Any, namespace: Any, timestamp: int) -> None:
        timers = self.maps[key_group]
        timer = (timestamp, key, namespace)
        if timer in timers:
            del timers[timer]
            self.size -= 1
            if len(self.heap) > 2 * self.size + _COMPACT_SLACK:
                self.rebuild()

    def peek(self) -> int | None:
        """The earliest live timer's timestamp (dropping deleted entries on the way), or None."""
        heap = self.heap
        maps = self.maps
        while heap:
            timestamp, _, kg, key, namespace = heap[0]
            if (timestamp, key, namespace) in maps[kg]:
                return timestamp
            heapq.heappop(heap)
        return None


class InternalTimerService:
    """Event-time and processing-time timers of one operator (one per operator and ``name``)."""

    def __init__(
        self,
        name: str,
        backend: HeapKeyedStateBackend,
        processing_time_service: ProcessingTimeService,
        triggerable: Triggerable,
    ) -> None:
        self.name = name
        self._backend = backend
        self._processing_time_service = processing_time_service
        self._triggerable = triggerable
        sequence = itertools.count()
        event_table, processing_table = self.table_names(name)
        self._event = _TimerQueue(backend.get_timer_table(event_table), sequence)
        self._processing = _TimerQueue(backend.get_timer_table(processing_table), sequence)
        self._watermark = MIN_TIMESTAMP
        #: The callback registered with the processing-time service, and its due time.
        self._scheduled: ScheduledCallback | None = None
        self._schedule_next_processing_time()

    @staticmethod
    def table_names(name: str) -> tuple[str, str]:
        """The state tables of service ``name``'s event-time and processing-time timers."""
        return f"{TIMER_STATE_PREFIX}event_{name}", f"{TIMER_STATE_PREFIX}processing_{name}"

    @staticmethod
    def has_timers(backend: HeapKeyedStateBackend, name: str) -> bool:
        """True if ``backend`` holds (restored) timers of service ``name``: an operator that
        creates its service lazily must create it at once then. (A snapshot leaves out an
        empty table, so either table may have come back alone.)"""
        return any(table in backend.tables for table in InternalTimerService.table_names(name))

    # ------------------------------------------------------------------ queries

    def current_processing_time(self) -> int:
        return self._processing_time_service.get_current_processing_time()

    def current_watermark(self) -> int:
        return self._watermark

    def num_event_time_timers(self) -> int:
        return self._event.size

    def num_processing_time_timers(self) -> int:
        return self._processing.size

    # ------------------------------------------------------------------ registration

    def register_event_time_timer(self, namespace: Any, timestamp: int) -> None:
        """A timer for the backend's current key: fires once the watermark reaches ``timestamp``."""
        b = self._backend
        self._event.add(b.current_index, b.current_key, namespace, timestamp)

    def delete_event_time_timer(self, namespace: Any, timestamp: int) -> None:
        b = self._backend
        self._event.remove(b.current_index, b.current_key, namespace, timestamp)

    def register_processing_time_timer(self, namespace: Any, timestamp: int) -> None:
        """A timer for the backend's current key: fires once processing time reaches ``timestamp``."""
        b = self._backend
        if self._processing.add(b.current_index, b.current_key, namespace, timestamp):
            scheduled = self._scheduled
            if scheduled is None or timestamp < scheduled.timestamp:
                self._schedule_next_processing_time()

    def delete_processing_time_timer(self, namespace: Any, timestamp: int) -> None:
        # The callback registered for it stays: when it runs it finds nothing due and
        # registers the next one (as Flink does).
        b = self._backend
        self._processing.remove(b.current_index, b.current_key, namespace, timestamp)

    # ------------------------------------------------------------------ firing

    def advance_watermark(self, timestamp: int) -> None:
        """Fire every event-time timer at or before ``timestamp``, earliest first
        (including timers the callbacks register at or before it)."""
        self._watermark = timestamp
        self._fire(self._event, timestamp, self._triggerable.on_event_time)

    def _on_processing_time(self, time: int) -> None:
        """The processing-time service's callback: fire every timer due at ``time``,
        then register the next due time."""
        self._scheduled = None
        self._fire(self._processing, time, self._triggerable.on_processing_time)
        self._schedule_next_processing_time()

    def _fire(self, queue: _TimerQueue, up_to: int, callback: Callable[[InternalTimer], None]) -> None:
        """Fire ``queue``'s timers due at ``up_to``, earliest first (its peek and pop, inlined:
        this loop runs once per timer)."""
        b = self._backend
        maps = queue.maps
        heappop = heapq.heappop
        while True:
            heap = queue.heap  # a callback's deletion may rebuild it
            if not heap or heap[0][0] > up_to:
                return
            timestamp, _, kg, key, namespace = heappop(heap)
            if maps[kg].pop((timestamp, key, namespace), _DELETED) is _DELETED:
                continue  # deleted after it was registered
            queue.size -= 1
            b.current_key = key
            b.current_index = kg
            callback(InternalTimer(timestamp, key, namespace))

    def _schedule_next_processing_time(self) -> None:
        """Register the earliest processing-time timer with the service (replacing what was)."""
        due = self._processing.peek()
        scheduled = self._scheduled
        if scheduled is not None:
            if due is not None and scheduled.timestamp <= due:
                return
            scheduled.cancel()
            self._scheduled = None
        if due is not None:
            self._scheduled = self._processing_time_service.register_timer(due, self._on_processing_time)
