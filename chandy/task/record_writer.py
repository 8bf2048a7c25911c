"""The output side of a task: batches records per channel and sends them.

Records collect in one buffer per output channel and leave when the buffer
holds ``batch_size`` records (a batch is never more than twice that), when the
task goes idle (a task that has nothing to read flushes before it sleeps, so a
trickle of records is not delayed), or when the oldest pending record is older
than the buffer timeout while the task stays busy. Events (end of partition,
later checkpoint barriers) first flush every buffer, so they stay in order
behind the records emitted before them.

A priority barrier (an unaligned checkpoint's, or an aligned one with a timeout) is the
exception: :meth:`RecordWriter.broadcast_priority_barrier` flushes every buffer beyond the
channels' credit (Flink's overdraft buffers) and sends the barrier ahead of what the
channels hold, so it reaches the consumer at once even under backpressure.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from chandy.network.channel import OutputChannel
from chandy.network.events import CheckpointBarrier, RuntimeEvent
from chandy.network.item_codec import RecordNotPicklableError, unpicklable_record_error
from chandy.task.metrics import WaitTimer
from chandy.task.partitioners import StreamPartitioner


class RecordWriter:
    """Partitioner + per-channel batching in front of the output channels of one edge."""

    __slots__ = (
        "channels",
        "partitioner",
        "batch_size",
        "_buffers",
        "pending_since_ns",
        "records_out",
        "batches_out",
        "blocked",
        "timestamped",
        "producer",
        "consumer",
    )

    def __init__(
        self, channels: Sequence[OutputChannel], partitioner: StreamPartitioner, batch_size: int
    ) -> None:
        self.channels = list(channels)
        self.partitioner = partitioner
        self.batch_size = batch_size
        self._buffers: list[Any] = [partitioner.new_buffer() for _ in self.channels]
        #: Monotonic time the oldest unsent record was emitted; 0 when nothing is pending.
        self.pending_since_ns = 0
        self.records_out = 0
        self.batches_out = 0
        #: Time sends waited for credit: the task's backpressure within a batch (see task.metrics).
        self.blocked = WaitTimer()
        #: The edge carries event timestamps (the partitioner's buffers have a timestamp column).
        self.timestamped = partitioner.timestamped
        #: The operator that emits into this writer and the task it sends to (for errors).
        self.producer: str | None = None
        self.consumer: str | None = None

    def emit_batch(self, records: Any) -> None:
        """Route ``records`` (a list or a :class:`~chandy.task.batches.TimestampedBatch`) and
        send every buffer that filled up."""
        buffers = self._buffers
        if self.timestamped:
            if type(records) is list:
                self.partitioner.partition_timestamped(records, [None] * len(records), buffers)
            else:
                self.partitioner.partition_timestamped(records.values, records.timestamps, buffers)
        elif type(records) is list:
            self.partitioner.partition(records, buffers)
        else:  # timestamps the edge does not carry (nothing downstream can use them)
            self.partitioner.partition(records.values, buffers)
        size = self.batch_size
        pending = False
        for index, buffer in enumerate(buffers):
            n = len(buffer)
            if n >= size:
                if n < 2 * size:  # send as is: a batch holds at most twice batch_size
                    self._send(index, buffer)
                    buffers[index] = self.partitioner.new_buffer()
                    continue
                cut = n - n % size
                for start in range(0, cut, size):
                    self._send(index, buffer[start : start + size])
                del buffer[:cut]
                n -= cut
            if n:
                pending = True
        if pending and not self.pending_since_ns:
            self.pending_since_ns = time.monotonic_ns()

    def _send(self, index: int, batch: Any) -> None:
        self.records_out += len(batch)
        self.batches_out += 1
        channel = self.channels[index]
        try:
            if channel.has_credit():
                channel.send(batch)
            else:  # the send waits for credit: backpressure, measured
                self.blocked.timed(channel.send, batch)
        except RecordNotPicklableError as exc:
            raise self._unpicklable(batch, exc) from exc.__cause__

    def _unpicklable(self, batch: Any, error: RecordNotPicklableError) -> RecordNotPicklableError:
        """``error`` (a TCP channel could not pickle ``batch``), naming who sent it where."""
        return unpicklable_record_error(batch, error.__cause__ or error, self.producer, self.consumer)

    def flush(self) -> None:
        """Send every partly filled buffer now."""
        if not self.pending_since_ns:
            return
        buffers = self._buffers
        for index, buffer in enumerate(buffers):
            if buffer:
                self._send(index, buffer)
                buffers[index] = self.partitioner.new_buffer()
        self.pending_since_ns = 0

    def broadcast_event(self, event: RuntimeEvent) -> None:
        """Flush, then send ``event`` on every channel, behind every record already emitted."""
        self.flush()
        for channel in self.channels:
            channel.send(event)

    def broadcast_priority_barrier(self, barrier: CheckpointBarrier) -> None:
        """Send ``barrier`` ahead of the data queued in every channel (unaligned or timeoutable).

        The partly filled buffers go into their channels first, without waiting for credit
        (at most one extra item per channel): the producer then holds nothing the barrier
        overtakes, so all of a checkpoint's in-flight data sits in the consumers' queues,
        where their channel state captures it. Waiting for credit here would hold the
        barrier behind the very backpressure it exists to overtake."""
        if self.pending_since_ns:
            buffers = self._buffers
            for index, buffer in enumerate(buffers):
                if buffer:
                    self.records_out += len(buffer)
                    self.batches_out += 1
                    try:
                        self.channels[index].send_overdraft(buffer)
                    except RecordNotPicklableError as exc:
                        raise self._unpicklable(buffer, exc) from exc.__cause__
                    buffers[index] = self.partitioner.new_buffer()
            self.pending_since_ns = 0
        for channel in self.channels:
            channel.send_priority(barrier)

    def is_available(self) -> bool:
        """Every channel has credit: the next batch will not block."""
        for channel in self.channels:
            if not channel.has_credit():
                return False
        return True
