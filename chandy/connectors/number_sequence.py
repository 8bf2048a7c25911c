"""``NumberSequenceSource(start, end)``: the numbers ``start..end`` (inclusive), in parallel."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chandy.core.connector import Boundedness, Source, SourceReader, SourceReaderContext


@dataclass
class NumberSequenceSplit:
    """Numbers ``[position, end]`` still to emit."""

    split_id: int
    position: int
    end: int


class NumberSequenceReader(SourceReader):
    """Reads a number sequence source's split: the numbers of this subtask's range from the checkpointed
    position on."""

    def __init__(self) -> None:
        self._splits: list[NumberSequenceSplit] = []

    def add_splits(self, splits: Sequence[NumberSequenceSplit]) -> None:
        self._splits.extend(NumberSequenceSplit(s.split_id, s.position, s.end) for s in splits)

    def next_range(self, max_records: int) -> tuple[int, int] | None:
        """The next ``[start, stop)`` of at most ``max_records`` numbers, taken from the
        current split (its position moves past them); ``None`` when all are read."""
        while self._splits:
            split = self._splits[0]
            if split.position > split.end:
                self._splits.pop(0)
                continue
            start, stop = split.position, min(split.end + 1, split.position + max_records)
            split.position = stop
            return start, stop
        return None

    def poll_next(self, max_records: int) -> list[int] | None:
        taken = self.next_range(max_records)
        return None if taken is None else list(range(*taken))

    def snapshot_state(self, checkpoint_id: int) -> list[NumberSequenceSplit]:
        return [NumberSequenceSplit(s.split_id, s.position, s.end) for s in self._splits]


class NumberSequenceSource(Source):
    """Every integer from ``start`` to ``end`` inclusive, split evenly across subtasks
    (PyFlink's ``NumberSequenceSource``)."""

    def __init__(self, start: int, end: int) -> None:
        if not isinstance(start, int) or not isinstance(end, int):
            raise TypeError("NumberSequenceSource(start, end) takes integers")
        if end < start:
            raise ValueError(f"NumberSequenceSource: end {end} is before start {start}")
        self.start = start
        self.end = end

    def get_boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED

    def create_splits(self, parallelism: int) -> list[NumberSequenceSplit]:
        total = self.end - self.start + 1
        splits = []
        for i in range(parallelism):
            lo = self.start + i * total // parallelism
            hi = self.start + (i + 1) * total // parallelism - 1
            splits.append(NumberSequenceSplit(i, lo, hi))
        return splits

    def create_reader(self, context: SourceReaderContext) -> NumberSequenceReader:
        return NumberSequenceReader()
