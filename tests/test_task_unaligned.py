"""Unaligned checkpoints at one task: real StreamTasks wired to real LocalChannels.

The test thread plays the tasks around the one under test: it is the producer of the
task's input channels (record batches, then barriers, in-band or as priority barriers) and
the consumer of its output channel, which it may leave full to backpressure the task. A
recording responder stands in for the checkpoint coordinator. What is checked is the
task's side of issue 16:

* under backpressure an unaligned barrier is acted on at once: the task snapshots,
  forwards the barrier ahead of its full output queue, and acknowledges with the data the
  barriers overtook as channel state (``unaligned=True``, the bytes persisted);
* the acknowledgement waits for the last channel's barrier, and the data a channel
  delivers before its barrier (after the snapshot) is part of the channel state;
* an aligned checkpoint with a timeout goes unaligned when the timer fires on the task
  thread while the task is backpressured;
* a restore replays each channel's state into that channel before its new input;
  a missing or corrupt channel-state file fails the task with one clear error;
* aligned checkpoints are unchanged: in-band barrier, no channel state, ``unaligned=False``;
  a source acknowledges an unaligned checkpoint with ``unaligned=True`` and no channel state.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.connectors.number_sequence import NumberSequenceSource
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.errors import InvalidCheckpointError
from chandy.graph.execution_graph import ExecutionGraph
from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    AlignmentType,
    CheckpointFailureReason,
    CheckpointOptions,
)
from chandy.messages.status import ExecutionState
from chandy.network.channel import LocalChannel
from chandy.network.channel_state import decode_payloads
from chandy.network.events import CancelCheckpointMarker, CheckpointBarrier, PriorityBarrier, Watermark
from chandy.state.handles import FileStateHandle, InputChannelStateHandle, StreamStateHandle
from chandy.state.snapshot import TaskStateSnapshot
from chandy.storage.checkpoint_storage import CheckpointStorage, StateReader
from chandy.task.deployment import TaskDeploymentDescriptor, TaskRestore
from chandy.task.partitioners import RebalancePartitioner
from chandy.task.processing_time import ProcessingTimeService, ProcessingTimeTimer
from chandy.task.record_writer import RecordWriter
from chandy.task.services import TaskServices
from chandy.task.stream_task import StreamTask
from chandy.util.clock import ManualClock
from tests.test_task_checkpoint_failures import RecordingListener, RecordingResponder, wait_for

UNALIGNED = CheckpointOptions(alignment=AlignmentType.UNALIGNED)
#: Records per output batch: each input batch holds one record, so the task sends at most
#: one batch per input batch and, once its output is full, stops reading at the next check.
BATCH_SIZE = 4
#: Batches queued on each input channel before the task starts.
QUEUED = 20

Batch = list[tuple[int, int]]


def _identity(value: Any) -> Any:
    return value


def _descriptors(
    extra_config: dict[str, Any] | None = None, function: Callable[[Any], Any] = _identity
) -> dict[str, TaskDeploymentDescriptor]:
    """Source (parallelism 2) -> rebalance -> Map (1) -> rebalance -> sink (1): the Map task
    has two input channels and one output channel. By vertex name prefix."""
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    env.enable_checkpointing(60_000)  # the tests send the barriers themselves
    env.configure({"chandy.network.batch-size": BATCH_SIZE, **(extra_config or {})})
    env.from_sequence(0, 10**9).set_parallelism(2).rebalance().map(function).rebalance().add_sink(
        lambda v: None
    )
    return descriptors_of(env, "unaligned at one task")


def descriptors_of(env: StreamExecutionEnvironment, job_name: str) -> dict[str, TaskDeploymentDescriptor]:
    """The first subtask's deployment descriptor of every task of ``env``'s job, by the
    first word of the task's name."""
    graph = ExecutionGraph(env._build_job_graph(job_name))
    found: dict[str, TaskDeploymentDescriptor] = {}
    for subtasks in graph.vertices.values():
        tdd = graph.deployment_descriptor(subtasks[0])
        found[tdd.task_name.split(" ")[0]] = tdd
    return found


def map_descriptor(function: Callable[[Any], Any] = _identity) -> TaskDeploymentDescriptor:
    tdd = _descriptors(function=function)["Map"]
    assert tdd.num_input_channels == 2 and len(tdd.outputs) == 1
    return tdd


