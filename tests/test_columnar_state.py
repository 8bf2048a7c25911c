"""Columnar keyed state (the batch path's): slots per key against a dict model, growth, removal,
the view a KeyedBatchFunction gets, and checkpoints written to real checkpoint storage,
restored and rescaled by key group."""

from __future__ import annotations

import copy
import datetime
import decimal
import json
import math
import struct
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chandy.core.state import ValueStateDescriptor
from chandy.errors import InvalidCheckpointError
from chandy.state.arrow_keys import key_groups_of
from chandy.state.columnar import (
    LAYOUT_MAGIC,
    ColumnarKeyedState,
    ColumnarKeyedStateBackend,
    ColumnarStateView,
)
from chandy.state.handles import ByteStreamStateHandle, FileStateHandle, KeyGroupsStateHandle
from chandy.state.heap import HeapKeyedStateBackend, IncompatibleRestoredStateError, IncompatibleStateError
from chandy.state.key_groups import KeyGroupRange
from chandy.storage.checkpoint_storage import CheckpointStorage, StateReader

MAX_PARALLELISM = 128
SCHEMA = pa.schema([("total", pa.int64()), ("mean", pa.float64()), ("seen", pa.bool_())])
ALL = KeyGroupRange(0, MAX_PARALLELISM - 1)


def groups(keys: Any) -> np.ndarray:
    return key_groups_of(keys, MAX_PARALLELISM)


def new_state(defaults: dict[str, Any] | None = None) -> ColumnarKeyedState:
    return ColumnarKeyedState("s", SCHEMA, defaults)


# ---------------------------------------------------------------------- slots against a model

INT_KEYS = st.integers(-3, 3) | st.sampled_from([2**63 - 1, -(2**63), 2**40]) | st.none()
STR_KEYS = st.sampled_from(["a", "b", "é", "", "long key " * 5]) | st.none()
FLOAT_KEYS = st.sampled_from([0.5, -1.5, math.inf, math.nan, 2.0, 0.0, -0.0]) | st.none()

OPERATIONS = st.lists(
    st.tuples(st.sampled_from(["batch", "batch", "remove"]), st.lists(st.integers(0, 1000), max_size=12)),
    max_size=12,
)


def model_key(key: Any) -> Any:
    return "NaN" if isinstance(key, float) and math.isnan(key) else key


def check_against_model(arrow_type: pa.DataType, key_pool: list[Any], operations: list[Any]) -> None:
    """Replay batches and removals on a state and on a dict (key -> (slot, total)):
    a live key keeps its slot, live keys never share one, new keys start from the defaults,
    is_new says which keys were new, and what was written is read back."""
    state = ColumnarKeyedState("s", SCHEMA, {"total": 7})
    model: dict[Any, tuple[int, int]] = {}
    step = 0
    for op, picks in operations:
        step += 1
        chosen = [key_pool[p % len(key_pool)] for p in picks] if key_pool else []
        array = pa.array(chosen, type=arrow_type)
        if op == "remove":
            present = [k for k in chosen if model_key(k) in model]
            state.remove(np.array([model[model_key(k)][0] for k in present], dtype=np.int64))
            for k in present:
                model.pop(model_key(k), None)
        else:
            before = dict(model)
            slots = state.slots_of(array, groups(array))
            assert slots.dtype == np.int64 and len(slots) == len(chosen)
            is_new = state.is_new(slots)
            total = state.column("total")
            for key, slot, new in zip(chosen, slots.tolist(), is_new.tolist(), strict=True):
                mk = model_key(key)
                assert new == (mk not in before)
                if mk in model:
                    assert slot == model[mk][0]
                    assert total[slot] == model[mk][1]
                else:
                    assert slot not in {s for s, _ in model.values()}
                    assert total[slot] == 7  # the default, also for a reused slot
                    model[mk] = (slot, 7)
            assert [model_key(k) for k in state.key_array(slots).to_pylist()] == [
                model_key(k) for k in chosen
            ]
            for key in set(map(model_key, chosen)):
                slot = model[key][0]
                total[slot] = step * 100 + slot
                model[key] = (slot, step * 100 + slot)
        assert state.num_keys == len(model)
        live = state.live_slots()
        assert sorted(live.tolist()) == sorted(s for s, _ in model.values())
        assert sorted(state.key_groups_of_slots(live).tolist()) == sorted(
            groups(pa.array([None if k == "NaN" else k for k in model], type=arrow_type)).tolist()
            if model and "NaN" not in model
            else sorted(state.key_groups_of_slots(live).tolist())
        )


@settings(max_examples=150, deadline=None)
@given(st.lists(INT_KEYS, min_size=1, max_size=10, unique=True), OPERATIONS)
def test_int_slots_follow_a_dict_model(pool: list[Any], operations: list[Any]) -> None:
    check_against_model(pa.int64(), pool, operations)


@settings(max_examples=100, deadline=None)
@given(st.lists(STR_KEYS, min_size=1, max_size=6, unique=True), OPERATIONS)
def test_string_slots_follow_a_dict_model(pool: list[Any], operations: list[Any]) -> None:
    check_against_model(pa.string(), pool, operations)


@settings(max_examples=60, deadline=None)
@given(st.lists(FLOAT_KEYS, min_size=1, max_size=6), OPERATIONS)
def test_float_slots_follow_a_dict_model_with_one_nan_key(pool: list[Any], operations: list[Any]) -> None:
    pool = list({model_key(k): k for k in pool}.values())
    check_against_model(pa.float64(), pool, operations)


