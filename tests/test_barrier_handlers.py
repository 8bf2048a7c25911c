"""Barrier handlers reproduce Flink's scenarios A1 (aligned) and A3 (at-least-once tracking).

Restated from Flink's ``AlignedCheckpointsTest`` and ``CheckpointBarrierTrackerTest``
(scenario numbers S1-S24 name their cases). Transport-free and deterministic: a
:class:`SequenceGate` holds the input items and never returns an item of a blocked
channel (Flink's current aligned handling: a blocked channel is simply not read), a
:class:`Driver` feeds what it reads to the handler one item at a time, and a
:class:`ManualClock` moves 1 ms before every item unless a test says otherwise.

Notation as in the spec: ``D(c)`` data buffer, ``B(n, c)`` barrier, ``X(n, c)`` cancel
marker, ``E(c)`` end of partition.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from chandy.messages.checkpoint import CheckpointFailureReason
from chandy.network.barrier_handler import (
    COLLECTING_BARRIERS,
    MAX_CHECKPOINTS_TO_TRACK,
    WAITING_FOR_FIRST_BARRIER,
    AlignmentMetrics,
    CheckpointBarrierHandler,
    CheckpointBarrierTracker,
    SingleCheckpointBarrierHandler,
)
from chandy.network.events import (
    END_OF_PARTITION,
    CancelCheckpointMarker,
    CheckpointBarrier,
    EndOfPartition,
    RuntimeEvent,
)
from chandy.util.clock import ManualClock

MS = 1_000_000  # nanoseconds per millisecond
START_MS = 1_000_000  # where every test's clock starts; barriers are created at this time by default

CANCELLED = CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER
SUBSUMED = CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED
END_OF_STREAM = CheckpointFailureReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM

# ---------------------------------------------------------------------- items

#: ("D", channel, size_bytes) is a data buffer; (event, channel) a barrier, cancel marker or end.
DataItem = tuple[str, int, int]
EventItem = tuple[RuntimeEvent, int]
Item = DataItem | EventItem

#: ("trigger", id) or ("abort", id, reason), in the order the handler called its actions.
Action = tuple[str, int] | tuple[str, int, CheckpointFailureReason]

_sizes = itertools.count(1)  # like Flink's sizeCounter: every buffer is distinguishable


def D(channel: int, size: int | None = None) -> DataItem:
    return ("D", channel, next(_sizes) if size is None else size)


def B(checkpoint_id: int, channel: int, timestamp: int = START_MS) -> EventItem:
    return (CheckpointBarrier(checkpoint_id, timestamp), channel)


def X(checkpoint_id: int, channel: int) -> EventItem:
    return (CancelCheckpointMarker(checkpoint_id), channel)


def E(channel: int) -> EventItem:
    return (END_OF_PARTITION, channel)


def triggered(checkpoint_id: int) -> Action:
    return ("trigger", checkpoint_id)


def aborted(checkpoint_id: int, reason: CheckpointFailureReason = CANCELLED) -> Action:
    return ("abort", checkpoint_id, reason)


def passed_through(sequence: list[Item]) -> list[Item]:
    """What the task sees of ``sequence``: data and end-of-partition, barriers and markers removed."""
    return [item for item in sequence if item[0] == "D" or isinstance(item[0], EndOfPartition)]


# ---------------------------------------------------------------------- harness


class SequenceGate:
    """The input: items in arrival order; items of blocked channels stay queued until unblocked."""

    def __init__(self, items: list[Item] | None = None) -> None:
        self._queue: list[Item] = list(items or [])
        self.blocked: set[int] = set()
        #: Every block_channel call, to show that a handler never blocked anything.
        self.block_calls: list[int] = []

    def add(self, *items: Item) -> None:
        self._queue.extend(items)

    # ChannelBlocker
    def block_channel(self, index: int) -> None:
        self.block_calls.append(index)
        self.blocked.add(index)

    def unblock_all(self) -> None:
        self.blocked.clear()

    def poll_next(self) -> Item | None:
        """The first queued item, in sequence order, whose channel is not blocked."""
        for position, item in enumerate(self._queue):
            if item[1] not in self.blocked:
                return self._queue.pop(position)
        return None

    def has_readable(self) -> bool:
        return any(item[1] not in self.blocked for item in self._queue)

    @property
    def queued(self) -> int:
        return len(self._queue)


class RecordingActions:
    """The task, as the handler sees it: records triggers and aborts in order."""

    def __init__(self) -> None:
        self.events: list[Action] = []
        self.metrics: dict[int, AlignmentMetrics] = {}

    def trigger_checkpoint_on_barrier(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        self.events.append(("trigger", barrier.checkpoint_id))
        self.metrics[barrier.checkpoint_id] = metrics

    def abort_checkpoint_on_barrier(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self.events.append(("abort", checkpoint_id, reason))

    @property
    def triggered(self) -> list[int]:
        return [event[1] for event in self.events if event[0] == "trigger"]

    @property
    def aborted(self) -> list[int]:
        return [event[1] for event in self.events if event[0] == "abort"]


class Driver:
    """The task's input loop: read one item, advance the clock, hand the item to the handler."""

    def __init__(
        self,
        handler: CheckpointBarrierHandler,
        gate: SequenceGate,
        clock: ManualClock,
        ms_per_step: float = 1,
    ) -> None:
        self.handler = handler
        self.gate = gate
        self.clock = clock
        self.ms_per_step = ms_per_step
        self.output: list[Item] = []

    def step(self) -> Item:
        item = self.gate.poll_next()
        assert item is not None, f"nothing readable; blocked {self.gate.blocked}, {self.gate.queued} queued"
        self.clock.advance_ms(self.ms_per_step)
        head, channel = item[0], item[1]
        if head == "D":
            self.handler.on_buffer(channel, item[2])  # type: ignore[misc]
            self.output.append(item)
        elif isinstance(head, CheckpointBarrier):
            self.handler.process_barrier(head, channel)
        elif isinstance(head, CancelCheckpointMarker):
            self.handler.process_cancellation_barrier(head, channel)
        elif isinstance(head, EndOfPartition):
            self.handler.process_end_of_partition(channel)
            self.output.append(item)
        else:
            raise AssertionError(f"unknown item {item!r}")
        return item

    def run(self) -> None:
        """Read until nothing is readable (the queue is empty or only blocked channels have items)."""
        while self.gate.has_readable():
            self.step()


