"""The output side of a batch edge: Arrow record batches buffered per channel and sent large.

The columnar partitioner (:mod:`chandy.task.arrow_partitioners`) cuts every emitted
``pyarrow.RecordBatch`` into one piece per channel. A piece is small when the batch was (a
trickle at a low rate) or when many channels share it, and every item a channel carries costs
a credit, a wakeup and, over TCP, a frame: so :class:`ArrowRecordWriter` keeps each channel's
pieces and sends them as one concatenated batch when they hold ``batch_size`` rows
(``chandy.network.arrow-batch-size``), exactly when :class:`~chandy.task.record_writer.RecordWriter`
sends its lists:

* when the task goes idle (it flushes before it sleeps), and within the buffer timeout while
  it stays busy, even inside one long batch function call (the task's output flusher sends
  what waited half of ``execution.buffer-timeout``, see :mod:`chandy.task.output_flusher`),
  so latency at low rates stays in milliseconds;
* before any event (barrier, watermark, end of partition), so events stay in order behind the
  rows emitted before them, and beyond credit before a priority barrier (overdraft), so the
  producer never holds rows the barrier overtakes.

A channel never gets an empty batch, and its rows keep their emission order. Pieces of
different schemas (a function returning a column of another type now and then) are never
concatenated: a channel's buffer is sent before a piece of another schema joins it. A buffer
of at least twice ``batch_size`` rows is sent in slices of ``batch_size`` (zero-copy), like the
record writer's lists, so one item never holds more than twice the configured rows; and an
item is cut by bytes too, into slices of at most :data:`MAX_ITEM_BYTES`, so wide rows never make
one larger than a TCP frame may be (``chandy.network.framing.MAX_FRAME_BYTES``: a frame over it
fails the task, and the restarted task would send the same item again, forever).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from chandy.network.channel import OutputChannel
from chandy.task.arrow_partitioners import ColumnarPartitioner
from chandy.task.record_writer import RecordWriter
from chandy.util.memory import keep_freed_heap

#: The most bytes (``RecordBatch.nbytes``) one item of a batch edge holds, whatever its rows: far
#: below the 1 GiB TCP frame limit, and large enough that a slice still amortises its frame.
MAX_ITEM_BYTES = 64 << 20


def _slices(batch: pa.RecordBatch, rows: int) -> Iterator[pa.RecordBatch]:
    """``batch`` in zero-copy slices of at most ``rows`` rows and :data:`MAX_ITEM_BYTES` bytes,
    in order. Rows are assumed about equally wide to choose the slices' rows, and a slice still
    over the limit (wider rows than average) is halved until it fits or is one row (which no cut
    can make smaller)."""
    n = batch.num_rows
    nbytes = batch.nbytes
    if nbytes > MAX_ITEM_BYTES:
        rows = max(1, min(rows, n * MAX_ITEM_BYTES // nbytes))
    if rows >= n:
        if nbytes > MAX_ITEM_BYTES and n > 1:
            half = n // 2
            yield from _slices(batch.slice(0, half), half)
            yield from _slices(batch.slice(half), n - half)
        else:
            yield batch
        return
    for start in range(0, n, rows):
        yield from _slices(batch.slice(start, rows), rows)


class ArrowRecordWriter(RecordWriter):
    """:class:`RecordWriter`'s interface for a batch edge: pieces buffered per channel, sent concatenated."""

    __slots__ = ("_rows", "_split")

    def __init__(
        self,
        channels: Sequence[OutputChannel],
        partitioner: ColumnarPartitioner,
        batch_size: int,
        now_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"chandy.network.arrow-batch-size must be at least 1 row, got {batch_size}")
        super().__init__(channels, partitioner, batch_size, now_ns)
        # Partitioning allocates and frees a few arrays of a batch's size per batch: keep the
        # freed heap instead of faulting it in again page by page (6.4 instead of 11.5 ns a row
        # to key 65,536-row batches of int keys onto 2 channels; see keep_freed_heap). A batch
        # source's task may hold no batch operator that would have asked already.
        keep_freed_heap()
        self._split = partitioner.split
        #: Rows buffered per channel (the pieces in ``_buffers``).
        self._rows = [0] * len(self.channels)
        self.timestamped = False

    def emit_batch(self, records: Any) -> None:
        """Route the record batch ``records`` and send every channel's buffer that filled up."""
        with self.lock:
            buffers, rows, size = self._buffers, self._rows, self.batch_size
            for index, piece in self._split(records):
                buffer = buffers[index]
                if buffer and not piece.schema.equals(buffer[0].schema):
                    self._send_pending(index, overdraft=False)
                    buffer = buffers[index]
                buffer.append(piece)
                rows[index] += piece.num_rows
                if rows[index] >= size:
                    self._send_pending(index, overdraft=False)
            if not self.pending_since_ns and any(rows):
                self.pending_since_ns = self._now_ns()

    def _send_pending(self, index: int, overdraft: bool) -> None:
        """Send channel ``index``'s buffered rows (at least one) as one batch, or in slices of
        ``batch_size`` if they are twice that or more, and of at most :data:`MAX_ITEM_BYTES`;
        empty the buffer."""
        pieces: list[pa.RecordBatch] = self._buffers[index]
        n = self._rows[index]
        batch = pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)
        self._buffers[index] = []
        self._rows[index] = 0
        size = self.batch_size
        for part in _slices(batch, n if n < 2 * size else size):
            if overdraft:
                self.records_out += part.num_rows
                self.batches_out += 1
                self.channels[index].send_overdraft(part)
            else:
                self._send(index, part)  # counts len(part), its rows

    def _has_pending(self, index: int) -> bool:
        return self._rows[index] > 0
