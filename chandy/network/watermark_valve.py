"""StatusWatermarkValve: the watermark of a task from the watermarks of its input channels.

Flink's rule: a task's watermark is the minimum over its *active, aligned*
input channels, and it is forwarded only when it advances. A channel that
declares itself idle (:class:`~chandy.network.events.WatermarkStatus`) is left
out of the minimum, so a source partition that has no data does not hold back
event time for everyone; when it becomes active again it rejoins the minimum
only once its watermark has caught up with the task's (it is *aligned*), so the
task's watermark never goes back. When every channel is idle the task itself
is idle downstream (after flushing the highest watermark any channel reached
if the last active channel was the one holding the minimum). A channel that
ended no longer counts.

The valve only computes; the input gate hands what it returns to the task.
"""

from __future__ import annotations

from chandy.core.time import MIN_TIMESTAMP
from chandy.network.events import ACTIVE, IDLE, RuntimeEvent, Watermark


class StatusWatermarkValve:
    """Per-channel watermarks and statuses of one task's input."""

    __slots__ = ("_watermarks", "_idle", "_aligned", "last_output", "is_idle")

    def __init__(self, num_channels: int) -> None:
        if num_channels < 1:
            raise ValueError("a valve needs at least one channel")
        self._watermarks = [MIN_TIMESTAMP] * num_channels
        self._idle = [False] * num_channels
        self._aligned = [True] * num_channels
        #: The watermark the task last forwarded.
        self.last_output = MIN_TIMESTAMP
        #: Whether the task is idle downstream (every input channel is).
        self.is_idle = False

    def input_watermark(self, channel: int, timestamp: int) -> list[RuntimeEvent]:
        """A watermark arrived on ``channel``; returns what the task forwards (maybe nothing)."""
        if self.is_idle or self._idle[channel] or timestamp <= self._watermarks[channel]:
            return []
        self._watermarks[channel] = timestamp
        if not self._aligned[channel] and timestamp >= self.last_output:
            self._aligned[channel] = True
        return self._new_min()

    def input_status(self, channel: int, idle: bool) -> list[RuntimeEvent]:
        """``channel`` became idle (or active); returns the events the task forwards."""
        if idle and not self._idle[channel]:
            self._idle[channel] = True
            self._aligned[channel] = False
            if not any(not i for i in self._idle):
                out: list[RuntimeEvent] = []
                if self._watermarks[channel] == self.last_output:
                    top = max(self._watermarks)
                    if top > self.last_output:
                        self.last_output = top
                        out.append(Watermark(top))
                self.is_idle = True
                out.append(IDLE)
                return out
            if self._watermarks[channel] == self.last_output:
                return self._new_min()
            return []
        if not idle and self._idle[channel]:
            self._idle[channel] = False
            if self._watermarks[channel] >= self.last_output:
                self._aligned[channel] = True
            if self.is_idle:
                self.is_idle = False
                return [ACTIVE]
        return []

    def channel_finished(self, channel: int) -> list[RuntimeEvent]:
        """``channel`` ended: it will never hold the watermark back again. (Its producer sent
        MAX_WATERMARK before ending, so nothing is flushed when the last channel ends.)"""
        if self._idle[channel]:
            return []
        self._idle[channel] = True
        self._aligned[channel] = False
        if all(self._idle) or self._watermarks[channel] != self.last_output:
            return []
        return self._new_min()

    def _new_min(self) -> list[RuntimeEvent]:
        low: int | None = None
        for watermark, aligned in zip(self._watermarks, self._aligned, strict=True):
            if aligned and (low is None or watermark < low):
                low = watermark
        if low is not None and low > self.last_output:
            self.last_output = low
            return [Watermark(low)]
        return []
