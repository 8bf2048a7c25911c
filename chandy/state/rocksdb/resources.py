"""The memory budget of a slot's RocksDB state, shared by every backend of the slot.

Flink bounds all RocksDB instances of a slot by the slot's managed memory: one block
cache, one write buffer manager charged to it. Chandy does the same, and also bounds its
own cache of decoded values (:mod:`chandy.state.rocksdb.views`), the one memory RocksDB
does not see. The budget is ``state.backend.rocksdb.memory.fixed-per-slot`` if set, else
``taskmanager.memory.managed.size`` (when ``state.backend.rocksdb.memory.managed``). It is
split:

- 3/4 to RocksDB's block cache, whose capacity *includes* the write buffers (the write
  buffer manager, limited to half of it, charges memtables to the cache, Flink's
  ``writeBufferRatio`` of 0.5): blocks and memtables hold every key's bytes compactly;
- 1/4 to the decoded-value caches, divided among the slot's live backends: they hold
  Python objects, several times larger than their bytes, and only the hot keys need them
  (a hit saves a RocksDB get and a decode, ~1 us; a miss costs no more than without them).

With neither option set (``memory.managed: false`` and no fixed size), every backend gets
a budget of its own of the managed size's value: bounded still, but not shared.
"""

from __future__ import annotations

import threading
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from rocksdict import Cache, WriteBufferManager

from chandy.config.configuration import Configuration
from chandy.config.options import RocksDBOptions

#: The share of the budget for RocksDB (block cache including write buffers).
ROCKSDB_SHARE = 0.75
#: The share of RocksDB's part that memtables may take (charged to the block cache).
WRITE_BUFFER_RATIO = 0.5


@dataclass
class SlotMemory:
    """One budget: RocksDB's shared cache and write buffer manager, and the decoded-value
    caches' share (divided among the backends that use it)."""

    budget: int
    cache: Cache
    write_buffer_manager: WriteBufferManager
    value_cache_bytes: int
    _backends: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def of(budget: int) -> SlotMemory:
        rocksdb_bytes = max(1 << 20, int(budget * ROCKSDB_SHARE))
        cache = Cache(rocksdb_bytes)
        manager = WriteBufferManager.new_write_buffer_manager_with_cache(
            max(1 << 19, int(rocksdb_bytes * WRITE_BUFFER_RATIO)), False, cache
        )
        return SlotMemory(budget, cache, manager, max(1 << 16, budget - rocksdb_bytes))

    def attach(self, backend_id: int) -> None:
        with self._lock:
            self._backends.add(backend_id)

    def detach(self, backend_id: int) -> None:
        with self._lock:
            self._backends.discard(backend_id)

    def value_cache_share(self) -> int:
        """The bytes one backend's decoded-value cache may take now."""
        return self.value_cache_bytes // max(1, len(self._backends))


def memory_budget(configuration: Configuration) -> tuple[int, bool]:
    """``(bytes, shared)``: the budget, and whether the slot's backends share it."""
    fixed = configuration.get(RocksDBOptions.FIXED_PER_SLOT)
    if fixed:
        return int(fixed), True
    managed = int(configuration.get(RocksDBOptions.MANAGED_SIZE))
    return managed, bool(configuration.get(RocksDBOptions.MEMORY_MANAGED))


def slot_memory(
    configuration: Configuration, shared_resources: MutableMapping[Any, Any], slot_index: int
) -> SlotMemory | None:
    """The slot's shared budget (created by the first backend factory of the slot and kept in
    ``shared_resources`` as long as the process's tasks), or ``None`` when every backend
    gets a budget of its own."""
    budget, shared = memory_budget(configuration)
    if not shared:
        return None
    key = ("rocksdb-memory", slot_index, budget)
    memory = shared_resources.get(key)
    if memory is None:
        memory = shared_resources[key] = SlotMemory.of(budget)
    assert isinstance(memory, SlotMemory)
    return memory
