"""In-memory channels and the input gate: order, credits, blocking, wakeups, priority
barriers and their positions, overdrafts, recovered items."""

from __future__ import annotations

import pickle
import random
import threading
import time
from typing import Any

import pytest

from chandy.network.cancellation import TaskCancelledError
from chandy.network.channel import ChannelClosedError, LocalChannel
from chandy.network.events import (
    ACTIVE,
    END_OF_PARTITION,
    CancelCheckpointMarker,
    CheckpointBarrier,
    PriorityBarrier,
    Watermark,
)
from chandy.network.input_gate import InputGate
from chandy.network.wakeup import Wakeup
from tests.channel_traffic import consume_numbered, produce_numbered, send_in_background


def test_items_come_out_in_order() -> None:
    channel = LocalChannel(capacity=10)
    for i in range(5):
        channel.send([i])
    channel.send(END_OF_PARTITION)
    assert [channel.poll() for _ in range(6)] == [[0], [1], [2], [3], [4], END_OF_PARTITION]
    assert channel.poll() is None


def test_a_sender_without_credit_blocks_until_the_receiver_takes_one() -> None:
    channel = LocalChannel(capacity=2)
    producer_wakeup = Wakeup()
    channel.bind_producer(producer_wakeup, lambda: False)
    channel.send([1])
    channel.send([2])
    assert not channel.has_credit()
    sent = threading.Event()

    def third() -> None:
        channel.send([3])
        sent.set()

    thread = threading.Thread(target=third)
    thread.start()
    assert not sent.wait(0.2)  # blocked: no credit
    assert channel.backlog() == 2
    assert channel.poll() == [1]  # a credit returns ...
    assert sent.wait(5)  # ... and the sender goes on
    thread.join()
    assert channel.max_backlog == 2


def test_a_blocked_sender_unwinds_when_its_task_is_cancelled() -> None:
    channel = LocalChannel(capacity=1)
    cancelled = threading.Event()
    wakeup = Wakeup()
    channel.bind_producer(wakeup, cancelled.is_set)
    channel.send([1])
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            channel.send([2])
        except TaskCancelledError as exc:
            errors.append(exc)

    thread = threading.Thread(target=blocked)
    thread.start()
    time.sleep(0.05)
    cancelled.set()
    wakeup.signal()
    thread.join(5)
    assert not thread.is_alive() and len(errors) == 1


def test_a_blocked_sender_fails_when_the_consumer_closed_the_channel() -> None:
    channel = LocalChannel(capacity=1)
    channel.send([1])
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            channel.send([2])
        except ChannelClosedError as exc:
            errors.append(exc)

    thread = threading.Thread(target=blocked)
    thread.start()
    channel.close()
    thread.join(5)
    assert len(errors) == 1


def test_gate_reads_round_robin_and_skips_blocked_channels() -> None:
    channels = [LocalChannel(10) for _ in range(3)]
    gate = InputGate(channels, Wakeup())
    for c, channel in enumerate(channels):
        channel.send([f"{c}a"])
        channel.send([f"{c}b"])
    assert [gate.poll_next() for _ in range(3)] == [(0, ["0a"]), (1, ["1a"]), (2, ["2a"])]
    gate.block_channel(1)
    assert gate.blocked_channels() == {1}
    assert [gate.poll_next() for _ in range(3)] == [(0, ["0b"]), (2, ["2b"]), None]
    gate.unblock_all()
    assert gate.poll_next() == (1, ["1b"])


def test_gate_is_finished_after_every_end_of_partition() -> None:
    channels = [LocalChannel(10) for _ in range(2)]
    gate = InputGate(channels, Wakeup())
    channels[0].send(END_OF_PARTITION)
    gate.poll_next()
    assert gate.is_channel_finished(0) and not gate.is_finished()
    channels[1].send(END_OF_PARTITION)
    gate.poll_next()
    assert gate.is_finished()


