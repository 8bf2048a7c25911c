"""Channels: one producer subtask to one consumer subtask, bounded by credits.

The receiver grants ``capacity`` credits, one per batch it is willing to hold;
a sender without credit blocks until the receiver takes a batch (Flink's
credit-based flow control). A slow consumer therefore stops its producers and
nothing queues without bound. An in-memory channel hands over references; a
TCP channel (``chandy.network.tcp``, used between Spark slots) serializes the
same items and sends credits back over the socket. Both present the same two
faces: :class:`OutputChannel` to the writer, :class:`InputChannel` to the gate.

The in-memory channel is lock-free: exactly one thread appends and one thread
pops, and ``collections.deque`` appends and pops are atomic.

Beside that in-band order a channel carries *priority* barriers (unaligned checkpoints,
Flink's priority events): they wait for no credit and reach the consumer ahead of the
queued items, as a :class:`~chandy.network.events.PriorityBarrier` whose ``position``
says where they belong in the in-band order. Both ends count in-band items for that: the
producer the items it sent (``sent``), the consumer the items it took (``taken``), so the
items a barrier overtook are exactly those numbered ``taken + 1 .. position``, still in
the consumer's queue (:meth:`InputChannel.in_flight_before`).
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

from chandy.network.cancellation import TaskCancelledError
from chandy.network.events import CheckpointBarrier, PriorityBarrier, RuntimeEvent, Watermark, WatermarkStatus
from chandy.network.item_codec import RecordNotPicklableError, encode_item, encoded_size
from chandy.network.wakeup import Wakeup


class ChannelClosedError(RuntimeError):
    """The other side of the channel is gone (its task was cancelled or failed)."""


class OutputChannel(ABC):
    """The sending face of a channel."""

    @abstractmethod
    def bind_producer(self, wakeup: Wakeup, should_abort: Callable[[], bool]) -> None:
        """Who to wake when credit returns, and how to tell that waiting is pointless."""

    @abstractmethod
    def has_credit(self) -> bool: ...

    @abstractmethod
    def send(self, item: Any) -> None:
        """Append ``item`` (a record batch or an event); blocks while there is no credit."""

    @abstractmethod
    def send_overdraft(self, item: Any) -> None:
        """Append ``item`` in-band even without credit (Flink's overdraft buffer).

        A barrier's producer flushes its partly filled batches this way before
        :meth:`send_priority`, so it never holds data the barrier overtakes. The channel
        then holds one item beyond its credit; the next :meth:`send` waits until the
        consumer took enough for a credit again.
        """

    @abstractmethod
    def send_priority(self, barrier: CheckpointBarrier) -> None:
        """Send ``barrier`` ahead of the queued items, without waiting for credit.

        The consumer's :meth:`InputChannel.poll_priority` returns it as a
        :class:`PriorityBarrier` whose ``position`` is the number of in-band items sent
        on this channel before it.
        """


class PriorityNotice:
    """A flag shared by every channel of one input gate: some channel holds a priority barrier.

    A channel sets it (after queueing the barrier) and then signals the consumer's wakeup;
    the gate clears it before it looks at the channels, so a barrier arriving during the
    look sets it again and is never missed. Reading it is one attribute read, cheap enough
    for the task to ask between any two items.
    """

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = False


def is_channel_state(item: Any) -> bool:
    """Whether ``item`` belongs in a checkpoint's in-flight data: record batches (lists, columns or
    Arrow record batches), watermarks
    and watermark statuses do; barriers, cancel markers, end-of-data and end-of-partition do not (they
    are control flow, decided again after a restore)."""
    return not isinstance(item, RuntimeEvent) or type(item) in (Watermark, WatermarkStatus)


class InputChannel(ABC):
    """The receiving face of a channel.

    ``taken`` counts the in-band items :meth:`poll` returned so far: a
    :class:`PriorityBarrier` at ``position`` overtook the items ``taken + 1 .. position``.
    """

    taken: int = 0

    @abstractmethod
    def bind_consumer(self, wakeup: Wakeup) -> None:
        """Who to wake when an item arrives."""

    def bind_priority(self, notice: PriorityNotice) -> None:
        """The gate's shared notice, set when a priority barrier arrives. A channel that
        never carries priority barriers may ignore it (the default)."""

    @abstractmethod
    def poll(self) -> Any:
        """The next item, or ``None`` if nothing has arrived."""

    def poll_priority(self) -> PriorityBarrier | None:
        """The next priority barrier that arrived, or ``None`` (the default: a channel
        without priority barriers)."""
        return None

    @abstractmethod
    def in_flight_before(self, position: int) -> list[bytes]:
        """The in-band items numbered ``taken + 1 .. position`` that are channel state
        (:func:`is_channel_state`), serialized, in order, without taking them: the data a
        priority barrier at ``position`` overtook."""

    def serialized(self, item: Any) -> bytes:
        """``item``, the item :meth:`poll` just returned, as bytes (as it crossed, or would
        have crossed, a TCP channel)."""
        return encode_item(item)

    @abstractmethod
    def backlog(self) -> int:
        """Items received and not yet taken."""

    @abstractmethod
    def size_of(self, item: Any) -> int:
        """Bytes ``item`` took (or would take) on the wire; asked only during alignment."""


class _NoWakeup(Wakeup):
    def signal(self) -> None:
        pass


_NO_WAKEUP = _NoWakeup()


def overtaken_items(queue: deque[Any], taken: int, position: int, channel: object) -> list[Any]:
    """The items of ``queue`` numbered ``taken + 1 .. position`` (its first ones), copied while
    the producer's side may append on the right.

    Iterating a deque that grows raises :class:`RuntimeError`; its items on the left do not
    change (only the caller's thread pops), so copying again gives the same answer. They
    are all there: a priority barrier is queued after everything sent before it.
    """
    overtaken = position - taken
    if overtaken <= 0:
        return []
    while True:
        try:
            items = list(itertools.islice(queue, overtaken))
            break
        except RuntimeError:
            continue
    if len(items) < overtaken:
        raise RuntimeError(
            f"channel {channel}: a barrier at position {position} overtook {overtaken} items "
            f"but only {len(items)} are queued"
        )
    return items


class LocalChannel(OutputChannel, InputChannel):
    """An in-memory channel between two tasks in one process."""

    __slots__ = (
        "name",
        "capacity",
        "_queue",
        "_priority",
        "_consumer",
        "_producer",
        "_notice",
        "_should_abort",
        "max_backlog",
        "closed",
        "sent",
        "taken",
    )

    def __init__(self, capacity: int, name: str = "") -> None:
        if capacity < 1:
            raise ValueError("a channel needs at least one credit")
        self.name = name
        self.capacity = capacity
        self._queue: deque[Any] = deque()
        self._priority: deque[PriorityBarrier] = deque()
        self._consumer: Wakeup = _NO_WAKEUP
        self._producer: Wakeup = _NO_WAKEUP
        self._notice = PriorityNotice()
        self._should_abort: Callable[[], bool] = lambda: False
        #: The most items ever queued at once: never above ``capacity`` but for overdrafts.
        self.max_backlog = 0
        self.closed = False
        #: In-band items sent (producer thread) and taken (consumer thread) so far.
        self.sent = 0
        self.taken = 0

    def bind_producer(self, wakeup: Wakeup, should_abort: Callable[[], bool]) -> None:
        self._producer = wakeup
        self._should_abort = should_abort

    def bind_consumer(self, wakeup: Wakeup) -> None:
        self._consumer = wakeup

    def bind_priority(self, notice: PriorityNotice) -> None:
        self._notice = notice
        if self._priority:  # it came before the gate: the sender read the old notice
            notice.pending = True

    def has_credit(self) -> bool:
        return len(self._queue) < self.capacity

    def send(self, item: Any) -> None:
        queue = self._queue
        while len(queue) >= self.capacity:
            if self.closed:
                raise ChannelClosedError(f"channel {self.name} was closed by its consumer")
            if self._should_abort():
                raise TaskCancelledError()
            self._producer.wait(0.05)
        queue.append(item)
        self.sent += 1
        n = len(queue)
        # Not max(): a builtin call costs more than the counter above, on every batch.
        if n > self.max_backlog:  # noqa: PLR1730
            self.max_backlog = n
        self._consumer.signal()

    def send_overdraft(self, item: Any) -> None:
        queue = self._queue
        queue.append(item)
        self.sent += 1
        self.max_backlog = max(self.max_backlog, len(queue))
        self._consumer.signal()

    def send_priority(self, barrier: CheckpointBarrier) -> None:
        # Queued before the notice is set: a consumer that sees the notice finds the barrier,
        # and every item it overtook is already in the queue (appended before, same thread).
        self._priority.append(PriorityBarrier(barrier, self.sent))
        self._notice.pending = True
        self._consumer.signal()

    def poll(self) -> Any:
        queue = self._queue
        try:
            item = queue.popleft()
        except IndexError:
            return None
        self.taken += 1
        if len(queue) == self.capacity - 1:
            self._producer.signal()
        return item

    def poll_priority(self) -> PriorityBarrier | None:
        try:
            return self._priority.popleft()
        except IndexError:
            return None

    def in_flight_before(self, position: int) -> list[bytes]:
        items = overtaken_items(self._queue, self.taken, position, self.name)
        return [encode_item(item) for item in items if is_channel_state(item)]

    def backlog(self) -> int:
        return len(self._queue)

    def size_of(self, item: Any) -> int:
        # In memory nothing was serialized; measure what a TCP channel would have sent.
        try:
            return encoded_size(item)
        except RecordNotPicklableError:
            # Records that stay in this process need not pickle (the local executor runs
            # such jobs); measuring them for the alignment statistics must not fail them.
            return 0

    def close(self) -> None:
        """The consumer is gone: wake a blocked producer so it fails instead of hanging."""
        self.closed = True
        self._producer.signal()
