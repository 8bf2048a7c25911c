"""The input gate: every input channel of a task, read one item at a time.

The gate reads channels round-robin (one item per turn, so no producer
starves), skips channels that are *blocked* (barrier alignment stops reading a
channel that already delivered the barrier; its sender then runs out of
credit) and remembers which channels have ended. It never waits: the task
thread waits on its :class:`~chandy.network.wakeup.Wakeup`, which every channel
signals when an item arrives.

Priority barriers (unaligned checkpoints) bypass that order: every channel shares one
:class:`~chandy.network.channel.PriorityNotice`, so the task learns of a priority barrier
on any channel with one attribute read (:attr:`InputGate.has_priority_event`), even while it
reads no data at all (blocked, or backpressured on its output).

After a restore from an unaligned checkpoint, the items a channel had in flight
(:meth:`InputGate.add_recovered`) are returned before any live item of that channel: a
wrapper stands in for the channel while they last, so the gate's reading loop is the same
with or without recovered items.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from chandy.network.channel import InputChannel, PriorityNotice
from chandy.network.events import EndOfData, EndOfPartition, PriorityBarrier
from chandy.network.item_codec import decode_naming_classes
from chandy.network.wakeup import Wakeup
from chandy.state.missing_classes import missing_class_error
from chandy.state.unpickling import DEFAULT_POLICY, PickleRefusal, UnpicklingPolicy, refused_error


class _RecoveredChannel(InputChannel):
    """Stands in for a channel at ``index`` of ``gate`` while recovered items remain.

    It returns the recovered items first, then puts the live channel back into the gate
    (at the first poll after the last recovered item, so that :meth:`serialized` of that
    item is still answered here) and reads on from it. Priority barriers and positions
    are the live channel's: its producer numbers only what it sent itself.
    """

    def __init__(
        self,
        gate: InputGate,
        index: int,
        live: InputChannel,
        payloads: list[bytes],
        policy: UnpicklingPolicy = DEFAULT_POLICY,
    ) -> None:
        self._gate = gate
        self._index = index
        self.live = live
        self.recovered: deque[bytes] = deque(payloads)
        self._last: bytes | None = None
        #: How the recovered items' pickles are read: they come from a checkpoint.
        self._policy = policy

    def bind_consumer(self, wakeup: Wakeup) -> None:
        self.live.bind_consumer(wakeup)

    def bind_priority(self, notice: PriorityNotice) -> None:
        self.live.bind_priority(notice)

    @property
    def taken(self) -> int:  # type: ignore[override]
        return self.live.taken

    def add(self, payloads: list[bytes]) -> None:
        self.recovered.extend(payloads)

    def poll(self) -> Any:
        if self.recovered:
            payload = self._last = self.recovered.popleft()
            try:
                return decode_naming_classes(payload, self._missing_class, self._policy)
            except PickleRefusal as exc:
                raise refused_error(exc.refused, "the task", None, what=self._what()) from None
        self._gate.channels[self._index] = self.live
        self._last = None
        return self.live.poll()

    def _what(self) -> str:
        return f"the in-flight records of its input channel {self._index} (unaligned checkpoint)"

    def _missing_class(self, missing: str, error: BaseException) -> BaseException:
        return missing_class_error(missing, error, "the task", [], what=self._what())

    def poll_priority(self) -> PriorityBarrier | None:
        return self.live.poll_priority()

    def backlog(self) -> int:
        return len(self.recovered) + self.live.backlog()

    def size_of(self, item: Any) -> int:
        return len(self._last) if self._last is not None else self.live.size_of(item)

    def in_flight_before(self, position: int) -> list[bytes]:
        return [*self.recovered, *self.live.in_flight_before(position)]

    def serialized(self, item: Any) -> bytes:
        return self._last if self._last is not None else self.live.serialized(item)


class InputGate:
    """All input channels of one task."""

    __slots__ = (
        "channels",
        "_blocked",
        "_finished",
        "num_finished",
        "_data_ended",
        "num_data_ended",
        "_end_of_data_untold",
        "_next",
        "_n",
        "_notice",
        "_wakeup",
    )

    def __init__(self, channels: Sequence[InputChannel], wakeup: Wakeup) -> None:
        if not channels:
            raise ValueError("an input gate needs at least one channel")
        self.channels = list(channels)
        self._notice = PriorityNotice()
        self._wakeup = wakeup
        for channel in self.channels:
            channel.bind_consumer(wakeup)
            channel.bind_priority(self._notice)
        self._n = len(self.channels)
        self._blocked = [False] * self._n
        self._finished = [False] * self._n
        self.num_finished = 0
        #: Channels that delivered :class:`EndOfData` (or ended without one).
        self._data_ended = [False] * self._n
        self.num_data_ended = 0
        self._end_of_data_untold = False
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
                kind = type(item)
                if kind is EndOfPartition:
                    self._finished[index] = True
                    self.num_finished += 1
                    self._end_data(index)
                elif kind is EndOfData:
                    self._end_data(index)
                return index, item
        return None

    @property
    def has_priority_event(self) -> bool:
        """Some channel may hold a priority barrier (:meth:`poll_priority` tells)."""
        return self._notice.pending

    @property
    def priority_notice(self) -> PriorityNotice:
        """The notice behind :attr:`has_priority_event`: a reading loop keeps it and reads its
        ``pending`` between items (one attribute read, no property call per item)."""
        return self._notice

    def poll_priority(self) -> tuple[int, PriorityBarrier] | None:
        """``(channel_index, priority_barrier)`` of a channel holding one, or ``None``.

        Priority barriers overtake everything: blocked channels are asked too. The notice is
        cleared before the channels are asked, so one arriving meanwhile sets it again; it is
        set again too when one is returned, as another may be waiting.
        """
        notice = self._notice
        notice.pending = False
        for index, channel in enumerate(self.channels):
            priority = channel.poll_priority()
            if priority is not None:
                notice.pending = True
                return index, priority
        return None

    def add_recovered(
        self, channel: int, payloads: list[bytes], policy: UnpicklingPolicy = DEFAULT_POLICY
    ) -> None:
        """Items ``channel`` had in flight at the restored checkpoint (serialized, in order):
        :meth:`poll_next` returns them before any live item of that channel, their pickles
        read under ``policy``."""
        if not payloads:
            return
        current = self.channels[channel]
        if isinstance(current, _RecoveredChannel):
            current.add(payloads)
        else:
            self.channels[channel] = _RecoveredChannel(self, channel, current, payloads, policy)
        self._wakeup.signal()

    def in_flight_before(self, channel: int, position: int) -> list[bytes]:
        """What a priority barrier at ``position`` on ``channel`` overtook, serialized and in
        order: the recovered items not yet returned, then the live ones up to ``position``."""
        return self.channels[channel].in_flight_before(position)

    def serialized(self, channel: int, item: Any) -> bytes:
        """``item``, just returned by :meth:`poll_next` from ``channel``, as bytes."""
        return self.channels[channel].serialized(item)

    def reached(self, channel: int, position: int) -> bool:
        """Whether ``channel`` returned every in-band item before ``position``: no recovered
        item is left and its producer's first ``position`` items were taken."""
        current = self.channels[channel]
        if isinstance(current, _RecoveredChannel):
            if current.recovered:
                return False
            current = current.live
        return current.taken >= position

    def _end_data(self, index: int) -> None:
        if not self._data_ended[index]:
            self._data_ended[index] = True
            self.num_data_ended += 1
            self._end_of_data_untold = self.num_data_ended == self._n

    def take_end_of_data(self) -> bool:
        """True once: right after the item that ended the data of the last channel."""
        if self._end_of_data_untold:
            self._end_of_data_untold = False
            return True
        return False

    def is_finished(self) -> bool:
        """Every channel delivered its :class:`EndOfPartition`."""
        return self.num_finished == self._n

    def is_end_of_data(self) -> bool:
        """Every channel delivered its :class:`EndOfData` (or its end of partition): no record
        will arrive any more, only checkpoint barriers and the ends of the partitions."""
        return self.num_data_ended == self._n

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
