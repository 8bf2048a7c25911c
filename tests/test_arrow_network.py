"""Arrow record batches on channels: the item codec, real loopback TCP both ways, and the
channel state of unaligned checkpoints holding record batches."""

from __future__ import annotations

import pickle
from typing import Any

import pyarrow as pa
import pytest

from chandy.network.channel import LocalChannel, is_channel_state
from chandy.network.channel_state import decode_payloads, encode_payloads
from chandy.network.events import END_OF_PARTITION, CheckpointBarrier, PriorityBarrier, Watermark
from chandy.network.input_gate import InputGate
from chandy.network.item_codec import decode_item, encode_item, encoded_size, is_arrow_payload
from chandy.network.tcp import ChannelKey, DataPlane
from chandy.network.wakeup import Wakeup
from chandy.task.chunked_input import PROBE_RECORDS
from tests import test_tcp_priority as tcp
from tests.test_task_unaligned import UNALIGNED
from tests.test_task_unaligned_chunks import OneChannelTask

planes = tcp.planes


def batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "key": pa.array(range(start, start + n), pa.int64()),
            "name": pa.array([f"k{i}" for i in range(start, start + n)]),
            "score": pa.array([i / 2 if i % 7 else None for i in range(start, start + n)], pa.float64()),
        }
    )


def test_codec_writes_record_batches_as_arrow_ipc_and_everything_else_as_pickle() -> None:
    rb = batch(0, 1000)
    payload = encode_item(rb)
    assert payload[:4] == b"\xff\xff\xff\xff" and is_arrow_payload(payload)
    assert b"cloudpickle" not in payload and payload[:1] != b"\x80"
    decoded = decode_item(payload)
    assert type(decoded) is pa.RecordBatch and decoded.equals(rb) and decoded.schema.equals(rb.schema)
    for item in ([1, (2, "x")], Watermark(7), END_OF_PARTITION, CheckpointBarrier(3, 9), None, b"\xff"):
        encoded = encode_item(item)
        assert encoded == pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        assert not is_arrow_payload(encoded)
        assert decode_item(encoded) == item
    # An empty batch and a slice (its offset is not written) survive too.
    assert decode_item(encode_item(rb.slice(0, 0))).num_rows == 0
    assert decode_item(encode_item(rb.slice(990, 10))).equals(rb.slice(990, 10))
    assert 0 < encoded_size(rb) <= len(payload)


