"""Priority barriers and overdrafts over TCP, between two real data planes on loopback."""

from __future__ import annotations

import pickle
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chandy.network.auth import new_secret
from chandy.network.events import CheckpointBarrier, PriorityBarrier, Watermark
from chandy.network.input_gate import InputGate
from chandy.network.tcp import (
    ChannelKey,
    DataPlane,
    RemoteInputChannel,
    RemoteOutputChannel,
)
from chandy.network.wakeup import Wakeup
from tests.channel_traffic import consume_numbered, data_planes, produce_numbered, send_in_background

KEY = ChannelKey(generation=1, edge_index=0, producer_subtask=0, consumer_subtask=1)


@pytest.fixture
def planes() -> Iterator[tuple[DataPlane, DataPlane]]:
    """Slot 0 (the producer's) and slot 1 (the consumer's), connected both ways."""
    with data_planes(new_secret()) as data:
        connecting = [threading.Thread(target=plane.connect_to_peers, args=(10.0,)) for plane in data]
        for thread in connecting:
            thread.start()
        for thread in connecting:
            thread.join(15)
        yield data[0], data[1]


def open_channel(
    planes: tuple[DataPlane, DataPlane], capacity: int
) -> tuple[RemoteOutputChannel, RemoteInputChannel, InputGate, Wakeup, Wakeup]:
    producer_plane, consumer_plane = planes
    inbound = consumer_plane.input_channel(KEY, producer_slot=0, capacity=capacity)
    outbound = producer_plane.output_channel(KEY, consumer_slot=1)
    producer_wakeup, consumer_wakeup = Wakeup(), Wakeup()
    outbound.bind_producer(producer_wakeup, lambda: False)
    gate = InputGate([inbound], consumer_wakeup)
    return outbound, inbound, gate, producer_wakeup, consumer_wakeup


def wait_for_priority(gate: InputGate, wakeup: Wakeup) -> tuple[int, PriorityBarrier]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if gate.has_priority_event:
            polled = gate.poll_priority()
            if polled is not None:
                return polled
        wakeup.wait(0.1)
    raise AssertionError("no priority barrier arrived within 10 s")


def poll(gate: InputGate, wakeup: Wakeup) -> Any:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        polled = gate.poll_next()
        if polled is not None:
            return polled[1]
        wakeup.wait(0.1)
    raise AssertionError("no item arrived within 10 s")


def test_a_priority_barrier_arrives_after_every_data_frame_sent_before_it(
    planes: tuple[DataPlane, DataPlane],
) -> None:
    """The barrier overtakes a full channel without credit, yet the consumer already holds
    every frame sent before it, large ones (sent in two writes) included, and takes none."""
    outbound, inbound, gate, _, wakeup = open_channel(planes, capacity=4)
    big = list(range(40_000))  # a frame of more than 64 KiB
    items: list[Any] = [[1], big, Watermark(9), [2]]
    for item in items:
        outbound.send(item)  # waits for the consumer's initial credits
    outbound.send_overdraft([3])  # no credit left, still sent
    assert not outbound.has_credit()
    barrier = CheckpointBarrier(5, 1234)
    outbound.send_priority(barrier)  # must not wait for credit
    index, priority = wait_for_priority(gate, wakeup)
    assert (index, priority) == (0, PriorityBarrier(barrier, 5))
    assert inbound.backlog() == 5 and inbound.taken == 0
    overtaken = gate.in_flight_before(0, priority.position)
    assert [pickle.loads(p) for p in overtaken] == [*items, [3]]
    assert not gate.reached(0, priority.position)
    for expected in [*items, [3]]:
        item = poll(gate, wakeup)
        assert item == expected
        assert pickle.loads(gate.serialized(0, item)) == expected
    assert gate.reached(0, priority.position)
    assert gate.in_flight_before(0, priority.position) == []


