"""The batch types that travel on channels and between chained operators.

* a plain ``list`` of values: a stream without timestamps (the common case,
  and the cheapest: nothing but the values moves);
* :class:`TimestampedBatch`: values and their event timestamps, as two
  parallel columns (``None`` for a record without a timestamp);
* :class:`KeyedBatch`: into a keyed operator, the key group and key of every
  record as well (and its timestamp when the stream has them).

Why columns: a keyed operator needs each record's key and key group. The
partitioner computed both to choose the channel, so they travel with the
records instead of being computed again. Parallel lists cost a list append per
column; a ``(key_group, key, value)`` tuple per record costs an allocation,
which in CPython is the more expensive of the two. The receiving loop iterates
``zip(key_groups, keys, values)``, which reuses one tuple. Timestamps ride in
their own column for the same reason, and a stream that has none pays nothing
for them: operators check a batch's type once per batch, never per record.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class TimestampedBatch:
    """Parallel columns: ``values[i]`` has the event timestamp ``timestamps[i]`` (or ``None``)."""

    __slots__ = ("values", "timestamps")

    def __init__(self, values: list[Any] | None = None, timestamps: list[int | None] | None = None) -> None:
        self.values = values if values is not None else []
        self.timestamps = timestamps if timestamps is not None else []

    def __len__(self) -> int:
        return len(self.values)

    def __bool__(self) -> bool:
        return bool(self.values)

    def __getitem__(self, index: slice) -> TimestampedBatch:
        if not isinstance(index, slice):
            raise TypeError("a TimestampedBatch is sliced, not indexed")
        return TimestampedBatch(self.values[index], self.timestamps[index])

    def __delitem__(self, index: slice) -> None:
        del self.values[index], self.timestamps[index]

    def __iter__(self) -> Iterator[tuple[Any, int | None]]:
        return zip(self.values, self.timestamps, strict=True)

    def extend(self, other: TimestampedBatch | list[Any]) -> None:
        """Append ``other`` (a plain list gets ``None`` timestamps)."""
        if type(other) is TimestampedBatch:
            self.values.extend(other.values)
            self.timestamps.extend(other.timestamps)
        else:
            self.values.extend(other)
            self.timestamps.extend([None] * len(other))

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TimestampedBatch)
            and self.values == other.values
            and self.timestamps == other.timestamps
        )

    def __repr__(self) -> str:
        return f"TimestampedBatch({list(self)!r})"

    def __reduce__(self) -> tuple[type, tuple[list[Any], list[int | None]]]:
        return TimestampedBatch, (self.values, self.timestamps)


class KeyedBatch:
    """Parallel columns: ``key_groups[i]``, ``keys[i]`` and ``values[i]`` are one record;
    ``timestamps`` is ``None`` on a stream without event time, else ``timestamps[i]``
    is the record's timestamp (or ``None``)."""

    __slots__ = ("key_groups", "keys", "values", "timestamps")

    def __init__(
        self,
        key_groups: list[int] | None = None,
        keys: list[Any] | None = None,
        values: list[Any] | None = None,
        timestamps: list[int | None] | None = None,
    ) -> None:
        self.key_groups = key_groups if key_groups is not None else []
        self.keys = keys if keys is not None else []
        self.values = values if values is not None else []
        self.timestamps = timestamps

    @staticmethod
    def with_timestamps() -> KeyedBatch:
        """An empty batch that carries a timestamp column."""
        return KeyedBatch([], [], [], [])

    def __len__(self) -> int:
        return len(self.values)

    def __bool__(self) -> bool:
        return bool(self.values)

    def __getitem__(self, index: slice) -> KeyedBatch:
        if not isinstance(index, slice):
            raise TypeError("a KeyedBatch is sliced, not indexed")
        ts = self.timestamps
        return KeyedBatch(
            self.key_groups[index], self.keys[index], self.values[index], None if ts is None else ts[index]
        )

    def __delitem__(self, index: slice) -> None:
        del self.key_groups[index], self.keys[index], self.values[index]
        if self.timestamps is not None:
            del self.timestamps[index]

    def __iter__(self) -> Iterator[tuple[int, Any, Any]]:
        return zip(self.key_groups, self.keys, self.values, strict=True)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, KeyedBatch)
            and self.values == other.values
            and self.keys == other.keys
            and self.key_groups == other.key_groups
            and self.timestamps == other.timestamps
        )

    def __repr__(self) -> str:
        if self.timestamps is None:
            return f"KeyedBatch({list(self)!r})"
        return f"KeyedBatch({list(self)!r}, timestamps={self.timestamps!r})"

    def __reduce__(self) -> tuple[type, tuple[list[int], list[Any], list[Any], list[int | None] | None]]:
        return KeyedBatch, (self.key_groups, self.keys, self.values, self.timestamps)


def values_of(batch: Any) -> list[Any]:
    """The values of any batch type."""
    return batch if type(batch) is list else batch.values


def timestamps_of(batch: Any) -> list[int | None] | None:
    """The timestamps of any batch type, or ``None`` if it carries none."""
    return None if type(batch) is list else batch.timestamps
