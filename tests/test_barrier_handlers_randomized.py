"""Both barrier handlers against random event sequences (``hypothesis``), checked by invariants.

The table-driven tests in ``test_barrier_handlers.py`` walk Flink's scenarios; this file
looks for the sequences nobody thought of. A scenario is 1-5 channels and a random list of
steps: send a data batch, a barrier, a cancel marker or an end of partition on one channel,
or let the task read a few items. Checkpoint ids mostly stay or grow by one, sometimes jump,
and sometimes come late (an id below the newest seen). After the steps every channel still
open either ends or delivers one last barrier newer than any before it, and the task reads
until nothing is left.

The handlers are driven exactly as a task drives them: real :class:`LocalChannel` s, a real
:class:`InputGate` (round-robin, skips blocked channels) and a real
:class:`CheckpointedInputGate`. The only addition is that every channel logs the items the
gate takes from it, and the task's actions log triggers and aborts, into one shared log: its
order is the exact interleaving of reads and handler decisions that the invariants are
checked against.

Invariants:

* a checkpoint is *started* when a barrier or cancel marker of it is read and its id is
  above every id read before; every started checkpoint is triggered or aborted exactly once
  (never both, never twice), and nothing else is;
* triggered ids increase;
* at the end every item was read and no channel is blocked (no alignment left hanging);
* the data of every channel comes out complete and in the channel's order;
* aligned (EXACTLY_ONCE): after a channel delivered the barrier of the checkpoint being
  aligned, nothing more is read from it until that checkpoint is triggered or aborted;
* tracked (AT_LEAST_ONCE): no channel is ever blocked.

CI runs a fixed set of examples (``derandomize=True``): the same sequences every run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from chandy.messages.checkpoint import CheckpointFailureReason
from chandy.network.barrier_handler import (
    AlignmentMetrics,
    CheckpointBarrierHandler,
    CheckpointBarrierTracker,
    SingleCheckpointBarrierHandler,
)
from chandy.network.channel import LocalChannel
from chandy.network.checkpointed_input_gate import CheckpointedInputGate
from chandy.network.events import (
    END_OF_PARTITION,
    CancelCheckpointMarker,
    CheckpointBarrier,
    EndOfPartition,
)
from chandy.network.input_gate import InputGate
from chandy.network.wakeup import Wakeup
from chandy.util.clock import ManualClock

EXAMPLES = 600  # per handler: about 2 s each

#: One entry of the shared log: ("read", channel, item), ("trigger", id) or ("abort", id, reason).
LogEntry = tuple[Any, ...]


class LoggingChannel(LocalChannel):
    """A real in-memory channel that also logs, in the shared log, every item the gate takes."""

    __slots__ = ("index", "log")

    def __init__(self, index: int, log: list[LogEntry]) -> None:
        super().__init__(capacity=1_000_000, name=f"channel {index}")
        self.index = index
        self.log = log

    def poll(self) -> Any:
        item = super().poll()
        if item is not None:
            self.log.append(("read", self.index, item))
        return item


class LoggingActions:
    """The task's side of the handler: logs each trigger and abort where it happens."""

    def __init__(self, log: list[LogEntry]) -> None:
        self.log = log

    def trigger_checkpoint_on_barrier(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        self.log.append(("trigger", barrier.checkpoint_id))

    def abort_checkpoint_on_barrier(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self.log.append(("abort", checkpoint_id, reason))


# ---------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Send:
    channel: int
    item: Any

    def __repr__(self) -> str:
        return f"Send({self.channel}, {self.item!r})"


@dataclass(frozen=True)
class Read:
    """The task reads up to ``count`` data batches (fewer if nothing is readable)."""

    count: int


Step = Send | Read


@dataclass
class Scenario:
    num_channels: int
    steps: list[Step] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"Scenario({self.num_channels} channels, {self.steps!r})"


#: How a barrier's or cancel marker's id relates to the newest id so far: mostly the same
#: (other channels delivering it) or the next one; sometimes a jump or a late, older id.
ID_STEPS = st.sampled_from([0, 0, 0, 1, 1, 2, 5, -1, -3])
KINDS = st.sampled_from(["data", "data", "barrier", "barrier", "read", "read", "cancel", "end"])


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    num_channels = draw(st.integers(1, 5))
    raw = draw(
        st.lists(st.tuples(KINDS, st.integers(0, num_channels - 1), ID_STEPS, st.integers(1, 4)), max_size=60)
    )
    scenario = Scenario(num_channels)
    ended: set[int] = set()
    newest = 0
    batch = 0
    for kind, channel, id_step, count in raw:
        if kind == "read":
            scenario.steps.append(Read(count))
            continue
        if channel in ended:
            continue  # nothing follows an end of partition
        if kind == "data":
            batch += 1
            scenario.steps.append(Send(channel, [(channel, batch)]))
        elif kind == "end":
            ended.add(channel)
            scenario.steps.append(Send(channel, END_OF_PARTITION))
        else:
            checkpoint_id = max(1, newest + id_step)
            newest = max(newest, checkpoint_id)
            event = (
                CheckpointBarrier(checkpoint_id, 0)
                if kind == "barrier"
                else CancelCheckpointMarker(checkpoint_id)
            )
            scenario.steps.append(Send(channel, event))
    close_with_end = draw(st.booleans())
    for channel in range(num_channels):
        if channel not in ended:
            last = END_OF_PARTITION if close_with_end else CheckpointBarrier(newest + 1, 0)
            scenario.steps.append(Send(channel, last))
    return scenario


# ---------------------------------------------------------------------- running one


@dataclass
class Run:
    log: list[LogEntry]
    output: list[Any]
    gate: InputGate
    handler: CheckpointBarrierHandler
    channels: list[LoggingChannel]
    blocked_ever: bool


def run(scenario: Scenario, handler_of: Any) -> Run:
    """Feed ``scenario`` to a task-like reader over real channels and gates; read until stuck."""
    log: list[LogEntry] = []
    channels = [LoggingChannel(i, log) for i in range(scenario.num_channels)]
    gate = InputGate(channels, Wakeup())
    handler = handler_of(scenario.num_channels, gate, LoggingActions(log))
    checkpointed = CheckpointedInputGate(gate, handler)
    output: list[Any] = []
    blocked_ever = False

    def read(limit: int | None) -> None:
        nonlocal blocked_ever
        while limit is None or limit > 0:
            polled = checkpointed.poll_next()
            blocked_ever = blocked_ever or bool(gate.blocked_channels())
            if polled is None:
                return
            output.append(polled)
            if limit is not None:
                limit -= 1

    for step in scenario.steps:
        if isinstance(step, Send):
            channels[step.channel].send(step.item)
        else:
            read(step.count)
    read(None)
    return Run(log, output, gate, handler, channels, blocked_ever)


def checkpoint_id_of(item: Any) -> int | None:
    if isinstance(item, (CheckpointBarrier, CancelCheckpointMarker)):
        return item.checkpoint_id
    return None


def check_common(scenario: Scenario, result: Run) -> None:
    # Nothing is left unread and nothing stays blocked.
    left = {channel.index: channel.backlog() for channel in result.channels if channel.backlog()}
    assert not left, f"items never read (channel: count) {left}; blocked {result.gate.blocked_channels()}"
    assert result.gate.blocked_channels() == set()
    assert result.gate.is_finished() == all(
        any(isinstance(s, Send) and s.channel == c and s.item is END_OF_PARTITION for s in scenario.steps)
        for c in range(scenario.num_channels)
    )
    # Every channel's data comes out whole and in order.
    for channel in range(scenario.num_channels):
        sent = [s.item for s in scenario.steps if isinstance(s, Send) and s.channel == channel]
        expected = [item for item in sent if isinstance(item, list)]
        assert [batch for index, batch in result.output if index == channel] == expected, channel
    # Started checkpoints: triggered or aborted exactly once, nothing else; triggers increase.
    started: list[int] = []
    newest = 0
    outcomes: dict[int, list[str]] = {}
    for entry in result.log:
        if entry[0] == "read":
            checkpoint_id = checkpoint_id_of(entry[2])
            if checkpoint_id is not None and checkpoint_id > newest:
                newest = checkpoint_id
                started.append(checkpoint_id)
        else:
            outcomes.setdefault(entry[1], []).append(entry[0])
    for checkpoint_id in started:
        assert len(outcomes.get(checkpoint_id, [])) == 1, (checkpoint_id, outcomes.get(checkpoint_id))
    assert set(outcomes) == set(started), (
        f"actions for checkpoints never started: {set(outcomes) - set(started)}"
    )
    triggered = [entry[1] for entry in result.log if entry[0] == "trigger"]
    assert triggered == sorted(set(triggered)), triggered


def check_alignment(result: Run) -> None:
    """EXACTLY_ONCE: a channel that delivered the barrier of the checkpoint in alignment is not
    read again until that checkpoint is triggered or aborted."""
    newest = 0
    resolved: set[int] = set()
    held: dict[int, int] = {}  # channel -> checkpoint whose barrier it delivered
    for entry in result.log:
        if entry[0] in ("trigger", "abort"):
            resolved.add(entry[1])
            held = {c: n for c, n in held.items() if n not in resolved}
            continue
        _, channel, item = entry
        assert channel not in held, (
            f"channel {channel} read ({item!r}) while aligning checkpoint {held[channel]}"
        )
        checkpoint_id = checkpoint_id_of(item)
        if checkpoint_id is None:
            continue
        if isinstance(item, CheckpointBarrier) and checkpoint_id >= newest and checkpoint_id not in resolved:
            held[channel] = checkpoint_id
        newest = max(newest, checkpoint_id)
    assert not held


# ---------------------------------------------------------------------- the properties


def aligned_handler(end_of_partition_aborts: bool) -> Any:
    def make(num_channels: int, gate: InputGate, actions: LoggingActions) -> CheckpointBarrierHandler:
        return SingleCheckpointBarrierHandler(
            num_channels, gate, actions, ManualClock(0), end_of_partition_aborts=end_of_partition_aborts
        )

    return make


def tracker(max_checkpoints_to_track: int) -> Any:
    def make(num_channels: int, gate: InputGate, actions: LoggingActions) -> CheckpointBarrierHandler:
        return CheckpointBarrierTracker(
            num_channels, actions, ManualClock(0), max_checkpoints_to_track=max_checkpoints_to_track
        )

    return make


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None)
@given(scenario=scenarios(), end_of_partition_aborts=st.booleans())
def test_aligned_handler_invariants(scenario: Scenario, end_of_partition_aborts: bool) -> None:
    result = run(scenario, aligned_handler(end_of_partition_aborts))
    check_common(scenario, result)
    check_alignment(result)
    handler = result.handler
    assert isinstance(handler, SingleCheckpointBarrierHandler)
    assert not handler.is_checkpoint_pending and not handler.is_aligning


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None)
@given(scenario=scenarios(), max_checkpoints_to_track=st.sampled_from([50, 1, 2, 3]))
def test_tracker_invariants(scenario: Scenario, max_checkpoints_to_track: int) -> None:
    result = run(scenario, tracker(max_checkpoints_to_track))
    check_common(scenario, result)
    assert not result.blocked_ever, "the at-least-once tracker never blocks a channel"
    handler = result.handler
    assert isinstance(handler, CheckpointBarrierTracker)
    assert handler.num_pending_checkpoints == 0


