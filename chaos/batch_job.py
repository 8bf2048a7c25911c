"""The chaos job on the batch (Arrow) path: the record job's checks, on columns.

A batch source (:class:`UnevenArrowSequence`: the record job's uneven splits, read a few
hundred rows per poll, :data:`BATCH_ROWS`) -> a paced ``map_batches`` (:class:`PaceBatches`:
the record job's pacing map and its faults timed to a subtask finishing) computing each
row's ``key``, ``id``, ``sum`` (its id, to be summed) and ``ts`` (the record job's
:class:`chaos.job.EventTime`, out of order by up to ``DISORDER_MS``) -> bounded
out-of-orderness watermarks from the ``ts`` column, then two branches:

Running sums: ``key_by("key").running_sum("sum")`` then ``key_by("key").running_count()``
(two keyed batch operators, each with its own columnar state) -> a ``map_batches`` with the
user faults of the running sum (``sum``) -> a Parquet batch ``FileSink`` and a batch
``DeltaSink``: the record job's ``{key, id, count, sum}`` rows, judged by the same oracle
(per key, counts exactly ``1..n`` and each sum the running sum of the ids before it: a
row replayed or lost in either operator shows).

Windows: ``key_by("key")`` -> a tumbling event-time window with a
:class:`~chandy.core.functions.BatchAggregateFunction` counting and summing the ids, and a
sliding one (twice the size, sliding by the size) with the built-in ``sum("id")`` -> both
as ``{key, window_start, window_end, count, sum}`` (a sliding row's ``count`` is
:data:`SUM_ONLY`) -> a ``map_batches`` with the user faults of the record job's timer
function (``timers``; ``timers-at-end`` when the batch holds a window only the end of input
fires) -> a Parquet batch ``FileSink``. The final watermark fires every window before the
last checkpoint commits, so the committed rows must hold each (key, window) of both
assigners once with its exact sum (and, tumbling, count).

The sinks' commit faults are the record job's (``file``, ``delta``, ``windows``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

import chaos.faultyfs  # noqa: F401 - registers faulty:// in every process that loads the job
from chandy import StreamExecutionEnvironment
from chandy.connectors import ArrowNumberSequenceSource, DeltaSink, FileSink, ParquetBulkWriters
from chandy.connectors.number_sequence import NumberSequenceSplit
from chandy.core.connector import Committer
from chandy.core.functions import (
    BatchAggregateFunction,
    MapBatchesFunction,
    RuntimeContext,
)
from chandy.core.time import Time
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from chaos.finishing import UnevenNumberSequence
from chaos.job import DISORDER_MS, SCHEMA, STEP_MS, EventTime, FlakyCommitter, PacedFinishing, UserFaults

#: Rows per batch (``chandy.network.arrow-batch-size``): small, so a subtask's split is many
#: batches, paced over the run, and faults land between them.
BATCH_ROWS = 256
#: The ``count`` of a sliding window's row: the built-in ``sum`` gives only the sum.
SUM_ONLY = -3
#: A sliding window is this many tumbling windows long (and slides by one).
SLIDING_WINDOWS = 2

BATCH_WINDOW_SCHEMA = pa.schema(
    [
        ("key", pa.int64()),
        ("window_start", pa.int64()),
        ("window_end", pa.int64()),
        ("count", pa.int64()),
        ("sum", pa.int64()),
    ]
)


class UnevenArrowSequence(ArrowNumberSequenceSource):
    """:class:`chaos.finishing.UnevenNumberSequence` as a batch source: column ``id``, one
    split of each size in ``sizes``."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__(0, sum(sizes) - 1, column="id")
        self.sizes = list(sizes)

    def create_splits(self, parallelism: int) -> list[NumberSequenceSplit]:
        return UnevenNumberSequence(self.sizes).create_splits(parallelism)


def jitter(ids: np.ndarray) -> np.ndarray:
    """:func:`chaos.job._jitter` over a column (the same 32-bit mix in uint64 arithmetic:
    wrapping mod 2**64 keeps the low 32 bits the mask takes)."""
    mask = np.uint64(0xFFFFFFFF)
    x = (ids.astype(np.uint64) * np.uint64(0x9E3779B1)) & mask
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x85EBCA77)) & mask
    x ^= x >> np.uint64(13)
    return (x % np.uint64(DISORDER_MS)).astype(np.int64)


def event_times(ids: np.ndarray, sizes: list[int]) -> np.ndarray:
    """:meth:`chaos.job.EventTime.of` over a column."""
    starts = np.asarray(EventTime(sizes).starts, dtype=np.int64)
    split_start = starts[np.searchsorted(starts, ids, side="right") - 1]
    result: np.ndarray = (ids - split_start) * STEP_MS + jitter(ids)
    return result


