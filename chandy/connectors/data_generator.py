"""``DataGeneratorSource``: records made by a function of their index, optionally rate-limited.

Flink's ``DataGeneratorSource`` for tests, demos and load generation: record ``i``
is ``generator_function(i)``. Because a record is a pure function of its index,
the read position is just the next index, and a restore (at any parallelism)
resumes exactly: nothing is generated twice and nothing is skipped.

A restore with another ``count`` re-plans from the new bound: the restored splits stop
below it, and a larger count (or ``None``, unbounded) adds the indices from the old count
on, dealt to the subtasks as a fresh start would deal them. The checkpoint records the
count it was taken with (in the readers' shared state) for this. A smaller count cannot
take back records already emitted above it: that is logged as a warning naming both.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chandy.core.connector import Boundedness, Source, SourceReader, SourceReaderContext

log = logging.getLogger(__name__)

#: Longest a rate-limited reader lets its task sleep between polls: bounds the extra
#: latency of a slow source while keeping an idle task from spinning.
_MAX_IDLE_WAIT_S = 0.05
#: Shortest sleep: a fast rate still hands the thread back to checkpoints and mail.
_MIN_IDLE_WAIT_S = 0.001
#: Records a reader may emit in one burst after it fell behind (e.g. under backpressure),
#: in seconds of its rate. Keeps "N per second" true over any window longer than this.
_BURST_S = 0.05


@dataclass
class DataGeneratorSplit:
    """Indices ``position, position + step, ...`` still to generate, below ``end``
    (``end`` is ``None`` for an unbounded source).

    A bounded source cuts ``[0, count)`` into contiguous ranges (``step`` 1); an
    unbounded one cannot, so subtask ``i`` of ``p`` gets ``i, i + p, i + 2p, ...``.
    The split carries its own step, so it stays correct when a restore deals it
    to a job with another parallelism.
    """

    split_id: int
    position: int
    end: int | None
    step: int = 1

    def copy(self) -> DataGeneratorSplit:
        """A copy of the split (its position is checkpointed from it)."""
        return DataGeneratorSplit(self.split_id, self.position, self.end, self.step)

    def remaining(self) -> float:
        """How many records the split still has to generate (infinite when unbounded)."""
        if self.end is None:
            return math.inf
        return max(0, -(-(self.end - self.position) // self.step))


@dataclass(frozen=True)
class PlannedCount:
    """The ``count`` a checkpoint's splits were planned from (every reader's shared state)."""

    count: int | None


@dataclass(frozen=True)
class GeneratorPlan:
    """What a reader needs to re-plan restored splits: the source's count now, and where
    the reader runs."""

    count: int | None
    subtask_index: int
    parallelism: int


class _RateLimiter:
    """A token bucket: ``rate`` permits per second, at most a short burst saved up.

    Starts with one permit so the first record goes out at once.
    """

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate * _BURST_S)
        self._tokens = 1.0
        self._last: float | None = None

    def available(self) -> int:
        now = time.monotonic()
        if self._last is not None:
            self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now
        return int(self._tokens)

    def acquire(self, permits: int) -> None:
        self._tokens -= permits


class DataGeneratorReader(SourceReader):
    """Generates the records of the splits it owns, one split after the other."""

    def __init__(
        self,
        generator_function: Callable[[Any], Any],
        records_per_second: float | None,
        boundedness: Boundedness,
        plan: GeneratorPlan | None = None,
    ) -> None:
        self._generate = generator_function
        self._plan = plan
        #: The counts the restored checkpoint was planned from (set on a restore only).
        self._restored_counts: set[int | None] | None = None
        self._bounded = boundedness is Boundedness.BOUNDED
        self._splits: list[DataGeneratorSplit] = []
        self._limiter = _RateLimiter(records_per_second) if records_per_second else None
        if self._limiter is not None:
            # Sleep about one record's worth of time: a slow rate polls rarely, a fast one
            # often, so records go out in small batches soon after they are due.
            self.idle_wait_s = min(_MAX_IDLE_WAIT_S, max(_MIN_IDLE_WAIT_S, 1.0 / self._limiter.rate))

    def add_splits(self, splits: Sequence[DataGeneratorSplit]) -> None:
        copies = [s.copy() for s in splits]
        if self._restored_counts is not None and self._plan is not None:
            copies = self._replan(copies, self._restored_counts, self._plan)
            self._restored_counts = None
        self._splits.extend(copies)

    def snapshot_shared_state(self, checkpoint_id: int) -> list[Any]:
        return [] if self._plan is None else [PlannedCount(self._plan.count)]

    def restore_shared_state(self, elements: list[Any]) -> None:
        self._restored_counts = {e.count for e in elements if isinstance(e, PlannedCount)}

    @staticmethod
    def _replan(
        splits: list[DataGeneratorSplit], counts: set[int | None], plan: GeneratorPlan
    ) -> list[DataGeneratorSplit]:
        """The restored ``splits`` of this subtask under the count of ``plan``: none reaches
        at or past a new bound, and indices from a smaller old count on are dealt out anew."""
        new = plan.count
        first = plan.subtask_index == 0  # the count is the whole source's: one subtask tells
        if len(counts) != 1:
            # A checkpoint of an older chandy (or of another source under this uid): its
            # count is unknown, so only the new bound can be honoured.
            if new is not None:
                for split in splits:
                    split.end = new if split.end is None else min(split.end, new)
            if first:
                log.warning(
                    "DataGeneratorSource(count=%s) restored from a checkpoint that does not record "
                    "the count it was started with: it generates no index at or above %s, but if "
                    "the count was raised, the indices above the old count are not generated. "
                    "Start the source without its state (a new uid()) to generate exactly [0, %s).",
                    new,
                    new,
                    new,
                )
            return splits
        (old,) = counts
        if old == new:
            return splits
        if new is not None:
            for split in splits:
                split.end = new if split.end is None else min(split.end, new)
        if old is not None and (new is None or new > old):
            i, p = plan.subtask_index, plan.parallelism
            if new is None:
                splits.append(DataGeneratorSplit(old + i, old + i, None, p))
            elif old + i * (new - old) // p < old + (i + 1) * (new - old) // p:
                splits.append(
                    DataGeneratorSplit(old + i, old + i * (new - old) // p, old + (i + 1) * (new - old) // p)
                )
        if first and new is not None and (old is None or new < old):
            log.warning(
                "DataGeneratorSource restored with count=%s from a checkpoint taken with count=%s: "
                "it generates no index at or above %s from now on, but records at those indices "
                "emitted before the checkpoint stay emitted.",
                new,
                "None (unbounded)" if old is None else old,
                new,
            )
        elif first:
            log.info(
                "DataGeneratorSource restored with count=%s from a checkpoint taken with count=%s: "
                "it also generates the indices from %s on.",
                "None (unbounded)" if new is None else new,
                old,
                old,
            )
        return splits

    def next_range(self, max_records: int) -> tuple[DataGeneratorSplit, int] | list[Any] | None:
        """The split to generate from and how many of its indices are due now (``[]`` when
        none are, ``None`` at the end). The caller generates them, then calls
        :meth:`advance`: a raising generator function moves nothing."""
        while self._splits and self._splits[0].remaining() == 0:
            self._splits.pop(0)
        if not self._splits:
            # An unbounded source whose subtask got no split (rescaled up) idles forever.
            return None if self._bounded else []
        split = self._splits[0]
        n = max_records
        if self._limiter is not None:
            n = min(n, self._limiter.available())
            if n <= 0:
                return []
        return split, int(min(n, split.remaining()))

    def advance(self, split: DataGeneratorSplit, n: int) -> None:
        """``n`` indices of ``split`` were generated (and take ``n`` permits of the rate)."""
        split.position += n * split.step
        if self._limiter is not None:
            self._limiter.acquire(n)

    def poll_next(self, max_records: int) -> list[Any] | None:
        due = self.next_range(max_records)
        if not isinstance(due, tuple):
            return due
        split, n = due
        generate = self._generate
        batch = [generate(i) for i in range(split.position, split.position + n * split.step, split.step)]
        self.advance(split, n)
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[DataGeneratorSplit]:
        return [s.copy() for s in self._splits]


class DataGeneratorSource(Source):
    """Record ``i`` is ``generator_function(i)`` for ``i`` in ``[0, count)``, or forever
    when ``count`` is ``None`` (Flink's ``DataGeneratorSource``).

    ``records_per_second`` limits the whole source; each of the ``p`` subtasks
    emits its ``1/p`` share. A rate-limited reader never sleeps in ``poll_next``:
    it returns nothing until records are due and lets its task sleep briefly, so
    checkpoints and cancellation are never held up by the limit.

    Bounded: subtask ``i`` of ``p`` generates the ``i``-th of ``p`` contiguous
    ranges. Unbounded: it generates every ``p``-th index starting at ``i``. Either
    way each split checkpoints the next index, so a restore (also at another
    parallelism) neither repeats nor skips a record. ``generator_function`` must
    be deterministic for that to mean the same records.
    """

    #: Argument names in error messages (the Arrow twin's differ).
    _FUNCTION_ARGUMENT = "generator_function"
    _RATE_ARGUMENT = "records_per_second"

    def __init__(
        self,
        generator_function: Callable[[int], Any],
        count: int | None,
        records_per_second: float | None = None,
    ) -> None:
        if not callable(generator_function):
            raise TypeError(
                f"{type(self).__name__}: {self._FUNCTION_ARGUMENT} must be callable (index -> record), "
                f"got {type(generator_function).__name__}"
            )
        if count is not None:
            if isinstance(count, bool) or not isinstance(count, int):
                raise TypeError(
                    f"{type(self).__name__}: count must be an int (or None for an unbounded "
                    f"source), got {type(count).__name__}"
                )
            if count < 0:
                raise ValueError(f"{type(self).__name__}: count must be >= 0, got {count}")
        if records_per_second is not None:
            if isinstance(records_per_second, bool) or not isinstance(records_per_second, (int, float)):
                raise TypeError(
                    f"{type(self).__name__}: {self._RATE_ARGUMENT} must be a number (or None for "
                    f"no limit), got {type(records_per_second).__name__}"
                )
            if not math.isfinite(records_per_second) or records_per_second <= 0:
                raise ValueError(
                    f"{type(self).__name__}: {self._RATE_ARGUMENT} must be a finite number > 0, "
                    f"got {records_per_second}"
                )
        self.generator_function = generator_function
        self.count = count
        self.records_per_second = records_per_second

    def get_boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED if self.count is not None else Boundedness.CONTINUOUS_UNBOUNDED

    def create_splits(self, parallelism: int) -> list[DataGeneratorSplit]:
        if self.count is None:
            return [DataGeneratorSplit(i, i, None, parallelism) for i in range(parallelism)]
        n = self.count
        return [
            DataGeneratorSplit(i, i * n // parallelism, (i + 1) * n // parallelism)
            for i in range(parallelism)
        ]

    def create_reader(self, context: SourceReaderContext) -> DataGeneratorReader:
        share = None
        if self.records_per_second is not None:
            share = self.records_per_second / context.parallelism
            log.debug(
                "DataGeneratorSource subtask %d/%d: %.3g records/s",
                context.subtask_index,
                context.parallelism,
                share,
            )
        return DataGeneratorReader(self.generator_function, share, self.get_boundedness(), self.plan(context))

    def plan(self, context: SourceReaderContext) -> GeneratorPlan:
        """What a reader of ``context`` re-plans restored splits with."""
        return GeneratorPlan(self.count, context.subtask_index, context.parallelism)