def aligned(
    num_channels: int,
    items: list[Item] | None = None,
    *,
    end_of_partition_aborts: bool = True,
    ms_per_step: float = 1,
) -> tuple[Driver, SingleCheckpointBarrierHandler, RecordingActions]:
    clock = ManualClock(START_MS)
    gate = SequenceGate(items)
    actions = RecordingActions()
    handler = SingleCheckpointBarrierHandler(
        num_channels, gate, actions, clock, end_of_partition_aborts=end_of_partition_aborts
    )
    return Driver(handler, gate, clock, ms_per_step), handler, actions


def tracker(
    num_channels: int, items: list[Item] | None = None, **options: int
) -> tuple[Driver, CheckpointBarrierTracker, RecordingActions]:
    clock = ManualClock(START_MS)
    gate = SequenceGate(items)
    actions = RecordingActions()
    handler = CheckpointBarrierTracker(num_channels, actions, clock, **options)
    return Driver(handler, gate, clock), handler, actions


@dataclass
class Step:
    """One row of a scenario table: the item read at this step and what must hold right after it."""

    item: Item
    blocked: set[int] = field(default_factory=set)
    #: The actions this very step caused, in order.
    effects: list[Action] = field(default_factory=list)
    latest: int | None = None  # handler.latest_checkpoint_id after the step
    alignment_ns: int | None = None  # handler.last_alignment_duration_ns after the step


