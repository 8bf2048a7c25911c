"""CheckpointedInputGate: an input gate whose checkpoint events go to a barrier handler.

The task reads data through it and never sees a barrier, a cancel marker or an
end of partition: those go to the :class:`CheckpointBarrierHandler`, which may
block channels (alignment), trigger the task's checkpoint or abort it. While a
checkpoint aligns, the size of every buffer read is reported to the handler
(bytes processed during alignment, a checkpoint metric).
"""

from __future__ import annotations

from typing import Any

from chandy.network.barrier_handler import CheckpointBarrierHandler
from chandy.network.events import (
    CancelCheckpointMarker,
    CheckpointBarrier,
    EndOfPartition,
    RuntimeEvent,
)
from chandy.network.input_gate import InputGate


class CheckpointedInputGate:
    """Flink's ``CheckpointedInputGate``: data out, checkpoint events to the handler."""

    __slots__ = ("gate", "handler")

    def __init__(self, gate: InputGate, handler: CheckpointBarrierHandler) -> None:
        self.gate = gate
        self.handler = handler

    def poll_next(self) -> tuple[int, Any] | None:
        """The next data batch as ``(channel, batch)``, or ``None`` if none can be read now
        (then :meth:`is_finished` tells whether any ever will)."""
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
            if isinstance(item, CheckpointBarrier):
                handler.process_barrier(item, channel)
            elif isinstance(item, CancelCheckpointMarker):
                handler.process_cancellation_barrier(item, channel)
            elif isinstance(item, EndOfPartition):
                handler.process_end_of_partition(channel)
            else:
                raise RuntimeError(f"unexpected event {item!r} on channel {channel}")

    def is_finished(self) -> bool:
        """Every input channel has ended."""
        return self.gate.is_finished()