def test_arrival_wakes_the_consumer() -> None:
    wakeup = Wakeup()
    channel = LocalChannel(4)
    InputGate([channel], wakeup)
    threading.Timer(0.05, lambda: channel.send([1])).start()
    started = time.monotonic()
    assert wakeup.wait(5)
    assert time.monotonic() - started < 4


def test_a_signal_before_wait_is_not_lost() -> None:
    wakeup = Wakeup()
    wakeup.signal()
    assert wakeup.wait(0) is True
    assert wakeup.wait(0) is False


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="credit"):
        LocalChannel(0)


def dump(item: Any) -> bytes:
    return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)


def test_priority_positions_and_overtaken_items_with_a_concurrent_producer() -> None:
    """A producer thread sends numbered batches into a small channel (so it keeps waiting for
    credit) and priority barriers at random points; whenever the consumer sees a barrier, its
    position is the number of batches sent before it, and the items it overtook are exactly
    the queued batches numbered ``taken + 1 .. position``, still there to be taken."""
    total = 3000
    barrier_after = sorted(random.Random(16).sample(range(total + 1), 60))
    channel = LocalChannel(capacity=3)
    wakeup = Wakeup()
    gate = InputGate([channel], wakeup)
    channel.bind_producer(Wakeup(), lambda: False)
    producer = produce_numbered(channel, total, barrier_after)
    taken, seen, overtaking = consume_numbered(gate, wakeup, total, len(barrier_after))
    producer.join(5)
    assert taken == list(range(1, total + 1))
    assert [p.barrier.checkpoint_id for p in seen] == list(range(len(barrier_after)))
    assert [p.position for p in seen] == barrier_after
    assert overtaking > 0  # the barriers did overtake queued data
    assert channel.sent == total


def test_in_flight_before_keeps_batches_and_watermarks_and_takes_nothing() -> None:
    channel = LocalChannel(capacity=20)
    items: list[Any] = [
        [0],
        [1],
        Watermark(5),
        CancelCheckpointMarker(3),
        [2],
        CheckpointBarrier(3, 0),
        ACTIVE,
        [3],
    ]
    for item in items:
        channel.send(item)
    channel.send([4])  # after the barrier's position
    assert channel.poll() == [0]
    channel.send_priority(CheckpointBarrier(4, 0))
    priority = channel.poll_priority()
    assert priority == PriorityBarrier(CheckpointBarrier(4, 0), len(items) + 1)
    assert channel.poll_priority() is None
    overtaken = channel.in_flight_before(len(items))
    assert overtaken == [dump(i) for i in ([1], Watermark(5), [2], ACTIVE, [3])]
    assert channel.in_flight_before(1) == []  # nothing left before what was taken
    assert channel.backlog() == len(items)  # nothing taken
    assert [channel.poll() for _ in range(len(items))] == [*items[1:], [4]]
    assert channel.taken == len(items) + 1


def test_a_priority_barrier_overtakes_a_full_channel_without_credit() -> None:
    channel = LocalChannel(capacity=2)
    wakeup = Wakeup()
    gate = InputGate([channel], wakeup)
    channel.send([1])
    channel.send([2])
    assert not channel.has_credit()
    gate.block_channel(0)  # blocked by an alignment: priority barriers still get through
    assert not gate.has_priority_event
    sender = threading.Thread(target=channel.send_priority, args=(CheckpointBarrier(1, 0),))
    sender.start()
    sender.join(5)
    assert not sender.is_alive()  # it did not wait for credit
    assert wakeup.wait(0)  # the consumer was woken
    assert gate.has_priority_event
    assert gate.poll_priority() == (0, PriorityBarrier(CheckpointBarrier(1, 0), 2))
    assert gate.has_priority_event  # there might be another: ask again
    assert gate.poll_priority() is None
    assert not gate.has_priority_event
    assert not gate.reached(0, 2)
    gate.unblock_all()
    assert [gate.poll_next(), gate.poll_next()] == [(0, [1]), (0, [2])]
    assert gate.reached(0, 2)


