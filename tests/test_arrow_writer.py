"""ArrowRecordWriter on real local channels: size cut, flushes, events and priority barriers."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from chandy.connectors.arrow_sources import ArrowNumberSequenceReader, ArrowNumberSequenceSource
from chandy.core.connector import SourceReaderContext
from chandy.graph.execution_graph import ExecutionGraph
from chandy.graph.job_graph import create_job_graph
from chandy.graph.stream_graph import StreamGraph
from chandy.messages.status import ExecutionState
from chandy.network.channel import LocalChannel
from chandy.network.events import END_OF_PARTITION, CheckpointBarrier, PriorityBarrier, Watermark
from chandy.state.arrow_keys import KEY_GROUP_COLUMN
from chandy.state.columnar import ColumnarKeyedStateBackend
from chandy.task.arrow_partitioners import (
    ArrowForwardPartitioner,
    ArrowKeyGroupPartitioner,
    ColumnarPartitioner,
)
from chandy.task.arrow_writer import MAX_ITEM_BYTES, ArrowRecordWriter
from chandy.task.deployment import TaskDeploymentDescriptor
from chandy.task.operator_chain import OperatorChain
from chandy.task.operators.batch import KeyedBatchAggregateOperator
from chandy.task.operators.source import SourceOperator
from chandy.task.services import TaskServices
from chandy.task.stream_task import StreamTask
from tests.test_task_checkpoint_failures import RecordingListener


def rows(start: int, n: int, key_mod: int = 5) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "key": pa.array([i % key_mod for i in range(start, start + n)], pa.int64()),
            "seq": pa.array(range(start, start + n), pa.int64()),
        }
    )


def writer_with(
    partitioner: ColumnarPartitioner, channels: int, batch_size: int, capacity: int = 1000
) -> tuple[ArrowRecordWriter, list[LocalChannel]]:
    chans = [LocalChannel(capacity, name=f"c{i}") for i in range(channels)]
    partitioner.setup(channels, 0)
    return ArrowRecordWriter(chans, partitioner, batch_size), chans


def drain(channel: LocalChannel) -> list[Any]:
    items = []
    while (item := channel.poll()) is not None:
        items.append(item)
    return items


def test_pieces_are_buffered_until_batch_size_rows_then_sent_as_one_batch() -> None:
    writer, [channel] = writer_with(ArrowForwardPartitioner(), 1, batch_size=100)
    writer.emit_batch(rows(0, 40))
    writer.emit_batch(rows(40, 40))
    assert channel.backlog() == 0 and writer.pending_since_ns > 0
    writer.emit_batch(rows(80, 30))  # 110 >= 100: one batch of all 110 rows
    [sent] = drain(channel)
    assert type(sent) is pa.RecordBatch and sent.column("seq").to_pylist() == list(range(110))
    assert (writer.records_out, writer.batches_out) == (110, 1)
    writer.emit_batch(rows(110, 0))  # an empty batch buffers nothing
    writer.flush()
    assert channel.backlog() == 0 and writer.pending_since_ns == 0
    writer.emit_batch(rows(110, 5))
    writer.flush()
    [small] = drain(channel)
    assert small.column("seq").to_pylist() == list(range(110, 115))
    writer.flush()  # nothing pending: never an empty batch
    assert channel.backlog() == 0 and writer.batches_out == 2


def test_a_huge_buffer_leaves_in_slices_of_batch_size() -> None:
    writer, [channel] = writer_with(ArrowForwardPartitioner(), 1, batch_size=100)
    writer.emit_batch(rows(0, 50))
    writer.emit_batch(rows(50, 300))  # 350 rows: 100, 100, 100, 50
    sent = drain(channel)
    assert [b.num_rows for b in sent] == [100, 100, 100, 50]
    assert pa.concat_batches(sent).column("seq").to_pylist() == list(range(350))


def test_wide_rows_leave_in_slices_of_at_most_max_item_bytes() -> None:
    """An item is cut by bytes too: 2 x batch_size rows of wide rows could exceed the TCP frame
    limit (1 GiB) and the job would restart forever. 100 rows of 1 MiB between narrow ones
    (skewed widths: slices are cut again where a slice is still too large)."""
    wide = b"w" * (1 << 20)
    payloads = [b"n"] * 30 + [wide] * 100 + [b"n"] * 30
    batch = pa.record_batch({"seq": pa.array(range(len(payloads))), "payload": pa.array(payloads)})
    assert batch.nbytes > 1.5 * MAX_ITEM_BYTES
    writer, [channel] = writer_with(ArrowForwardPartitioner(), 1, batch_size=65_536)
    writer.emit_batch(batch)
    writer.flush()
    sent = drain(channel)
    assert len(sent) >= 2 and all(0 < part.nbytes <= MAX_ITEM_BYTES for part in sent), [
        (part.num_rows, part.nbytes) for part in sent
    ]
    assert pa.concat_batches(sent).column("seq").to_pylist() == list(range(len(payloads)))
    assert (writer.records_out, writer.batches_out) == (len(payloads), len(sent))
    writer.emit_batch(batch)  # beyond credit before a priority barrier: cut the same way
    writer.broadcast_priority_barrier(CheckpointBarrier(1, 0))
    overdrafted = [item for item in drain(channel) if isinstance(item, pa.RecordBatch)]
    assert [part.num_rows for part in overdrafted] == [part.num_rows for part in sent]


def test_keyed_rows_keep_their_order_per_channel_across_random_batches_and_flushes() -> None:
    rng = random.Random(7)
    max_p = 32
    writer, channels = writer_with(ArrowKeyGroupPartitioner("key").for_target(max_p, True), 3, batch_size=64)
    start = 0
    for _ in range(200):
        n = rng.randrange(0, 50)
        writer.emit_batch(rows(start, n, key_mod=97))
        start += n
        if rng.random() < 0.1:
            writer.flush()
        if rng.random() < 0.05:
            writer.broadcast_event(Watermark(start))
    writer.broadcast_event(END_OF_PARTITION)
    seen: list[int] = []
    for index, channel in enumerate(channels):
        items = drain(channel)
        assert items[-1] is END_OF_PARTITION
        batches = [i for i in items if isinstance(i, pa.RecordBatch)]
        assert all(b.num_rows for b in batches)
        assert all(b.num_rows < 2 * 64 for b in batches)
        seq = [s for b in batches for s in b.column("seq").to_pylist()]
        assert seq == sorted(seq)
        groups = [g for b in batches for g in b.column(KEY_GROUP_COLUMN).to_pylist()]
        assert all(g * 3 // max_p == index for g in groups)
        # A watermark follows every row emitted before it.
        position = 0
        for item in items:
            if isinstance(item, pa.RecordBatch):
                position = item.column("seq").to_pylist()[-1]
            elif isinstance(item, Watermark):
                assert position < item.timestamp
        seen += seq
    assert sorted(seen) == list(range(start))
    assert writer.records_out == start


def test_events_flush_first_and_a_priority_barrier_overdrafts_the_buffer_ahead_of_itself() -> None:
    writer, [channel] = writer_with(ArrowForwardPartitioner(), 1, batch_size=1000, capacity=2)
    writer.emit_batch(rows(0, 10))
    writer.broadcast_event(Watermark(1))  # flushes first: batch then watermark
    items = [channel.poll(), channel.poll()]
    assert items[0].num_rows == 10 and items[1] == Watermark(1)
    channel.send([0])
    channel.send([1])  # the channel is now full (capacity 2)
    assert not writer.is_available()
    writer.emit_batch(rows(10, 7))
    barrier = CheckpointBarrier(3, 9)
    writer.broadcast_priority_barrier(barrier)  # must not wait for credit
    assert writer.pending_since_ns == 0 and channel.backlog() == 3
    assert channel.poll_priority() == PriorityBarrier(barrier, 5)
    assert channel.poll() == [0] and channel.poll() == [1]
    assert channel.poll().column("seq").to_pylist() == list(range(10, 17))
    assert writer.batches_out == 2 and writer.records_out == 17


def test_a_piece_of_another_schema_is_not_concatenated_with_the_buffer() -> None:
    writer, [channel] = writer_with(ArrowForwardPartitioner(), 1, batch_size=100)
    writer.emit_batch(rows(0, 3))
    writer.emit_batch(pa.record_batch({"key": pa.array([1.5]), "seq": pa.array([3], pa.int64())}))
    writer.flush()
    first, second = drain(channel)
    assert first.num_rows == 3 and second.schema.field("key").type == pa.float64()


def test_records_on_a_batch_edge_fail_naming_the_conversion() -> None:
    writer, _ = writer_with(ArrowForwardPartitioner(), 1, batch_size=100)
    with pytest.raises(TypeError, match="to_batches"):
        writer.emit_batch([1, 2, 3])
    with pytest.raises(ValueError, match="arrow-batch-size"):
        writer_with(ArrowForwardPartitioner(), 1, batch_size=0)


# ---------------------------------------------------------------------- a real source task on a batch edge

#: ``max_records`` of every poll of :class:`RecordingSequence`'s readers (same process: the task's
#: cloudpickled copy of the class refers to this module).
POLLS: list[int] = []


class RecordingSequence(ArrowNumberSequenceSource):
    """A batch number sequence whose readers record how many rows the task asked for."""

    def create_reader(self, context: SourceReaderContext) -> ArrowNumberSequenceReader:
        reader = super().create_reader(context)
        poll = reader.poll_next

        def recording_poll(max_records: int) -> pa.RecordBatch | None:
            POLLS.append(max_records)
            return poll(max_records)

        reader.poll_next = recording_poll  # type: ignore[method-assign]
        return reader


def source_into_keyed_sum(end: int, config: dict[str, Any]) -> dict[str, TaskDeploymentDescriptor]:
    """A batch source (parallelism 1) keyed by ``value`` into a keyed batch sum (parallelism 2)."""
    graph = StreamGraph()
    source = graph.add_node(
        "Source", lambda: SourceOperator(RecordingSequence(1, end)), is_source=True, parallelism=1
    )
    source.columnar = True
    total = graph.add_node(
        "Sum",
        lambda: KeyedBatchAggregateOperator("sum", "value", False, "value"),
        is_sink=True,
        keyed=True,
        parallelism=2,
    )
    total.columnar = True
    graph.add_edge(source, total, ArrowKeyGroupPartitioner("value"))
    job = create_job_graph(
        graph,
        job_name="batch edge",
        default_parallelism=1,
        default_max_parallelism=0,
        chaining_enabled=True,
        config=config,
    )
    execution = ExecutionGraph(job)
    return {
        tdd.task_name.split(" ")[0]: tdd
        for tdd in (execution.deployment_descriptor(subtasks[0]) for subtasks in execution.vertices.values())
    }


def test_a_batch_source_task_reads_arrow_batch_size_rows_and_sends_them_through_the_arrow_writer() -> None:
    POLLS.clear()
    config = {"chandy.network.arrow-batch-size": 3000, "chandy.network.batch-size": 7}
    tdds = source_into_keyed_sum(10_000, config)
    outputs = [LocalChannel(1000, name=f"out{i}") for i in range(2)]
    listener = RecordingListener()
    task = StreamTask(tdds["Source"], [], [outputs], TaskServices(), listener)
    assert isinstance(task.writers[0], ArrowRecordWriter) and task.writers[0].batch_size == 3000
    task.invoke()
    assert listener.states[-1][0] is ExecutionState.FINISHED, listener.states
    assert POLLS and set(POLLS) == {3000}
    seen = []
    for index, channel in enumerate(outputs):
        items = drain(channel)
        assert items[-1] is END_OF_PARTITION
        batches = [i for i in items if isinstance(i, pa.RecordBatch)]
        assert all(0 < b.num_rows < 6000 for b in batches)
        values = [v for b in batches for v in b.column("value").to_pylist()]
        assert values == sorted(values)
        assert all(g * 2 // 128 == index for b in batches for g in b.column(KEY_GROUP_COLUMN).to_pylist())
        seen += values
    assert sorted(seen) == list(range(1, 10_001))


def test_a_keyed_operator_with_columnar_state_gets_the_columnar_backend_whatever_the_config_says() -> None:
    tdds = source_into_keyed_sum(10, {"state.backend.type": "rocksdb"})
    chain = OperatorChain(tdds["Sum"], [], TaskServices(), lambda: False)
    try:
        [operator] = chain.operators.values()
        assert operator.columnar_state and operator.runtime_context is not None
        backend = operator.runtime_context.keyed_state_backend
        assert isinstance(backend, ColumnarKeyedStateBackend)
        assert backend.max_parallelism == 128
    finally:
        assert chain.close() is None
