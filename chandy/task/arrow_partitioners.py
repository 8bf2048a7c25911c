"""Partitioners of the batch path: which output channel each row of an Arrow record batch goes to.

A columnar partitioner (``columnar = True``) routes a whole ``pyarrow.RecordBatch`` at a
time: :meth:`ColumnarPartitioner.split` returns the pieces of the batch and the channel each
goes to, computed with numpy and Arrow kernels, with no Python per row. The task gives an
edge with a columnar partitioner the :class:`~chandy.task.arrow_writer.ArrowRecordWriter`,
which buffers the pieces per channel and sends them as large batches.

* forward, rebalance, rescale and broadcast move whole batches: rebalance and rescale deal
  batches round-robin (the record path deals records; a batch is the unit here, and batch
  sources emit batches of equal size, so channels get equal rows), broadcast hands the same
  (immutable) batch to every channel;
* shuffle draws a random channel per row;
* :class:`ArrowKeyGroupPartitioner` computes each row's key group with
  :func:`~chandy.state.arrow_keys.key_groups_of` (the record path's hash, so records and
  batches of one key reach the same subtask), its channel through a lookup array indexed by
  key group, and cuts the batch with one ``take`` per channel of the rows' indices. Into a
  keyed operator the batch carries the key groups in
  :data:`~chandy.state.arrow_keys.KEY_GROUP_COLUMN` (int32, last) and, for a key computed by a
  function, the keys in :data:`~chandy.state.arrow_keys.KEY_COLUMN` before it (as the record
  path ships ``KeyedBatch.key_groups`` and ``keys``).

How to cut (measured on 65,536-row batches of int keys, 128 key groups, the 2-core development
machine): ``take`` of ``np.flatnonzero(channel == c)`` costs 2.9 ns a row for 2 channels and
6.9 for 8; one ``filter`` per channel 7.0 and 12.1; a stable argsort by channel and one
``take`` 11.5 and 10.4. The per-channel ``take`` is used up to :data:`_TAKE_PER_CHANNEL_UP_TO`
channels (its cost grows with their number), the argsort beyond. The whole
:meth:`ArrowKeyGroupPartitioner.split` of such a batch (key groups, channels, cut) costs 2.6 ns
a row for 1 channel, 6.4 for 2 and 10.5 for 8 with int keys, 22, 29 and 33 with string keys
of 10,000 distinct values (most of it their hashing), with glibc keeping its freed heap as
the writer asks (see :class:`~chandy.task.arrow_writer.ArrowRecordWriter`).

A batch edge never carries the record path's timestamp column: batches hold their times in
their own columns, so :meth:`ColumnarPartitioner.with_timestamps` always answers an untimed copy.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from chandy.errors import BatchColumnError, BatchTypeError, BatchValueError
from chandy.state.arrow_keys import INTERNAL_COLUMNS, KEY_COLUMN, KEY_GROUP_COLUMN, key_groups_of
from chandy.task.partitioners import (
    BroadcastPartitioner,
    ForwardPartitioner,
    RebalancePartitioner,
    RescalePartitioner,
    ShufflePartitioner,
    StreamPartitioner,
)

#: Up to this many channels a batch is cut by one ``take`` of each channel's row indices,
#: beyond it by one stable argsort by channel (see the module's docstring).
_TAKE_PER_CHANNEL_UP_TO = 16

#: The pieces of one batch: (channel index, the rows that go there), non-empty pieces only.
Pieces = list[tuple[int, pa.RecordBatch]]


#: Why a key of several values (a tuple, a struct, a list) is refused, and what to do instead.
_ONE_KEY = (
    "a batch edge needs one key per row, not several values: key by one column, or combine the "
    "columns into one first in map_batches (e.g. pyarrow.compute.binary_join_element_wise over "
    "string columns), since Arrow groups and hashes only scalar keys"
)


class ColumnarPartitioner(StreamPartitioner):
    """A partitioner of an edge that carries Arrow record batches (see the module's docstring)."""

    columnar = True

    @abstractmethod
    def split(self, batch: pa.RecordBatch) -> Pieces:
        """The non-empty pieces of ``batch`` and the channel each goes to, rows in batch order."""

    def partition(self, records: Any, buffers: list[Any]) -> None:
        """Append each piece of the record batch ``records`` to its channel's buffer (a list)."""
        for channel, piece in self.split(records):
            buffers[channel].append(piece)

    def partition_timestamped(self, records: Any, timestamps: list[int | None], buffers: list[Any]) -> None:
        raise TypeError(
            f"{type(self).__name__} partitions Arrow record batches, which carry their event times in "
            "their own columns: a batch edge never carries the record path's timestamps"
        )

    def new_buffer(self) -> Any:
        return []

    def with_timestamps(self, timestamped: bool) -> StreamPartitioner:
        """An untimed copy, whatever ``timestamped`` says (a batch edge carries no timestamp column)."""
        return self.copy()


def _check_batch(batch: Any, partitioner: ColumnarPartitioner) -> pa.RecordBatch:
    if type(batch) is not pa.RecordBatch:
        raise BatchTypeError(
            f"{partitioner.name} partitioning of a batch stream got a {type(batch).__name__}, not a "
            "pyarrow.RecordBatch: records reached a batch edge. Convert the stream with to_batches() "
            "before a batch operation (or to_records() before a record one)"
        )
    return batch


class ArrowForwardPartitioner(ColumnarPartitioner, ForwardPartitioner):
    """Subtask i to subtask i, whole batches; chains like :class:`ForwardPartitioner`."""

    name = "FORWARD"

    def split(self, batch: pa.RecordBatch) -> Pieces:
        return [(0, batch)] if _check_batch(batch, self).num_rows else []


class ArrowRebalancePartitioner(ColumnarPartitioner, RebalancePartitioner):
    """Whole batches round-robin over all channels, starting at a random one."""

    name = "REBALANCE"

    def split(self, batch: pa.RecordBatch) -> Pieces:
        if not _check_batch(batch, self).num_rows:
            return []
        channel = self._position
        self._position = (channel + 1) % self.num_channels
        return [(channel, batch)]


class ArrowRescalePartitioner(ArrowRebalancePartitioner, RescalePartitioner):
    """Whole batches round-robin over the few consumers this producer is wired to (pointwise)."""

    name = "RESCALE"


class ArrowShufflePartitioner(ColumnarPartitioner, ShufflePartitioner):
    """A random channel per row."""

    name = "SHUFFLE"

    def setup(self, num_channels: int, subtask_index: int) -> None:
        StreamPartitioner.setup(self, num_channels, subtask_index)
        self._generator = np.random.default_rng(
            None if self.seed is None else self.seed * 1_000_003 + subtask_index
        )

    def split(self, batch: pa.RecordBatch) -> Pieces:
        n = _check_batch(batch, self).num_rows
        if not n:
            return []
        if self.num_channels == 1:
            return [(0, batch)]
        channels = self._generator.integers(0, self.num_channels, n, dtype=np.int32)
        return _cut(batch, channels, self.num_channels)


class ArrowBroadcastPartitioner(ColumnarPartitioner, BroadcastPartitioner):
    """Every batch to every channel (record batches are immutable: one batch is shared)."""

    name = "BROADCAST"

    def split(self, batch: pa.RecordBatch) -> Pieces:
        if not _check_batch(batch, self).num_rows:
            return []
        return [(channel, batch) for channel in range(self.num_channels)]


class ArrowKeyGroupPartitioner(ColumnarPartitioner):
    """By key, vectorised: ``key_group * parallelism // max_parallelism`` per row (Flink's HASH edge).

    ``key`` names a column or is a function of the batch returning one key per row (an Arrow
    or numpy array, or a sequence). ``max_parallelism`` is the consuming vertex's, set by the
    job graph (:meth:`for_target`). ``ship_keys`` (into a keyed operator) appends the key
    group column, and for a function key the key column, as the module's docstring says;
    without it (``key_by(...).print()``) the batch travels as it came.
    """

    name = "HASH"

    def __init__(
        self,
        key: str | Callable[[pa.RecordBatch], Any],
        max_parallelism: int = 0,
        ship_keys: bool = True,
    ) -> None:
        self.key = key
        self.max_parallelism = max_parallelism
        self.ship_keys = ship_keys

    def for_target(self, max_parallelism: int, ship_keys: bool) -> ArrowKeyGroupPartitioner:
        return ArrowKeyGroupPartitioner(self.key, max_parallelism, ship_keys)

    def setup(self, num_channels: int, subtask_index: int) -> None:
        super().setup(num_channels, subtask_index)
        max_p = self.max_parallelism
        if not 1 <= num_channels <= max_p:
            raise ValueError(f"parallelism {num_channels} is outside [1, max parallelism {max_p}]")
        self._channel_of = (np.arange(max_p, dtype=np.int64) * num_channels // max_p).astype(
            np.int8 if num_channels <= 127 else np.int32
        )

    def keys_of(self, batch: pa.RecordBatch) -> pa.Array | pa.ChunkedArray | np.ndarray:
        """The key of every row of ``batch``: its key column, or what the key function returned."""
        key = self.key
        if isinstance(key, str):
            index = batch.schema.get_field_index(key)
            if index < 0:
                raise BatchColumnError(
                    f"key_by({key!r}): the batch has no column {key!r}; its columns are "
                    f"{[n for n in batch.schema.names if n not in INTERNAL_COLUMNS]}"
                )
            column = batch.column(index)
            if pa.types.is_nested(column.type):
                raise BatchTypeError(f"key_by({key!r}): the column is {column.type}; {_ONE_KEY}")
            return column
        name = f"key_by: the key function {getattr(key, '__qualname__', key)!r}"
        try:
            keys = key(batch)
        except (AttributeError, TypeError, KeyError, IndexError) as exc:  # written for one record?
            raise BatchTypeError(
                f"{name} failed ({type(exc).__name__}: {exc}): it gets the whole RecordBatch, not a "
                "record, and must return an array of one key per row (e.g. lambda b: b.column('name'), "
                "or pyarrow.compute over the batch's columns)"
            ) from exc
        if not isinstance(keys, (pa.Array, pa.ChunkedArray, np.ndarray)):
            if isinstance(keys, (list, tuple)) and keys and isinstance(keys[0], (tuple, dict)):
                raise BatchTypeError(f"{name} returned {type(keys[0]).__name__}s; {_ONE_KEY}")
            try:
                keys = pa.array(keys)
            except (TypeError, pa.ArrowException) as exc:
                raise BatchTypeError(
                    f"{name} returned a {type(keys).__name__}, which is not an array of one key per "
                    "row: return an Arrow or numpy array (e.g. pyarrow.compute over the batch's columns)"
                ) from exc
        if isinstance(keys, np.ndarray) and keys.ndim != 1:
            raise BatchTypeError(f"{name} returned a {keys.ndim}-dimensional numpy array; {_ONE_KEY}")
        if not isinstance(keys, np.ndarray) and pa.types.is_nested(keys.type):
            raise BatchTypeError(f"{name} returned keys of type {keys.type}; {_ONE_KEY}")
        if len(keys) != batch.num_rows:
            raise BatchValueError(
                f"{name} returned {len(keys)} keys for a batch of {batch.num_rows} rows; it must return "
                "exactly one key per row"
            )
        return keys

    def split(self, batch: pa.RecordBatch) -> Pieces:
        n = _check_batch(batch, self).num_rows
        if not n:
            return []
        for name in INTERNAL_COLUMNS:  # keyed again: the previous keying's columns go
            index = batch.schema.get_field_index(name)
            if index >= 0:
                batch = batch.remove_column(index)
        keys = self.keys_of(batch)
        groups = key_groups_of(keys, self.max_parallelism)
        if self.ship_keys:
            if not isinstance(self.key, str):
                batch = batch.append_column(KEY_COLUMN, _as_arrow(keys))
            batch = batch.append_column(KEY_GROUP_COLUMN, pa.array(groups.astype(np.int32, copy=False)))
        if self.num_channels == 1:
            return [(0, batch)]
        return _cut(batch, self._channel_of[groups], self.num_channels)


def _as_arrow(keys: pa.Array | pa.ChunkedArray | np.ndarray) -> pa.Array:
    if isinstance(keys, pa.ChunkedArray):
        return keys.combine_chunks()
    if isinstance(keys, np.ndarray):
        return pa.array(keys)
    return keys


def _cut(batch: pa.RecordBatch, channels: np.ndarray, num_channels: int) -> Pieces:
    """The rows of ``batch`` per channel (``channels``: one channel index per row), in batch order."""
    if num_channels <= _TAKE_PER_CHANNEL_UP_TO:
        pieces: Pieces = []
        for channel in range(num_channels):
            rows = np.flatnonzero(channels == channel)
            if len(rows) == len(channels):
                return [(channel, batch)]
            if len(rows):
                pieces.append((channel, batch.take(rows)))
        return pieces
    order = np.argsort(channels, kind="stable")
    counts = np.bincount(channels, minlength=num_channels)
    ordered = batch.take(order)
    pieces = []
    start = 0
    for channel in np.flatnonzero(counts).tolist():
        count = int(counts[channel])
        pieces.append((channel, ordered.slice(start, count)))
        start += count
    return pieces