@pytest.mark.parametrize(
    ("kind", "batch_keys"),
    [("string", 200), ("string", 5000), ("int", 200), ("int", 5000)],
    ids=["string-dict-lookups", "string-arrow-lookups", "int-few", "int-many"],
)
def test_keys_at_scale_with_removals(kind: str, batch_keys: int) -> None:
    """Thousands of keys, most removed and some back, round after round: string keys in
    batches of few distinct keys (looked up in the dict) and of many (looked up in Arrow, dead
    entries compacted); int keys through the index's tombstones and rebuilds."""
    state = new_state()
    keys: list[Any] = (
        [f"k{i}" for i in range(6000)] if kind == "string" else [i * 7919 - 10**6 for i in range(6000)]
    )
    rng = np.random.default_rng(5)
    slot_of: dict[Any, int] = {}
    for round_ in range(8):
        chosen = [keys[i] for i in rng.integers(0, len(keys), batch_keys)]
        array = pa.array(chosen)
        slots = state.slots_of(array, groups(array))
        for key, slot in zip(chosen, slots.tolist(), strict=True):
            assert slot_of.setdefault(key, slot) == slot, (round_, key)
        assert len(set(slot_of.values())) == len(slot_of) == state.num_keys
        gone = [k for k in slot_of if rng.random() < 0.6]
        state.remove(np.array([slot_of.pop(k) for k in gone], dtype=np.int64))
        assert state.num_keys == len(slot_of)
    live = state.live_slots()
    assert dict(zip(state.key_array(live).to_pylist(), live.tolist(), strict=True)) == slot_of


def test_key_types_other_than_int_and_string() -> None:
    for array in (
        pa.array([b"x", b"y", b"x", None]),
        pa.array([True, False, True, None]),
        pa.array([1, 2, 1, None], type=pa.uint8()),
        pa.array([2**64 - 1, 2**63, 2**64 - 1, None], type=pa.uint64()),
        pa.array([1.5, -0.0, 1.5, None]),
        pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, None]), pa.array(["p", "q"])),
        pa.chunked_array([[1, 2], [1, None]]),
    ):
        state = new_state()
        slots = state.slots_of(array, groups(array))
        assert slots[0] == slots[2] and len(set(slots.tolist())) == 3, array
        assert state.key_array(slots[[0, 1, 3]]).to_pylist() == [array.to_pylist()[i] for i in (0, 1, 3)], (
            array
        )
        assert state.slots_of(array, groups(array)).tolist() == slots.tolist()


def test_keys_equal_in_python_but_not_in_arrow_are_one_key() -> None:
    """0.0 and -0.0, and NaNs of different bits, are distinct values to Arrow's hashing and one
    key each to the state (as in a Python dict; all NaNs are one key)."""
    other_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    state = new_state()
    keys = pa.array([0.0, -0.0, math.nan, other_nan, 1.0])
    slots = state.slots_of(keys, np.zeros(len(keys), dtype=np.int32))
    assert slots[0] == slots[1] and slots[2] == slots[3] and len(set(slots.tolist())) == 3
    assert state.num_keys == 3
    assert state.slots_of(keys, np.zeros(len(keys), dtype=np.int32)).tolist() == slots.tolist()


def test_numpy_keys() -> None:
    state = new_state()
    slots = state.slots_of(np.array([5, 6, 5]), groups(np.array([5, 6, 5])))
    assert slots[0] == slots[2] != slots[1]
    assert state.key_array(slots).to_pylist() == [5, 6, 5]


def test_keys_change_type_is_refused_naming_both_types() -> None:
    state = new_state()
    state.slots_of(pa.array([1, 2]), groups(pa.array([1, 2])))
    with pytest.raises(TypeError, match="int64.*string"):
        state.slots_of(pa.array(["a"]), groups(pa.array(["a"])))
    # Integers of another width are the same keys.
    assert state.slots_of(pa.array([1], type=pa.int32()), groups(pa.array([1]))).tolist() == [0]
    strings = new_state()
    first = strings.slots_of(pa.array(["a", "b"]), groups(pa.array(["a", "b"])))
    for layout in (pa.large_string(), pa.string_view()):
        same = pa.array(["b", "a"], type=layout)
        assert strings.slots_of(same, groups(same)).tolist() == first[::-1].tolist()
    for other in (pa.array([1.5]), pa.array([b"a"]), pa.array([1])):
        # Arrow would cast 1.5 to "1.5": a float is not a string key, whatever casts exist.
        with pytest.raises(TypeError, match="holds keys of type string"):
            strings.slots_of(other, groups(other))


@pytest.mark.parametrize("later", [pa.array(["a", None]), pa.array([7, None]), pa.array([b"x", None])])
def test_keys_of_arrow_null_type_first_then_typed_keys(later: pa.Array) -> None:
    """A first batch whose keys are all null may carry Arrow's null type (pa.array([None])):
    the null key keeps its slot when typed keys arrive."""
    state = new_state()
    null_only = pa.array([None, None])
    first = state.slots_of(null_only, groups(null_only))
    assert first[0] == first[1] and state.key_array(first).to_pylist() == [None, None]
    slots = state.slots_of(later, groups(later))
    assert slots[1] == first[0] and slots[0] != first[0]
    assert state.key_array(slots).to_pylist() == later.to_pylist()
    assert state.slots_of(null_only, groups(null_only)).tolist() == first.tolist()
    assert state.key_array(state.live_slots()).type == later.type


def test_an_emptied_state_takes_keys_of_another_type() -> None:
    state = new_state()
    strings = pa.array(["a", "b"])
    for _ in range(2):  # the second lookup goes through Arrow's index_in
        slots = state.slots_of(strings, groups(strings))
    state.remove(slots)
    for keys in (pa.array([b"a", b"c"]), pa.array([1, 2])):
        first = state.slots_of(keys, groups(keys))
        assert state.slots_of(keys, groups(keys)).tolist() == first.tolist()
        assert state.key_array(first).to_pylist() == keys.to_pylist()
        state.remove(first)


def test_nested_keys_are_refused_naming_the_fix() -> None:
    keys = pa.array([{"a": 1, "b": "x"}])
    with pytest.raises(TypeError, match="cannot be keyed by struct.*one key column"):
        new_state().slots_of(keys, np.zeros(1, dtype=np.int32))


def test_the_null_key_is_one_key_and_not_zero() -> None:
    state = new_state()
    keys = pa.array([None, 0, None, 0], type=pa.int64())
    slots = state.slots_of(keys, groups(keys))
    assert slots[0] == slots[2] != slots[1] == slots[3]
    assert state.key_array(slots).to_pylist() == [None, 0, None, 0]
    state.remove(slots[:1])
    # Removing the null key leaves key 0 in place.
    assert state.slots_of(pa.array([0]), groups(pa.array([0]))).tolist() == [slots[1]]
    assert state.is_new(
        state.slots_of(pa.array([None], type=pa.int64()), np.zeros(1, np.int32))
    ).tolist() == [True]


