"""The heap keyed state backend: each state type, scoped to the current key."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from chandy.core.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from chandy.state.heap import HeapKeyedStateBackend
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.storage.checkpoint_storage import StateReader


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


@pytest.mark.parametrize(
    ("describe", "result"),
    [
        (lambda: ReducingStateDescriptor("r", lambda a, b: a + b), 6),
        (lambda: AggregatingStateDescriptor("avg", Average(), None), 2),
    ],
    ids=["reducing", "aggregating"],
)
def test_reducing_and_aggregating_state(
    backend: HeapKeyedStateBackend, describe: Callable[[], StateDescriptor], result: float
) -> None:
    state = backend.get_partitioned_state(describe())
    at(backend, "k")
    assert state.get() is None
    for v in (1, 2, 3):
        state.add(v)
    assert state.get() == result
    at(backend, "other")
    assert state.get() is None
    state.add(10)
    assert state.get() == 10
    state.clear()
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


def restore_into(
    snapshot_bytes_by_backend: list, key_group_range: KeyGroupRange | None = None
) -> HeapKeyedStateBackend:
    from chandy.state.handles import ByteStreamStateHandle, KeyGroupsStateHandle

    fresh = HeapKeyedStateBackend(key_group_range or KeyGroupRange(0, 127), 128)
    handles = [
        KeyGroupsStateHandle(s.key_group_range, s.ranges, ByteStreamStateHandle("x", s.payload))
        for s in snapshot_bytes_by_backend
    ]
    fresh.restore(handles, StateReader())
    return fresh


def test_a_snapshot_sees_state_as_of_the_barrier_whatever_happens_after(
    backend: HeapKeyedStateBackend,
) -> None:
    """Copy-on-write: mutations after the synchronous part never reach the snapshot."""
    value = backend.get_partitioned_state(ValueStateDescriptor("v"))
    items = backend.get_partitioned_state(ListStateDescriptor("l"))
    mapping = backend.get_partitioned_state(MapStateDescriptor("m"))
    folded = backend.get_partitioned_state(ReducingStateDescriptor("r", lambda a, b: a + b))
    at(backend, "k")
    value.update(["mutable", "list"])
    items.add(1)
    mapping.put("a", [1])
    folded.add([1])
    snapshot = backend.snapshot()
    # after the barrier: in-place mutations of what user code reads, and new writes
    value.value().append("after")
    items.add(2)
    mapping.get("a").append(2)
    mapping.put("b", 3)
    folded.add([2])
    at(backend, "new-key")
    value.update("new")
    serialized = snapshot.serialize()
    snapshot.release()
    restored = restore_into([serialized])
    at(restored, "k")
    assert restored.get_partitioned_state(ValueStateDescriptor("v")).value() == ["mutable", "list"]
    assert list(restored.get_partitioned_state(ListStateDescriptor("l")).get()) == [1]
    assert dict(restored.get_partitioned_state(MapStateDescriptor("m")).items()) == {"a": [1]}
    assert restored.get_partitioned_state(ReducingStateDescriptor("r", lambda a, b: a + b)).get() == [1]
    at(restored, "new-key")
    assert restored.get_partitioned_state(ValueStateDescriptor("v")).value() is None
    # and the live state kept every change
    at(backend, "k")
    assert value.value() == ["mutable", "list", "after"]
    assert list(items.get()) == [1, 2]
    assert dict(mapping.items()) == {"a": [1, 2], "b": 3}


def test_copy_on_write_stops_once_no_snapshot_is_in_flight(backend: HeapKeyedStateBackend) -> None:
    value = backend.get_partitioned_state(ValueStateDescriptor("v"))
    at(backend, "k")
    value.update([1])
    first = value.value()
    snapshot = backend.snapshot()
    assert value.value() is not first  # privatized while the snapshot is in flight
    snapshot.release()
    privatized = value.value()
    assert value.value() is privatized  # no more copies afterwards
    assert backend.tables["v"].cow is None


def test_immutable_values_are_never_copied(backend: HeapKeyedStateBackend) -> None:
    value = backend.get_partitioned_state(ValueStateDescriptor("v"))
    at(backend, "k")
    value.update(("a", 1, frozenset({2})))
    before = value.value()
    snapshot = backend.snapshot()
    assert value.value() is before
    snapshot.release()


def test_keyed_state_restores_into_a_smaller_range_per_key_group(backend: HeapKeyedStateBackend) -> None:
    value = backend.get_partitioned_state(ValueStateDescriptor("v"))
    for i in range(1000):
        at(backend, i)
        value.update(i * 10)
    snapshot = backend.snapshot()
    serialized = snapshot.serialize()
    snapshot.release()
    halves = [KeyGroupRange.of_operator(128, 2, i) for i in range(2)]
    restored = [restore_into([serialized], r) for r in halves]
    assert sum(b.num_keys("v") for b in restored) == 1000
    for i in range(1000):
        kg = assign_to_key_group(i, 128)
        owner = restored[0] if kg in halves[0] else restored[1]
        owner.set_current_key(i, kg)
        assert owner.get_partitioned_state(ValueStateDescriptor("v")).value() == i * 10


def test_operator_state_snapshot_and_restore() -> None:
    from chandy.state.handles import ByteStreamStateHandle, OperatorStateDistributionMode
    from chandy.state.operator_state import OperatorStateBackend

    source = OperatorStateBackend()
    split = source.get_list_state(ListStateDescriptor("offsets"))
    union = source.get_union_list_state(ListStateDescriptor("everyone"))
    split.add_all([{"partition": 0, "offset": 5}, {"partition": 1, "offset": 9}])
    union.add("shared")
    payload, metas = source.snapshot()
    split.add("after the snapshot")  # not in the snapshot: elements were pickled already
    assert metas["offsets"].mode is OperatorStateDistributionMode.SPLIT_DISTRIBUTE
    assert metas["everyone"].mode is OperatorStateDistributionMode.UNION
    target = OperatorStateBackend()
    target.restore([(metas, ByteStreamStateHandle("x", payload))], lambda h, r: h.data[r[0] : r[1]])
    assert list(target.get_list_state(ListStateDescriptor("offsets")).get()) == [
        {"partition": 0, "offset": 5},
        {"partition": 1, "offset": 9},
    ]
    assert list(target.get_union_list_state(ListStateDescriptor("everyone")).get()) == ["shared"]
    with pytest.raises(ValueError, match="SPLIT_DISTRIBUTE"):
        target.get_union_list_state(ListStateDescriptor("offsets"))


class Average:
    """An AggregateFunction with a mutable accumulator (so copy-on-write matters)."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        accumulator[0] += value
        accumulator[1] += 1
        return accumulator

    def get_result(self, accumulator: list[int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, acc_a: list[int], acc_b: list[int]) -> list[int]:
        acc_a[0] += acc_b[0]
        acc_a[1] += acc_b[1]
        return acc_a


def test_an_aggregating_state_descriptor_needs_an_aggregate_function() -> None:
    with pytest.raises(TypeError, match="AggregateFunction"):
        AggregatingStateDescriptor("bad", lambda a, b: a + b, None)


def test_namespaced_state_is_per_key_and_namespace(backend: HeapKeyedStateBackend) -> None:
    value = backend.get_partitioned_state(ValueStateDescriptor("v"), namespaced=True)
    items = backend.get_partitioned_state(ListStateDescriptor("l"), namespaced=True)
    mapping = backend.get_partitioned_state(MapStateDescriptor("m"), namespaced=True)
    folded = backend.get_partitioned_state(ReducingStateDescriptor("r", lambda a, b: a + b), namespaced=True)
    avg = backend.get_partitioned_state(AggregatingStateDescriptor("a", Average(), None), namespaced=True)
    handles = (value, items, mapping, folded, avg)
    at(backend, "k")
    for ns in ("w1", "w2"):
        for h in handles:
            h.set_current_namespace(ns)
        value.update(ns)
        items.add(ns)
        mapping.put(ns, 1)
        folded.add(len(ns))
        avg.add(2 if ns == "w1" else 4)
    at(backend, "other")
    value.update("other's")
    for h in handles:
        h.set_current_namespace("w1")
    at(backend, "k")
    assert value.value() == "w1" and value.get_current_namespace() == "w1"
    assert list(items.get()) == ["w1"]
    assert dict(mapping.items()) == {"w1": 1}
    assert folded.get() == 2 and avg.get() == 2
    value.clear()
    assert value.value() is None
    value.set_current_namespace("w2")
    assert value.value() == "w2"
    assert backend.num_keys("v") == 2  # (k, w2) and (other, w2)
    with pytest.raises(ValueError, match="holds namespaced value state"):
        backend.get_partitioned_state(ValueStateDescriptor("v"))


def test_merge_namespaces_folds_the_sources_into_the_target(backend: HeapKeyedStateBackend) -> None:
    items = backend.get_partitioned_state(ListStateDescriptor("l"), namespaced=True)
    folded = backend.get_partitioned_state(ReducingStateDescriptor("r", lambda a, b: a + b), namespaced=True)
    avg = backend.get_partitioned_state(AggregatingStateDescriptor("a", Average(), None), namespaced=True)
    at(backend, "k")
    for ns, v in (("s1", 1), ("s2", 2), ("t", 3)):
        for h in (items, folded, avg):
            h.set_current_namespace(ns)
            h.add(v)
    at(backend, "untouched")
    items.set_current_namespace("s1")
    items.add(100)
    at(backend, "k")
    for h in (items, folded, avg):
        h.set_current_namespace("s1")  # the merge does not move the handle
        h.merge_namespaces("t", ["s1", "s2", "absent"])
        assert h.get_current_namespace() == "s1"
        h.set_current_namespace("s2")
        assert (list(h.get()) == []) if h is items else (h.get() is None)
        h.set_current_namespace("s1")
    items.set_current_namespace("t")
    folded.set_current_namespace("t")
    avg.set_current_namespace("t")
    assert sorted(items.get()) == [1, 2, 3]
    assert folded.get() == 6
    assert avg.get() == 2
    # into a target that holds nothing yet
    folded.merge_namespaces("new", ["t"])
    folded.set_current_namespace("new")
    assert folded.get() == 6
    at(backend, "untouched")
    assert list(items.get()) == []  # namespace "t" of another key
    items.set_current_namespace("s1")
    assert list(items.get()) == [100]


def test_namespaced_state_and_merges_are_copy_on_write_and_restore(backend: HeapKeyedStateBackend) -> None:
    items = backend.get_partitioned_state(ListStateDescriptor("l"), namespaced=True)
    avg = backend.get_partitioned_state(AggregatingStateDescriptor("a", Average(), None), namespaced=True)
    at(backend, "k")
    for ns, v in (("s1", 1), ("s2", 2), ("t", 3)):
        for h in (items, avg):
            h.set_current_namespace(ns)
            h.add(v)
    snapshot = backend.snapshot()
    for h in (items, avg):
        # merges in place: s2 into s1's list and accumulator, then that into t's
        h.merge_namespaces("t", ["s1", "s2"])
        h.set_current_namespace("t")
        h.add(10)
    serialized = snapshot.serialize()
    snapshot.release()
    restored = restore_into([serialized])
    r_items = restored.get_partitioned_state(ListStateDescriptor("l"), namespaced=True)
    r_avg = restored.get_partitioned_state(AggregatingStateDescriptor("a", Average(), None), namespaced=True)
    at(restored, "k")
    for ns, v in (("s1", 1), ("s2", 2), ("t", 3)):
        r_items.set_current_namespace(ns)
        r_avg.set_current_namespace(ns)
        assert list(r_items.get()) == [v]
        assert r_avg.get() == v
    assert sorted(items.get()) == [1, 2, 3, 10]
    assert avg.get() == 4