class Wiring:
    """The channels of the Map task, with what the test sent on each input."""

    def __init__(self, output_capacity: int = 1) -> None:
        self.inputs = [LocalChannel(64, name=f"in{c}") for c in range(2)]
        self.output = LocalChannel(output_capacity, name="out")
        self.sent: list[list[Batch]] = [[], []]

    def send(self, channel: int, batch: Batch) -> None:
        self.sent[channel].append(batch)
        self.inputs[channel].send(batch)

    def queue(self, first: int = 0, n: int = QUEUED) -> None:
        for i in range(first, first + n):
            for c in range(2):
                self.send(c, [(c, i)])

    def drain(self) -> list[Any]:
        """Every in-band item queued on the output now."""
        items = []
        while (item := self.output.poll()) is not None:
            items.append(item)
        return items

    def records_until(
        self, done: Callable[[list[tuple[int, int]]], bool], what: str
    ) -> list[tuple[int, int]]:
        """Keep draining the output until ``done(records so far)``; the records, in order."""
        records: list[tuple[int, int]] = []

        def drained() -> bool:
            records.extend(r for item in self.drain() if isinstance(item, list) for r in item)
            return done(records)

        wait_for(drained, what)
        return records

    def forwarded_barrier(self) -> PriorityBarrier:
        """Wait for the task to forward a priority barrier on its output."""
        found: list[PriorityBarrier] = []

        def arrived() -> bool:
            priority = self.output.poll_priority()
            if priority is not None:
                found.append(priority)
            return bool(found)

        wait_for(arrived, "a barrier forwarded downstream")
        return found[0]


@contextmanager
def running(
    tdd: TaskDeploymentDescriptor, wiring: Wiring, services: TaskServices
) -> Iterator[tuple[StreamTask, RecordingListener]]:
    listener = RecordingListener()
    task = StreamTask(tdd, wiring.inputs, [[wiring.output]], services, listener)
    thread = threading.Thread(target=task.invoke, name="Map under test", daemon=True)
    thread.start()
    try:
        yield task, listener
    finally:
        task.cancel()
        thread.join(30)
        assert not thread.is_alive()


def backpressured(task: StreamTask, wiring: Wiring) -> list[int]:
    """Wait until the task filled its output and stopped reading; how many batches it took
    from each input channel (it takes no more while the output stays full)."""
    wait_for(lambda: task.state is ExecutionState.RUNNING, "the task to run")
    wait_for(lambda: not wiring.output.has_credit(), "the task to fill its output")
    taken = [channel.taken for channel in wiring.inputs]
    assert all(n < QUEUED for n in taken), "the task stopped reading under backpressure"
    return taken


def run_on_task_thread(task: StreamTask) -> None:
    """Return once the task thread has taken a mail queued now: what it was doing when the
    mail was queued (acting on a barrier) is done."""
    done = threading.Event()
    task.mailbox.put(done.set, "test probe")
    assert done.wait(30), "the task did not take its mail"


def channel_state(ack: AcknowledgeCheckpoint, tdd: TaskDeploymentDescriptor) -> dict[int, list[Any]]:
    """The items of each input channel in the acknowledged channel state, unpickled."""
    assert ack.state is not None
    head = ack.state.subtask_states[tdd.operators[0].operator_id]
    reader = StateReader()
    state: dict[int, list[Any]] = {}
    for handle in head.input_channel_state:
        data = reader.read(handle.delegate, (handle.offset, handle.offset + handle.length))
        state[handle.channel_index] = [pickle.loads(p) for p in decode_payloads(data, "test")]
    assert list(state) == sorted(state), "channel state is kept in the order of the channels"
    return state


def barrier(
    checkpoint_id: int, options: CheckpointOptions, timestamp: int | None = None
) -> CheckpointBarrier:
    return CheckpointBarrier(
        checkpoint_id, int(time.time() * 1000) if timestamp is None else timestamp, options
    )


def take_unaligned_checkpoint(
    tdd: TaskDeploymentDescriptor, services: TaskServices, responder: RecordingResponder
) -> tuple[AcknowledgeCheckpoint, Wiring, list[int]]:
    """Checkpoint 1, unaligned, while the Map task is backpressured."""
    wiring = Wiring()
    wiring.queue()
    with running(tdd, wiring, services) as (task, _):
        taken = backpressured(task, wiring)
        for channel in wiring.inputs:
            channel.send_priority(barrier(1, UNALIGNED))
        wait_for(lambda: len(responder.acks) == 1, "the acknowledgement")
        assert not wiring.output.has_credit(), "the output stayed full: the barrier overtook it"
    return responder.acks[0], wiring, taken


