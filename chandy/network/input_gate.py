"""The input gate: every input channel of a task, read one item at a time.

The gate reads channels round-robin (one item per turn, so no producer
starves), skips channels that are *blocked* (barrier alignment stops reading a
channel that already delivered the barrier; its sender then runs out of
credit) and remembers which channels have ended. It never waits: the task
thread waits on its :class:`~chandy.network.wakeup.Wakeup`, which every channel
signals when an item arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chandy.network.channel import InputChannel
from chandy.network.events import EndOfPartition
from chandy.network.wakeup import Wakeup


class InputGate:
    """All input channels of one task."""

    __slots__ = ("channels", "_blocked", "_finished", "num_finished", "_next", "_n")

    def __init__(self, channels: Sequence[InputChannel], wakeup: Wakeup) -> None:
        if not channels:
            raise ValueError("an input gate needs at least one channel")
        self.channels = list(channels)
        for channel in self.channels:
            channel.bind_consumer(wakeup)
        self._n = len(self.channels)
        self._blocked = [False] * self._n
        self._finished = [False] * self._n
        self.num_finished = 0
        self._next = 0

    @property
    def number_of_channels(self) -> int:
        return self._n

    def poll_next(self) -> tuple[int, Any] | None:
        """``(channel_index, item)`` from the next channel that has one, or ``None``."""
        channels, blocked, n = self.channels, self._blocked, self._n
        start = self._next
        for step in range(n):
            index = start + step
            if index >= n:
                index -= n
            if blocked[index]:
                continue
            item = channels[index].poll()
            if item is not None:
                self._next = index + 1 if index + 1 < n else 0
                if type(item) is EndOfPartition:
                    self._finished[index] = True
                    self.num_finished += 1
                return index, item
        return None

    def is_finished(self) -> bool:
        """Every channel delivered its :class:`EndOfPartition`."""
        return self.num_finished == self._n

    def is_channel_finished(self, index: int) -> bool:
        return self._finished[index]

    def block_channel(self, index: int) -> None:
        """Stop reading ``index`` until :meth:`unblock_all` (barrier alignment)."""
        self._blocked[index] = True

    def is_blocked(self, index: int) -> bool:
        return self._blocked[index]

    def blocked_channels(self) -> set[int]:
        return {i for i, b in enumerate(self._blocked) if b}

    def unblock_all(self) -> None:
        for i in range(self._n):
            self._blocked[i] = False