def test_priority_positions_over_tcp_with_a_concurrent_producer(planes: tuple[DataPlane, DataPlane]) -> None:
    """Numbered batches and priority barriers at random points, producer and consumer on
    their own threads: each barrier's position counts the batches sent before it, and those
    not yet taken are all already queued when the barrier is seen."""
    outbound, _, gate, _, wakeup = open_channel(planes, capacity=4)
    rng = random.Random(16)
    total = 2000
    barrier_after = sorted(rng.sample(range(total + 1), 40))
    producer = produce_numbered(outbound, total, barrier_after, overdrafts=rng)
    taken, seen, overtaking = consume_numbered(gate, wakeup, total, len(barrier_after))
    producer.join(10)
    assert taken == list(range(1, total + 1))
    assert [p.position for p in seen] == barrier_after
    assert [p.barrier.checkpoint_id for p in seen] == list(range(len(barrier_after)))
    assert overtaking > 0


def test_an_overdraft_takes_credit_below_zero_and_sends_wait_until_it_recovers(
    planes: tuple[DataPlane, DataPlane],
) -> None:
    outbound, inbound, gate, _, wakeup = open_channel(planes, capacity=2)
    outbound.send([1])
    outbound.send([2])
    outbound.send_overdraft([3])
    outbound.send_overdraft([4])  # two overdrafts: credit is at -2
    sent, sender = send_in_background(outbound, [5])
    assert poll(gate, wakeup) == [1]
    assert poll(gate, wakeup) == [2]
    assert not sent.wait(0.3)  # two credits back: credit at 0, still none to send with
    assert inbound.backlog() == 2
    assert poll(gate, wakeup) == [3]
    assert sent.wait(10)  # the third credit makes it positive
    sender.join(5)
    assert [poll(gate, wakeup), poll(gate, wakeup)] == [[4], [5]]
    assert outbound.sent == 5 and inbound.taken == 5


def test_frames_sent_without_credit_before_the_consumer_opened_its_channel_are_kept(
    planes: tuple[DataPlane, DataPlane],
) -> None:
    """An overdraft and a priority barrier need no credit, so they can reach a slot before
    its task opened the channel (a producer deployed first): they wait there for it."""
    producer_plane, consumer_plane = planes
    early = producer_plane.output_channel(KEY, consumer_slot=1)
    early.send_overdraft([1])
    early.send_priority(CheckpointBarrier(3, 0))
    # A frame on another channel of the same connection, sent after them: once it arrived,
    # so had they.
    other_key = ChannelKey(1, 1, 0, 1)
    other = consumer_plane.input_channel(other_key, producer_slot=0, capacity=2)
    other_wakeup = Wakeup()
    other_gate = InputGate([other], other_wakeup)
    producer_plane.output_channel(other_key, consumer_slot=1).send_priority(CheckpointBarrier(3, 0))
    wait_for_priority(other_gate, other_wakeup)

    inbound = consumer_plane.input_channel(KEY, producer_slot=0, capacity=2)
    wakeup = Wakeup()
    gate = InputGate([inbound], wakeup)
    assert wait_for_priority(gate, wakeup) == (0, PriorityBarrier(CheckpointBarrier(3, 0), 1))
    assert [pickle.loads(p) for p in gate.in_flight_before(0, 1)] == [[1]]
    assert poll(gate, wakeup) == [1]
    early.bind_producer(Wakeup(), lambda: False)
    early.send([2])  # the credit the consumer granted on opening, less the overdraft
    assert poll(gate, wakeup) == [2]


def test_early_frames_of_a_released_generation_are_dropped(planes: tuple[DataPlane, DataPlane]) -> None:
    producer_plane, consumer_plane = planes
    consumer_plane.release_generation(KEY.generation)
    stale = producer_plane.output_channel(KEY, consumer_slot=1)
    stale.send_overdraft([1])
    stale.send_priority(CheckpointBarrier(3, 0))
    marker_key = ChannelKey(KEY.generation + 1, 0, 0, 1)
    marker = consumer_plane.input_channel(marker_key, producer_slot=0, capacity=2)
    marker_wakeup = Wakeup()
    producer_plane.output_channel(marker_key, consumer_slot=1).send_priority(CheckpointBarrier(3, 0))
    wait_for_priority(InputGate([marker], marker_wakeup), marker_wakeup)
    # Were they kept, a channel opened under that key (never, in a slot) would get them.
    gate = InputGate([consumer_plane.input_channel(KEY, producer_slot=0, capacity=2)], Wakeup())
    assert gate.poll_priority() is None and gate.poll_next() is None