# ---------------------------------------------------------------------- taking unaligned checkpoints


def test_an_unaligned_barrier_overtakes_a_full_output_and_the_ack_carries_the_overtaken_data() -> None:
    tdd = map_descriptor()
    responder = RecordingResponder()
    ack, wiring, taken = take_unaligned_checkpoint(
        tdd, TaskServices(checkpoint_responder=responder), responder
    )

    assert ack.checkpoint_id == 1 and not responder.declines
    assert ack.metrics.unaligned
    # What the task had not taken of each channel when its barrier arrived: everything after.
    expected = {c: wiring.sent[c][taken[c] :] for c in range(2)}
    assert channel_state(ack, tdd) == expected
    assert ack.metrics.bytes_persisted_during_alignment == sum(
        len(pickle.dumps(b, protocol=pickle.HIGHEST_PROTOCOL))
        for batches in expected.values()
        for b in batches
    )
    # Downstream, the barrier went ahead of every batch still queued on the full output.
    forwarded = wiring.output.poll_priority()
    assert isinstance(forwarded, PriorityBarrier)
    assert forwarded.barrier.checkpoint_id == 1 and forwarded.barrier.options.is_unaligned
    assert forwarded.position == wiring.output.sent >= 1
    assert wiring.output.backlog() >= 1, "it overtook queued output"


def test_the_ack_waits_for_the_last_channels_barrier_and_holds_what_that_channel_delivered_before_it() -> (
    None
):
    tdd = map_descriptor()
    responder = RecordingResponder()
    wiring = Wiring()
    wiring.queue()
    with running(tdd, wiring, TaskServices(checkpoint_responder=responder)) as (task, _):
        taken = backpressured(task, wiring)
        wiring.inputs[0].send_priority(barrier(1, UNALIGNED))
        assert wiring.forwarded_barrier().barrier.checkpoint_id == 1, "the snapshot on the first barrier"
        run_on_task_thread(task)  # the task is done with the first barrier
        assert not responder.acks, "channel 1 has not delivered its barrier yet"
        # The output drains: the task reads on, channel 1's batches before its barrier included.
        wiring.records_until(
            lambda _: all(c.backlog() == 0 for c in wiring.inputs), "the task to read every queued batch"
        )
        assert not responder.acks
        wiring.inputs[1].send_priority(barrier(1, UNALIGNED))
        wait_for(lambda: len(responder.acks) == 1, "the acknowledgement")
    ack = responder.acks[0]
    assert ack.metrics.unaligned and not responder.declines
    assert channel_state(ack, tdd) == {c: wiring.sent[c][taken[c] :] for c in range(2)}


def test_an_unaligned_checkpoint_aborted_before_its_channel_state_is_complete_is_never_acknowledged() -> None:
    tdd = map_descriptor()
    responder = RecordingResponder()
    wiring = Wiring()
    wiring.queue()
    with running(tdd, wiring, TaskServices(checkpoint_responder=responder)) as (task, _):
        backpressured(task, wiring)
        wiring.inputs[0].send_priority(barrier(1, UNALIGNED))
        wiring.forwarded_barrier()  # the snapshot on the first barrier
        wiring.inputs[1].send(CancelCheckpointMarker(1))  # behind channel 1's queued batches
        wiring.records_until(lambda _: bool(responder.declines), "the decline")
        assert [d.checkpoint_id for d in responder.declines] == [1]
        # The next checkpoint completes: nothing of the aborted one is left waiting.
        for channel in wiring.inputs:
            channel.send_priority(barrier(2, UNALIGNED))
        wait_for(lambda: bool(responder.acks), "the acknowledgement of checkpoint 2")
    assert [a.checkpoint_id for a in responder.acks] == [2], "checkpoint 1 was never acknowledged"
    assert responder.acks[0].metrics.unaligned


def _fails_on_the_last_queued_record(value: tuple[int, int]) -> tuple[int, int]:
    if value == (1, QUEUED - 1):
        raise RuntimeError(f"record {value} cannot be processed")
    return value


