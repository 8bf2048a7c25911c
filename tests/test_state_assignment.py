"""Which state each subtask restores: operator-state repartitioning (S52) and assign_states."""

from __future__ import annotations

import dataclasses
import logging
import random
from collections import Counter
from dataclasses import dataclass

import pytest

from chandy.checkpoint.operator_state import OperatorState
from chandy.checkpoint.state_assignment import (
    VertexToRestore,
    assign_states,
    repartition_operator_state,
)
from chandy.errors import InvalidCheckpointError
from chandy.state.handles import (
    ByteStreamStateHandle,
    IncrementalKeyedStateHandle,
    InputChannelStateHandle,
    KeyGroupsStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
    OperatorStateMeta,
    Range,
)
from chandy.state.key_groups import KeyGroupRange, compute_operator_index_for_key_group
from chandy.state.snapshot import OperatorSubtaskState

SPLIT = OperatorStateDistributionMode.SPLIT_DISTRIBUTE
UNION = OperatorStateDistributionMode.UNION
BROADCAST = OperatorStateDistributionMode.BROADCAST

#: An element of operator state: which old subtask's stream, which byte range in it.
Element = tuple[str, Range]


# ---------------------------------------------------------------------- S52


@dataclass
class OldState:
    """Operator state of ``len(handles)`` old subtasks, and what each named list held."""

    handles: list[list[OperatorStateHandle]]
    split: list[Element]
    union: list[Element]
    broadcast: dict[str, list[Element]]  # per old subtask: its (identical-content) copy


def element_ranges(rng: random.Random, count: int, offset: int) -> tuple[Range, ...]:
    ranges = []
    position = offset
    for _ in range(count):
        length = rng.randint(1, 16)
        ranges.append((position, position + length))
        position += length
    return tuple(ranges)


def random_old_state(rng: random.Random, old_parallelism: int) -> OldState:
    with_union = rng.random() < 0.5  # without union state, equal parallelism keeps the lists
    broadcast_count = rng.randint(1, 4)  # every subtask holds the whole broadcast state
    handles: list[list[OperatorStateHandle]] = []
    split: list[Element] = []
    union: list[Element] = []
    broadcast: dict[str, list[Element]] = {}
    for index in range(old_parallelism):
        name = f"old-{index}"
        delegate = ByteStreamStateHandle(name, b"")
        split_ranges = element_ranges(rng, rng.randint(0, 12), 0)
        union_ranges = element_ranges(rng, rng.randint(0, 4), 10_000)
        broadcast_ranges = element_ranges(rng, broadcast_count, 20_000)
        states = {
            "split": OperatorStateMeta(SPLIT, split_ranges),
            "broadcast": OperatorStateMeta(BROADCAST, broadcast_ranges),
        }
        if with_union:
            states["union"] = OperatorStateMeta(UNION, union_ranges)
        else:
            union_ranges = ()
        handles.append([OperatorStateHandle(states, delegate)])
        split += [(name, r) for r in split_ranges]
        union += [(name, r) for r in union_ranges]
        broadcast[name] = [(name, r) for r in broadcast_ranges]
    return OldState(handles, split, union, broadcast)


def elements_of(handles: list[OperatorStateHandle], state_name: str) -> list[Element]:
    found: list[Element] = []
    for handle in handles:
        meta = handle.states.get(state_name)
        if meta is None:
            continue
        assert isinstance(handle.delegate, ByteStreamStateHandle)
        found += [(handle.delegate.name, r) for r in meta.elements]
    return found


def check_repartitioning(old: OldState, new_parallelism: int) -> None:
    old_parallelism = len(old.handles)
    new = repartition_operator_state(old.handles, new_parallelism)
    assert len(new) == new_parallelism

    split_per_subtask = [elements_of(handles, "split") for handles in new]
    assert Counter(e for part in split_per_subtask for e in part) == Counter(old.split)
    if old_parallelism != new_parallelism:  # as in Flink: unchanged parallelism keeps the lists
        loads = [len(part) for part in split_per_subtask]
        assert max(loads) - min(loads) <= 1, loads

    for handles in new:
        assert Counter(elements_of(handles, "union")) == Counter(old.union)
        broadcast = elements_of(handles, "broadcast")
        owners = {name for name, _ in broadcast}
        assert len(owners) == 1, owners  # one copy, from one old subtask
        assert broadcast == old.broadcast[owners.pop()]
        for handle in handles:
            for name, meta in handle.states.items():
                assert meta.mode is {"split": SPLIT, "union": UNION, "broadcast": BROADCAST}[name]


@pytest.mark.slow
def test_s52_partitionable_state_repartitioning_10000_random_runs() -> None:
    rng = random.Random(52)
    for _ in range(10_000):
        old_parallelism = rng.randint(1, 9)
        new_parallelism = rng.randint(1, 9)
        check_repartitioning(random_old_state(rng, old_parallelism), new_parallelism)


