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
    #: The ``uid()`` the user gave the operator (``None``: unset, or an older checkpoint).
    uid: str | None = None
    #: The operator's name when it was checkpointed (``None`` in older checkpoints).
    name: str | None = None

    def describe(self) -> str:
        """The operator as a user recognizes it: name, uid and operator id, as far as known."""
        parts = [f"operator '{self.name}'" if self.name else "operator"]
        if self.uid is not None:
            parts.append(f"uid '{self.uid}'")
        else:
            parts.append("no uid")
        parts.append(f"operator id {self.operator_id}")
        return f"{parts[0]} ({', '.join(parts[1:])})"

    def put_state(self, subtask_index: int, state: OperatorSubtaskState) -> None:
        if not 0 <= subtask_index < self.parallelism:
            raise IndexError(f"subtask {subtask_index} outside parallelism {self.parallelism}")
        self.subtask_states[subtask_index] = state

    @property
    def state_size(self) -> int:
        return sum(s.state_size for s in self.subtask_states.values())