def test_the_gate_finds_priority_barriers_on_every_channel() -> None:
    channels = [LocalChannel(4) for _ in range(3)]
    gate = InputGate(channels, Wakeup())
    channels[2].send([1])
    channels[2].send_priority(CheckpointBarrier(7, 0))
    channels[0].send_priority(CheckpointBarrier(7, 0))
    found = {gate.poll_priority(), gate.poll_priority()}
    assert found == {
        (0, PriorityBarrier(CheckpointBarrier(7, 0), 0)),
        (2, PriorityBarrier(CheckpointBarrier(7, 0), 1)),
    }
    assert gate.poll_priority() is None and not gate.has_priority_event


def test_an_overdraft_goes_beyond_credit_and_the_next_send_waits_for_credit_again() -> None:
    channel = LocalChannel(capacity=2)
    channel.bind_producer(Wakeup(), lambda: False)
    channel.send([1])
    channel.send([2])
    channel.send_overdraft([3])  # no credit, yet it does not wait
    assert channel.backlog() == 3 and channel.max_backlog == 3 and channel.sent == 3
    sent, thread = send_in_background(channel, [4])
    assert channel.poll() == [1]
    assert not sent.wait(0.2)  # two queued for two credits: still none
    assert channel.poll() == [2]
    assert sent.wait(5)
    thread.join()
    assert [channel.poll(), channel.poll(), channel.poll()] == [[3], [4], None]


def test_recovered_items_come_before_live_ones_and_count_as_in_flight() -> None:
    live, other = LocalChannel(4), LocalChannel(4)
    gate = InputGate([live, other], Wakeup())
    recovered = [dump([1]), dump(Watermark(3)), dump([2])]
    gate.add_recovered(0, recovered[:2])
    gate.add_recovered(0, recovered[2:])  # added to what is still there
    gate.add_recovered(1, [])  # nothing: the channel stays as it is
    assert gate.channels[1] is other
    live.send([10])
    live.send_priority(CheckpointBarrier(1, 0))
    live.send([11])
    (index, priority) = gate.poll_priority() or (None, None)
    assert index == 0 and priority is not None and priority.position == 1
    assert gate.in_flight_before(0, 1) == [*recovered, dump([10])]
    assert not gate.reached(0, 1)
    taken = []
    for payload in recovered:
        item = gate.poll_next()
        assert item is not None and item[0] == 0
        taken.append(item[1])
        assert gate.serialized(0, item[1]) == payload
        assert gate.channels[0].size_of(item[1]) == len(payload)
        assert not gate.reached(0, 1)
    assert taken == [[1], Watermark(3), [2]]
    assert gate.in_flight_before(0, 1) == [dump([10])]
    assert gate.poll_next() == (0, [10])
    assert gate.channels[0] is live  # the live channel is read directly again
    assert gate.serialized(0, [10]) == dump([10])
    assert gate.reached(0, 1) and gate.in_flight_before(0, 1) == []
    assert gate.poll_next() == (0, [11])


def test_recovered_items_are_replayed_round_robin_with_the_other_channels() -> None:
    channels = [LocalChannel(4), LocalChannel(4)]
    wakeup = Wakeup()
    gate = InputGate(channels, wakeup)
    gate.add_recovered(1, [dump(["r1"]), dump(["r2"])])
    assert wakeup.wait(0)  # the task looks at the gate even if no live item arrives
    channels[0].send(["a"])
    channels[1].send(["b"])
    polled = [gate.poll_next() for _ in range(5)]
    assert polled == [(0, ["a"]), (1, ["r1"]), (1, ["r2"]), (1, ["b"]), None]
    assert gate.channels[1].taken == 1


def test_a_priority_barrier_sent_before_the_gate_was_built_is_noticed() -> None:
    channel = LocalChannel(4)
    channel.send([1])
    channel.send_priority(CheckpointBarrier(2, 0))  # the producer task started first
    gate = InputGate([channel], Wakeup())
    assert gate.has_priority_event
    assert gate.poll_priority() == (0, PriorityBarrier(CheckpointBarrier(2, 0), 1))