def test_growth_keeps_every_key_and_value() -> None:
    state = new_state({"mean": 0.5})
    rng = np.random.default_rng(7)
    keys = rng.permutation(400_000)[:200_000].astype(np.int64)
    for batch in np.array_split(keys, 37):
        array = pa.array(batch)
        slots = state.slots_of(array, groups(array))
        state.column("total")[slots] = batch * 3
    assert state.num_keys == len(keys)
    again = state.slots_of(pa.array(keys), groups(pa.array(keys)))
    assert len(np.unique(again)) == len(keys)
    assert (state.column("total")[again] == keys * 3).all()
    assert (state.column("mean")[again] == 0.5).all()
    assert (state.key_array(again).to_numpy() == keys).all()
    assert (state.key_groups_of_slots(again) == groups(pa.array(keys))).all()


def test_distinct_keys_may_skip_the_search_for_repeats() -> None:
    state, same = new_state(), new_state()
    rng = np.random.default_rng(11)
    for _ in range(5):
        keys = pa.array(np.unique(rng.integers(-(2**62), 2**62, 3000)))
        assert (
            state.slots_of(keys, groups(keys), distinct=True).tolist()
            == same.slots_of(keys, groups(keys)).tolist()
        )
    assert state.num_keys == same.num_keys


def test_removed_keys_come_back_with_defaults_in_reused_slots() -> None:
    state = new_state({"total": -1, "seen": True})
    keys = pa.array(np.arange(100))
    slots = state.slots_of(keys, groups(keys))
    state.column("total")[slots] = 50
    state.column("seen")[slots] = False
    state.remove(slots[:60])
    state.remove(slots[:10])  # removing again does nothing
    assert state.num_keys == 40
    back = pa.array(np.arange(1000, 1060))
    reused = state.slots_of(back, groups(back))
    assert set(reused.tolist()) == set(slots[:60].tolist())  # freed slots are reused first
    returning = state.slots_of(pa.array([5]), groups(pa.array([5])))
    assert state.is_new(returning).tolist() == [True]
    assert state.column("total")[returning].tolist() == [-1]
    assert state.column("seen")[returning].tolist() == [True]
    assert state.column("total")[slots[60:]].tolist() == [50] * 40


def test_defaults_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown columns.*'nope'"):
        new_state({"nope": 1})
    with pytest.raises(ValueError, match="default 'x' of column 'total'"):
        new_state({"total": "x"})
    with pytest.raises(ValueError, match="reserved"):
        ColumnarKeyedState("s", pa.schema([("__chandy_key", pa.int64())]))


def test_object_columns_hold_any_arrow_type() -> None:
    state = ColumnarKeyedState("s", pa.schema([("name", pa.string()), ("tags", pa.list_(pa.int64()))]))
    keys = pa.array([1, 2])
    slots = state.slots_of(keys, groups(keys))
    assert state.column("name")[slots].tolist() == [None, None]
    state.column("name")[slots] = ["one", "two"]
    assert state.column("name").dtype == np.dtype(object)


def test_a_mutable_default_is_copied_for_every_new_key() -> None:
    state = ColumnarKeyedState("s", pa.schema([("seen", pa.list_(pa.int64()))]), {"seen": []})
    keys = pa.array([1, 2])
    slots = state.slots_of(keys, groups(keys))
    state.column("seen")[slots[0]].append(5)
    assert state.column("seen")[slots].tolist() == [[5], []]
    assert state.defaults["seen"] == []


# ---------------------------------------------------------------------- the view


def view_of(state: ColumnarKeyedState, keys: list[Any]) -> ColumnarStateView:
    array = pa.array(keys)
    slots = state.slots_of(array, groups(array))
    return ColumnarStateView(state, slots, np.arange(len(keys) + 1), np.arange(len(keys)))


def test_view_reads_copies_and_writes_back() -> None:
    state = new_state({"mean": 1.0})
    view = view_of(state, [10, 20, 30])
    assert view.is_new().tolist() == [True, True, True]
    assert view.keys.to_pylist() == [10, 20, 30]
    totals = view["total"]
    totals += 5  # a copy: the state is unchanged until assigned
    assert view["total"].tolist() == [0, 0, 0]
    view["total"] = totals
    view["mean"] = np.array([1, 2, 3])  # ints into a float column: a safe cast
    view["seen"] = True  # a scalar for every key
    again = view_of(state, [30, 10, 40])
    assert again.is_new().tolist() == [False, False, True]
    assert again["total"].tolist() == [5, 5, 0]
    assert again["mean"].tolist() == [3.0, 1.0, 1.0]
    assert again["seen"].tolist() == [True, True, False]
    assert view.offsets.tolist() == [0, 1, 2, 3] and view.group_ids.tolist() == [0, 1, 2]
    assert len(view) == 3


def test_view_assignment_errors_name_the_column_and_the_fix() -> None:
    view = view_of(new_state(), [1, 2])
    with pytest.raises(ValueError, match="'total': 2 values expected.*shape \\(3,\\)"):
        view["total"] = np.array([1, 2, 3])
    with pytest.raises(TypeError, match="'total' holds int64 and got float64.*astype"):
        view["total"] = np.array([1.5, 2.5])
    with pytest.raises(KeyError, match="no column 'nope'.*total"):
        view["nope"]
    view["total"] = pa.array([4, 5])
    assert view["total"].tolist() == [4, 5]


def test_view_refuses_integers_that_do_not_fit_the_column() -> None:
    state = ColumnarKeyedState("s", pa.schema([("small", pa.int8())]))
    view = view_of(state, [1, 2])
    view["small"] = np.array([-128, 127], dtype=np.int64)  # a narrower column: fits, cast
    assert view["small"].tolist() == [-128, 127]
    with pytest.raises(OverflowError, match="'small' holds int8.*300.*outside"):
        view["small"] = np.array([1, 300])
    assert view["small"].tolist() == [-128, 127]


