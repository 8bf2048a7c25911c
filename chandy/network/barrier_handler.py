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
  :data:`COLLECTING_BARRIERS`, ...), and each event returns the next state.

  The same handler takes unaligned checkpoints (issue 16), chosen per checkpoint by
  ``barrier.options``: an unaligned barrier arrives as a *priority* barrier ahead of the
  data queued in its channel and the task snapshots at once; what the barriers overtook
  is collected as the checkpoint's channel state (:class:`ChannelStateWriter`). An aligned
  barrier with a timeout arrives as an *announcement* (a priority barrier acted on in
  order, once the gate took every item before it); if the alignment is not done when the
  timeout passes, the checkpoint switches to unaligned here.
* :class:`CheckpointBarrierTracker` (AT_LEAST_ONCE). Never blocks; triggers when
  every open channel has delivered barrier n. Records after the barrier on a
  fast channel reach the state before the snapshot and are replayed after a
  restore: counted twice, never lost.

Both end every checkpoint they start exactly once, triggered or aborted, so the
task acknowledges or declines each one (an unaligned checkpoint, triggered at its first
barrier, may still be aborted before its channel state is complete; its channel state is
then dropped, so the task never acknowledges it); ``tests/test_barrier_handlers_randomized.py``
checks this (and that nothing stays blocked or unread) over random event sequences.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

from chandy.messages.checkpoint import CheckpointFailureReason
from chandy.network.channel_state import ChannelStateWriter
from chandy.network.events import CancelCheckpointMarker, CheckpointBarrier, PriorityBarrier
from chandy.util.clock import Clock, SystemClock
from chandy.util.timer import Cancellable, Timer

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
    """What alignment needs of the input gate (and an unaligned checkpoint, of its channels)."""

    def block_channel(self, index: int) -> None: ...

    def unblock_all(self) -> None: ...

    def in_flight_before(self, channel: int, position: int) -> list[bytes]:
        """The items of ``channel`` not taken yet up to in-band ``position``, serialized: what a
        priority barrier at ``position`` overtook (only asked for unaligned checkpoints)."""
        ...


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
        #: True while a checkpoint is in progress here: the checkpointed gate then tells the
        #: handler of every item it takes (bytes read during alignment, in-flight data to
        #: persist, announced barriers reached). One attribute read per item: nothing more
        #: is asked of the gate's reading loop when no checkpoint is in progress.
        self.watch_input = False
        #: Channels whose items, as the gate takes them, are in-flight data of the unaligned
        #: checkpoint in progress (:meth:`persist`): it went unaligned before their barrier arrived.
        self.persisting: set[int] = set()
        #: Announced barriers (aligned, with a timeout) the gate must hand back in order
        #: (:meth:`process_barrier`) once it took every item before ``position``, by channel.
        self.announced: dict[int, PriorityBarrier] = {}

    @abstractmethod
    def process_barrier(self, barrier: CheckpointBarrier, channel: int) -> None: ...

    def process_priority_barrier(self, priority: PriorityBarrier, channel: int) -> None:
        """A barrier sent ahead of the data queued in ``channel`` (unaligned, or announced)."""
        raise RuntimeError(
            f"{type(self).__name__} got a priority barrier of checkpoint {priority.barrier.checkpoint_id} "
            f"on channel {channel}: unaligned checkpoints and aligned checkpoint timeouts need the "
            "EXACTLY_ONCE checkpointing mode (execution.checkpointing.mode)"
        )

    @abstractmethod
    def process_cancellation_barrier(self, marker: CancelCheckpointMarker, channel: int) -> None: ...

    @abstractmethod
    def process_end_of_partition(self, channel: int) -> None: ...

    def on_buffer(self, channel: int, size_bytes: int) -> None:
        """A data buffer of ``size_bytes`` was read from ``channel``."""

    def persist(self, channel: int, payload: bytes) -> None:
        """An item just taken from a :attr:`persisting` channel, serialized: in-flight data."""

    @property
    def is_aligning(self) -> bool:
        """True between the first and the last barrier of an aligned checkpoint."""
        return False

    @property
    def num_open_channels(self) -> int:
        return self.num_channels - len(self.closed_channels)


