"""In-flight data of an unaligned checkpoint: what its barriers overtook, per input channel.

An unaligned barrier overtakes the items queued in its channel. Those items were sent
before the barrier, so the checkpoint must hold them: not in operator state (the task
snapshotted before reading them) but as *channel state*, replayed into the same channel
before any new input after a restore (Flink's ``ChannelStateWriter`` and
``InputChannelStateHandle``).

chandy persists in-flight data at one place only, the consumer. A producer never keeps
data it has not put into a channel: a barrier's producer first flushes its partly filled
batches into the channels (beyond their credit if need be, Flink's overdraft buffers), then
sends the barrier ahead of them. So everything the barrier overtakes sits in the
receiver's queue, and an unaligned checkpoint has input channel state only (Flink's
result-subpartition state is always empty here).

The :class:`ChannelStateWriter` collects one checkpoint's items on the task thread: the
barrier handler starts it when the checkpoint goes unaligned, the input gate adds the items
overtaken on each channel (serialized, as they crossed or would cross a TCP channel), and
the handler finishes it once every open channel delivered its barrier. The task's
checkpoint code waits for that (:meth:`ChannelStateWriter.on_complete`) before it writes
the state and acknowledges. Everything runs on the task thread: no locks.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")


@dataclass
class InputChannelState:
    """The in-flight data of one checkpoint at one subtask: serialized items per input channel,
    in channel order (channel indexes are the task's input gate's)."""

    checkpoint_id: int
    per_channel: dict[int, list[bytes]] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(len(p) for payloads in self.per_channel.values() for p in payloads)

    def is_empty(self) -> bool:
        return not any(self.per_channel.values())


def encode_payloads(payloads: list[bytes]) -> bytes:
    """One channel's items as one byte string: a 4-byte length before each."""
    parts: list[bytes] = []
    for payload in payloads:
        parts.append(_LENGTH.pack(len(payload)))
        parts.append(payload)
    return b"".join(parts)


def decode_payloads(data: bytes, source: str) -> list[bytes]:
    """The items :func:`encode_payloads` wrote; a truncated or corrupt stream names ``source``."""
    payloads: list[bytes] = []
    offset = 0
    end = len(data)
    while offset < end:
        if offset + _LENGTH.size > end:
            raise ValueError(f"channel state {source} is truncated at byte {offset} of {end}")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + length > end:
            raise ValueError(
                f"channel state {source} is truncated: an item of {length} bytes at byte {offset} of {end}"
            )
        payloads.append(data[offset : offset + length])
        offset += length
    return payloads


Completion = Callable[[InputChannelState | None], None]


class ChannelStateWriter:
    """Collects the channel state of the unaligned checkpoint in progress at one task.

    At most one checkpoint collects at a time (a newer barrier aborts an older checkpoint
    at the barrier handler, as in Flink). Items for any other checkpoint id are ignored:
    they belong to a checkpoint that was already aborted.
    """

    def __init__(self) -> None:
        self._current: InputChannelState | None = None
        self._finished: dict[int, InputChannelState] = {}
        self._waiting: dict[int, Completion] = {}

    @property
    def checkpoint_id(self) -> int | None:
        """The checkpoint collecting now, if any."""
        return None if self._current is None else self._current.checkpoint_id

    def start(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` went unaligned here: collect its in-flight data."""
        if self._current is not None:
            self.abort(self._current.checkpoint_id)
        for older in [k for k in self._finished if k < checkpoint_id]:
            del self._finished[older]  # never asked for: its checkpoint ended without a snapshot here
        self._current = InputChannelState(checkpoint_id)

    def add_input(self, checkpoint_id: int, channel: int, payloads: list[bytes]) -> None:
        """Items of ``channel`` that were sent before its barrier of ``checkpoint_id``, in order."""
        current = self._current
        if current is None or current.checkpoint_id != checkpoint_id or not payloads:
            return
        current.per_channel.setdefault(channel, []).extend(payloads)

    def finish_input(self, checkpoint_id: int) -> None:
        """Every open channel delivered its barrier: the channel state is complete."""
        current = self._current
        if current is None or current.checkpoint_id != checkpoint_id:
            return
        self._current = None
        callback = self._waiting.pop(checkpoint_id, None)
        if callback is not None:
            callback(current)
        else:
            self._finished[checkpoint_id] = current

    def abort(self, checkpoint_id: int) -> None:
        """The checkpoint was aborted here: drop what it collected."""
        if self._current is not None and self._current.checkpoint_id == checkpoint_id:
            self._current = None
        self._finished.pop(checkpoint_id, None)
        callback = self._waiting.pop(checkpoint_id, None)
        if callback is not None:
            callback(None)

    def on_complete(self, checkpoint_id: int, callback: Completion) -> None:
        """Call ``callback`` with the checkpoint's channel state once it is complete (at once
        if it is), or with ``None`` if the checkpoint is aborted or was never started here."""
        finished = self._finished.pop(checkpoint_id, None)
        if finished is not None:
            callback(finished)
        elif self._current is not None and self._current.checkpoint_id == checkpoint_id:
            self._waiting[checkpoint_id] = callback
        else:
            callback(None)

    def close(self) -> None:
        """The task ends: every checkpoint still waiting gets ``None``."""
        self._current = None
        self._finished.clear()
        waiting, self._waiting = self._waiting, {}
        for callback in waiting.values():
            callback(None)