def test_view_clear_drops_state_and_wins_over_later_writes() -> None:
    state = new_state()
    view = view_of(state, [1, 2, 3])
    view["total"] = np.array([10, 20, 30])
    view.clear(np.array([True, False, True]))
    assert state.num_keys == 1
    assert view["total"].tolist() == [0, 20, 0]  # cleared keys read as the defaults
    view["total"] = np.array([11, 21, 31])
    view.clear(np.array([True, False, False]))  # clearing again is harmless
    assert state.num_keys == 1
    after = view_of(state, [1, 2, 3])
    assert after.is_new().tolist() == [True, False, True]
    assert after["total"].tolist() == [0, 21, 0]
    after.clear()
    assert state.num_keys == 0
    with pytest.raises(ValueError, match="one boolean per key"):
        after.clear(np.array([True]))


def test_view_writes_lists_into_object_columns() -> None:
    state = ColumnarKeyedState("s", pa.schema([("seen", pa.list_(pa.int64())), ("name", pa.string())]))
    view = view_of(state, [1, 2])
    view["seen"] = [[1, 2], [3, 4]]  # equal lengths: not a 2-d array
    view["name"] = pa.array(["a", None])
    assert view["seen"].tolist() == [[1, 2], [3, 4]] and view["name"].tolist() == ["a", None]
    with pytest.raises(ValueError, match="2 values expected"):
        view["seen"] = [[1, 2]]


def test_view_reads_of_mutable_values_are_copies() -> None:
    """Nothing is written until assigned, for lists and dicts too: a read gives copies, so a
    value changed in place leaves the state as it was; immutable values stay shared."""
    schema = pa.schema(
        [("seen", pa.list_(pa.int64())), ("info", pa.struct([("n", pa.int64())])), ("name", pa.string())]
    )
    state = ColumnarKeyedState("s", schema, {"seen": [], "info": {"n": 0}, "name": "x"})
    view = view_of(state, [1, 2])
    seen, info = view["seen"], view["info"]
    for lst in seen:
        lst.append(10)
    for d in info:
        d["n"] = 7
    assert view["seen"].tolist() == [[], []] and view["info"].tolist() == [{"n": 0}, {"n": 0}]
    view["seen"] = seen
    again = view_of(state, [1, 2])
    assert again["seen"].tolist() == [[10], [10]] and again["info"].tolist() == [{"n": 0}, {"n": 0}]
    names = again["name"]
    assert names[0] is state.column("name")[again.slots[0]]  # str: shared, not copied


def test_view_keys_may_be_given() -> None:
    state = new_state()
    keys = pa.array(["k"])
    slots = state.slots_of(keys, groups(keys))
    view = ColumnarStateView(state, slots, np.array([0, 2]), np.array([0, 0]), keys)
    assert view.keys is keys and view.slots.tolist() == slots.tolist()


# ---------------------------------------------------------------------- the backend


def backend(key_group_range: KeyGroupRange = ALL) -> ColumnarKeyedStateBackend:
    return ColumnarKeyedStateBackend(key_group_range, MAX_PARALLELISM, owner="operator 'agg' (uid 'agg')")


def fill(b: ColumnarKeyedStateBackend, keys: pa.Array, name: str = "s") -> ColumnarKeyedState:
    """Keys in the backend's range only (as a keyed edge delivers them), total = their position."""
    own = pc_filter_range(keys, b.key_group_range)
    state = b.get_columnar_state(name, SCHEMA)
    slots = state.slots_of(own, groups(own))
    state.column("total")[slots] = np.arange(len(own)) + 1000
    state.column("mean")[slots] = np.arange(len(own)) / 3
    state.column("seen")[slots] = np.arange(len(own)) % 2 == 0
    return state


def pc_filter_range(keys: pa.Array, key_group_range: KeyGroupRange) -> pa.Array:
    kgs = groups(keys)
    return keys.filter(pa.array((kgs >= key_group_range.start) & (kgs <= key_group_range.end)))


def contents(b: ColumnarKeyedStateBackend, name: str = "s") -> dict[Any, tuple[Any, ...]]:
    state = b.states.get(name)
    if state is None:
        return {}
    live = state.live_slots()
    keys = [model_key(k) for k in state.key_array(live).to_pylist()]
    rows = zip(*(state.column(f.name)[live].tolist() for f in state.schema), strict=True)
    result = dict(zip(keys, rows, strict=True))
    assert len(result) == len(live)
    return result


def checkpoint(
    backends: list[ColumnarKeyedStateBackend], storage: CheckpointStorage, checkpoint_id: int
) -> list[KeyGroupsStateHandle]:
    handles: list[KeyGroupsStateHandle] = []
    for b in backends:
        snapshot = b.snapshot(checkpoint_id)
        serializer = snapshot.serializer()
        while not serializer.step(time.monotonic_ns()):  # one key group per step
            pass
        written = serializer.result().write(storage, checkpoint_id, None)
        snapshot.release()
        for handle in written.handles:
            assert isinstance(handle, KeyGroupsStateHandle)
            handles.append(handle)
    return handles


def restore(
    parallelism: int, handles: list[KeyGroupsStateHandle], storage: CheckpointStorage
) -> list[ColumnarKeyedStateBackend]:
    restored = []
    for index in range(parallelism):
        b = backend(KeyGroupRange.of_operator(MAX_PARALLELISM, parallelism, index))
        b.restore(handles, StateReader(storage))
        restored.append(b)
    return restored


KEY_SETS = {
    "int": pa.array(np.arange(-2000, 3000, 3, dtype=np.int64)),
    "string": pa.array([f"user-{i}" for i in range(1500)] + [None]),
    "int-with-null": pa.array([*range(500), None], type=pa.int32()),
    "float": pa.array([i / 4 for i in range(400)] + [math.nan, math.inf]),
}


