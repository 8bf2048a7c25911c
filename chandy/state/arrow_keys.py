"""Key groups of a whole Arrow column at once: the batch path's half of key partitioning.

The batch path must put a key exactly where the record path puts it (a job may key one
stream by records and another by batches and join them, and a savepoint's key groups must
mean the same thing either way), so :func:`key_groups_of` computes, for every element,
precisely :func:`~chandy.state.key_groups.assign_to_key_group` of the Python value the
element stands for, without calling it per element:

* integer columns (every width, signed or not) and booleans: Java's ``Long.hashCode`` and
  MurmurHash3's finalizer in numpy, over the whole column: 2.6 ns per element (int64,
  65,536 rows);
* everything else (strings, binary, floats, dates, ...): the column is dictionary-encoded
  (in Arrow) and only its *distinct* values are hashed, the result spread back with
  ``take``. Real streams repeat keys, so that is a hash per distinct key per batch. Strings
  and binary are hashed (CRC-32, as :func:`~chandy.state.key_groups.stable_hash` does) for
  all distinct values at once in numpy when that is cheaper than one Python call each;
  other types by ``stable_hash`` per distinct value. 25 ns per element for 65,536 string
  rows of 10,000 distinct keys (43 with a Python hash per key), 20 of them Arrow's encoding;
* nulls hash like ``None`` (0), as on the record path.

(Figures: ``key_groups_of`` over one column repeatedly, timed with ``time.perf_counter`` on
the 2-core development machine.)

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
    """Hashes of a dictionary's (distinct) values: vectorised for ints, and for strings and
    binary when that is cheaper (see :func:`_crc32s`), else one Python call each."""
    kind = dictionary.type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return hashes_of(dictionary)
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
    if text or pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        hashes = _crc32s(dictionary.cast(pa.large_binary()))
        if hashes is not None:
            if not text:
                hashes ^= np.uint32(_BYTES_SALT)
            if dictionary.null_count:
                hashes[np.asarray(dictionary.is_null())] = 0
            return hashes
    return _generic_hashes(dictionary.to_pylist())


#: ``stable_hash`` of ``bytes`` is their CRC-32 xor this (so ``b"a"`` and ``"a"`` differ).
_BYTES_SALT = 0x5BD1E995


def _crc32_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> np.uint32(1)) ^ np.uint32(0xEDB88320), table >> np.uint32(1))
    return table.astype(np.uint32)


_CRC32_TABLE = _crc32_table()
#: What a step over one byte position costs in numpy calls, and a Python crc32 of a value
#: costs, in ns (measured): whichever total is smaller decides.
_STEP_NS, _BYTE_NS, _PYTHON_NS = 8000, 6, 170


def _crc32s(values: pa.Array, always: bool = False) -> np.ndarray | None:
    """``zlib.crc32`` of every value of a ``large_binary`` array (nulls as empty), computed
    for all values at once, one byte position per step, or ``None`` when hashing the values
    one by one in Python would be cheaper (few values, or one much longer than the rest)
    unless ``always``.

    The values are ordered longest first, so the ones still going at byte ``j`` are a prefix
    and each step is a few numpy operations over it: table-driven CRC-32, as zlib's."""
    n = len(values)
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int64)[values.offset : values.offset + n + 1]
    lengths = np.diff(offsets)
    longest = int(lengths.max()) if n else 0
    if not always and longest * _STEP_NS + int(lengths.sum()) * _BYTE_NS >= n * _PYTHON_NS:
        return None
    data_buffer = values.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    order = np.argsort(-lengths, kind="stable")
    starts = offsets[:-1][order]
    # still[j]: how many values are longer than j bytes (lengths descending).
    still = np.searchsorted(-lengths[order], -np.arange(longest), side="left")
    crc = np.full(n, 0xFFFFFFFF, dtype=np.uint32)
    for j, count in enumerate(still.tolist()):
        head = crc[:count]
        byte = data[starts[:count] + j]
        crc[:count] = _CRC32_TABLE[(head ^ byte) & np.uint32(0xFF)] ^ (head >> np.uint32(8))
    result = np.empty(n, dtype=np.uint32)
    result[order] = crc ^ np.uint32(0xFFFFFFFF)
    return result
