"""Columnar keyed state: the batch path's keyed state, one row (slot) per key in numpy columns.

Why columns: a keyed batch operator updates the state of thousands of keys per batch. Kept as
Python objects per key (the heap backend), that is an interpreter round trip per key; kept
as numpy columns indexed by a *slot* per key, it is one fancy-indexing read and one write
per batch (``acc[slots] += sums``). What remains per batch is finding the slots of the
batch's keys, which :meth:`ColumnarKeyedState.slots_of` does without a Python call per row:

* integer (and boolean) keys: an open-addressing hash table in numpy arrays (Fibonacci
  hashing, linear probing), probed for the whole batch at once: a gather and a compare per
  probe round, almost every key found in the first round at a load of at most one half.
  Unseen keys are inserted the same way, vectorised;
* every other key type (strings, binary, floats, dates, ...): the batch is dictionary
  encoded in C (one hash per row) and only its *distinct* keys are looked up: with
  ``pc.index_in`` against an Arrow array of the known keys while they are few compared to
  the batch's, else in a Python dict from key to slot. Float NaNs are one key; a null key is
  the key ``None``, for every key type.

Measured (``slots_of`` over pre-built batches, ``time.perf_counter``, 2-core development
machine, glibc's ``M_TOP_PAD`` raised as the batch operators' ``open`` does: without it the
top of the heap is trimmed and faulted in again for every batch's numpy temporaries, 11
instead of 3.1 ns a row in the first line; per row of the batch, and per key looked up when
the caller passes the batch's distinct keys, as the batch operators do):

=====================================  ==========================  ===========================
keys in the state                      every row of a batch        distinct keys of the batch
=====================================  ==========================  ===========================
5,000 int64, 32,768-row batches        3.1 ns a row                0.7 ns a row (4.9 a key)
1,000,000 int64, 32,768-row batches    15 ns a row                 14 ns a key (cache misses)
10,000 strings, 65,536-row batches     26 ns a row                 11.6 ns a row (76 a key)
1,000,000 strings, 65,536-row batches  750 ns a row                745 ns a key (dict misses)
=====================================  ==========================  ===========================

Slots of removed keys are reused; a new or reused slot starts with the state's defaults.
Columns grow by doubling, so :meth:`ColumnarKeyedState.column` must be fetched again after
a :meth:`~ColumnarKeyedState.slots_of` that may have inserted keys.

Checkpoints: :meth:`ColumnarKeyedStateBackend.snapshot` copies every state's per-slot arrays
at the barrier, contiguously (0.04 ms for 5,000 keys, 1.6 ms for a million): that is all the
task thread does. The rest runs where the checkpoint's files are written (the checkpoint I/O
pool, :meth:`ColumnarSnapshotResult.write`), from the copies, so the task mutating its state
meanwhile changes nothing: the live slots are sorted by key group, every column gathered once
into one Arrow record batch per state, and that batch cut (zero-copy slices) into one IPC
record batch message per key group that has keys. One payload per subtask holds a header (the
states' schemas, each state's name in its schema's metadata) and then the key groups in
order, so each key group is one byte range of a
:class:`~chandy.state.handles.KeyGroupsStateHandle` (``state_kinds`` ``(name, "columnar")``)
and a restore parses only the key groups of its own range: rescaling works exactly as for the
heap backend's snapshots. Nothing is pickled. The work is per key group that holds keys, not
per key group of the range, so a large max parallelism with few keys costs little.

Snapshots written before this layout (one Arrow IPC stream per key group and state, schema
included) still restore: their first bytes are an IPC stream's, not this layout's magic.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chandy.core.functions import KeyedBatchState
from chandy.core.state import State, StateDescriptor
from chandy.errors import BatchTypeError, BatchValueError, InvalidCheckpointError
from chandy.state.arrow_keys import KEY_COLUMN
from chandy.state.backend import (
    LAST_CONFIRMED,
    BaseCheckpoint,
    KeyedStateBackend,
    StateFileReader,
    StateWriter,
    WrittenKeyedState,
)
from chandy.state.handles import (
    ByteStreamStateHandle,
    FileStateHandle,
    IncrementalKeyedStateHandle,
    KeyedStateHandle,
    KeyGroupsStateHandle,
    Range,
)
from chandy.state.heap import (
    IncompatibleRestoredStateError,
    IncompatibleStateError,
    SerializedKeyedState,
    is_immutable,
)
from chandy.state.key_groups import KeyGroupRange
from chandy.state.unpickling import DEFAULT_POLICY, UnpicklingPolicy
from chandy.util.clock import Clock, SystemClock

log = logging.getLogger(__name__)

#: The kind of a columnar state in ``KeyGroupsStateHandle.state_kinds``.
COLUMNAR_KIND = "columnar"
#: The schema metadata key holding a state's name in its checkpointed IPC streams.
STATE_NAME_METADATA = b"chandy.columnar.state"
#: The first bytes of a snapshot in the key-group layout (:meth:`ColumnarSnapshotResult.serialize`).
LAYOUT_MAGIC = b"CHCOLKG1"
#: The payload's start: the magic and the header's end (the first key group's first byte).
_PREAMBLE = struct.Struct("<8sQ")
#: In the header: how many states; then per state its IPC schema message, length first.
_COUNT = struct.Struct("<H")
_LENGTH = struct.Struct("<I")
#: Before each record batch message of a key group: the index of its state's schema, its length.
_FRAME = struct.Struct("<HQ")

_EMPTY = np.int64(-1)
_TOMBSTONE = np.int64(-2)
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)
#: A NaN every float key that is NaN is replaced by: the dict finds it by identity.
_NAN = float("nan")


class _IntIndex:
    """Integer key -> slot: open addressing in one numpy array, probed a batch at a time.

    Position ``p`` holds its key at ``_table[2p]`` and its slot at ``_table[2p + 1]``
    (:data:`_EMPTY`, :data:`_TOMBSTONE` for a removed key, or a slot): interleaved, a probe
    costs one cache miss, not two, which is most of a lookup's time once the table outgrows
    the caches (12 against 18 ns a key with a million keys). The load (live keys and
    tombstones) stays at most one half, so most lookups end in the first probe round."""

    __slots__ = ("_bits", "_table", "_used", "_live")

    def __init__(self) -> None:
        self._reset(4)
        self._live = 0

    def _reset(self, bits: int) -> None:
        self._bits = bits
        # Keys of empty positions are never read: one pass of -1 (_EMPTY) over the table.
        self._table = np.full(2 << bits, _EMPTY, dtype=np.int64)
        self._used = 0

    def _positions(self, keys: np.ndarray) -> np.ndarray:
        """Where each key's probe starts, as an index of ``_table`` (twice the position)."""
        product = keys.view(np.uint64) * _FIBONACCI
        product >>= np.uint64(64 - self._bits)
        positions = product.view(np.int64)
        positions <<= 1
        return positions

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The slot of every key (-1 when absent) and its index in the table (-1 when absent)."""
        table = self._table
        at = self._positions(keys)
        hit = table[at] == keys
        found = table[at + 1]
        hit &= found >= 0
        if hit.all():
            return found, at
        wrap = (2 << self._bits) - 1
        result = np.where(hit, found, _EMPTY)
        result_at = np.where(hit, at, _EMPTY)
        pending = np.flatnonzero(~hit & (found != _EMPTY))
        while pending.size:
            p = (at[pending] + 2) & wrap
            at[pending] = p
            found = table[p + 1]
            hit = table[p] == keys[pending]
            hit &= found >= 0
            done = pending[hit]
            result[done] = found[hit]
            result_at[done] = p[hit]
            pending = pending[~hit & (found != _EMPTY)]
        return result, result_at

    def insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Add ``keys`` (distinct, none present) with their ``slots``."""
        n = len(keys)
        if (self._used + n) * 2 > (1 << self._bits):
            self._grow(n)
        self._place(keys, slots)
        self._used += n
        self._live += n

    def _place(self, keys: np.ndarray, slots: np.ndarray) -> None:
        wrap = (2 << self._bits) - 1
        table = self._table
        at = self._positions(keys)
        while len(keys):
            empty = np.flatnonzero(table[at + 1] == _EMPTY)
            # Several keys may want one empty position: each writes its own mark (below the
            # tombstone) there and the one whose mark stayed (the last) takes it; no sort.
            marks = -3 - empty
            table[at[empty] + 1] = marks
            winners = empty[table[at[empty] + 1] == marks]
            table[at[winners]] = keys[winners]
            table[at[winners] + 1] = slots[winners]
            rest = np.ones(len(keys), dtype=bool)
            rest[winners] = False
            keys, slots, at = keys[rest], slots[rest], at[rest]
            at = np.where(table[at + 1] == _EMPTY, at, (at + 2) & wrap)

    def _grow(self, extra: int) -> None:
        live = self._table[1::2] >= 0
        keys, slots = self._table[0::2][live], self._table[1::2][live]
        # A load of a quarter to a half after growing: room to insert before the next one.
        needed = 3 * (len(keys) + extra)
        self._reset(max(4, (needed - 1).bit_length()))
        self._place(keys, slots)
        self._used = len(keys)

    def remove(self, keys: np.ndarray) -> None:
        """Drop ``keys`` (those present): their positions become tombstones."""
        found, at = self.find(keys)
        at = at[found >= 0]
        self._table[at + 1] = _TOMBSTONE
        self._live -= len(at)

    def __len__(self) -> int:
        return self._live


