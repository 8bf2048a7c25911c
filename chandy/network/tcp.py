"""Channels between slots: the same ordered batch-and-event stream as in memory, over TCP.

Each slot process runs one :class:`DataPlane`: it accepts its peers on the
listening socket its supervisor bound (so the address stays the same when the
process is replaced), and keeps one outgoing connection to every other slot. A
connection from slot A to slot B multiplexes every channel whose producer is in
A and consumer in B (Flink multiplexes per TaskManager pair the same way): data
frames flow A to B, credit frames B to A. When a slot process dies, its peers
see its connections close; its next incarnation connects to them, and they
connect back to it (see :class:`DataPlane`).

Flow control is credit based, exactly as in memory: the consumer's
:class:`RemoteInputChannel` announces ``capacity`` credits when it is created
and one more for every item its task takes (announced in small groups, and
always when its queue runs empty, so a sender never waits for a credit that is
only being held back); the producer's :class:`RemoteOutputChannel` sends only
with credit. Nothing queues without bound on either side.

A priority barrier (unaligned checkpoints) travels in a frame of its own kind, carrying
its position (the data frames sent on the channel before it) and the pickled barrier. It
needs no credit, and it is sent on the task thread like the channel's data frames, so on
the one connection it always follows them: when the receiver's socket thread queues it
(apart from the data, waking the task at once), every item it overtook is already queued.
An overdraft data frame (the partly filled batch a priority barrier or an event flushes, and
the event itself) is sent without credit: the producer's credit goes below zero, and its next
ordinary send waits until the consumer's takes bring it above zero again.

Frames carry the channel's key: ``(generation, edge, producer subtask,
consumer subtask)``. The generation changes with every deployment of the job's
tasks, so frames of cancelled tasks can never reach their successors.
Items are encoded by the sending task and decoded by the receiving task (not the socket
threads) with :mod:`chandy.network.item_codec`: Arrow record batches as Arrow IPC streams,
everything else pickled; every connection passed the job-secret handshake
before its first frame is read.
"""

from __future__ import annotations

import logging
import pickle
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chandy.network.auth import HANDSHAKE_TIMEOUT_S, authenticate_client_side
from chandy.network.cancellation import TaskCancelledError
from chandy.network.channel import (
    ChannelClosedError,
    InputChannel,
    OutputChannel,
    PriorityNotice,
    is_channel_state,
    overtaken_items,
)
from chandy.network.events import CheckpointBarrier, PriorityBarrier
from chandy.network.framing import AuthenticatingAcceptor, FramedSocket
from chandy.network.item_codec import decode_item, decode_received, encode_item, is_arrow_payload
from chandy.network.wakeup import Wakeup

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">BIIII")  # kind, generation, edge, producer, consumer
_DATA = 1
_CREDIT = 2
_PRIORITY = 3
_CREDIT_AMOUNT = struct.Struct(">I")
_POSITION = struct.Struct(">Q")  # a priority frame's position, before the pickled barrier
_HELLO = struct.Struct(">II")  # slot index, incarnation


@dataclass(frozen=True, slots=True)
class ChannelKey:
    generation: int
    edge_index: int
    producer_subtask: int
    consumer_subtask: int

    def header(self, kind: int) -> bytes:
        return _HEADER.pack(
            kind, self.generation, self.edge_index, self.producer_subtask, self.consumer_subtask
        )