def test_a_task_that_fails_before_its_channel_state_is_complete_declines_the_checkpoint() -> None:
    tdd = map_descriptor(_fails_on_the_last_queued_record)
    responder = RecordingResponder()
    wiring = Wiring()
    wiring.queue()
    with running(tdd, wiring, TaskServices(checkpoint_responder=responder)) as (task, listener):
        backpressured(task, wiring)
        wiring.inputs[0].send_priority(barrier(1, UNALIGNED))
        wiring.forwarded_barrier()  # the snapshot on the first barrier
        wiring.records_until(lambda _: task.state is ExecutionState.FAILED, "the task to fail")
    assert not responder.acks
    (decline,) = responder.declines
    assert decline.checkpoint_id == 1
    assert decline.reason is CheckpointFailureReason.CHECKPOINT_DECLINED_TASK_CLOSING
    assert [f.message for s, f in listener.states if f is not None] == ["record (1, 19) cannot be processed"]


class FirstWriteFails(CheckpointStorage):
    """Checkpoint storage whose first state write fails, as a full disk would."""

    def __init__(self, base_uri: str, job_id: str) -> None:
        super().__init__(base_uri, job_id, inline_threshold=0)
        self.failed = False

    def write_state(
        self, checkpoint_id: int, data: bytes, target_location: str | None = None
    ) -> StreamStateHandle:
        if not self.failed:
            self.failed = True
            raise OSError(f"no space left to write {len(data)} bytes of checkpoint {checkpoint_id}")
        return super().write_state(checkpoint_id, data, target_location)


def test_a_failed_channel_state_write_declines_the_checkpoint_and_the_next_one_completes(
    tmp_path: Path,
) -> None:
    tdd = map_descriptor()
    responder = RecordingResponder()
    storage = FirstWriteFails(str(tmp_path), tdd.job_id)
    wiring = Wiring()
    wiring.queue()
    with running(tdd, wiring, TaskServices(checkpoint_responder=responder, checkpoint_storage=storage)) as (
        task,
        _,
    ):
        backpressured(task, wiring)
        for channel in wiring.inputs:
            channel.send_priority(barrier(1, UNALIGNED))
        wait_for(lambda: bool(responder.declines), "the decline")
        (decline,) = responder.declines
        assert (
            decline.checkpoint_id == 1
            and decline.reason is CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION
        )
        assert "no space left" in decline.message
        for channel in wiring.inputs:
            channel.send_priority(barrier(2, UNALIGNED))
        wait_for(lambda: bool(responder.acks), "the acknowledgement of checkpoint 2")
        assert task.state is ExecutionState.RUNNING, "the task goes on: its state is intact"
    assert [a.checkpoint_id for a in responder.acks] == [2]
    assert channel_state(responder.acks[0], tdd), "checkpoint 2 holds the data its barriers overtook"


def test_an_aligned_checkpoint_goes_unaligned_when_its_timeout_fires_under_backpressure() -> None:
    clock = ManualClock()
    tdd = map_descriptor()
    responder = RecordingResponder()
    wiring = Wiring()
    wiring.queue()
    timeoutable = CheckpointOptions(aligned_checkpoint_timeout_ms=1_000)
    with running(tdd, wiring, TaskServices(checkpoint_responder=responder, clock=clock)) as (task, _):
        taken = backpressured(task, wiring)
        for channel in wiring.inputs:  # announced: both barriers wait behind the queued batches
            channel.send_priority(barrier(1, timeoutable, clock.now_ms()))
        run_on_task_thread(task)
        assert wiring.output.poll_priority() is None and not responder.acks, "still aligning"
        clock.advance_ms(1_000)  # the task thread fires the timeout, though it reads nothing
        wait_for(lambda: len(responder.acks) == 1, "the acknowledgement")
        assert not wiring.output.has_credit(), "the output stayed full"
        forwarded = wiring.output.poll_priority()
    ack = responder.acks[0]
    assert ack.metrics.unaligned
    assert forwarded is not None and forwarded.barrier.options.is_unaligned, "unaligned from here on"
    assert channel_state(ack, tdd) == {c: wiring.sent[c][taken[c] :] for c in range(2)}


