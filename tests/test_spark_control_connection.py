"""The driver's end of a slot's control connection, against a real socket whose peer
stops reading: the JobMaster thread sends through it and must never block."""

from __future__ import annotations

import socket
import threading
import time

from chandy.network.framing import FramedSocket
from chandy.runtime.spark.executor import SlotConnection
from chandy.runtime.spark.messages import RegisterSlot, Shutdown

#: Socket buffers of the test connections. Set before the connection is made, they turn off
#: Linux's buffer autotuning, which may grow a loopback receive buffer to
#: ``net.ipv4.tcp_rmem``'s maximum (32 MiB here): a 4 MB message then fits in the buffers
#: and the send the tests need to be stuck returns at once (a clean CI run failed so).
SOCKET_BUFFER_BYTES = 64 * 1024


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection (the driver's, the slot's) with small buffers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES
        )  # accepted sockets inherit it
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        accepted.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    return accepted, client


def test_sends_to_a_slot_that_stopped_reading_never_block_and_declare_it_lost() -> None:
    driver_end, slot_end = tcp_pair()  # slot_end is never read: a hung slot
    lost: list[str] = []
    declared = threading.Event()

    def on_lost(connection: SlotConnection, reason: str) -> None:
        lost.append(reason)
        declared.set()

    info = RegisterSlot(0, "127.0.0.1:1", "127.0.0.1", 1, None)
    slot = SlotConnection(info, FramedSocket(driver_end), on_lost, queue_capacity=4)
    message = Shutdown("x" * 4_000_000)  # more than both socket buffers hold
    try:
        sent = []
        for _ in range(8):
            started = time.monotonic()
            sent.append(slot.send(message))
            assert time.monotonic() - started < 0.5, "a send blocked its caller"
        assert declared.wait(10)
        assert "stopped reading" in lost[0]
        assert sent[0] is True and sent[-1] is False
        assert not slot.send(message)  # lost: nothing more is taken
    finally:
        slot.close()
        slot_end.close()
    assert not slot._sender.is_alive()  # the connection's owner joined its sender
    # Closing the connection failed the blocked send: that is the loss's consequence, not a
    # second loss (it raced the first reason to on_lost, and after another job had run in the
    # process it won, as "sending failed (Broken pipe)").
    assert len(lost) == 1


def test_a_send_stuck_in_the_socket_shows_as_a_stall_the_heartbeat_watch_can_see() -> None:
    driver_end, slot_end = tcp_pair()
    info = RegisterSlot(0, "127.0.0.1:1", "127.0.0.1", 1, None)
    slot = SlotConnection(info, FramedSocket(driver_end), lambda c, why: None)
    try:
        assert slot.stalled_for(time.monotonic()) == 0.0
        assert slot.send(Shutdown("x" * 4_000_000))
        deadline = time.monotonic() + 10
        while slot.stalled_for(time.monotonic()) == 0.0:  # the sender is inside sendall
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert slot.stalled_for(time.monotonic() + 60) > 59
    finally:
        slot.close()
        slot_end.close()
    assert not slot._sender.is_alive()