def run_table(driver: Driver, actions: RecordingActions, table: list[Step]) -> None:
    for number, row in enumerate(table, start=1):
        before = len(actions.events)
        read = driver.step()
        where = f"step {number} ({row.item!r})"
        assert read == row.item, f"{where}: read {read!r} instead (output order must equal input order)"
        assert driver.gate.blocked == row.blocked, f"{where}: blocked set"
        assert actions.events[before:] == row.effects, f"{where}: actions caused"
        if row.latest is not None:
            assert driver.handler.latest_checkpoint_id == row.latest, f"{where}: latest checkpoint id"
        if row.alignment_ns is not None:
            handler = driver.handler
            assert isinstance(handler, SingleCheckpointBarrierHandler)
            assert handler.last_alignment_duration_ns == row.alignment_ns, f"{where}: alignment duration"
    assert driver.gate.queued == 0, "every item was read"
    assert driver.output == passed_through([row.item for row in table])


# ---------------------------------------------------------------------- A1. aligned barrier handling


def test_s1_single_channel_no_barriers() -> None:
    sequence = [D(0), D(0), D(0), E(0)]
    driver, handler, actions = aligned(1, sequence)
    driver.run()
    assert driver.output == sequence
    assert handler.last_alignment_duration_ns == 0
    assert actions.events == []
    assert driver.gate.block_calls == []


def test_s2_multi_channel_no_barriers() -> None:
    sequence = [D(2), D(2), D(0), D(1), D(0), E(0), D(3), D(1), E(3), D(1), E(1), D(2), E(2)]
    driver, handler, actions = aligned(4, sequence)
    driver.run()
    assert driver.output == sequence
    assert handler.last_alignment_duration_ns == 0
    assert actions.events == []
    assert driver.gate.block_calls == []


def test_s3_single_channel_with_barriers() -> None:
    sequence = [
        D(0),
        D(0),
        D(0),
        B(1, 0),
        D(0),
        D(0),
        D(0),
        D(0),
        B(2, 0),
        B(3, 0),
        D(0),
        D(0),
        B(4, 0),
        B(5, 0),
        B(6, 0),
        D(0),
        E(0),
    ]
    driver, handler, actions = aligned(1, sequence)
    for item in sequence:
        before = len(actions.events)
        assert driver.step() == item
        if isinstance(item[0], CheckpointBarrier):  # every barrier triggers at once
            assert actions.events[before:] == [triggered(item[0].checkpoint_id)]
        assert driver.gate.blocked == set()
    assert actions.triggered == [1, 2, 3, 4, 5, 6]
    assert actions.aborted == []
    assert driver.gate.block_calls == [], "a single channel is never blocked"
    assert driver.output == passed_through(sequence)
    assert all(m.alignment_duration_ns == 0 for m in actions.metrics.values())
    assert handler.last_alignment_duration_ns == 0


def test_s4_multi_channel_alignment() -> None:
    table = [
        # 1-3
        Step(D(0)),
        Step(D(2)),
        Step(D(0)),
        # 4-7: checkpoint 1, alignment starts at step 4
        Step(B(1, 1), blocked={1}, latest=1),
        Step(B(1, 2), blocked={1, 2}),
        Step(D(0), blocked={1, 2}),
        Step(B(1, 0), effects=[triggered(1)], alignment_ns=3 * MS),
        # 8-12
        Step(D(0)),
        Step(D(0)),
        Step(D(1)),
        Step(D(1)),
        Step(D(2)),
        # 13-15: checkpoint 2, barriers together
        Step(B(2, 0), blocked={0}, latest=2),
        Step(B(2, 1), blocked={0, 1}),
        Step(B(2, 2), effects=[triggered(2)], alignment_ns=2 * MS),
        # 16-22: checkpoint 3, data only from non-blocked channels in between
        Step(D(2)),
        Step(D(2)),
        Step(B(3, 2), blocked={2}, latest=3),
        Step(D(0), blocked={2}),
        Step(D(0), blocked={2}),
        Step(B(3, 0), blocked={0, 2}),
        Step(B(3, 1), effects=[triggered(3)], alignment_ns=4 * MS),
        # 23-25: "empty" checkpoint 4
        Step(B(4, 1), blocked={1}, latest=4),
        Step(B(4, 2), blocked={1, 2}),
        Step(B(4, 0), effects=[triggered(4)], alignment_ns=2 * MS),
        # 26-29: trailing data
        Step(D(0)),
        Step(E(0)),
        Step(E(1)),
        Step(E(2)),
    ]
    driver, handler, actions = aligned(3)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)

    assert actions.triggered == [1, 2, 3, 4]
    assert actions.aborted == []
    # alignment of checkpoint 1 is measured from step 4 (its first barrier) to step 7
    assert actions.metrics[1].alignment_duration_ns == 3 * MS
    # the start delay is the barrier's age when its first barrier arrived (step 4): <= time since creation
    elapsed_since_creation_ns = (driver.clock.now_ms() - START_MS) * MS
    for checkpoint_id, metrics in actions.metrics.items():
        assert 0 <= metrics.checkpoint_start_delay_ns <= elapsed_since_creation_ns, checkpoint_id
    assert actions.metrics[1].checkpoint_start_delay_ns == 4 * MS
    assert handler.state is WAITING_FOR_FIRST_BARRIER
    assert not handler.is_aligning


