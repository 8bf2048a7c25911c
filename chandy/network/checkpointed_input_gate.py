"""CheckpointedInputGate: an input gate whose checkpoint events go to a barrier handler.

The task reads data through it and never sees a barrier, a cancel marker or an
end of partition: those go to the :class:`CheckpointBarrierHandler`, which may
block channels (alignment), trigger the task's checkpoint or abort it. While a
checkpoint aligns, the size of every buffer read is reported to the handler
(bytes processed during alignment, a checkpoint metric).

Watermarks and watermark statuses of the channels go to the task's
:class:`~chandy.network.watermark_valve.StatusWatermarkValve`; the task sees only
what the valve forwards: a :class:`Watermark` when the minimum over the input
advanced, a :class:`WatermarkStatus` when the whole input became idle or active.
"""

from __future__ import annotations

from typing import Any

from chandy.network.barrier_handler import CheckpointBarrierHandler
from chandy.network.events import (
    CancelCheckpointMarker,
    CheckpointBarrier,
    EndOfPartition,
    RuntimeEvent,
    Watermark,
    WatermarkStatus,
)
from chandy.network.input_gate import InputGate
from chandy.network.watermark_valve import StatusWatermarkValve


class CheckpointedInputGate:
    """Flink's ``CheckpointedInputGate``: data out, checkpoint events to the handler."""

    __slots__ = ("gate", "handler", "valve", "_forward")

    def __init__(self, gate: InputGate, handler: CheckpointBarrierHandler) -> None:
        self.gate = gate
        self.handler = handler
        self.valve = StatusWatermarkValve(gate.number_of_channels)
        #: Watermark events the valve produced and the task has not taken yet.
        self._forward: list[RuntimeEvent] = []

    def poll_next(self) -> tuple[int, Any] | None:
        """The next data batch as ``(channel, batch)``, or a watermark event the task must
        forward as ``(channel, Watermark | WatermarkStatus)``, or ``None`` if nothing can be
        read now (then :meth:`is_finished` tells whether anything ever will)."""
        if self._forward:
            return -1, self._forward.pop(0)
        gate, handler = self.gate, self.handler
        while True:
            polled = gate.poll_next()
            if polled is None:
                return None
            channel, item = polled
            if not isinstance(item, RuntimeEvent):
                if handler.is_aligning:
                    handler.on_buffer(channel, gate.channels[channel].size_of(item))
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
            else:
                raise RuntimeError(f"unexpected event {item!r} on channel {channel}")
            if out:
                self._forward.extend(out[1:])
                return channel, out[0]

    def is_finished(self) -> bool:
        """Every input channel has ended."""
        return self.gate.is_finished()
