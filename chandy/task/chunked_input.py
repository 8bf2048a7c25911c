"""Slow input batches in chunks, so that an unaligned barrier is taken between records.

A task acts on a priority (unaligned) barrier between two input batches. Behind a slow
operator one batch can take long (a sink at 0.4 ms per record takes 400 ms for 1,024
records), and an unaligned checkpoint would wait for all of it, where Flink takes the
barrier between two records. With unaligned checkpoints enabled, the task therefore hands
a batch it expects to be slow to the operator chain in chunks of about
:data:`TARGET_CHUNK_NS` each, and between two chunks lets the input gate give the priority
barriers that arrived to the barrier handler.

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
processed whole, as without unaligned checkpoints; so is every batch of a fast operator.
The task chooses this way of reading once, at the start of its loop: with unaligned
checkpoints disabled nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chandy.network.channel_state import ChannelStateWriter
from chandy.network.checkpointed_input_gate import CheckpointedInputGate
from chandy.network.item_codec import encode_item

#: Longest a chunk of a batch should take. An unaligned barrier waits at most about this long
#: for the task (plus the chunk in progress when the estimate is off). Small against the
#: checkpoint times it is for (PyFlink takes such a barrier in 16 ms p50 behind a slow sink),
#: large against the cost of a chunk (a slice and a call, microseconds), so a task that splits
#: its batches loses nothing measurable in throughput.
TARGET_CHUNK_NS = 10_000_000

#: Records in the first chunk while nothing is measured yet: a first batch behind a slow
#: operator is not processed whole on no information.
PROBE_RECORDS = 16

#: Weight of the newest measurement in the estimate: it follows a change of the operator's
#: cost within a few batches, and one batch slowed by a pause (GC, a full output) moves it
#: only a quarter of the way.
EWMA_WEIGHT = 0.25


class ChunkedInput:
    """Processes input batches whole or in chunks, taking priority barriers between chunks."""

    __slots__ = ("_gate", "_now_ns", "_target_ns", "ns_per_record", "_measured", "_in_hand")

    def __init__(
        self,
        gate: CheckpointedInputGate,
        now_ns: Callable[[], int],
        target_ns: int = TARGET_CHUNK_NS,
    ) -> None:
        self._gate = gate
        self._now_ns = now_ns
        self._target_ns = target_ns
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
        if self._measured and n * self.ns_per_record <= self._target_ns:
            now_ns = self._now_ns
            start = now_ns()
            process_batch(batch)
            self._observe(now_ns() - start, n)
            return
        self._process_chunks(process_batch, channel, batch, n)

    def _process_chunks(
        self, process_batch: Callable[[Any], object], channel: int, batch: Any, n: int
    ) -> None:
        now_ns, gate = self._now_ns, self._gate
        done = 0
        while done < n:
            if self._measured:
                size = max(1, int(self._target_ns / self.ns_per_record)) if self.ns_per_record else n
            else:
                size = PROBE_RECORDS
            end = min(n, done + size)
            chunk = batch if done == 0 and end == n else batch[done:end]
            start = now_ns()
            process_batch(chunk)
            self._observe(now_ns() - start, end - done)
            done = end
            if done < n and gate.has_priority_event:
                self._in_hand = (channel, batch, done)
                try:
                    gate.process_priority_events(mid_batch=True)
                finally:
                    self._in_hand = None

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
