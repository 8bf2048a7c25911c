"""The output side of a task: batches records per channel and sends them.

Records collect in one buffer per output channel and leave when the buffer
holds ``batch_size`` records (a batch is never more than twice that), when the
task goes idle (a task that has nothing to read flushes before it sleeps, so a
trickle of records is not delayed), or when the oldest pending record has waited
half the buffer timeout while the task stays busy (see
:mod:`chandy.task.output_flusher` for who checks that, and why half). Events (end
of partition, later checkpoint barriers) first flush every buffer, so they stay
in order behind the records emitted before them.

A priority barrier (an unaligned checkpoint's, or an aligned one with a timeout) is the
exception: :meth:`RecordWriter.broadcast_priority_barrier` flushes every buffer beyond the
channels' credit (Flink's overdraft buffers) and sends the barrier ahead of what the
channels hold, so it reaches the consumer at once even under backpressure.

Two threads use a writer: the task thread, which emits, flushes and broadcasts, and the
task's output flusher (Flink's ``OutputFlusher``), which sends what waited too long while
the task thread is busy in a long batch or user call. :attr:`RecordWriter.lock` makes their
turns exclusive: the task thread takes it once per call (per emitted *batch*, not per record:
about 0.1 ns a record at the default batch size), the flusher only if it is free and only to
send to channels that have credit, so it never waits for the task thread nor for a consumer.
Only the task thread adds records, so it may read :attr:`~RecordWriter.pending_since_ns`
without the lock: the flusher only ever clears it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
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
        "_now_ns",
        "lock",
        "pending_since_ns",
        "records_out",
        "batches_out",
        "blocked",
        "timestamped",
        "producer",
        "consumer",
    )

    def __init__(
        self,
        channels: Sequence[OutputChannel],
        partitioner: StreamPartitioner,
        batch_size: int,
        now_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.channels = list(channels)
        self.partitioner = partitioner
        self.batch_size = batch_size
        self._buffers: list[Any] = [partitioner.new_buffer() for _ in self.channels]
        #: The task's monotonic clock (injected in tests), for :attr:`pending_since_ns`.
        self._now_ns = now_ns
        #: Held by whoever touches the buffers or sends: the task thread, or the output flusher.
        self.lock = threading.Lock()
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
        with self.lock:
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
                self.pending_since_ns = self._now_ns()

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

    # The two hooks a writer of another buffer type (ArrowRecordWriter) overrides; both are
    # called with the lock held.

    def _has_pending(self, index: int) -> bool:
        """Channel ``index``'s buffer holds records."""
        return bool(self._buffers[index])

    def _send_pending(self, index: int, overdraft: bool) -> None:
        """Send channel ``index``'s buffered records (at least one) and empty its buffer;
        ``overdraft``: without waiting for credit (:meth:`OutputChannel.send_overdraft`)."""
        buffer = self._buffers[index]
        self._buffers[index] = self.partitioner.new_buffer()
        if overdraft:
            self.records_out += len(buffer)
            self.batches_out += 1
            try:
                self.channels[index].send_overdraft(buffer)
            except RecordNotPicklableError as exc:
                raise self._unpicklable(buffer, exc) from exc.__cause__
        else:
            self._send(index, buffer)

    def _send_all_pending(self, overdraft: bool) -> None:
        for index in range(len(self.channels)):
            if self._has_pending(index):
                self._send_pending(index, overdraft)
        self.pending_since_ns = 0

    def flush(self) -> None:
        """Send every partly filled buffer now (task thread)."""
        if not self.pending_since_ns:
            return
        with self.lock:
            if self.pending_since_ns:  # the output flusher may have sent them meanwhile
                self._send_all_pending(overdraft=False)

    def flush_if_waited(self, now_ns: int, max_wait_ns: int) -> bool:
        """The output flusher's flush: if the oldest pending record was emitted ``max_wait_ns``
        or more before ``now_ns``, send every buffer whose channel has credit.

        Never waits: not for the lock (the task thread holding it is emitting or sending
        anyway), nor for credit (a buffer of a channel without credit stays, and leaves with
        the task thread's next send on that channel). A buffer goes out beyond credit only in
        the rare slices after its first item (:class:`~chandy.task.arrow_writer.ArrowRecordWriter`
        cuts a buffer of more than 64 MiB). Returns False when something due stayed behind."""
        since = self.pending_since_ns
        if not since or now_ns - since < max_wait_ns:
            return True
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if not self.pending_since_ns:
                return True
            stayed = False
            for index, channel in enumerate(self.channels):
                if self._has_pending(index):
                    if channel.has_credit():
                        self._send_pending(index, overdraft=True)
                    else:
                        stayed = True
            if not stayed:
                self.pending_since_ns = 0
            return not stayed
        finally:
            self.lock.release()

    def broadcast_event(self, event: RuntimeEvent) -> None:
        """Flush, then send ``event`` on every channel, behind every record already emitted.

        Never waits for credit (an overdraft: at most the partly filled buffer and the event
        beyond it, per channel). Events go out from timers and mails too (a periodic
        watermark), not only while processing an input the task checked it had room for; a
        task waiting for credit there could take no mail (a checkpoint's trigger) and no
        priority barrier until the consumer took an item, and under backpressure that wait
        was as long as the whole pipeline's, so unaligned checkpoints expired behind it.
        The task's loop still reads no input while a channel is over its capacity, so the
        overdraft stays bounded by what one step emits (Flink's overdraft buffers, FLIP-227)."""
        with self.lock:
            if self.pending_since_ns:
                self._send_all_pending(overdraft=True)
            for channel in self.channels:
                channel.send_overdraft(event)

    def broadcast_priority_barrier(self, barrier: CheckpointBarrier) -> None:
        """Send ``barrier`` ahead of the data queued in every channel (unaligned or timeoutable).

        The partly filled buffers go into their channels first, without waiting for credit
        (at most one extra item per channel): the producer then holds nothing the barrier
        overtakes, so all of a checkpoint's in-flight data sits in the consumers' queues,
        where their channel state captures it. Waiting for credit here would hold the
        barrier behind the very backpressure it exists to overtake."""
        with self.lock:
            if self.pending_since_ns:
                self._send_all_pending(overdraft=True)
            for channel in self.channels:
                channel.send_priority(barrier)

    def is_available(self) -> bool:
        """Every channel has credit: the next batch will not block."""
        for channel in self.channels:
            if not channel.has_credit():
                return False
        return True
