"""An unaligned barrier is taken between the records of a slow input batch.

With unaligned checkpoints enabled, a task hands a batch it expects to be slow to its
operators in chunks (:mod:`chandy.task.chunked_input`) and acts on priority barriers between
two chunks, as Flink takes a barrier between two records. Checked here:

* with a manual clock and a real gate and barrier handler: chunks follow the measured cost
  per record; an unaligned checkpoint starts after the chunk in which its barrier arrived,
  and its channel state starts with the rest of the batch, before what the barrier overtook;
* with real StreamTasks on real LocalChannels and a head that sleeps per record: the snapshot
  is taken before the batch ends (a two-input head's too), the channel state holds the rest
  of the batch first, and a restore replays it, then the rest, with nothing lost or doubled;
  an aligned checkpoint (an announced barrier with a timeout) is never taken in the middle
  of a batch; with unaligned checkpoints disabled no batch is split.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.core.functions import CoMapFunction
from chandy.graph.execution_graph import ExecutionGraph
from chandy.messages.checkpoint import CheckpointFailureReason, CheckpointOptions
from chandy.network.barrier_handler import AlignmentMetrics, SingleCheckpointBarrierHandler
from chandy.network.channel import LocalChannel
from chandy.network.channel_state import ChannelStateWriter, InputChannelState
from chandy.network.checkpointed_input_gate import CheckpointedInputGate
from chandy.network.events import CheckpointBarrier
from chandy.network.input_gate import InputGate
from chandy.network.wakeup import Wakeup
from chandy.task.chunked_input import PROBE_RECORDS, ChunkedInput
from chandy.task.deployment import TaskDeploymentDescriptor
from chandy.task.services import TaskServices
from chandy.util.clock import ManualClock
from tests.probes import Probe
from tests.test_task_checkpoint_failures import RecordingResponder, wait_for
from tests.test_task_unaligned import (
    UNALIGNED,
    Wiring,
    _descriptors,
    barrier,
    channel_state,
    restored,
    run_on_task_thread,
    running,
)

UNALIGNED_ENABLED = {"execution.checkpointing.unaligned.enabled": True}

# ---------------------------------------------------------------------- the chunks, on a manual clock


class OneChannelTask:
    """What a task does around its input, on a manual clock: a real gate of one LocalChannel,
    a real barrier handler whose actions are this object (a trigger records how much of the
    batch in hand was processed and adds the rest to the channel state, as the task does), and
    a head costing 1 ms per record that sends a priority barrier with ``options`` on the
    channel while it processes record 30."""

    def __init__(self, options: CheckpointOptions) -> None:
        self.options = options
        self.clock = ManualClock()
        self.channel = LocalChannel(64, name="in")
        gate = InputGate([self.channel], Wakeup())
        self.channel_state = ChannelStateWriter()
        handler = SingleCheckpointBarrierHandler(1, gate, self, self.clock, channel_state=self.channel_state)
        self.gate = CheckpointedInputGate(gate, handler)
        self.chunked = ChunkedInput(self.gate, self.clock.monotonic_ns)
        self.processed: list[int] = []
        self.chunks: list[int] = []
        self.triggered: list[tuple[int, int]] = []
        self.completed: list[InputChannelState | None] = []

    def head(self, batch: list[int]) -> None:
        self.chunks.append(len(batch))
        for record in batch:
            self.clock.advance_ms(1)
            self.processed.append(record)
            if record == 30:
                self.channel.send_priority(CheckpointBarrier(1, self.clock.now_ms(), self.options))

    def take_and_process(self, batch: list[int]) -> None:
        assert self.gate.poll_next() == (0, batch)
        self.chunked.process(self.head, 0, batch)

    def trigger_checkpoint_on_barrier(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        self.triggered.append((barrier.checkpoint_id, len(self.processed)))
        if barrier.options.is_unaligned:
            self.chunked.persist_unprocessed(barrier.checkpoint_id, self.channel_state)
            self.channel_state.on_complete(barrier.checkpoint_id, self.completed.append)

    def abort_checkpoint_on_barrier(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        raise AssertionError(f"checkpoint {checkpoint_id} aborted: {reason}")


def test_chunks_follow_the_measured_cost_and_the_rest_of_the_batch_comes_first_in_the_channel_state() -> None:
    task = OneChannelTask(UNALIGNED)
    big, after = list(range(100)), list(range(100, 110))
    task.channel.send(big)
    task.channel.send(after)  # queued behind the batch, before the barrier: it overtakes this one
    task.take_and_process(big)

    # A first chunk to measure (1 ms per record), then chunks of the 10 ms target.
    assert task.chunks == [PROBE_RECORDS] + [10] * 8 + [4]
    assert task.chunked.ns_per_record == 1_000_000
    # The barrier came during the chunk 26..35: the checkpoint started right after it.
    assert task.triggered == [(1, 36)]
    (state,) = task.completed
    assert state is not None
    assert [pickle.loads(p) for p in state.per_channel[0]] == [big[36:], after]
    assert task.processed == big, "the rest of the batch is processed too, after the snapshot"

    # A batch expected to take no longer than the target is processed whole.
    task.chunks.clear()
    task.chunked.process(task.head, 0, list(range(200, 210)))
    assert task.chunks == [10]


def test_an_announced_barrier_reached_mid_batch_waits_for_the_next_poll() -> None:
    """An aligned barrier with a timeout that the gate reached while the batch is in hand is
    not processed in order between two chunks: an aligned snapshot would lose the rest."""
    task = OneChannelTask(CheckpointOptions(aligned_checkpoint_timeout_ms=60_000))
    big = list(range(100))
    task.channel.send(big)  # alone: the barrier announced behind it is reached at once
    task.take_and_process(big)
    assert task.triggered == [], "not between two chunks"
    assert task.gate.poll_next() is None
    assert task.triggered == [(1, 100)], "aligned, after the whole batch"


# ---------------------------------------------------------------------- real tasks

#: Records of the slow batch; the head sleeps SLOW_MS per record, so it takes >= 1 s: the test
#: thread has that long to send its barriers while the task is in the batch.
BIG = 1_000
SLOW_MS = 1.0


def _slow(value: Any) -> Any:
    time.sleep(SLOW_MS / 1000)  # the operator's own cost, not a synchronization
    return value


def slow_map(config: dict[str, Any]) -> TaskDeploymentDescriptor:
    return _descriptors(config, function=_slow)["Map"]


def queue_big_batch(wiring: Wiring) -> list[tuple[int, int]]:
    """Channel 0: one slow batch, then small ones; channel 1: small ones. The gate reads
    channel 0 first, so the task starts with the slow batch."""
    big = [(0, i) for i in range(BIG)]
    wiring.send(0, big)
    for i in range(BIG, BIG + 3):
        wiring.send(0, [(0, i)])
        wiring.send(1, [(1, i)])
    return big


def processing_big_batch(wiring: Wiring) -> None:
    """Wait until the task took the slow batch (channel 0's first item): it processes it for
    the next second at least."""
    wait_for(lambda: wiring.inputs[0].taken >= 1, "the task to take the slow batch")


def records_before_the_forwarded_barrier(wiring: Wiring) -> tuple[list[tuple[int, int]], list[Any]]:
    """The records the task emitted before the barrier it forwarded (its snapshot came after
    exactly these), and every later output item."""
    priority = wiring.output.poll_priority()
    assert priority is not None, "the barrier went downstream"
    items = wiring.drain()
    before = [r for item in items[: priority.position] for r in item]
    return before, items[priority.position :]


def unaligned_checkpoint_mid_batch(
    config: dict[str, Any], wiring: Wiring, responder: RecordingResponder
) -> list[tuple[int, int]]:
    """Unaligned barriers on both channels while the slow Map task processes the slow batch
    (queued on ``wiring``); the records it emitted before its snapshot."""
    with running(slow_map(config), wiring, TaskServices(checkpoint_responder=responder)):
        processing_big_batch(wiring)
        for channel in wiring.inputs:
            channel.send_priority(barrier(1, UNALIGNED))
        wait_for(lambda: len(responder.acks) == 1, "the acknowledgement")
        before, _ = records_before_the_forwarded_barrier(wiring)
    return before


def test_a_slow_batch_is_split_and_the_rest_is_the_first_in_flight_data_of_its_channel() -> None:
    responder = RecordingResponder()
    wiring = Wiring(output_capacity=1_000)
    big = queue_big_batch(wiring)
    before = unaligned_checkpoint_mid_batch(UNALIGNED_ENABLED, wiring, responder)
    ack = responder.acks[0]
    assert ack.metrics.unaligned and not responder.declines
    k = len(before)
    assert 0 < k < BIG, f"the snapshot came after {k} of the batch's {BIG} records: in its middle"
    assert before == big[:k]
    state = channel_state(ack, slow_map(UNALIGNED_ENABLED))
    assert state[0] == [big[k:], *wiring.sent[0][1:]], "the rest of the batch first, then what was queued"
    assert state[1] == wiring.sent[1]


@pytest.mark.slow
def test_a_restore_replays_the_rest_of_the_batch_then_the_rest_with_nothing_lost_or_doubled() -> None:
    responder = RecordingResponder()
    first = Wiring(output_capacity=1_000)
    big = queue_big_batch(first)
    before = unaligned_checkpoint_mid_batch(UNALIGNED_ENABLED, first, responder)
    k = len(before)
    assert 0 < k < BIG

    wiring = Wiring(output_capacity=1_000)
    wiring.queue(first=1_000, n=3)  # new input after the restore
    sent_before = {c: [r for batch in first.sent[c] for r in batch] for c in range(2)}
    new = {c: [r for batch in wiring.sent[c] for r in batch] for c in range(2)}
    expected = sum(len(v) for v in sent_before.values()) - k + sum(len(v) for v in new.values())
    tdd = slow_map(UNALIGNED_ENABLED)
    with running(restored(tdd, responder.acks[0].state), wiring, TaskServices()) as (task, _):
        records = wiring.records_until(lambda so_far: len(so_far) >= expected, "every record")
        for _ in range(2):  # a whole turn of the loop after the last input: anything left is flushed
            run_on_task_thread(task)
        records += [r for batch in wiring.drain() for r in batch]
    assert len(records) == expected, "nothing lost, nothing doubled"
    assert [r for r in records if r[0] == 0] == big[k:] + sent_before[0][BIG:] + new[0]
    assert [r for r in records if r[0] == 1] == sent_before[1] + new[1]
    assert sorted(before + records) == sorted(sent_before[0] + sent_before[1] + new[0] + new[1])


def test_an_aligned_checkpoint_is_never_taken_in_the_middle_of_a_batch() -> None:
    tdd = slow_map(UNALIGNED_ENABLED)
    responder = RecordingResponder()
    wiring = Wiring(output_capacity=1_000)
    big = [(0, i) for i in range(BIG)]
    wiring.send(0, big)  # alone: its channel's announced barrier is reached at once
    timeoutable = CheckpointOptions(aligned_checkpoint_timeout_ms=600_000)
    with running(tdd, wiring, TaskServices(checkpoint_responder=responder)):
        processing_big_batch(wiring)
        for channel in wiring.inputs:
            channel.send_priority(barrier(1, timeoutable))
        wiring.send(0, [(0, BIG)])
        wiring.send(1, [(1, BIG)])  # after the barriers
        wait_for(lambda: len(responder.acks) == 1, "the acknowledgement")
        before, after_items = records_before_the_forwarded_barrier(wiring)
        after = [r for item in after_items for r in item]
        after += wiring.records_until(lambda so_far: len(after) + len(so_far) >= 2, "the later records")
    ack = responder.acks[0]
    assert not ack.metrics.unaligned and not responder.declines
    assert ack.state is None or all(not s.input_channel_state for s in ack.state.subtask_states.values())
    assert before == big, "the snapshot came after the whole batch"
    assert sorted(after) == [(0, BIG), (1, BIG)], "what came after the barrier"


def test_with_unaligned_checkpoints_disabled_no_batch_is_split() -> None:
    responder = RecordingResponder()
    wiring = Wiring(output_capacity=1_000)
    big = queue_big_batch(wiring)
    # Unaligned barriers all the same (as if the config were ignored): taken between batches.
    before = unaligned_checkpoint_mid_batch({}, wiring, responder)
    assert before == big, "the whole batch was processed before the snapshot"
    assert channel_state(responder.acks[0], slow_map({}))[0] == wiring.sent[0][1:]


class SlowCoMap(CoMapFunction):
    def map1(self, value: Any) -> Any:
        return _slow(value)

    def map2(self, value: Any) -> Any:
        return _slow(value)


def test_a_two_input_head_is_split_too() -> None:
    """Two sources -> connect -> a slow CoMap: the slow batch comes on the second input's channel."""
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    env.enable_checkpointing(60_000)
    env.configure({"chandy.network.batch-size": 4, **UNALIGNED_ENABLED})
    first, second = env.from_sequence(0, 10**9), env.from_sequence(0, 10**9)
    first.rebalance().connect(second.rebalance()).map(SlowCoMap()).rebalance().add_sink(lambda v: None)
    graph = ExecutionGraph(env._build_job_graph("two inputs"))
    (tdd,) = [
        graph.deployment_descriptor(subtasks[0])
        for subtasks in graph.vertices.values()
        if graph.deployment_descriptor(subtasks[0]).num_input_channels == 2
    ]
    assert tdd.input_types == (1, 2)
    responder = RecordingResponder()
    wiring = Wiring(output_capacity=1_000)
    big = [(1, i) for i in range(BIG)]
    wiring.send(1, big)
    with running(tdd, wiring, TaskServices(checkpoint_responder=responder)):
        wait_for(lambda: wiring.inputs[1].taken >= 1, "the task to take the slow batch")
        for channel in wiring.inputs:
            channel.send_priority(barrier(1, UNALIGNED))
        wait_for(lambda: len(responder.acks) == 1, "the acknowledgement")
        before, _ = records_before_the_forwarded_barrier(wiring)
    k = len(before)
    assert 0 < k < BIG and before == big[:k], f"the snapshot came after {k} of {BIG} records"
    assert channel_state(responder.acks[0], tdd) == {1: [big[k:]]}


class SlowCounting:
    """``_slow``, counting its records in a probe (every 100th)."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.seen = 0

    def __call__(self, value: Any) -> Any:
        self.seen += 1
        if self.seen % 100 == 0:
            self.probe.add("records", 100)
        return _slow(value)


def test_a_full_output_does_not_hold_a_priority_barrier_behind_the_flush_between_chunks() -> None:
    """The slow batch's records leave by the buffer timeout's flush between chunks; the output
    (capacity 1) is full after the first, and nobody consumes it. The flushes after that send
    only where there is credit, so the task gets back to its chunks and takes the barrier
    between two of them. (A flush that waited for credit held the barrier until a consumer
    came: under backpressure, unaligned checkpoints expired.)"""
    responder = RecordingResponder()
    wiring = Wiring(output_capacity=1)
    queue_big_batch(wiring)
    # Batches of more records than the slow one holds: its records leave by the flushes alone.
    config = {**UNALIGNED_ENABLED, "chandy.network.batch-size": 10 * BIG}
    probe = Probe()
    tdd = _descriptors(config, function=SlowCounting(probe))["Map"]
    with running(tdd, wiring, TaskServices(checkpoint_responder=responder)):
        processing_big_batch(wiring)
        wait_for(lambda: not wiring.output.has_credit(), "the first flush to fill the output")
        # 300 records (300 ms) on: several flushes were due since the output filled.
        wait_for(lambda: probe.get("records") >= 300, "the task to go on through flushes due")
        for channel in wiring.inputs:
            channel.send_priority(barrier(1, UNALIGNED))
        wait_for(lambda: len(responder.acks) == 1, "the acknowledgement while the output stays full")
        # The first flush's item, and the records pending at the barrier (sent beyond credit
        # ahead of it, so that the barrier overtakes them all): nothing else was sent.
        assert wiring.output.backlog() == 2 and not responder.declines
    assert responder.acks[0].metrics.unaligned
