"""Test probes: objects that stay the same object when a job copies its functions.

Every subtask gets its own deserialized copy of each user function, so a list
captured by a test function would be copied too. A :class:`Probe` pickles as a
reference into this process's registry, so tasks running in this process (the
local executor) all write into the one the test holds.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

_registry: dict[int, Probe] = {}
_ids = itertools.count()


def _lookup(probe_id: int) -> Probe:
    return _registry[probe_id]


class Probe:
    """A thread-safe bag of values and counters shared by the test and its tasks."""

    def __init__(self) -> None:
        self.id = next(_ids)
        self.lock = threading.Lock()
        self.items: list[Any] = []
        self.counters: dict[str, int] = {}
        _registry[self.id] = self

    def append(self, value: Any) -> None:
        with self.lock:
            self.items.append(value)

    def add(self, name: str, amount: int = 1) -> int:
        with self.lock:
            value = self.counters.get(name, 0) + amount
            self.counters[name] = value
            return value

    def get(self, name: str) -> int:
        return self.counters.get(name, 0)

    def maximum(self, name: str, value: int) -> None:
        with self.lock:
            self.counters[name] = max(value, self.counters.get(name, value))

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _lookup, (self.id,)
