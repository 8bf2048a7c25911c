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
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

from chandy.network.cancellation import TaskCancelledError
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


class InputChannel(ABC):
    """The receiving face of a channel."""

    @abstractmethod
    def bind_consumer(self, wakeup: Wakeup) -> None:
        """Who to wake when an item arrives."""

    @abstractmethod
    def poll(self) -> Any:
        """The next item, or ``None`` if nothing has arrived."""

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


class LocalChannel(OutputChannel, InputChannel):
    """An in-memory channel between two tasks in one process."""

    __slots__ = (
        "name",
        "capacity",
        "_queue",
        "_consumer",
        "_producer",
        "_should_abort",
        "max_backlog",
        "closed",
    )

    def __init__(self, capacity: int, name: str = "") -> None:
        if capacity < 1:
            raise ValueError("a channel needs at least one credit")
        self.name = name
        self.capacity = capacity
        self._queue: deque[Any] = deque()
        self._consumer: Wakeup = _NO_WAKEUP
        self._producer: Wakeup = _NO_WAKEUP
        self._should_abort: Callable[[], bool] = lambda: False
        #: The most items ever queued at once: never above ``capacity``.
        self.max_backlog = 0
        self.closed = False

    def bind_producer(self, wakeup: Wakeup, should_abort: Callable[[], bool]) -> None:
        self._producer = wakeup
        self._should_abort = should_abort

    def bind_consumer(self, wakeup: Wakeup) -> None:
        self._consumer = wakeup

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
        n = len(queue)
        self.max_backlog = max(self.max_backlog, n)
        self._consumer.signal()

    def poll(self) -> Any:
        queue = self._queue
        try:
            item = queue.popleft()
        except IndexError:
            return None
        if len(queue) == self.capacity - 1:
            self._producer.signal()
        return item

    def backlog(self) -> int:
        return len(self._queue)

    def size_of(self, item: Any) -> int:
        # In memory nothing was serialized; measure what a TCP channel would have sent.
        return len(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))

    def close(self) -> None:
        """The consumer is gone: wake a blocked producer so it fails instead of hanging."""
        self.closed = True
        self._producer.signal()