def test_s4_state_values_during_alignment() -> None:
    driver, handler, _ = aligned(3, [B(1, 1), B(1, 2), B(1, 0)])
    assert handler.state is WAITING_FOR_FIRST_BARRIER
    driver.step()
    assert handler.state is COLLECTING_BARRIERS
    assert handler.is_aligning
    driver.step()
    assert handler.state is COLLECTING_BARRIERS
    driver.step()
    assert handler.state is WAITING_FOR_FIRST_BARRIER
    assert not handler.is_aligning


def test_s6_alignment_metrics() -> None:
    buffer_size = 100
    sleep_ms = 10
    driver, handler, actions = aligned(3)
    clock = driver.clock
    created_ms = clock.now_ms()  # T: the barrier of checkpoint 1 is created
    clock.advance_ms(sleep_ms)
    alignment_start_ns = clock.monotonic_ns()

    first = [
        D(0, buffer_size),
        D(1, buffer_size),
        D(2, buffer_size),
        B(1, 1, created_ms),  # first barrier, >= 10 ms after T
        D(0, buffer_size),
        D(2, buffer_size),
        B(1, 0, created_ms),
        D(2, buffer_size),
    ]
    driver.gate.add(*first)
    driver.run()
    assert actions.events == []
    assert driver.gate.blocked == {0, 1}

    clock.advance_ms(sleep_ms)
    second = [
        B(1, 2, created_ms),  # last barrier, >= 10 ms later
        D(0, buffer_size),
        D(1, buffer_size),
        D(2, buffer_size),
        E(0),
        E(1),
        E(2),
    ]
    driver.gate.add(*second)
    driver.run()

    start_delay_ms = clock.now_ms() - created_ms
    alignment_duration_ns = clock.monotonic_ns() - alignment_start_ns

    assert actions.events == [triggered(1)]
    assert handler.latest_checkpoint_id == 1
    metrics = actions.metrics[1]
    assert sleep_ms <= metrics.checkpoint_start_delay_ns // MS <= start_delay_ms
    assert metrics.alignment_duration_ns // MS >= sleep_ms
    assert metrics.alignment_duration_ns <= alignment_duration_ns
    assert handler.last_alignment_duration_ns == metrics.alignment_duration_ns
    assert metrics.bytes_processed_during_alignment == 3 * buffer_size
    assert driver.output == passed_through(first + second)
    assert driver.gate.blocked == set()


def test_s8_channels_closed_before_alignment() -> None:
    table = [
        # close some channels immediately
        Step(E(2)),
        Step(E(1)),
        # checkpoint 2 with barriers from channels 3 and 0 only
        Step(D(0)),
        Step(D(0)),
        Step(D(3)),
        Step(B(2, 3), blocked={3}),
        Step(B(2, 0), effects=[triggered(2)], latest=2),
        # checkpoint 3 likewise ("empty")
        Step(B(3, 0), blocked={0}),
        Step(B(3, 3), effects=[triggered(3)], latest=3),
        # some data, one more channel closes
        Step(D(0)),
        Step(D(0)),
        Step(D(3)),
        Step(E(0)),
        # checkpoint 4 on the last remaining channel: its single barrier completes it
        Step(D(3)),
        Step(B(4, 3), effects=[triggered(4)], latest=4),
        Step(D(3)),
        Step(E(3)),
    ]
    driver, _, actions = aligned(4)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    assert actions.triggered == [2, 3, 4]
    assert actions.aborted == []