@pytest.mark.parametrize("kind", list(KEY_SETS))
@pytest.mark.parametrize("written_by", [1, 3])
def test_checkpoint_restores_and_rescales_by_key_group(tmp_path: Path, kind: str, written_by: int) -> None:
    """Written by 1 or 3 subtasks to real checkpoint files, restored into 1, 2 and 3 backends
    over split key-group ranges: every key exactly once, with its values and key group."""
    storage = CheckpointStorage(str(tmp_path), "job", inline_threshold=0)
    storage.initialize()
    keys = KEY_SETS[kind]
    writers = [backend(KeyGroupRange.of_operator(MAX_PARALLELISM, written_by, i)) for i in range(written_by)]
    expected: dict[Any, tuple[Any, ...]] = {}
    for b in writers:
        fill(b, keys)
        fill(b, pa.array(np.arange(10, dtype=np.int64)), name="other")
        expected.update(contents(b))
    assert len(expected) == len(keys)
    handles = checkpoint(writers, storage, 1)
    assert len(handles) == written_by
    assert all(h.state_kinds == (("other", "columnar"), ("s", "columnar")) for h in handles)
    assert all(not isinstance(h.delegate, ByteStreamStateHandle) for h in handles)
    for parallelism in (1, 2, 3):
        restored = restore(parallelism, handles, storage)
        merged: dict[Any, tuple[Any, ...]] = {}
        for b in restored:
            part = contents(b)
            assert not set(part) & set(merged), "a key restored twice"
            merged.update(part)
            state = b.get_columnar_state("s", SCHEMA)
            live = state.live_slots()
            key_groups = state.key_groups_of_slots(live)
            assert ((key_groups >= b.key_group_range.start) & (key_groups <= b.key_group_range.end)).all()
            assert key_groups.tolist() == groups(state.key_array(live)).tolist()
            assert b.num_keys("other") == len(pc_filter_range(pa.array(np.arange(10)), b.key_group_range))
        assert merged == expected, parallelism


def test_every_column_type_round_trips(tmp_path: Path) -> None:
    """Numeric columns live in numpy arrays of their own dtype, the others as objects; all of
    them come back from a checkpoint as written, with the schema's metadata."""
    schema = pa.schema(
        [
            ("i8", pa.int8()),
            ("u64", pa.uint64()),
            ("f32", pa.float32()),
            ("flag", pa.bool_()),
            ("name", pa.string()),
            ("at", pa.timestamp("us")),
            ("day", pa.date32()),
            ("amount", pa.decimal128(10, 2)),
            ("seen", pa.list_(pa.int64())),
            ("blob", pa.binary()),
        ],
        metadata={b"owner": b"test"},
    )
    values: dict[str, list[Any]] = {
        "i8": [-128, 127],
        "u64": [2**64 - 1, 0],
        "f32": [1.5, -0.25],
        "flag": [True, False],
        "name": ["é", None],
        "at": [datetime.datetime(2026, 11, 25, 2, 40, 1, 5), None],
        "day": [datetime.date(2026, 11, 25), datetime.date(1970, 1, 1)],
        "amount": [decimal.Decimal("12.34"), None],
        "seen": [[1, 2], []],
        "blob": [b"\x00\xff", b""],
    }
    storage = CheckpointStorage(str(tmp_path), "job", inline_threshold=0)
    b = backend()
    state = b.get_columnar_state("typed", schema)
    keys = pa.array(["first", "second"])
    slots = state.slots_of(keys, groups(keys))
    for column, column_values in values.items():
        target = state.column(column)
        if target.dtype == np.dtype(object):
            for slot, value in zip(slots.tolist(), column_values, strict=True):
                target[slot] = value
        else:
            target[slots] = column_values
    (restored,) = restore(1, checkpoint([b], storage, 1), storage)
    again = restored.get_columnar_state("typed", schema)
    assert again.schema.metadata == {b"owner": b"test"}
    back = again.slots_of(keys, groups(keys))
    assert not again.is_new(back).any()
    for column, column_values in values.items():
        assert again.column(column)[back].tolist() == column_values, column
    assert again.column("u64").dtype == np.uint64 and again.column("f32").dtype == np.float32


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1) | st.none(), max_size=60, unique=True)
    | st.lists(st.text(max_size=4) | st.none(), max_size=60, unique=True),
    st.sampled_from([1, 3, 16, 128]),
    st.integers(1, 4),
    st.integers(1, 4),
    st.sets(st.integers(0, 59)),
)
def test_any_keys_rescale_from_any_parallelism_to_any_other(
    keys: list[Any], max_parallelism: int, written_by: int, restored_by: int, removed: set[int]
) -> None:
    written_by, restored_by = min(written_by, max_parallelism), min(restored_by, max_parallelism)
    storage = CheckpointStorage(None, "job")  # in memory: the bytes are inlined in the handles
    array = pa.array(keys)
    key_groups = key_groups_of(array, max_parallelism)
    expected: dict[Any, int] = {}
    handles: list[KeyGroupsStateHandle] = []
    for index in range(written_by):
        own = KeyGroupRange.of_operator(max_parallelism, written_by, index)
        writer = ColumnarKeyedStateBackend(own, max_parallelism)
        state = writer.get_columnar_state("s", SCHEMA)
        mine = (key_groups >= own.start) & (key_groups <= own.end)
        slots = state.slots_of(array.filter(pa.array(mine)), key_groups[mine])
        state.column("total")[slots] = np.flatnonzero(mine)
        gone = [i for i, row in enumerate(np.flatnonzero(mine).tolist()) if row in removed]
        state.remove(slots[gone])
        expected.update({keys[row]: row for row in np.flatnonzero(mine).tolist() if row not in removed})
        snapshot = writer.snapshot(1)
        handles.extend(
            h
            for h in snapshot.serialize().write(storage, 1, None).handles
            if isinstance(h, KeyGroupsStateHandle)
        )
    restored: dict[Any, int] = {}
    for index in range(restored_by):
        own = KeyGroupRange.of_operator(max_parallelism, restored_by, index)
        reader = ColumnarKeyedStateBackend(own, max_parallelism)
        reader.restore(handles, StateReader(storage))
        state = reader.get_columnar_state("s", SCHEMA)
        live = state.live_slots()
        for key, total in zip(
            state.key_array(live).to_pylist(), state.column("total")[live].tolist(), strict=True
        ):
            assert key not in restored
            restored[key] = total
        assert reader.num_keys("s") == len(live)
    assert restored == expected


