"""A bounded source over an in-memory sequence (``env.from_collection``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chandy.core.connector import Boundedness, Source, SourceReader, SourceReaderContext


@dataclass
class CollectionSplit:
    """Elements ``[position, end)`` of the collection still to read."""

    split_id: int
    position: int
    end: int


class CollectionReader(SourceReader):
    """Reads a collection source's split: the elements of this subtask's share, from the checkpointed position
    on."""

    def __init__(self, elements: Sequence[Any]) -> None:
        self._elements = elements
        self._splits: list[CollectionSplit] = []

    def add_splits(self, splits: Sequence[CollectionSplit]) -> None:
        self._splits.extend(CollectionSplit(s.split_id, s.position, s.end) for s in splits)

    def poll_next(self, max_records: int) -> list[Any] | None:
        while self._splits:
            split = self._splits[0]
            if split.position >= split.end:
                self._splits.pop(0)
                continue
            stop = min(split.end, split.position + max_records)
            batch = list(self._elements[split.position : stop])
            split.position = stop
            return batch
        return None

    def snapshot_state(self, checkpoint_id: int) -> list[CollectionSplit]:
        return [CollectionSplit(s.split_id, s.position, s.end) for s in self._splits]


class CollectionSource(Source):
    """Reads a list in order. ``parallel=False`` (the default, like Flink's
    ``fromCollection``) reads it with one subtask, preserving its order."""

    def __init__(self, elements: Sequence[Any], parallel: bool = False) -> None:
        self.elements = list(elements)
        self.parallel = parallel

    def get_boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED

    def create_splits(self, parallelism: int) -> list[CollectionSplit]:
        n = len(self.elements)
        parts = parallelism if self.parallel else 1
        return [CollectionSplit(i, i * n // parts, (i + 1) * n // parts) for i in range(parts)]

    def create_reader(self, context: SourceReaderContext) -> CollectionReader:
        return CollectionReader(self.elements)