# ---------------------------------------------------------------------- states


class BarrierHandlerState(ABC):
    """A state of :class:`SingleCheckpointBarrierHandler`. Every event returns the next state.

    The events: a barrier taken in order (``barrier_received``), a priority barrier (an
    unaligned one, or an announcement of an aligned one with a timeout), an input that
    ended while its end does not abort the checkpoint, the alignment timeout, an abort.
    """

    @abstractmethod
    def barrier_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState: ...

    def priority_barrier_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int, priority: PriorityBarrier
    ) -> BarrierHandlerState:
        """Aligned states: an unaligned barrier switches the checkpoint to unaligned at once;
        an announcement is kept until the gate reached it, unless the timeout passed."""
        handler.announced[channel] = priority
        if priority.barrier.options.is_unaligned or handler.timed_out(priority.barrier):
            return handler.go_unaligned()
        return ALTERNATING_COLLECTING_BARRIERS

    def end_of_partition_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int
    ) -> BarrierHandlerState:
        """Aligned states: the ended channel counts as aligned (it does not abort here)."""
        if handler.all_barriers_received():
            handler.gate.unblock_all()
            assert handler.current_barrier is not None
            handler.trigger_global_checkpoint(handler.current_barrier)
            return WAITING_FOR_FIRST_BARRIER
        return self

    def alignment_timed_out(self, handler: SingleCheckpointBarrierHandler) -> BarrierHandlerState:
        return self

    @abstractmethod
    def abort(self, handler: SingleCheckpointBarrierHandler) -> BarrierHandlerState: ...

    def __repr__(self) -> str:
        return type(self).__name__


class WaitingForFirstBarrier(BarrierHandlerState):
    """Nothing is blocked; no checkpoint is being aligned.

    Which way the next checkpoint goes is up to its first barrier's options: in-band and
    aligned (as always), announced with a timeout (:class:`AlternatingCollectingBarriers`),
    or unaligned (:class:`CollectingBarriersUnaligned`)."""

    def barrier_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        if barrier.options.is_priority:
            return ALTERNATING_COLLECTING_BARRIERS.barrier_received(handler, channel, barrier)
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
        if barrier.options.is_unaligned:  # an upstream task's alignment timed out
            return handler.go_unaligned()
        handler.gate.block_channel(channel)
        if handler.all_barriers_received():
            handler.gate.unblock_all()
            handler.trigger_global_checkpoint(barrier)
            return WAITING_FOR_FIRST_BARRIER
        return self

    def abort(self, handler: SingleCheckpointBarrierHandler) -> BarrierHandlerState:
        handler.gate.unblock_all()
        return WAITING_FOR_FIRST_BARRIER


class AlternatingCollectingBarriers(CollectingBarriers):
    """An aligned checkpoint with a timeout (Flink's ``AlternatingWaitingForFirstBarrier`` and
    ``AlternatingCollectingBarriers`` in one: announcements may come before any barrier).

    Channels that delivered the barrier in order are blocked, announced ones are read up to
    their barrier. When the alignment timer fires (or a barrier or announcement finds the
    timeout passed) before every channel delivered it, the checkpoint goes unaligned.
    """

    def barrier_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        handler.announced.pop(channel, None)
        if barrier.options.is_unaligned:
            return handler.go_unaligned()
        if handler.all_barriers_received():
            handler.gate.unblock_all()
            handler.trigger_global_checkpoint(barrier)
            return WAITING_FOR_FIRST_BARRIER
        handler.gate.block_channel(channel)
        if handler.timed_out(barrier):
            return handler.go_unaligned()
        return self

    def end_of_partition_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int
    ) -> BarrierHandlerState:
        handler.announced.pop(channel, None)
        return super().end_of_partition_received(handler, channel)

    def alignment_timed_out(self, handler: SingleCheckpointBarrierHandler) -> BarrierHandlerState:
        return handler.go_unaligned()