def test_an_aligned_checkpoint_is_unchanged() -> None:
    tdd = map_descriptor()
    responder = RecordingResponder()
    wiring = Wiring(output_capacity=64)
    wiring.queue(n=5)
    with running(tdd, wiring, TaskServices(checkpoint_responder=responder)):
        for channel in wiring.inputs:
            channel.send(barrier(1, CheckpointOptions()))
        wait_for(lambda: len(responder.acks) == 1, "the acknowledgement")
        assert wiring.output.poll_priority() is None, "an aligned barrier never overtakes"
        output = wiring.drain()
    ack = responder.acks[0]
    assert not ack.metrics.unaligned and ack.metrics.bytes_persisted_during_alignment == 0
    assert ack.state is None or all(not s.input_channel_state for s in ack.state.subtask_states.values())
    assert isinstance(output[-1], CheckpointBarrier) and output[-1].checkpoint_id == 1, "in-band, last"
    records = sorted(r for batch in output[:-1] for r in batch)
    assert records == sorted(r for c in range(2) for batch in wiring.sent[c] for r in batch)


def checkpoint_a_backpressured_source(
    tdd: TaskDeploymentDescriptor, output: LocalChannel, backpressured: Callable[[], bool], what: str
) -> RecordingResponder:
    """Run the source task of ``tdd`` into ``output`` (nobody consumes it) until
    ``backpressured()`` (``what``), trigger unaligned checkpoint 1, and wait for its
    acknowledgement; the responder that got it."""
    responder = RecordingResponder()
    task = StreamTask(tdd, [], [[output]], TaskServices(checkpoint_responder=responder), RecordingListener())
    thread = threading.Thread(target=task.invoke, name="source under test", daemon=True)
    thread.start()
    try:
        wait_for(backpressured, what)
        task.trigger_checkpoint_async(1, int(time.time() * 1000), UNALIGNED)
        wait_for(lambda: len(responder.acks) == 1, "the acknowledgement")
    finally:
        task.cancel()
        thread.join(30)
    return responder


def test_a_backpressured_source_acknowledges_an_unaligned_checkpoint_without_channel_state() -> None:
    output = LocalChannel(4, name="out")
    responder = checkpoint_a_backpressured_source(
        _descriptors()["Sequence"], output, lambda: not output.has_credit(), "the source to fill its output"
    )
    ack = responder.acks[0]
    assert ack.metrics.unaligned and ack.metrics.bytes_persisted_during_alignment == 0
    assert ack.state is not None, "the source's reader position"
    assert all(not s.input_channel_state for s in ack.state.subtask_states.values())
    forwarded = output.poll_priority()
    assert forwarded is not None and forwarded.barrier.checkpoint_id == 1
    assert forwarded.position == output.sent, "ahead of every batch it sent"


# ---------------------------------------------------------------------- restoring channel state


def restored(tdd: TaskDeploymentDescriptor, state: TaskStateSnapshot | None) -> TaskDeploymentDescriptor:
    assert state is not None
    return dataclasses.replace(tdd, attempt_number=1, task_restore=TaskRestore(1, state))


def test_a_restore_replays_each_channels_state_into_that_channel_before_new_input() -> None:
    tdd = map_descriptor()
    responder = RecordingResponder()
    ack, before, taken = take_unaligned_checkpoint(
        tdd, TaskServices(checkpoint_responder=responder), responder
    )
    in_flight = {c: [r for batch in before.sent[c][taken[c] :] for r in batch] for c in range(2)}
    assert all(in_flight.values())

    wiring = Wiring(output_capacity=1_000)
    wiring.queue(first=100, n=5)  # new input, queued before the task even starts
    new = {c: [r for batch in wiring.sent[c] for r in batch] for c in range(2)}
    expected = sum(len(v) for v in in_flight.values()) + sum(len(v) for v in new.values())
    with running(restored(tdd, ack.state), wiring, TaskServices()) as (task, _):
        records = wiring.records_until(lambda so_far: len(so_far) >= expected, "every record")
        for _ in range(2):  # a whole turn of the loop after the last input: anything left is flushed
            run_on_task_thread(task)
        records += [r for batch in wiring.drain() for r in batch]
    assert len(records) == expected, "nothing lost, nothing doubled"
    for c in range(2):
        assert [r for r in records if r[0] == c] == in_flight[c] + new[c], f"channel {c}: replayed first"


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_missing_or_corrupt_channel_state_file_fails_the_restore_with_one_clear_error(
    tmp_path: Path, damage: str
) -> None:
    tdd = map_descriptor()
    storage = CheckpointStorage(str(tmp_path), tdd.job_id, inline_threshold=0)
    responder = RecordingResponder()
    services = TaskServices(checkpoint_responder=responder, checkpoint_storage=storage)
    ack, _, _ = take_unaligned_checkpoint(tdd, services, responder)
    assert ack.state is not None
    handles: tuple[InputChannelStateHandle, ...] = ack.state.subtask_states[
        tdd.operators[0].operator_id
    ].input_channel_state
    files = {h.delegate for h in handles}
    assert len(files) == 1, "one stream per subtask"
    (delegate,) = files
    assert isinstance(delegate, FileStateHandle)
    if damage == "missing":
        os.remove(delegate.path)
    else:
        Path(delegate.path).write_bytes(b"\0" * delegate.size)

    wiring = Wiring(output_capacity=64)
    with running(restored(tdd, ack.state), wiring, TaskServices(checkpoint_storage=storage)) as (
        task,
        listener,
    ):
        wait_for(lambda: task.state is ExecutionState.FAILED, "the task to fail")
    (failure,) = [f for state, f in listener.states if state is ExecutionState.FAILED]
    assert failure is not None and isinstance(failure.exception, InvalidCheckpointError)
    message = failure.message
    assert delegate.path in message and "checkpoint 1" in message and damage in message
    assert "Restore from an earlier checkpoint or a savepoint" in message
    assert message.count("Restore") == 1, message