class RemoteOutputChannel(OutputChannel):
    """The producer's end of a channel to a task in another slot."""

    def __init__(self, key: ChannelKey, connection: FramedSocket) -> None:
        self.key = key
        self._connection = connection
        self._header = key.header(_DATA)
        self._priority_header = key.header(_PRIORITY)
        self._credits = 0
        #: Data frames sent so far (the position of a priority barrier sent now).
        self.sent = 0
        self._lock = threading.Lock()
        self._producer: Wakeup | None = None
        self._should_abort: Callable[[], bool] = lambda: False
        self.closed = False

    def bind_producer(self, wakeup: Wakeup, should_abort: Callable[[], bool]) -> None:
        self._producer = wakeup
        self._should_abort = should_abort

    def add_credit(self, amount: int) -> None:
        """Credit arrived from the consumer (socket thread)."""
        with self._lock:
            self._credits += amount
        if self._producer is not None:
            self._producer.signal()

    def has_credit(self) -> bool:
        return self._credits > 0

    def send(self, item: Any) -> None:
        while True:
            with self._lock:
                if self._credits > 0:
                    self._credits -= 1
                    break
            if self.closed or self._connection.closed:
                raise ChannelClosedError(f"channel {self.key} lost its connection")
            if self._should_abort():
                raise TaskCancelledError()
            if self._producer is not None:
                self._producer.wait(0.05)
        self._write(encode_item(item), self._header)
        self.sent += 1

    def send_overdraft(self, item: Any) -> None:
        with self._lock:
            self._credits -= 1  # may go below zero: send() waits until it is positive again
        self._send_frame(encode_item(item), self._header)
        self.sent += 1

    def send_priority(self, barrier: CheckpointBarrier) -> None:
        # On the task thread, after every data frame of this channel went out: the frames
        # arrive in this order, so the receiver has queued what the barrier overtakes.
        payload = _POSITION.pack(self.sent) + pickle.dumps(barrier, protocol=pickle.HIGHEST_PROTOCOL)
        self._send_frame(payload, self._priority_header)

    def _send_frame(self, payload: bytes, header: bytes) -> None:
        """A frame sent without credit: nothing waited, so a closed channel is checked here."""
        if self.closed:
            raise ChannelClosedError(f"channel {self.key} was closed")
        self._write(payload, header)

    def _write(self, payload: bytes, header: bytes) -> None:
        try:
            self._connection.send_frame(payload, header)
        except OSError as exc:
            raise ChannelClosedError(f"channel {self.key}: {exc}") from None

    def close(self) -> None:
        self.closed = True
        if self._producer is not None:
            self._producer.signal()