class CollectingBarriersUnaligned(BarrierHandlerState):
    """The checkpoint is unaligned and was triggered; collecting its in-flight data.

    A channel whose barrier arrives (priority, announced or in order) gives what the
    barrier overtook; until then, every item taken from it is in-flight data
    (:attr:`SingleCheckpointBarrierHandler.persisting`). Nothing is blocked. Flink's
    ``CollectingBarriersUnaligned`` and ``AlternatingCollectingBarriersUnaligned`` in one:
    where to go afterwards depends on the next checkpoint's options, not on this state.
    """

    def barrier_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        handler.persisting.discard(channel)  # every item before the barrier was taken, and persisted
        return handler.finish_unaligned_if_done(self)

    def priority_barrier_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int, priority: PriorityBarrier
    ) -> BarrierHandlerState:
        handler.persisting.discard(channel)
        handler.capture(channel, priority.position)
        return handler.finish_unaligned_if_done(self)

    def end_of_partition_received(
        self, handler: SingleCheckpointBarrierHandler, channel: int
    ) -> BarrierHandlerState:
        handler.persisting.discard(channel)
        return handler.finish_unaligned_if_done(self)

    def abort(self, handler: SingleCheckpointBarrierHandler) -> BarrierHandlerState:
        handler.persisting.clear()
        handler.channel_state.abort(handler.current_checkpoint_id)
        return WAITING_FOR_FIRST_BARRIER


WAITING_FOR_FIRST_BARRIER = WaitingForFirstBarrier()
COLLECTING_BARRIERS = CollectingBarriers()
ALTERNATING_COLLECTING_BARRIERS = AlternatingCollectingBarriers()
COLLECTING_BARRIERS_UNALIGNED = CollectingBarriersUnaligned()