def test_s9_end_of_partition_during_alignment() -> None:
    table = [
        # one checkpoint
        Step(B(1, 0), blocked={0}),
        Step(B(1, 1), blocked={0, 1}),
        Step(B(1, 2), effects=[triggered(1)]),
        # some buffers
        Step(D(0)),
        Step(D(0)),
        Step(D(2), latest=1),
        # the checkpoint that will be incomplete
        Step(B(2, 2), blocked={2}, latest=2),
        Step(B(2, 0), blocked={0, 2}),
        Step(D(1), blocked={0, 2}),
        # end of partition on the channel still missing: checkpoint 2 aborted, everything unblocked
        Step(E(1), effects=[aborted(2, END_OF_STREAM)]),
        Step(E(2)),
        Step(D(0)),
        Step(E(0)),
    ]
    driver, handler, actions = aligned(3)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    assert actions.triggered == [1]
    assert actions.aborted == [2]
    assert handler.state is WAITING_FOR_FIRST_BARRIER
    assert not handler.is_checkpoint_pending


def test_s9_end_of_partition_counts_as_aligned_when_it_does_not_abort() -> None:
    """FLIP-147 style: the ended channel counts as having delivered the barrier."""
    table = [
        Step(B(1, 0), blocked={0}),
        Step(B(1, 1), blocked={0, 1}),
        Step(B(1, 2), effects=[triggered(1)]),
        Step(D(0)),
        Step(D(0)),
        Step(D(2)),
        Step(B(2, 2), blocked={2}, latest=2),
        Step(B(2, 0), blocked={0, 2}),
        Step(D(1), blocked={0, 2}),
        # channel 1 ends: every open channel delivered barrier 2, so it triggers (from step 7: 3 ms)
        Step(E(1), effects=[triggered(2)], alignment_ns=3 * MS),
        Step(E(2)),
        Step(D(0)),
        Step(E(0)),
    ]
    driver, handler, actions = aligned(3, end_of_partition_aborts=False)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    assert actions.triggered == [1, 2]
    assert actions.aborted == []
    assert actions.metrics[2].alignment_duration_ns == 3 * MS
    assert handler.state is WAITING_FOR_FIRST_BARRIER
    assert not handler.is_checkpoint_pending


def test_s10_cancel_markers_on_a_single_channel() -> None:
    table = [
        Step(D(0)),
        Step(B(1, 0), effects=[triggered(1)], latest=1, alignment_ns=0),
        Step(D(0)),
        Step(B(2, 0), effects=[triggered(2)], latest=2, alignment_ns=0),
        Step(D(0)),
        Step(X(4, 0), effects=[aborted(4)], latest=4, alignment_ns=0),
        Step(B(5, 0), effects=[triggered(5)], latest=5, alignment_ns=0),
        Step(D(0)),
        Step(X(6, 0), effects=[aborted(6)], latest=6, alignment_ns=0),
        Step(D(0), alignment_ns=0),
    ]
    driver, _, actions = aligned(1)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    assert actions.triggered == [1, 2, 5]
    assert actions.aborted == [4, 6]
    assert len(actions.triggered) == 3
    assert len(actions.aborted) == 2
    assert all(m.alignment_duration_ns == 0 for m in actions.metrics.values())
    assert driver.gate.block_calls == []


