"""Keyed state, as a user function sees it: descriptors and state handles.

Names and methods follow PyFlink (``ValueStateDescriptor``, ``state.value()``,
``state.update(v)``, ...). A descriptor names a state; the runtime context turns
it into a handle scoped to the key of the record being processed. Values are
Python objects. Type information is optional and recommended: a state whose
descriptor declares PyFlink ``Types`` (``ValueStateDescriptor("count",
Types.LONG())``) is written as data when a snapshot is written, never pickled, and
a restore checks that the declared type can still read it
(:mod:`chandy.state.typed`); a state without it is pickled, and read back by a
restricted unpickler (:mod:`chandy.state.unpickling`).

A descriptor may carry a :class:`StateTtlConfig` (``enable_time_to_live``): its
values then expire a fixed time after they were last written (or read), with
Flink's semantics; ``docs/state-ttl.md`` explains them.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from chandy.core.time import Duration, Time


class StateTtlConfig:
    """Time-to-live of keyed state (PyFlink's ``StateTtlConfig``), built with
    ``StateTtlConfig.new_builder(ttl)...build()`` and given to a descriptor's
    ``enable_time_to_live``.

    A value's *last access timestamp* is set when it is written (and, with
    ``OnReadAndWrite``, when it is read); once ``ttl`` has passed since then, in
    processing time, the value is expired. Expired values are removed when they are
    read, by incremental cleanup, and never written into a checkpoint.
    """

    class UpdateType(enum.Enum):
        """When the last access timestamp is refreshed (which prolongs the value's life)."""

        #: TTL is disabled: the state does not expire (the descriptor behaves as without TTL).
        Disabled = 0
        #: On creation and on every write.
        OnCreateAndWrite = 1
        #: As ``OnCreateAndWrite``, and on every read too.
        OnReadAndWrite = 2

    class StateVisibility(enum.Enum):
        """Whether an expired value that is still stored may be returned."""

        #: Returned by the read that finds it expired (which also removes it).
        ReturnExpiredIfNotCleanedUp = 0
        #: Never returned.
        NeverReturnExpired = 1

    class TtlTimeCharacteristic(enum.Enum):
        """The time TTL is measured in: processing time only, as in Flink."""

        ProcessingTime = 0

    class CleanupStrategies:
        """Which cleanups of expired state run, besides the removal on read that always runs."""

        class Strategies(enum.Enum):
            """The kinds of cleanup of expired state, PyFlink's names."""

            FULL_STATE_SCAN_SNAPSHOT = 0
            INCREMENTAL_CLEANUP = 1
            ROCKSDB_COMPACTION_FILTER = 2

        class CleanupStrategy(ABC):  # noqa: B024 (PyFlink's marker base class has no methods)
            """Base of the cleanup strategies' settings."""

        class EmptyCleanupStrategy(CleanupStrategy):
            """A strategy without settings (the full-snapshot cleanup)."""

        class IncrementalCleanupStrategy(CleanupStrategy):
            """Check ``cleanup_size`` entries of the state for expiry on every access to it
            (and, with ``run_cleanup_for_every_record``, for every record the operator processes)."""

            def __init__(self, cleanup_size: int, run_cleanup_for_every_record: bool) -> None:
                if isinstance(cleanup_size, bool) or not isinstance(cleanup_size, int) or cleanup_size <= 0:
                    raise ValueError(
                        f"cleanup_incrementally: cleanup_size is how many state entries each access "
                        f"checks for expiry and must be a positive int, got {cleanup_size!r}"
                    )
                self._cleanup_size = cleanup_size
                self._run_cleanup_for_every_record = bool(run_cleanup_for_every_record)

            def get_cleanup_size(self) -> int:
                """How many entries each incremental cleanup step looks at."""
                return self._cleanup_size

            def run_cleanup_for_every_record(self) -> bool:
                """Whether a cleanup step also runs for every record processed."""
                return self._run_cleanup_for_every_record

        class RocksdbCompactFilterCleanupStrategy(CleanupStrategy):
            """Cleanup in RocksDB's compaction. Accepted for compatibility: chandy keeps keyed
            state on the heap, where (as in Flink's heap backend) it has no effect."""

            def __init__(
                self, query_time_after_num_entries: int, periodic_compaction_time: Duration | None = None
            ) -> None:
                self._query_time_after_num_entries = query_time_after_num_entries
                self._periodic_compaction_time = periodic_compaction_time or Duration.of_days(30)

            def get_query_time_after_num_entries(self) -> int:
                """After how many entries RocksDB's compaction filter reads the clock again (PyFlink's
                setting; kept for compatibility)."""
                return self._query_time_after_num_entries

            def get_periodic_compaction_time(self) -> Duration:
                """How often RocksDB compacts to drop expired entries (PyFlink's setting; kept for
                compatibility)."""
                return self._periodic_compaction_time

        EMPTY_STRATEGY = EmptyCleanupStrategy()

        def __init__(
            self,
            strategies: dict[
                StateTtlConfig.CleanupStrategies.Strategies, StateTtlConfig.CleanupStrategies.CleanupStrategy
            ],
            is_cleanup_in_background: bool,
        ) -> None:
            self._strategies = dict(strategies)
            self._is_cleanup_in_background = is_cleanup_in_background

        def is_cleanup_in_background(self) -> bool:
            """Whether expired entries are also removed in the background, not only when read."""
            return self._is_cleanup_in_background

        def in_full_snapshot(self) -> bool:
            """Whether expired entries are left out of full snapshots."""
            return StateTtlConfig.CleanupStrategies.Strategies.FULL_STATE_SCAN_SNAPSHOT in self._strategies

        def get_incremental_cleanup_strategy(
            self,
        ) -> StateTtlConfig.CleanupStrategies.IncrementalCleanupStrategy | None:
            """The incremental cleanup that runs: the configured one, else (cleanup in background
            being on, the default) Flink's default of 5 entries per access, else none."""
            strategies = StateTtlConfig.CleanupStrategies
            configured = self._strategies.get(strategies.Strategies.INCREMENTAL_CLEANUP)
            if isinstance(configured, strategies.IncrementalCleanupStrategy):
                return configured
            return strategies.IncrementalCleanupStrategy(5, False) if self._is_cleanup_in_background else None

        def get_rocksdb_compact_filter_cleanup_strategy(
            self,
        ) -> StateTtlConfig.CleanupStrategies.RocksdbCompactFilterCleanupStrategy | None:
            """The RocksDB compaction-filter cleanup settings, or ``None``."""
            strategies = StateTtlConfig.CleanupStrategies
            configured = self._strategies.get(strategies.Strategies.ROCKSDB_COMPACTION_FILTER)
            if isinstance(configured, strategies.RocksdbCompactFilterCleanupStrategy):
                return configured
            return (
                strategies.RocksdbCompactFilterCleanupStrategy(1000)
                if self._is_cleanup_in_background
                else None
            )

    def __init__(
        self,
        update_type: StateTtlConfig.UpdateType,
        state_visibility: StateTtlConfig.StateVisibility,
        ttl_time_characteristic: StateTtlConfig.TtlTimeCharacteristic,
        ttl: Time | Duration,
        cleanup_strategies: StateTtlConfig.CleanupStrategies,
    ) -> None:
        self._update_type = update_type
        self._state_visibility = state_visibility
        self._ttl_time_characteristic = ttl_time_characteristic
        self._ttl = ttl
        self._cleanup_strategies = cleanup_strategies

    @staticmethod
    def new_builder(ttl: Time | Duration) -> StateTtlConfig.Builder:
        """Start a time-to-live configuration: values expire ``ttl`` after they were last written (see the
        builder for reads and visibility)."""
        return StateTtlConfig.Builder(ttl)

    def get_update_type(self) -> StateTtlConfig.UpdateType:
        """What refreshes a value's time to live: its writes (``OnCreateAndWrite``) or also its reads
        (``OnReadAndWrite``)."""
        return self._update_type

    def get_state_visibility(self) -> StateTtlConfig.StateVisibility:
        """Whether an expired value that was not cleaned up yet is still returned
        (``ReturnExpiredIfNotCleanedUp``) or never (``NeverReturnExpired``)."""
        return self._state_visibility

    def get_ttl(self) -> Time | Duration:
        """How long a value lives after the write (or read) that last refreshed it."""
        return self._ttl

    def get_ttl_time_characteristic(self) -> StateTtlConfig.TtlTimeCharacteristic:
        """The clock time-to-live is measured in (processing time, as in Flink)."""
        return self._ttl_time_characteristic

    def is_enabled(self) -> bool:
        """Whether values expire (an update type other than ``Disabled``)."""
        return self._update_type is not StateTtlConfig.UpdateType.Disabled

    def get_cleanup_strategies(self) -> StateTtlConfig.CleanupStrategies:
        """Which cleanups of expired entries run besides the removal on read, which always runs (expired
        entries are never written into a checkpoint)."""
        return self._cleanup_strategies

    def ttl_milliseconds(self) -> int:
        """The time to live in milliseconds."""
        return self._ttl.to_milliseconds()

    def __repr__(self) -> str:
        return (
            f"StateTtlConfig<update_type={self._update_type}, state_visibility={self._state_visibility}, "
            f"ttl_time_characteristic={self._ttl_time_characteristic}, ttl={self._ttl}>"
        )

    class Builder:
        """Builds a :class:`StateTtlConfig`; every setter returns the builder (PyFlink's)."""

        def __init__(self, ttl: Time | Duration) -> None:
            self._ttl = _checked_ttl(ttl)
            self._update_type = StateTtlConfig.UpdateType.OnCreateAndWrite
            self._state_visibility = StateTtlConfig.StateVisibility.NeverReturnExpired
            self._ttl_time_characteristic = StateTtlConfig.TtlTimeCharacteristic.ProcessingTime
            self._is_cleanup_in_background = True
            self._strategies: dict[
                StateTtlConfig.CleanupStrategies.Strategies, StateTtlConfig.CleanupStrategies.CleanupStrategy
            ] = {}

        def set_update_type(self, update_type: StateTtlConfig.UpdateType) -> StateTtlConfig.Builder:
            """When the last access timestamp is refreshed."""
            self._update_type = _setting("set_update_type", update_type, StateTtlConfig.UpdateType)
            return self

        def update_ttl_on_create_and_write(self) -> StateTtlConfig.Builder:
            """Refresh a value's time to live when it is written (the default)."""
            return self.set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite)

        def update_ttl_on_read_and_write(self) -> StateTtlConfig.Builder:
            """Refresh a value's time to live when it is read too: values in use never expire."""
            return self.set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)

        def set_state_visibility(
            self, state_visibility: StateTtlConfig.StateVisibility
        ) -> StateTtlConfig.Builder:
            """Whether an expired value not yet cleaned up may be returned."""
            self._state_visibility = _setting(
                "set_state_visibility", state_visibility, StateTtlConfig.StateVisibility
            )
            return self

        def return_expired_if_not_cleaned_up(self) -> StateTtlConfig.Builder:
            """Let a read return an expired value that was not removed yet (it is removed then)."""
            return self.set_state_visibility(StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp)

        def never_return_expired(self) -> StateTtlConfig.Builder:
            """Never return an expired value (the default)."""
            return self.set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)

        def set_ttl_time_characteristic(
            self, ttl_time_characteristic: StateTtlConfig.TtlTimeCharacteristic
        ) -> StateTtlConfig.Builder:
            """The clock time to live is measured in; processing time is the only one, as in Flink."""
            self._ttl_time_characteristic = _setting(
                "set_ttl_time_characteristic", ttl_time_characteristic, StateTtlConfig.TtlTimeCharacteristic
            )
            return self

        def use_processing_time(self) -> StateTtlConfig.Builder:
            """Measure time to live in processing time (the only choice, as in Flink)."""
            return self.set_ttl_time_characteristic(StateTtlConfig.TtlTimeCharacteristic.ProcessingTime)

        def cleanup_full_snapshot(self) -> StateTtlConfig.Builder:
            """Leave expired entries out of full snapshots. Chandy's heap snapshots always
            leave them out, so this changes nothing there; it is kept for PyFlink's API."""
            strategies = StateTtlConfig.CleanupStrategies
            self._strategies[strategies.Strategies.FULL_STATE_SCAN_SNAPSHOT] = strategies.EMPTY_STRATEGY
            return self

        def cleanup_incrementally(
            self, cleanup_size: int, run_cleanup_for_every_record: bool
        ) -> StateTtlConfig.Builder:
            """On every access to the state, check ``cleanup_size`` of its entries (all keys,
            round-robin) and remove the expired ones; with ``run_cleanup_for_every_record``,
            also for every record the operator processes, whatever state it touches."""
            strategies = StateTtlConfig.CleanupStrategies
            self._strategies[strategies.Strategies.INCREMENTAL_CLEANUP] = (
                strategies.IncrementalCleanupStrategy(cleanup_size, run_cleanup_for_every_record)
            )
            return self

        def cleanup_in_rocksdb_compact_filter(
            self, query_time_after_num_entries: int, periodic_compaction_time: Duration | None = None
        ) -> StateTtlConfig.Builder:
            """Accepted for PyFlink's API; chandy's heap state has no compaction, so this has no
            effect (Flink's heap backend ignores it too)."""
            strategies = StateTtlConfig.CleanupStrategies
            self._strategies[strategies.Strategies.ROCKSDB_COMPACTION_FILTER] = (
                strategies.RocksdbCompactFilterCleanupStrategy(
                    query_time_after_num_entries, periodic_compaction_time
                )
            )
            return self

        def disable_cleanup_in_background(self) -> StateTtlConfig.Builder:
            """Turn off the default incremental cleanup (5 entries per access). A cleanup
            configured explicitly (``cleanup_incrementally``) still runs."""
            self._is_cleanup_in_background = False
            return self

        def set_ttl(self, ttl: Time | Duration) -> StateTtlConfig.Builder:
            """How long a value lives after the access that last refreshed it."""
            self._ttl = _checked_ttl(ttl)
            return self

        def build(self) -> StateTtlConfig:
            """The configuration, to give to a state descriptor's ``enable_time_to_live``."""
            return StateTtlConfig(
                self._update_type,
                self._state_visibility,
                self._ttl_time_characteristic,
                self._ttl,
                StateTtlConfig.CleanupStrategies(self._strategies, self._is_cleanup_in_background),
            )