class _KnownKeys:
    """Non-integer keys -> slot for a whole batch in Arrow: ``pc.index_in`` against an Arrow
    array of the known keys (hashed in C++, per batch), for as long as that array is not much
    longer than the batch's distinct keys (3x cheaper than a Python dict lookup per key:
    38 against 106 ns for 10,000 string keys; 177 against 470 for 100,000).

    Keys are appended as they get slots; a removed key's entry is marked dead (slot -1) and
    the dead are dropped with a vectorised ``filter`` once they are half the array."""

    __slots__ = ("_chunks", "_slot_chunks", "_keys", "_slots", "_position", "_dead")

    def __init__(self, key_type: pa.DataType) -> None:
        self._chunks: list[pa.Array] = []
        self._slot_chunks: list[np.ndarray] = []
        self._keys: pa.Array = pa.array([], type=key_type)
        self._slots = np.empty(0, dtype=np.int64)
        #: The position of every slot's key in ``_keys`` (by slot; grown on demand).
        self._position = np.empty(0, dtype=np.int64)
        self._dead = 0

    def __len__(self) -> int:
        return len(self._keys) + sum(len(c) for c in self._chunks)

    def add(self, keys: pa.Array, slots: np.ndarray) -> None:
        self._chunks.append(keys)
        self._slot_chunks.append(slots)

    def _combine(self) -> None:
        if not self._chunks:
            return
        start = len(self._keys)
        self._keys = pa.concat_arrays([self._keys, *self._chunks])
        added = np.concatenate(self._slot_chunks)
        self._slots = np.concatenate([self._slots, added])
        self._chunks, self._slot_chunks = [], []
        if added.size and int(added.max()) >= len(self._position):
            grown = np.full(max(2 * len(self._position), int(added.max()) + 1), -1, dtype=np.int64)
            grown[: len(self._position)] = self._position
            self._position = grown
        self._position[added] = np.arange(start, start + len(added))

    def find(self, distinct: pa.Array) -> np.ndarray:
        """The slot of every key of ``distinct`` (-1 where not found)."""
        self._combine()
        at = pc.index_in(distinct, value_set=self._keys, skip_nulls=False)
        positions = pc.fill_null(at, -1).to_numpy(zero_copy_only=False)
        found = np.full(len(positions), -1, dtype=np.int64)
        hit = positions >= 0
        found[hit] = self._slots[positions[hit]]
        return found

    def remove(self, slots: np.ndarray) -> None:
        self._combine()
        slots = slots[slots < len(self._position)]
        positions = self._position[slots]
        positions = positions[positions >= 0]
        self._slots[positions] = -1
        self._position[slots] = -1
        self._dead += len(positions)
        if self._dead * 2 > len(self._keys):
            keep = self._slots >= 0
            self._keys = self._keys.filter(pa.array(keep))
            self._slots = self._slots[keep]
            self._position[self._slots] = np.arange(len(self._slots))
            self._dead = 0


#: The known keys are looked up in Arrow while they are at most this many times the batch's
#: distinct keys: index_in hashes every known key per batch (about 100 ns each for strings),
#: a dict lookup of a key costs 100 to 700 ns (more as the dict outgrows the caches).
_INDEX_IN_RATIO = 4


def _numpy_dtype(arrow_type: pa.DataType) -> np.dtype[Any]:
    """The dtype of a state column: numpy's own for numbers and booleans, else objects."""
    if pa.types.is_boolean(arrow_type):
        return np.dtype(bool)
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        dtype: np.dtype[Any] = np.dtype(arrow_type.to_pandas_dtype())
        return dtype
    return np.dtype(object)


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _as_arrow(values: pa.Array | pa.ChunkedArray | np.ndarray) -> pa.Array:
    if isinstance(values, np.ndarray):
        return pa.array(values)
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    return values


def _is_int_like(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type))


def _key_family(arrow_type: pa.DataType) -> str:
    """Key types whose values are the same keys in another layout share a family."""
    if _is_int_like(arrow_type):
        return "int"
    if (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_string_view(arrow_type)
    ):
        return "string"
    if (
        pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_binary_view(arrow_type)
        or pa.types.is_fixed_size_binary(arrow_type)
    ):
        return "binary"
    if pa.types.is_floating(arrow_type):
        return "float"
    return str(arrow_type)


