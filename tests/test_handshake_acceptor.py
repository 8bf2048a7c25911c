"""Connections that say nothing do not block the ports between the driver and the slots.

Real sockets on loopback: silent peers connect and send nothing (or drip), while an
honest peer runs the secret handshake next to them.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from chandy.network.auth import NONCE_BYTES, AuthenticationError, authenticate_client_side, new_secret
from chandy.network.framing import AuthenticatingAcceptor, FramedSocket, close_listener
from chandy.network.tcp import DataPlane
from tests.channel_traffic import data_planes

#: Well under the handshake's deadline (10 s): an honest peer must not wait for a silent one's.
PROMPTLY_S = 5.0


def silent(address: tuple[str, int], count: int) -> list[socket.socket]:
    """``count`` connections that send nothing; each has read its nonce, so the server is
    running all their handshakes at once (a server that handshakes in its accept loop
    sends the second one nothing until the first timed out)."""
    peers = []
    for _ in range(count):
        sock = socket.create_connection(address, timeout=PROMPTLY_S)
        peers.append(sock)
        assert len(sock.recv(NONCE_BYTES, socket.MSG_WAITALL)) == NONCE_BYTES
    return peers


def still_open(sock: socket.socket) -> bool:
    """The server has not closed this connection (nothing to read, and no end of stream)."""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(timeout)


def closed_by_server(sock: socket.socket, timeout_s: float = PROMPTLY_S) -> bool:
    sock.settimeout(timeout_s)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True  # reset


class Server:
    """A listener on loopback and its acceptor, which hands authenticated peers to a queue."""

    def __init__(self, secret: bytes, max_pending: int = 16, timeout_s: float = 10.0) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.accepted: queue.Queue[FramedSocket] = queue.Queue()
        self.acceptor = AuthenticatingAcceptor(
            self.listener,
            secret,
            "test",
            lambda connection, _: self.accepted.put(connection),
            max_pending=max_pending,
            timeout_s=timeout_s,
        ).start()

    def close(self) -> None:
        self.acceptor.close()
        close_listener(self.listener)
        while not self.accepted.empty():
            self.accepted.get().close()


@pytest.fixture
def secret() -> bytes:
    return new_secret()


@pytest.fixture
def threads_before() -> Iterator[set[threading.Thread]]:
    before = set(threading.enumerate())
    yield before
    left = [t.name for t in threading.enumerate() if t not in before and t.name.startswith("chandy")]
    assert left == [], f"threads left running: {left}"


def honest_handshake(address: tuple[str, int], secret: bytes) -> float:
    """Seconds an honest client's handshake took."""
    started = time.monotonic()
    with socket.create_connection(address, timeout=PROMPTLY_S) as sock:
        authenticate_client_side(sock, secret)
    return time.monotonic() - started


def test_an_honest_peer_gets_through_while_silent_ones_are_open(
    secret: bytes, threads_before: set[threading.Thread]
) -> None:
    server = Server(secret)
    peers = silent(server.address, 8)
    try:
        assert honest_handshake(server.address, secret) < PROMPTLY_S
        connection = server.accepted.get(timeout=PROMPTLY_S)
        connection.close()
        assert all(still_open(p) for p in peers)  # their deadline has not passed: still pending
        assert server.acceptor.pending == 8
    finally:
        server.close()
        for p in peers:
            p.close()


def test_a_flood_of_silent_connections_holds_a_bounded_number_of_threads_and_sockets(
    secret: bytes, threads_before: set[threading.Thread]
) -> None:
    server = Server(secret, max_pending=4)
    peers: list[socket.socket] = []
    most_threads = 0
    try:
        for _ in range(60):
            peers.extend(silent(server.address, 1))
            handshakes = [t for t in threading.enumerate() if t.name.startswith("chandy test handshake")]
            most_threads = max(most_threads, len(handshakes))
            assert server.acceptor.pending <= 4
        assert most_threads <= 4
        # every one but the newest four was dropped: its socket is closed on the server side
        assert all(closed_by_server(p) for p in peers[:-4])
        assert all(still_open(p) for p in peers[-4:])
        assert honest_handshake(server.address, secret) < PROMPTLY_S
        server.accepted.get(timeout=PROMPTLY_S).close()
    finally:
        server.close()
        for p in peers:
            p.close()


def test_a_wrong_secret_still_fails_and_nothing_is_handed_on(
    secret: bytes, threads_before: set[threading.Thread], caplog: pytest.LogCaptureFixture
) -> None:
    server = Server(secret)
    try:
        with socket.create_connection(server.address, timeout=PROMPTLY_S) as sock:
            with pytest.raises(AuthenticationError):
                authenticate_client_side(sock, new_secret())
        assert server.accepted.empty()
        assert honest_handshake(server.address, secret) < PROMPTLY_S
        server.accepted.get(timeout=PROMPTLY_S).close()
        assert server.accepted.empty()  # the refused peer came first: it was never handed on
        assert "refused a test connection" in caplog.text
    finally:
        server.close()


def test_a_peer_dripping_bytes_fails_at_the_handshake_deadline_not_per_byte(
    secret: bytes, threads_before: set[threading.Thread]
) -> None:
    server = Server(secret, timeout_s=0.5)
    try:
        with socket.create_connection(server.address, timeout=PROMPTLY_S) as sock:
            assert len(sock.recv(NONCE_BYTES, socket.MSG_WAITALL)) == NONCE_BYTES
            started = time.monotonic()
            try:
                for _ in range(64):  # the whole reply, one byte per 0.1 s: 6.4 s if per byte
                    sock.sendall(b"x")
                    if not still_open(sock):
                        break
                    time.sleep(0.1)
            except OSError:
                pass  # reset by the server
            assert closed_by_server(sock)
            assert time.monotonic() - started < 3.0
    finally:
        server.close()


def test_closing_fails_pending_handshakes_and_joins_every_thread(
    secret: bytes, threads_before: set[threading.Thread]
) -> None:
    server = Server(secret)
    peers = silent(server.address, 5)
    started = time.monotonic()
    server.close()
    assert time.monotonic() - started < PROMPTLY_S  # not waiting out the handshakes' deadline
    try:
        assert all(closed_by_server(p) for p in peers)
    finally:
        for p in peers:
            p.close()


def test_a_slot_connects_to_a_data_port_held_by_silent_connections(
    threads_before: set[threading.Thread],
) -> None:
    """Two real data planes: slot 1 reaches slot 0 while silent connections hold slot 0's port."""
    with data_planes(new_secret()) as data:
        host, port = data[0].address.rsplit(":", 1)
        quiet = silent((host, int(port)), 6)
        try:
            assert_connect_promptly(data)
            assert all(still_open(p) for p in quiet)
        finally:
            for p in quiet:
                p.close()


def assert_connect_promptly(data: list[DataPlane]) -> None:
    errors: list[BaseException] = []

    def connect(plane: DataPlane) -> None:
        try:
            plane.connect_to_peers(PROMPTLY_S)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    connecting = [threading.Thread(target=connect, args=(plane,)) for plane in data]
    for thread in connecting:
        thread.start()
    for thread in connecting:
        thread.join(PROMPTLY_S + 5)
    assert errors == []