def test_s11_cancel_markers_on_multiple_channels() -> None:
    table = [
        # some buffers and a successful checkpoint 1
        Step(D(0)),
        Step(D(2)),
        Step(D(0)),
        Step(B(1, 1), blocked={1}),
        Step(B(1, 2), blocked={1, 2}),
        Step(D(0), blocked={1, 2}),
        Step(B(1, 0), effects=[triggered(1)]),
        Step(D(0)),
        Step(D(2)),
        # checkpoint 2 aborted on its last barrier
        Step(B(2, 0), blocked={0}),
        Step(B(2, 2), blocked={0, 2}),
        Step(D(1), blocked={0, 2}),
        Step(X(2, 1), effects=[aborted(2)], alignment_ns=0),
        Step(D(2)),
        Step(D(1)),
        # successful checkpoint 3
        Step(B(3, 1), blocked={1}),
        Step(B(3, 2), blocked={1, 2}),
        Step(B(3, 0), effects=[triggered(3)]),
        Step(D(0)),
        Step(D(1)),
        # checkpoint 4 aborted on its first barrier; its later barriers are ignored and do not block
        Step(X(4, 1), effects=[aborted(4)], alignment_ns=0),
        Step(B(4, 2)),
        Step(D(2)),
        Step(B(4, 0)),
        # successful checkpoint 5
        Step(D(0)),
        Step(D(1)),
        Step(D(2)),
        Step(B(5, 2), blocked={2}),
        Step(B(5, 1), blocked={1, 2}),
        Step(B(5, 0), effects=[triggered(5)]),
        Step(D(0)),
        Step(D(1)),
        # checkpoint 6: several cancellations, then a barrier; aborted exactly once
        Step(X(6, 1), effects=[aborted(6)]),
        Step(X(6, 2), alignment_ns=0),
        Step(B(6, 0)),
        Step(D(0)),
    ]
    driver, _, actions = aligned(3)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    assert actions.events == [triggered(1), aborted(2), triggered(3), aborted(4), triggered(5), aborted(6)]
    assert len(actions.triggered) == 3
    assert len(actions.aborted) == 3


# ---------------------------------------------------------------------- A3. at-least-once tracking


def test_s19_tracker_single_channel() -> None:
    sequence = [
        D(0),
        D(0),
        D(0),
        B(1, 0),
        D(0),
        D(0),
        D(0),
        D(0),
        B(2, 0),
        B(3, 0),
        D(0),
        D(0),
        B(4, 0),
        B(5, 0),
        B(6, 0),
        D(0),
    ]
    driver, _, actions = tracker(1, sequence)
    for item in sequence:
        before = len(actions.events)
        assert driver.step() == item
        if isinstance(item[0], CheckpointBarrier):
            assert actions.events[before:] == [triggered(item[0].checkpoint_id)]
    assert actions.events == [triggered(n) for n in (1, 2, 3, 4, 5, 6)]
    assert driver.output == passed_through(sequence)
    assert driver.gate.block_calls == []


def test_s20_tracker_skipped_ids() -> None:
    sequence = [
        D(0),
        B(1, 0),
        D(0),
        D(0),
        B(3, 0),
        D(0),
        B(4, 0),
        B(6, 0),
        D(0),
        B(7, 0),
        D(0),
        B(10, 0),
        D(0),
    ]
    driver, handler, actions = tracker(1, sequence)
    driver.run()
    assert actions.events == [triggered(n) for n in (1, 3, 4, 6, 7, 10)]
    assert handler.latest_checkpoint_id == 10
    assert driver.output == passed_through(sequence)


def test_s21_tracker_multi_channel() -> None:
    table = [
        Step(D(0)),
        Step(D(2)),
        Step(D(0)),
        Step(B(1, 1)),
        Step(B(1, 2)),
        # data from channels that already delivered barrier 1 flows through before the snapshot
        Step(D(2)),
        Step(D(1)),
        Step(B(1, 0), effects=[triggered(1)]),
        Step(D(0)),
        Step(D(0)),
        Step(D(1)),
        Step(D(1)),
        Step(D(2)),
        Step(B(2, 0)),
        Step(B(2, 1)),
        Step(B(2, 2), effects=[triggered(2)]),
        Step(D(2)),
        Step(D(2)),
        Step(B(3, 2)),
        Step(D(2)),
        Step(D(2)),
        Step(B(3, 0)),
        Step(B(3, 1), effects=[triggered(3)]),
        Step(B(4, 1)),
        Step(B(4, 2)),
        Step(B(4, 0), effects=[triggered(4)]),
        Step(D(0)),
    ]
    driver, _, actions = tracker(3)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    assert actions.triggered == [1, 2, 3, 4]
    assert driver.gate.block_calls == []


