"""Checkpoint ids: strictly increasing, and continuing after a restore."""

from __future__ import annotations

import threading


class CheckpointIDCounter:
    """Flink's ``StandaloneCheckpointIDCounter``: ids start at 1."""

    INITIAL_CHECKPOINT_ID = 1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = self.INITIAL_CHECKPOINT_ID

    def get_and_increment(self) -> int:
        with self._lock:
            value = self._next
            self._next += 1
            return value

    def get(self) -> int:
        """The id the next checkpoint will get."""
        return self._next

    def set_count(self, next_id: int) -> None:
        """After a restore of checkpoint n, continue at n + 1 (never reuse an id)."""
        with self._lock:
            self._next = max(self._next, next_id)
