"""Checkpoint barriers at a task with inputs: when to snapshot, what to block.

Transport-free on purpose: a handler only sees "barrier n on channel c",
"cancel marker", "end of partition on c" and "a buffer of so many bytes was
read", and answers by blocking channels, triggering or aborting through the
:class:`BarrierHandlerActions` its owner gives it. Tests drive it with exact
event sequences and a manual clock.

Two handlers, as in Flink:

* :class:`SingleCheckpointBarrierHandler` (EXACTLY_ONCE, aligned). After the
  first barrier of checkpoint n it stops reading every channel that delivered
  barrier n; their senders run out of credit and wait. When every open channel
  has delivered it, the task snapshots and all channels are released. A
  record that arrived after the barrier on a fast channel therefore cannot reach
  the state before the snapshot; after a restore it is read again exactly once.
  Its states are values (:data:`WAITING_FOR_FIRST_BARRIER`,
  :data:`COLLECTING_BARRIERS`), and each event returns the next state.
* :class:`CheckpointBarrierTracker` (AT_LEAST_ONCE). Never blocks; triggers when
  every open channel has delivered barrier n. Records after the barrier on a
  fast channel reach the state before the snapshot and are replayed after a
  restore: counted twice, never lost.

Both end every checkpoint they start exactly once, triggered or aborted, so the
task acknowledges or declines each one; ``tests/test_barrier_handlers_randomized.py``
checks this (and that nothing stays blocked or unread) over random event sequences.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

from chandy.messages.checkpoint import CheckpointFailureReason
from chandy.network.events import CancelCheckpointMarker, CheckpointBarrier
from chandy.util.clock import Clock, SystemClock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AlignmentMetrics:
    """What alignment cost for one checkpoint at one subtask."""

    alignment_duration_ns: int = 0
    checkpoint_start_delay_ns: int = 0
    bytes_processed_during_alignment: int = 0


class BarrierHandlerActions(Protocol):
    """What a handler asks of the task that owns it."""

    def trigger_checkpoint_on_barrier(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        """Every open channel delivered the barrier: snapshot and forward it."""

    def abort_checkpoint_on_barrier(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        """This checkpoint cannot complete here: decline it and tell downstream."""


class ChannelBlocker(Protocol):
    """What alignment needs of the input gate."""

    def block_channel(self, index: int) -> None: ...

    def unblock_all(self) -> None: ...


class CheckpointBarrierHandler(ABC):
    """Common contract of both handlers."""

    def __init__(self, num_channels: int, actions: BarrierHandlerActions, clock: Clock | None = None) -> None:
        if num_channels < 1:
            raise ValueError("a barrier handler needs at least one channel")
        self.num_channels = num_channels
        self.actions = actions
        self.clock = clock or SystemClock()
        self.closed_channels: set[int] = set()
        #: Highest checkpoint id seen in a barrier or cancel marker.
        self.latest_checkpoint_id = -1

    @abstractmethod
    def process_barrier(self, barrier: CheckpointBarrier, channel: int) -> None: ...

    @abstractmethod
    def process_cancellation_barrier(self, marker: CancelCheckpointMarker, channel: int) -> None: ...

    @abstractmethod
    def process_end_of_partition(self, channel: int) -> None: ...

    def on_buffer(self, channel: int, size_bytes: int) -> None:
        """A data buffer of ``size_bytes`` was read from ``channel``."""

    @property
    def is_aligning(self) -> bool:
        """True between the first and the last barrier of an aligned checkpoint."""
        return False

    @property
    def num_open_channels(self) -> int:
        return self.num_channels - len(self.closed_channels)


# ---------------------------------------------------------------------- aligned


class BarrierHandlerState(ABC):
    """A state of the aligned handler. Every event returns the next state."""

    @abstractmethod
    def barrier_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState: ...

    @abstractmethod
    def abort(self, handler: SingleCheckpointBarrierHandler) -> BarrierHandlerState: ...

    def __repr__(self) -> str:
        return type(self).__name__


class WaitingForFirstBarrier(BarrierHandlerState):
    """Nothing is blocked; no checkpoint is being aligned."""

    def barrier_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        if handler.all_barriers_received():  # one open channel: nothing to align
            handler.trigger_global_checkpoint(barrier)
            return self
        handler.gate.block_channel(channel)
        return COLLECTING_BARRIERS

    def abort(self, handler: SingleCheckpointBarrierHandler) -> BarrierHandlerState:
        return self


class CollectingBarriers(BarrierHandlerState):
    """Some channels delivered the barrier and are blocked; waiting for the rest."""

    def barrier_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        handler.gate.block_channel(channel)
        if handler.all_barriers_received():
            handler.gate.unblock_all()
            handler.trigger_global_checkpoint(barrier)
            return WAITING_FOR_FIRST_BARRIER
        return self

    def abort(self, handler: SingleCheckpointBarrierHandler) -> BarrierHandlerState:
        handler.gate.unblock_all()
        return WAITING_FOR_FIRST_BARRIER


WAITING_FOR_FIRST_BARRIER = WaitingForFirstBarrier()
COLLECTING_BARRIERS = CollectingBarriers()


class SingleCheckpointBarrierHandler(CheckpointBarrierHandler):
    """Aligned barriers for EXACTLY_ONCE (Flink's ``SingleCheckpointBarrierHandler``).

    ``end_of_partition_aborts``: an input that ends during alignment aborts the
    checkpoint (``CHECKPOINT_DECLINED_INPUT_END_OF_STREAM``), Flink's behaviour
    without checkpoints after tasks finished. When False, the ended channel counts
    as aligned and the checkpoint may complete.
    """

    def __init__(
        self,
        num_channels: int,
        gate: ChannelBlocker,
        actions: BarrierHandlerActions,
        clock: Clock | None = None,
        *,
        end_of_partition_aborts: bool = True,
    ) -> None:
        super().__init__(num_channels, actions, clock)
        self.gate = gate
        self.end_of_partition_aborts = end_of_partition_aborts
        self.state: BarrierHandlerState = WAITING_FOR_FIRST_BARRIER
        self.current_checkpoint_id = -1
        self._pending = False
        self._received: set[int] = set()
        self._first_barrier_ns = 0
        self._start_delay_ns = 0
        self._bytes_processed = 0
        self._current_barrier: CheckpointBarrier | None = None
        #: Alignment duration of the last checkpoint: 0 when it was aborted (Flink's task metric).
        self.last_alignment_duration_ns = 0

    @property
    def is_aligning(self) -> bool:
        return self._pending and bool(self._received)

    @property
    def is_checkpoint_pending(self) -> bool:
        return self._pending

    def all_barriers_received(self) -> bool:
        return len(self._received | self.closed_channels) == self.num_channels

    def on_buffer(self, channel: int, size_bytes: int) -> None:
        if self._pending:
            self._bytes_processed += size_bytes

    # -- events ------------------------------------------------------------

    def process_barrier(self, barrier: CheckpointBarrier, channel: int) -> None:
        barrier_id = barrier.checkpoint_id
        if barrier_id > self.current_checkpoint_id:
            if self._pending:
                log.debug(
                    "checkpoint %d subsumed by barrier %d before alignment completed",
                    self.current_checkpoint_id,
                    barrier_id,
                )
                self._abort(self.current_checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED)
            self._start_alignment(barrier)
        elif barrier_id < self.current_checkpoint_id or not self._pending:
            return  # obsolete: an older checkpoint, or this one was already triggered or aborted
        if channel in self._received:
            log.warning("second barrier of checkpoint %d on channel %d ignored", barrier_id, channel)
            return
        self._received.add(channel)
        self.state = self.state.barrier_received(self, channel, barrier)

    def process_cancellation_barrier(self, marker: CancelCheckpointMarker, channel: int) -> None:
        cancelled = marker.checkpoint_id
        self.latest_checkpoint_id = max(self.latest_checkpoint_id, cancelled)
        if cancelled > self.current_checkpoint_id:
            if self._pending:
                self._abort(self.current_checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED)
            self.current_checkpoint_id = cancelled
            self._pending = True  # so that _abort reports it, once
            self._abort(cancelled, CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)
        elif cancelled == self.current_checkpoint_id and self._pending:
            self._abort(cancelled, CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)

    def process_end_of_partition(self, channel: int) -> None:
        self.closed_channels.add(channel)
        if not self._pending:
            return
        if self.end_of_partition_aborts:
            self._abort(
                self.current_checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM
            )
        elif self.all_barriers_received():
            self.gate.unblock_all()
            self.state = WAITING_FOR_FIRST_BARRIER
            assert self._current_barrier is not None
            self.trigger_global_checkpoint(self._current_barrier)

    # -- transitions called by the states ----------------------------------

    def _start_alignment(self, barrier: CheckpointBarrier) -> None:
        self.current_checkpoint_id = barrier.checkpoint_id
        self.latest_checkpoint_id = max(self.latest_checkpoint_id, barrier.checkpoint_id)
        self._pending = True
        self._received = set()
        self._first_barrier_ns = self.clock.monotonic_ns()
        self._start_delay_ns = max(0, self.clock.now_ms() - barrier.timestamp) * 1_000_000
        self._bytes_processed = 0
        self._current_barrier = barrier

    def trigger_global_checkpoint(self, barrier: CheckpointBarrier) -> None:
        duration = self.clock.monotonic_ns() - self._first_barrier_ns
        metrics = AlignmentMetrics(duration, self._start_delay_ns, self._bytes_processed)
        self._pending = False
        self._received = set()
        self.last_alignment_duration_ns = duration
        self.actions.trigger_checkpoint_on_barrier(barrier, metrics)

    def _abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self._pending = False
        self._received = set()
        self._bytes_processed = 0
        self.last_alignment_duration_ns = 0
        self.state = self.state.abort(self)
        self.actions.abort_checkpoint_on_barrier(checkpoint_id, reason)


# ---------------------------------------------------------------------- at-least-once


@dataclass
class _BarrierCount:
    checkpoint_id: int
    channels: set[int]
    first_barrier_ns: int
    start_delay_ns: int
    barrier: CheckpointBarrier | None = None
    aborted: bool = False


#: Most checkpoints the tracker counts at once (Flink's ``MAX_CHECKPOINTS_TO_TRACK``).
MAX_CHECKPOINTS_TO_TRACK = 50


class CheckpointBarrierTracker(CheckpointBarrierHandler):
    """Barrier tracking for AT_LEAST_ONCE (Flink's ``CheckpointBarrierTracker``): never blocks.

    Keeps a count per checkpoint id in progress (ids are assumed to increase). Since
    nothing blocks, a fast channel can deliver barriers of many checkpoints while a slow
    one delivers none; at most ``max_checkpoints_to_track`` counts are kept, and the
    oldest is dropped when a newer one would exceed that. A count is never dropped
    silently: every checkpoint that can no longer complete here (pushed out of the bound,
    older than one that completed, older than a cancelled one) is aborted, so the task
    declines it at once and the coordinator does not wait for its timeout.

    With one open channel a barrier needs no counting, unless a count is in progress: a
    channel that delivered its barrier and then ended leaves a count that the last open
    channel's barrier completes.
    """

    def __init__(
        self,
        num_channels: int,
        actions: BarrierHandlerActions,
        clock: Clock | None = None,
        *,
        max_checkpoints_to_track: int = MAX_CHECKPOINTS_TO_TRACK,
    ) -> None:
        super().__init__(num_channels, actions, clock)
        if max_checkpoints_to_track < 1:
            raise ValueError(f"max_checkpoints_to_track must be >= 1, got {max_checkpoints_to_track}")
        self.max_checkpoints_to_track = max_checkpoints_to_track
        #: Counts in progress, oldest (lowest id) first.
        self._pending: list[_BarrierCount] = []

    @property
    def num_pending_checkpoints(self) -> int:
        """Checkpoints whose barriers are being counted (at most ``max_checkpoints_to_track``)."""
        return len(self._pending)

    def process_barrier(self, barrier: CheckpointBarrier, channel: int) -> None:
        barrier_id = barrier.checkpoint_id
        now_ns = self.clock.monotonic_ns()
        delay = max(0, self.clock.now_ms() - barrier.timestamp) * 1_000_000
        if self.num_open_channels == 1 and not self._pending:  # fast path: nothing to count
            if barrier_id > self.latest_checkpoint_id:
                self.latest_checkpoint_id = barrier_id
                self.actions.trigger_checkpoint_on_barrier(barrier, AlignmentMetrics(0, delay, 0))
            return
        for position, entry in enumerate(self._pending):
            if entry.checkpoint_id == barrier_id:
                entry.channels.add(channel)
                self._complete_if_done(position, barrier)
                return
        if barrier_id > self.latest_checkpoint_id:
            self.latest_checkpoint_id = barrier_id
            self._pending.append(_BarrierCount(barrier_id, {channel}, now_ns, delay, barrier))
            if len(self._pending) > self.max_checkpoints_to_track:
                dropped = self._pending.pop(0)
                log.warning(
                    "barrier tracker: checkpoint %d dropped, %d newer ones are being counted "
                    "(at most %d); an input channel lags far behind",
                    dropped.checkpoint_id,
                    len(self._pending),
                    self.max_checkpoints_to_track,
                )
                self._abort(dropped, CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED)
            self._complete_if_done(len(self._pending) - 1, barrier)
        # else: an obsolete barrier of a checkpoint already completed, aborted or dropped

    def _complete_if_done(self, position: int, barrier: CheckpointBarrier) -> None:
        entry = self._pending[position]
        if len(entry.channels | self.closed_channels) < self.num_channels:
            return
        older = self._pending[:position]
        del self._pending[: position + 1]
        for dead in older:  # every channel passed them without completing them: they never will
            self._abort(dead, CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED)
        if not entry.aborted:
            duration = self.clock.monotonic_ns() - entry.first_barrier_ns
            self.actions.trigger_checkpoint_on_barrier(
                barrier, AlignmentMetrics(duration, entry.start_delay_ns, 0)
            )

    def _abort(self, entry: _BarrierCount, reason: CheckpointFailureReason) -> None:
        """Abort ``entry``'s checkpoint unless it was aborted already (each is aborted once)."""
        if not entry.aborted:
            entry.aborted = True
            self.actions.abort_checkpoint_on_barrier(entry.checkpoint_id, reason)

    def process_cancellation_barrier(self, marker: CancelCheckpointMarker, channel: int) -> None:
        cancelled = marker.checkpoint_id
        if self.num_open_channels == 1 and not self._pending:
            if cancelled > self.latest_checkpoint_id:
                self.latest_checkpoint_id = cancelled
                self.actions.abort_checkpoint_on_barrier(
                    cancelled, CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER
                )
            return
        # Everything older than the cancelled checkpoint can no longer complete.
        while self._pending and self._pending[0].checkpoint_id < cancelled:
            self._abort(
                self._pending.pop(0), CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER
            )
        if self._pending and self._pending[0].checkpoint_id == cancelled:
            entry = self._pending[0]
        elif cancelled > self.latest_checkpoint_id:
            self.latest_checkpoint_id = cancelled
            entry = _BarrierCount(cancelled, set(), self.clock.monotonic_ns(), 0)
            self._pending.insert(0, entry)
        else:
            return
        entry.channels.add(channel)
        self._abort(entry, CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)
        if len(entry.channels | self.closed_channels) >= self.num_channels:
            self._pending.remove(entry)

    def process_end_of_partition(self, channel: int) -> None:
        self.closed_channels.add(channel)
        for position in range(len(self._pending) - 1, -1, -1):
            entry = self._pending[position]
            if len(entry.channels | self.closed_channels) >= self.num_channels:
                barrier = entry.barrier or CheckpointBarrier(entry.checkpoint_id, 0)
                self._complete_if_done(position, barrier)
                return