# ---------------------------------------------------------------------- the alignment timer


def test_the_alignment_timer_runs_actions_through_the_processing_time_service() -> None:
    clock = ManualClock()
    service = ProcessingTimeService(clock)
    timer = ProcessingTimeTimer(service)
    ran: list[str] = []
    timer.schedule(49.5, lambda: ran.append("timeout"))
    cancelled = timer.schedule(10, lambda: ran.append("cancelled"))
    cancelled.cancel()
    assert cancelled.cancelled
    clock.advance_ms(49)
    service.fire_due()
    assert ran == []
    clock.advance_ms(1)
    service.fire_due()
    assert ran == ["timeout"]


# ---------------------------------------------------------------------- the record writer


def test_a_priority_barrier_flushes_partial_batches_beyond_credit_and_goes_ahead_of_them() -> None:
    channels = [LocalChannel(1, name=f"out{c}") for c in range(2)]
    partitioner = RebalancePartitioner()
    partitioner.setup(2, 0)
    writer = RecordWriter(channels, partitioner, batch_size=4)
    writer.emit_batch(list(range(8)))  # one full batch per channel: no credit left
    assert not writer.is_available()
    writer.emit_batch([8, 9])  # partial batches, one record each
    writer.broadcast_priority_barrier(barrier(1, UNALIGNED))  # returns: it waits for no credit
    for channel in channels:
        priority = channel.poll_priority()
        assert priority is not None and priority.barrier.checkpoint_id == 1
        assert priority.position == 2 == channel.backlog(), "ahead of the full batch and the flushed one"
        overtaken = [pickle.loads(p) for p in channel.in_flight_before(priority.position)]
        assert [len(batch) for batch in overtaken] == [4, 1]
    assert sorted(r for c in channels for batch in iter(c.poll, None) for r in batch) == list(range(10))
    assert writer.pending_since_ns == 0 and writer.records_out == 10


def _value_as_timestamp(value: Any, record_timestamp: int) -> int:
    return int(value)


def test_a_backpressured_source_with_periodic_watermarks_still_takes_the_checkpoint_trigger() -> None:
    """The source's periodic watermark fires while its output channel has no credit. The
    watermark goes beyond credit (with the records buffered before it) instead of waiting for
    a consumer that never comes: the task stays in its loop, takes the trigger, and the
    barrier overtakes everything. (It used to wait in the watermark's send, so the checkpoint
    expired behind the backpressure it should overtake.)"""
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    env.enable_checkpointing(60_000)  # the test sends the trigger itself
    env.configure({"chandy.network.batch-size": BATCH_SIZE, "pipeline.auto-watermark-interval": 1})
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(_value_as_timestamp)
    env.from_source(NumberSequenceSource(0, 10**9), strategy, "Sequence").rebalance().map(_identity).add_sink(
        lambda v: None
    )
    output = LocalChannel(4, name="out")
    responder = checkpoint_a_backpressured_source(
        descriptors_of(env, "a watermarking source under backpressure")["Sequence"],
        output,
        lambda: output.backlog() > 4,
        "a periodic watermark beyond the full channel's credit",
    )
    assert responder.acks[0].metrics.unaligned
    queued = [output.poll() for _ in range(output.backlog())]
    assert any(isinstance(item, Watermark) for item in queued)
    assert output.poll_priority() is not None, "the barrier went ahead of the queue"