@pytest.mark.parametrize(("old_parallelism", "new_parallelism"), [(1, 9), (9, 1), (3, 7), (7, 3), (4, 4)])
def test_s52_split_lists_are_spread_evenly(old_parallelism: int, new_parallelism: int) -> None:
    handles = [
        [
            OperatorStateHandle(
                {"split": OperatorStateMeta(SPLIT, element_ranges(random.Random(i), 10, 0))},
                ByteStreamStateHandle(f"old-{i}", b""),
            )
        ]
        for i in range(old_parallelism)
    ]
    new = repartition_operator_state(handles, new_parallelism)
    loads = [len(elements_of(h, "split")) for h in new]
    assert sum(loads) == 10 * old_parallelism
    assert max(loads) - min(loads) <= 1


def test_equal_parallelism_keeps_each_subtasks_split_list_beside_a_union_state() -> None:
    """A source's reader splits (split-distribute) next to its shared union state, at an
    unchanged parallelism, stay with the subtask that read them, as in Flink (only the union
    list is dealt out again). Subtask 0's list is empty (its split ended): were the lists dealt
    out again, subtask 0 would read subtask 1's split after the restore, behind the in-flight
    data of its old split (an unaligned checkpoint's channel state, ending in that split's final
    watermark), and downstream event time would run ahead of the moved split."""
    union = element_ranges(random.Random(1), 2, 10_000)
    splits = [(), ((0, 7),), ((7, 12), (12, 20))]
    handles = [
        [
            OperatorStateHandle(
                {"splits": OperatorStateMeta(SPLIT, ranges), "shared": OperatorStateMeta(UNION, union)},
                ByteStreamStateHandle(f"old-{index}", b""),
            )
        ]
        for index, ranges in enumerate(splits)
    ]
    new = repartition_operator_state(handles, 3)
    assert [elements_of(h, "splits") for h in new] == [
        [(f"old-{index}", r) for r in ranges] for index, ranges in enumerate(splits)
    ]
    every_union = [(f"old-{index}", r) for index in range(3) for r in union]
    assert [Counter(elements_of(h, "shared")) for h in new] == [Counter(every_union)] * 3


# ---------------------------------------------------------------------- assign_states


MAX_PARALLELISM = 128


def keyed_operator_state(
    operator_id: str, parallelism: int, max_parallelism: int = MAX_PARALLELISM
) -> OperatorState:
    """Keyed state of ``parallelism`` old subtasks; key group k lives at bytes [10k, 10k + 10)."""
    state = OperatorState(operator_id, parallelism, max_parallelism)
    for index in range(parallelism):
        key_groups = KeyGroupRange.of_operator(max_parallelism, parallelism, index)
        handle = KeyGroupsStateHandle(
            key_groups,
            tuple((10 * k, 10 * k + 10) for k in key_groups),
            ByteStreamStateHandle(f"old-{index}", b""),
        )
        state.put_state(index, OperatorSubtaskState((handle,), ()))
    return state


def vertex(
    parallelism: int, operator_ids: tuple[str, ...] = ("window",), max_parallelism: int = MAX_PARALLELISM
) -> VertexToRestore:
    return VertexToRestore(
        7,
        "Window(keyed)",
        parallelism,
        max_parallelism,
        operator_ids,
        tuple(f"{op}-name" for op in operator_ids),
    )


@pytest.mark.parametrize(
    ("old_parallelism", "new_parallelism"), [(2, 3), (3, 2), (1, 4), (4, 1), (5, 7), (7, 5), (3, 3), (1, 128)]
)
def test_keyed_state_is_split_by_key_group_range(old_parallelism: int, new_parallelism: int) -> None:
    states = {"window": keyed_operator_state("window", old_parallelism)}
    assigned = assign_states(
        states, [vertex(new_parallelism)], allow_non_restored_state=False, source="chk-1"
    )

    owner_of: dict[int, int] = {}
    for index in range(new_parallelism):
        expected = KeyGroupRange.of_operator(MAX_PARALLELISM, new_parallelism, index)
        subtask = assigned[(7, index)].subtask_states["window"]
        seen: list[int] = []
        for handle in subtask.managed_keyed_state:
            for key_group, byte_range in handle.key_groups():
                assert byte_range == (10 * key_group, 10 * key_group + 10)
                old_owner = compute_operator_index_for_key_group(MAX_PARALLELISM, old_parallelism, key_group)
                assert isinstance(handle.delegate, ByteStreamStateHandle)
                assert handle.delegate.name == f"old-{old_owner}"
                assert key_group not in owner_of, f"key group {key_group} assigned twice"
                owner_of[key_group] = index
                seen.append(key_group)
        assert sorted(seen) == list(expected)
    assert sorted(owner_of) == list(range(MAX_PARALLELISM))


