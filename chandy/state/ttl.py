"""State time-to-live on the heap backend: Flink's TTL state decorators.

A descriptor with an enabled :class:`~chandy.core.state.StateTtlConfig` gets one of
the handles below instead of the plain ones, and its table a kind of its own
(``"ttl value"``, ...). State without TTL therefore runs exactly the code it ran
before TTL existed: the choice is made once, when the handle is created, and
nothing on the plain handles' path checks for TTL.

What is stored (Flink's ``TtlValue``): a value, reducing or aggregating state
keeps ``(user value, last access timestamp)``; a list state keeps such a pair per
element and a map state per entry, so each element and entry expires on its
own. A pair whose timestamp plus the TTL is at or before now is expired. Time is
processing time from the backend's clock (the task's, so tests drive it with a
``ManualClock``).

Expired values go away three ways, as in Flink: the read that finds one removes
it (and returns it once with ``ReturnExpiredIfNotCleanedUp``); incremental cleanup
checks a few entries of the state, round-robin over every key, on each access
(and, if asked, for every record); and a snapshot never writes one
(:meth:`HeapKeyedStateBackend.snapshot` filters with :func:`expiry_filter`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from chandy.core.state import State, StateDescriptor, StateTtlConfig
from chandy.state.heap import (
    NAMESPACED,
    HeapAggregatingState,
    HeapKeyedStateBackend,
    HeapListState,
    HeapMapState,
    HeapReducingState,
    HeapValueState,
    StateTable,
    _HeapState,
    _Namespaced,
)

#: The kind of a table with TTL is this prefix and the kind of its values ("ttl value").
TTL = "ttl "

#: ``(stored, now) -> stored without its expired parts``: the same object if nothing
#: expired, a new one if some of it did, ``None`` if all of it did.
Expiry = Callable[[Any, int], Any]


def expiry_filter(kind: str, ttl_ms: int) -> Expiry:
    """How to drop the expired parts of a value of a TTL table of ``kind``."""
    base = kind.removeprefix(NAMESPACED).removeprefix(TTL)

    def pair(stored: tuple[Any, int], now: int) -> Any:
        return None if stored[1] + ttl_ms <= now else stored

    def elements(stored: list[tuple[Any, int]], now: int) -> Any:
        live = [e for e in stored if e[1] + ttl_ms > now]
        return stored if len(live) == len(stored) else live or None

    def entries(stored: dict[Any, tuple[Any, int]], now: int) -> Any:
        live = {k: e for k, e in stored.items() if e[1] + ttl_ms > now}
        return stored if len(live) == len(stored) else live or None

    filters: dict[str, Expiry] = {"list": elements, "map": entries}
    return filters.get(base, pair)


class IncrementalCleanup:
    """Flink's ``TtlIncrementalCleanup`` for one table: each :meth:`run` does up to ``size``
    steps, continuing where the previous run stopped, round-robin over every key group.

    A step checks one entry for expiry, or moves on to the next key group (listing its
    keys: a dictionary cannot be iterated while the task changes it, so a key written
    after its group was listed waits for the next round). Counting the moves as steps
    bounds every run, even over an almost empty table, to ``size`` steps.
    """

    __slots__ = ("_table", "_size", "_expire", "_now", "_key_group", "_map", "_keys")

    def __init__(self, table: StateTable, size: int, expire: Expiry, now: Callable[[], int]) -> None:
        self._table = table
        self._size = size
        self._expire = expire
        self._now = now
        self._key_group = table.key_group_range.end  # the first move wraps to the range's start
        self._map: dict[Any, Any] = {}
        self._keys: list[Any] = []

    def run(self) -> None:
        table = self._table
        keys = self._keys
        m = self._map
        now: int | None = None
        for _ in range(self._size):
            if not keys:
                kg = self._key_group + 1
                if kg > table.key_group_range.end:
                    kg = table.key_group_range.start
                self._key_group = kg
                m = self._map = table.maps[kg] or {}
                keys.extend(m)
                continue
            key = keys.pop()
            stored = m.get(key)
            if stored is None:
                continue  # removed since its group was listed
            if now is None:
                now = self._now()
            kept = self._expire(stored, now)
            if kept is stored:
                continue
            if kept is None:
                del m[key]
            else:
                # A new list or dict, but of the elements a snapshot in flight may share: the key
                # is not marked private, so the handle's next read copies it first.
                m[key] = kept


class _TtlState(_HeapState):
    """What every TTL handle knows: the TTL, the clock, and what the config asks for.

    Its fields live in the instance dictionary every handle has (the ``State`` ABCs
    declare no slots): slots here would clash with those of the reducing and
    aggregating handles.
    """

    def __init__(
        self,
        backend: HeapKeyedStateBackend,
        table: StateTable,
        descriptor: StateDescriptor,
        config: StateTtlConfig,
        now: Callable[[], int],
        cleanup: IncrementalCleanup | None,
    ) -> None:
        super().__init__(backend, table, descriptor)
        self._ttl = config.ttl_milliseconds()
        self._now = now
        self._update_on_read = config.get_update_type() is StateTtlConfig.UpdateType.OnReadAndWrite
        self._return_expired = (
            config.get_state_visibility() is StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp
        )
        self._cleanup = cleanup

    def _accessed(self) -> None:
        """Flink's access callback: a step of incremental cleanup on every state access."""
        cleanup = self._cleanup
        if cleanup is not None:
            cleanup.run()

    def _get_unexpired(self) -> Any:
        """The current key's user value, or ``None``: an expired pair is removed (and returned
        once if expired values are visible); a live one is re-stamped if reads refresh it
        (Flink's ``getWithTtlCheckAndUpdate``)."""
        self._accessed()
        stored = self._read()
        if stored is None:
            return None
        now = self._now()
        if stored[1] + self._ttl <= now:
            self.clear()
            return stored[0] if self._return_expired else None
        if self._update_on_read:
            self._write((stored[0], now))
        return stored[0]

    def _previous(self, now: int) -> Any:
        """The user value a write folds into: an expired one counts as absent unless expired
        values are visible (Flink's ``TtlReduceFunction``/``TtlAggregateFunction``)."""
        stored = self._read()
        if stored is None or (not self._return_expired and stored[1] + self._ttl <= now):
            return None
        return stored[0]


