"""Unaligned checkpoints and the aligned-checkpoint timeout at the barrier handler (issue 16).

The handler's states for Flink's unaligned and alternating (aligned with a timeout) barrier
handling, walked through exact event sequences. Transport-free and deterministic: the test
hands the handler each event itself (an in-order barrier, a priority barrier at a position,
a cancel marker, an end of partition), a :class:`ManualClock` and a :class:`ManualTimer`
give time and the alignment timer, and a :class:`ScriptedGate` stands for the input gate:
it records what the handler blocks and releases and answers ``in_flight_before`` from the
items the test queued on each channel. The channel state is the real
:class:`ChannelStateWriter`, logging each call, so the tests see the exact interleaving of
triggers, aborts, blocks and channel-state calls in one log.

Notation: ``B(n)`` a barrier of checkpoint n taken in order, ``P(n, c, position)`` a priority
barrier (unaligned, or an announcement of an aligned one with a timeout) on channel c.
"""

from __future__ import annotations

from typing import Any

import pytest

from chandy.messages.checkpoint import (
    AlignmentType,
    CheckpointFailureReason,
    CheckpointOptions,
    CheckpointType,
)
from chandy.network.barrier_handler import (
    ALTERNATING_COLLECTING_BARRIERS,
    COLLECTING_BARRIERS,
    COLLECTING_BARRIERS_UNALIGNED,
    WAITING_FOR_FIRST_BARRIER,
    AlignmentMetrics,
    SingleCheckpointBarrierHandler,
)
from chandy.network.channel_state import ChannelStateWriter, InputChannelState
from chandy.network.events import CancelCheckpointMarker, CheckpointBarrier, PriorityBarrier
from chandy.util.clock import ManualClock
from chandy.util.timer import ManualTimer

MS = 1_000_000
START_MS = 1_000_000

ALIGNED = CheckpointOptions()
UNALIGNED = CheckpointOptions(alignment=AlignmentType.UNALIGNED)
SAVEPOINT = CheckpointOptions(
    checkpoint_type=CheckpointType.SAVEPOINT,
    alignment=AlignmentType.FORCED_ALIGNED,
    aligned_checkpoint_timeout_ms=0,  # ignored: a savepoint is never unaligned
)

CANCELLED = CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER
SUBSUMED = CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED
END_OF_STREAM = CheckpointFailureReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM


def timeoutable(timeout_ms: int) -> CheckpointOptions:
    return CheckpointOptions(aligned_checkpoint_timeout_ms=timeout_ms)


def B(
    checkpoint_id: int, options: CheckpointOptions = ALIGNED, timestamp: int = START_MS
) -> CheckpointBarrier:
    return CheckpointBarrier(checkpoint_id, timestamp, options)


def P(
    checkpoint_id: int, position: int, options: CheckpointOptions = UNALIGNED, timestamp: int = START_MS
) -> PriorityBarrier:
    return PriorityBarrier(CheckpointBarrier(checkpoint_id, timestamp, options), position)


# ---------------------------------------------------------------------- harness

Log = list[tuple[Any, ...]]


class ScriptedGate:
    """The gate as the handler sees it: blocks, releases, and the items queued per channel.

    ``queued[c]`` are the items of channel c not taken yet, the first being in-band item
    ``taken[c] + 1``; ``in_flight_before(c, p)`` answers with those numbered up to ``p``.
    """

    def __init__(self, log: Log, num_channels: int) -> None:
        self.log = log
        self.blocked: set[int] = set()
        self.queued: dict[int, list[str]] = {c: [] for c in range(num_channels)}
        self.taken: dict[int, int] = dict.fromkeys(range(num_channels), 0)

    def block_channel(self, index: int) -> None:
        self.log.append(("block", index))
        self.blocked.add(index)

    def unblock_all(self) -> None:
        if self.blocked:
            self.log.append(("unblock", *sorted(self.blocked)))
        self.blocked.clear()

    def in_flight_before(self, channel: int, position: int) -> list[bytes]:
        overtaken = position - self.taken[channel]
        return [item.encode() for item in self.queued[channel][: max(0, overtaken)]]

    def take(self, channel: int) -> str:
        """The task takes the next item of ``channel`` (what the checkpointed gate does)."""
        self.taken[channel] += 1
        return self.queued[channel].pop(0)