_E = TypeVar("_E", bound=enum.Enum)


def _setting(setter: str, value: _E, kind: type[_E]) -> _E:
    """``value`` if it is a member of ``kind`` (a string such as "OnReadAndWrite" is not)."""
    if not isinstance(value, kind):
        raise TypeError(f"{setter} needs a StateTtlConfig.{kind.__name__}, got {value!r}")
    return value


def _checked_ttl(ttl: Time | Duration) -> Time | Duration:
    if not isinstance(ttl, (Time, Duration)):
        raise TypeError(
            f"a state TTL is a Time or a Duration (Time.seconds(1), Duration.of_minutes(5)), got {ttl!r}"
        )
    if ttl.to_milliseconds() <= 0:
        raise ValueError(f"a state TTL must be positive, got {ttl.to_milliseconds()} ms")
    return ttl


class StateDescriptor:
    """Names a piece of state. Two descriptors with the same name are the same state."""

    def __init__(self, name: str, type_info: Any = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a state descriptor needs a non-empty string name")
        self.name = name
        self.type_info = type_info
        self._ttl_config: StateTtlConfig | None = None

    def get_name(self) -> str:
        """The state's name: what a checkpoint files it under, so a restore finds it only under the same
        name."""
        return self.name

    def enable_time_to_live(self, ttl_config: StateTtlConfig) -> None:
        """Let this state's values expire as ``ttl_config`` says (PyFlink's). Only keyed
        state expires; operator state ignores it, as in Flink."""
        if not isinstance(ttl_config, StateTtlConfig):
            raise TypeError(
                f"enable_time_to_live needs a StateTtlConfig (StateTtlConfig.new_builder(ttl).build()), "
                f"got {ttl_config!r}"
            )
        self._ttl_config = ttl_config

    def get_ttl_config(self) -> StateTtlConfig | None:
        """The TTL given to ``enable_time_to_live``, or ``None`` (Flink's ``getTtlConfig``)."""
        return self._ttl_config

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class ValueStateDescriptor(StateDescriptor):
    """One value per key. ``ValueStateDescriptor("count", Types.LONG())`` in PyFlink."""

    def __init__(self, name: str, value_type_info: Any = None) -> None:
        super().__init__(name, value_type_info)


class ListStateDescriptor(StateDescriptor):
    """A list of values per key."""

    def __init__(self, name: str, elem_type_info: Any = None) -> None:
        super().__init__(name, elem_type_info)


class MapStateDescriptor(StateDescriptor):
    """A map per key."""

    def __init__(self, name: str, key_type_info: Any = None, value_type_info: Any = None) -> None:
        super().__init__(name, (key_type_info, value_type_info))


class ReducingStateDescriptor(StateDescriptor):
    """One value per key, folded with ``reduce_function`` on every ``add``."""

    def __init__(self, name: str, reduce_function: Any, type_info: Any = None) -> None:
        super().__init__(name, type_info)
        reduce = getattr(reduce_function, "reduce", reduce_function)
        if not callable(reduce):
            raise ValueError(
                f"ReducingStateDescriptor({name!r}) needs a ReduceFunction or a callable (a, b) -> c"
            )
        self.reduce_function: Callable[[Any, Any], Any] = reduce


class AggregatingStateDescriptor(StateDescriptor):
    """One accumulator per key, folded with an ``AggregateFunction`` on every ``add``
    (PyFlink's ``AggregatingStateDescriptor(name, agg_function, state_type_info)``).

    The state keeps the accumulator; ``get()`` returns ``agg_function.get_result`` of it.
    """

    def __init__(self, name: str, agg_function: Any, state_type_info: Any = None) -> None:
        super().__init__(name, state_type_info)
        missing = [
            m
            for m in ("create_accumulator", "add", "get_result", "merge")
            if not callable(getattr(agg_function, m, None))
        ]
        if missing:
            raise TypeError(
                f"AggregatingStateDescriptor({name!r}) needs an AggregateFunction; "
                f"{agg_function!r} has no {', '.join(missing)} method"
            )
        self.agg_function = agg_function

    def get_agg_function(self) -> Any:
        """The ``AggregateFunction`` that folds the values added to the state."""
        return self.agg_function


class State(ABC):
    """A state handle; every operation applies to the current key."""

    @abstractmethod
    def clear(self) -> None:
        """Remove the value for the current key."""


class ValueState(State):
    """Keyed state holding one value per key: ``value()`` reads it (``None`` when unset), ``update`` writes
    it, ``clear`` removes it."""

    @abstractmethod
    def value(self) -> Any:
        """The value for the current key, or ``None``."""

    @abstractmethod
    def update(self, value: Any) -> None:
        """Replace the value for the current key. ``None`` clears it."""


class ListState(State):
    """Keyed state holding a list of values per key; ``get`` returns them, ``add`` appends, ``update``
    replaces."""

    @abstractmethod
    def get(self) -> Iterable[Any]:
        """The values for the current key (empty if none)."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Append a value to the current key's list."""

    @abstractmethod
    def add_all(self, values: Iterable[Any]) -> None:
        """Append every value to the current key's list."""

    @abstractmethod
    def update(self, values: Iterable[Any]) -> None:
        """Replace all values for the current key."""


class _ReadableMap(State):
    """The reading half of a map state, shared by :class:`MapState` and the broadcast states."""

    @abstractmethod
    def get(self, key: Any) -> Any: ...

    @abstractmethod
    def contains(self, key: Any) -> bool: ...

    @abstractmethod
    def items(self) -> Iterable[tuple[Any, Any]]: ...

    @abstractmethod
    def keys(self) -> Iterable[Any]: ...

    @abstractmethod
    def values(self) -> Iterable[Any]: ...

    @abstractmethod
    def is_empty(self) -> bool: ...

    def __getitem__(self, key: Any) -> Any:
        return self.get(key)

    def __contains__(self, key: Any) -> bool:
        return self.contains(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.keys()))