def test_unclaimed_operator_state_is_refused() -> None:
    states = {
        "window": keyed_operator_state("window", 2),
        "removed-op": keyed_operator_state("removed-op", 2),
    }
    with pytest.raises(InvalidCheckpointError) as error:
        assign_states(states, [vertex(2)], allow_non_restored_state=False, source="chk-4")
    assert "removed-op" in str(error.value)
    assert "chk-4" in str(error.value)


def test_unclaimed_operator_state_is_skipped_when_allowed() -> None:
    states = {
        "window": keyed_operator_state("window", 2),
        "removed-op": keyed_operator_state("removed-op", 2),
    }
    assigned = assign_states(states, [vertex(2)], allow_non_restored_state=True, source="chk-4")
    assert set(assigned) == {(7, 0), (7, 1)}
    for snapshot in assigned.values():
        assert set(snapshot.subtask_states) == {"window"}


def test_every_subtask_of_a_checkpointed_operator_hears_of_it_and_a_new_operator_is_absent() -> None:
    """At a higher parallelism some subtasks get nothing of an operator's state; they still get
    an (empty) entry, which tells a restored source to read only what it was given. An
    operator the checkpoint does not know (added since) gets no entry: it starts afresh, a new
    source planning its own splits."""
    stateless = OperatorState("map", 2, MAX_PARALLELISM)  # in the checkpoint, no subtask state
    states = {"window": keyed_operator_state("window", 1), "map": stateless}
    assigned = assign_states(
        states, [vertex(3, ("window", "map", "new-source"))], allow_non_restored_state=False, source="sp"
    )
    for index in range(3):
        entries = assigned[(7, index)].subtask_states
        assert set(entries) == {"window", "map"}
        assert entries["map"] == OperatorSubtaskState()


def test_changed_max_parallelism_is_refused() -> None:
    states = {"window": keyed_operator_state("window", 2, max_parallelism=128)}
    with pytest.raises(InvalidCheckpointError) as error:
        assign_states(
            states, [vertex(2, max_parallelism=256)], allow_non_restored_state=False, source="chk-5"
        )
    message = str(error.value)
    assert "max parallelism" in message
    assert "128" in message
    assert "256" in message
    assert "window-name" in message


@pytest.mark.parametrize(("old_parallelism", "new_parallelism"), [(2, 3), (3, 1), (1, 2), (4, 4)])
def test_incremental_handles_go_whole_to_every_subtask_whose_range_they_overlap(
    old_parallelism: int, new_parallelism: int
) -> None:
    """A RocksDB checkpoint cannot be cut by key group: each new subtask gets every old
    database that holds any of its key groups, whole, and clips it itself on restore."""
    state = OperatorState("window", old_parallelism, MAX_PARALLELISM)
    old_handles = []
    for index in range(old_parallelism):
        handle = IncrementalKeyedStateHandle(
            KeyGroupRange.of_operator(MAX_PARALLELISM, old_parallelism, index),
            f"backend-{index}",
            5,
            ((f"{index}.sst", ByteStreamStateHandle(f"sst-{index}", b"")),),
            (),
        )
        old_handles.append(handle)
        state.put_state(index, OperatorSubtaskState((handle,), ()))

    assigned = assign_states(
        {"window": state}, [vertex(new_parallelism)], allow_non_restored_state=False, source="chk-5"
    )

    for index in range(new_parallelism):
        key_groups = KeyGroupRange.of_operator(MAX_PARALLELISM, new_parallelism, index)
        expected = [h for h in old_handles if h.key_group_range.intersection(key_groups).number_of_key_groups]
        got = list(assigned[(7, index)].subtask_states["window"].managed_keyed_state)
        assert got == expected  # whole handles (not clipped), in old subtask order
        covered = {k for h in got for k in h.key_group_range}
        assert set(key_groups) <= covered


# ---------------------------------------------------------------------- channel state (unaligned)


def unaligned_state(parallelism: int, with_keyed: bool = True) -> dict[str, OperatorState]:
    """A keyed window whose subtasks 0 and (if any) 2 hold in-flight data, and its source."""
    window = (
        keyed_operator_state("window", parallelism)
        if with_keyed
        else OperatorState("window", parallelism, 128)
    )
    for index in (0, 2):
        if index < parallelism:
            stream = ByteStreamStateHandle(f"channels-{index}", b"x" * 10)
            channels = (InputChannelStateHandle(0, stream, 0, 4), InputChannelStateHandle(1, stream, 4, 6))
            old = window.subtask_states.get(index, OperatorSubtaskState())
            window.put_state(index, dataclasses.replace(old, input_channel_state=channels))
    return {"window": window, "source": OperatorState("source", 2, 128, name="source")}


