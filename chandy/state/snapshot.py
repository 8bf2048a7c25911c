"""What one subtask snapshotted: per operator, its keyed and operator state handles."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from chandy.state.handles import (
    FileStateHandle,
    KeyGroupsStateHandle,
    OperatorStateHandle,
    StreamStateHandle,
)


@dataclass(frozen=True)
class OperatorSubtaskState:
    """The state of one operator in one subtask."""

    managed_keyed_state: tuple[KeyGroupsStateHandle, ...] = ()
    managed_operator_state: tuple[OperatorStateHandle, ...] = ()
    #: The subtask had finished (all its input read and committed) before this checkpoint:
    #: a restore gives it no state and, being restored, it reads nothing again.
    finished: bool = False

    @property
    def state_size(self) -> int:
        return sum(h.state_size for h in self.managed_keyed_state) + sum(
            h.state_size for h in self.managed_operator_state
        )

    def stream_handles(self) -> Iterator[StreamStateHandle]:
        for keyed in self.managed_keyed_state:
            yield keyed.delegate
        for operator in self.managed_operator_state:
            yield operator.delegate

    def is_empty(self) -> bool:
        return not self.managed_keyed_state and not self.managed_operator_state


@dataclass(frozen=True)
class TaskStateSnapshot:
    """Every operator's state in one subtask, by operator id."""

    subtask_states: dict[str, OperatorSubtaskState] = field(default_factory=dict)

    @property
    def state_size(self) -> int:
        return sum(s.state_size for s in self.subtask_states.values())

    def file_handles(self) -> list[FileStateHandle]:
        """Every file this snapshot references (to discard an unused snapshot)."""
        found: dict[str, FileStateHandle] = {}
        for state in self.subtask_states.values():
            for handle in state.stream_handles():
                if isinstance(handle, FileStateHandle):
                    found[handle.path] = handle
        return list(found.values())