class ColumnarKeyedState:
    """One named columnar state: per key a slot, per column of ``schema`` a numpy array by slot.

    ``defaults`` maps a column to the value a new key starts with (0, ``False`` or ``None``
    for a column without one). Keys may be of any hashable Arrow type, the same in every
    batch; integers of any width (and booleans) share the vectorised index.
    """

    def __init__(self, name: str, schema: pa.Schema, defaults: Mapping[str, Any] | None = None) -> None:
        if KEY_COLUMN in schema.names:
            raise ValueError(f"columnar state '{name}': the column name {KEY_COLUMN!r} is reserved")
        self.name = name
        self.schema = schema
        self.defaults: dict[str, Any] = {}
        self._dtypes = {f.name: _numpy_dtype(f.type) for f in schema}
        #: Object columns whose values Python code can change in place (lists, dicts of
        #: list / struct / map types): a barrier or a read must copy them by value.
        self.mutable_columns = frozenset(f.name for f in schema if pa.types.is_nested(f.type))
        self.set_defaults(defaults)
        #: The Arrow type of the keys (from the first batch or the restore); None while unknown.
        self.key_type: pa.DataType | None = None
        self._int_keys: bool | None = None
        self._index = _IntIndex()
        self._dict: dict[Any, int] = {}
        self._known: _KnownKeys | None = None
        self._null_slot = -1
        #: The key groups new keys may be in (the backend's range); any while ``None``.
        self.key_group_range: KeyGroupRange | None = None
        #: The number of :meth:`slots_of` calls so far: a slot born in the latest is new.
        self.epoch = 0
        self._capacity = 0
        self._columns: dict[str, np.ndarray] = {c: np.empty(0, dtype=dt) for c, dt in self._dtypes.items()}
        self._alive = np.empty(0, dtype=bool)
        self._key_groups = np.empty(0, dtype=np.int32)
        self._born = np.empty(0, dtype=np.int64)
        #: The key of every slot: integer keys as int64 (uint64 by their bits), others as objects.
        self._ikeys = np.empty(0, dtype=np.int64)
        self._okeys = np.empty(0, dtype=object)
        self._high = 0  # slots [0, _high) were handed out at least once
        self._free = np.empty(0, dtype=np.int64)
        self._count = 0
        self._alloc(16)

    def set_defaults(self, defaults: Mapping[str, Any] | None) -> None:
        """Set the values new keys start with (existing keys keep theirs)."""
        defaults = dict(defaults or {})
        unknown = set(defaults) - set(self.schema.names)
        if unknown:
            raise ValueError(
                f"columnar state '{self.name}': defaults for unknown columns {sorted(unknown)}; "
                f"its columns are {self.schema.names}"
            )
        resolved: dict[str, Any] = {}
        for column, dtype in self._dtypes.items():
            value = defaults.get(column)
            if dtype != np.dtype(object):
                try:
                    value = dtype.type(0 if value is None else value)
                except (TypeError, ValueError, OverflowError) as exc:
                    raise ValueError(
                        f"columnar state '{self.name}': default {defaults.get(column)!r} of column "
                        f"'{column}' is not a {dtype} value ({exc})"
                    ) from None
            resolved[column] = value
        self.defaults = resolved

    # ------------------------------------------------------------------ storage

    def _alloc(self, capacity: int) -> None:
        """Grow every per-slot array to ``capacity`` (amortised doubling by the caller)."""
        old = self._capacity

        def grown(array: np.ndarray, fill: Any) -> np.ndarray:
            new = np.empty(capacity, dtype=array.dtype)
            new[:old] = array[:old]
            new[old:] = fill
            return new

        # Slots past the used ones get their defaults when handed out (_allocate).
        self._columns = {
            c: grown(a, None if a.dtype == object else self.defaults[c]) for c, a in self._columns.items()
        }
        self._alive = grown(self._alive, False)
        self._key_groups = grown(self._key_groups, 0)
        self._born = grown(self._born, -1)
        self._ikeys = grown(self._ikeys, 0)
        self._okeys = grown(self._okeys, None)
        self._capacity = capacity

    def _allocate(self, n: int) -> np.ndarray:
        """``n`` free slots (reused ones first), with the defaults in every column."""
        reused = self._free[:n]
        self._free = self._free[n:]
        fresh = n - len(reused)
        if self._high + fresh > self._capacity:
            self._alloc(max(2 * self._capacity, self._high + fresh))
        slots = np.concatenate([reused, np.arange(self._high, self._high + fresh, dtype=np.int64)])
        self._high += fresh
        for column, values in self._columns.items():
            values[slots] = self.defaults_of(column, len(slots))
        self._alive[slots] = True
        self._born[slots] = self.epoch
        self._count += n
        return slots

    def defaults_of(self, column: str, count: int) -> Any:
        """The default of ``column`` for ``count`` keys, ready to assign: a scalar for numpy
        columns; for object columns an array holding the default once per key, a copy for
        each when it is mutable (a list default must not be one list shared by every key)."""
        default = self.defaults[column]
        if self._dtypes[column] != np.dtype(object):
            return default
        if is_immutable(default):
            return np.fromiter(itertools.repeat(default, count), dtype=object, count=count)
        return np.fromiter((copy.deepcopy(default) for _ in range(count)), dtype=object, count=count)

    @property
    def num_keys(self) -> int:
        """How many keys hold state."""
        return self._count

    def column(self, name: str) -> np.ndarray:
        """The backing array of column ``name``, indexed by slot: writing into it updates the
        state. Fetch it again after :meth:`slots_of` (which may grow the arrays)."""
        try:
            return self._columns[name]
        except KeyError:
            raise KeyError(
                f"columnar state '{self.name}' has no column {name!r}; its columns are {self.schema.names}"
            ) from None

    def key_groups_of_slots(self, slots: np.ndarray) -> np.ndarray:
        """The key group of the key in every slot (int32)."""
        groups: np.ndarray = self._key_groups[slots]
        return groups

    def is_new(self, slots: np.ndarray) -> np.ndarray:
        """True for the slots the latest :meth:`slots_of` inserted (keys without state before it)."""
        new: np.ndarray = self._born[slots] == self.epoch
        return new

    def key_array(self, slots: np.ndarray) -> pa.Array:
        """The keys of ``slots`` as an Arrow array of the keys' type."""
        slots = np.asarray(slots, dtype=np.int64)
        stored = self._ikeys if self._int_keys else self._okeys
        return _keys_to_arrow(stored[slots], slots, self._null_slot, self.key_type, bool(self._int_keys))

    def copy_at_barrier(self) -> _StateCopy | None:
        """What a snapshot needs of this state, copied as cheaply as a barrier allows: the
        per-slot arrays up to the highest slot ever used, contiguous (memcpy speed); the
        sort by key group and the gathers happen later, in the serializer. ``None`` when the
        state holds no key."""
        if not self._count:
            return None
        high = self._high
        assert self.key_type is not None
        stored = self._ikeys if self._int_keys else self._okeys  # key objects are immutable: shared
        return _StateCopy(
            self.name,
            self.schema,
            self.key_type,
            bool(self._int_keys),
            self._null_slot,
            self._alive[:high].copy(),
            self._key_groups[:high].copy(),
            stored[:high].copy(),
            [self._column_at_barrier(f, high) for f in self.schema],
        )

    def _column_at_barrier(self, field: pa.Field, high: int) -> np.ndarray | pa.Array:
        """Column ``field`` of slots ``[0, high)`` as a snapshot must keep it. Numbers, and
        objects no code can change (str, bytes, dates, decimals), are copied shallowly (a
        memcpy of the array or of its pointers); lists and dicts of nested types are converted
        to Arrow by value here, because a batch processed after the barrier (before the
        serializer runs) may change them in place and would change the checkpoint with them."""
        values = self._columns[field.name][:high]
        if field.name not in self.mutable_columns:
            return values.copy()
        values = values.copy()
        values[~self._alive[:high]] = None  # freed slots may hold stale values: not checkpointed
        return pa.array(values.tolist(), type=field.type)

    # ------------------------------------------------------------------ lookups

    def slots_of(
        self, keys: pa.Array | pa.ChunkedArray | np.ndarray, key_groups: np.ndarray, *, distinct: bool = False
    ) -> np.ndarray:
        """The slot of every element of ``keys`` (int64), inserting the keys not seen yet
        (with the defaults, in ``key_groups``: the key group of every element). ``distinct``:
        the caller knows no key repeats (a batch's distinct keys), which saves sorting the new
        integer keys to find their repeats."""
        self.epoch += 1
        array = _as_arrow(keys)
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        key_groups = np.asarray(key_groups)
        if len(key_groups) != len(array):
            raise ValueError(f"slots_of: {len(array)} keys but {len(key_groups)} key groups")
        self._check_key_type(array.type)
        if not self._int_keys and array.type != self.key_type:
            # The same keys in another layout (string / large_string / string_view, ...).
            array = array.cast(self.key_type)
        if self._int_keys:
            return self._int_slots(array, key_groups, distinct)
        return self._generic_slots(array, key_groups)

    def _check_key_type(self, key_type: pa.DataType) -> None:
        """Take ``key_type`` as the keys' type while the state has no keys of another (none
        at all, or only the null key, which a batch of nulls may type as Arrow's ``null``);
        after that, accept the same keys in another layout only (see :func:`_key_family`)."""
        current = self.key_type
        if current is not None and pa.types.is_null(key_type):
            return  # nulls only: the null key, whatever the keys' type
        if current is not None and self._count and not pa.types.is_null(current):
            if _key_family(key_type) != _key_family(current):
                raise TypeError(
                    f"columnar state '{self.name}' holds keys of type {current} and got keys of "
                    f"type {key_type}: the keys of one keyed stream must keep one type (cast the "
                    "key column in the function that produces it)"
                )
            return
        if pa.types.is_nested(key_type):
            raise TypeError(
                f"columnar state '{self.name}' cannot be keyed by {key_type} values (a batch key "
                "must be a scalar: an int, string, binary, float, bool, date or decimal); combine "
                "the columns into one key column, e.g. a string, in the key_by function"
            )
        if key_type == current:
            return
        # A new key type for an empty state, or for one holding only the null key.
        if not self._count:
            self._dict.clear()
            self._index = _IntIndex()
        self._known = None  # rebuilt for the new type; the dict still has the null key
        self.key_type = key_type
        self._int_keys = _is_int_like(key_type)
        if self._null_slot >= 0:
            self._ikeys[self._null_slot] = 0
            self._dict[None] = self._null_slot

    def _int_slots(self, array: pa.Array, key_groups: np.ndarray, distinct: bool) -> np.ndarray:
        nulls = array.null_count
        if pa.types.is_null(array.type):
            values = np.zeros(len(array), dtype=np.int64)
        elif nulls:
            values = pc.fill_null(array, False if pa.types.is_boolean(array.type) else 0).to_numpy(
                zero_copy_only=False
            )
        else:
            values = array.to_numpy(zero_copy_only=False)
        values = values.astype(np.int64, copy=False) if values.dtype != np.uint64 else values.view(np.int64)
        slots, _ = self._index.find(values)
        is_null = None
        if nulls or pa.types.is_null(array.type):
            is_null = np.ones(len(array), dtype=bool) if nulls == len(array) else np.asarray(array.is_null())
            slots[is_null] = self._null_slot
        missing = np.flatnonzero(slots < 0)
        if missing.size:
            self._check_key_groups(
                key_groups[missing],
                lambda i: (
                    None if is_null is not None and is_null[missing[i]] else self._int_key(values[missing[i]])
                ),
            )
        if is_null is not None and self._null_slot < 0:
            first_null = int(np.argmax(is_null))
            self._null_slot = int(self._allocate(1)[0])
            self._key_groups[self._null_slot] = key_groups[first_null]
            self._ikeys[self._null_slot] = 0
            slots[is_null] = self._null_slot
            missing = np.flatnonzero(slots < 0)
        if missing.size:
            if distinct:
                new_keys, first, inverse = values[missing], np.arange(len(missing)), None
            else:
                new_keys, first, inverse = np.unique(values[missing], return_index=True, return_inverse=True)
            new_slots = self._allocate(len(new_keys))
            self._ikeys[new_slots] = new_keys
            self._key_groups[new_slots] = key_groups[missing[first]]
            self._index.insert(new_keys, new_slots)
            slots[missing] = new_slots if inverse is None else new_slots[inverse.reshape(-1)]
        return slots

    def _generic_slots(self, array: pa.Array, key_groups: np.ndarray) -> np.ndarray:
        """Slots of non-integer keys: the batch is dictionary-encoded, its distinct keys are
        looked up in Arrow (:class:`_KnownKeys`) while the state holds few keys compared to
        them, else (and for what Arrow did not find, such as ``-0.0`` for a known ``0.0``) in
        the dict, which has every key."""
        encoded = pc.dictionary_encode(array, null_encoding="encode")
        dictionary = encoded.dictionary
        indices = encoded.indices.to_numpy(zero_copy_only=False)
        if self._known is None:
            self._known = _KnownKeys(dictionary.type)
        if self._count and self._count <= _INDEX_IN_RATIO * len(dictionary):
            distinct_slots = self._known.find(dictionary)
            unresolved = np.flatnonzero(distinct_slots < 0)
        else:
            distinct_slots = np.full(len(dictionary), -1, dtype=np.int64)
            unresolved = np.arange(len(dictionary))
        if not unresolved.size:
            result: np.ndarray = distinct_slots[indices]
            return result
        rest = dictionary.take(pa.array(unresolved)).to_pylist()
        if pa.types.is_floating(array.type):
            rest = [_NAN if _is_nan(v) else v for v in rest]
        lookup = self._dict
        distinct_slots[unresolved] = np.fromiter(
            (lookup.get(k, -1) for k in rest), dtype=np.int64, count=len(rest)
        )
        missing = np.flatnonzero(distinct_slots[unresolved] < 0)
        if missing.size:
            # Arrow's distinct values that are one key in Python (0.0 and -0.0, NaNs of other
            # bits) get one slot: the first of them is the key's representative.
            position: dict[Any, int] = {}
            owner = np.fromiter(
                (position.setdefault(rest[k], len(position)) for k in missing.tolist()),
                dtype=np.int64,
                count=len(missing),
            )
            firsts = np.unique(owner, return_index=True)[1]
            representatives = unresolved[missing[firsts]]
            # The key group of a new key: that of any of its rows (they are all the same).
            row_of = np.empty(len(dictionary), dtype=np.int64)
            row_of[indices] = np.arange(len(indices))
            new_groups = key_groups[row_of[representatives]]
            self._check_key_groups(new_groups, lambda i: list(position)[i])
            new_slots = self._allocate(len(position))
            for key, slot in zip(position, new_slots.tolist(), strict=True):
                lookup[key] = slot
                self._okeys[slot] = key
                if key is None:
                    self._null_slot = slot
            self._key_groups[new_slots] = new_groups
            self._known.add(dictionary.take(pa.array(representatives)), new_slots)
            distinct_slots[unresolved[missing]] = new_slots[owner]
        result = distinct_slots[indices]
        return result

    def _int_key(self, value: np.int64) -> int:
        """An integer key as the user wrote it (uint64 keys are stored by their bits)."""
        return int(np.int64(value).view(np.uint64)) if self.key_type == pa.uint64() else int(value)

    def _check_key_groups(self, key_groups: np.ndarray, key_at: Callable[[int], Any]) -> None:
        """Refuse new keys outside :attr:`key_group_range` (when set, by the backend): a
        snapshot writes the backend's key groups only, so their state would be lost."""
        own = self.key_group_range
        if own is None or not key_groups.size:
            return
        outside = (key_groups < own.start) | (key_groups > own.end)
        if outside.any():
            i = int(np.argmax(outside))
            raise ValueError(
                f"columnar state '{self.name}': key {key_at(i)!r} is in key group {int(key_groups[i])}, "
                f"outside this backend's range {own}: a keyed batch must reach the subtask that owns "
                "its key groups (partitioned by ArrowKeyGroupPartitioner with the operator's max "
                "parallelism)"
            )

    # ------------------------------------------------------------------ removal

    def remove(self, slots: np.ndarray) -> None:
        """Drop the state of the keys in ``slots``: a key that comes back starts from the defaults."""
        slots = np.unique(np.asarray(slots, dtype=np.int64))
        slots = slots[self._alive[slots]]
        if not slots.size:
            return
        null_slot = self._null_slot
        if null_slot >= 0 and (slots == null_slot).any():
            self._null_slot = -1
        if self._int_keys:
            # The null key's slot holds 0 as its key, which is not the index's key 0.
            self._index.remove(self._ikeys[slots[slots != null_slot]])
        else:
            for key in self._okeys[slots].tolist():
                self._dict.pop(_NAN if _is_nan(key) else key, None)
            self._okeys[slots] = None
            if self._known is not None:
                self._known.remove(slots)
        self._alive[slots] = False
        self._born[slots] = -1
        self._free = np.concatenate([self._free, slots])
        self._count -= len(slots)

    def live_slots(self) -> np.ndarray:
        """The slots holding a key, in slot order."""
        return np.flatnonzero(self._alive[: self._high])

    # ------------------------------------------------------------------ restore

    def _load(self, keys: pa.Array, key_groups: np.ndarray, columns: Mapping[str, np.ndarray]) -> None:
        """Insert restored keys (distinct, not present), in ``key_groups``, with their values."""
        epoch = self.epoch
        slots = self.slots_of(keys, key_groups, distinct=True)
        self.epoch = epoch
        self._born[slots] = -1
        for name, values in columns.items():
            self._columns[name][slots] = values


