"""Key groups of a whole Arrow column at once: the batch path's half of key partitioning.

The batch path must put a key exactly where the record path puts it (a job may key one
stream by records and another by batches and join them, and a savepoint's key groups must
mean the same thing either way), so :func:`key_groups_of` computes, for every element,
precisely :func:`~chandy.state.key_groups.assign_to_key_group` of the Python value the
element stands for, without calling it per element:

* integer columns (every width, signed or not) and booleans: Java's ``Long.hashCode`` and
  MurmurHash3's finalizer in numpy, over the whole column, a few nanoseconds per element;
* everything else (strings, binary, floats, dates, ...): the column's *distinct* values are
  hashed in Python by :func:`~chandy.state.key_groups.stable_hash` and the result is spread
  back with ``take``. Real streams repeat keys, so that is a hash per distinct key per batch;
* nulls hash like ``None`` (0), as on the record path.

A keyed batch travels with its key groups in an extra column, :data:`KEY_GROUP_COLUMN`
(computed once by the partitioner, as the record path ships its ``KeyedBatch.key_groups``),
and, when the key is computed by a function rather than named as a column, with the keys in
:data:`KEY_COLUMN`. Operators take both off before user code sees the batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chandy.state.key_groups import UPPER_BOUND_MAX_PARALLELISM, stable_hash

#: The key group of every row of a keyed batch (int32), appended last by the partitioner.
KEY_GROUP_COLUMN = "__chandy_key_group"
#: The key of every row, when ``key_by`` was given a function of the batch, not a column name.
KEY_COLUMN = "__chandy_key"
#: Columns the engine adds to batches on keyed edges; user functions never see them.
INTERNAL_COLUMNS = (KEY_GROUP_COLUMN, KEY_COLUMN)

_M32 = np.uint64(0xFFFFFFFF)


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's finalizer over a uint32 array (in place; wrapping multiplication)."""
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def _int_hashes(values: np.ndarray) -> np.ndarray:
    """``stable_hash`` of every int (Java's ``Long.hashCode`` of its 64-bit two's complement)."""
    if values.dtype == np.uint64:
        # A uint64 above 2**63 - 1 is a Python int outside Java's long: hashed by crc32 there.
        big = values > np.uint64((1 << 63) - 1)
        if big.any():
            out = _int_hashes(np.where(big, 0, values).astype(np.int64))
            out[big] = [stable_hash(int(v)) for v in values[big]]
            return out
    u = values.astype(np.int64, copy=False).view(np.uint64)
    return ((u ^ (u >> np.uint64(32))) & _M32).astype(np.uint32)


def hashes_of(column: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    """``stable_hash`` of every element of ``column`` (a uint32 array, nulls hash to 0)."""
    if isinstance(column, np.ndarray):
        if column.dtype.kind in "iub":
            return _int_hashes(column.astype(np.int64) if column.dtype.kind == "b" else column)
        column = pa.array(column)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        if column.null_count:
            filled = pc.fill_null(column, False if pa.types.is_boolean(kind) else 0)
            hashes = hashes_of(filled.to_numpy(zero_copy_only=False))
            hashes[np.asarray(column.is_null())] = 0
            return hashes
        return hashes_of(column.to_numpy(zero_copy_only=False))
    if pa.types.is_dictionary(kind):
        distinct = _dictionary_hashes(column.dictionary)
        indices = column.indices
        if not indices.null_count:
            by_index: np.ndarray = distinct[indices.to_numpy()]
            return by_index
        # A null index hashes like None (0): it points at a 0 appended after the dictionary
        # (which is empty when every element is null).
        distinct = np.append(distinct, np.uint32(0))
        out: np.ndarray = distinct[pc.fill_null(indices, len(distinct) - 1).to_numpy()]
        return out
    encoded = pc.dictionary_encode(column)
    return hashes_of(encoded)


def _generic_hashes(values: list[Any]) -> np.ndarray:
    return np.fromiter((stable_hash(v) for v in values), dtype=np.uint32, count=len(values))


def key_groups_of(column: pa.Array | pa.ChunkedArray | np.ndarray, max_parallelism: int) -> np.ndarray:
    """The key group of every element of ``column`` (an int32 array), equal element by element
    to ``assign_to_key_group(value, max_parallelism)`` of the Python value the element stands for."""
    if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ValueError(f"max parallelism {max_parallelism} is outside [1, {UPPER_BOUND_MAX_PARALLELISM}]")
    hashes = hashes_of(column)
    return (_fmix32(hashes) % np.uint32(max_parallelism)).astype(np.int32)


def _dictionary_hashes(dictionary: pa.Array) -> np.ndarray:
    """Hashes of a dictionary's (distinct) values: vectorised for ints, else one Python call each."""
    kind = dictionary.type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return hashes_of(dictionary)
    return _generic_hashes(dictionary.to_pylist())