def test_restored_state_keeps_working_and_checkpoints_again(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path), "job", inline_threshold=0)
    first = backend()
    fill(first, KEY_SETS["string"])
    handles = checkpoint([first], storage, 1)
    (b,) = restore(1, handles, storage)
    state = b.get_columnar_state("s", SCHEMA, {"total": 99})
    keys = pa.array(["user-3", "brand new", None])
    slots = state.slots_of(keys, groups(keys))
    assert state.is_new(slots).tolist() == [False, True, False]
    assert state.column("total")[slots].tolist() == [1003, 99, 2500]
    state.column("total")[slots] += 1
    (again,) = restore(1, checkpoint([b], storage, 2), storage)
    assert contents(again)["brand new"][0] == 100
    assert contents(again)["user-3"][0] == 1004


def test_a_snapshot_holds_the_state_as_of_the_barrier(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path), "job")
    b = backend()
    state = fill(b, KEY_SETS["int"])
    before = contents(b)
    snapshot = b.snapshot(1)
    state.column("total")[state.live_slots()] = -5
    state.remove(state.live_slots()[:100])
    extra = pa.array([10**9])
    state.slots_of(extra, groups(extra))
    written = snapshot.serializer()
    written.step(None)
    handles = list(written.result().write(storage, 1, None).handles)
    (restored,) = restore(1, handles, storage)  # type: ignore[arg-type]
    assert contents(restored) == before


def test_a_snapshot_holds_nested_values_as_of_the_barrier(tmp_path: Path) -> None:
    """List and struct values are Python objects a batch after the barrier may change in
    place (before the serializer runs): the checkpoint holds them as they were at the barrier."""
    storage = CheckpointStorage(str(tmp_path), "job")
    b = backend()
    schema = pa.schema([("seen", pa.list_(pa.int64())), ("info", pa.struct([("n", pa.int64())]))])
    state = b.get_columnar_state("s", schema, {"seen": [], "info": {"n": 0}})
    keys = pa.array([1, 2, 3])
    slots = state.slots_of(keys, groups(keys))
    state.column("seen")[slots] = np.fromiter(([10], [10], [10]), dtype=object, count=3)
    state.column("info")[slots] = np.fromiter(({"n": 1}, {"n": 1}, {"n": 1}), dtype=object, count=3)
    state.remove(slots[2:])  # a freed slot's stale value is not checkpointed
    snapshot = b.snapshot(1)
    for lst in state.column("seen")[slots]:
        lst.append(20)  # in place, on the task thread, after the barrier
    for d in state.column("info")[slots]:
        d["n"] = 2
    written = snapshot.serializer()
    written.step(None)
    handles = list(written.result().write(storage, 1, None).handles)
    (restored,) = restore(1, handles, storage)  # type: ignore[arg-type]
    assert contents(restored) == {1: ([10], {"n": 1}), 2: ([10], {"n": 1})}


def frames_of(payload: bytes, byte_range: tuple[int, int]) -> list[tuple[int, int]]:
    """The (state index, message length) of every record batch message in ``byte_range``."""
    found = []
    position, end = byte_range
    while position < end:
        index, length = struct.unpack_from("<HQ", payload, position)
        found.append((index, length))
        position += 10 + length
    assert position == end
    return found


def test_the_task_thread_only_copies_and_the_payload_has_one_message_per_key_group_and_state() -> None:
    """The serializer has nothing to do on the task thread (the result serializes where the
    files are written); the payload is one header (the states' schemas) then, key group after
    key group, one record batch message per state with keys in it, in byte ranges that tile
    the payload."""
    b = backend()
    fill(b, KEY_SETS["int"])
    fill(b, pa.array(np.arange(10, dtype=np.int64)), name="other")
    serializer = b.snapshot(1).serializer()
    assert serializer.done and serializer.step(0)
    result = serializer.result().serialize()
    payload = result.payload
    assert payload[:8] == LAYOUT_MAGIC
    (header_size,) = struct.unpack_from("<Q", payload, 8)
    assert len(result.ranges) == MAX_PARALLELISM
    assert result.ranges[0][0] == header_size and result.ranges[-1][1] == len(payload)
    assert all(a[1] == b[0] for a, b in zip(result.ranges, result.ranges[1:], strict=False))
    with_keys = {
        name: set(groups(b.states[name].key_array(b.states[name].live_slots())).tolist())
        for name in ("other", "s")
    }
    for kg, byte_range in enumerate(result.ranges):
        indexes = [index for index, _ in frames_of(payload, byte_range)]
        assert indexes == [i for i, name in enumerate(("other", "s")) if kg in with_keys[name]], kg


def test_a_restore_parses_only_its_own_key_groups(tmp_path: Path) -> None:
    """Restored at another parallelism, a backend reads the header and its own key groups'
    bytes only: every other key group's bytes may be garbage; one of its own is an error
    naming the key group and the stream."""
    storage = CheckpointStorage(str(tmp_path), "job", inline_threshold=0)
    writer = backend()
    fill(writer, KEY_SETS["string"])
    fill(writer, pa.array(np.arange(40, dtype=np.int64)), name="other")
    expected = {name: contents(writer, name) for name in ("s", "other")}
    (handle,) = checkpoint([writer], storage, 1)
    data = bytearray(StateReader(storage).read(handle.delegate, (0, handle.delegate.state_size)))
    own = KeyGroupRange.of_operator(MAX_PARALLELISM, 3, 1)
    for kg, (start, end) in handle.key_groups():
        if kg not in own:
            data[start:end] = b"\xff" * (end - start)
    damaged = KeyGroupsStateHandle(
        handle.key_group_range,
        handle.ranges,
        ByteStreamStateHandle("others", bytes(data)),
        handle.state_kinds,
    )
    restored = backend(own)
    restored.restore([damaged], StateReader(storage))
    for name in ("s", "other"):
        mine = {k: v for k, v in expected[name].items() if int(groups(pa.array([k]))[0]) in own}
        assert mine and contents(restored, name) == mine, name
    first = next(kg for kg, (start, end) in damaged.key_groups() if kg in own and end > start)
    start, end = handle.range_of(first)
    data[start:end] = b"\xff" * (end - start)
    bad = KeyGroupsStateHandle(
        handle.key_group_range, handle.ranges, ByteStreamStateHandle("mine", bytes(data)), handle.state_kinds
    )
    with pytest.raises(InvalidCheckpointError, match=f"key group {first} .*inline state mine.*is corrupt"):
        backend(own).restore([bad], StateReader(storage))


