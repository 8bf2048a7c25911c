"""Operator (non-keyed) state: named lists per subtask, redistributed on restore.

A function that is not on a keyed stream keeps its checkpointed data here, as
Flink's ``OperatorStateStore``: ``get_list_state`` (split-distribute: on restore
at another parallelism the elements of all subtasks are dealt out to the new subtasks;
at the same one each subtask keeps its own) and
``get_union_list_state`` (every new subtask gets every element). Source readers
keep their splits here; two-phase-commit sinks their pending transactions.

Broadcast state (``get_broadcast_state``, Flink's ``BroadcastState``) is a map
per name that every subtask holds a copy of, written only by the broadcast side
of a broadcast process function. Each subtask snapshots its own copy, one element
per entry, in ``BROADCAST`` mode; a restore gives every new subtask exactly one
copy, whatever the old and new parallelism (see
:func:`chandy.checkpoint.state_assignment.repartition_operator_state`).

Elements are serialized one by one in the synchronous part of a checkpoint
(operator state is small: offsets, transaction ids, rules), so the snapshot can
never see a later change; the handle records each element's byte range, which
lets the JobMaster redistribute elements without reading them. An element of a
state whose descriptor declares ``Types`` is written as data (the typed encoding of
:mod:`chandy.state.typed`, whose first byte is a tag below 0x80); any other is
pickled (a pickle starts with 0x80), and read back by the restricted unpickler.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from typing import Any

from chandy.core.state import (
    BroadcastState,
    ListState,
    ListStateDescriptor,
    MapStateDescriptor,
    ReadOnlyBroadcastState,
)
from chandy.core.types import MapTypeInfo, Types
from chandy.errors import InvalidCheckpointError
from chandy.state.codec import decode
from chandy.state.handles import (
    OperatorStateDistributionMode,
    OperatorStateMeta,
    Range,
    StreamStateHandle,
)
from chandy.state.heap import IncompatibleRestoredStateError, IncompatibleStateError
from chandy.state.missing_classes import load_state
from chandy.state.typed import StateSerializer, declared_type
from chandy.state.unpicklable import unpicklable_state_error
from chandy.state.unpickling import DEFAULT_POLICY, UnpicklingPolicy

#: How a function declares operator state of each mode.
_ACCESSORS = {
    OperatorStateDistributionMode.SPLIT_DISTRIBUTE: "get_list_state",
    OperatorStateDistributionMode.UNION: "get_union_list_state",
    OperatorStateDistributionMode.BROADCAST: "DataStream.broadcast(MapStateDescriptor)",
}
_SPLIT = OperatorStateDistributionMode.SPLIT_DISTRIBUTE
_BROADCAST = OperatorStateDistributionMode.BROADCAST


#: The first byte of a pickle (protocol 2 and later: the PROTO opcode); typed elements start below it.
_PICKLE_START = 0x80


class OperatorListState(ListState):
    """A list of elements for the whole subtask (no current key)."""

    __slots__ = ("name", "mode", "elements", "serializer")

    def __init__(self, name: str, mode: OperatorStateDistributionMode) -> None:
        self.name = name
        self.mode = mode
        self.elements: list[Any] = []
        #: Writes the elements when the descriptor declares ``Types``; ``None``: pickled.
        self.serializer: StateSerializer | None = None

    def get(self) -> Iterable[Any]:
        return tuple(self.elements)

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError(f"operator state '{self.name}': None cannot be stored in a list state")
        self.elements.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        for value in values:
            self.add(value)

    def update(self, values: Iterable[Any]) -> None:
        self.elements = []
        self.add_all(values if values is not None else ())

    def clear(self) -> None:
        self.elements = []


class HeapBroadcastState(BroadcastState):
    """One broadcast state of one subtask: a plain dict.

    ``items``, ``keys`` and ``values`` return lists, so a function may remove entries
    while it iterates (dropping outdated rules is the common case)."""

    __slots__ = ("name", "entries", "read_only", "serializer")

    def __init__(self, name: str) -> None:
        self.name = name
        self.entries: dict[Any, Any] = {}
        #: Writes the ``(key, value)`` entries when the descriptor declares both types.
        self.serializer: StateSerializer | None = None
        #: The view the element side gets (one object, made once).
        self.read_only = ImmutableBroadcastState(self)

    def get(self, key: Any) -> Any:
        return self.entries.get(key)

    def contains(self, key: Any) -> bool:
        return key in self.entries

    def items(self) -> list[tuple[Any, Any]]:
        return list(self.entries.items())

    def keys(self) -> list[Any]:
        return list(self.entries)

    def values(self) -> list[Any]:
        return list(self.entries.values())

    def is_empty(self) -> bool:
        return not self.entries

    def put(self, key: Any, value: Any) -> None:
        self.entries[key] = value

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        self.entries.update(dict_value)

    def remove(self, key: Any) -> None:
        self.entries.pop(key, None)

    def clear(self) -> None:
        self.entries.clear()


class ImmutableBroadcastState(ReadOnlyBroadcastState):
    """The element side's view of a broadcast state: reads go to the state, writes are
    refused (Flink's ``ImmutableMapState``), since only the broadcast side sees the same
    elements on every subtask and may therefore change the state."""

    __slots__ = ("_state",)

    def __init__(self, state: HeapBroadcastState) -> None:
        self._state = state

    def get(self, key: Any) -> Any:
        return self._state.entries.get(key)

    def contains(self, key: Any) -> bool:
        return key in self._state.entries

    def items(self) -> list[tuple[Any, Any]]:
        return self._state.items()

    def keys(self) -> list[Any]:
        return self._state.keys()

    def values(self) -> list[Any]:
        return self._state.values()

    def is_empty(self) -> bool:
        return not self._state.entries

    def _refuse(self, *args: Any) -> None:
        raise TypeError(
            f"broadcast state '{self._state.name}' is read-only in process_element (and "
            "on_timer): change it in process_broadcast_element, which every subtask runs for "
            "every broadcast element, so that all subtasks keep the same state"
        )

    clear = put = put_all = remove = __setitem__ = __delitem__ = _refuse


class OperatorStateBackend:
    """All operator state of one operator in one subtask."""

    def __init__(self) -> None:
        self.states: dict[str, OperatorListState] = {}
        self.broadcast_states: dict[str, HeapBroadcastState] = {}
        #: Who holds this state, for errors: "operator 'Sink' (uid 'files')".
        self.owner = "the operator"
        #: The mode of every state a restore brought back, by name.
        self._restored_modes: dict[str, OperatorStateDistributionMode] = {}

    def _get(self, descriptor: ListStateDescriptor, mode: OperatorStateDistributionMode) -> OperatorListState:
        if not isinstance(descriptor, ListStateDescriptor):
            raise TypeError("operator state is a list: use a ListStateDescriptor")
        name = descriptor.name
        state = self.states.get(name)
        if state is None:
            if name in self.broadcast_states:
                raise self._incompatible(name, _BROADCAST, mode)
            state = self.states[name] = OperatorListState(name, mode)
        elif state.mode is not mode:
            raise self._incompatible(name, state.mode, mode)
        declared = declared_type(descriptor)
        state.serializer = None if declared is None else StateSerializer(name, "value", declared)
        return state

    def _incompatible(
        self, name: str, held: OperatorStateDistributionMode, requested: OperatorStateDistributionMode
    ) -> IncompatibleStateError:
        """The error for state ``name`` held in mode ``held`` and now declared as ``requested``."""
        if self._restored_modes.get(name) is held:
            return IncompatibleRestoredStateError(
                f"{self.owner} cannot restore operator state '{name}': the checkpoint "
                f"holds it as {held.value} state and the job now declares it as "
                f"{requested.value} ({_ACCESSORS[requested]}). A state keeps its kind across restores. "
                f"Declare it with {_ACCESSORS[held]} again, or give the new state another "
                "name (the old one is then left unused), or start the operator without state: "
                "give it a new uid() and restore with "
                "execution.state-recovery.ignore-unclaimed-state: true"
            )
        return IncompatibleStateError(
            f"{self.owner}: operator state '{name}' was registered as "
            f"{held.value} and is now requested as {requested.value}"
        )

    def get_list_state(self, descriptor: ListStateDescriptor) -> OperatorListState:
        """Split-distribute list state (Flink's ``getListState``)."""
        return self._get(descriptor, OperatorStateDistributionMode.SPLIT_DISTRIBUTE)

    def get_union_list_state(self, descriptor: ListStateDescriptor) -> OperatorListState:
        """Union list state: after a restore every subtask sees all elements."""
        return self._get(descriptor, OperatorStateDistributionMode.UNION)

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> HeapBroadcastState:
        """The subtask's copy of broadcast state ``descriptor.name`` (created empty, or as
        restored): Flink's ``OperatorStateStore.getBroadcastState``."""
        if not isinstance(descriptor, MapStateDescriptor):
            raise TypeError(
                f"broadcast state is a map: use a MapStateDescriptor, got {type(descriptor).__name__}"
            )
        name = descriptor.name
        state = self.broadcast_states.get(name)
        if state is None:
            listed = self.states.get(name)
            if listed is not None:
                raise self._incompatible(name, listed.mode, _BROADCAST)
            state = self.broadcast_states[name] = HeapBroadcastState(name)
        declared = declared_type(descriptor)
        if declared is not None:
            assert isinstance(declared, MapTypeInfo)
            entry = Types.TUPLE([declared._key_type_info, declared._value_type_info])
            state.serializer = StateSerializer(name, "map", declared, stored=entry)
        return state

    def get_registered_state_names(self) -> set[str]:
        return set(self.states)

    def get_registered_broadcast_state_names(self) -> set[str]:
        return set(self.broadcast_states)

    def snapshot(self) -> tuple[bytes, dict[str, OperatorStateMeta]] | None:
        """Every element pickled now, with its byte range; ``None`` if there is no state."""
        if not self.states and not self.broadcast_states:
            return None
        parts: list[bytes] = []
        metas: dict[str, OperatorStateMeta] = {}
        offset = 0
        named: list[tuple[str, OperatorStateDistributionMode, Iterable[Any], StateSerializer | None]] = [
            (name, state.mode, state.elements, state.serializer) for name, state in self.states.items()
        ]
        # a broadcast state is a map: one (key, value) element per entry
        named += [
            (name, _BROADCAST, state.entries.items(), state.serializer)
            for name, state in self.broadcast_states.items()
        ]
        for name, mode, elements, serializer in named:
            ranges: list[Range] = []
            for element in elements:
                if serializer is not None:
                    blob = serializer.encode(element)
                else:
                    try:
                        blob = pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL)
                    except Exception as exc:
                        raise unpicklable_state_error(name, element, exc) from exc
                parts.append(blob)
                ranges.append((offset, offset + len(blob)))
                offset += len(blob)
            metas[name] = OperatorStateMeta(mode, tuple(ranges))
        return b"".join(parts), metas

    def restore(
        self,
        handles: Iterable[tuple[dict[str, OperatorStateMeta], StreamStateHandle]],
        read: Callable[[StreamStateHandle, Range], bytes],
        policy: UnpicklingPolicy = DEFAULT_POLICY,
    ) -> None:
        """Load the elements assigned to this subtask (already redistributed): for a
        broadcast state, one old subtask's copy. Pickled elements are read under ``policy``."""
        for metas, delegate in handles:
            for name, meta in metas.items():
                if meta.mode is _BROADCAST:
                    self._restored_modes[name] = meta.mode
                    entries = self.get_broadcast_state(MapStateDescriptor(name)).entries
                    for byte_range in meta.elements:
                        entry = self._element(read(delegate, byte_range), name, "broadcast ", policy)
                        if not isinstance(entry, tuple) or len(entry) != 2:
                            raise self._corrupt(
                                name, "broadcast ", ValueError("an entry is not a (key, value) pair")
                            )
                        key, value = entry
                        entries[key] = value
                    continue
                state = self.states.get(name)
                if state is None:
                    state = self.states[name] = OperatorListState(name, meta.mode)
                    self._restored_modes[name] = meta.mode
                for byte_range in meta.elements:
                    state.elements.append(
                        self._element(read(delegate, byte_range), name, "operator ", policy)
                    )

    def _element(self, data: bytes, name: str, kind: str, policy: UnpicklingPolicy) -> Any:
        """One restored element: pickled (read under ``policy``) or typed (data)."""
        if not data or data[0] == _PICKLE_START:
            return load_state(data, self.owner, name, kind, policy)

        def loads(pickled: bytes) -> Any:  # a PICKLED_BYTE_ARRAY part of a declared type
            return load_state(pickled, self.owner, name, kind, policy)

        try:
            return decode(data, loads)
        except (ValueError, IndexError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as exc:
            raise self._corrupt(name, kind, exc) from exc

    def _corrupt(self, name: str, kind: str, error: BaseException) -> InvalidCheckpointError:
        return InvalidCheckpointError(
            f"{self.owner} cannot restore {kind}state '{name}': its bytes are corrupt "
            f"({type(error).__name__}: {error}). Restore from another checkpoint."
        )