class RemoteInputChannel(InputChannel):
    """The consumer's end of a channel from a task in another slot.

    The socket thread only queues raw frames; the task thread decodes an item
    when it takes it, so decoding is paid where the item is used.
    """

    def __init__(self, key: ChannelKey, connection: FramedSocket, capacity: int) -> None:
        self.key = key
        self.capacity = capacity
        self._connection = connection
        self._credit_header = key.header(_CREDIT)
        self._queue: deque[bytes] = deque()
        self._priority: deque[tuple[int, bytes]] = deque()
        self._consumer: Wakeup | None = None
        self._notice = PriorityNotice()
        self._unannounced = 0
        self._announce_every = max(1, capacity // 2)
        self._last_frame = b""
        self.max_backlog = 0
        self.taken = 0

    def start(self) -> None:
        """Grant the initial credits (after the channel is registered for its frames)."""
        self._announce(self.capacity)

    def _announce(self, amount: int) -> None:
        try:
            self._connection.send_frame(_CREDIT_AMOUNT.pack(amount), self._credit_header)
        except OSError:
            pass  # the connection is gone; the job is failing over

    def bind_consumer(self, wakeup: Wakeup) -> None:
        self._consumer = wakeup

    def bind_priority(self, notice: PriorityNotice) -> None:
        self._notice = notice
        if self._priority:  # it came before the gate: the sender read the old notice
            notice.pending = True

    def deliver(self, payload: bytes) -> None:
        """A data frame arrived (socket thread)."""
        self._queue.append(payload)
        self.max_backlog = max(self.max_backlog, len(self._queue))
        if self._consumer is not None:
            self._consumer.signal()

    def deliver_priority(self, position: int, payload: bytes) -> None:
        """A priority frame arrived (socket thread), after every data frame sent before it."""
        self._priority.append((position, payload))
        self._notice.pending = True
        if self._consumer is not None:
            self._consumer.signal()

    def poll(self) -> Any:
        try:
            payload = self._queue.popleft()
        except IndexError:
            return None
        self.taken += 1
        self._unannounced += 1
        if self._unannounced >= self._announce_every or not self._queue:
            self._announce(self._unannounced)
            self._unannounced = 0
        self._last_frame = payload
        return decode_received(payload)

    def poll_priority(self) -> PriorityBarrier | None:
        try:
            position, payload = self._priority.popleft()
        except IndexError:
            return None
        return PriorityBarrier(pickle.loads(payload), position)

    def in_flight_before(self, position: int) -> list[bytes]:
        frames = overtaken_items(self._queue, self.taken, position, self.key)
        # Events are told from batches by decoding them: paid only for what a barrier
        # overtook, at most the channel's credit and one overdraft.
        return [frame for frame in frames if is_arrow_payload(frame) or is_channel_state(decode_item(frame))]

    def serialized(self, item: Any) -> bytes:
        return self._last_frame  # the frame of the item just taken

    def backlog(self) -> int:
        return len(self._queue)

    def size_of(self, item: Any) -> int:
        return len(self._last_frame)  # the frame of the item just taken


def _deliver(channel: RemoteInputChannel, kind: int, frame: bytes) -> None:
    """Hand a data or priority frame (header included) to its input channel."""
    header_size = _HEADER.size
    if kind == _DATA:
        channel.deliver(frame[header_size:])
    elif kind == _PRIORITY:
        (position,) = _POSITION.unpack_from(frame, header_size)
        channel.deliver_priority(position, frame[header_size + _POSITION.size :])


def bind_data_listener(host: str) -> tuple[socket.socket, str]:
    """A listening socket for a slot's data port, and its ``host:port``.

    The Spark task (the slot's supervisor) binds it once and its slot processes inherit
    it: every incarnation of the slot listens at the address the others learnt when the
    stage started, and connections made while one incarnation is being replaced wait in
    the backlog for the next.
    """
    server = socket.create_server((host, 0))
    return server, f"{host}:{server.getsockname()[1]}"


@dataclass
class _Link:
    """A connection to or from one peer slot, and which incarnation of it is at the other end."""

    connection: FramedSocket
    incarnation: int

    @property
    def usable(self) -> bool:
        return not self.connection.closed


class DataPlane:
    """One slot process's connections to every other slot, and the channels multiplexed on them.

    A slot process can die and come back (its supervisor forks the next *incarnation*,
    which listens on the same inherited socket). Every connection therefore opens with a
    hello in both directions, ``(slot, incarnation)``: a slot that hears from a newer
    incarnation of a peer than its own outgoing connection reaches connects to it again,
    and channels are only ever opened on connections to a peer's newest incarnation.
    """

    def __init__(
        self,
        slot_index: int,
        secret: bytes,
        listener: socket.socket,
        address: str,
        peers: dict[int, str],
        incarnation: int = 0,
        connect_timeout_s: float = 60.0,
    ) -> None:
        self.slot_index = slot_index
        self.incarnation = incarnation
        self.address = address
        self._secret = secret
        self._server = listener
        self._peers = {slot: a for slot, a in peers.items() if slot != slot_index}
        self._connect_timeout_s = connect_timeout_s
        self._outgoing: dict[int, _Link] = {}  # consumer slot -> connection
        self._incoming: dict[int, _Link] = {}  # producer slot -> connection
        self._known: dict[int, int] = {}  # the newest incarnation heard of, per peer
        self._connecting = {slot: threading.Lock() for slot in self._peers}
        self._inputs: dict[ChannelKey, RemoteInputChannel] = {}
        self._outputs: dict[ChannelKey, RemoteOutputChannel] = {}
        self._pending_credits: dict[ChannelKey, int] = {}
        self._early: dict[ChannelKey, list[tuple[int, bytes]]] = {}  # frames before their channel
        self._released_generation = -1
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        #: Accepted connections whose hello has not come yet.
        self._greeting: set[FramedSocket] = set()
        self._closed = False
        self.on_peer_lost: Callable[[int, str], None] = lambda slot, why: None
        self._acceptor = AuthenticatingAcceptor(listener, secret, "data", self._accepted).start()

    def _start(self, target: Callable[..., None], name: str, *args: Any) -> None:
        """Start a thread this data plane owns; finished ones are joined and dropped."""
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            # Started under the lock: connections are handed on from several handshake
            # threads at once, and a thread not yet started is not alive, so another call
            # would drop it from the list (and close() would join it before it started).
            self._threads = [t for t in self._threads if t.is_alive()]
            thread.start()
            self._threads.append(thread)

    # -- connections --------------------------------------------------------

    def connect_to_peers(self, timeout_s: float | None = None) -> None:
        """Connect to every other slot, and wait until every other slot connected here."""
        timeout_s = self._connect_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        for slot in sorted(self._peers):
            while True:
                try:
                    self._ensure_outgoing(slot, 0)
                    break
                except (OSError, ConnectionError):
                    # That slot's process is being replaced (or its port is gone with its
                    # supervisor, and Spark is failing the stage): try again until the deadline.
                    if self._closed or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        with self._changed:
            if not self._changed.wait_for(
                lambda: all(self._current(self._incoming, s) for s in self._peers) or self._closed, timeout_s
            ):
                missing = [s for s in self._peers if not self._current(self._incoming, s)]
                raise ConnectionError(
                    f"slot {self.slot_index}: slots {missing} did not connect within {timeout_s} s"
                )

    def _current(self, links: dict[int, _Link], slot: int) -> _Link | None:
        """The link to ``slot`` if it is open and reaches its newest known incarnation (lock held)."""
        link = links.get(slot)
        if link is None or not link.usable or link.incarnation < self._known.get(slot, 0):
            return None
        return link

    def _ensure_outgoing(self, slot: int, incarnation: int) -> None:
        """Connect to ``slot`` unless an open connection reaches ``incarnation`` or a newer one."""
        with self._connecting[slot]:
            with self._lock:
                link = self._outgoing.get(slot)
                if self._closed or (link is not None and link.usable and link.incarnation >= incarnation):
                    return
            host, port = self._peers[slot].rsplit(":", 1)
            sock = socket.create_connection((host, int(port)), timeout=self._connect_timeout_s)
            try:
                authenticate_client_side(sock, self._secret)
                connection = FramedSocket(sock)
                connection.send_frame(_HELLO.pack(self.slot_index, self.incarnation))
                peer, peer_incarnation = _HELLO.unpack(connection.recv_frame())
            except (OSError, struct.error):
                sock.close()
                raise
            sock.settimeout(None)
            if peer != slot:
                connection.close()
                raise ConnectionError(f"slot {self.slot_index}: {self._peers[slot]} answered as slot {peer}")
            with self._changed:
                old = self._outgoing.get(slot)
                self._outgoing[slot] = _Link(connection, peer_incarnation)
                self._known[slot] = max(self._known.get(slot, 0), peer_incarnation)
                self._changed.notify_all()
            if old is not None:
                old.connection.close()
        self._start(self._read_credits, f"chandy credits from slot {slot}", slot, connection)

    def _reconnect(self, slot: int, incarnation: int) -> None:
        try:
            self._ensure_outgoing(slot, incarnation)
        except (OSError, ConnectionError) as exc:  # that incarnation died too; its successor calls again
            if not self._closed:
                log.info("slot %d: could not reach slot %d again: %s", self.slot_index, slot, exc)

    def _accepted(self, connection: FramedSocket, peer: Any) -> None:
        """A peer passed the handshake (on the acceptor's handshake thread): its hello is read
        on a thread of its own, which then reads its frames."""
        self._start(self._serve_incoming, f"chandy data from {peer[0]}:{peer[1]}", connection)

    def _serve_incoming(self, connection: FramedSocket) -> None:
        with self._lock:
            if self._closed:
                connection.close()
                return
            self._greeting.add(connection)  # close() closes it, not waiting out the hello
        try:
            connection.sock.settimeout(HANDSHAKE_TIMEOUT_S)
            producer_slot, incarnation = _HELLO.unpack(connection.recv_frame())
            connection.send_frame(_HELLO.pack(self.slot_index, self.incarnation))
            connection.sock.settimeout(None)
        except (OSError, struct.error):
            connection.close()
            return
        finally:
            with self._lock:
                self._greeting.discard(connection)
        if producer_slot not in self._peers:
            log.warning("slot %d: refused a data connection claiming slot %d", self.slot_index, producer_slot)
            connection.close()
            return
        with self._changed:
            old = self._incoming.get(producer_slot)
            if self._closed or (old is not None and old.usable and old.incarnation > incarnation):
                # Hellos are read concurrently: a dead incarnation's may come after its successor's.
                connection.close()
                return
            self._incoming[producer_slot] = _Link(connection, incarnation)
            self._known[producer_slot] = max(self._known.get(producer_slot, 0), incarnation)
            outgoing = self._outgoing.get(producer_slot)
            stale = outgoing is None or not outgoing.usable or outgoing.incarnation < incarnation
            self._changed.notify_all()
        if old is not None:
            old.connection.close()
        if stale and outgoing is not None:
            # A new incarnation of that slot: it needs a connection from us too.
            self._start(
                self._reconnect, f"chandy reconnect to slot {producer_slot}", producer_slot, incarnation
            )
        self._read_data(producer_slot, connection)

    def _read_data(self, producer_slot: int, connection: FramedSocket) -> None:
        header_size = _HEADER.size
        try:
            while True:
                frame = connection.recv_frame()
                kind, *key_fields = _HEADER.unpack_from(frame)
                key = ChannelKey(*key_fields)
                channel = self._inputs.get(key)
                if kind == _DATA and channel is not None:
                    channel.deliver(frame[header_size:])
                elif channel is not None:
                    _deliver(channel, kind, frame)
                elif kind != _CREDIT:
                    self._keep_early(key, kind, frame)
        except (OSError, ConnectionError, struct.error) as exc:
            self._lost(self._incoming, producer_slot, connection, f"data connection lost: {exc}")

    def _keep_early(self, key: ChannelKey, kind: int, frame: bytes) -> None:
        """A frame for a channel not open here (yet). Only frames sent without credit can come
        before the consumer opened its channel (an overdraft, a priority barrier, when the
        producer was deployed first): they wait for :meth:`input_channel`. Frames of a released
        generation are dropped (its tasks are gone)."""
        with self._lock:
            channel = self._inputs.get(key)  # opened meanwhile: it took what waited, deliver
            if channel is None:
                if key.generation > self._released_generation:
                    self._early.setdefault(key, []).append((kind, frame))
                return
        _deliver(channel, kind, frame)

    def _read_credits(self, consumer_slot: int, connection: FramedSocket) -> None:
        header_size = _HEADER.size
        try:
            while True:
                frame = connection.recv_frame()
                kind, *key_fields = _HEADER.unpack_from(frame)
                if kind != _CREDIT:
                    continue
                key = ChannelKey(*key_fields)
                (amount,) = _CREDIT_AMOUNT.unpack_from(frame, header_size)
                with self._lock:
                    channel = self._outputs.get(key)
                    if channel is None:  # credits can overtake the producer's deployment
                        self._pending_credits[key] = self._pending_credits.get(key, 0) + amount
                        continue
                channel.add_credit(amount)
        except (OSError, ConnectionError, struct.error) as exc:
            self._lost(self._outgoing, consumer_slot, connection, f"credit connection lost: {exc}")

    def _lost(self, links: dict[int, _Link], slot: int, connection: FramedSocket, reason: str) -> None:
        connection.close()
        with self._lock:
            link = links.get(slot)
            current = link is not None and link.connection is connection
        if current and not self._closed:
            self.on_peer_lost(slot, reason)

    # -- channels -----------------------------------------------------------

    def _wait_link(self, links: dict[int, _Link], slot: int, timeout_s: float) -> _Link:
        """The connection to ``slot``'s newest incarnation (lock held); waits while it is
        being replaced, and raises :class:`ChannelClosedError` if it does not come."""
        self._changed.wait_for(lambda: self._closed or self._current(links, slot) is not None, timeout_s)
        link = None if self._closed else self._current(links, slot)
        if link is None:
            raise ChannelClosedError(
                f"slot {self.slot_index} has no connection to slot {slot} "
                f"(incarnation {self._known.get(slot, 0)}) after {timeout_s} s"
            )
        return link

    def output_channel(
        self, key: ChannelKey, consumer_slot: int, timeout_s: float = 10.0
    ) -> RemoteOutputChannel:
        with self._changed:
            link = self._wait_link(self._outgoing, consumer_slot, timeout_s)
            channel = RemoteOutputChannel(key, link.connection)
            self._outputs[key] = channel
            pending = self._pending_credits.pop(key, 0)
        if pending:
            channel.add_credit(pending)
        return channel

    def input_channel(
        self, key: ChannelKey, producer_slot: int, capacity: int, timeout_s: float = 10.0
    ) -> RemoteInputChannel:
        with self._changed:
            link = self._wait_link(self._incoming, producer_slot, timeout_s)
            channel = RemoteInputChannel(key, link.connection, capacity)
            for kind, frame in self._early.pop(key, ()):
                _deliver(channel, kind, frame)  # before the reader can deliver a later frame
            self._inputs[key] = channel
        channel.start()
        return channel

    def release_generation(self, generation: int) -> None:
        """Forget the channels of a cancelled deployment; wake blocked senders."""
        with self._lock:
            outputs = [c for k, c in self._outputs.items() if k.generation == generation]
            self._outputs = {k: c for k, c in self._outputs.items() if k.generation != generation}
            self._inputs = {k: c for k, c in self._inputs.items() if k.generation != generation}
            self._pending_credits = {
                k: v for k, v in self._pending_credits.items() if k.generation > generation
            }
            self._early = {k: v for k, v in self._early.items() if k.generation > generation}
            self._released_generation = max(self._released_generation, generation)
        for channel in outputs:
            channel.close()

    def close(self) -> None:
        """Close every connection and join every thread this data plane started. The
        listener is left open: it belongs to the slot's supervisor."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._acceptor.close()  # joined: no connection is handed on after this
        with self._changed:
            links = [*self._outgoing.values(), *self._incoming.values()]
            greeting = list(self._greeting)
            outputs = list(self._outputs.values())
            threads = list(self._threads)
        for connection in [*(link.connection for link in links), *greeting]:
            connection.close()
        for channel in outputs:
            channel.close()
        for thread in threads:
            thread.join(5)
