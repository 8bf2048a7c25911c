"""Each partitioner routes a batch the way Flink's does."""

from __future__ import annotations

import pytest

from chandy.state.key_groups import assign_key_to_parallel_operator
from chandy.task.batches import KeyedBatch
from chandy.task.partitioners import (
    BroadcastPartitioner,
    ForwardPartitioner,
    KeyGroupStreamPartitioner,
    RebalancePartitioner,
    ShufflePartitioner,
    StreamPartitioner,
)


def route(partitioner: StreamPartitioner, records: list, channels: int, subtask: int = 0) -> list:
    p = partitioner.copy()
    p.setup(channels, subtask)
    buffers = [p.new_buffer() for _ in range(channels)]
    p.partition(records, buffers)
    return buffers


def test_forward_keeps_everything_on_one_channel_in_order() -> None:
    assert route(ForwardPartitioner(), [1, 2, 3], 1) == [[1, 2, 3]]


def test_rebalance_is_round_robin_per_record_across_batches() -> None:
    p = RebalancePartitioner()
    p.setup(3, 0)
    buffers: list[list[int]] = [[], [], []]
    p.partition(list(range(7)), buffers)
    p.partition(list(range(7, 10)), buffers)
    sizes = sorted(len(b) for b in buffers)
    assert sizes == [3, 3, 4]
    # consecutive records go to consecutive channels
    owner = {r: i for i, b in enumerate(buffers) for r in b}
    assert all(owner[r + 1] == (owner[r] + 1) % 3 for r in range(9))


def test_shuffle_spreads_records_and_is_reproducible_with_a_seed() -> None:
    a = route(ShufflePartitioner(seed=7), list(range(3000)), 3)
    b = route(ShufflePartitioner(seed=7), list(range(3000)), 3)
    assert a == b
    assert all(800 < len(x) < 1200 for x in a)
    assert sorted(r for x in a for r in x) == list(range(3000))


def test_broadcast_sends_every_record_everywhere() -> None:
    assert route(BroadcastPartitioner(), [1, 2], 3) == [[1, 2], [1, 2], [1, 2]]


@pytest.mark.parametrize("channels", [1, 2, 5])
def test_key_partitioner_sends_each_key_to_its_key_group_owner(channels: int) -> None:
    records = [(f"k{i % 37}", i) for i in range(500)]
    partitioner = KeyGroupStreamPartitioner(lambda r: r[0]).for_target(128, ship_keys=True)
    buffers = route(partitioner, records, channels)
    seen = []
    for channel, batch in enumerate(buffers):
        assert isinstance(batch, KeyedBatch)
        for kg, key, value in batch:
            assert key == value[0]
            assert assign_key_to_parallel_operator(key, 128, channels) == channel
            assert kg * channels // 128 == channel
            seen.append(value)
    assert sorted(seen) == sorted(records)


def test_key_partitioner_into_a_plain_operator_ships_values_only() -> None:
    partitioner = KeyGroupStreamPartitioner(lambda r: r % 3).for_target(128, ship_keys=False)
    buffers = route(partitioner, list(range(30)), 2)
    assert sorted(buffers[0] + buffers[1]) == list(range(30))
    for channel, batch in enumerate(buffers):
        assert all(assign_key_to_parallel_operator(r % 3, 128, 2) == channel for r in batch)


def test_key_partitioner_names_an_unhashable_key() -> None:
    partitioner = KeyGroupStreamPartitioner(lambda r: [r]).for_target(128, ship_keys=True)
    with pytest.raises(TypeError, match="not hashable"):
        route(partitioner, [1, 2], 2)
