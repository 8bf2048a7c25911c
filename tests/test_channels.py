"""In-memory channels and the input gate: order, credits, blocking, wakeups."""

from __future__ import annotations

import threading
import time

import pytest

from chandy.network.cancellation import TaskCancelledError
from chandy.network.channel import ChannelClosedError, LocalChannel
from chandy.network.events import END_OF_PARTITION
from chandy.network.input_gate import InputGate
from chandy.network.wakeup import Wakeup


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
