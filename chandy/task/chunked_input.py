"""Slow input batches in chunks: for the buffer timeout, and for unaligned barriers.

An operator processes a whole input batch before its output reaches the task's record
writers (a map builds its output list in one comprehension), and the task acts on mail and
barriers only between batches. Behind a slow operator one batch can take long (a map at
0.2 s per record takes 2 s for 10 records, a sink at 0.4 ms per record 400 ms for 1,024),
where Flink handles records one at a time. So a task hands a batch it expects to be slow to
the operator chain in chunks, for two reasons:

* the buffer timeout (``execution.buffer-timeout``, Flink's): a record produced while its
  task is busy leaves within the timeout. Chunks of at most half of it get each chunk's
  output into the writers soon after it was produced, where the task's output flusher
  (:mod:`chandy.task.output_flusher`) sends it once it waited the other half; between two
  chunks the task thread sends what is due itself. A timeout of 0 (flush after every
  record) processes one record per chunk and flushes after each; -1 (flush only full
  batches) splits nothing for this;
* the metrics of a task without network outputs (its chain ends in sinks: nothing to flush).
  Records are counted per batch handed to an operator, so behind a slow operator the
  counts, and the rates the status line and the REST API show, would stand still until a
  whole batch is through (a map at 5 ms per record: 5 s for 1,024) and then jump. Chunks of
  at most half the metrics report interval (``chandy.metrics.report-interval``) make them
  move at least twice per report. The target is long because a sink's cost may be per call:
  it pays that cost at most once per half a report interval;
* unaligned checkpoints: a task acts on a priority (unaligned) barrier between two input
  batches, and an unaligned checkpoint would wait for all of a slow one, where Flink takes
  the barrier between two records. With unaligned checkpoints enabled, chunks take at most
  :data:`TARGET_CHUNK_NS` and the input gate gives the priority barriers that arrived
  meanwhile to the barrier handler between two chunks.

Only an unaligned checkpoint may start between two chunks: its snapshot holds what the
operators processed, and the rest of the batch, which was sent before its channel's barrier
(a barrier that came before the batch was handled before the batch was handed over), is
in-flight data of that channel. :meth:`ChunkedInput.persist_unprocessed`, called when the
task is triggered, adds it to the checkpoint's channel state, serialized the way channels
serialize items, before anything the barrier handler captures for that channel after the
trigger, so a restore replays it first. An announced (aligned) barrier reached meanwhile
waits for the next poll of the gate: an aligned snapshot in the middle of a batch would lose
the rest of it. (If the batch's channel was persisting for an unaligned checkpoint already
triggered, the whole batch went into its channel state when it was taken; a barrier of that
checkpoint arriving mid-batch needs nothing more.)

What a batch costs is not known before it is processed, so it is estimated: an
exponentially weighted average of nanoseconds per record over the batches (and chunks)
processed, measured on the task's clock. A batch expected to take at most the target is
processed whole, as it always was: every batch of a fast operator is (1,024 records of a
keyed sum take about 0.3 ms against the default 50 ms), so the hot path pays two clock
reads and a multiplication per batch. A source task is chunked the same way, by asking its
reader for at most the records expected to take a chunk's time (:meth:`ChunkedInput.limit`).
Arrow record batches (the batch path) are never cut: a batch function's cost is mostly per
call, so cutting its batches would multiply it; their rows still leave within the timeout
once the function returned (the flusher sends them while the next call runs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from chandy.network.channel_state import ChannelStateWriter
from chandy.network.checkpointed_input_gate import CheckpointedInputGate
from chandy.network.item_codec import encode_item

#: Longest a chunk of a batch should take with unaligned checkpoints. An unaligned barrier waits
#: at most about this long for the task (plus the chunk in progress when the estimate is off).
#: Small against the checkpoint times it is for (PyFlink takes such a barrier in 16 ms p50
#: behind a slow sink), large against the cost of a chunk (a slice and a call, microseconds),
#: so a task that splits its batches loses nothing measurable in throughput.
TARGET_CHUNK_NS = 10_000_000

#: Records in the first chunk while nothing is measured yet: a first batch behind a slow
#: operator is not processed whole on no information.
PROBE_RECORDS = 16

#: Weight of the newest measurement in the estimate: it follows a change of the operator's
#: cost within a few batches, and one batch slowed by a pause (GC, a full output) moves it
#: only a quarter of the way.
EWMA_WEIGHT = 0.25


class ChunkedInput:
    """Processes input batches whole or in chunks; with a gate, takes priority barriers between
    chunks."""

    __slots__ = (
        "_gate",
        "_now_ns",
        "_target_ns",
        "_probe",
        "_after_chunk",
        "ns_per_record",
        "_measured",
        "_in_hand",
    )

    def __init__(
        self,
        gate: CheckpointedInputGate | None,
        now_ns: Callable[[], int],
        target_ns: int = TARGET_CHUNK_NS,
        *,
        probe_records: int = PROBE_RECORDS,
        after_chunk: Callable[[], object] | None = None,
    ) -> None:
        """``gate``: the task's input, whose priority barriers are handled between chunks
        (unaligned checkpoints); ``None`` when chunks are only for the buffer timeout.
        ``target_ns``: the longest a chunk should take (0: one record per chunk).
        ``after_chunk``: called between two chunks (the task sends what is due)."""
        self._gate = gate
        self._now_ns = now_ns
        self._target_ns = target_ns
        self._probe = probe_records
        self._after_chunk = after_chunk
        #: Estimated processing time of one record (ns), once :attr:`_measured`.
        self.ns_per_record = 0.0
        self._measured = False
        #: While priority barriers are handled between chunks: the batch's channel, the batch,
        #: and how many of its records were processed.
        self._in_hand: tuple[int, Any, int] | None = None

    def process(self, process_batch: Callable[[Any], object], channel: int, batch: Any) -> None:
        """Hand ``batch``, taken from ``channel``, to ``process_batch``: whole if it is
        expected to be quick, else in chunks with priority barriers handled in between."""
        n = len(batch)
        if (self._measured and n * self.ns_per_record <= self._target_ns) or (
            self._gate is None and type(batch) is pa.RecordBatch
        ):
            now_ns = self._now_ns
            start = now_ns()
            process_batch(batch)
            self._observe(now_ns() - start, n)
            return
        self._process_chunks(process_batch, channel, batch, n)

    def _chunk_size(self, n: int) -> int:
        """Records in the next chunk."""
        if not self._measured:
            return self._probe
        if self._target_ns <= 0:
            return 1
        if not self.ns_per_record:
            return n
        return max(1, int(self._target_ns / self.ns_per_record))

    def limit(self, n: int) -> int:
        """At most how many of ``n`` records a source should read in one go: those expected to
        take no longer than the target (what a chunk of a batch would hold)."""
        if self._measured and n * self.ns_per_record <= self._target_ns:
            return n
        return min(n, self._chunk_size(n))

    def _process_chunks(
        self, process_batch: Callable[[Any], object], channel: int, batch: Any, n: int
    ) -> None:
        now_ns, gate, after_chunk = self._now_ns, self._gate, self._after_chunk
        done = 0
        while done < n:
            end = min(n, done + self._chunk_size(n))
            chunk = batch if done == 0 and end == n else batch[done:end]
            start = now_ns()
            process_batch(chunk)
            self._observe(now_ns() - start, end - done)
            done = end
            if done < n:
                if after_chunk is not None:
                    after_chunk()
                if gate is not None and gate.has_priority_event:
                    self._in_hand = (channel, batch, done)
                    try:
                        gate.process_priority_events(mid_batch=True)
                    finally:
                        self._in_hand = None

    def observe(self, elapsed_ns: int, records: int) -> None:
        """``records`` took ``elapsed_ns`` (a source's read and what its chain did with them)."""
        if records:
            self._observe(elapsed_ns, records)

    def _observe(self, elapsed_ns: int, records: int) -> None:
        sample = elapsed_ns / records if records else 0.0
        if self._measured:
            self.ns_per_record += EWMA_WEIGHT * (sample - self.ns_per_record)
        else:
            self.ns_per_record = sample
            self._measured = True

    @property
    def in_batch(self) -> bool:
        """True while priority barriers are handled between two chunks of a batch."""
        return self._in_hand is not None

    def persist_unprocessed(self, checkpoint_id: int, channel_state: ChannelStateWriter) -> None:
        """Unaligned checkpoint ``checkpoint_id`` is triggered (its channel state started, nothing
        captured yet): if that happens between two chunks, the rest of the batch is the first
        in-flight data of its channel. Serialized as channels serialize items, so a restore
        replays it like any other (:meth:`InputGate.add_recovered`)."""
        in_hand = self._in_hand
        if in_hand is None:
            return
        channel, batch, done = in_hand
        rest = batch[done:]
        channel_state.add_input(checkpoint_id, channel, [encode_item(rest)])