def iter_reads(result: Run) -> Iterator[tuple[int, Any]]:
    for entry in result.log:
        if entry[0] == "read":
            yield entry[1], entry[2]


def test_the_harness_sees_what_the_gate_reads() -> None:
    """The invariants are only as good as the log: check it on a sequence worked by hand."""
    scenario = Scenario(
        2,
        [
            Send(0, CheckpointBarrier(1, 0)),
            Send(0, [(0, 1)]),
            Read(4),
            Send(1, [(1, 2)]),
            Send(1, CheckpointBarrier(1, 0)),
            Send(0, END_OF_PARTITION),
            Send(1, END_OF_PARTITION),
        ],
    )
    result = run(scenario, aligned_handler(True))
    assert list(iter_reads(result)) == [
        (0, CheckpointBarrier(1, 0)),
        (1, [(1, 2)]),
        (1, CheckpointBarrier(1, 0)),
        (0, [(0, 1)]),
        (1, END_OF_PARTITION),  # round robin: channel 1's turn after channel 0's
        (0, END_OF_PARTITION),
    ]
    assert [entry for entry in result.log if entry[0] != "read"] == [("trigger", 1)]
    assert isinstance(list(iter_reads(result))[-1][1], EndOfPartition)
    check_common(scenario, result)
    check_alignment(result)
