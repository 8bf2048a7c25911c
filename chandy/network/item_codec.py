"""How a channel item becomes bytes: Arrow IPC for record batches of the batch path, pickle otherwise.

One codec for everything that serializes channel items: TCP channels (``chandy.network.tcp``)
and the channel state of unaligned checkpoints (``LocalChannel.serialized`` / ``size_of``,
the chunked input's unprocessed rest, the restore's replay). A ``pyarrow.RecordBatch`` is
written as an Arrow IPC stream (its schema and the one batch): the columns' buffers are
copied as they are, with no per-row work and no pickle, and the receiver maps them without
copying again. Everything else (list batches of the record path, barriers, watermarks and
other events) stays pickled, exactly as before.

The two are told apart by their first byte: an IPC stream starts with the 0xFFFFFFFF
continuation marker, a pickle (protocol 2 and later) with the PROTO opcode 0x80. The choice
costs one ``type(item) is`` test per item on the sending side and one byte comparison on
the receiving side, so the record path pays nothing measurable for it.
"""

from __future__ import annotations

import pickle
from typing import Any

import pyarrow as pa

#: First byte of an Arrow IPC stream (the 0xFFFFFFFF continuation marker of its first message).
_IPC_FIRST_BYTE = 0xFF
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def encode_item(item: Any) -> bytes:
    """``item`` as bytes: an Arrow IPC stream for a ``pyarrow.RecordBatch``, else a pickle."""
    if type(item) is pa.RecordBatch:
        return _encode_batch(item)
    return pickle.dumps(item, protocol=_PROTOCOL)


def _encode_batch(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def decode_item(payload: bytes) -> Any:
    """The item :func:`encode_item` turned into ``payload``."""
    if payload and payload[0] == _IPC_FIRST_BYTE:
        return _decode_batch(payload)
    return pickle.loads(payload)


def is_arrow_payload(payload: bytes) -> bool:
    """Whether ``payload`` is an encoded record batch (data, so channel state), told without decoding it."""
    return bool(payload) and payload[0] == _IPC_FIRST_BYTE


def _decode_batch(payload: bytes) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(pa.py_buffer(payload))
    batches = list(reader)
    if len(batches) != 1:
        raise ValueError(
            f"an Arrow IPC channel item must hold exactly one record batch, this one holds {len(batches)}: "
            "the sender and the receiver run different chandy versions, or the bytes are corrupt"
        )
    return batches[0]


def encoded_size(item: Any) -> int:
    """Bytes ``item`` takes on the wire (what :func:`encode_item` returns), without
    serializing a record batch: its IPC stream is its buffers plus a small header, so
    ``nbytes`` is close enough for the alignment statistics that ask this."""
    if type(item) is pa.RecordBatch:
        return int(item.nbytes)
    return len(pickle.dumps(item, protocol=_PROTOCOL))
