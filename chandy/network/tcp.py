"""Channels between slots: the same ordered batch-and-event stream as in memory, over TCP.

Each slot runs one :class:`DataPlane`: a listening socket for its peers, and
one outgoing connection to every other slot, opened once when the slots start
and kept for the slot's life. A connection from slot A to slot B multiplexes
every channel whose producer is in A and consumer in B (Flink multiplexes per
TaskManager pair the same way): data frames flow A to B, credit frames B to A.

Flow control is credit based, exactly as in memory: the consumer's
:class:`RemoteInputChannel` announces ``capacity`` credits when it is created
and one more for every item its task takes (announced in small groups, and
always when its queue runs empty, so a sender never waits for a credit that is
only being held back); the producer's :class:`RemoteOutputChannel` sends only
with credit. Nothing queues without bound on either side.

Frames carry the channel's key: ``(generation, edge, producer subtask,
consumer subtask)``. The generation changes with every deployment of the job's
tasks, so frames of cancelled tasks can never reach their successors.
Items are pickled by the sending task and unpickled by the receiving task
(not the socket threads); every connection passed the job-secret handshake
before its first frame is read.
"""

from __future__ import annotations

import logging
import pickle
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chandy.network.auth import authenticate_client_side
from chandy.network.cancellation import TaskCancelledError
from chandy.network.channel import ChannelClosedError, InputChannel, OutputChannel
from chandy.network.framing import FramedSocket, accept_authenticated, close_listener
from chandy.network.wakeup import Wakeup

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">BIIII")  # kind, generation, edge, producer, consumer
_DATA = 1
_CREDIT = 2
_CREDIT_AMOUNT = struct.Struct(">I")


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
        self._credits = 0
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
        payload = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._connection.send_frame(payload, self._header)
        except OSError as exc:
            raise ChannelClosedError(f"channel {self.key}: {exc}") from None

    def close(self) -> None:
        self.closed = True
        if self._producer is not None:
            self._producer.signal()


class RemoteInputChannel(InputChannel):
    """The consumer's end of a channel from a task in another slot.

    The socket thread only queues raw frames; the task thread unpickles an item
    when it takes it, so decoding is paid where the item is used.
    """

    def __init__(self, key: ChannelKey, connection: FramedSocket, capacity: int) -> None:
        self.key = key
        self.capacity = capacity
        self._connection = connection
        self._credit_header = key.header(_CREDIT)
        self._queue: deque[bytes] = deque()
        self._consumer: Wakeup | None = None
        self._unannounced = 0
        self._announce_every = max(1, capacity // 2)
        self._last_size = 0
        self.max_backlog = 0

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

    def deliver(self, payload: bytes) -> None:
        """A data frame arrived (socket thread)."""
        self._queue.append(payload)
        self.max_backlog = max(self.max_backlog, len(self._queue))
        if self._consumer is not None:
            self._consumer.signal()

    def poll(self) -> Any:
        try:
            payload = self._queue.popleft()
        except IndexError:
            return None
        self._unannounced += 1
        if self._unannounced >= self._announce_every or not self._queue:
            self._announce(self._unannounced)
            self._unannounced = 0
        self._last_size = len(payload)
        return pickle.loads(payload)

    def backlog(self) -> int:
        return len(self._queue)

    def size_of(self, item: Any) -> int:
        return self._last_size  # the frame of the item just taken


class DataPlane:
    """One slot's connections to every other slot, and the channels multiplexed on them."""

    def __init__(self, slot_index: int, secret: bytes, bind_host: str) -> None:
        self.slot_index = slot_index
        self._secret = secret
        self._server = socket.create_server((bind_host, 0))
        self.address = f"{bind_host}:{self._server.getsockname()[1]}"
        self._outgoing: dict[int, FramedSocket] = {}  # consumer slot -> connection
        self._incoming: dict[int, FramedSocket] = {}  # producer slot -> connection
        self._inputs: dict[ChannelKey, RemoteInputChannel] = {}
        self._outputs: dict[ChannelKey, RemoteOutputChannel] = {}
        self._pending_credits: dict[ChannelKey, int] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._incoming_ready = threading.Condition(self._lock)
        self.on_peer_lost: Callable[[int, str], None] = lambda slot, why: None
        self._start(self._accept_loop, "chandy data accept")

    def _start(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- connections --------------------------------------------------------

    def connect_to_peers(
        self, addresses: dict[int, str], expected_incoming: int, timeout_s: float = 60.0
    ) -> None:
        """Connect to every other slot, and wait until every other slot connected here."""
        for slot, address in sorted(addresses.items()):
            if slot == self.slot_index:
                continue
            host, port = address.rsplit(":", 1)
            sock = socket.create_connection((host, int(port)), timeout=timeout_s)
            sock.settimeout(None)
            authenticate_client_side(sock, self._secret)
            connection = FramedSocket(sock)
            connection.send_frame(struct.pack(">I", self.slot_index))  # who we are
            with self._lock:
                self._outgoing[slot] = connection
            self._start(self._read_credits, f"chandy credits from slot {slot}", slot, connection)
        with self._incoming_ready:
            if not self._incoming_ready.wait_for(
                lambda: len(self._incoming) >= expected_incoming or self._closed, timeout_s
            ):
                raise ConnectionError(
                    f"slot {self.slot_index}: only {len(self._incoming)} of "
                    f"{expected_incoming} peers connected within {timeout_s} s"
                )

    def _accept_loop(self) -> None:
        for connection, _ in accept_authenticated(self._server, self._secret, "data", lambda: self._closed):
            try:
                (producer_slot,) = struct.unpack(">I", connection.recv_frame())
            except (OSError, struct.error):
                connection.close()
                continue
            with self._incoming_ready:
                self._incoming[producer_slot] = connection
                self._incoming_ready.notify_all()
            self._start(self._read_data, f"chandy data from slot {producer_slot}", producer_slot, connection)

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
        except (OSError, ConnectionError, struct.error) as exc:
            if not self._closed:
                self.on_peer_lost(producer_slot, f"data connection lost: {exc}")

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
            if not self._closed:
                self.on_peer_lost(consumer_slot, f"credit connection lost: {exc}")

    # -- channels -----------------------------------------------------------

    def output_channel(self, key: ChannelKey, consumer_slot: int) -> RemoteOutputChannel:
        with self._lock:
            channel = RemoteOutputChannel(key, self._outgoing[consumer_slot])
            self._outputs[key] = channel
            pending = self._pending_credits.pop(key, 0)
        if pending:
            channel.add_credit(pending)
        return channel

    def input_channel(self, key: ChannelKey, producer_slot: int, capacity: int) -> RemoteInputChannel:
        with self._lock:
            channel = RemoteInputChannel(key, self._incoming[producer_slot], capacity)
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
        for channel in outputs:
            channel.close()

    def close(self) -> None:
        """Close every socket and join every thread this data plane started."""
        self._closed = True
        with self._incoming_ready:
            self._incoming_ready.notify_all()
        close_listener(self._server)
        for connection in [*self._outgoing.values(), *self._incoming.values()]:
            connection.close()
        for channel in self._outputs.values():
            channel.close()
        for thread in self._threads:
            thread.join(5)