class ColumnarStateView(KeyedBatchState):
    """The columnar state of one grouped batch's keys, as a :class:`KeyedBatchFunction` sees it.

    Built by the operator from what it computed anyway: ``slots`` (the state slot of each
    group, from :meth:`ColumnarKeyedState.slots_of` over the batch's distinct keys),
    ``offsets`` (group ``i`` is rows ``offsets[i]:offsets[i + 1]``), ``group_ids`` (the
    group of every row) and, when at hand, ``keys`` (the distinct keys; else read from the
    state on first use). Construction copies nothing; :meth:`is_new` is fixed when built
    (slots the latest ``slots_of`` inserted).

    Reads copy (``state[col]`` is the column gathered at ``slots``, with copies of mutable
    values: lists and dicts; keys cleared in this view read as the defaults); assignment
    writes a whole column back, cast to the column's dtype. :meth:`clear` frees the keys at
    once; a later assignment in the same view does not bring a cleared key back.
    """

    def __init__(
        self,
        state: ColumnarKeyedState,
        slots: np.ndarray,
        offsets: np.ndarray,
        group_ids: np.ndarray,
        keys: pa.Array | None = None,
    ) -> None:
        self._state = state
        self._slots = np.asarray(slots, dtype=np.int64)
        self._offsets = offsets
        self._group_ids = group_ids
        self._keys = keys
        self._new = state.is_new(self._slots)
        self._cleared: np.ndarray | None = None

    @property
    def keys(self) -> pa.Array:
        if self._keys is None:
            self._keys = self._state.key_array(self._slots)
        return self._keys

    @property
    def offsets(self) -> np.ndarray:
        return self._offsets

    @property
    def group_ids(self) -> np.ndarray:
        return self._group_ids

    @property
    def slots(self) -> np.ndarray:
        """The state slot of every group."""
        return self._slots

    def is_new(self) -> np.ndarray:
        return self._new.copy()

    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, column: str) -> np.ndarray:
        values: np.ndarray = self._state.column(column)[self._slots]
        if column in self._state.mutable_columns:
            # The gather copied the pointers only: a list changed in place would change the
            # state before (or without) the assignment, so give copies of mutable values.
            values = np.fromiter((copy.deepcopy(v) for v in values.tolist()), dtype=object, count=len(values))
        if self._cleared is not None:
            values[self._cleared] = self._state.defaults_of(column, int(self._cleared.sum()))
        return values

    def __setitem__(self, column: str, values: Any) -> None:
        target = self._state.column(column)
        if target.dtype == np.dtype(object):
            # Python values (lists included) one per key: never broadcast into a 2-d array.
            if isinstance(values, (pa.Array, pa.ChunkedArray)):
                values = values.to_pylist()
            if not isinstance(values, np.ndarray):
                values = (
                    list(values)
                    if isinstance(values, Iterable) and not isinstance(values, (str, bytes))
                    else [values] * len(self._slots)
                )
                values = np.fromiter(values, dtype=object, count=len(values))
        elif isinstance(values, (pa.Array, pa.ChunkedArray)):
            values = values.to_numpy(zero_copy_only=False)
        array = np.asarray(values)
        if array.ndim == 0:
            array = np.broadcast_to(array, (len(self._slots),))
        if array.shape != (len(self._slots),):
            raise BatchValueError(
                f"columnar state '{self._state.name}', column '{column}': {len(self._slots)} values "
                f"expected (one per key of the batch), got an array of shape {array.shape}"
            )
        if target.dtype != np.dtype(object) and array.dtype != target.dtype:
            if not np.can_cast(array.dtype, target.dtype, casting="same_kind"):
                raise BatchTypeError(
                    f"columnar state '{self._state.name}', column '{column}' holds {target.dtype} "
                    f"and got {array.dtype} values; convert them first (values.astype({target.dtype}))"
                )
            if (
                target.dtype.kind in "iu"
                and array.size
                and not np.can_cast(array.dtype, target.dtype, "safe")
            ):
                info = np.iinfo(target.dtype)
                low, high = array.min(), array.max()
                if low < info.min or high > info.max:
                    raise OverflowError(
                        f"columnar state '{self._state.name}', column '{column}' holds {target.dtype} "
                        f"and got values from {low} to {high}, outside [{info.min}, {info.max}]; "
                        "declare the column with a wider type in the state schema"
                    )
            array = array.astype(target.dtype)
        if self._cleared is None:
            target[self._slots] = array
        else:
            keep = ~self._cleared
            target[self._slots[keep]] = array[keep]

    def clear(self, mask: Any = None) -> None:
        if mask is None:
            chosen = np.ones(len(self._slots), dtype=bool)
        else:
            chosen = np.asarray(mask, dtype=bool)
            if chosen.shape != (len(self._slots),):
                raise BatchValueError(
                    f"clear(mask): one boolean per key of the batch ({len(self._slots)}) expected, "
                    f"got shape {chosen.shape}"
                )
        fresh = chosen if self._cleared is None else chosen & ~self._cleared
        self._state.remove(self._slots[fresh])
        self._cleared = chosen.copy() if self._cleared is None else self._cleared | chosen