class SingleCheckpointBarrierHandler(CheckpointBarrierHandler):
    """Barriers for EXACTLY_ONCE (Flink's ``SingleCheckpointBarrierHandler``): aligned,
    aligned with a timeout, or unaligned, as each checkpoint's ``barrier.options`` say.

    ``end_of_partition_aborts``: an input that ends during alignment aborts the
    checkpoint (``CHECKPOINT_DECLINED_INPUT_END_OF_STREAM``), Flink's behaviour
    without checkpoints after tasks finished. When False, the ended channel counts
    as aligned and the checkpoint may complete.

    ``timer`` runs the alignment timeout of an aligned checkpoint with a timeout, on the
    task thread (without one, a timeout is noticed only when a barrier or announcement
    arrives). ``channel_state`` collects what the barriers of an unaligned checkpoint
    overtook; the handler starts it, adds what was in flight and finishes or aborts it,
    so the task's checkpoint code only waits for it (:meth:`ChannelStateWriter.on_complete`).

    An unaligned checkpoint is triggered before its last barrier arrives: it ends here
    when the last one does (its channel state finished) or when it is aborted after all
    (its channel state dropped, and the task told with an abort, as in Flink).
    """

    def __init__(
        self,
        num_channels: int,
        gate: ChannelBlocker,
        actions: BarrierHandlerActions,
        clock: Clock | None = None,
        *,
        end_of_partition_aborts: bool = True,
        timer: Timer | None = None,
        channel_state: ChannelStateWriter | None = None,
    ) -> None:
        super().__init__(num_channels, actions, clock)
        self.gate = gate
        self.end_of_partition_aborts = end_of_partition_aborts
        self.timer = timer
        self.channel_state = channel_state if channel_state is not None else ChannelStateWriter()
        self.state: BarrierHandlerState = WAITING_FOR_FIRST_BARRIER
        self.current_checkpoint_id = -1
        self._received: set[int] = set()
        self._first_barrier_ns = 0
        self._start_delay_ns = 0
        self._bytes_processed = 0
        #: The first barrier (or announcement) of the checkpoint in progress.
        self.current_barrier: CheckpointBarrier | None = None
        self._alignment_timer: Cancellable | None = None
        #: Alignment duration of the last checkpoint: 0 when it was aborted (Flink's task metric).
        self.last_alignment_duration_ns = 0

    @property
    def is_aligning(self) -> bool:
        return self.watch_input and bool(self._received) and self.state is not COLLECTING_BARRIERS_UNALIGNED

    @property
    def is_checkpoint_pending(self) -> bool:
        return self.watch_input

    @property
    def is_unaligned(self) -> bool:
        """The checkpoint in progress went unaligned and collects its in-flight data."""
        return self.state is COLLECTING_BARRIERS_UNALIGNED

    def all_barriers_received(self) -> bool:
        return len(self._received | self.closed_channels) == self.num_channels

    def on_buffer(self, channel: int, size_bytes: int) -> None:
        if self.watch_input:
            self._bytes_processed += size_bytes

    def persist(self, channel: int, payload: bytes) -> None:
        self.channel_state.add_input(self.current_checkpoint_id, channel, [payload])

    # -- events ------------------------------------------------------------

    def process_barrier(self, barrier: CheckpointBarrier, channel: int) -> None:
        if not self._admit(barrier):
            return
        if channel in self._received:
            if self.state is not COLLECTING_BARRIERS_UNALIGNED:  # else: announced, captured at the switch
                log.warning(
                    "second barrier of checkpoint %d on channel %d ignored", barrier.checkpoint_id, channel
                )
            return
        self._received.add(channel)
        self.state = self.state.barrier_received(self, channel, barrier)

    def process_priority_barrier(self, priority: PriorityBarrier, channel: int) -> None:
        """An unaligned barrier (acted on at once) or an announcement (kept in :attr:`announced`
        until the gate took every item before it, then given to :meth:`process_barrier`)."""
        if not self._admit(priority.barrier):
            return
        if channel in self._received:
            log.warning(
                "second barrier of checkpoint %d on channel %d ignored",
                priority.barrier.checkpoint_id,
                channel,
            )
            return
        self.state = self.state.priority_barrier_received(self, channel, priority)

    def _admit(self, barrier: CheckpointBarrier) -> bool:
        """Start the barrier's checkpoint if it is newer (aborting the one in progress);
        False if it belongs to a checkpoint that ended here already."""
        barrier_id = barrier.checkpoint_id
        if barrier_id > self.current_checkpoint_id:
            if self.watch_input:
                log.debug(
                    "checkpoint %d subsumed by barrier %d before alignment completed",
                    self.current_checkpoint_id,
                    barrier_id,
                )
                self._abort(self.current_checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED)
            self._start_alignment(barrier)
            return True
        # obsolete: an older checkpoint, or this one was already triggered or aborted
        return barrier_id == self.current_checkpoint_id and self.watch_input

    def process_cancellation_barrier(self, marker: CancelCheckpointMarker, channel: int) -> None:
        cancelled = marker.checkpoint_id
        self.latest_checkpoint_id = max(self.latest_checkpoint_id, cancelled)
        if cancelled > self.current_checkpoint_id:
            if self.watch_input:
                self._abort(self.current_checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED)
            self.current_checkpoint_id = cancelled
            self.watch_input = True  # so that _abort reports it, once
            self._abort(cancelled, CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)
        elif cancelled == self.current_checkpoint_id and self.watch_input:
            self._abort(cancelled, CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)

    def process_end_of_partition(self, channel: int) -> None:
        self.closed_channels.add(channel)
        if not self.watch_input:
            return
        if self.end_of_partition_aborts:
            self._abort(
                self.current_checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM
            )
        else:
            self.state = self.state.end_of_partition_received(self, channel)

    def on_alignment_timeout(self, checkpoint_id: int) -> None:
        """The alignment timer of ``checkpoint_id`` fired (task thread)."""
        self._alignment_timer = None
        if checkpoint_id == self.current_checkpoint_id and self.watch_input:
            self.state = self.state.alignment_timed_out(self)

    def timed_out(self, barrier: CheckpointBarrier) -> bool:
        """The barrier's aligned checkpoint timeout passed (Flink's ``isTimedOut``)."""
        timeout = barrier.options.aligned_checkpoint_timeout_ms
        return (
            timeout is not None
            and barrier.options.is_timeoutable
            and self.clock.now_ms() - barrier.timestamp >= timeout
        )

    # -- transitions called by the states ----------------------------------

    def _start_alignment(self, barrier: CheckpointBarrier) -> None:
        self.current_checkpoint_id = barrier.checkpoint_id
        self.latest_checkpoint_id = max(self.latest_checkpoint_id, barrier.checkpoint_id)
        self.watch_input = True
        self._received = set()
        self._first_barrier_ns = self.clock.monotonic_ns()
        self._start_delay_ns = max(0, self.clock.now_ms() - barrier.timestamp) * 1_000_000
        self._bytes_processed = 0
        self.current_barrier = barrier
        timeout = barrier.options.aligned_checkpoint_timeout_ms
        if self.timer is not None and timeout is not None and barrier.options.is_timeoutable:
            delay = max(0, timeout - (self.clock.now_ms() - barrier.timestamp))
            checkpoint_id = barrier.checkpoint_id
            self._alignment_timer = self.timer.schedule(
                delay, lambda: self.on_alignment_timeout(checkpoint_id)
            )

    def _end_checkpoint(self) -> None:
        """The checkpoint in progress ended here (triggered aligned, finished or aborted)."""
        self.watch_input = False
        self._received = set()
        if self._alignment_timer is not None:
            self._alignment_timer.cancel()
            self._alignment_timer = None
        if self.announced:
            self.announced.clear()

    def trigger_global_checkpoint(self, barrier: CheckpointBarrier) -> None:
        duration = self.clock.monotonic_ns() - self._first_barrier_ns
        metrics = AlignmentMetrics(duration, self._start_delay_ns, self._bytes_processed)
        self._end_checkpoint()
        self.last_alignment_duration_ns = duration
        self.actions.trigger_checkpoint_on_barrier(barrier, metrics)

    def go_unaligned(self) -> BarrierHandlerState:
        """The checkpoint in progress goes unaligned here (first unaligned barrier, timeout):
        start its channel state, trigger it with unaligned options, take what the known
        barriers overtook, persist the channels whose barrier is not known yet, and release
        the channels the aligned phase blocked."""
        barrier = self.current_barrier
        assert barrier is not None
        checkpoint_id = barrier.checkpoint_id
        if self._alignment_timer is not None:
            self._alignment_timer.cancel()
            self._alignment_timer = None
        self.channel_state.start(checkpoint_id)
        if not barrier.options.is_unaligned:
            barrier = CheckpointBarrier(checkpoint_id, barrier.timestamp, barrier.options.to_unaligned())
        duration = self.clock.monotonic_ns() - self._first_barrier_ns  # until the switch
        self.last_alignment_duration_ns = duration
        self.actions.trigger_checkpoint_on_barrier(
            barrier, AlignmentMetrics(duration, self._start_delay_ns, self._bytes_processed)
        )
        announced, self.announced = self.announced, {}
        for channel in range(self.num_channels):
            if channel in self._received or channel in self.closed_channels:
                continue
            priority = announced.get(channel)
            if priority is None:
                self.persisting.add(channel)
            else:
                self.capture(channel, priority.position)
        self.gate.unblock_all()
        return self.finish_unaligned_if_done(COLLECTING_BARRIERS_UNALIGNED)

    def capture(self, channel: int, position: int) -> None:
        """``channel``'s barrier, at ``position``, is known: what it overtook is in-flight data."""
        self._received.add(channel)
        self.channel_state.add_input(
            self.current_checkpoint_id, channel, self.gate.in_flight_before(channel, position)
        )

    def finish_unaligned_if_done(self, state: BarrierHandlerState) -> BarrierHandlerState:
        """Every open channel delivered its barrier: the channel state is complete."""
        if not self.all_barriers_received():
            return state
        self.persisting.clear()
        self._end_checkpoint()
        self.channel_state.finish_input(self.current_checkpoint_id)
        return WAITING_FOR_FIRST_BARRIER

    def _abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self._end_checkpoint()
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
