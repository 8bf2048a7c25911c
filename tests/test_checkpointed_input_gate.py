"""CheckpointedInputGate over real in-memory channels: alignment holds records back."""

from __future__ import annotations

import pickle
from typing import Any

from chandy.messages.checkpoint import AlignmentType, CheckpointFailureReason, CheckpointOptions
from chandy.network.barrier_handler import (
    AlignmentMetrics,
    CheckpointBarrierTracker,
    SingleCheckpointBarrierHandler,
)
from chandy.network.channel import LocalChannel
from chandy.network.channel_state import ChannelStateWriter, InputChannelState
from chandy.network.checkpointed_input_gate import CheckpointedInputGate
from chandy.network.events import (
    END_OF_DATA,
    END_OF_PARTITION,
    CancelCheckpointMarker,
    CheckpointBarrier,
    Watermark,
    WatermarkStatus,
)
from chandy.network.input_gate import InputGate
from chandy.network.wakeup import Wakeup
from chandy.util.clock import ManualClock
from chandy.util.timer import ManualTimer
from tests.test_barrier_handlers_randomized import LoggingChannel


class Actions:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def trigger_checkpoint_on_barrier(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        self.events.append(("trigger", barrier.checkpoint_id, metrics))

    def abort_checkpoint_on_barrier(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self.events.append(("abort", checkpoint_id, reason))


def drain(gate: CheckpointedInputGate) -> list[Any]:
    out = []
    while (polled := gate.poll_next()) is not None:
        out.append(polled[1])
    return out


def aligned(n: int) -> tuple[list[LocalChannel], CheckpointedInputGate, Actions]:
    channels = [LocalChannel(16) for _ in range(n)]
    gate = InputGate(channels, Wakeup())
    actions = Actions()
    handler = SingleCheckpointBarrierHandler(n, gate, actions)
    return channels, CheckpointedInputGate(gate, handler), actions


def test_records_after_a_barrier_wait_until_every_channel_delivered_it() -> None:
    channels, gate, actions = aligned(2)
    channels[0].send(["a1"])
    channels[0].send(CheckpointBarrier(1, 0))
    channels[0].send(["a2 (after the barrier)"])
    channels[1].send(["b1"])
    assert drain(gate) == [["a1"], ["b1"]]  # a2 is held back: channel 0 is blocked
    assert actions.events == []
    channels[1].send(["b2"])
    assert drain(gate) == [["b2"]]
    channels[1].send(CheckpointBarrier(1, 0))
    out = drain(gate)
    assert [e[:2] for e in actions.events] == [("trigger", 1)]
    assert out == [["a2 (after the barrier)"]]  # released after the snapshot was triggered
    assert actions.events[0][2].bytes_processed_during_alignment > 0  # b2 was read meanwhile


def test_the_last_end_of_data_returns_to_the_task_before_the_barrier_behind_it() -> None:
    """The final checkpoint's barrier follows the end of data on every channel. The gate must
    hand the end of the input to the task first (it returns ``None`` with is_end_of_data), so
    the task finishes its operators before the barrier triggers its snapshot: that snapshot is
    its final checkpoint, covering what the operators did while finishing."""
    channels, gate, actions = aligned(2)
    channels[0].send(["a"])
    channels[0].send(END_OF_DATA)
    channels[0].send(CheckpointBarrier(4, 0))
    channels[1].send(["b"])
    channels[1].send(END_OF_DATA)
    channels[1].send(CheckpointBarrier(4, 0))
    assert drain(gate) == [["a"], ["b"]]
    assert gate.is_end_of_data() and not gate.is_finished()
    assert actions.events == []  # not yet: the task ends its input first
    assert gate.poll_next() is None
    assert [e[:2] for e in actions.events] == [("trigger", 4)]  # the barrier is still taken
    channels[0].send(END_OF_PARTITION)
    channels[1].send(END_OF_PARTITION)
    assert drain(gate) == []
    assert gate.is_finished()


def test_an_end_of_partition_ends_the_data_of_a_channel_without_an_end_of_data() -> None:
    channels, gate, _ = aligned(2)
    channels[0].send(END_OF_DATA)
    assert drain(gate) == [] and not gate.is_end_of_data()
    channels[1].send(END_OF_PARTITION)
    assert drain(gate) == [] and gate.is_end_of_data()
    channels[0].send(END_OF_PARTITION)
    assert drain(gate) == [] and gate.is_finished()


def test_cancel_markers_abort_and_end_of_partition_finishes() -> None:
    channels, gate, actions = aligned(2)
    channels[0].send(CheckpointBarrier(3, 0))
    channels[1].send(CancelCheckpointMarker(3))
    channels[0].send(["x"])
    assert drain(gate) == [["x"]]  # the abort released the blocked channel
    reason = CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER
    assert actions.events == [("abort", 3, reason)]
    channels[0].send(END_OF_PARTITION)
    channels[1].send(END_OF_PARTITION)
    assert drain(gate) == [] and gate.is_finished()


def test_at_least_once_tracking_never_holds_records_back() -> None:
    channels = [LocalChannel(16) for _ in range(2)]
    gate_in = InputGate(channels, Wakeup())
    actions = Actions()
    gate = CheckpointedInputGate(gate_in, CheckpointBarrierTracker(2, actions))
    channels[0].send(CheckpointBarrier(1, 0))
    channels[0].send(["after the barrier"])
    assert drain(gate) == [["after the barrier"]]
    channels[1].send(CheckpointBarrier(1, 0))
    drain(gate)
    assert [e[:2] for e in actions.events] == [("trigger", 1)]


# ---------------------------------------------------------------------- priority barriers (issue 16)


class StateActions(Actions):
    """The task: logs into the shared log and collects an unaligned checkpoint's channel state."""

    def __init__(self, log: list[Any], channel_state: ChannelStateWriter) -> None:
        super().__init__()
        self.events = log
        self.channel_state = channel_state
        self.options: dict[int, CheckpointOptions] = {}
        self.states: dict[int, InputChannelState | None] = {}

    def trigger_checkpoint_on_barrier(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        super().trigger_checkpoint_on_barrier(barrier, metrics)
        checkpoint_id = barrier.checkpoint_id
        self.options[checkpoint_id] = barrier.options
        if barrier.options.is_unaligned:
            self.channel_state.on_complete(
                checkpoint_id, lambda state: self.states.__setitem__(checkpoint_id, state)
            )


def unaligned_setup(
    n: int, timer: ManualTimer | None = None
) -> tuple[list[LoggingChannel], CheckpointedInputGate, StateActions, list[Any]]:
    log: list[Any] = []
    channels = [LoggingChannel(i, log) for i in range(n)]
    gate = InputGate(channels, Wakeup())
    channel_state = ChannelStateWriter()
    actions = StateActions(log, channel_state)
    clock = timer.clock if timer is not None else ManualClock(0)
    handler = SingleCheckpointBarrierHandler(
        n, gate, actions, clock, timer=timer, channel_state=channel_state
    )
    return channels, CheckpointedInputGate(gate, handler), actions, log


def decoded(state: InputChannelState | None) -> dict[int, list[Any]]:
    assert state is not None, "the channel state was dropped"
    return {c: [pickle.loads(p) for p in payloads] for c, payloads in state.per_channel.items() if payloads}


UNALIGNED_OPTIONS = CheckpointOptions(alignment=AlignmentType.UNALIGNED)


def test_an_unaligned_barrier_overtakes_the_queued_data_which_becomes_channel_state() -> None:
    channels, gate, actions, log = unaligned_setup(2)
    channels[0].send(["a1"])
    channels[0].send(["a2"])
    channels[0].send_priority(CheckpointBarrier(1, 0, UNALIGNED_OPTIONS))
    channels[0].send(["a3 (after the barrier)"])
    channels[1].send(["b1"])
    channels[1].send(Watermark(5))
    # the barrier is handled before any item is read: the snapshot precedes a1, a2
    assert gate.poll_next() == (0, ["a1"])
    assert [e[:2] for e in log] == [("priority", 0), ("trigger", 1), ("read", 0)]
    assert actions.options[1] == UNALIGNED_OPTIONS
    assert drain(gate) == [["b1"], ["a2"], ["a3 (after the barrier)"]]  # nothing is blocked
    assert gate.handler.persisting == {1}
    channels[1].send(["b2"])
    channels[1].send_priority(CheckpointBarrier(1, 0, UNALIGNED_OPTIONS))  # overtakes b2
    channels[1].send(["b3 (after the barrier)"])
    assert drain(gate) == [["b2"], ["b3 (after the barrier)"]]
    # a1, a2 were queued when channel 0's barrier came; b1 and the watermark were taken from
    # channel 1 after the snapshot and before its barrier; b2 was queued when that came
    assert decoded(actions.states[1]) == {0: [["a1"], ["a2"]], 1: [["b1"], Watermark(5), ["b2"]]}
    assert not gate.handler.watch_input and gate.handler.persisting == set()


def test_an_announced_barrier_aligns_in_order_after_the_items_before_it() -> None:
    timer = ManualTimer(ManualClock(0))
    channels, gate, actions, log = unaligned_setup(2, timer)
    options = CheckpointOptions(aligned_checkpoint_timeout_ms=1_000)
    channels[0].send(["a1"])
    channels[0].send(["a2"])
    channels[0].send_priority(CheckpointBarrier(1, 0, options))
    channels[0].send(["a3 (after the barrier)"])
    channels[1].send(["b1"])
    # a2 is channel 0's last item before the barrier: the barrier is processed after the
    # task got a2 and before a3, blocking channel 0 (aligned)
    assert drain(gate) == [["a1"], ["b1"], ["a2"]]
    assert gate.gate.blocked_channels() == {0}
    assert [e for e in log if e[0] in ("trigger", "abort")] == []
    # channel 1's announcement comes with nothing before it left to read: processed at once
    channels[1].send_priority(CheckpointBarrier(1, 0, options))
    assert gate.has_priority_event
    gate.process_priority_events()  # e.g. by a task backpressured on its output
    assert [e[:2] for e in log if e[0] in ("trigger", "abort")] == [("trigger", 1)]
    assert actions.options[1] == options  # aligned: no channel state
    assert 1 not in actions.states
    assert drain(gate) == [["a3 (after the barrier)"]]
    assert timer.pending() == []


def test_the_alignment_timeout_switches_and_persists_what_is_read_until_the_last_barrier() -> None:
    timer = ManualTimer(ManualClock(0))
    channels, gate, actions, log = unaligned_setup(3, timer)
    options = CheckpointOptions(aligned_checkpoint_timeout_ms=10)
    channels[0].send(CheckpointBarrier(1, 0, options))  # in order, as a reached announcement is
    channels[0].send(["a1 (after the barrier)"])
    channels[1].send(["b1"])
    channels[1].send(["b2"])
    channels[1].send_priority(CheckpointBarrier(1, 0, options))
    channels[2].send(["c1"])
    assert gate.poll_next() == (1, ["b1"])  # channel 0's barrier blocked channel 0
    assert gate.gate.blocked_channels() == {0}
    timer.advance(10)  # fires on the task thread between two reads
    assert [e[:2] for e in log if e[0] == "trigger"] == [("trigger", 1)]
    assert actions.options[1] == options.to_unaligned()
    assert gate.gate.blocked_channels() == set()
    assert drain(gate) == [["c1"], ["a1 (after the barrier)"], ["b2"]]
    channels[2].send(WatermarkStatus(True))
    channels[2].send_priority(CheckpointBarrier(1, 0, options.to_unaligned()))
    assert drain(gate) == []
    # b2 was overtaken by the announced barrier at the switch; c1 and the status were read
    # from channel 2 after it, before its barrier
    assert decoded(actions.states[1]) == {1: [["b2"]], 2: [["c1"], WatermarkStatus(True)]}
    assert [e[0] for e in log].count("trigger") == 1 and "abort" not in [e[0] for e in log]


class RacingChannel(LoggingChannel):
    """A channel whose producer, on another thread, sends a barrier and then an item just as
    the task looks: the item arrives after the barrier, between the task's look for priority
    barriers and its poll (simulated by doing both inside the poll)."""

    __slots__ = ("race",)

    def __init__(self, index: int, log: list[Any]) -> None:
        super().__init__(index, log)
        self.race: tuple[list[CheckpointBarrier], list[Any]] | None = None

    def poll(self) -> Any:
        if self.race is not None:
            barriers, after = self.race
            self.race = None
            for barrier in barriers:
                self.send_priority(barrier)
            if after:
                self.send(after)
        return super().poll()


def three_channels_one_racing() -> tuple[
    list[Any],
    RacingChannel,
    list[LoggingChannel],
    StateActions,
    SingleCheckpointBarrierHandler,
    CheckpointedInputGate,
]:
    """Three channels, the middle one racing its priority barriers against the task's takes."""
    log: list[Any] = []
    racing = RacingChannel(1, log)
    channels = [LoggingChannel(0, log), racing, LoggingChannel(2, log)]
    gate_in = InputGate(channels, Wakeup())
    channel_state = ChannelStateWriter()
    actions = StateActions(log, channel_state)
    handler = SingleCheckpointBarrierHandler(3, gate_in, actions, ManualClock(0), channel_state=channel_state)
    return log, racing, channels, actions, handler, CheckpointedInputGate(gate_in, handler)


def test_an_item_that_arrived_after_its_barrier_is_not_persisted() -> None:
    _log, racing, channels, actions, handler, gate = three_channels_one_racing()
    channels[0].send_priority(CheckpointBarrier(1, 0, UNALIGNED_OPTIONS))
    assert gate.poll_next() is None  # the snapshot: channels 1 and 2 persist from now on
    racing.send(["b1"])
    assert gate.poll_next() == (1, ["b1"])  # taken after the snapshot, before channel 1's barrier
    assert handler.persisting == {1, 2}
    racing.race = ([CheckpointBarrier(1, 0, UNALIGNED_OPTIONS)], ["b2 (after the barrier)"])
    assert drain(gate) == [["b2 (after the barrier)"]]
    assert handler.persisting == {2}
    channels[2].send_priority(CheckpointBarrier(1, 0, UNALIGNED_OPTIONS))
    assert drain(gate) == []
    assert decoded(actions.states[1]) == {1: [["b1"]]}


def test_recovered_items_not_yet_replayed_belong_to_the_next_unaligned_checkpoint() -> None:
    channels, gate, actions, _ = unaligned_setup(3)
    recovered = [pickle.dumps(["r1"]), pickle.dumps(Watermark(3)), pickle.dumps(["r2"])]
    gate.gate.add_recovered(1, recovered)
    channels[0].send_priority(CheckpointBarrier(1, 0, UNALIGNED_OPTIONS))
    gate.process_priority_events()  # the snapshot, before anything more is read
    assert gate.poll_next() == (1, ["r1"])  # replayed after the snapshot: persisted as recovered
    # channel 1's barrier comes before any live item: it overtakes only the recovered ones left
    channels[1].send_priority(CheckpointBarrier(1, 0, UNALIGNED_OPTIONS))
    channels[1].send(["b1 (live, after the barrier)"])
    channels[2].send_priority(CheckpointBarrier(1, 0, UNALIGNED_OPTIONS))
    assert drain(gate) == [["r2"], ["b1 (live, after the barrier)"]]
    state = actions.states[1]
    assert state is not None and state.per_channel[1] == recovered  # the same bytes, in order
    assert decoded(state) == {1: [["r1"], Watermark(3), ["r2"]]}


def test_an_announcement_is_not_reached_while_recovered_items_remain() -> None:
    channels, gate, actions, log = unaligned_setup(2, ManualTimer(ManualClock(0)))
    options = CheckpointOptions(aligned_checkpoint_timeout_ms=1_000)
    gate.gate.add_recovered(0, [pickle.dumps(["r1"]), pickle.dumps(["r2"])])
    channels[0].send_priority(CheckpointBarrier(1, 0, options))  # position 0, behind the recovered items
    channels[0].send(["a1 (after the barrier)"])
    channels[1].send(["b1"])
    assert drain(gate) == [["r1"], ["b1"], ["r2"]]  # then channel 0's barrier: it is blocked
    assert gate.gate.blocked_channels() == {0}
    channels[1].send_priority(CheckpointBarrier(1, 0, options))
    assert drain(gate) == [["a1 (after the barrier)"]]
    assert [e[:2] for e in log if e[0] in ("trigger", "abort")] == [("trigger", 1)]
    assert actions.options[1] == options


def test_a_snapshot_never_falls_between_taking_an_item_and_handing_it_over() -> None:
    """Barriers of two checkpoints reach a channel an unaligned checkpoint persists just as the
    task takes its last item before them: that item goes to the older checkpoint's channel
    state and is handed over before the newer checkpoint's snapshot, which must not miss it."""
    _log, racing, channels, actions, handler, gate = three_channels_one_racing()
    channels[0].send_priority(CheckpointBarrier(1, 0, UNALIGNED_OPTIONS))
    assert gate.poll_next() is None
    assert handler.persisting == {1, 2}
    racing.send(["b1"])
    # b1 is before both barriers
    racing.race = (
        [CheckpointBarrier(1, 0, UNALIGNED_OPTIONS), CheckpointBarrier(2, 0, UNALIGNED_OPTIONS)],
        [],
    )

    assert gate.poll_next() == (1, ["b1"])
    assert 2 not in actions.options, "checkpoint 2's snapshot waits until the task got b1"
    channels[0].send_priority(CheckpointBarrier(2, 0, UNALIGNED_OPTIONS))
    channels[2].send_priority(CheckpointBarrier(2, 0, UNALIGNED_OPTIONS))
    assert drain(gate) == []
    assert actions.states[1] is None  # subsumed by checkpoint 2
    assert decoded(actions.states[2]) == {}  # b1 is in the snapshot: the task had it


def racing_setup(n: int) -> tuple[list[LoggingChannel], RacingChannel, CheckpointedInputGate, StateActions]:
    """Channel 1 of ``n`` races (:class:`RacingChannel`); an alignment timeout of a minute."""
    log: list[Any] = []
    racing = RacingChannel(1, log)
    channels = [racing if i == 1 else LoggingChannel(i, log) for i in range(n)]
    gate_in = InputGate(channels, Wakeup())
    channel_state = ChannelStateWriter()
    actions = StateActions(log, channel_state)
    timer = ManualTimer(ManualClock(0))
    handler = SingleCheckpointBarrierHandler(
        n, gate_in, actions, timer.clock, timer=timer, channel_state=channel_state
    )
    return channels, racing, CheckpointedInputGate(gate_in, handler), actions


def test_an_unaligned_barrier_that_came_before_the_item_just_taken_is_handled_before_it() -> None:
    channels, racing, gate, actions = racing_setup(2)
    racing.race = ([CheckpointBarrier(1, 0, UNALIGNED_OPTIONS)], ["b1 (after the barrier)"])
    assert gate.poll_next() == (1, ["b1 (after the barrier)"])
    assert actions.options[1] == UNALIGNED_OPTIONS, "the snapshot comes before b1"
    channels[0].send_priority(CheckpointBarrier(1, 0, UNALIGNED_OPTIONS))
    assert drain(gate) == []
    assert decoded(actions.states[1]) == {}


def test_an_announcement_that_came_before_the_item_just_taken_goes_unaligned_at_once() -> None:
    """The item after an announced barrier was taken already and cannot wait behind a blocked
    channel: the checkpoint goes unaligned, its snapshot before that item."""
    channels, racing, gate, actions = racing_setup(2)
    options = CheckpointOptions(aligned_checkpoint_timeout_ms=60_000)
    channels[0].send(["a1"])
    racing.race = ([CheckpointBarrier(1, 0, options)], ["b1 (after the barrier)"])
    assert drain(gate) == [["a1"], ["b1 (after the barrier)"]]
    assert actions.options[1] == options.to_unaligned()
    assert gate.handler.persisting == {0}
    channels[0].send(["a2"])
    channels[0].send_priority(CheckpointBarrier(1, 0, options))
    assert drain(gate) == [["a2"]]
    assert decoded(actions.states[1]) == {0: [["a2"]]}


def test_a_backpressured_task_completes_an_alignment_that_its_last_item_reached() -> None:
    """The item just handed to the task was the last before its channel's announced barrier;
    the task then reads nothing (its output is backpressured). The reached barrier must still
    be processed, completing the alignment, instead of waiting for the output to clear or for
    the (here 60 s) timeout to send the checkpoint unaligned."""
    timer = ManualTimer(ManualClock(0))
    channels, gate, actions, log = unaligned_setup(2, timer)
    options = CheckpointOptions(aligned_checkpoint_timeout_ms=60_000)
    channels[1].send_priority(CheckpointBarrier(1, 0, options))  # nothing before it: aligned at once
    channels[0].send(["a1"])
    channels[0].send_priority(CheckpointBarrier(1, 0, options))
    assert gate.poll_next() == (0, ["a1"])
    assert [e for e in log if e[0] in ("trigger", "abort")] == []
    assert gate.has_priority_event
    gate.process_priority_events()
    assert [e[:2] for e in log if e[0] in ("trigger", "abort")] == [("trigger", 1)]
    assert actions.options[1] == options  # aligned: nothing persisted
    assert 1 not in actions.states
    assert gate.gate.blocked_channels() == set()
