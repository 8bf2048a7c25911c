"""The heap keyed state backend: Python objects in dictionaries, one per key group.

Why one dictionary per key group: a snapshot is written per key group (the unit
of rescaling), so grouping at write time would mean hashing every key again.
The keyed partitioner upstream already computed each record's key group; the
operator hands it to :meth:`HeapKeyedStateBackend.set_current_key` and a state
access is two list/dict lookups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from chandy.api.state import (
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    State,
    StateDescriptor,
    ValueState,
    ValueStateDescriptor,
)
from chandy.state.backend import KeyedStateBackend
from chandy.state.key_groups import KeyGroupRange


class StateTable:
    """All keys' values of one named state: ``maps[key_group][key] -> value``.

    ``maps`` is indexed by the absolute key group (entries outside this
    backend's range are ``None``): a list of ``max_parallelism`` references
    costs little and saves a subtraction on every state access.
    """

    __slots__ = ("name", "kind", "maps", "key_group_range")

    def __init__(self, name: str, kind: str, key_group_range: KeyGroupRange,
                 max_parallelism: int) -> None:
        self.name = name
        self.kind = kind
        self.key_group_range = key_group_range
        self.maps: list[dict[Any, Any] | None] = [None] * max_parallelism
        for kg in key_group_range:
            self.maps[kg] = {}

    def key_group_maps(self) -> list[tuple[int, dict[Any, Any]]]:
        """``(key_group, map)`` for every key group of the range."""
        return [(kg, self.maps[kg]) for kg in self.key_group_range]  # type: ignore[misc]

    def __len__(self) -> int:
        return sum(len(m) for _, m in self.key_group_maps())


class HeapKeyedStateBackend(KeyedStateBackend):
    """Keyed state on the Python heap."""

    def __init__(self, key_group_range: KeyGroupRange, max_parallelism: int) -> None:
        super().__init__(key_group_range, max_parallelism)
        self.tables: dict[str, StateTable] = {}
        self._handles: dict[str, State] = {}
        self.current_key: Any = None
        self.current_index = key_group_range.start  # the key group of the current key

    def set_current_key(self, key: Any, key_group: int) -> None:
        if key_group not in self.key_group_range:
            raise ValueError(f"key {key!r} is in key group {key_group}, outside this backend's "
                             f"range {self.key_group_range}")
        self.current_key = key
        self.current_index = key_group

    def get_current_key(self) -> Any:
        return self.current_key

    def get_partitioned_state(self, descriptor: StateDescriptor) -> State:
        kind = _KINDS.get(type(descriptor))
        if kind is None:
            raise TypeError(f"unsupported state descriptor {type(descriptor).__name__}")
        kind_name, handle_type = kind
        table = self.tables.get(descriptor.name)
        if table is None:
            table = StateTable(descriptor.name, kind_name, self.key_group_range,
                               self.max_parallelism)
            self.tables[descriptor.name] = table
        elif table.kind != kind_name:
            raise ValueError(
                f"state '{descriptor.name}' holds {table.kind} state and is now requested as "
                f"{kind_name} state; use a different name for each state")
        handle = self._handles.get(descriptor.name)
        if handle is None:
            handle = handle_type(self, table, descriptor)
            self._handles[descriptor.name] = handle
        return handle

    def num_keys(self, state_name: str) -> int:
        table = self.tables.get(state_name)
        return 0 if table is None else len(table)

    def dispose(self) -> None:
        self.tables.clear()
        self._handles.clear()


class HeapValueState(ValueState):
    __slots__ = ("_backend", "_maps")

    def __init__(self, backend: HeapKeyedStateBackend, table: StateTable,
                 descriptor: StateDescriptor) -> None:
        self._backend = backend
        self._maps = table.maps

    def value(self) -> Any:
        b = self._backend
        return self._maps[b.current_index].get(b.current_key)

    def update(self, value: Any) -> None:
        b = self._backend
        if value is None:
            self._maps[b.current_index].pop(b.current_key, None)
        else:
            self._maps[b.current_index][b.current_key] = value

    def clear(self) -> None:
        b = self._backend
        self._maps[b.current_index].pop(b.current_key, None)


class HeapReducingState(ReducingState):
    __slots__ = ("_backend", "_maps", "_reduce")

    def __init__(self, backend: HeapKeyedStateBackend, table: StateTable,
                 descriptor: StateDescriptor) -> None:
        assert isinstance(descriptor, ReducingStateDescriptor)
        self._backend = backend
        self._maps = table.maps
        self._reduce: Callable[[Any, Any], Any] = descriptor.reduce_function

    def get(self) -> Any:
        b = self._backend
        return self._maps[b.current_index].get(b.current_key)

    def add(self, value: Any) -> None:
        b = self._backend
        m = self._maps[b.current_index]
        key = b.current_key
        old = m.get(key)
        m[key] = value if old is None else self._reduce(old, value)

    def clear(self) -> None:
        b = self._backend
        self._maps[b.current_index].pop(b.current_key, None)


class HeapListState(ListState):
    __slots__ = ("_backend", "_maps")

    def __init__(self, backend: HeapKeyedStateBackend, table: StateTable,
                 descriptor: StateDescriptor) -> None:
        self._backend = backend
        self._maps = table.maps

    def get(self) -> Iterable[Any]:
        b = self._backend
        return tuple(self._maps[b.current_index].get(b.current_key, ()))

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("ListState.add(None): None cannot be stored in a list state")
        b = self._backend
        m = self._maps[b.current_index]
        values = m.get(b.current_key)
        if values is None:
            m[b.current_key] = [value]
        else:
            values.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        items = list(values)
        if any(v is None for v in items):
            raise ValueError("ListState.add_all: None cannot be stored in a list state")
        if not items:
            return
        b = self._backend
        m = self._maps[b.current_index]
        current = m.get(b.current_key)
        if current is None:
            m[b.current_key] = items
        else:
            current.extend(items)

    def update(self, values: Iterable[Any]) -> None:
        items = list(values) if values is not None else []
        if any(v is None for v in items):
            raise ValueError("ListState.update: None cannot be stored in a list state")
        b = self._backend
        m = self._maps[b.current_index]
        if items:
            m[b.current_key] = items
        else:
            m.pop(b.current_key, None)

    def clear(self) -> None:
        b = self._backend
        self._maps[b.current_index].pop(b.current_key, None)


class HeapMapState(MapState):
    __slots__ = ("_backend", "_maps")

    def __init__(self, backend: HeapKeyedStateBackend, table: StateTable,
                 descriptor: StateDescriptor) -> None:
        self._backend = backend
        self._maps = table.maps

    def _current(self) -> dict[Any, Any] | None:
        b = self._backend
        return self._maps[b.current_index].get(b.current_key)

    def _current_for_write(self) -> dict[Any, Any]:
        b = self._backend
        m = self._maps[b.current_index]
        d = m.get(b.current_key)
        if d is None:
            d = m[b.current_key] = {}
        return d

    def get(self, key: Any) -> Any:
        d = self._current()
        return None if d is None else d.get(key)

    def put(self, key: Any, value: Any) -> None:
        self._current_for_write()[key] = value

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        if dict_value:
            self._current_for_write().update(dict_value)

    def remove(self, key: Any) -> None:
        b = self._backend
        m = self._maps[b.current_index]
        d = m.get(b.current_key)
        if d is not None:
            d.pop(key, None)
            if not d:
                del m[b.current_key]

    def contains(self, key: Any) -> bool:
        d = self._current()
        return d is not None and key in d

    def items(self) -> Iterator[tuple[Any, Any]]:
        d = self._current()
        return iter(list(d.items()) if d else ())

    def keys(self) -> Iterator[Any]:
        d = self._current()
        return iter(list(d) if d else ())

    def values(self) -> Iterator[Any]:
        d = self._current()
        return iter(list(d.values()) if d else ())

    def is_empty(self) -> bool:
        return not self._current()

    def clear(self) -> None:
        b = self._backend
        self._maps[b.current_index].pop(b.current_key, None)


_KINDS: dict[type, tuple[str, type]] = {
    ValueStateDescriptor: ("value", HeapValueState),
    ListStateDescriptor: ("list", HeapListState),
    MapStateDescriptor: ("map", HeapMapState),
    ReducingStateDescriptor: ("reducing", HeapReducingState),
}
