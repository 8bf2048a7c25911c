"""CheckpointedInputGate over real in-memory channels: alignment holds records back."""

from __future__ import annotations

from typing import Any

from chandy.messages.checkpoint import CheckpointFailureReason
from chandy.network.barrier_handler import (
    AlignmentMetrics,
    CheckpointBarrierTracker,
    SingleCheckpointBarrierHandler,
)
from chandy.network.channel import LocalChannel
from chandy.network.checkpointed_input_gate import CheckpointedInputGate
from chandy.network.events import END_OF_PARTITION, CancelCheckpointMarker, CheckpointBarrier
from chandy.network.input_gate import InputGate
from chandy.network.wakeup import Wakeup


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