def unaligned_vertex(parallelism: int, source_parallelism: int = 2) -> VertexToRestore:
    return dataclasses.replace(vertex(parallelism), inputs=(("source", source_parallelism),))


def test_skipping_an_unclaimed_operator_with_in_flight_data_warns_how_much(
    caplog: pytest.LogCaptureFixture,
) -> None:
    states = unaligned_state(3)
    states["window"] = dataclasses.replace(states["window"], operator_id="removed-op")
    states = {"removed-op": states["window"], "window": keyed_operator_state("window", 3)}
    with caplog.at_level(logging.INFO, logger="chandy.checkpoint.state_assignment"):
        assign_states(states, [vertex(3)], allow_non_restored_state=True, source="chk-6")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "20 bytes of in-flight records" in warnings[0] and "not replayed" in warnings[0]


@pytest.mark.parametrize("with_keyed", [True, False])
def test_channel_state_goes_to_the_same_subtask(with_keyed: bool) -> None:
    states = unaligned_state(3, with_keyed)
    assigned = assign_states(states, [unaligned_vertex(3)], allow_non_restored_state=False, source="chk-6")
    for index in range(3):
        restored = assigned[(7, index)].subtask_states.get("window", OperatorSubtaskState())
        assert (
            restored.input_channel_state
            == states["window"].subtask_states.get(index, OperatorSubtaskState()).input_channel_state
        )
    assert [h.channel_index for h in assigned[(7, 2)].subtask_states["window"].input_channel_state] == [0, 1]
    assert assigned[(7, 1)].subtask_states.get("window", OperatorSubtaskState()).input_channel_state == ()


@pytest.mark.parametrize(
    ("new_parallelism", "source_parallelism", "cause"),
    [
        (4, 2, "its parallelism changed from 3 to 4"),
        (2, 2, "its parallelism changed from 3 to 2"),
        (
            3,
            5,
            "its number of input channels changed: the parallelism of upstream operator 'source' "
            "(no uid, operator id source) changed from 2 to 5",
        ),
    ],
)
def test_rescaling_an_unaligned_checkpoint_is_refused(
    new_parallelism: int, source_parallelism: int, cause: str
) -> None:
    with pytest.raises(InvalidCheckpointError) as error:
        assign_states(
            unaligned_state(3),
            [unaligned_vertex(new_parallelism, source_parallelism)],
            allow_non_restored_state=False,
            source="chk-6",
        )
    message = str(error.value)
    assert message.startswith("chk-6: operator 'window-name' (no uid) cannot be restored because ")
    assert cause in message
    assert "unaligned and holds in-flight data" in message
    assert "cannot be redistributed" in message
    assert "Restore it at parallelism 3" in message and "take a savepoint" in message
    assert "restore from a savepoint or an aligned checkpoint" in message


def test_an_aligned_checkpoint_still_rescales_when_upstream_changed() -> None:
    """Only in-flight data pins the layout: the same vertex without channel state rescales."""
    states = {"window": keyed_operator_state("window", 3), "source": OperatorState("source", 2, 128)}
    assigned = assign_states(
        states, [unaligned_vertex(4, source_parallelism=5)], allow_non_restored_state=False, source="chk-6"
    )
    assert set(assigned) == {(7, i) for i in range(4)}


def test_channel_state_of_an_operator_now_chained_after_another_is_refused() -> None:
    """In-flight data is replayed into the task's inputs, which feed its first operator only."""
    moved = dataclasses.replace(
        unaligned_vertex(3), operator_ids=("map", "window"), operator_names=("Map", "W")
    )
    with pytest.raises(InvalidCheckpointError) as error:
        assign_states(unaligned_state(3), [moved], allow_non_restored_state=False, source="chk-6")
    assert "it is no longer the first operator of its task (now chained after 'Map')" in str(error.value)
    assert "restore from a savepoint or an aligned checkpoint" in str(error.value)


def test_a_checkpoint_whose_channel_state_is_empty_rescales() -> None:
    """Channel state slices without bytes (nothing was in flight) pin nothing."""
    window = keyed_operator_state("window", 2)
    empty = (InputChannelStateHandle(0, ByteStreamStateHandle("c", b""), 0, 0),)
    window.put_state(0, dataclasses.replace(window.subtask_states[0], input_channel_state=empty))
    states = {"window": window, "source": OperatorState("source", 2, 128)}
    assigned = assign_states(states, [unaligned_vertex(3)], allow_non_restored_state=False, source="chk-7")
    assert all(not snapshot.subtask_states["window"].input_channel_state for snapshot in assigned.values())
