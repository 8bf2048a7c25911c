"""The coordinator's view of one operator's state in a checkpoint: its subtasks' states."""

from __future__ import annotations

from dataclasses import dataclass, field

from chandy.state.snapshot import OperatorSubtaskState


@dataclass
class OperatorState:
    """Flink's ``OperatorState``: parallelism, max parallelism and state per subtask index."""

    operator_id: str
    parallelism: int
    max_parallelism: int
    subtask_states: dict[int, OperatorSubtaskState] = field(default_factory=dict)

    def put_state(self, subtask_index: int, state: OperatorSubtaskState) -> None:
        if not 0 <= subtask_index < self.parallelism:
            raise IndexError(f"subtask {subtask_index} outside parallelism {self.parallelism}")
        self.subtask_states[subtask_index] = state

    @property
    def state_size(self) -> int:
        return sum(s.state_size for s in self.subtask_states.values())