FIRST_LAYOUT = Path(__file__).parent / "data" / "columnar-v1"


def test_a_snapshot_in_the_first_layout_still_restores(tmp_path: Path) -> None:
    """Snapshots written by the first layout (one Arrow IPC stream per key group and state,
    ``tests/data/columnar-v1``) restore at any parallelism, and checkpoint again in the new one."""
    meta = json.loads((FIRST_LAYOUT / "snapshots.json").read_text())
    assert meta["max_parallelism"] == MAX_PARALLELISM
    handles = []
    for index, subtask in enumerate(meta["subtasks"]):
        payload = (FIRST_LAYOUT / f"subtask-{index}.bin").read_bytes()
        assert payload[:4] == b"\xff\xff\xff\xff"  # an Arrow IPC stream: the first layout
        handles.append(
            KeyGroupsStateHandle(
                KeyGroupRange(subtask["start"], subtask["end"]),
                tuple(tuple(r) for r in subtask["ranges"]),
                ByteStreamStateHandle(f"v1-{index}", payload),
                tuple(tuple(k) for k in subtask["state_kinds"]),
            )
        )
    expected = {
        "s": {int(k): tuple(v) for k, v in meta["expected"]["s"].items()},
        "other": {(None if k == "None" else k): tuple(v) for k, v in meta["expected"]["other"].items()},
    }
    storage = CheckpointStorage(str(tmp_path), "job", inline_threshold=0)
    for parallelism in (1, 2, 3):
        restored = restore(parallelism, handles, storage)
        for name in ("s", "other"):
            merged: dict[Any, tuple[Any, ...]] = {}
            for b in restored:
                merged.update(contents(b, name))
            assert merged == expected[name], (parallelism, name)
        if parallelism == 2:
            again = restore(1, checkpoint(restored, storage, 2), storage)
            assert {name: contents(again[0], name) for name in ("s", "other")} == expected


def test_the_result_serialized_on_another_thread_holds_the_barrier_values(tmp_path: Path) -> None:
    """The result is serialized and written on the checkpoint I/O pool while the task goes
    on: inserting keys (the arrays grow), writing every column, removing keys and changing
    nested values in place, before and while the other thread serializes, changes nothing in
    the checkpoint."""
    storage = CheckpointStorage(str(tmp_path), "job", inline_threshold=0)
    b = backend()
    state = fill(b, KEY_SETS["string"])
    nested = b.get_columnar_state("nested", pa.schema([("seen", pa.list_(pa.int64()))]), {"seen": []})
    keys = pa.array(np.arange(300, dtype=np.int64))
    slots = nested.slots_of(keys, groups(keys))
    nested.column("seen")[slots] = np.fromiter(([int(k)] for k in slots), dtype=object, count=len(slots))
    before = copy.deepcopy({name: contents(b, name) for name in ("s", "nested")})  # lists: by value
    result = b.snapshot(1).serializer().result()  # the barrier: the task's part ends here

    def mutate(round_: int) -> None:
        extra = pa.array([f"new-{round_}-{i}" for i in range(200)])
        state.slots_of(extra, groups(extra))
        state.column("total")[state.live_slots()] = -round_
        state.remove(state.live_slots()[:5])
        for values in nested.column("seen")[nested.live_slots()]:
            values.append(-round_)

    mutate(0)
    started = threading.Event()
    written: list[Any] = []

    def write() -> None:
        started.set()
        written.append(result.write(storage, 1, None))

    thread = threading.Thread(target=write)
    thread.start()
    started.wait()
    for round_ in range(1, 30):
        mutate(round_)
    thread.join()
    handles = [h for h in written[0].handles if isinstance(h, KeyGroupsStateHandle)]
    (restored,) = restore(1, handles, storage)
    assert {name: contents(restored, name) for name in ("s", "nested")} == before


def test_empty_state_snapshots_nothing(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path), "job")
    b = backend()
    assert not b.has_state()
    assert b.snapshot(1).is_empty
    b.get_columnar_state("s", SCHEMA)
    assert b.has_state() and b.num_keys("s") == 0 and b.num_keys("absent") == 0
    snapshot = b.snapshot(1)
    assert snapshot.is_empty
    result = snapshot.serialize()
    assert result.payload == b"" and len(result.ranges) == MAX_PARALLELISM
    assert result.write(storage, 1, None).handles == ()
    fresh = backend()
    fresh.restore([], StateReader(storage))
    assert not fresh.has_state()


def test_a_state_whose_keys_were_all_removed_snapshots_nothing() -> None:
    b = backend()
    state = fill(b, KEY_SETS["int"])
    state.remove(state.live_slots())
    assert b.snapshot(1).is_empty


@pytest.mark.parametrize("keys", [pa.array([1, 2, 3]), pa.array(["a", "b", "c"])], ids=["int", "string"])
def test_keys_outside_the_backends_key_groups_are_refused(keys: pa.Array) -> None:
    """A snapshot writes the backend's key groups only: a key of another would be lost."""
    b = backend(KeyGroupRange(0, 9))
    state = b.get_columnar_state("s", SCHEMA)
    with pytest.raises(
        ValueError, match="key group 77, outside this backend's range KeyGroupRange\\(start=0, end=9\\)"
    ):
        state.slots_of(keys, np.array([3, 77, 5], dtype=np.int32))
    assert state.num_keys == 0
    assert state.slots_of(keys, np.array([3, 4, 5], dtype=np.int32)).tolist() == [0, 1, 2]
    unbounded = ColumnarKeyedState("free", SCHEMA)  # outside a backend: any key group
    assert len(unbounded.slots_of(keys, np.array([3, 77, 5], dtype=np.int32))) == 3


