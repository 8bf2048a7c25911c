"""Identifiers shared by every layer that talks about a running subtask."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True, slots=True)
class ExecutionAttemptID:
    """Which vertex, which subtask, which attempt."""

    vertex_id: int
    subtask_index: int
    attempt_number: int

    def __str__(self) -> str:
        return f"{self.vertex_id}/{self.subtask_index}#{self.attempt_number}"
