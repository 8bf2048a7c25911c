"""KeyedBatch: the records of a key-partitioned edge, as three parallel columns.

A keyed operator needs each record's key and key group. The partitioner
computed both to choose the channel, so they travel with the records instead
of being computed again. Three parallel lists cost a list append per column;
a ``(key_group, key, value)`` tuple per record costs an allocation, which in
CPython is the more expensive of the two. The receiving loop iterates
``zip(key_groups, keys, values)``, which reuses one tuple.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class KeyedBatch:
    """Parallel columns: ``key_groups[i]``, ``keys[i]`` and ``values[i]`` are one record."""

    __slots__ = ("key_groups", "keys", "values")

    def __init__(
        self,
        key_groups: list[int] | None = None,
        keys: list[Any] | None = None,
        values: list[Any] | None = None,
    ) -> None:
        self.key_groups = key_groups if key_groups is not None else []
        self.keys = keys if keys is not None else []
        self.values = values if values is not None else []

    def __len__(self) -> int:
        return len(self.values)

    def __bool__(self) -> bool:
        return bool(self.values)

    def __getitem__(self, index: slice) -> KeyedBatch:
        if not isinstance(index, slice):
            raise TypeError("a KeyedBatch is sliced, not indexed")
        return KeyedBatch(self.key_groups[index], self.keys[index], self.values[index])

    def __delitem__(self, index: slice) -> None:
        del self.key_groups[index], self.keys[index], self.values[index]

    def __iter__(self) -> Iterator[tuple[int, Any, Any]]:
        return zip(self.key_groups, self.keys, self.values, strict=True)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, KeyedBatch)
            and self.values == other.values
            and self.keys == other.keys
            and self.key_groups == other.key_groups
        )

    def __repr__(self) -> str:
        return f"KeyedBatch({list(self)!r})"

    def __reduce__(self) -> tuple[type, tuple[list[int], list[Any], list[Any]]]:
        return KeyedBatch, (self.key_groups, self.keys, self.values)