class HeapTtlValueState(_TtlState, HeapValueState):
    __slots__ = ()

    def value(self) -> Any:
        return self._get_unexpired()

    def update(self, value: Any) -> None:
        self._accessed()
        if value is None:
            self.clear()
        else:
            self._write((value, self._now()))


class HeapTtlReducingState(_TtlState, HeapReducingState):
    __slots__ = ()

    def get(self) -> Any:
        return self._get_unexpired()

    def add(self, value: Any) -> None:
        self._accessed()
        now = self._now()
        old = self._previous(now)
        self._write((value if old is None else self._reduce(old, value), now))


class HeapTtlAggregatingState(_TtlState, HeapAggregatingState):
    __slots__ = ()

    def get(self) -> Any:
        acc = self._get_unexpired()
        return None if acc is None else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        self._accessed()
        now = self._now()
        acc = self._previous(now)
        if acc is None:
            acc = self._agg.create_accumulator()
        self._write((self._agg.add(value, acc), now))


class HeapTtlListState(_TtlState, HeapListState):
    """Every element carries its own timestamp and expires on its own (Flink's ``TtlListState``)."""

    __slots__ = ()

    def get(self) -> Iterable[Any]:
        self._accessed()
        stored = self._read()
        if not stored:
            return ()
        now = self._now()
        ttl = self._ttl
        live = [e for e in stored if e[1] + ttl > now]
        result = tuple(e[0] for e in (stored if self._return_expired else live))
        if not live:
            self.clear()
        elif self._update_on_read:
            self._write([(e[0], now) for e in live])
        elif len(live) < len(stored):
            self._write(live)
        return result

    def add(self, value: Any) -> None:
        self._accessed()
        if value is None:
            raise ValueError("ListState.add(None): None cannot be stored in a list state")
        super().add((value, self._now()))

    def add_all(self, values: Iterable[Any]) -> None:
        self._accessed()
        items = list(values)
        if any(v is None for v in items):
            raise ValueError("ListState.add_all: None cannot be stored in a list state")
        now = self._now()
        super().add_all([(v, now) for v in items])

    def update(self, values: Iterable[Any]) -> None:
        self._accessed()
        items = list(values) if values is not None else []
        if any(v is None for v in items):
            raise ValueError("ListState.update: None cannot be stored in a list state")
        now = self._now()
        super().update([(v, now) for v in items])


class HeapTtlMapState(_TtlState, HeapMapState):
    """Every entry carries its own timestamp and expires on its own (Flink's ``TtlMapState``)."""

    __slots__ = ()

    def _entry(self, key: Any) -> tuple[Any, int] | None:
        """The entry of ``key`` if visible: an expired one is removed (and visible once if
        expired values are), a live one re-stamped if reads refresh it."""
        self._accessed()
        d = self._read()
        entry: tuple[Any, int] | None = None if d is None else d.get(key)
        if entry is None:
            return None
        now = self._now()
        if entry[1] + self._ttl <= now:
            assert d is not None
            del d[key]
            if not d:
                self.clear()
            return entry if self._return_expired else None
        if self._update_on_read:
            assert d is not None
            d[key] = (entry[0], now)
        return entry

    def get(self, key: Any) -> Any:
        entry = self._entry(key)
        return None if entry is None else entry[0]

    def contains(self, key: Any) -> bool:
        return self._entry(key) is not None

    def put(self, key: Any, value: Any) -> None:
        self._accessed()
        super().put(key, (value, self._now()))

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        self._accessed()
        now = self._now()
        super().put_all({k: (v, now) for k, v in dict_value.items()})

    def remove(self, key: Any) -> None:
        self._accessed()
        super().remove(key)

    def _visible_entries(self) -> list[tuple[Any, Any]]:
        """``(key, user value)`` of every visible entry, removing the expired ones and
        re-stamping the live ones if reads refresh them (Flink's entries iterator)."""
        self._accessed()
        d = self._read()
        if not d:
            return []
        now = self._now()
        ttl = self._ttl
        live = {k: e for k, e in d.items() if e[1] + ttl > now}
        shown = d if self._return_expired else live
        result = [(k, e[0]) for k, e in shown.items()]
        if not live:
            self.clear()
        elif self._update_on_read:
            self._write({k: (e[0], now) for k, e in live.items()})
        elif len(live) < len(d):
            self._write(live)
        return result

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._visible_entries())

    def keys(self) -> Iterator[Any]:
        return iter([k for k, _ in self._visible_entries()])

    def values(self) -> Iterator[Any]:
        return iter([v for _, v in self._visible_entries()])

    def is_empty(self) -> bool:
        return not self._visible_entries()


