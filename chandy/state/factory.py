"""Which keyed state backend an operator subtask gets: the configured one.

``state.backend.type`` chooses: ``hashmap`` (the default) builds a
:class:`~chandy.state.heap.HeapKeyedStateBackend`; ``rocksdb`` an embedded RocksDB
per operator subtask (:mod:`chandy.state.rocksdb`, imported only then, so a job on
the heap never loads the RocksDB library).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from chandy.config.configuration import Configuration
from chandy.config.options import StateBackendOptions
from chandy.state.backend import KeyedStateBackend, KeyedStateBackendFactory
from chandy.state.heap import HeapKeyedStateBackend
from chandy.state.key_groups import KeyGroupRange
from chandy.util.clock import Clock


def keyed_state_backend_factory(
    config: Mapping[str, Any], shared_resources: MutableMapping[Any, Any], slot_index: int
) -> KeyedStateBackendFactory:
    """The factory of keyed state backends for the tasks of one slot.

    ``shared_resources`` lives as long as the process's tasks (``TaskServices``): a backend
    that shares memory between the subtasks of a slot (RocksDB's block cache and write
    buffers) keeps it there under ``slot_index``.
    """
    configuration = Configuration(config)
    if configuration.get(StateBackendOptions.TYPE) == "rocksdb":
        from chandy.state.rocksdb.factory import rocksdb_backend_factory  # deferred: loads rocksdict

        return rocksdb_backend_factory(configuration, shared_resources, slot_index)

    def create(
        key_group_range: KeyGroupRange, max_parallelism: int, owner: str, clock: Clock
    ) -> KeyedStateBackend:
        return HeapKeyedStateBackend(key_group_range, max_parallelism, owner=owner, clock=clock)

    return create