def test_s22_tracker_jumping_to_a_later_checkpoint() -> None:
    table = [
        Step(D(0)),
        Step(D(2)),
        Step(D(0)),
        Step(B(1, 1)),
        Step(B(1, 2)),
        Step(D(2)),
        Step(D(1)),
        Step(B(1, 0), effects=[triggered(1)]),
        Step(D(0)),
        Step(D(0)),
        Step(D(1)),
        Step(D(1)),
        Step(D(2)),
        Step(B(2, 0)),
        Step(B(2, 1)),
        Step(B(2, 2), effects=[triggered(2)]),
        Step(D(2)),
        Step(D(2)),
        # checkpoint 3 only ever gets a barrier from channel 2
        Step(B(3, 2), latest=3),
        Step(D(2)),
        Step(D(2)),
        # jump to checkpoint 4
        Step(B(4, 0), latest=4),
        Step(D(0)),
        Step(D(1)),
        Step(D(2)),
        Step(B(4, 1)),
        Step(D(1)),
        # 4 completes; 3 can no longer complete: it is aborted (declined), never dropped silently
        Step(B(4, 2), effects=[aborted(3, SUBSUMED), triggered(4)]),
        Step(D(0)),
    ]
    driver, _, actions = tracker(3)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    assert actions.events == [triggered(1), triggered(2), aborted(3, SUBSUMED), triggered(4)]


def test_s24_tracker_abort_single_channel() -> None:
    table = [
        Step(D(0)),
        Step(B(1, 0), effects=[triggered(1)]),
        Step(D(0)),
        Step(B(2, 0), effects=[triggered(2)]),
        Step(X(4, 0), effects=[aborted(4)], latest=4),
        Step(B(5, 0), effects=[triggered(5)], latest=5),
        Step(D(0)),
        Step(X(6, 0), effects=[aborted(6)], latest=6),
        Step(D(0)),
    ]
    driver, _, actions = tracker(1)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    # 1, 2, -4, 5, -6
    assert actions.events == [triggered(1), triggered(2), aborted(4), triggered(5), aborted(6)]


def test_s24_tracker_abort_multi_channel() -> None:
    table = [
        # some buffers and a successful checkpoint
        Step(D(0)),
        Step(D(2)),
        Step(D(0)),
        Step(B(1, 1)),
        Step(B(1, 2)),
        Step(D(2)),
        Step(D(1)),
        Step(B(1, 0), effects=[triggered(1)]),
        # aborted on last barrier
        Step(D(0)),
        Step(D(2)),
        Step(B(2, 0)),
        Step(B(2, 2)),
        Step(D(0)),
        Step(D(2)),
        Step(X(2, 1), effects=[aborted(2)]),
        # successful checkpoint
        Step(D(2)),
        Step(D(1)),
        Step(B(3, 1)),
        Step(B(3, 2)),
        Step(B(3, 0), effects=[triggered(3)]),
        # a cancel marker arriving first aborts at once; later barriers of 4 are ignored
        Step(D(0)),
        Step(D(1)),
        Step(X(4, 1), effects=[aborted(4)]),
        Step(B(4, 2)),
        Step(D(0)),
        Step(B(4, 0)),
        # another successful checkpoint
        Step(D(0)),
        Step(D(1)),
        Step(D(2)),
        Step(B(5, 2)),
        Step(B(5, 1)),
        Step(B(5, 0), effects=[triggered(5)]),
        # several cancellations and a barrier after them: aborted once
        Step(D(0)),
        Step(D(1)),
        Step(X(6, 1), effects=[aborted(6)]),
        Step(X(6, 2)),
        Step(B(6, 0)),
        Step(D(0)),
    ]
    driver, _, actions = tracker(3)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    # 1, -2, 3, -4, 5, -6
    assert actions.events == [triggered(1), aborted(2), triggered(3), aborted(4), triggered(5), aborted(6)]
    assert driver.gate.block_calls == []


