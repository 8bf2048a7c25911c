"""The buffer timeout while a task is busy: the output flusher and the chunks of slow batches.

On a manual clock, with real writers on real LocalChannels: the flusher sends what waited
half the timeout and says when to look next; it never waits for the writer's lock (the task
thread holds it while it emits) nor for credit; a failed send stops it and reaches the task.
A slow batch goes to the operators in chunks of at most half the timeout, one record first
(the promise holds from the first record), with the task's check between two chunks; a
timeout of 0 makes every chunk one record; an Arrow batch is never cut. And the option itself:
Flink's -1 and ``execution.buffer-timeout.enabled``.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

from chandy import StreamExecutionEnvironment
from chandy.config import Configuration
from chandy.config.options import ExecutionOptions
from chandy.errors import ConfigurationError
from chandy.graph.execution_graph import ExecutionGraph
from chandy.network.channel import LocalChannel
from chandy.task.arrow_partitioners import ArrowForwardPartitioner
from chandy.task.arrow_writer import ArrowRecordWriter
from chandy.task.chunked_input import ChunkedInput
from chandy.task.deployment import TaskDeploymentDescriptor
from chandy.task.output_flusher import RETRY_SHARE, OutputFlusher
from chandy.task.partitioners import RebalancePartitioner
from chandy.task.record_writer import RecordWriter
from chandy.task.services import TaskServices
from chandy.task.stream_task import StreamTask
from chandy.util.clock import ManualClock
from tests.test_arrow_writer import drain
from tests.test_task_checkpoint_failures import RecordingListener, wait_for

MS = 1_000_000
#: Half of a 100 ms buffer timeout: how long a record may wait in a writer.
MAX_WAIT_NS = 50 * MS


def writer_on(
    clock: ManualClock, channels: int = 2, capacity: int = 4
) -> tuple[RecordWriter, list[LocalChannel]]:
    outputs = [LocalChannel(capacity, name=f"out{c}") for c in range(channels)]
    partitioner = RebalancePartitioner()
    partitioner.setup(channels, 0)
    return RecordWriter(outputs, partitioner, 1024, clock.monotonic_ns), outputs


def test_the_flusher_sends_what_waited_half_the_timeout_and_says_when_to_look_next() -> None:
    clock = ManualClock()
    writer, outputs = writer_on(clock)
    flusher = OutputFlusher([writer], MAX_WAIT_NS, clock.monotonic_ns, "Map (1/1)")
    assert flusher.flush_due() == MAX_WAIT_NS, "nothing pending: look again after the whole wait"

    writer.emit_batch([1, 2, 3])
    clock.advance_ms(30)
    assert flusher.flush_due() == 20 * MS, "due in 20 ms"
    assert [drain(c) for c in outputs] == [[], []]

    clock.advance_ms(20)
    assert flusher.flush_due() == MAX_WAIT_NS
    assert sorted(r for c in outputs for item in drain(c) for r in item) == [1, 2, 3]
    assert writer.pending_since_ns == 0

    # The oldest record sets the deadline: a later emit does not push it back.
    writer.emit_batch([4])
    clock.advance_ms(40)
    writer.emit_batch([5])
    clock.advance_ms(10)
    flusher.flush_due()
    assert sorted(r for c in outputs for item in drain(c) for r in item) == [4, 5]


def test_the_flusher_never_waits_for_the_lock_the_task_thread_holds() -> None:
    clock = ManualClock()
    writer, outputs = writer_on(clock)
    flusher = OutputFlusher([writer], MAX_WAIT_NS, clock.monotonic_ns, "Map (1/1)")
    writer.emit_batch([1, 2])
    clock.advance_ms(60)
    held, release = threading.Event(), threading.Event()

    def emitting() -> None:  # the task thread, in the middle of an emit
        with writer.lock:
            held.set()
            release.wait(30)

    task_thread = threading.Thread(target=emitting)
    task_thread.start()
    try:
        assert held.wait(30)
        assert flusher.flush_due() == MAX_WAIT_NS // RETRY_SHARE, "busy: try again soon"
        assert [drain(c) for c in outputs] == [[], []]
    finally:
        release.set()
        task_thread.join(30)
    flusher.flush_due()
    assert sorted(r for c in outputs for item in drain(c) for r in item) == [1, 2]


def test_a_channel_without_credit_keeps_its_buffer_and_the_others_are_sent() -> None:
    clock = ManualClock()
    writer, (full, free) = writer_on(clock, capacity=1)
    full.send(["queued"])  # no credit left on this one
    writer.emit_batch([1, 2, 3, 4])
    clock.advance_ms(50)
    assert flusher_once(writer, clock) == MAX_WAIT_NS // RETRY_SHARE
    assert drain(free) != [] and writer.pending_since_ns, "the full channel's records stay pending"
    assert drain(full) == [["queued"]]  # the consumer takes: credit again
    flusher_once(writer, clock)
    assert len(drain(full)) == 1 and writer.pending_since_ns == 0


def flusher_once(writer: RecordWriter, clock: ManualClock) -> int:
    return OutputFlusher([writer], MAX_WAIT_NS, clock.monotonic_ns, "Map (1/1)").flush_due()


def test_the_arrow_writer_is_flushed_the_same_way() -> None:
    clock = ManualClock()
    channel = LocalChannel(4, name="out")
    partitioner = ArrowForwardPartitioner()
    partitioner.setup(1, 0)
    writer = ArrowRecordWriter([channel], partitioner, 65536, clock.monotonic_ns)
    writer.emit_batch(pa.record_batch({"x": [1, 2]}))
    writer.emit_batch(pa.record_batch({"x": [3]}))
    clock.advance_ms(50)
    flusher_once(writer, clock)
    (batch,) = drain(channel)
    assert batch.column("x").to_pylist() == [1, 2, 3] and writer.records_out == 3


class BrokenChannel(LocalChannel):
    def send_overdraft(self, item: Any) -> None:
        raise OSError("connection reset")


def test_a_failed_send_stops_the_flusher_thread_and_is_handed_to_the_task() -> None:
    writer = RecordWriter([BrokenChannel(4, name="out")], RebalancePartitioner(), 1024)
    writer.partitioner.setup(1, 0)
    failures: list[BaseException] = []
    flusher = OutputFlusher([writer], MS, lambda: writer.pending_since_ns + MS, "Map (1/1)", failures.append)
    writer.emit_batch([1])
    flusher.start()
    wait_for(lambda: bool(failures), "the flusher to fail")
    flusher.stop()
    assert isinstance(failures[0], OSError) and flusher.failure is failures[0]


def test_the_flusher_thread_sends_while_the_task_thread_is_elsewhere_and_stops_when_asked() -> None:
    writer = RecordWriter([LocalChannel(4, name="out")], RebalancePartitioner(), 1024)
    writer.partitioner.setup(1, 0)
    flusher = OutputFlusher([writer], MS, writer._now_ns, "Map (1/1)")
    flusher.start()
    try:
        writer.emit_batch([1, 2])
        wait_for(lambda: writer.channels[0].backlog() == 1, "the flusher to send the records")
    finally:
        flusher.stop()
    assert not any(t.name == "OutputFlusher for Map (1/1)" for t in threading.enumerate())
    assert writer.channels[0].poll() == [1, 2]


# ---------------------------------------------------------------------- chunks of slow batches


class SlowHead:
    """An operator costing ``ms_per_record`` on the manual clock; records its chunks."""

    def __init__(self, clock: ManualClock, ms_per_record: float) -> None:
        self.clock = clock
        self.ms_per_record = ms_per_record
        self.chunks: list[int] = []

    def process_batch(self, batch: Any) -> None:
        self.chunks.append(len(batch))
        self.clock.advance_ms(self.ms_per_record * len(batch))


def test_a_slow_batch_goes_in_chunks_of_half_the_timeout_with_the_check_between_them() -> None:
    clock = ManualClock()
    checks: list[int] = []
    chunked = ChunkedInput(
        None, clock.monotonic_ns, MAX_WAIT_NS, probe_records=1, after_chunk=lambda: checks.append(1)
    )
    head = SlowHead(clock, 200)  # 10 records at 0.2 s: Flink sends each within 100 ms
    chunked.process(head.process_batch, 0, list(range(10)))
    assert head.chunks == [1] * 10, "the first record alone (measured), then one per chunk"
    assert len(checks) == 9, "the task checks its writers between two chunks"

    fast = SlowHead(clock, 0.01)  # 1,024 records in 10 ms: whole, as always
    chunked = ChunkedInput(None, clock.monotonic_ns, MAX_WAIT_NS, probe_records=1)
    chunked.process(fast.process_batch, 0, list(range(1024)))
    chunked.process(fast.process_batch, 0, list(range(1024)))
    assert fast.chunks == [1, 1023, 1024]

    medium = SlowHead(clock, 1)  # 1 ms a record: chunks of 50
    chunked = ChunkedInput(None, clock.monotonic_ns, MAX_WAIT_NS, probe_records=1)
    chunked.process(medium.process_batch, 0, list(range(120)))
    assert medium.chunks == [1, 50, 50, 19]


def test_a_source_reads_what_takes_a_chunks_time() -> None:
    clock = ManualClock()
    chunked = ChunkedInput(None, clock.monotonic_ns, MAX_WAIT_NS, probe_records=1)
    assert chunked.limit(1024) == 1, "the first read is one record, measured"
    chunked.observe(200 * MS, 1)
    assert chunked.limit(1024) == 1
    chunked.observe(0, 0)  # nothing read: no measurement
    assert chunked.ns_per_record == 200 * MS
    fast = ChunkedInput(None, clock.monotonic_ns, MAX_WAIT_NS, probe_records=1)
    fast.observe(10_000, 1)  # 10 us a record: 1,024 take 10 ms
    assert fast.limit(1024) == 1024
    fast.observe(100_000, 1)  # 100 us (the average moves a quarter of the way): 32.5 us
    assert fast.limit(4096) == int(MAX_WAIT_NS / 32_500)


def test_a_timeout_of_zero_processes_one_record_per_chunk_and_an_arrow_batch_is_never_cut() -> None:
    clock = ManualClock()
    checks: list[int] = []
    chunked = ChunkedInput(None, clock.monotonic_ns, 0, probe_records=1, after_chunk=lambda: checks.append(1))
    head = SlowHead(clock, 0.001)
    chunked.process(head.process_batch, 0, list(range(5)))
    chunked.process(head.process_batch, 0, list(range(3)))
    assert head.chunks == [1] * 8 and len(checks) == 6
    assert chunked.limit(1024) == 1

    batch = pa.record_batch({"x": list(range(100))})
    head.chunks.clear()
    slow = SlowHead(clock, 200)
    chunked = ChunkedInput(None, clock.monotonic_ns, MAX_WAIT_NS, probe_records=1)
    chunked.process(slow.process_batch, 0, batch)
    chunked.process(slow.process_batch, 0, batch)
    assert slow.chunks == [100, 100], "a batch function sees the batches it was given"


# ---------------------------------------------------------------------- the option


def task_of(config: dict[str, Any], name: str = "Map") -> StreamTask:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    env.configure(config)
    env.from_sequence(0, 9).rebalance().map(lambda v: v).rebalance().add_sink(lambda v: None)
    graph = ExecutionGraph(env._build_job_graph("buffer timeout"))
    tdds: list[TaskDeploymentDescriptor] = [
        graph.deployment_descriptor(subtasks[0]) for subtasks in graph.vertices.values()
    ]
    (tdd,) = [t for t in tdds if t.task_name.startswith(name)]
    return StreamTask(
        tdd,
        [LocalChannel(4) for _ in range(tdd.num_input_channels)],
        [[LocalChannel(4)] for _ in tdd.outputs],
        TaskServices(clock=ManualClock()),
        RecordingListener(),
    )


@pytest.mark.parametrize(
    ("config", "flush_wait_ns", "flusher"),
    [
        ({}, 50 * MS, True),
        ({"execution.buffer-timeout": "10 ms"}, 5 * MS, True),
        ({"execution.buffer-timeout": 0}, 0, False),
        ({"execution.buffer-timeout": -1}, -1, False),
        ({"execution.buffer-timeout": "-1"}, -1, False),
        ({"execution.buffer-timeout.enabled": False}, -1, False),
    ],
)
def test_flinks_three_modes_of_the_buffer_timeout(
    config: dict[str, Any], flush_wait_ns: int, flusher: bool
) -> None:
    task = task_of(config)
    assert task.flush_wait_ns == flush_wait_ns
    assert (task._flusher is not None) is flusher
    assert (task._chunked is None) is (flush_wait_ns < 0), "-1 splits no batch (aligned checkpoints)"
    sink = task_of(config, "Sink")
    assert sink._flusher is None, "a sink has nothing to flush"
    # its slow batches are split only so that its counts move (half the report interval)
    assert sink._chunked is not None and sink._chunked._target_ns == 500 * MS


def test_a_buffer_timeout_below_minus_one_is_refused() -> None:
    assert Configuration({"execution.buffer-timeout": -1}).get(ExecutionOptions.BUFFER_TIMEOUT) == -1
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    with pytest.raises(ConfigurationError, match="execution.buffer-timeout"):
        env.set_buffer_timeout(-2)
    assert env.set_buffer_timeout(-1).get_buffer_timeout() == -1
