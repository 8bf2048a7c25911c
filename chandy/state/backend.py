"""The keyed state backend contract.

A backend holds the keyed state of one operator subtask for its key-group
range. The operator sets the current key (and its key group, which the keyed
partitioner already computed, so the hot path never hashes twice) before it
calls the user function; every state handle then reads and writes under that
key. The heap backend keeps Python objects in dictionaries per key group; a
RocksDB backend would keep serialized bytes under a key-group prefix. Both
snapshot per key group, which is what makes rescaling possible.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from chandy.core.state import State, StateDescriptor
from chandy.state.key_groups import KeyGroupRange


class KeyedStateBackend(ABC):
    """Keyed state of one operator subtask."""

    def __init__(self, key_group_range: KeyGroupRange, max_parallelism: int) -> None:
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism

    @abstractmethod
    def set_current_key(self, key: Any, key_group: int) -> None:
        """Scope every state handle to ``key`` (which lies in ``key_group``)."""

    @abstractmethod
    def get_current_key(self) -> Any: ...

    @abstractmethod
    def get_partitioned_state(self, descriptor: StateDescriptor) -> State:
        """The handle for ``descriptor``; the same name always gives the same state."""

    @abstractmethod
    def num_keys(self, state_name: str) -> int:
        """How many keys hold a value in ``state_name`` (for tests and metrics)."""

    def dispose(self) -> None:
        """Drop all state (the task is going away)."""
