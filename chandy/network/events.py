"""Events that travel in a channel between record batches, in order.

A channel carries one ordered stream of items: a record batch (a ``list``) or a
:class:`RuntimeEvent`. Because events never overtake records, an
:class:`EndOfData` marks exactly where a producer's records end, and an
:class:`EndOfPartition` where the channel itself ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from chandy.messages.checkpoint import CheckpointOptions


@dataclass(frozen=True, slots=True)
class RuntimeEvent:
    """Base of every in-band event."""


@dataclass(frozen=True, slots=True)
class EndOfPartition(RuntimeEvent):
    """The producer finished: nothing follows on this channel."""


END_OF_PARTITION = EndOfPartition()


@dataclass(frozen=True, slots=True)
class EndOfData(RuntimeEvent):
    """The producer's operators finished: no record or watermark follows on this channel,
    but checkpoint barriers still may (Flink's ``EndOfData``, FLIP-147).

    A bounded job ends in two steps. Every task, once each of its input channels delivered
    this event, ends its input (``end_input``, ``finish``), sends it on, and waits for a
    checkpoint taken *after* that to complete: the final checkpoint, whose barrier travels
    behind this event through every task, so one checkpoint covers what every operator did
    while finishing (a two-phase-commit sink's last transaction among it). Only then does
    the task send :class:`EndOfPartition` and end. A task that ended before its output was
    covered by a completed checkpoint could otherwise have committed output that the
    checkpoint a failover restores from does not account for."""


END_OF_DATA = EndOfData()


DEFAULT_OPTIONS = CheckpointOptions()


@dataclass(frozen=True, slots=True)
class CheckpointBarrier(RuntimeEvent):
    """Separates the records before checkpoint ``checkpoint_id`` from those after it.

    Injected by every source subtask when it takes its snapshot, forwarded by
    every task once it has taken its own. ``timestamp`` is the trigger time at
    the coordinator (milliseconds); it gives the checkpoint's start delay.
    """

    checkpoint_id: int
    timestamp: int
    options: CheckpointOptions = DEFAULT_OPTIONS


@dataclass(frozen=True, slots=True)
class CancelCheckpointMarker(RuntimeEvent):
    """Checkpoint ``checkpoint_id`` was aborted upstream: do not wait for its barriers."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class Watermark(RuntimeEvent):
    """Event time on this channel has reached ``timestamp``: no record older will follow.

    A task's watermark is the minimum over its active input channels; it
    forwards a watermark only when that minimum advances.
    """

    timestamp: int


@dataclass(frozen=True, slots=True)
class WatermarkStatus(RuntimeEvent):
    """The channel became idle (``idle=True``: it does not hold back the watermark) or
    active again (Flink's ``WatermarkStatus``)."""

    idle: bool


IDLE = WatermarkStatus(True)
ACTIVE = WatermarkStatus(False)


@dataclass(frozen=True, slots=True)
class PriorityBarrier:
    """A barrier sent ahead of the data queued in its channel (Flink's priority event).

    It never enters the channel's in-band order: the receiver sees it as soon as it arrives,
    and ``position`` tells it where the barrier belongs in that order: the number of in-band
    items (batches and events) its producer had sent on this channel before it. An unaligned
    barrier is acted on at once and the items the receiver has not yet taken up to
    ``position`` are the data it overtook; a timeoutable aligned barrier is an announcement,
    acted on once the receiver has taken ``position`` items, unless its alignment times out.
    """

    barrier: CheckpointBarrier
    position: int