class LoggingChannelState(ChannelStateWriter):
    """The real channel state writer; every call is also logged."""

    def __init__(self, log: Log) -> None:
        super().__init__()
        self.log = log
        #: What on_complete gave, per checkpoint: the state, or None when it was dropped.
        self.completed: dict[int, InputChannelState | None] = {}

    def start(self, checkpoint_id: int) -> None:
        self.log.append(("cs.start", checkpoint_id))
        super().start(checkpoint_id)

    def add_input(self, checkpoint_id: int, channel: int, payloads: list[bytes]) -> None:
        self.log.append(("cs.add", checkpoint_id, channel, *payloads))
        super().add_input(checkpoint_id, channel, payloads)

    def finish_input(self, checkpoint_id: int) -> None:
        self.log.append(("cs.finish", checkpoint_id))
        super().finish_input(checkpoint_id)

    def abort(self, checkpoint_id: int) -> None:
        self.log.append(("cs.abort", checkpoint_id))
        super().abort(checkpoint_id)


class Task:
    """The task's side: logs triggers and aborts; an unaligned trigger waits for the channel
    state as the task's checkpoint code does (``on_complete``)."""

    def __init__(self, log: Log, channel_state: LoggingChannelState) -> None:
        self.log = log
        self.channel_state = channel_state
        self.barriers: dict[int, CheckpointBarrier] = {}
        self.metrics: dict[int, AlignmentMetrics] = {}

    def trigger_checkpoint_on_barrier(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        checkpoint_id = barrier.checkpoint_id
        self.log.append(("trigger", checkpoint_id, barrier.options.alignment))
        self.barriers[checkpoint_id] = barrier
        self.metrics[checkpoint_id] = metrics
        if barrier.options.is_unaligned:
            completed = self.channel_state.completed

            def done(state: InputChannelState | None) -> None:
                completed[checkpoint_id] = state

            self.channel_state.on_complete(checkpoint_id, done)

    def abort_checkpoint_on_barrier(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self.log.append(("abort", checkpoint_id, reason))


class Harness:
    def __init__(self, num_channels: int, *, end_of_partition_aborts: bool = True) -> None:
        self.log: Log = []
        self.clock = ManualClock(START_MS)
        self.timer = ManualTimer(self.clock)
        self.gate = ScriptedGate(self.log, num_channels)
        self.channel_state = LoggingChannelState(self.log)
        self.task = Task(self.log, self.channel_state)
        self.handler = SingleCheckpointBarrierHandler(
            num_channels,
            self.gate,
            self.task,
            self.clock,
            end_of_partition_aborts=end_of_partition_aborts,
            timer=self.timer,
            channel_state=self.channel_state,
        )
        self._seen = 0

    def new(self) -> Log:
        """The log entries since the last call."""
        entries = self.log[self._seen :]
        self._seen = len(self.log)
        return entries

    def queue(self, channel: int, *items: str) -> None:
        self.gate.queued[channel].extend(items)

    def take(self, channel: int) -> None:
        """The task takes one data item of ``channel``, as the checkpointed gate would hand it over."""
        item = self.gate.take(channel)
        if channel in self.handler.persisting:
            self.handler.persist(channel, item.encode())

    def barrier(self, channel: int, barrier: CheckpointBarrier) -> Log:
        self.handler.process_barrier(barrier, channel)
        return self.new()

    def priority(self, channel: int, priority: PriorityBarrier) -> Log:
        self.handler.process_priority_barrier(priority, channel)
        return self.new()

    def cancel(self, channel: int, checkpoint_id: int) -> Log:
        self.handler.process_cancellation_barrier(CancelCheckpointMarker(checkpoint_id), channel)
        return self.new()

    def end(self, channel: int) -> Log:
        self.handler.process_end_of_partition(channel)
        return self.new()

    def advance(self, ms: float) -> Log:
        self.timer.advance(ms)
        return self.new()


def trigger(checkpoint_id: int, alignment: AlignmentType = AlignmentType.UNALIGNED) -> tuple[Any, ...]:
    return ("trigger", checkpoint_id, alignment)


def abort(checkpoint_id: int, reason: CheckpointFailureReason = CANCELLED) -> tuple[Any, ...]:
    return ("abort", checkpoint_id, reason)


def state_of(h: Harness, checkpoint_id: int) -> dict[int, list[bytes]]:
    state = h.channel_state.completed[checkpoint_id]
    assert state is not None, f"checkpoint {checkpoint_id}'s channel state was dropped"
    return {c: payloads for c, payloads in state.per_channel.items() if payloads}


# ---------------------------------------------------------------------- unaligned from the first barrier


def test_first_unaligned_barrier_triggers_at_once_and_captures_what_it_overtook() -> None:
    h = Harness(3)
    h.queue(1, "b1", "b2", "b3 (after the barrier)")
    h.clock.advance_ms(7)  # the barrier is 7 ms old when it arrives
    assert h.priority(1, P(1, position=2)) == [
        ("cs.start", 1),
        trigger(1),
        ("cs.add", 1, 1, b"b1", b"b2"),
    ]
    assert h.task.barriers[1].options == UNALIGNED
    assert h.task.metrics[1] == AlignmentMetrics(0, 7 * MS, 0)
    assert h.handler.state is COLLECTING_BARRIERS_UNALIGNED
    assert h.handler.is_checkpoint_pending and h.handler.is_unaligned and not h.handler.is_aligning
    assert h.handler.persisting == {0, 2}  # their barriers are not known yet
    assert h.gate.blocked == set()
    assert 1 not in h.channel_state.completed, "the acknowledgement waits for the channel state"


def test_other_channels_persist_what_the_task_takes_until_their_barrier() -> None:
    h = Harness(3)
    h.queue(0, "a1", "a2", "a3", "a4 (after)")
    h.queue(1, "b1")
    h.queue(2, "c1", "c2 (after)")
    h.priority(1, P(1, position=1))
    h.take(0)  # taken after the snapshot, sent before the barrier: in-flight data
    h.take(2)
    h.take(1)  # channel 1's barrier is known: b1 was captured already, not persisted again
    assert h.new() == [("cs.add", 1, 0, b"a1"), ("cs.add", 1, 2, b"c1")]
    assert h.priority(0, P(1, position=3)) == [("cs.add", 1, 0, b"a2", b"a3")]
    assert h.handler.persisting == {2}
    h.take(0)  # a2: in the state already, not twice
    assert h.new() == []
    assert h.priority(2, P(1, position=1)) == [("cs.add", 1, 2), ("cs.finish", 1)]
    assert h.handler.state is WAITING_FOR_FIRST_BARRIER
    assert not h.handler.is_checkpoint_pending and h.handler.persisting == set()
    assert state_of(h, 1) == {0: [b"a1", b"a2", b"a3"], 1: [b"b1"], 2: [b"c1"]}
    assert [e[0] for e in h.log].count("trigger") == 1


def test_a_single_channel_finishes_the_channel_state_at_once() -> None:
    h = Harness(1)
    h.queue(0, "x1", "x2")
    assert h.priority(0, P(4, position=2)) == [
        ("cs.start", 4),
        trigger(4),
        ("cs.add", 4, 0, b"x1", b"x2"),
        ("cs.finish", 4),
    ]
    assert state_of(h, 4) == {0: [b"x1", b"x2"]}
    assert h.handler.state is WAITING_FOR_FIRST_BARRIER


def test_end_of_partition_completes_the_channel_state_when_it_does_not_abort() -> None:
    h = Harness(2, end_of_partition_aborts=False)
    h.queue(1, "b1")
    h.priority(0, P(1, position=0))
    h.take(1)
    assert h.new()[-1] == ("cs.add", 1, 1, b"b1")
    assert h.end(1) == [("cs.finish", 1)]
    assert state_of(h, 1) == {1: [b"b1"]}


def test_an_in_order_unaligned_barrier_overtook_nothing() -> None:
    h = Harness(2)
    assert h.barrier(0, B(1, UNALIGNED)) == [("cs.start", 1), trigger(1)]
    assert h.handler.persisting == {1}
    assert h.barrier(1, B(1, UNALIGNED)) == [("cs.finish", 1)]
    assert state_of(h, 1) == {}


# ---------------------------------------------------------------------- aborts drop the channel state


@pytest.mark.parametrize("how", ["cancel marker", "newer barrier", "end of partition"])
def test_an_abort_after_the_trigger_drops_the_channel_state(how: str) -> None:
    h = Harness(3)
    h.queue(0, "a1")
    h.queue(2, "c1")
    h.priority(0, P(1, position=1))
    h.take(2)
    h.new()
    if how == "cancel marker":
        assert h.cancel(1, 1) == [("cs.abort", 1), abort(1)]
    elif how == "newer barrier":
        assert h.priority(1, P(2, position=0)) == [
            ("cs.abort", 1),
            abort(1, SUBSUMED),
            ("cs.start", 2),
            trigger(2),
            ("cs.add", 2, 1),
        ]
        assert h.handler.persisting == {0, 2}
    else:
        assert h.end(1) == [("cs.abort", 1), abort(1, END_OF_STREAM)]
        assert h.handler.state is WAITING_FOR_FIRST_BARRIER
        assert h.handler.persisting == set()
    assert h.channel_state.completed[1] is None, "the task's snapshot is dropped"
    # a late barrier of the aborted checkpoint changes nothing
    assert h.priority(2, P(1, position=1)) == []


def test_cancel_marker_before_any_barrier_starts_no_channel_state() -> None:
    h = Harness(2)
    assert h.cancel(0, 3) == [abort(3)]
    assert h.priority(1, P(3, position=0)) == []  # its barrier comes late: obsolete
    assert h.channel_state.checkpoint_id is None


# ---------------------------------------------------------------------- aligned with a timeout


def test_announced_barriers_align_in_order_when_the_timeout_does_not_pass() -> None:
    h = Harness(2)
    options = timeoutable(100)
    assert h.priority(0, P(1, position=2, options=options)) == []
    assert h.handler.state is ALTERNATING_COLLECTING_BARRIERS
    assert set(h.handler.announced) == {0}  # the gate hands it back once reached
    assert [entry.due_ms for entry in h.timer.pending()] == [START_MS + 100]
    assert h.barrier(0, B(1, options)) == [("block", 0)]  # reached: an in-order aligned barrier
    assert h.handler.announced == {}
    h.clock.advance_ms(30)
    assert h.priority(1, P(1, position=5, options=options)) == []
    assert h.barrier(1, B(1, options)) == [("unblock", 0), trigger(1, AlignmentType.ALIGNED)]
    assert h.task.barriers[1].options == options  # forwarded as is: still aligned downstream
    assert h.task.metrics[1].alignment_duration_ns == 30 * MS
    assert h.timer.pending() == [], "the alignment timer is cancelled when the checkpoint completes"
    assert h.advance(1_000) == []
    assert h.channel_state.checkpoint_id is None and h.channel_state.completed == {}


def test_the_timer_switches_to_unaligned_mid_alignment() -> None:
    h = Harness(3)
    options = timeoutable(10)
    created = START_MS - 3  # the barrier is 3 ms old when it arrives: 7 ms are left
    h.queue(1, "b1", "b2", "b3", "b4 (after)")
    h.queue(2, "c1", "c2")
    assert h.barrier(0, B(1, options, created)) == [("block", 0)]
    assert [entry.due_ms for entry in h.timer.pending()] == [START_MS + 7]
    h.clock.advance_ms(2)
    assert h.priority(1, P(1, position=3, options=options, timestamp=created)) == []
    h.take(1)  # b1 is taken while aligned: processed before the snapshot, not in-flight data
    h.take(2)
    assert h.new() == []
    assert h.advance(4) == []  # 6 of 7 ms
    assert h.advance(1) == [
        ("cs.start", 1),
        trigger(1),
        ("cs.add", 1, 1, b"b2", b"b3"),  # the announced channel: what its barrier will overtake
        ("unblock", 0),
    ]
    assert h.task.barriers[1].options == options.to_unaligned()
    assert h.task.metrics[1].alignment_duration_ns == 7 * MS  # from the first barrier to the switch
    assert h.task.metrics[1].checkpoint_start_delay_ns == 3 * MS
    assert h.handler.persisting == {2}
    assert h.handler.announced == {}  # captured: the gate hands nothing back in order
    # the announced channel's barrier, if the gate still hands it back in order: ignored
    assert h.barrier(1, B(1, options, created)) == []
    h.take(2)
    assert h.new() == [("cs.add", 1, 2, b"c2")]
    assert h.priority(2, P(1, position=3, options=options.to_unaligned(), timestamp=created)) == [
        ("cs.add", 1, 2),
        ("cs.finish", 1),
    ]
    assert state_of(h, 1) == {1: [b"b2", b"b3"], 2: [b"c2"]}
    assert [e for e in h.log if e[0] in ("trigger", "abort")] == [trigger(1)]


def test_an_announcement_after_the_switch_is_captured_at_once() -> None:
    h = Harness(2)
    options = timeoutable(5)
    h.queue(1, "b1", "b2")
    h.barrier(0, B(1, options))
    h.advance(5)
    assert h.handler.persisting == {1}
    # channel 1's upstream is still aligned: its barrier comes as an announcement
    assert h.priority(1, P(1, position=2, options=options)) == [
        ("cs.add", 1, 1, b"b1", b"b2"),
        ("cs.finish", 1),
    ]
    assert h.handler.announced == {}


def test_timeout_zero_switches_at_the_first_announcement() -> None:
    h = Harness(2)
    h.queue(0, "a1")
    assert h.priority(0, P(1, position=1, options=timeoutable(0))) == [
        ("cs.start", 1),
        trigger(1),
        ("cs.add", 1, 0, b"a1"),
    ]
    assert h.task.metrics[1].alignment_duration_ns == 0
    assert h.handler.persisting == {1}
    assert h.timer.pending() == []


def test_a_timeout_passed_before_the_first_barrier_switches_at_once() -> None:
    h = Harness(2)
    options = timeoutable(20)
    created = START_MS - 25  # triggered 25 ms ago: the timeout passed on the way
    assert h.barrier(1, B(1, options, created)) == [("block", 1), ("cs.start", 1), trigger(1), ("unblock", 1)]
    assert h.task.metrics[1] == AlignmentMetrics(0, 25 * MS, 0)
    assert h.handler.persisting == {0}


def test_a_timeout_noticed_by_a_barrier_before_the_timer_ran() -> None:
    h = Harness(3)
    options = timeoutable(10)
    h.barrier(0, B(1, options))
    h.clock.advance_ms(10)  # the timer is due but has not run yet
    assert h.barrier(1, B(1, options)) == [("block", 1), ("cs.start", 1), trigger(1), ("unblock", 0, 1)]
    assert h.timer.pending() == []
    assert h.advance(100) == []  # cancelled: no second switch


def test_the_alignment_timer_is_cancelled_by_an_abort_and_a_stale_one_does_nothing() -> None:
    h = Harness(2)
    h.barrier(0, B(1, timeoutable(10)))
    assert h.cancel(1, 1) == [("unblock", 0), abort(1)]
    assert h.timer.pending() == []
    # a timer that fires for a checkpoint no longer in progress is ignored
    h.barrier(0, B(2, timeoutable(10)))
    h.handler.on_alignment_timeout(1)
    assert h.new() == []
    assert h.handler.state is ALTERNATING_COLLECTING_BARRIERS


def test_an_unaligned_barrier_during_aligned_collecting_switches_at_once() -> None:
    h = Harness(3)
    h.queue(2, "c1", "c2")
    assert h.barrier(0, B(1, ALIGNED)) == [("block", 0)]
    assert h.handler.state is COLLECTING_BARRIERS
    h.clock.advance_ms(4)
    # channel 2's upstream timed out and forwarded the barrier unaligned
    assert h.priority(2, P(1, position=1)) == [
        ("cs.start", 1),
        trigger(1),
        ("cs.add", 1, 2, b"c1"),
        ("unblock", 0),
    ]
    assert h.task.barriers[1].options == UNALIGNED
    assert h.task.metrics[1].alignment_duration_ns == 4 * MS
    assert h.handler.persisting == {1}
    assert h.barrier(1, B(1, ALIGNED)) == [("cs.finish", 1)]
    assert state_of(h, 1) == {2: [b"c1"]}


def test_a_savepoint_stays_aligned_whatever_the_timeout() -> None:
    h = Harness(2)
    h.queue(1, "b1")
    assert h.barrier(0, B(1, SAVEPOINT, START_MS - 1_000)) == [("block", 0)]
    assert h.timer.pending() == [], "no alignment timer for a savepoint"
    assert h.advance(60_000) == []
    assert h.handler.state is COLLECTING_BARRIERS and h.gate.blocked == {0}
    h.take(1)
    assert h.barrier(1, B(1, SAVEPOINT, START_MS - 1_000)) == [
        ("block", 1),
        ("unblock", 0, 1),
        trigger(1, AlignmentType.FORCED_ALIGNED),
    ]
    assert h.handler.persisting == set()
    assert h.channel_state.completed == {} and ("cs.start", 1) not in h.log


def test_a_plain_aligned_checkpoint_schedules_no_timer() -> None:
    h = Harness(2)
    h.barrier(0, B(1))
    assert h.timer.pending() == []
    assert h.handler.announced == {} and h.handler.persisting == set()
    h.barrier(1, B(1))
    assert [e for e in h.log if e[0] == "trigger"] == [trigger(1, AlignmentType.ALIGNED)]


def test_an_at_least_once_tracker_refuses_priority_barriers() -> None:
    from chandy.network.barrier_handler import CheckpointBarrierTracker

    tracker = CheckpointBarrierTracker(2, Task([], LoggingChannelState([])))
    with pytest.raises(RuntimeError, match="EXACTLY_ONCE"):
        tracker.process_priority_barrier(P(1, position=0), 0)