# ---------------------------------------------------------------------- snapshots


def _keys_to_arrow(
    stored: np.ndarray, slots: np.ndarray, null_slot: int, key_type: pa.DataType | None, int_keys: bool
) -> pa.Array:
    """The Arrow array of keys ``stored`` (those of ``slots``): integer keys from their int64
    (or uint64 bits) form, with the null key's slot masked; other keys from their objects."""
    key_type = key_type if key_type is not None else pa.null()
    if not int_keys:
        return pa.array(stored.tolist(), type=key_type)
    mask = (slots == null_slot) if null_slot >= 0 else None
    if pa.types.is_boolean(key_type):
        return pa.array(stored.astype(bool), mask=mask)
    if key_type == pa.uint64():
        return pa.array(stored.view(np.uint64), mask=mask)
    return pa.array(stored, mask=mask).cast(key_type)


@dataclass
class _StateCopy:
    """One state's per-slot arrays as they were at the barrier (slots ``[0, high)``)."""

    name: str
    schema: pa.Schema
    key_type: pa.DataType
    int_keys: bool
    null_slot: int
    alive: np.ndarray
    key_groups: np.ndarray
    #: int64 keys, or key objects.
    keys: np.ndarray
    #: Per state column, numpy arrays by slot; nested types' columns as Arrow arrays (copied
    #: by value at the barrier, see :meth:`ColumnarKeyedState._column_at_barrier`).
    columns: list[np.ndarray | pa.Array]
    #: The live slots sorted by key group, and where each key group's start: slots
    #: ``slots[bounds[i]:bounds[i + 1]]`` are in key group ``range.start + i`` (see :meth:`sort`).
    slots: np.ndarray | None = None
    bounds: np.ndarray | None = None

    def sort(self, key_group_range: KeyGroupRange) -> None:
        live = np.flatnonzero(self.alive)
        # Key groups fit an int16 (at most 32768 of them): numpy sorts those by radix, in
        # linear time (7 against 44 ms for a million keys).
        groups = self.key_groups[live].astype(np.int16)
        order = np.argsort(groups, kind="stable")
        self.slots = live[order]
        self.bounds = np.searchsorted(
            groups[order], np.arange(key_group_range.start, key_group_range.end + 2), side="left"
        )

    def sorted_batch(self, schema: pa.Schema) -> pa.RecordBatch:
        """Every live row, sorted by key group (see :meth:`sort`): one gather per column."""
        assert self.slots is not None
        slots = self.slots
        keys = _keys_to_arrow(self.keys[slots], slots, self.null_slot, self.key_type, self.int_keys)
        taken = pa.array(slots)
        columns = [
            c.take(taken) if isinstance(c, pa.Array) else pa.array(c[slots], type=f.type)
            for c, f in zip(self.columns, self.schema, strict=True)
        ]
        return pa.RecordBatch.from_arrays([keys, *columns], schema=schema)

    def ipc_schema(self) -> pa.Schema:
        metadata = dict(self.schema.metadata or {})
        metadata[STATE_NAME_METADATA] = self.name.encode()
        return pa.schema([pa.field(KEY_COLUMN, self.key_type), *self.schema], metadata=metadata)


