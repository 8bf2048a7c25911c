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

import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from chandy.messages.checkpoint import (
    AlignmentType,
    CheckpointFailureReason,
    CheckpointOptions,
    CheckpointType,
)
from chandy.network.barrier_handler import (
    AlignmentMetrics,
    CheckpointBarrierHandler,
    CheckpointBarrierTracker,
    SingleCheckpointBarrierHandler,
)
from chandy.network.channel import LocalChannel
from chandy.network.channel_state import ChannelStateWriter
from chandy.network.checkpointed_input_gate import CheckpointedInputGate
from chandy.network.events import (
    END_OF_PARTITION,
    CancelCheckpointMarker,
    CheckpointBarrier,
    EndOfPartition,
    PriorityBarrier,
    Watermark,
    WatermarkStatus,
)
from chandy.network.input_gate import InputGate
from chandy.network.wakeup import Wakeup
from chandy.util.clock import ManualClock
from chandy.util.timer import ManualTimer

EXAMPLES = 600  # per handler: about 2 s each

#: One entry of the shared log: ("read", channel, item), ("trigger", id) or ("abort", id, reason).
LogEntry = tuple[Any, ...]


class LoggingChannel(LocalChannel):
    """A real in-memory channel that also logs, in the shared log, every item the gate takes."""

    __slots__ = ("index", "log", "racing", "_held")

    def __init__(self, index: int, log: list[LogEntry]) -> None:
        super().__init__(capacity=1_000_000, name=f"channel {index}")
        self.index = index
        self.log = log
        #: Sends arrive only at the next poll (:class:`Race`).
        self.racing = False
        self._held: list[tuple[Any, Any]] = []

    def deliver(self, send: Any, item: Any) -> None:
        """``send(item)`` now, or at the next poll while racing."""
        if self.racing:
            self._held.append((send, item))
        else:
            send(item)

    def flush_racing(self) -> None:
        self.racing = False
        held, self._held = self._held, []
        for send, item in held:
            send(item)

    def poll(self) -> Any:
        if self.racing:
            self.flush_racing()
        item = super().poll()
        if item is not None:
            self.log.append(("read", self.index, item))
        return item

    def poll_priority(self) -> PriorityBarrier | None:
        priority = super().poll_priority()
        if priority is not None:
            self.log.append(("priority", self.index, priority))
        return priority