class PaceBatches(PacedFinishing, MapBatchesFunction):
    """The record job's pacing map (:class:`chaos.job.PacedFinishing`) for batches (a
    split's last id is its last batch's last row); turns the ids into the job's columns."""

    def __init__(self, rate: float, plan_dir: str, sizes: list[int], keys: int) -> None:
        super().__init__(rate, plan_dir, sizes)
        self.sizes = list(sizes)
        self.keys = keys

    def map_batch(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        ids = batch["id"].to_numpy()
        self.step(int(ids[-1]), len(ids))
        return {"key": ids % self.keys, "id": ids, "sum": ids, "ts": event_times(ids, self.sizes)}


class RunningRows(MapBatchesFunction):
    """The running rows as the sinks take them; raises when the plan arms a ``user`` fault
    for ``sum`` (after both keyed operators updated their state for the batch)."""

    def __init__(self, plan_dir: str) -> None:
        self.plan_dir = plan_dir

    def open(self, runtime_context: RuntimeContext) -> None:
        self.faults = UserFaults(self.plan_dir, runtime_context, "sum")

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        self.faults.check("batch of ids from", batch["id"][0].as_py())
        return batch.select(SCHEMA.names)


class CountSumBatches(BatchAggregateFunction):
    """A tumbling window's count and sum of its ids, per key, in numpy."""

    def create_accumulator(self) -> dict[str, Any]:
        return {"count": 0, "sum": 0}

    def add(self, accumulator: dict[str, Any], batch: Any, group_ids: Any) -> None:
        np.add.at(accumulator["count"], group_ids, 1)
        np.add.at(accumulator["sum"], group_ids, batch["id"].to_numpy())

    def get_result(self, accumulator: dict[str, Any]) -> dict[str, Any]:
        return {"count": accumulator["count"], "sum": accumulator["sum"]}


def sliding_rows(batch: pa.RecordBatch) -> dict[str, Any]:
    """A sliding window's ``sum("id")`` rows in the window sink's columns."""
    return {
        "key": batch["key"],
        "window_start": batch["window_start"],
        "window_end": batch["window_end"],
        "count": np.full(batch.num_rows, SUM_ONLY, dtype=np.int64),
        "sum": batch["id"],
    }


class WindowRows(MapBatchesFunction):
    """Fired windows on their way to the sink: raises when the plan arms a ``user`` fault for
    ``timers`` (any batch of fired windows) or ``timers-at-end`` (a batch holding a window
    that ends after the job's last timestamp: only the end of input fires it)."""

    def __init__(self, plan_dir: str, last_timestamp: int) -> None:
        self.plan_dir = plan_dir
        self.last_timestamp = last_timestamp

    def open(self, runtime_context: RuntimeContext) -> None:
        self.faults = UserFaults(self.plan_dir, runtime_context, "timers")
        self.end_faults = UserFaults(self.plan_dir, runtime_context, "timers-at-end")

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        ends = batch["window_end"].to_numpy()
        if int(ends.max()) > self.last_timestamp:
            self.end_faults.check("windows the end of input fires, ending at", int(ends.max()))
        else:
            self.faults.check("windows ending at", int(ends.min()))
        return batch.select(BATCH_WINDOW_SCHEMA.names)


class ChaosBatchFileSink(FileSink):
    """A Parquet batch FileSink whose committer takes the plan's ``commit`` faults for ``sink``."""

    def __init__(self, plan_dir: str, base_path: str, schema: pa.Schema, sink: str) -> None:
        super().__init__(base_path, bulk_writer_factory=ParquetBulkWriters.for_record_batches(schema))
        self.plan_dir = plan_dir
        self.sink = sink

    def create_committer(self) -> Committer:
        return FlakyCommitter(super().create_committer(), self.plan_dir, self.sink)


class ChaosBatchDeltaSink(DeltaSink):
    def __init__(self, plan_dir: str, table_uri: str) -> None:
        super().__init__(table_uri, SCHEMA, columnar=True)
        self.plan_dir = plan_dir

    def create_committer(self) -> Committer:
        return FlakyCommitter(super().create_committer(), self.plan_dir, "delta")


def build(
    env: StreamExecutionEnvironment,
    run_dir: str,
    plan_dir: str,
    sizes: list[int],
    keys: int,
    rate: float,
    window_ms: int,
) -> None:
    """The batch job of one chaos run, writing under ``run_dir`` (``parquet/``, ``delta/``,
    ``windows/``) as :func:`chaos.job.build` does; one source split of each size in ``sizes``."""
    env.configure({"chandy.network.arrow-batch-size": BATCH_ROWS})
    source = env.from_source(UnevenArrowSequence(sizes), source_name="Arrow Sequence Source")
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(DISORDER_MS).with_timestamp_column("ts")
    stamped = (
        source.uid("source")
        .map_batches(PaceBatches(rate, plan_dir, sizes, keys))
        .uid("pace")
        .assign_timestamps_and_watermarks(strategy)
        .uid("timestamps")
    )
    counted = (
        stamped.key_by("key")
        .running_sum("sum")
        .uid("sum")
        .key_by("key")
        .running_count()
        .uid("count")
        .map_batches(RunningRows(plan_dir))
        .uid("rows")
    )
    counted.sink_to(ChaosBatchFileSink(plan_dir, os.path.join(run_dir, "parquet"), SCHEMA, "file")).uid(
        "parquet"
    )
    counted.sink_to(ChaosBatchDeltaSink(plan_dir, os.path.join(run_dir, "delta"))).uid("delta")
    keyed = stamped.key_by("key")
    tumbling = (
        keyed.window(TumblingEventTimeWindows.of(Time.milliseconds(window_ms)))
        .aggregate(CountSumBatches(), {"count": "int64", "sum": "int64"})
        .uid("windows")
    )
    sliding = (
        keyed.window(
            SlidingEventTimeWindows.of(
                Time.milliseconds(SLIDING_WINDOWS * window_ms), Time.milliseconds(window_ms)
            )
        )
        .sum("id")
        .uid("sliding")
        .map_batches(sliding_rows)
        .uid("sliding-rows")
    )
    last_timestamp = int(event_times(np.arange(sum(sizes), dtype=np.int64), sizes).max())
    (
        tumbling.union(sliding)
        .map_batches(WindowRows(plan_dir, last_timestamp))
        .uid("window-rows")
        .sink_to(
            ChaosBatchFileSink(plan_dir, os.path.join(run_dir, "windows"), BATCH_WINDOW_SCHEMA, "windows")
        )
        .uid("windows-parquet")
    )
