"""Length-prefixed frames over a socket that already passed the secret handshake.

Plain blocking sockets with one ``sendall`` per frame: measured on loopback here
at 2-3 GB/s, several times what asyncio streams manage, and the reader is one
thread per connection whose owner closes it.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from chandy.network.auth import (
    HANDSHAKE_TIMEOUT_S,
    AuthenticationError,
    authenticate_server_side,
    recv_exactly,
)

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
#: Frames larger than this are refused: a corrupt length must not allocate gigabytes.
MAX_FRAME_BYTES = 1 << 30


#: Handshakes one listener runs at once. A job's slots connect a few times each (once per
#: incarnation, to the driver and to every peer), and an honest handshake takes one round
#: trip, so this many only pile up when something connects and stays silent.
MAX_PENDING_HANDSHAKES = 16


class AuthenticatingAcceptor:
    """Accepts connections on a listener and runs each one's secret handshake on a thread
    of its own, handing the peers that passed to ``on_connection``; every other peer is
    disconnected and logged.

    The accepting thread never reads from a peer: a connection that sends nothing (or
    drips) cannot keep the next peer waiting for its nonce. Each handshake has its own
    deadline (``timeout_s`` for the whole exchange), and at most ``max_pending`` run at
    once: beyond that the *oldest* pending handshake is dropped, since an honest peer
    completes in one round trip and only a silent one lingers. So a flood of silent
    connections holds at most ``max_pending`` threads and sockets, and an honest peer
    still gets through.

    ``on_connection`` runs on the handshake's thread and should only hand the connection
    on (start its reader); it owns the connection from then on. The listener belongs to
    the caller: :meth:`close` does not close it (a slot's data port is shared with its
    supervisor, and shutting it down would close it for every process holding it); a
    pipe wakes the accepting thread instead.

    Threads: the acceptor and the handshakes in progress, all joined by :meth:`close`.
    """

    def __init__(
        self,
        server: socket.socket,
        secret: bytes,
        what: str,
        on_connection: Callable[[FramedSocket, Any], None],
        max_pending: int = MAX_PENDING_HANDSHAKES,
        timeout_s: float = HANDSHAKE_TIMEOUT_S,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self._server = server
        self._secret = secret
        self._what = what
        self._on_connection = on_connection
        self._max_pending = max_pending
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        #: Pending handshakes, oldest first: each socket and the thread authenticating it.
        self._pending: dict[socket.socket, threading.Thread] = {}
        #: Every handshake thread not yet ended, also those handing a connection on (no
        #: longer pending): close() joins them all.
        self._running: set[threading.Thread] = set()
        self._dropped: set[socket.socket] = set()
        self._drops = 0
        self._closed = False
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._accept_loop, name=f"chandy {what} accept", daemon=True)

    def start(self) -> AuthenticatingAcceptor:
        self._thread.start()
        return self

    @property
    def pending(self) -> int:
        """Handshakes in progress now."""
        with self._lock:
            return len(self._pending)

    def _accept_loop(self) -> None:
        server = self._server.fileno()
        while True:
            try:
                readable, _, _ = select.select([server, self._stop_read], [], [])
            except (OSError, ValueError):
                return  # the listener was closed under us
            if self._stop_read in readable:
                return
            try:
                sock, peer = self._server.accept()
            except BlockingIOError:
                continue  # another process holding the listener took the connection
            except OSError:
                return
            with self._changed:
                if self._closed:
                    sock.close()
                    return
                if len(self._running) >= self._max_pending:
                    if self._pending:
                        self._drop_oldest()
                    # threads, not only pending handshakes: one that passed may still be
                    # handing its connection on, and the bound is on threads and sockets
                    self._changed.wait_for(lambda: len(self._running) < self._max_pending or self._closed)
                    if self._closed:
                        sock.close()
                        return
                thread = threading.Thread(
                    target=self._handshake,
                    args=(sock, peer),
                    name=f"chandy {self._what} handshake {peer[0]}:{peer[1]}",
                    daemon=True,
                )
                self._pending[sock] = thread
                self._running.add(thread)
            thread.start()

    def _drop_oldest(self) -> None:
        """Make the oldest pending handshake fail now (lock held): shut its socket down, so
        that its thread's ``recv`` returns; that thread closes it."""
        oldest = next(iter(self._pending))
        self._dropped.add(oldest)
        self._drops += 1
        if self._drops == 1 or self._drops % 100 == 0:
            log.warning(
                "%d %s connections dropped before their handshake ended: more than %d were "
                "pending at once (connections that send nothing?)",
                self._drops,
                self._what,
                self._max_pending,
            )
        try:
            oldest.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _handshake(self, sock: socket.socket, peer: Any) -> None:
        try:
            self._authenticate_and_hand_on(sock, peer)
        finally:
            with self._changed:
                self._running.discard(threading.current_thread())
                self._changed.notify_all()

    def _authenticate_and_hand_on(self, sock: socket.socket, peer: Any) -> None:
        try:
            authenticate_server_side(sock, self._secret, self._timeout_s)
            failure: str | None = None
        except AuthenticationError as exc:
            failure = str(exc)
        with self._changed:
            del self._pending[sock]
            dropped = sock in self._dropped
            self._dropped.discard(sock)
            closed = self._closed
            self._changed.notify_all()
        if failure is not None or dropped or closed:
            if failure is not None and not dropped and not closed:
                log.warning("refused a %s connection from %s:%s: %s", self._what, peer[0], peer[1], failure)
            sock.close()
            return
        connection = FramedSocket(sock)
        try:
            self._on_connection(connection, peer)
        except Exception:
            log.exception("handing on a %s connection from %s:%s failed", self._what, peer[0], peer[1])
            connection.close()

    def close(self) -> None:
        """Stop accepting, fail the pending handshakes, and join every thread; the listener
        stays open (it belongs to the caller). A handshake that already ended has handed its
        connection on before this returns."""
        with self._changed:
            if self._closed:
                return
            self._closed = True
            for sock in self._pending:
                self._dropped.add(sock)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._changed.notify_all()
        os.write(self._stop_write, b"x")
        if self._thread.ident is not None:
            self._thread.join()
        with self._changed:
            # the pending ones, and those that passed and are handing their connection on
            running = set(self._running)
        for thread in running:
            if thread.ident is not None:
                thread.join()
        os.close(self._stop_read)
        os.close(self._stop_write)


