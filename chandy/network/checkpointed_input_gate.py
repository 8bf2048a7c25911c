"""CheckpointedInputGate: an input gate whose checkpoint events go to a barrier handler.

The task reads data through it and never sees a barrier, a cancel marker, an end
of data (the gate counts them: :meth:`is_end_of_data`) or an end of partition:
those go to the :class:`CheckpointBarrierHandler`, which may block channels
(alignment), trigger the task's checkpoint or abort it. While a
checkpoint aligns, the size of every buffer read is reported to the handler
(bytes processed during alignment, a checkpoint metric).

Priority barriers (unaligned checkpoints, and aligned ones with a timeout) overtake the
data: the gate looks for them (the gate's shared notice, one attribute read) before each
item it takes, and hands them to the handler first. It looks again right after the take: a
barrier and the next item its producer sent after it may both arrive in between. If the item
came after its own channel's barrier, that barrier is handled before the item reaches the
task; any other barrier seen then is handled right after the task got the item (a snapshot in
between would hold neither the item nor, as in-flight data, a copy of it).

An unaligned barrier is acted on at once. An aligned one with a timeout is an
*announcement*: the handler keeps it (``handler.announced``) and this gate gives it back as
an in-order barrier once it took every item its producer sent before it
(``InputGate.reached``), before any later item of that channel, so it aligns exactly like an
in-band barrier unless the alignment times out (or, in the race above, the item after it was
taken already and cannot wait behind a blocked channel: the checkpoint goes unaligned at
once). After an unaligned checkpoint started, the items taken from a channel whose barrier
has not arrived yet are in-flight data of that checkpoint (``handler.persisting``): they are
added to its channel state as they are taken.

While no checkpoint is in progress all of that costs the reading loop three attribute reads
per item (the priority notice twice, the handler's ``watch_input``), where it used to call
the handler's ``is_aligning`` property: no slower (see the commit that added them).

Watermarks and watermark statuses of the channels go to the task's
:class:`~chandy.network.watermark_valve.StatusWatermarkValve`; the task sees only
what the valve forwards: a :class:`Watermark` when the minimum over the input
advanced, a :class:`WatermarkStatus` when the whole input became idle or active.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chandy.network.barrier_handler import CheckpointBarrierHandler
from chandy.network.channel import is_channel_state
from chandy.network.events import (
    CancelCheckpointMarker,
    CheckpointBarrier,
    EndOfData,
    EndOfPartition,
    PriorityBarrier,
    RuntimeEvent,
    Watermark,
    WatermarkStatus,
)
from chandy.network.input_gate import InputGate
from chandy.network.watermark_valve import StatusWatermarkValve


@dataclass(frozen=True, slots=True)
class _ReachedBarrier:
    """An announced barrier whose channel returned its last item before it: the handler
    gets it, in order, before anything more is taken from that channel."""

    channel: int
    barrier: CheckpointBarrier


@dataclass(frozen=True, slots=True)
class _ArrivedPriority:
    """A priority barrier seen while an item taken from the gate was in hand, and sent after that
    item: handed to the handler after the item, so that its snapshot does not fall between
    taking the item and handing it over."""

    channel: int
    priority: PriorityBarrier


class CheckpointedInputGate:
    """Flink's ``CheckpointedInputGate``: data out, checkpoint events to the handler."""

    __slots__ = ("gate", "handler", "valve", "_forward", "_notice")

    def __init__(self, gate: InputGate, handler: CheckpointBarrierHandler) -> None:
        self.gate = gate
        self.handler = handler
        self.valve = StatusWatermarkValve(gate.number_of_channels)
        #: Set by any channel when a priority barrier arrives (read before and after every take).
        self._notice = gate.priority_notice
        #: Watermark events the valve produced and the task has not taken yet, announced
        #: barriers reached and priority barriers put off, in the order they must be handled.
        self._forward: list[RuntimeEvent | _ReachedBarrier | _ArrivedPriority] = []

    def poll_next(self) -> tuple[int, Any] | None:
        """The next data batch as ``(channel, batch)``, or a watermark event the task must
        forward as ``(channel, Watermark | WatermarkStatus)``, or ``None`` if nothing can be
        read now (then :meth:`is_end_of_data` tells whether a record ever will). It returns
        ``None`` right after the last channel's end of data, before any barrier behind it."""
        gate, handler, forward, notice = self.gate, self.handler, self._forward, self._notice
        while True:
            if forward:
                head = forward.pop(0)
                if type(head) is _ReachedBarrier:
                    handler.process_barrier(head.barrier, head.channel)
                elif type(head) is _ArrivedPriority:
                    self._process_priority(head.channel, head.priority, defer=bool(forward))
                else:
                    return -1, head
                continue
            if notice.pending:
                self._process_priority_events(defer=False)
                continue
            polled = gate.poll_next()
            if notice.pending:  # arrived meanwhile, maybe before the item just taken
                if polled is None:
                    continue
                self._priority_with_item_in_hand(*polled)
            elif polled is None:
                return None
            channel, item = polled
            if handler.watch_input:
                self._taken(channel, item)
            if not isinstance(item, RuntimeEvent):
                return polled
            if isinstance(item, Watermark):
                out = self.valve.input_watermark(channel, item.timestamp)
            elif isinstance(item, CheckpointBarrier):
                handler.process_barrier(item, channel)
                continue
            elif isinstance(item, WatermarkStatus):
                out = self.valve.input_status(channel, item.idle)
            elif isinstance(item, CancelCheckpointMarker):
                handler.process_cancellation_barrier(item, channel)
                continue
            elif isinstance(item, EndOfPartition):
                out = self.valve.channel_finished(channel)
                handler.process_end_of_partition(channel)
                if not out and not forward and gate.take_end_of_data():
                    return None  # the task ends its input now: see the EndOfData branch
            elif isinstance(item, EndOfData):
                # Counted by the gate (is_end_of_data). The last one ends the task's input: it
                # returns to the task at once, so that the task finishes its operators before it
                # takes any barrier that followed (that checkpoint is its final one).
                if not forward and gate.take_end_of_data():
                    return None
                continue
            else:
                raise RuntimeError(f"unexpected event {item!r} on channel {channel}")
            if out:
                # ``forward`` was empty before this item: it holds only barriers put off until
                # after it or reached by it, which come after what the item produced.
                forward[:0] = out[1:]
                return channel, out[0]

    def _taken(self, channel: int, item: Any) -> None:
        """A checkpoint is in progress and ``item`` was just taken from ``channel``."""
        gate, handler = self.gate, self.handler
        if channel in handler.persisting:
            if is_channel_state(item):
                handler.persist(channel, gate.serialized(channel, item))
        elif handler.is_aligning and not isinstance(item, RuntimeEvent):
            handler.on_buffer(channel, gate.channels[channel].size_of(item))
        announced = handler.announced.get(channel)
        if announced is not None and gate.reached(channel, announced.position):
            self._forward.append(_ReachedBarrier(channel, announced.barrier))

    def _priority_with_item_in_hand(self, channel: int, item: Any) -> None:
        """Priority barriers arrived and ``item`` was just taken from ``channel``.

        A barrier of that channel which the item came after is handled now, before the item
        reaches the task: unaligned, its snapshot must not hold the item. An announcement
        then goes unaligned at once (aligning in order would need the item put back behind a
        blocked channel). Every other barrier waits until the item is handed over: a snapshot
        now would come before the item although the item is not in-flight data of it."""
        gate = self.gate
        while (polled := gate.poll_priority()) is not None:
            arrived, priority = polled
            if arrived == channel and gate.reached(channel, priority.position + 1):
                barrier = priority.barrier
                if barrier.options.is_timeoutable:
                    unaligned = CheckpointBarrier(
                        barrier.checkpoint_id, barrier.timestamp, barrier.options.to_unaligned()
                    )
                    priority = PriorityBarrier(unaligned, priority.position)
                self._process_priority(channel, priority, defer=True)
            else:
                self._forward.append(_ArrivedPriority(arrived, priority))

    @property
    def has_priority_event(self) -> bool:
        """A priority barrier arrived that :meth:`process_priority_events` would handle, or an
        announced barrier was reached and waits at the head of the forward queue."""
        forward = self._forward
        return (
            self._notice.pending
            or any(type(entry) is _ArrivedPriority for entry in forward)
            or (bool(forward) and type(forward[0]) is _ReachedBarrier)
        )

    def process_priority_events(self, *, mid_batch: bool = False) -> None:
        """Hand every priority barrier that arrived to the handler, without reading data: a
        task backpressured on its output calls this, so that an unaligned checkpoint (or an
        alignment timeout) still goes ahead while it reads nothing.

        ``mid_batch``: the task has processed part of the batch :meth:`poll_next` returned
        last (a slow operator, see :mod:`chandy.task.chunked_input`). Only unaligned
        checkpoints may start then (the rest of the batch is their in-flight data); an
        announced barrier that is reached waits in the forward queue until the next
        :meth:`poll_next`, as an aligned snapshot now would hold half of the batch and lose
        the rest."""
        forward = self._forward
        while not mid_batch and forward and type(forward[0]) is _ReachedBarrier:
            # An announced barrier reached by the last item handed over, with nothing before it
            # left to forward: it completes (or continues) an alignment without reading data.
            reached = forward.pop(0)
            assert type(reached) is _ReachedBarrier
            self.handler.process_barrier(reached.barrier, reached.channel)
        if forward:  # barriers put off while an item was in hand come first, in order
            arrived = [entry for entry in forward if type(entry) is _ArrivedPriority]
            if arrived:
                forward[:] = [entry for entry in forward if type(entry) is not _ArrivedPriority]
                for entry in arrived:
                    self._process_priority(entry.channel, entry.priority, defer=mid_batch or bool(forward))
        self._process_priority_events(defer=mid_batch or bool(forward))

    def _process_priority_events(self, *, defer: bool) -> None:
        gate = self.gate
        while (polled := gate.poll_priority()) is not None:
            self._process_priority(*polled, defer=defer)

    def _process_priority(self, channel: int, priority: PriorityBarrier, *, defer: bool) -> None:
        """Hand one priority barrier to the handler. An announcement already reached is processed
        in order at once, unless (``defer``) events of items taken before it wait in ``_forward``."""
        handler = self.handler
        handler.process_priority_barrier(priority, channel)
        if handler.announced.get(channel) is priority and self.gate.reached(channel, priority.position):
            if defer:
                self._forward.append(_ReachedBarrier(channel, priority.barrier))
            else:
                handler.process_barrier(priority.barrier, channel)

    def is_finished(self) -> bool:
        """Every input channel has ended."""
        return self.gate.is_finished()

    def is_end_of_data(self) -> bool:
        """Every input channel delivered its end of data (or ended): no more records or
        watermarks, only barriers and the ends of the partitions."""
        return self.gate.is_end_of_data()