class LoggingActions:
    """The task's side of the handler: logs each trigger and abort where it happens, and, for
    an unaligned checkpoint, what its channel state came to (``("state", id, state or None)``)."""

    def __init__(self, log: list[LogEntry], channel_state: ChannelStateWriter | None = None) -> None:
        self.log = log
        self.channel_state = channel_state

    def trigger_checkpoint_on_barrier(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        checkpoint_id = barrier.checkpoint_id
        self.log.append(("trigger", checkpoint_id, barrier.options))
        if barrier.options.is_unaligned:
            assert self.channel_state is not None
            self.channel_state.on_complete(
                checkpoint_id, lambda state: self.log.append(("state", checkpoint_id, state))
            )

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


@dataclass(frozen=True)
class SendPriority:
    """A priority barrier: unaligned, or an announcement of an aligned one with a timeout.
    Its timestamp is the time its checkpoint's first barrier is sent (the trigger time)."""

    channel: int
    checkpoint_id: int
    options: CheckpointOptions


@dataclass(frozen=True)
class Race:
    """What is sent on ``channel`` from now on arrives only as the task polls the channel next,
    between its look for priority barriers and its take (another thread's sends, in that window)."""

    channel: int


@dataclass(frozen=True)
class Tick:
    """Time passes on the task thread: due timers (the alignment timeout) run."""

    ms: int


Step = Send | Read | SendPriority | Tick | Race


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


#: How each checkpoint of a mixed scenario travels (drawn once per checkpoint id).
MODES = st.sampled_from(["aligned", "unaligned", "timeout", "timeout", "savepoint"])
MIXED_KINDS = st.sampled_from(
    ["data"] * 2
    + ["watermark"]
    + ["barrier"] * 2
    + ["read"] * 2
    + ["tick"] * 2
    + ["race"] * 3
    + ["cancel", "end"]
)
SAVEPOINT = CheckpointOptions(
    checkpoint_type=CheckpointType.SAVEPOINT,
    alignment=AlignmentType.FORCED_ALIGNED,
    aligned_checkpoint_timeout_ms=0,
)


@st.composite
def mixed_scenarios(draw: st.DrawFn, modes: st.SearchStrategy[str] = MODES) -> Scenario:
    """Like :func:`scenarios`, with every checkpoint aligned in band, a savepoint, unaligned, or
    aligned with a timeout (announced; some upstreams forward it unaligned, their own
    alignment having timed out), watermarks among the data, and time passing (ticks).
    A channel delivers at most one barrier per checkpoint, as a real producer does."""
    num_channels = draw(st.integers(1, 5))
    raw = draw(
        st.lists(
            st.tuples(MIXED_KINDS, st.integers(0, num_channels - 1), ID_STEPS, st.integers(1, 4)),
            max_size=60,
        )
    )
    scenario = Scenario(num_channels)
    ended: set[int] = set()
    sent: set[tuple[int, int]] = set()  # (channel, checkpoint id) that got a barrier
    chosen: dict[int, CheckpointOptions] = {}
    newest = 0
    batch = 0

    def options_of(checkpoint_id: int) -> CheckpointOptions:
        if checkpoint_id not in chosen:
            mode = draw(modes)
            if mode == "unaligned":
                chosen[checkpoint_id] = CheckpointOptions(alignment=AlignmentType.UNALIGNED)
            elif mode == "timeout":
                timeout = draw(st.sampled_from([0, 3, 8, 20]))
                chosen[checkpoint_id] = CheckpointOptions(aligned_checkpoint_timeout_ms=timeout)
            else:
                chosen[checkpoint_id] = SAVEPOINT if mode == "savepoint" else CheckpointOptions()
        return chosen[checkpoint_id]

    def barrier(channel: int, checkpoint_id: int) -> Step:
        sent.add((channel, checkpoint_id))
        options = options_of(checkpoint_id)
        if not options.is_priority:
            return Send(channel, CheckpointBarrier(checkpoint_id, 0, options))
        if options.is_timeoutable and draw(st.integers(0, 3)) == 0:
            options = options.to_unaligned()
        return SendPriority(channel, checkpoint_id, options)

    for kind, channel, id_step, count in raw:
        if kind in ("read", "tick"):
            scenario.steps.append(Read(count) if kind == "read" else Tick(count * 5))
        elif kind == "race":
            scenario.steps.append(Race(channel))
        elif channel in ended:
            pass  # nothing follows an end of partition
        elif kind in ("data", "watermark", "end"):
            batch += 1
            if kind == "end":
                ended.add(channel)
            items = {
                "data": [(channel, batch)],
                "watermark": Watermark(count) if id_step >= 0 else WatermarkStatus(count > 2),
                "end": END_OF_PARTITION,
            }
            scenario.steps.append(Send(channel, items[kind]))
        else:
            checkpoint_id = max(1, newest + id_step)
            newest = max(newest, checkpoint_id)
            if kind == "cancel":
                scenario.steps.append(Send(channel, CancelCheckpointMarker(checkpoint_id)))
            elif (channel, checkpoint_id) not in sent:
                scenario.steps.append(barrier(channel, checkpoint_id))
    close_with_end = draw(st.booleans())
    for channel in range(num_channels):
        if channel not in ended:
            scenario.steps.append(
                Send(channel, END_OF_PARTITION) if close_with_end else barrier(channel, newest + 1)
            )
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
    #: Checkpoints triggered with unaligned options.
    unaligned: set[int] = field(default_factory=set)


def run(scenario: Scenario, handler_of: Any) -> Run:
    """Feed ``scenario`` to a task-like reader over real channels and gates; read until stuck.

    Every batch the task gets is logged (``("out", channel, batch)``) where it gets it, so
    the invariants know what the task had processed when a checkpoint was triggered."""
    log: list[LogEntry] = []
    channels = [LoggingChannel(i, log) for i in range(scenario.num_channels)]
    gate = InputGate(channels, Wakeup())
    timer = ManualTimer(ManualClock(0))
    channel_state = ChannelStateWriter()
    handler = handler_of(
        scenario.num_channels, gate, LoggingActions(log, channel_state), timer, channel_state
    )
    checkpointed = CheckpointedInputGate(gate, handler)
    output: list[Any] = []
    blocked_ever = False
    trigger_times: dict[int, int] = {}

    def read(limit: int | None) -> None:
        nonlocal blocked_ever
        while limit is None or limit > 0:
            polled = checkpointed.poll_next()
            blocked_ever = blocked_ever or bool(gate.blocked_channels())
            if polled is None:
                return
            output.append(polled)
            if isinstance(polled[1], list):
                log.append(("out", polled[0], polled[1]))
            if limit is not None:
                limit -= 1

    for step in scenario.steps:
        if isinstance(step, Send):
            channels[step.channel].deliver(channels[step.channel].send, step.item)
        elif isinstance(step, SendPriority):
            timestamp = trigger_times.setdefault(step.checkpoint_id, timer.clock.now_ms())
            barrier = CheckpointBarrier(step.checkpoint_id, timestamp, step.options)
            channels[step.channel].deliver(channels[step.channel].send_priority, barrier)
        elif isinstance(step, Tick):
            timer.advance(step.ms)
        elif isinstance(step, Race):
            channels[step.channel].racing = True
        else:
            read(step.count)
    for channel in channels:  # the producers' last sends arrive in the end
        channel.flush_racing()
    read(None)
    unaligned = {entry[1] for entry in log if entry[0] == "trigger" and entry[2].is_unaligned}
    return Run(log, output, gate, handler, channels, blocked_ever, unaligned)


def checkpoint_id_of(item: Any) -> int | None:
    if isinstance(item, PriorityBarrier):
        return item.barrier.checkpoint_id
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
        got = [batch for index, batch in result.output if index == channel and isinstance(batch, list)]
        assert got == expected, channel
    # Started checkpoints: triggered or aborted exactly once, nothing else; triggers increase.
    started: list[int] = []
    newest = 0
    outcomes: dict[int, list[str]] = {}
    # What the handler was given, in order: the reads (in-band events are handed over as they
    # are read) or, when priority barriers are about (handed over first, or after the item
    # taken with them), what a LoggingHandler logged.
    given = ("given",) if any(entry[0] == "given" for entry in result.log) else ("read", "priority")
    for entry in result.log:
        if entry[0] in given:
            checkpoint_id = checkpoint_id_of(entry[2])
            if checkpoint_id is not None and checkpoint_id > newest:
                newest = checkpoint_id
                started.append(checkpoint_id)
        elif entry[0] in ("trigger", "abort"):
            outcomes.setdefault(entry[1], []).append(entry[0])
    for checkpoint_id in started:
        ended = outcomes.get(checkpoint_id, [])
        # an unaligned checkpoint is triggered at its first barrier and may still be aborted
        # before its channel state is complete (check_channel_state checks that case)
        assert len(ended) == 1 or (checkpoint_id in result.unaligned and ended == ["trigger", "abort"]), (
            checkpoint_id,
            ended,
        )
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
        if entry[0] != "read":
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


def check_channel_state(scenario: Scenario, result: Run) -> None:
    """Unaligned checkpoints: each one's channel state is finished or dropped exactly once,
    dropped exactly when the checkpoint was aborted after its trigger, and nothing collects
    any more at the end."""
    states: dict[int, list[Any]] = {}
    for entry in result.log:
        if entry[0] == "state":
            states.setdefault(entry[1], []).append(entry[2])
    assert set(states) == result.unaligned, (set(states), result.unaligned)
    aborted = {entry[1] for entry in result.log if entry[0] == "abort"}
    for checkpoint_id, outcomes in states.items():
        assert len(outcomes) == 1, (checkpoint_id, outcomes)
        assert (outcomes[0] is None) == (checkpoint_id in aborted), (checkpoint_id, outcomes[0])
    handler = result.handler
    assert isinstance(handler, SingleCheckpointBarrierHandler)
    assert handler.channel_state.checkpoint_id is None
    assert handler.persisting == set() and handler.announced == {}


def check_snapshots_are_exact(scenario: Scenario, result: Run) -> None:
    """Every checkpoint that completed here holds each channel's data exactly up to its barrier:
    the batches the task had got when it was triggered, then (unaligned) the channel state.
    A channel that never delivered the barrier must have ended: then all of its data."""
    before: dict[
        tuple[int, int], list[Any]
    ] = {}  # (channel, checkpoint id) -> batches sent before its barrier
    sent: dict[int, list[Any]] = {c: [] for c in range(scenario.num_channels)}
    for step in scenario.steps:
        if isinstance(step, Send) and isinstance(step.item, list):
            sent[step.channel].append(step.item)
        elif isinstance(step, (Send, SendPriority)):
            checkpoint_id = (
                step.checkpoint_id if isinstance(step, SendPriority) else checkpoint_id_of(step.item)
            )
            if checkpoint_id is not None and not isinstance(
                step.item if isinstance(step, Send) else None, CancelCheckpointMarker
            ):
                before.setdefault((step.channel, checkpoint_id), list(sent[step.channel]))
    states = {entry[1]: entry[2] for entry in result.log if entry[0] == "state"}
    for position, entry in enumerate(result.log):
        if entry[0] != "trigger":
            continue
        checkpoint_id, options = entry[1], entry[2]
        in_state: dict[int, list[Any]] = {}
        if options.is_unaligned:
            state = states[checkpoint_id]
            if state is None:
                continue  # aborted: never acknowledged
            for channel, payloads in state.per_channel.items():
                items = [pickle.loads(p) for p in payloads]
                assert all(isinstance(i, (list, Watermark, WatermarkStatus)) for i in items), items
                in_state[channel] = [i for i in items if isinstance(i, list)]
        got: dict[int, list[Any]] = {c: [] for c in range(scenario.num_channels)}
        for earlier in result.log[:position]:
            if earlier[0] == "out":
                got[earlier[1]].append(earlier[2])
        for channel in range(scenario.num_channels):
            expected = before.get((channel, checkpoint_id), sent[channel])
            assert got[channel] + in_state.get(channel, []) == expected, (
                f"checkpoint {checkpoint_id} ({options.alignment.name}), channel {channel}: "
                f"processed {got[channel]} + channel state {in_state.get(channel, [])} != sent before "
                f"its barrier {expected}"
            )


# ---------------------------------------------------------------------- the properties


def aligned_handler(end_of_partition_aborts: bool) -> Any:
    def make(
        num_channels: int, gate: InputGate, actions: LoggingActions, *_: Any
    ) -> CheckpointBarrierHandler:
        return SingleCheckpointBarrierHandler(
            num_channels, gate, actions, ManualClock(0), end_of_partition_aborts=end_of_partition_aborts
        )

    return make


class LoggingHandler(SingleCheckpointBarrierHandler):
    """The real handler; each barrier or cancel marker it is given is also logged
    (``("given", channel, event)``) before it acts on it."""

    def __init__(self, log: list[LogEntry], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log = log

    def process_barrier(self, barrier: CheckpointBarrier, channel: int) -> None:
        self.log.append(("given", channel, barrier))
        super().process_barrier(barrier, channel)

    def process_priority_barrier(self, priority: PriorityBarrier, channel: int) -> None:
        self.log.append(("given", channel, priority))
        super().process_priority_barrier(priority, channel)

    def process_cancellation_barrier(self, marker: CancelCheckpointMarker, channel: int) -> None:
        self.log.append(("given", channel, marker))
        super().process_cancellation_barrier(marker, channel)


def unaligned_handler(end_of_partition_aborts: bool) -> Any:
    def make(
        num_channels: int,
        gate: InputGate,
        actions: LoggingActions,
        timer: ManualTimer,
        channel_state: ChannelStateWriter,
    ) -> CheckpointBarrierHandler:
        return LoggingHandler(
            actions.log,
            num_channels,
            gate,
            actions,
            timer.clock,
            end_of_partition_aborts=end_of_partition_aborts,
            timer=timer,
            channel_state=channel_state,
        )

    return make


def tracker(max_checkpoints_to_track: int) -> Any:
    def make(
        num_channels: int, gate: InputGate, actions: LoggingActions, *_: Any
    ) -> CheckpointBarrierHandler:
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


def check_unaligned_run(scenario: Scenario, end_of_partition_aborts: bool) -> None:
    result = run(scenario, unaligned_handler(end_of_partition_aborts))
    check_common(scenario, result)
    check_channel_state(scenario, result)
    check_snapshots_are_exact(scenario, result)
    handler = result.handler
    assert isinstance(handler, SingleCheckpointBarrierHandler)
    assert not handler.is_checkpoint_pending and not handler.is_aligning


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None)
@given(scenario=mixed_scenarios(), end_of_partition_aborts=st.booleans())
def test_unaligned_and_timeout_handler_invariants(scenario: Scenario, end_of_partition_aborts: bool) -> None:
    check_unaligned_run(scenario, end_of_partition_aborts)


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None)
@given(scenario=mixed_scenarios(st.just("timeout")), end_of_partition_aborts=st.booleans())
def test_alignment_timeout_invariants(scenario: Scenario, end_of_partition_aborts: bool) -> None:
    """Only aligned checkpoints with a timeout: more alignments time out midway."""
    check_unaligned_run(scenario, end_of_partition_aborts)


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
    assert [entry[:2] for entry in result.log if entry[0] in ("trigger", "abort")] == [("trigger", 1)]
    assert isinstance(list(iter_reads(result))[-1][1], EndOfPartition)
    check_common(scenario, result)
    check_alignment(result)