class ColumnarSnapshot:
    """The copies taken at the barrier (:class:`~chandy.state.backend.KeyedStateSnapshot`)."""

    def __init__(
        self, key_group_range: KeyGroupRange, copies: list[_StateCopy], names: Iterable[str] = ()
    ) -> None:
        self.key_group_range = key_group_range
        self._copies = copies
        #: Every state of the backend (those without keys too), for the handle's ``state_kinds``.
        self.names = sorted({*names, *(c.name for c in copies)})

    @property
    def is_empty(self) -> bool:
        return not self._copies

    def serializer(self) -> ColumnarSerializer:
        return ColumnarSerializer(self)

    def serialize(self) -> SerializedKeyedState:
        """The snapshot's bytes, at once (in the calling thread)."""
        return self.serializer().result().serialize()

    def release(self) -> None:
        self._copies = []


class ColumnarSerializer:
    """Nothing to do on the task thread: the copies taken at the barrier are the task's last
    contact with the snapshot, and :class:`ColumnarSnapshotResult` serializes them where the
    checkpoint's files are written. (The heap backend's ``KeyGroupSerializer`` pickles in steps
    on the task thread instead, because pickling is interpreter work that a helper thread gets
    only in turns; here the work per key group is a few Arrow calls, and per checkpoint a sort
    and one gather per column.)"""

    def __init__(self, snapshot: ColumnarSnapshot) -> None:
        self._result = ColumnarSnapshotResult(
            snapshot.key_group_range, list(snapshot._copies), tuple(snapshot.names)
        )
        self.done = True

    def step(self, deadline_ns: int | None) -> bool:
        """Done at once (see the class)."""
        return True

    def result(self) -> ColumnarSnapshotResult:
        return self._result


class ColumnarSnapshotResult:
    """A columnar snapshot ready to be written (a :class:`~chandy.state.backend.SnapshotResult`):
    the barrier's copies, serialized by :meth:`write` on the checkpoint I/O pool. It owns the
    copies (the task never touches them again), so no lock is needed."""

    def __init__(
        self, key_group_range: KeyGroupRange, copies: list[_StateCopy], names: tuple[str, ...]
    ) -> None:
        self.key_group_range = key_group_range
        self._copies = copies
        self._state_kinds = tuple((name, COLUMNAR_KIND) for name in names)
        self._serialized: SerializedKeyedState | None = None

    def write(
        self, writer: StateWriter, checkpoint_id: int, target_location: str | None
    ) -> WrittenKeyedState:
        """Serialize (see :meth:`serialize`) and store the bytes as one stream."""
        return self.serialize().write(writer, checkpoint_id, target_location)

    def serialize(self) -> SerializedKeyedState:
        """The payload: ``LAYOUT_MAGIC``, the header's end, the states' IPC schemas (each length
        first), then every key group's record batch messages (each with its state's index and
        its length first), key group after key group; with the byte range of each key group."""
        if self._serialized is not None:
            return self._serialized
        key_group_range = self.key_group_range
        count = key_group_range.number_of_key_groups
        if not self._copies:
            self._serialized = SerializedKeyedState(
                key_group_range, b"", ((0, 0),) * count, self._state_kinds
            )
            return self._serialized
        schemas = [state_copy.ipc_schema() for state_copy in self._copies]
        header: list[Any] = [b"", _COUNT.pack(len(schemas))]
        for schema in schemas:
            message = schema.serialize()
            header += [_LENGTH.pack(message.size), message]
        header_size = _PREAMBLE.size + sum(len(part) for part in header)
        header[0] = _PREAMBLE.pack(LAYOUT_MAGIC, header_size)
        #: (key group index, state index, frame, message) of every key group of every state.
        frames: list[tuple[int, int, bytes, pa.Buffer]] = []
        for index, (state_copy, schema) in enumerate(zip(self._copies, schemas, strict=True)):
            state_copy.sort(key_group_range)
            batch = state_copy.sorted_batch(schema)
            bounds = state_copy.bounds
            assert bounds is not None
            starts = bounds[:-1].tolist()
            for kg in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
                message = batch.slice(starts[kg], int(bounds[kg + 1]) - starts[kg]).serialize()
                frames.append((kg, index, _FRAME.pack(index, message.size), message))
        if len(self._copies) > 1:
            frames.sort(key=lambda frame: (frame[0], frame[1]))
        sizes = np.zeros(count, dtype=np.int64)
        np.add.at(sizes, [f[0] for f in frames], [_FRAME.size + f[3].size for f in frames])
        ends = header_size + np.cumsum(sizes)
        ranges = tuple(zip((ends - sizes).tolist(), ends.tolist(), strict=True))
        parts = [*header, *(part for f in frames for part in (f[2], f[3]))]
        self._copies = []
        self._serialized = SerializedKeyedState(key_group_range, b"".join(parts), ranges, self._state_kinds)
        return self._serialized