class _WritableMap(_ReadableMap):
    """The writing half of a map state."""

    @abstractmethod
    def put(self, key: Any, value: Any) -> None: ...

    @abstractmethod
    def put_all(self, dict_value: dict[Any, Any]) -> None: ...

    @abstractmethod
    def remove(self, key: Any) -> None: ...

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        self.remove(key)


class MapState(_WritableMap):
    """A map per key (PyFlink's ``MapState``)."""


class ReducingState(State):
    """Keyed state holding one value per key, which ``add`` folds with its reduce function."""

    @abstractmethod
    def get(self) -> Any:
        """The folded value for the current key, or ``None``."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Fold ``value`` into the current key's value."""


class AggregatingState(State):
    """An accumulator per key, fed by ``add`` and read through the aggregate function's
    ``get_result`` (PyFlink's ``AggregatingState``)."""

    @abstractmethod
    def get(self) -> Any:
        """The aggregate's result for the current key, or ``None`` if nothing was added."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Add ``value`` to the current key's accumulator."""


class ReadOnlyBroadcastState(_ReadableMap):
    """A read-only view of a :class:`BroadcastState` (PyFlink's ``ReadOnlyBroadcastState``):
    what the element side of a broadcast process function sees, so that only the broadcast
    side, which every subtask receives in full, can change the state (and the copies on
    every subtask stay identical).

    ``get`` returns ``None`` for an absent key. Values are not copied: do not modify what
    ``get`` or ``items`` return.
    """


class BroadcastState(ReadOnlyBroadcastState, _WritableMap):
    """A map every subtask of a broadcast process function holds a copy of (PyFlink's
    ``BroadcastState``), written on the broadcast side.

    The copies stay identical only if ``process_broadcast_element`` changes the state in
    the same way on every subtask (every subtask receives every broadcast element, in the
    same order per upstream subtask): the state must not depend on the subtask or on the
    element side. A checkpoint stores every subtask's copy; a restore gives each new
    subtask one copy (new subtask ``i`` that of old subtask ``i mod old parallelism``).
    """
