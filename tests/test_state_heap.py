"""The heap keyed state backend: each state type, scoped to the current key."""

from __future__ import annotations

import pytest

from chandy.api.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from chandy.state.heap import HeapKeyedStateBackend
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group


@pytest.fixture
def backend() -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(KeyGroupRange(0, 127), 128)


def at(backend: HeapKeyedStateBackend, key: object) -> None:
    backend.set_current_key(key, assign_to_key_group(key, 128))


def test_value_state_is_per_key(backend: HeapKeyedStateBackend) -> None:
    state = backend.get_partitioned_state(ValueStateDescriptor("v"))
    at(backend, "a")
    assert state.value() is None
    state.update(1)
    at(backend, "b")
    assert state.value() is None
    state.update(2)
    at(backend, "a")
    assert state.value() == 1
    state.clear()
    assert state.value() is None
    at(backend, "b")
    state.update(None)  # None clears, as in Flink
    assert backend.num_keys("v") == 0


def test_list_state(backend: HeapKeyedStateBackend) -> None:
    state = backend.get_partitioned_state(ListStateDescriptor("l"))
    at(backend, 1)
    assert list(state.get()) == []
    state.add("x")
    state.add_all(["y", "z"])
    assert list(state.get()) == ["x", "y", "z"]
    state.update(["q"])
    assert list(state.get()) == ["q"]
    with pytest.raises(ValueError, match="None"):
        state.add(None)
    at(backend, 2)
    assert list(state.get()) == []
    at(backend, 1)
    state.update([])
    assert list(state.get()) == []
    assert backend.num_keys("l") == 0


def test_map_state(backend: HeapKeyedStateBackend) -> None:
    state = backend.get_partitioned_state(MapStateDescriptor("m"))
    at(backend, "k")
    assert state.is_empty()
    state.put("a", 1)
    state["b"] = 2
    state.put_all({"c": 3})
    assert state.get("a") == 1 and state["b"] == 2
    assert "c" in state and state.contains("c") and not state.contains("zz")
    assert sorted(state.keys()) == ["a", "b", "c"]
    assert sorted(state.values()) == [1, 2, 3]
    assert sorted(state.items()) == [("a", 1), ("b", 2), ("c", 3)]
    for k in state:  # iterating while removing is safe
        del state[k]
    assert state.is_empty()
    assert backend.num_keys("m") == 0


def test_reducing_state(backend: HeapKeyedStateBackend) -> None:
    state = backend.get_partitioned_state(ReducingStateDescriptor("r", lambda a, b: a + b))
    at(backend, "k")
    assert state.get() is None
    for v in (1, 2, 3):
        state.add(v)
    assert state.get() == 6
    at(backend, "other")
    assert state.get() is None


def test_same_name_same_state_and_kind_mismatch_is_an_error(backend: HeapKeyedStateBackend) -> None:
    a = backend.get_partitioned_state(ValueStateDescriptor("s"))
    assert backend.get_partitioned_state(ValueStateDescriptor("s")) is a
    with pytest.raises(ValueError, match="holds value state"):
        backend.get_partitioned_state(ListStateDescriptor("s"))


def test_key_outside_the_range_is_refused() -> None:
    backend = HeapKeyedStateBackend(KeyGroupRange(0, 63), 128)
    with pytest.raises(ValueError, match="outside"):
        backend.set_current_key("k", 100)
