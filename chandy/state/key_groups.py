"""Key groups: the unit in which keyed state is partitioned, snapshotted and rescaled.

Same arithmetic as Flink's ``KeyGroupRangeAssignment``: a key belongs to key group
``murmur(hash(key)) % max_parallelism``; key group ``k`` belongs to operator
``k * parallelism // max_parallelism``; operator ``i`` owns a contiguous range.

Python's ``hash()`` is salted per process, so it must never decide where a key
goes: one process would send key ``"a"`` to subtask 0, a restarted one to subtask
1, and the restored state would be in the wrong place. :func:`stable_hash` is
deterministic across processes and machines, and agrees with Python equality
for the built-in key types (``1 == 1.0 == True`` hash alike).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from chandy.core.types import Row

UPPER_BOUND_MAX_PARALLELISM = 32768
DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 128

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF


def _fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finalizer: spreads every input bit over the output."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h


def _hash_int(v: int) -> int:
    if -(1 << 63) <= v < (1 << 63):
        v &= _M64
        return (v ^ (v >> 32)) & _M32  # Java's Long.hashCode
    return zlib.crc32(v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True))


def stable_hash(key: Any) -> int:
    """A 32-bit hash of ``key`` that is the same in every process.

    Supports the types keys are made of: ``int``, ``bool``, ``float``, ``str``,
    ``bytes``, ``None``, tuples (and named tuples) and frozensets of these, enums,
    dates and times, ``Decimal``, ``UUID``, PyFlink ``Row``s and dataclass instances. Anything else
    raises :class:`TypeError` naming the type and the fix.
    """
    t = type(key)
    if t is str:
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if t is int or t is bool:
        return _hash_int(int(key))
    if t is tuple or isinstance(key, tuple):
        h = 0x345678
        for item in key:
            h = ((h * 1000003) ^ stable_hash(item)) & _M32
        return (h ^ len(key)) & _M32
    if t is float:
        if key.is_integer():
            return _hash_int(int(key))
        return zlib.crc32(struct.pack("<d", key))
    if t is bytes:
        return zlib.crc32(key) ^ 0x5BD1E995
    if key is None:
        return 0
    if isinstance(key, enum.Enum):
        return stable_hash(key.value)
    if isinstance(key, int):  # int subclasses (IntEnum handled above)
        return _hash_int(int(key))
    if isinstance(key, str):
        return stable_hash(str(key))
    if isinstance(key, frozenset):
        return sum(_fmix32(stable_hash(item)) for item in key) & _M32
    if isinstance(key, decimal.Decimal):
        if key == key.to_integral_value():
            return _hash_int(int(key))
        return zlib.crc32(str(key.normalize()).encode())
    if isinstance(key, (datetime.datetime, datetime.date, datetime.time, datetime.timedelta)):
        return zlib.crc32(repr(key).encode())
    if isinstance(key, uuid.UUID):
        return _hash_int(key.int)
    if isinstance(key, Row):  # PyFlink's composite keys; equal rows (named: in any order) alike
        return stable_hash(key._comparable())
    if dataclasses.is_dataclass(key) and not isinstance(key, type):
        return stable_hash(tuple(getattr(key, f.name) for f in dataclasses.fields(key)))
    raise TypeError(
        f"a key of type {t.__name__} cannot be partitioned: chandy needs a hash that is the "
        "same in every process. Make the key selector return an int, str, bytes, float, bool, "
        "None, a tuple of these, an enum, a date/time, a Decimal, a UUID, a Row or a dataclass of these."
    )


def assign_to_key_group(key: Any, max_parallelism: int) -> int:
    """The key group of ``key``."""
    return _fmix32(stable_hash(key)) % max_parallelism


def compute_operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask that owns ``key_group``."""
    return key_group * parallelism // max_parallelism


def assign_key_to_parallel_operator(key: Any, max_parallelism: int, parallelism: int) -> int:
    """The subtask that owns ``key``."""
    return compute_operator_index_for_key_group(
        max_parallelism, parallelism, assign_to_key_group(key, max_parallelism)
    )


def round_up_to_power_of_two(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def compute_default_max_parallelism(parallelism: int) -> int:
    """Flink's default: 1.5 x parallelism rounded up to a power of two, within [128, 32768]."""
    return min(
        max(round_up_to_power_of_two(parallelism + parallelism // 2), DEFAULT_LOWER_BOUND_MAX_PARALLELISM),
        UPPER_BOUND_MAX_PARALLELISM,
    )


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    """Reject a parallelism the key groups cannot serve."""
    if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ValueError(f"max parallelism {max_parallelism} is outside [1, {UPPER_BOUND_MAX_PARALLELISM}]")
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism {parallelism} is outside [1, max parallelism {max_parallelism}]")


@dataclass(frozen=True)
class KeyGroupRange:
    """The key groups ``start..end`` (both inclusive). Empty when ``end < start``."""

    start: int
    end: int

    @staticmethod
    def of_operator(max_parallelism: int, parallelism: int, operator_index: int) -> KeyGroupRange:
        """The range operator ``operator_index`` of ``parallelism`` owns."""
        check_parallelism(parallelism, max_parallelism)
        if not 0 <= operator_index < parallelism:
            raise ValueError(f"operator index {operator_index} outside [0, {parallelism})")
        start = (operator_index * max_parallelism + parallelism - 1) // parallelism
        end = ((operator_index + 1) * max_parallelism - 1) // parallelism
        return KeyGroupRange(start, end)

    @property
    def number_of_key_groups(self) -> int:
        return max(0, self.end - self.start + 1)

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __len__(self) -> int:
        return self.number_of_key_groups

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else KeyGroupRange(0, -1)


class KeyGroupAssigner:
    """Key -> key group, with a bounded cache for the hot path.

    Hashing in Python costs about a microsecond; real streams repeat keys, so a
    dictionary lookup answers most records. The cache is dropped when it grows
    past ``cache_size`` entries, which bounds memory for high-cardinality keys.
    """

    __slots__ = ("max_parallelism", "cache", "cache_size")

    def __init__(self, max_parallelism: int, cache_size: int = 1 << 16) -> None:
        self.max_parallelism = max_parallelism
        self.cache: dict[Any, int] = {}
        self.cache_size = cache_size

    def key_group(self, key: Any) -> int:
        try:
            kg = self.cache.get(key)
        except TypeError:
            raise TypeError(
                f"the key {key!r} is not hashable ({type(key).__name__}); make the "
                "key selector return an immutable value such as a tuple"
            ) from None
        if kg is None:
            kg = _fmix32(stable_hash(key)) % self.max_parallelism
            if len(self.cache) >= self.cache_size:
                self.cache.clear()
            self.cache[key] = kg
        return kg