def test_tracker_completes_a_checkpoint_on_the_last_open_channel_after_another_closed() -> None:
    # Channel 0 delivers barrier 3 and then ends (its upstream finished); channel 1 is
    # then the only open one. Its barrier 3 must still complete checkpoint 3: counting it
    # is not a fast path's first barrier of a new checkpoint. (A bounded job waited
    # forever for this final checkpoint when the count was skipped.)
    table = [
        Step(D(0)),
        Step(D(1)),
        Step(B(3, 0), latest=3),
        Step(D(0)),
        Step(E(0)),
        Step(D(1)),
        Step(B(3, 1), effects=[triggered(3)], latest=3),
        Step(D(1)),
        Step(B(4, 1), effects=[triggered(4)], latest=4),  # one open channel: nothing to count
    ]
    driver, _, actions = tracker(2)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    assert actions.events == [triggered(3), triggered(4)]


def test_tracker_aborts_a_checkpoint_cancelled_on_the_last_open_channel_after_another_closed() -> None:
    table = [
        Step(B(3, 0), latest=3),
        Step(E(0)),
        Step(X(3, 1), effects=[aborted(3)], latest=3),
        Step(D(1)),
        Step(B(4, 1), effects=[triggered(4)], latest=4),
    ]
    driver, _, actions = tracker(2)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)


# ---------------------------------------------------------------------- the tracker's bound


def run_bounded_tracker(table: list[Step], max_checkpoints_to_track: int) -> None:
    """Run ``table`` on a 2-channel tracker with that bound; nothing may stay counted after it."""
    driver, handler, actions = tracker(2, max_checkpoints_to_track=max_checkpoints_to_track)
    driver.gate.add(*(row.item for row in table))
    run_table(driver, actions, table)
    assert handler.num_pending_checkpoints == 0


def test_tracker_tracks_at_most_max_checkpoints_and_aborts_each_one_it_drops() -> None:
    # Channel 0 runs far ahead of channel 1 (at-least-once never blocks it): without a bound
    # the tracker would keep one count per checkpoint forever. With room for 3, the 4th count
    # pushes out the oldest, which is aborted (the task declines it) at that very step.
    table = [
        Step(B(1, 0), latest=1),
        Step(B(2, 0), latest=2),
        Step(B(3, 0), latest=3),
        Step(B(4, 0), effects=[aborted(1, SUBSUMED)], latest=4),
        Step(D(0)),
        Step(B(5, 0), effects=[aborted(2, SUBSUMED)], latest=5),
        # a cancelled count still takes its place, and is not aborted twice when dropped
        Step(
            X(6, 0), effects=[aborted(3, CANCELLED), aborted(4, CANCELLED), aborted(5, CANCELLED), aborted(6)]
        ),
        Step(B(7, 0), latest=7),
        Step(B(8, 0), latest=8),
        Step(B(9, 0), latest=9),
        Step(B(10, 0), effects=[aborted(7, SUBSUMED)], latest=10),
        # the slow channel's barriers of dropped counts are obsolete: nothing happens
        Step(D(1)),
        Step(B(1, 1)),
        Step(B(7, 1)),
        Step(B(8, 1), effects=[triggered(8)]),
        Step(B(10, 1), effects=[aborted(9, SUBSUMED), triggered(10)]),
    ]
    run_bounded_tracker(table, max_checkpoints_to_track=3)


def test_tracker_drops_a_cancelled_count_without_aborting_it_again() -> None:
    table = [
        Step(X(1, 0), effects=[aborted(1)], latest=1),
        Step(B(2, 0), latest=2),
        Step(B(3, 0), latest=3),  # pushes out 1, which was aborted already: no second abort
        Step(B(4, 0), effects=[aborted(2, SUBSUMED)], latest=4),
        Step(B(4, 1), effects=[aborted(3, SUBSUMED), triggered(4)]),
    ]
    run_bounded_tracker(table, max_checkpoints_to_track=2)


def test_tracker_default_bound_is_flinks() -> None:
    driver, handler, actions = tracker(2)
    assert handler.max_checkpoints_to_track == MAX_CHECKPOINTS_TO_TRACK == 50
    driver.gate.add(*(B(n, 0) for n in range(1, 1001)))
    driver.run()
    assert handler.num_pending_checkpoints == 50
    assert actions.events == [aborted(n, SUBSUMED) for n in range(1, 951)]


def test_tracker_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_checkpoints_to_track must be >= 1, got 0"):
        CheckpointBarrierTracker(2, RecordingActions(), max_checkpoints_to_track=0)