# Per-window state (``ProcessWindowFunction.Context.window_state``) with TTL. Chandy, as
# Flink, refuses per-window state with merging windows, so these never merge namespaces.


class HeapTtlNamespacedValueState(_Namespaced, HeapTtlValueState):
    __slots__ = ()


class HeapTtlNamespacedListState(_Namespaced, HeapTtlListState):
    __slots__ = ()


class HeapTtlNamespacedMapState(_Namespaced, HeapTtlMapState):
    __slots__ = ()


class HeapTtlNamespacedReducingState(_Namespaced, HeapTtlReducingState):
    __slots__ = ()


class HeapTtlNamespacedAggregatingState(_Namespaced, HeapTtlAggregatingState):
    __slots__ = ()


def ttl_state(
    backend: HeapKeyedStateBackend,
    descriptor: StateDescriptor,
    config: StateTtlConfig,
    kind: str,
    handle_type: type,
    namespaced: bool,
) -> State:
    """The TTL handle of ``descriptor`` (``kind`` and ``handle_type`` are those it has
    without TTL), created on first request with its table's expiry and cleanup."""
    ttl_type, namespaced_ttl_type = TTL_HANDLES[handle_type]
    if namespaced:
        kind, ttl_type = NAMESPACED + TTL + kind, namespaced_ttl_type
    else:
        kind = TTL + kind
    table = backend._table(descriptor.name, kind)
    existing = backend._handles.get(descriptor.name)
    if existing is not None:
        return existing
    backend.declare_type(table, descriptor)
    expire = expiry_filter(kind, config.ttl_milliseconds())
    table.expire = expire
    now = backend.clock.now_ms
    cleanup: IncrementalCleanup | None = None
    strategy = config.get_cleanup_strategies().get_incremental_cleanup_strategy()
    if strategy is not None:
        cleanup = IncrementalCleanup(table, strategy.get_cleanup_size(), expire, now)
        if strategy.run_cleanup_for_every_record():
            KeySelectionListeners.add(backend, cleanup.run)
    handle = cast(State, ttl_type(backend, table, descriptor, config, now, cleanup))
    backend._handles[descriptor.name] = handle
    return handle


class KeySelectionListeners(HeapKeyedStateBackend):
    """A backend that calls listeners whenever the current key is set: what incremental
    cleanup with ``run_cleanup_for_every_record`` hooks into (Flink's key selection
    listeners), as every keyed operator sets the key once per record and timer.

    Operators set ``backend.current_key`` directly, for speed. Rather than make that a
    call on every backend, a backend becomes this class (its ``current_key`` a
    property) only when such a cleanup is registered: a job without one keeps the
    plain attribute and pays nothing.
    """

    _key_listeners: list[Callable[[], None]]
    _key: Any

    @staticmethod
    def add(backend: HeapKeyedStateBackend, listener: Callable[[], None]) -> None:
        if not isinstance(backend, KeySelectionListeners):
            key = backend.current_key
            backend.__class__ = _with_key_listeners(type(backend))
            assert isinstance(backend, KeySelectionListeners)
            del backend.__dict__["current_key"]
            backend._key = key
            backend._key_listeners = []
        backend._key_listeners.append(listener)

    @property
    def current_key(self) -> Any:
        return self._key

    @current_key.setter
    def current_key(self, key: Any) -> None:
        self._key = key
        for listener in self._key_listeners:
            listener()


@functools.cache
def _with_key_listeners(backend_type: type[HeapKeyedStateBackend]) -> type[KeySelectionListeners]:
    """``backend_type`` with key selection listeners (a subclass of the heap backend, such as
    the RocksDB one, keeps its own methods)."""
    if backend_type is HeapKeyedStateBackend:
        return KeySelectionListeners
    return type(f"{backend_type.__name__}WithKeyListeners", (KeySelectionListeners, backend_type), {})


#: plain handle type -> (TTL handle type, namespaced TTL handle type)
TTL_HANDLES: dict[type, tuple[type[_TtlState], type[_TtlState]]] = {
    HeapValueState: (HeapTtlValueState, HeapTtlNamespacedValueState),
    HeapListState: (HeapTtlListState, HeapTtlNamespacedListState),
    HeapMapState: (HeapTtlMapState, HeapTtlNamespacedMapState),
    HeapReducingState: (HeapTtlReducingState, HeapTtlNamespacedReducingState),
    HeapAggregatingState: (HeapTtlAggregatingState, HeapTtlNamespacedAggregatingState),
}
