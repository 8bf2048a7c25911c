"""ArrowRecordWriter on real local channels: size cut, flushes, events and priority barriers."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from chandy.network.channel import LocalChannel
from chandy.network.events import END_OF_PARTITION, CheckpointBarrier, PriorityBarrier, Watermark
from chandy.state.arrow_keys import KEY_GROUP_COLUMN
from chandy.task.arrow_partitioners import (
    ArrowForwardPartitioner,
    ArrowKeyGroupPartitioner,
    ColumnarPartitioner,
)
from chandy.task.arrow_writer import ArrowRecordWriter


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
