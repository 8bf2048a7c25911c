"""Operator (non-keyed) state: named lists per subtask, redistributed on restore.

A function that is not on a keyed stream keeps its checkpointed data here, as
Flink's ``OperatorStateStore``: ``get_list_state`` (split-distribute: on restore
the elements of all subtasks are dealt round-robin to the new subtasks) and
``get_union_list_state`` (every new subtask gets every element). Source readers
keep their splits here; two-phase-commit sinks their pending transactions.

Elements are pickled one by one in the synchronous part of a checkpoint
(operator state is small: offsets, transaction ids), so the snapshot can never
see a later change; the handle records each element's byte range, which lets
the JobMaster redistribute elements without reading them.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from typing import Any

from chandy.core.state import ListState, ListStateDescriptor
from chandy.state.handles import (
    OperatorStateDistributionMode,
    OperatorStateMeta,
    Range,
    StreamStateHandle,
)
from chandy.state.heap import IncompatibleRestoredStateError, IncompatibleStateError

#: How a function declares operator state of each mode.
_ACCESSORS = {
    OperatorStateDistributionMode.SPLIT_DISTRIBUTE: "get_list_state",
    OperatorStateDistributionMode.UNION: "get_union_list_state",
    OperatorStateDistributionMode.BROADCAST: "a broadcast state",
}


class OperatorListState(ListState):
    """A list of elements for the whole subtask (no current key)."""

    __slots__ = ("name", "mode", "elements")

    def __init__(self, name: str, mode: OperatorStateDistributionMode) -> None:
        self.name = name
        self.mode = mode
        self.elements: list[Any] = []

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


class OperatorStateBackend:
    """All operator state of one operator in one subtask."""

    def __init__(self) -> None:
        self.states: dict[str, OperatorListState] = {}
        #: Who holds this state, for errors: "operator 'Sink' (uid 'files')".
        self.owner = "the operator"
        #: The mode of every state a restore brought back, by name.
        self._restored_modes: dict[str, OperatorStateDistributionMode] = {}

    def _get(self, descriptor: ListStateDescriptor, mode: OperatorStateDistributionMode) -> OperatorListState:
        if not isinstance(descriptor, ListStateDescriptor):
            raise TypeError("operator state is a list: use a ListStateDescriptor")
        state = self.states.get(descriptor.name)
        if state is None:
            state = self.states[descriptor.name] = OperatorListState(descriptor.name, mode)
        elif state.mode is not mode:
            if self._restored_modes.get(descriptor.name) is state.mode:
                raise IncompatibleRestoredStateError(
                    f"{self.owner} cannot restore operator state '{descriptor.name}': the checkpoint "
                    f"holds it as {state.mode.value} list state and the job now declares it as "
                    f"{mode.value} ({_ACCESSORS[mode]}). A state keeps its kind across restores. "
                    f"Declare it with {_ACCESSORS[state.mode]} again, or give the new state another "
                    "name (the old one is then left unused), or start the operator without state: "
                    "give it a new uid() and restore with "
                    "execution.state-recovery.ignore-unclaimed-state: true"
                )
            raise IncompatibleStateError(
                f"{self.owner}: operator state '{descriptor.name}' was registered as "
                f"{state.mode.value} and is now requested as {mode.value}"
            )
        return state

    def get_list_state(self, descriptor: ListStateDescriptor) -> OperatorListState:
        """Split-distribute list state (Flink's ``getListState``)."""
        return self._get(descriptor, OperatorStateDistributionMode.SPLIT_DISTRIBUTE)

    def get_union_list_state(self, descriptor: ListStateDescriptor) -> OperatorListState:
        """Union list state: after a restore every subtask sees all elements."""
        return self._get(descriptor, OperatorStateDistributionMode.UNION)

    def get_registered_state_names(self) -> set[str]:
        return set(self.states)

    def snapshot(self) -> tuple[bytes, dict[str, OperatorStateMeta]] | None:
        """Every element pickled now, with its byte range; ``None`` if there is no state."""
        if not self.states:
            return None
        parts: list[bytes] = []
        metas: dict[str, OperatorStateMeta] = {}
        offset = 0
        for name, state in self.states.items():
            ranges: list[Range] = []
            for element in state.elements:
                blob = pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL)
                parts.append(blob)
                ranges.append((offset, offset + len(blob)))
                offset += len(blob)
            metas[name] = OperatorStateMeta(state.mode, tuple(ranges))
        return b"".join(parts), metas

    def restore(
        self,
        handles: Iterable[tuple[dict[str, OperatorStateMeta], StreamStateHandle]],
        read: Callable[[StreamStateHandle, Range], bytes],
    ) -> None:
        """Load the elements assigned to this subtask (already redistributed)."""
        for metas, delegate in handles:
            for name, meta in metas.items():
                state = self.states.get(name)
                if state is None:
                    state = self.states[name] = OperatorListState(name, meta.mode)
                    self._restored_modes[name] = meta.mode
                for byte_range in meta.elements:
                    state.elements.append(pickle.loads(read(delegate, byte_range)))