def test_same_name_same_state_and_schema_mismatch_errors(tmp_path: Path) -> None:
    b = backend()
    state = b.get_columnar_state("s", SCHEMA)
    assert b.get_columnar_state("s", SCHEMA) is state
    other = pa.schema([("total", pa.float64())])
    with pytest.raises(IncompatibleStateError, match="'s' has schema .*total: int64.*total: double"):
        b.get_columnar_state("s", other)
    fill(b, KEY_SETS["int"])
    storage = CheckpointStorage(str(tmp_path), "job")
    handles = checkpoint([b], storage, 1)
    declared_first = backend()
    declared_first.get_columnar_state("s", other)
    with pytest.raises(
        IncompatibleRestoredStateError, match="cannot restore columnar state 's'.*total: double"
    ):
        declared_first.restore(handles, StateReader(storage))
    (restored,) = restore(1, handles, storage)
    with pytest.raises(IncompatibleRestoredStateError) as error:
        restored.get_columnar_state("s", other)
    message = str(error.value)
    assert "operator 'agg' (uid 'agg') cannot restore columnar state 's'" in message
    assert "total: int64, mean: double, seen: bool" in message and "(total: double)" in message
    assert "Declare the state with the checkpoint's schema" in message and "uid()" in message


def corrupted(handle: KeyGroupsStateHandle, storage: CheckpointStorage, damage: Any) -> KeyGroupsStateHandle:
    data = StateReader(storage).read(handle.delegate, (0, handle.delegate.state_size))
    return KeyGroupsStateHandle(
        handle.key_group_range,
        handle.ranges,
        ByteStreamStateHandle("damaged", damage(data)),
        handle.state_kinds,
    )


def set_bytes(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value) :]


def header_end(data: bytes) -> int:
    return int(struct.unpack_from("<Q", data, 8)[0])


@pytest.mark.parametrize(
    ("damage", "where"),
    [
        (lambda data: data[:8] + bytes(len(data) - 8), "the header"),  # zeroed after the magic
        (lambda data: bytes(b ^ 0x5A for b in data), "key group"),  # every byte flipped (the magic too)
        (lambda data: data[: len(data) // 2] + b"\xff" * (len(data) - len(data) // 2), "key group"),
        (lambda data: data[: len(data) - 7], "key group"),  # truncated: the last message is short
        (lambda data: data[:12], "the header"),  # truncated inside the header
        (lambda data: set_bytes(data, 8, struct.pack("<Q", 10**9)), "the header"),  # header too long
        (lambda data: set_bytes(data, 16, struct.pack("<H", 7)), "the header"),  # 7 schemas announced
        (lambda data: set_bytes(data, header_end(data), struct.pack("<H", 9)), "key group"),  # no state 9
        (lambda data: set_bytes(data, header_end(data) + 2, struct.pack("<Q", 10**6)), "key group"),
        (lambda data: set_bytes(data, header_end(data) + 10, b"\x00" * 12), "key group"),  # message zeroed
    ],
    ids=[
        *("zeroed", "flipped", "overwritten", "truncated", "truncated-header", "header-length"),
        *("schema-count", "state-index", "length", "message-zeroed"),
    ],
)
def test_a_corrupt_or_truncated_snapshot_is_one_clear_error(tmp_path: Path, damage: Any, where: str) -> None:
    storage = CheckpointStorage(str(tmp_path), "job")
    b = backend()
    fill(b, KEY_SETS["int"])
    (handle,) = checkpoint([b], storage, 1)
    bad = corrupted(handle, storage, damage)
    with pytest.raises(InvalidCheckpointError) as error:
        backend().restore([bad], StateReader(storage))
    message = str(error.value)
    assert message.startswith("operator 'agg' (uid 'agg') cannot restore columnar state 's': " + where)
    assert "of inline state damaged of the checkpoint's _metadata is corrupt" in message
    assert message.endswith("Restore from another checkpoint.")


def test_a_truncated_checkpoint_file_names_the_file(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path), "job", inline_threshold=0)
    b = backend()
    fill(b, KEY_SETS["int"])
    (handle,) = checkpoint([b], storage, 1)
    assert isinstance(handle.delegate, FileStateHandle)
    path = Path(handle.delegate.path.removeprefix("file://"))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(InvalidCheckpointError, match=f"{path.name}"):
        backend().restore([handle], StateReader(storage))


def test_a_corrupt_range_names_the_checkpoint_file(tmp_path: Path) -> None:
    """Bytes that pass the file's checksum but whose key-group range is wrong (a handle
    that does not match its file): the error names the file and the key group."""
    storage = CheckpointStorage(str(tmp_path), "job", inline_threshold=0)
    b = backend()
    fill(b, KEY_SETS["int"])
    (handle,) = checkpoint([b], storage, 1)
    first = next(kg for kg, (start, end) in handle.key_groups() if end > start)
    ranges = list(handle.ranges)
    start, end = ranges[first]
    ranges[first] = (start + 3, end)
    bad = KeyGroupsStateHandle(handle.key_group_range, tuple(ranges), handle.delegate, handle.state_kinds)
    with pytest.raises(InvalidCheckpointError, match=f"key group {first} .*checkpoint file .*chk-1"):
        backend().restore([bad], StateReader(storage))


def test_record_state_is_refused_naming_the_fix() -> None:
    b = backend()
    with pytest.raises(TypeError, match="columnar keyed state.*get_columnar_state.*to_records"):
        b.set_current_key("k", 3)
    with pytest.raises(TypeError, match="state \\('count'\\).*get_columnar_state"):
        b.get_partitioned_state(ValueStateDescriptor("count", int))
    assert b.get_current_key() is None


def test_record_state_in_the_checkpoint_is_refused(tmp_path: Path) -> None:
    """A checkpoint of the heap backend for the same operator (a uid reused for a batch
    operator) cannot be restored as columnar state."""
    storage = CheckpointStorage(str(tmp_path), "job")
    heap = HeapKeyedStateBackend(ALL, MAX_PARALLELISM)
    heap.set_current_key("k", 5)
    heap.get_partitioned_state(ValueStateDescriptor("count", int)).update(3)  # type: ignore[attr-defined]
    snapshot = heap.snapshot(1)
    handles = snapshot.serialize().write(storage, 1, None).handles
    with pytest.raises(
        IncompatibleRestoredStateError, match="record state \\[\\('count', 'value'\\)\\].*uid"
    ):
        backend().restore(handles, StateReader(storage))


def test_dispose_drops_everything() -> None:
    b = backend()
    fill(b, KEY_SETS["int"])
    b.dispose()
    assert not b.has_state() and b.num_keys("s") == 0