def _where(handle: KeyGroupsStateHandle) -> str:
    delegate = handle.delegate
    if isinstance(delegate, FileStateHandle):
        return f"checkpoint file {delegate.path}"
    if isinstance(delegate, ByteStreamStateHandle):
        return f"inline state {delegate.name} of the checkpoint's _metadata"
    return f"state {delegate!r}"


class ColumnarKeyedStateBackend(KeyedStateBackend):
    """The keyed state backend of a batch operator: named :class:`ColumnarKeyedState`\\ s.

    Record-at-a-time state (``get_partitioned_state``) is not served here: a keyed batch
    operator keeps columnar state, and the chain builds this backend for operators with
    ``columnar_state = True``."""

    def __init__(
        self,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        owner: str = "the operator",
        clock: Clock | None = None,
    ) -> None:
        super().__init__(key_group_range, max_parallelism)
        self.owner = owner or "the operator"
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.states: dict[str, ColumnarKeyedState] = {}
        #: Names of the states a restore brought back (their schema is the checkpoint's).
        self._restored: set[str] = set()
        #: Names requested through get_columnar_state in this run.
        self._declared: set[str] = set()

    # -------------------------------------------------------------- record state: refused

    def _record_state_error(self, what: str) -> TypeError:
        return TypeError(
            f"{self.owner} keeps columnar keyed state (a batch operator) and cannot serve "
            f"record-at-a-time {what}: use get_columnar_state(name, schema) and read or write "
            "whole columns, or convert the stream with to_records() and use the record API's keyed state"
        )

    def set_current_key(self, key: Any, key_group: int) -> None:
        raise self._record_state_error("set_current_key")

    def get_current_key(self) -> Any:
        return None

    def get_partitioned_state(self, descriptor: StateDescriptor) -> State:
        raise self._record_state_error(f"state ('{descriptor.name}')")

    # -------------------------------------------------------------- columnar state

    def get_columnar_state(
        self, name: str, schema: pa.Schema, defaults: Mapping[str, Any] | None = None
    ) -> ColumnarKeyedState:
        """The state ``name`` with ``schema`` (created empty, or as restored); the same name
        always gives the same object."""
        state = self.states.get(name)
        if state is None:
            state = self.states[name] = ColumnarKeyedState(name, schema, defaults)
            state.key_group_range = self.key_group_range
            self._declared.add(name)
            return state
        if not state.schema.equals(schema, check_metadata=False):
            if name in self._restored and name not in self._declared:
                raise self._incompatible_restore(name, state.schema, schema)
            raise IncompatibleStateError(
                f"{self.owner}: columnar state '{name}' has schema ({_describe(state.schema)}) and is "
                f"now requested with ({_describe(schema)}); use a different name for each state"
            )
        if name not in self._declared:
            state.set_defaults(defaults)
            self._declared.add(name)
        return state

    def drop_columnar_state(self, name: str) -> None:
        """Forget the state ``name`` and its keys (a batch window that fired and was cleaned
        up): the next checkpoint has none of it, and ``get_columnar_state(name, ...)`` makes
        it anew."""
        self.states.pop(name, None)
        self._declared.discard(name)
        self._restored.discard(name)

    def _incompatible_restore(
        self, name: str, restored: pa.Schema, declared: pa.Schema
    ) -> IncompatibleRestoredStateError:
        return IncompatibleRestoredStateError(
            f"{self.owner} cannot restore columnar state '{name}': the checkpoint holds it "
            f"with schema ({_describe(restored)}) and the job now declares "
            f"({_describe(declared)}). Declare the state with the checkpoint's schema, or give "
            "the new state another name (the old one is then left unused), or start the "
            "operator without state: give it a new uid() and restore with "
            "execution.state-recovery.ignore-unclaimed-state: true"
        )

    def has_state(self) -> bool:
        return bool(self.states)

    def num_keys(self, state_name: str) -> int:
        state = self.states.get(state_name)
        return 0 if state is None else state.num_keys

    def snapshot(
        self,
        checkpoint_id: int = 0,
        *,
        canonical: bool = False,
        native: bool = False,
        base_checkpoint_id: BaseCheckpoint = LAST_CONFIRMED,
    ) -> ColumnarSnapshot:
        """Copy every state's live rows, sorted by key group (the synchronous part). The
        columnar backend has one format, full snapshots in Arrow IPC, whatever is asked."""
        copies = [state.copy_at_barrier() for _, state in sorted(self.states.items())]
        return ColumnarSnapshot(self.key_group_range, [c for c in copies if c is not None], self.states)

    def restore(
        self,
        handles: Iterable[KeyedStateHandle],
        reader: StateFileReader,
        policy: UnpicklingPolicy = DEFAULT_POLICY,
    ) -> None:
        """Load the key groups of this backend's range from ``handles`` (which may cover
        other ranges too: a restore after rescaling). Columns are Arrow IPC, never pickled:
        ``policy`` has nothing to restrict here."""
        #: Per state, its restored key groups (as read; loaded into the state once, below).
        read: dict[str, list[tuple[pa.Table, int]]] = {}
        for handle in handles:
            if isinstance(handle, IncrementalKeyedStateHandle):
                raise IncompatibleRestoredStateError(
                    f"{self.owner} cannot restore checkpoint {handle.checkpoint_id}: it holds the "
                    "RocksDB backend's native snapshot of record state, and this operator keeps "
                    "columnar state. Give the batch operator a new uid() (and restore with "
                    "execution.state-recovery.ignore-unclaimed-state: true)"
                )
            record_kinds = [(n, k) for n, k in handle.state_kinds if k != COLUMNAR_KIND]
            if record_kinds:
                raise IncompatibleRestoredStateError(
                    f"{self.owner} keeps columnar state and the checkpoint holds record state "
                    f"{record_kinds} for it: the operator's uid() names another operator's state. "
                    "Give the batch operator its own uid() (and restore with "
                    "execution.state-recovery.ignore-unclaimed-state: true)"
                )
            part = handle.intersection(self.key_group_range)
            if part is None or not any(end > start for start, end in part.ranges):
                continue
            if self._in_key_group_layout(part, reader):
                self._read_key_groups(part, reader, read)
                continue
            for kg, byte_range in part.key_groups():  # the first layout: a stream per key group
                if byte_range[1] > byte_range[0]:
                    self._read_key_group(part, kg, byte_range, reader, read)
        for name, parts in read.items():
            self._load(self.states[name], parts)
        for name in sorted(self._restored):
            log.debug("%s restored columnar state '%s': %d keys", self.owner, name, self.num_keys(name))

    def _in_key_group_layout(self, handle: KeyGroupsStateHandle, reader: StateFileReader) -> bool:
        """Whether ``handle``'s stream starts with :data:`LAYOUT_MAGIC` (else it is in the first
        layout, whose streams start with an Arrow IPC continuation marker)."""
        try:
            return reader.read(handle.delegate, (0, len(LAYOUT_MAGIC))) == LAYOUT_MAGIC
        except (OSError, ValueError) as exc:
            raise self._corrupt(handle, "its first bytes", exc) from None

    def _corrupt(self, handle: KeyGroupsStateHandle, what: str, exc: BaseException) -> InvalidCheckpointError:
        names = ", ".join(repr(n) for n, _ in handle.state_kinds) or "(unknown)"
        return InvalidCheckpointError(
            f"{self.owner} cannot restore columnar state {names}: {what} of {_where(handle)} "
            f"is corrupt or truncated ({type(exc).__name__}: {exc}). Restore from another checkpoint."
        )

    def _read_key_groups(
        self,
        handle: KeyGroupsStateHandle,
        reader: StateFileReader,
        read: dict[str, list[tuple[pa.Table, int]]],
    ) -> None:
        """Parse the key groups of ``handle`` (the part of a snapshot this backend owns) from a
        snapshot in the key-group layout (:meth:`ColumnarSnapshotResult.serialize`): the header
        once, then the record batch messages of those key groups only, read as one range."""
        try:
            preamble = reader.read(handle.delegate, (0, _PREAMBLE.size))
            _, header_size = _PREAMBLE.unpack(preamble)
            header = memoryview(reader.read(handle.delegate, (_PREAMBLE.size, header_size)))
            if len(header) != header_size - _PREAMBLE.size:
                raise ValueError(f"the header ends at byte {header_size}, past the stream's end")
            (count,) = _COUNT.unpack_from(header, 0)
            position = _COUNT.size
            schemas: list[pa.Schema] = []
            for _ in range(count):
                (length,) = _LENGTH.unpack_from(header, position)
                position += _LENGTH.size
                if position + length > len(header):
                    raise ValueError(f"a schema of {length} bytes runs past the header's end")
                schemas.append(pa.ipc.read_schema(pa.py_buffer(header[position : position + length])))
                position += length
            states = [self._restored_state(schema) for schema in schemas]
        except IncompatibleStateError:
            raise  # a schema the job declares differently: not corruption
        except (pa.ArrowException, OSError, EOFError, struct.error, KeyError, ValueError) as exc:
            raise self._corrupt(handle, "the header", exc) from None
        first = next(start for start, end in handle.ranges if end > start)
        last = max(end for _, end in handle.ranges)
        data = pa.py_buffer(reader.read(handle.delegate, (first, last)))
        for kg, (start, end) in handle.key_groups():
            position = start - first
            try:
                while position < end - first:
                    index, length = _FRAME.unpack_from(data, position)
                    position += _FRAME.size
                    if position + length > end - first:
                        raise ValueError(f"a record batch of {length} bytes runs past the key group's end")
                    message = pa.ipc.read_message(data.slice(position, length))
                    batch = pa.ipc.read_record_batch(message, schemas[index])
                    batch.validate()
                    position += length
                    if batch.num_rows:
                        read.setdefault(states[index].name, []).append((pa.Table.from_batches([batch]), kg))
            except (pa.ArrowException, OSError, EOFError, struct.error, ValueError, IndexError) as exc:
                raise self._corrupt(handle, f"key group {kg} (bytes {start}..{end})", exc) from None

    def _read_key_group(
        self,
        handle: KeyGroupsStateHandle,
        key_group: int,
        byte_range: Range,
        reader: StateFileReader,
        read: dict[str, list[tuple[pa.Table, int]]],
    ) -> None:
        """Parse one key group's IPC streams (one per state) into ``read``, checking each
        stream's state and schema."""
        data = reader.read(handle.delegate, byte_range)
        source = pa.BufferReader(pa.py_buffer(data))
        name = ", ".join(repr(n) for n, _ in handle.state_kinds) or "(unknown)"
        try:
            while source.tell() < len(data):
                stream = pa.ipc.open_stream(source)
                schema = stream.schema
                name = repr((schema.metadata or {})[STATE_NAME_METADATA].decode())
                table = stream.read_all()
                state = self._restored_state(schema)
                if table.num_rows:
                    read.setdefault(state.name, []).append((table, key_group))
        except IncompatibleStateError:
            raise  # a schema the job declares differently: not corruption
        except (pa.ArrowException, OSError, KeyError, IndexError, ValueError, UnicodeDecodeError) as exc:
            raise InvalidCheckpointError(
                f"{self.owner} cannot restore columnar state {name}: key group {key_group} "
                f"(bytes {byte_range[0]}..{byte_range[1]}) of {_where(handle)} is corrupt "
                f"({type(exc).__name__}: {exc}). Restore from another checkpoint."
            ) from None

    def _restored_state(self, ipc_schema: pa.Schema) -> ColumnarKeyedState:
        """The state a checkpointed stream with ``ipc_schema`` belongs to (created as the
        checkpoint declares it, or the job's, which must have the same schema)."""
        metadata = dict(ipc_schema.metadata or {})
        name = metadata.pop(STATE_NAME_METADATA).decode()
        if ipc_schema.names[0] != KEY_COLUMN:
            raise ValueError(
                f"the first column is {ipc_schema.names[0]!r}, not the key column {KEY_COLUMN!r}"
            )
        schema = pa.schema(list(ipc_schema)[1:], metadata=metadata or None)
        state = self.states.get(name)
        if state is None:
            state = self.states[name] = ColumnarKeyedState(name, schema)
            state.key_group_range = self.key_group_range
        elif not state.schema.equals(schema, check_metadata=False):
            if name in self._declared:
                raise self._incompatible_restore(name, schema, state.schema)
            raise ValueError(
                f"state '{name}' has schema ({_describe(schema)}) in one key group and "
                f"({_describe(state.schema)}) in another"
            )
        self._restored.add(name)
        return state

    @staticmethod
    def _load(state: ColumnarKeyedState, parts: list[tuple[pa.Table, int]]) -> None:
        """Insert the keys and values of every restored key group of ``state`` at once (one
        lookup for all of them), grouped by the key type they were written with."""
        by_type: dict[pa.DataType, list[tuple[pa.Table, int]]] = {}
        for table, key_group in parts:
            by_type.setdefault(table.schema.field(0).type, []).append((table, key_group))
        for same in by_type.values():
            table = pa.concat_tables([t for t, _ in same])
            key_groups = np.repeat(
                np.array([kg for _, kg in same], dtype=np.int32), [t.num_rows for t, _ in same]
            )
            columns = {
                f.name: _to_numpy(table.column(i + 1), state.column(f.name).dtype)
                for i, f in enumerate(state.schema)
            }
            state._load(table.column(0).combine_chunks(), key_groups, columns)

    def dispose(self) -> None:
        self.states.clear()


def _to_numpy(column: pa.ChunkedArray, dtype: np.dtype[Any]) -> np.ndarray:
    if dtype == np.dtype(object):
        return np.fromiter(column.to_pylist(), dtype=object, count=len(column))
    converted: np.ndarray = column.to_numpy().astype(dtype, copy=False)
    return converted


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)