def test_a_corrupt_arrow_item_fails_with_a_clear_error() -> None:
    payload = encode_item(batch(0, 10))
    with pytest.raises((ValueError, pa.ArrowInvalid)):
        decode_item(payload[: len(payload) // 2])  # truncated
    schema_only = pa.BufferOutputStream()
    pa.ipc.new_stream(schema_only, batch(0, 1).schema).close()
    with pytest.raises(ValueError, match="exactly one record batch"):
        decode_item(schema_only.getvalue().to_pybytes())


def open_pair(
    planes: tuple[DataPlane, DataPlane], producer: int, capacity: int
) -> tuple[Any, InputGate, Wakeup]:
    """A channel from slot ``producer`` to the other slot."""
    consumer = 1 - producer
    key = ChannelKey(generation=1, edge_index=producer, producer_subtask=producer, consumer_subtask=consumer)
    inbound = planes[consumer].input_channel(key, producer_slot=producer, capacity=capacity)
    outbound = planes[producer].output_channel(key, consumer_slot=consumer)
    outbound.bind_producer(Wakeup(), lambda: False)
    wakeup = Wakeup()
    return outbound, InputGate([inbound], wakeup), wakeup


def test_record_batches_cross_tcp_both_ways_between_events_and_list_batches(
    planes: tuple[DataPlane, DataPlane],
) -> None:
    forward, forward_gate, forward_wakeup = open_pair(planes, producer=0, capacity=4)
    backward, backward_gate, backward_wakeup = open_pair(planes, producer=1, capacity=4)
    big = batch(0, 50_000)  # a frame of more than a megabyte
    items: list[Any] = [batch(0, 3), [1, 2, 3], Watermark(5), big, ["a"], batch(10, 1), END_OF_PARTITION]
    received: dict[int, list[Any]] = {0: [], 1: []}
    # Interleave sends and takes, so neither side waits for credit the other holds.
    for item in items:
        forward.send(item)
        backward.send(item)
        received[0].append(tcp.poll(forward_gate, forward_wakeup))
        received[1].append(tcp.poll(backward_gate, backward_wakeup))
    for got in received.values():
        assert len(got) == len(items)
        for expected, item in zip(items, got, strict=True):
            if isinstance(expected, pa.RecordBatch):
                assert type(item) is pa.RecordBatch and item.equals(expected)
            else:
                assert item == expected


def test_a_priority_barrier_over_tcp_captures_overtaken_record_batches_as_ipc(
    planes: tuple[DataPlane, DataPlane],
) -> None:
    outbound, gate, wakeup = open_pair(planes, producer=0, capacity=3)
    items: list[Any] = [batch(0, 5), Watermark(1), [7, 8]]
    for item in items:
        outbound.send(item)
    outbound.send_overdraft(batch(5, 2))
    barrier = CheckpointBarrier(4, 100)
    outbound.send_priority(barrier)
    index, priority = tcp.wait_for_priority(gate, wakeup)
    assert (index, priority) == (0, PriorityBarrier(barrier, 4))
    overtaken = gate.in_flight_before(0, priority.position)
    assert [is_arrow_payload(p) for p in overtaken] == [True, False, False, True]
    decoded = [decode_item(p) for p in overtaken]
    assert decoded[0].equals(items[0]) and decoded[1:3] == items[1:] and decoded[3].equals(batch(5, 2))
    first = tcp.poll(gate, wakeup)
    assert decode_item(gate.serialized(0, first)).equals(items[0])


def test_unaligned_channel_state_of_record_batches_round_trips_through_a_restore() -> None:
    """What a local channel's barrier overtook (record batches among events and list batches)
    is written as channel state, read back, and replayed by a new gate before live items."""
    channel = LocalChannel(capacity=8, name="c")
    items: list[Any] = [batch(0, 4), Watermark(3), [1, 2], batch(4, 2), END_OF_PARTITION]
    for item in items:
        channel.send(item)
    channel.send_priority(CheckpointBarrier(1, 5))
    polled = channel.poll_priority()
    assert polled is not None and polled.position == len(items)
    assert is_channel_state(items[0]) and not is_channel_state(END_OF_PARTITION)
    overtaken = channel.in_flight_before(polled.position)
    assert len(overtaken) == 4 and is_arrow_payload(overtaken[0]) and is_arrow_payload(overtaken[3])
    stored = decode_payloads(encode_payloads(overtaken), "test state")
    assert stored == overtaken

    live = LocalChannel(capacity=4, name="restored")
    live.send(batch(100, 1))
    gate = InputGate([live], Wakeup())
    gate.add_recovered(0, stored)
    replayed = []
    while (polled_item := gate.poll_next()) is not None:
        replayed.append(polled_item[1])
        # The recovered item's bytes are the stored ones (persisted again as they are).
        if len(replayed) <= 4:
            assert gate.serialized(0, polled_item[1]) == stored[len(replayed) - 1]
    assert replayed[0].equals(items[0]) and replayed[1:3] == items[1:3] and replayed[3].equals(items[3])
    assert replayed[4].equals(batch(100, 1)) and len(replayed) == 5


def test_local_channel_serializes_a_record_batch_as_ipc_and_sizes_it_without_pickle() -> None:
    channel = LocalChannel(capacity=2, name="c")
    rb = batch(0, 100)
    channel.send(rb)
    item = channel.poll()
    assert is_arrow_payload(channel.serialized(item)) and decode_item(channel.serialized(item)).equals(rb)
    assert channel.size_of(item) == rb.nbytes
    assert channel.size_of([1, 2]) == len(pickle.dumps([1, 2], protocol=pickle.HIGHEST_PROTOCOL))


class ArrowBatchTask(OneChannelTask):
    """:class:`OneChannelTask` whose input batches are Arrow record batches of a column ``v``."""

    def head(self, batch: Any) -> None:
        assert type(batch) is pa.RecordBatch
        super().head(batch.column("v").to_pylist())


def test_a_slow_record_batch_is_chunked_and_its_unprocessed_rest_is_arrow_channel_state() -> None:
    """Unaligned checkpoints slice a slow RecordBatch like a list (``len`` and slices), and the
    rest of the batch goes into the channel state as an Arrow IPC stream, replayed as a batch."""
    task = ArrowBatchTask(UNALIGNED)
    big = pa.record_batch({"v": pa.array(range(100), pa.int64())})
    after = pa.record_batch({"v": pa.array(range(100, 110), pa.int64())})
    task.channel.send(big)
    task.channel.send(after)
    polled = task.gate.poll_next()
    assert polled is not None and polled[1] is big
    task.chunked.process(task.head, 0, big)
    assert task.chunks == [PROBE_RECORDS] + [10] * 8 + [4]
    assert task.triggered == [(1, 36)]
    (state,) = task.completed
    assert state is not None
    payloads = state.per_channel[0]
    assert all(is_arrow_payload(p) for p in payloads)
    assert [decode_item(p).column("v").to_pylist() for p in payloads] == [
        list(range(36, 100)),
        list(range(100, 110)),
    ]
    assert task.processed == list(range(100))