def close_listener(server: socket.socket) -> None:
    """Close a listening socket so that a thread blocked in ``accept()`` returns
    (on Linux, ``close()`` alone leaves it blocked)."""
    try:
        server.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    server.close()


class FramedSocket:
    """Frames in and out of one authenticated socket. Sending is thread-safe;
    receiving belongs to one reader thread."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._send_lock = threading.Lock()
        self.closed = False

    def send_frame(self, payload: bytes | memoryview, header: bytes = b"") -> None:
        frame = _LENGTH.pack(len(header) + len(payload)) + header
        with self._send_lock:
            self.sock.sendall(frame + payload if len(payload) < 65536 else frame)
            if len(payload) >= 65536:
                self.sock.sendall(payload)

    def recv_frame(self) -> bytes:
        (length,) = _LENGTH.unpack(recv_exactly(self.sock, _LENGTH.size))
        if length > MAX_FRAME_BYTES:
            raise ConnectionError(f"frame of {length} bytes refused")
        return recv_exactly(self.sock, length)

    def send_message(self, message: Any) -> None:
        """A control message (a dataclass), cloudpickled: it may carry user functions and
        exceptions of user-defined classes. Only ever read by an authenticated peer."""
        from chandy.util.code_pickling import dumps

        self.send_frame(dumps(message))

    def recv_message(self) -> Any:
        return pickle.loads(self.recv_frame())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
