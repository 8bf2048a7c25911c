"""Traffic for channel tests: numbered batches with priority barriers between them.

A producer thread sends the batches ``[1] .. [total]`` and a priority barrier after the
batch counts in ``barrier_after``; the consumer checks, at every barrier it sees, that the
barrier's position is right and that the items it overtook are exactly the batches
``taken + 1 .. position``. The same traffic runs over an in-memory and a TCP channel.
"""

from __future__ import annotations

import pickle
import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from chandy.network.channel import OutputChannel
from chandy.network.events import CheckpointBarrier, PriorityBarrier
from chandy.network.input_gate import InputGate
from chandy.network.tcp import DataPlane, bind_data_listener
from chandy.network.wakeup import Wakeup


@contextmanager
def data_planes(secret: bytes, count: int = 2) -> Iterator[list[DataPlane]]:
    """``count`` slots' data planes on loopback, each knowing the others' addresses and not yet
    connected to them; closed with their listeners at the end."""
    listeners: list[tuple[socket.socket, str]] = [bind_data_listener("127.0.0.1") for _ in range(count)]
    peers = {slot: address for slot, (_, address) in enumerate(listeners)}
    data = [
        DataPlane(slot, secret, listener, address, peers)
        for slot, (listener, address) in enumerate(listeners)
    ]
    try:
        yield data
    finally:
        for plane in data:
            plane.close()
        for listener, _ in listeners:
            listener.close()


def send_in_background(channel: OutputChannel, item: Any) -> tuple[threading.Event, threading.Thread]:
    """``channel.send(item)`` on a thread of its own (it may wait for credit); the event is
    set once it returned."""
    sent = threading.Event()

    def send() -> None:
        channel.send(item)
        sent.set()

    thread = threading.Thread(target=send)
    thread.start()
    return sent, thread


def produce_numbered(
    channel: OutputChannel, total: int, barrier_after: list[int], overdrafts: random.Random | None = None
) -> threading.Thread:
    """A started producer thread; with ``overdrafts``, about one batch in 20 is an overdraft."""

    def produce() -> None:
        positions = iter(barrier_after)
        upcoming = next(positions, None)
        checkpoint = 0
        for n in range(total + 1):
            while upcoming == n:
                channel.send_priority(CheckpointBarrier(checkpoint, n))
                checkpoint += 1
                upcoming = next(positions, None)
            if n < total:
                overdraft = overdrafts is not None and overdrafts.random() < 0.05
                (channel.send_overdraft if overdraft else channel.send)([n + 1])

    thread = threading.Thread(target=produce)
    thread.start()
    return thread


def consume_numbered(
    gate: InputGate, wakeup: Wakeup, total: int, barriers: int
) -> tuple[list[int], list[PriorityBarrier], int]:
    """Reads channel 0 of ``gate`` until ``total`` batches and ``barriers`` barriers came,
    asking for priority barriers before every item as a task does. Returns the batch
    numbers, the barriers, and how many barriers overtook something."""
    taken: list[int] = []
    seen: list[PriorityBarrier] = []
    overtaking = 0
    deadline = time.monotonic() + 60
    while len(taken) < total or len(seen) < barriers:
        assert time.monotonic() < deadline, f"stuck after {len(taken)} items and {len(seen)} barriers"
        if gate.has_priority_event:
            polled = gate.poll_priority()
            if polled is not None:
                index, priority = polled
                assert index == 0
                seen.append(priority)
                overtaken = [pickle.loads(p) for p in gate.in_flight_before(0, priority.position)]
                assert overtaken == [[k] for k in range(len(taken) + 1, priority.position + 1)]
                assert gate.reached(0, priority.position) == (len(taken) >= priority.position)
                overtaking += bool(overtaken)
                continue
        item = gate.poll_next()
        if item is None:
            wakeup.wait(0.05)
            continue
        taken.append(item[1][0])
        assert gate.channels[0].taken == len(taken)
    return taken, seen, overtaking
