"""The heap keyed state backend: Python objects in dictionaries, one per key group.

Why one dictionary per key group: a snapshot is written per key group (the unit
of rescaling), so grouping at write time would mean hashing every key again.
The keyed partitioner upstream already computed each record's key group; the
operator hands it to :meth:`HeapKeyedStateBackend.set_current_key` and a state
access is two list/dict lookups.

Snapshots are copy-on-write. The synchronous part (on the task thread, between
two batches) takes a shallow copy of every key group's dictionary: a C-speed
copy of references, not of values. While any snapshot is still being
serialized off the task thread, a value that is not immutable (a list, a dict,
a user object) is deep-copied the first time this subtask touches it for its
key, so the snapshot keeps the object as it was at the barrier even if user
code mutates what it read. Immutable values (numbers, strings, tuples of
them) are never copied. Once no snapshot is in flight, accesses check one
attribute and do nothing else.

Namespaced state (a window's contents: one value per key *and* window) lives in
the same per-key-group dictionaries under ``(key, namespace)``, so it is
snapshotted, restored and rescaled exactly like plain keyed state. Timers are
tables too (:meth:`HeapKeyedStateBackend.get_timer_table`, kind ``"timers"``,
names under :data:`TIMER_STATE_PREFIX`): a timer set before a barrier is in that
barrier's snapshot and comes back, after rescaling, on the subtask that owns
its key group. User code cannot reach them through a state descriptor.

State with a time-to-live (a descriptor with ``enable_time_to_live``) gets the
handles of :mod:`chandy.state.ttl`, chosen when the handle is created; the
handles here, which every state without TTL uses, know nothing of it.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

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
from chandy.errors import InvalidCheckpointError, UnrecoverableError
from chandy.state.backend import (
    LAST_CONFIRMED,
    BaseCheckpoint,
    KeyedStateBackend,
    StateFileReader,
    StateWriter,
    WrittenKeyedState,
)
from chandy.state.handles import (
    FileStateHandle,
    IncrementalKeyedStateHandle,
    KeyedStateHandle,
    KeyGroupsStateHandle,
    Range,
)
from chandy.state.key_group_format import read_key_group, write_key_group
from chandy.state.key_groups import KeyGroupRange
from chandy.state.missing_classes import TIMER_STATE_PREFIX as TIMER_STATE_PREFIX  # noqa: PLC0414 - re-exported
from chandy.state.typed import (
    StateSerializer,
    compatible,
    declared_type,
    describe,
    state_serializer,
    type_of_spec,
)
from chandy.state.unpickling import DEFAULT_POLICY, UnpicklingPolicy
from chandy.util.clock import Clock, SystemClock

#: The kind of a timer table.
TIMERS_KIND = "timers"
#: The kind of a namespaced table is this prefix and the kind of its values ("namespaced list").
NAMESPACED = "namespaced "

_ATOMIC = frozenset({int, float, str, bytes, bool, complex, type(None)})


def is_immutable(value: Any) -> bool:
    """True for values no code can change in place (so a snapshot may share them)."""
    t = type(value)
    if t in _ATOMIC:
        return True
    if t is tuple or t is frozenset:
        return all(is_immutable(v) for v in value)
    return False


class IncompatibleStateError(UnrecoverableError, ValueError):
    """A state is requested as another kind than the one it holds under its name.

    Unrecoverable: a restarted task would declare its state the same way and fail
    again, so the job fails at once instead of restarting in a loop.
    """


class IncompatibleRestoredStateError(InvalidCheckpointError, IncompatibleStateError):
    """The job declares a restored state as another kind than the checkpoint holds
    (``ValueState`` became ``ListState``, ...): the checkpoint cannot be used as it is."""


class IncompatibleStateTypeError(IncompatibleRestoredStateError):
    """The job declares a restored state with a type that cannot read what the checkpoint
    holds (Flink's incompatible state schema: ``Types.LONG()`` became ``Types.STRING()``).
    ``written`` and ``declared`` are the two types as PyFlink prints them."""

    written: str = ""
    declared: str = ""


def _describe_kind(kind: str) -> str:
    """How a user declares state of ``kind`` (a window's state is declared by its function)."""
    if kind.startswith(NAMESPACED):
        return f"{kind} state (a window's contents: keep the window function's kind)"
    if kind.startswith("ttl "):
        return f"{_describe_kind(kind[4:])[:-1]} with enable_time_to_live)"
    descriptor = {
        "value": "ValueStateDescriptor",
        "list": "ListStateDescriptor",
        "map": "MapStateDescriptor",
        "reducing": "ReducingStateDescriptor",
        "aggregating": "AggregatingStateDescriptor",
    }.get(kind)
    return f"{kind} state ({descriptor})" if descriptor else f"{kind} state"


class StateTable:
    """All keys' values of one named state: ``maps[key_group][key] -> value``.

    ``maps`` is indexed by the absolute key group (entries outside this
    backend's range are ``None``): a list of ``max_parallelism`` references
    costs little and saves a subtraction on every state access.
    """

    __slots__ = ("name", "kind", "maps", "key_group_range", "cow", "expire", "serializer")

    def __init__(self, name: str, kind: str, key_group_range: KeyGroupRange, max_parallelism: int) -> None:
        self.name = name
        self.kind = kind
        self.key_group_range = key_group_range
        self.maps: list[dict[Any, Any] | None] = [None] * max_parallelism
        for kg in key_group_range:
            self.maps[kg] = {}
        #: Keys privatized since the latest snapshot; ``None`` while no snapshot is in flight.
        self.cow: set[Any] | None = None
        #: For state with TTL, ``(value, now) -> its unexpired part or None`` (what a snapshot
        #: keeps, see :func:`chandy.state.ttl.expiry_filter`); ``None`` for state without TTL.
        self.expire: Callable[[Any, int], Any] | None = None
        #: How its values are written when its descriptor declares ``Types`` (or the state was
        #: restored typed and is not declared yet); ``None``: pickled.
        self.serializer: StateSerializer | None = None

    def privatize(self, m: dict[Any, Any], key: Any) -> Any:
        """The value of ``key``, copied first if a snapshot may still share it."""
        value = m.get(key)
        cow = self.cow
        if cow is None or key in cow:
            return value
        if value is not None and not is_immutable(value):
            value = copy.deepcopy(value)
            m[key] = value
        cow.add(key)
        return value

    def key_group_maps(self) -> list[tuple[int, dict[Any, Any]]]:
        """``(key_group, map)`` for every key group of the range."""
        return [(kg, self.maps[kg]) for kg in self.key_group_range]  # type: ignore[misc]

    def __len__(self) -> int:
        return sum(len(m) for _, m in self.key_group_maps())


class HeapKeyedStateBackend(KeyedStateBackend):
    """Keyed state on the Python heap.

    ``clock`` is the processing time state TTL is measured in (the task's clock, which
    tests replace by a ``ManualClock``).
    """

    def __init__(
        self,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        *,
        owner: str = "the operator",
        clock: Clock | None = None,
    ) -> None:
        super().__init__(key_group_range, max_parallelism)
        self.clock: Clock = clock if clock is not None else SystemClock()
        #: Who holds this state, for errors: "operator 'Counter' (uid 'counter')".
        self.owner = owner
        self.tables: dict[str, StateTable] = {}
        #: The kind of every state a restore brought back, by name.
        self._restored_kinds: dict[str, str] = {}
        #: The type every typed state a restore brought back was written with, by name
        #: (:func:`chandy.state.typed.type_spec`).
        self._restored_types: dict[str, str] = {}
        self._handles: dict[str, State] = {}
        self.current_key: Any = None
        self.current_index = key_group_range.start  # the key group of the current key
        self._lock = threading.Lock()
        self._snapshots_in_flight = 0

    def set_current_key(self, key: Any, key_group: int) -> None:
        if key_group not in self.key_group_range:
            raise ValueError(
                f"key {key!r} is in key group {key_group}, outside this backend's "
                f"range {self.key_group_range}"
            )
        self.current_key = key
        self.current_index = key_group

    def get_current_key(self) -> Any:
        return self.current_key

    def get_partitioned_state(self, descriptor: StateDescriptor, namespaced: bool = False) -> State:
        """The handle of ``descriptor``'s state. ``namespaced=True`` gives a handle whose
        values are per key *and* namespace (:meth:`set_current_namespace` chooses it);
        a name holds either namespaced or plain state, not both."""
        kind = _KINDS.get(type(descriptor))
        if kind is None:
            raise TypeError(f"unsupported state descriptor {type(descriptor).__name__}")
        if descriptor.name.startswith(TIMER_STATE_PREFIX):
            raise ValueError(
                f"state name '{descriptor.name}' is reserved for timers "
                f"(names starting with '{TIMER_STATE_PREFIX}'); choose another name"
            )
        kind_name, handle_type, namespaced_type = kind
        ttl_config = descriptor.get_ttl_config()
        if ttl_config is not None and ttl_config.is_enabled():
            from chandy.state.ttl import ttl_state  # deferred: it builds on this module's handles

            return ttl_state(self, descriptor, ttl_config, kind_name, handle_type, namespaced)
        if namespaced:
            kind_name, handle_type = NAMESPACED + kind_name, namespaced_type
        table = self._table(descriptor.name, kind_name)
        handle = self._handles.get(descriptor.name)
        if handle is None:
            self.declare_type(table, descriptor)
            handle = handle_type(self, table, descriptor)
            self._handles[descriptor.name] = handle
        return handle

    def declare_type(self, table: StateTable, descriptor: StateDescriptor) -> None:
        """``descriptor`` declares ``table``'s state (once, with its handle): its values are
        written with the serializer of its declared ``Types`` from now on, or pickled if it
        declares none. A type that cannot read what a restore brought back is an
        :class:`IncompatibleStateTypeError` (Flink's state schema compatibility)."""
        declared = declared_type(descriptor)
        written = self._restored_types.get(table.name)
        if written is not None and declared is not None:
            written_type = type_of_spec(written)
            if not compatible(written_type, declared):
                raise self._incompatible_type(table.name, describe(written_type), describe(declared))
        self.set_serializer(table, state_serializer(table.name, table.kind, declared))

    def set_serializer(self, table: StateTable, serializer: StateSerializer | None) -> None:
        """Write ``table``'s values with ``serializer`` (``None``: pickled) from now on."""
        table.serializer = serializer

    def _incompatible_type(self, name: str, written: str, declared: str) -> IncompatibleStateTypeError:
        error = IncompatibleStateTypeError(
            f"{self.owner} cannot restore state '{name}': the checkpoint holds it written as "
            f"{written} and the job now declares it as {declared}, which cannot read it (a "
            "state's type may change only within a family: the integer types, FLOAT and DOUBLE, "
            "STRING and CHAR, the list and array types). Declare it as "
            f"{written} again, or give the state of type {declared} a new name (the old state is "
            "then left unused), or start the operator without state: give it a new uid() and "
            "restore with execution.state-recovery.ignore-unclaimed-state: true. A restart would "
            "fail the same way, so the job fails now."
        )
        error.written, error.declared = written, declared
        return error

    def restored_type(self, name: str, spec: str) -> None:
        """A restore brought state ``name`` back written typed as ``spec``: written so again
        until the job declares it."""
        self._restored_types[name] = spec
        table = self.tables[name]
        if table.serializer is None or table.serializer.spec != spec:
            self.set_serializer(table, state_serializer(name, table.kind, type_of_spec(spec)))

    def get_timer_table(self, name: str) -> StateTable:
        """The table of timers ``name`` (created empty if absent, restored if it was
        snapshotted): ``maps[key_group]`` holds ``{(timestamp, key, namespace): None}``."""
        if not name.startswith(TIMER_STATE_PREFIX):
            raise ValueError(f"timer table names start with '{TIMER_STATE_PREFIX}', got '{name}'")
        return self._table(name, TIMERS_KIND)

    def _table(self, name: str, kind: str) -> StateTable:
        table = self.tables.get(name)
        if table is None:
            table = self.tables[name] = StateTable(name, kind, self.key_group_range, self.max_parallelism)
        elif table.kind != kind:
            if self._restored_kinds.get(name) == table.kind:
                raise IncompatibleRestoredStateError(
                    f"{self.owner} cannot restore state '{name}': the checkpoint holds it as "
                    f"{table.kind} state and the job now declares it as {kind} state. A state "
                    f"keeps its kind across restores. Declare it as {_describe_kind(table.kind)} "
                    f"again, or give the {kind} state a new name (the old state is then left "
                    "unused), or start the operator without state: give it a new uid() and "
                    "restore with execution.state-recovery.ignore-unclaimed-state: true"
                )
            raise IncompatibleStateError(
                f"{self.owner}: state '{name}' holds {table.kind} state and is now requested as "
                f"{kind} state; use a different name for each state"
            )
        return table

    def has_state(self) -> bool:
        return bool(self.tables)

    def num_keys(self, state_name: str) -> int:
        table = self.tables.get(state_name)
        return 0 if table is None else len(table)

    def apply_to_all_keys(self, descriptor: StateDescriptor, function: Callable[[Any, State], Any]) -> None:
        """Call ``function(key, state)`` for every key of this backend that has a value of
        ``descriptor``'s state, with ``state`` scoped to that key (Flink's ``applyToAllKeys``,
        behind ``KeyedBroadcastProcessFunction``'s ``ctx.apply_to_keyed_state``).

        The keys are listed before the first call, so ``function`` may update or clear the
        state as it goes; the current key is the same afterwards as before."""
        state = self.get_partitioned_state(descriptor)
        table = self.tables[descriptor.name]
        keys = [(kg, key) for kg, m in table.key_group_maps() for key in m]
        current_key, current_index = self.current_key, self.current_index
        try:
            for kg, key in keys:
                self.current_key = key
                self.current_index = kg
                function(key, state)
        finally:
            self.current_key, self.current_index = current_key, current_index

    # ------------------------------------------------------------------ snapshots

    def snapshot(
        self,
        checkpoint_id: int = 0,
        *,
        canonical: bool = False,
        native: bool = False,
        base_checkpoint_id: BaseCheckpoint = LAST_CONFIRMED,
    ) -> HeapSnapshot:
        """The synchronous part: shallow copies of every key group, copy-on-write from now on.
        The heap's only format is the canonical one, whatever ``canonical`` asks; every
        snapshot is full (no ``base_checkpoint_id``).

        Call :meth:`HeapSnapshot.serialize` (off the task thread) and then
        :meth:`HeapSnapshot.release`.
        """
        with self._lock:
            self._snapshots_in_flight += 1
            for table in self.tables.values():
                table.cow = set()
        copies = {
            name: (table.kind, {kg: dict(m) for kg, m in table.key_group_maps() if m})
            for name, table in self.tables.items()
        }
        # State with TTL: entries expired at the barrier are left out when serialized.
        expiring = {name: table.expire for name, table in self.tables.items() if table.expire is not None}
        serializers = self.serializers()
        if expiring:
            return HeapSnapshot(
                self, self.key_group_range, copies, serializers, expiring, self.clock.now_ms()
            )
        return HeapSnapshot(self, self.key_group_range, copies, serializers)

    def serializers(self) -> dict[str, StateSerializer]:
        """The serializer of every typed state, by name (the others are pickled)."""
        return {name: table.serializer for name, table in self.tables.items() if table.serializer is not None}

    def _release(self) -> None:
        with self._lock:
            self._snapshots_in_flight -= 1
            if self._snapshots_in_flight == 0:
                for table in self.tables.values():
                    table.cow = None

    def restore(
        self,
        handles: Iterable[KeyedStateHandle],
        reader: StateFileReader,
        policy: UnpicklingPolicy = DEFAULT_POLICY,
    ) -> None:
        """Load every key group of this backend's range from ``handles`` (which may
        cover other ranges too: a restore after rescaling); pickles are read under ``policy``."""
        read = reader.read
        for handle in handles:
            if isinstance(handle, IncrementalKeyedStateHandle):
                raise IncompatibleRestoredStateError(
                    f"{self.owner} cannot restore checkpoint {handle.checkpoint_id}: it holds the "
                    "RocksDB state backend's native snapshot (its database files) and this job uses the "
                    "heap (hashmap) state backend. Restore it with state.backend.type: rocksdb, or "
                    "take a savepoint in the CANONICAL format and restore from that to switch backends"
                )
            part = handle.intersection(self.key_group_range)
            if part is None:
                continue
            for kg, byte_range in part.key_groups():
                if byte_range[1] <= byte_range[0]:
                    continue
                group = read_key_group(read(part.delegate, byte_range), self.owner, policy)
                for name, (kind, values, spec) in group.items():
                    table = self.tables.get(name)
                    if table is None:
                        table = self.tables[name] = StateTable(
                            name, kind, self.key_group_range, self.max_parallelism
                        )
                    elif table.kind != kind:
                        raise ValueError(
                            f"restored state '{name}' is {kind} state in one "
                            f"snapshot and {table.kind} state in another"
                        )
                    self._restored_kinds[name] = kind
                    if spec is not None:
                        self.restored_type(name, spec)
                    target = table.maps[kg]
                    assert target is not None
                    target.update(values)

    def dispose(self) -> None:
        self.tables.clear()
        self._handles.clear()


class _HeapState:
    """Common fields of the heap state handles (``_namespace`` is used by namespaced ones)."""

    __slots__ = ("_backend", "_maps", "_table", "_namespace")

    def __init__(
        self, backend: HeapKeyedStateBackend, table: StateTable, descriptor: StateDescriptor
    ) -> None:
        self._backend = backend
        # Only the current key's group is indexed, which is in this backend's range: never None.
        self._maps = cast("list[dict[Any, Any]]", table.maps)
        self._table = table
        self._namespace: Any = None

    def _read(self) -> Any:
        """The current key's value, privatized first while a snapshot is in flight."""
        b = self._backend
        if self._table.cow is None:
            return self._maps[b.current_index].get(b.current_key)
        return self._table.privatize(self._maps[b.current_index], b.current_key)

    def _write(self, value: Any) -> None:
        b = self._backend
        key = b.current_key
        self._maps[b.current_index][key] = value
        cow = self._table.cow
        if cow is not None:
            cow.add(key)  # a fresh object: no snapshot shares it

    def clear(self) -> None:
        b = self._backend
        self._maps[b.current_index].pop(b.current_key, None)


class HeapValueState(_HeapState, ValueState):
    """``value()`` and ``update()`` inline ``_read`` and ``_write``: they are the most
    frequent state calls of all (a read and a write per record of a running aggregate),
    and a Python call saved on each is worth more than the duplication."""

    __slots__ = ()

    def value(self) -> Any:
        b = self._backend
        table = self._table
        if table.cow is None:
            return self._maps[b.current_index].get(b.current_key)
        return table.privatize(self._maps[b.current_index], b.current_key)

    def update(self, value: Any) -> None:
        b = self._backend
        key = b.current_key
        if value is None:
            self._maps[b.current_index].pop(key, None)
            return
        self._maps[b.current_index][key] = value
        cow = self._table.cow
        if cow is not None:
            cow.add(key)  # a fresh object: no snapshot shares it


class HeapReducingState(_HeapState, ReducingState):
    __slots__ = ("_reduce",)

    def __init__(
        self, backend: HeapKeyedStateBackend, table: StateTable, descriptor: StateDescriptor
    ) -> None:
        super().__init__(backend, table, descriptor)
        assert isinstance(descriptor, ReducingStateDescriptor)
        self._reduce: Callable[[Any, Any], Any] = descriptor.reduce_function

    def get(self) -> Any:
        return self._read()

    def add(self, value: Any) -> None:
        old = self._read()
        self._write(value if old is None else self._reduce(old, value))


class HeapListState(_HeapState, ListState):
    __slots__ = ()

    def get(self) -> Iterable[Any]:
        return tuple(self._read() or ())

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("ListState.add(None): None cannot be stored in a list state")
        values = self._read()
        if values is None:
            self._write([value])
        else:
            values.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        items = list(values)
        if any(v is None for v in items):
            raise ValueError("ListState.add_all: None cannot be stored in a list state")
        if not items:
            return
        current = self._read()
        if current is None:
            self._write(items)
        else:
            current.extend(items)

    def update(self, values: Iterable[Any]) -> None:
        items = list(values) if values is not None else []
        if any(v is None for v in items):
            raise ValueError("ListState.update: None cannot be stored in a list state")
        if items:
            self._write(items)
        else:
            self.clear()


class HeapMapState(_HeapState, MapState):
    __slots__ = ()

    def _current_for_write(self) -> dict[Any, Any]:
        d: dict[Any, Any] | None = self._read()
        if d is None:
            d = {}
            self._write(d)
        return d

    def get(self, key: Any) -> Any:
        d = self._read()
        return None if d is None else d.get(key)

    def put(self, key: Any, value: Any) -> None:
        self._current_for_write()[key] = value

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        if dict_value:
            self._current_for_write().update(dict_value)

    def remove(self, key: Any) -> None:
        d = self._read()
        if d is not None:
            d.pop(key, None)
            if not d:
                self.clear()

    def contains(self, key: Any) -> bool:
        d = self._read()
        return d is not None and key in d

    def items(self) -> Iterator[tuple[Any, Any]]:
        d = self._read()
        return iter(list(d.items()) if d else ())

    def keys(self) -> Iterator[Any]:
        d = self._read()
        return iter(list(d) if d else ())

    def values(self) -> Iterator[Any]:
        d = self._read()
        return iter(list(d.values()) if d else ())

    def is_empty(self) -> bool:
        return not self._read()


class HeapAggregatingState(_HeapState, AggregatingState):
    """The accumulator of an ``AggregateFunction`` per key."""

    __slots__ = ("_agg",)

    def __init__(
        self, backend: HeapKeyedStateBackend, table: StateTable, descriptor: StateDescriptor
    ) -> None:
        super().__init__(backend, table, descriptor)
        assert isinstance(descriptor, AggregatingStateDescriptor)
        self._agg: Any = descriptor.agg_function

    def get(self) -> Any:
        acc = self._read()
        return None if acc is None else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        acc = self._read()
        if acc is None:
            acc = self._agg.create_accumulator()
        self._write(self._agg.add(value, acc))


class _Namespaced(_HeapState):
    """Values per ``(key, namespace)``: the same table layout, a composite dictionary key.

    A mixin placed before a plain handle class: it replaces the three accessors
    every operation goes through, so each state type works unchanged.
    """

    __slots__ = ()

    def set_current_namespace(self, namespace: Any) -> None:
        """Scope the following operations to ``namespace`` (for example a window)."""
        self._namespace = namespace

    def get_current_namespace(self) -> Any:
        return self._namespace

    def _read(self) -> Any:
        b = self._backend
        key = (b.current_key, self._namespace)
        if self._table.cow is None:
            return self._maps[b.current_index].get(key)
        return self._table.privatize(self._maps[b.current_index], key)

    def _write(self, value: Any) -> None:
        b = self._backend
        key = (b.current_key, self._namespace)
        self._maps[b.current_index][key] = value
        cow = self._table.cow
        if cow is not None:
            cow.add(key)

    def clear(self) -> None:
        b = self._backend
        self._maps[b.current_index].pop((b.current_key, self._namespace), None)


class _MergingNamespaced(_Namespaced):
    """Namespaced state whose values of several namespaces can be merged into one
    (what merging windows, such as sessions, need)."""

    __slots__ = ()

    def _merge_values(self, a: Any, b: Any) -> Any:
        raise TypeError(f"{type(self).__name__} cannot merge namespaces")

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Fold the current key's values of every namespace in ``sources`` into ``target``'s
        and remove them (Flink's ``InternalMergingState.mergeNamespaces``)."""
        b = self._backend
        m = self._maps[b.current_index]
        key = b.current_key
        table = self._table
        merged: Any = None
        for namespace in sources:
            source_key = (key, namespace)
            # Privatized before it is removed: merging may change it in place, and a
            # snapshot in flight may share it.
            value = m.get(source_key) if table.cow is None else table.privatize(m, source_key)
            if value is None:
                continue
            del m[source_key]
            merged = value if merged is None else self._merge_values(merged, value)
        if merged is None:
            return
        current, self._namespace = self._namespace, target
        try:
            old = self._read()
            self._write(merged if old is None else self._merge_values(old, merged))
        finally:
            self._namespace = current


class HeapNamespacedValueState(_Namespaced, HeapValueState):
    __slots__ = ()

    # Through the namespaced accessors, not the plain handle's inlined ones.
    def value(self) -> Any:
        return self._read()

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
        else:
            self._write(value)


class HeapNamespacedMapState(_Namespaced, HeapMapState):
    __slots__ = ()


class HeapNamespacedListState(_MergingNamespaced, HeapListState):
    __slots__ = ()

    def _merge_values(self, a: Any, b: Any) -> Any:
        a.extend(b)
        return a


class HeapNamespacedReducingState(_MergingNamespaced, HeapReducingState):
    __slots__ = ()

    def _merge_values(self, a: Any, b: Any) -> Any:
        return self._reduce(a, b)


class HeapNamespacedAggregatingState(_MergingNamespaced, HeapAggregatingState):
    __slots__ = ()

    def _merge_values(self, a: Any, b: Any) -> Any:
        return self._agg.merge(a, b)


@dataclass
class SerializedKeyedState:
    """One backend's key groups as one byte string, with the range of each key group."""

    key_group_range: KeyGroupRange
    payload: bytes
    ranges: tuple[Range, ...]
    #: ``(name, kind)`` of every state in the snapshot, recorded in ``_metadata`` for inspection.
    state_kinds: tuple[tuple[str, str], ...] = ()

    def write(
        self, writer: StateWriter, checkpoint_id: int, target_location: str | None
    ) -> WrittenKeyedState:
        """Store the bytes as one stream (nothing when there are none)."""
        if not self.payload:
            return WrittenKeyedState()
        delegate = writer.write_state(checkpoint_id, self.payload, target_location)
        handle = KeyGroupsStateHandle(self.key_group_range, self.ranges, delegate, self.state_kinds)
        size = len(self.payload)
        written = [delegate] if isinstance(delegate, FileStateHandle) else []
        return WrittenKeyedState((handle,), written, size, size)


class HeapSnapshot:
    """Key-group copies taken at the barrier, waiting to be serialized."""

    def __init__(
        self,
        backend: HeapKeyedStateBackend,
        key_group_range: KeyGroupRange,
        copies: dict[str, tuple[str, dict[int, dict[Any, Any]]]],
        serializers: dict[str, StateSerializer] | None = None,
        expiring: dict[str, Callable[[Any, int], Any]] | None = None,
        now_ms: int = 0,
    ) -> None:
        self._backend: HeapKeyedStateBackend | None = backend
        self.key_group_range = key_group_range
        self._copies = copies
        #: The typed states' serializers at the barrier, by name.
        self.serializers = serializers or {}
        #: The TTL states' expiry filters, by name, and the time (at the barrier) they apply.
        self._expiring = expiring or {}
        self._now_ms = now_ms

    @property
    def is_empty(self) -> bool:
        return not any(by_kg for _, by_kg in self._copies.values())

    def serialize(self) -> SerializedKeyedState:
        """Pickle every key group at once."""
        serializer = self.serializer()
        serializer.step(None)
        return serializer.result()

    def serializer(self) -> KeyGroupSerializer:
        """Pickle key group by key group, in steps (see :class:`KeyGroupSerializer`)."""
        return KeyGroupSerializer(self)

    def release(self) -> None:
        """Done with the copies: copy-on-write may stop once no snapshot is in flight."""
        backend, self._backend = self._backend, None
        self._copies = {}
        if backend is not None:
            backend._release()


class KeyGroupSerializer:
    """Serializes a snapshot's key groups in steps of bounded duration.

    Only the copies taken at the barrier are read, which the task never touches,
    so a step may run on any thread, and the task may process records between
    steps. In CPython the task thread is the cheapest place for it: it already
    holds the interpreter lock, where a helper thread would wait for it behind
    every busy task.
    """

    def __init__(self, snapshot: HeapSnapshot) -> None:
        self._snapshot = snapshot
        self._state_kinds = tuple(sorted((name, kind) for name, (kind, _) in snapshot._copies.items()))
        self._key_groups = iter(snapshot.key_group_range)
        self._payload = KeyGroupPayload(serializers=snapshot.serializers)
        self.done = False

    def step(self, deadline_ns: int | None) -> bool:
        """Serialize key groups until ``deadline_ns`` (monotonic) passes; True when done."""
        copies = self._snapshot._copies
        expiring = self._snapshot._expiring
        for kg in self._key_groups:
            group = {name: (kind, by_kg[kg]) for name, (kind, by_kg) in copies.items() if kg in by_kg}
            if expiring:
                group = unexpired(group, expiring, self._snapshot._now_ms)
            self._payload.add(group)
            if deadline_ns is not None and time.monotonic_ns() >= deadline_ns:
                return False
        self.done = True
        return True

    def result(self) -> SerializedKeyedState:
        if not self.done:
            raise RuntimeError("serialization is not finished")
        return self._payload.result(self._snapshot.key_group_range, self._state_kinds)


class KeyGroupPayload:
    """A serialized snapshot being built: one blob per key group, in key-group order (the
    canonical format of :mod:`chandy.state.key_group_format`, which every backend writes
    and restores)."""

    __slots__ = ("_parts", "_ranges", "_offset", "_write", "_serializers")

    def __init__(
        self,
        sink: Callable[[bytes], object] | None = None,
        serializers: dict[str, StateSerializer] | None = None,
    ) -> None:
        """``sink`` takes each key group's blob in order instead of this payload (the
        RocksDB backend spills them to a local file; the heap keeps them in memory for
        :meth:`result` to join). ``serializers`` write the typed states (by name)."""
        self._parts: list[bytes] = []
        self._ranges: list[Range] = []
        self._offset = 0
        self._write = self._parts.append if sink is None else sink
        self._serializers = serializers or {}

    def __len__(self) -> int:
        """How many key groups were added."""
        return len(self._ranges)

    def add(self, group: dict[str, tuple[str, dict[Any, Any]]]) -> None:
        """The next key group: ``{name: (kind, {table key: value})}``, empty if it holds nothing."""
        if group:
            blob = write_key_group(group, self._serializers)
            self._write(blob)
            self._ranges.append((self._offset, self._offset + len(blob)))
            self._offset += len(blob)
        else:
            self._ranges.append((self._offset, self._offset))

    def add_empty(self, count: int) -> None:
        """``count`` key groups that hold nothing."""
        self._ranges.extend([(self._offset, self._offset)] * count)

    @property
    def ranges(self) -> tuple[Range, ...]:
        """Each key group's byte range in the concatenated pickles."""
        return tuple(self._ranges)

    def result(
        self, key_group_range: KeyGroupRange, state_kinds: tuple[tuple[str, str], ...]
    ) -> SerializedKeyedState:
        """The pickles kept in memory, joined (without a ``sink``)."""
        return SerializedKeyedState(key_group_range, b"".join(self._parts), tuple(self._ranges), state_kinds)


def unexpired(
    group: dict[str, tuple[str, dict[Any, Any]]],
    expiring: dict[str, Callable[[Any, int], Any]],
    now: int,
) -> dict[str, tuple[str, dict[Any, Any]]]:
    """A key group's tables without the entries of TTL states that had expired at ``now``
    (the barrier's time; ``expiring`` holds those states' expiry filters, by name).

    Builds new dictionaries and values, never changes ``group``'s: in a heap snapshot they
    may still be shared with the live state (copy-on-write)."""
    kept: dict[str, tuple[str, dict[Any, Any]]] = {}
    for name, (kind, values) in group.items():
        expire = expiring.get(name)
        if expire is None:
            kept[name] = (kind, values)
            continue
        live = {}
        for key, stored in values.items():
            part = expire(stored, now)
            if part is not None:
                live[key] = part
        if live:
            kept[name] = (kind, live)
    return kept


#: descriptor type -> (kind, plain handle type, namespaced handle type)
_KINDS: dict[type, tuple[str, type, type]] = {
    ValueStateDescriptor: ("value", HeapValueState, HeapNamespacedValueState),
    ListStateDescriptor: ("list", HeapListState, HeapNamespacedListState),
    MapStateDescriptor: ("map", HeapMapState, HeapNamespacedMapState),
    ReducingStateDescriptor: ("reducing", HeapReducingState, HeapNamespacedReducingState),
    AggregatingStateDescriptor: ("aggregating", HeapAggregatingState, HeapNamespacedAggregatingState),
}
