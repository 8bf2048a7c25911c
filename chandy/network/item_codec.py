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
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from chandy.errors import UnrecoverableError
from chandy.state.missing_classes import find_missing_class
from chandy.state.unpickling import UNRESTRICTED, UnpicklingPolicy

#: First byte of an Arrow IPC stream (the 0xFFFFFFFF continuation marker of its first message).
_IPC_FIRST_BYTE = 0xFF
_PROTOCOL = pickle.HIGHEST_PROTOCOL


class RecordNotPicklableError(UnrecoverableError, TypeError):
    """A record that must leave its task (to another Spark slot, or into an unaligned
    checkpoint's in-flight data) cannot be pickled: a lock, a socket, an open file or a
    client inside it. The same record meets the same pickle after a restart, so the job
    fails once; the message names the record's type, the operator that emitted it where
    that is known, and the fix. A ``TypeError`` too, as pickle's own error mostly is."""

    #: The type of the record that cannot be pickled (``module.qualname``).
    record_type: str = ""


def encode_item(item: Any) -> bytes:
    """``item`` as bytes: an Arrow IPC stream for a ``pyarrow.RecordBatch``, else a pickle
    (a :class:`RecordNotPicklableError` if it cannot be pickled)."""
    if type(item) is pa.RecordBatch:
        return _encode_batch(item)
    try:
        return pickle.dumps(item, protocol=_PROTOCOL)
    except Exception as exc:
        raise unpicklable_record_error(item, exc) from exc


def unpicklable_record_error(
    item: Any, error: BaseException, producer: str | None = None, consumer: str | None = None
) -> RecordNotPicklableError:
    """The error for a batch (or event) ``item`` that pickling failed on with ``error``:
    it names the first record that cannot be pickled by its type, ``producer`` (the
    operator that emitted it) and ``consumer`` (the task it was sent to) when known."""
    records = getattr(item, "values", item)  # a TimestampedBatch holds its records in values
    culprit, cause = item, error
    if isinstance(records, list):
        for record in records:
            try:
                pickle.dumps(record, protocol=_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - the first record that fails is the one named
                culprit, cause = record, exc
                break
    record_type = f"{type(culprit).__module__}.{type(culprit).__qualname__}"
    who = f"{producer} emitted a record" if producer else "A record"
    where = f" to send it to task '{consumer}'" if consumer else ""
    failure = RecordNotPicklableError(
        f"{who} that cannot be pickled{where}: a {record_type} ({type(cause).__name__}: {cause}). "
        "A record that leaves its task is pickled: to reach a task in another Spark slot, and "
        "into an unaligned checkpoint's in-flight data. Emit picklable values (plain data: "
        "create locks, clients, sockets and files in open() and keep them in the function, "
        "not in its records), or chain the operators so that the record never leaves its task "
        "(the same parallelism, no key_by, rebalance, shuffle or broadcast between them, and "
        "chaining not disabled). A restart would fail the same way, so the job fails now."
    )
    failure.record_type = record_type
    return failure


def _encode_batch(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def decode_item(payload: bytes, policy: UnpicklingPolicy = UNRESTRICTED) -> Any:
    """The item :func:`encode_item` turned into ``payload``; a pickle read under ``policy``
    (restricted for a checkpoint's in-flight data: :mod:`chandy.state.unpickling`)."""
    if payload and payload[0] == _IPC_FIRST_BYTE:
        return _decode_batch(payload)
    if policy.unrestricted:
        return pickle.loads(payload)
    return policy.loads(payload)


class RecordClassNotFoundError(UnrecoverableError, ImportError):
    """A record that arrived from another slot holds a class this process cannot import: the
    module that defines it was not shipped to this executor, or another version of it was.
    The same records arrive again after a restart, so the job fails once, naming the class
    and how to ship it."""


def decode_received(payload: bytes) -> Any:
    """:func:`decode_item` for a frame another process sent: a class of the record that this
    process cannot import is a :class:`RecordClassNotFoundError`."""
    return decode_naming_classes(payload, _unimportable_record)


def decode_naming_classes(
    payload: bytes,
    error: Callable[[str, BaseException], BaseException],
    policy: UnpicklingPolicy = UNRESTRICTED,
) -> Any:
    """:func:`decode_item`, where a class of the item that cannot be loaded raises
    ``error(missing, cause)`` (``missing`` as ``module.qualname``); other failures as they were."""
    try:
        return decode_item(payload, policy)
    except (ImportError, AttributeError) as exc:
        found = find_missing_class(payload, policy)
        if found is None:
            raise
        raise error(*found) from exc


def _unimportable_record(missing: str, error: BaseException) -> RecordClassNotFoundError:
    return RecordClassNotFoundError(
        f"a record that arrived from another slot holds an object of class {missing}, which "
        f"cannot be loaded here ({type(error).__name__}: {error}). Every Spark executor "
        "must import the job's modules, in the version the driver runs: ship them with "
        "spark.submit.pyFiles (spark-submit --py-files, SparkContext.addPyFile) or install "
        "them in the executors' Python. A restart would fail the same way, so the job fails now."
    )


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
    return len(encode_item(item))
