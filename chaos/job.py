"""The chaos job: a paced sequence, then two branches.

The sequence's source splits have sizes of their own (:class:`chaos.finishing.UnevenNumberSequence`),
so paced subtasks finish at very different times, while the others still run; the pacing map
is where the faults timed to a subtask finishing strike (:mod:`chaos.finishing`).

Running sums: keyed running sums -> FileSink (Parquet) and DeltaSink. Record ``i`` goes
to key ``i % keys`` and comes out as ``{key, id, count, sum}``: ``count`` and ``sum``
are the running count and sum of its key, kept in keyed state. A record processed twice
repeats a ``count`` of its key, a lost one leaves a gap, and the final ``sum`` of a key
is the sum of its ids only if each counted once: the committed output alone shows any
loss or duplicate.

Event time: each record gets a timestamp (:class:`EventTime`: its position in its
source split, with a bounded disorder fixed per id) and the sources bounded-out-of-order
watermarks; a keyed tumbling event-time window counts and sums the ids of each (key,
window); a keyed process function holds each window's result in ``MapState`` until an
event-time timer one window later and only then emits ``{key, window_start, count,
sum}`` to a FileSink (Parquet). The source is bounded: its final watermark fires every
window and timer before the last checkpoint commits, so the committed rows must hold
each (key, window) once with the count and sum of its ids. A lost or doubly fired
window or timer, a window restored without its contents, or a timer restored without
its row (or the other way round) all show in that output.

Everything here is importable (not defined in ``__main__``), so cloudpickle ships it
by reference and every slot imports this module, and with it :mod:`chaos.faultyfs`,
which registers the ``faulty://`` protocol before the slot's tasks touch storage.
"""

from __future__ import annotations

import bisect
import os
import time
from typing import Any

import pyarrow as pa

import chaos.faultyfs  # noqa: F401 - registers faulty:// in every process that loads the job
from chandy import StreamExecutionEnvironment
from chandy.connectors import DeltaSink, FileSink, ParquetBulkWriters
from chandy.core.connector import Committer
from chandy.core.functions import (
    AggregateFunction,
    CheckpointedFunction,
    CheckpointListener,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedProcessFunction,
    MapFunction,
    RuntimeContext,
)
from chandy.core.state import MapStateDescriptor, ValueStateDescriptor
from chandy.core.time import MAX_WATERMARK, Time, TimeDomain
from chandy.core.watermark_strategy import TimestampAssigner, WatermarkStrategy
from chandy.core.windows import TumblingEventTimeWindows
from chaos.faultyfs import FaultPlan, InjectedFault
from chaos.finishing import FinishFaults, UnevenNumberSequence, last_ids

SCHEMA = pa.schema([("key", pa.int64()), ("id", pa.int64()), ("count", pa.int64()), ("sum", pa.int64())])
WINDOW_SCHEMA = pa.schema(
    [("key", pa.int64()), ("window_start", pa.int64()), ("count", pa.int64()), ("sum", pa.int64())]
)

#: Event time advances this many ms per record of a source split.
STEP_MS = 1
#: Each record's timestamp is up to this many ms later than its position's (so records come
#: out of order); the watermarks allow for exactly this much disorder, so none is late.
DISORDER_MS = 40
#: A window's result is held back until the watermark passes the end of the window after it.
HOLD_WINDOWS = 1
#: What a timer emits when it finds no row for its window (a timer restored without its state).
NO_ROW = -1
#: What a timer emits when it fires before the watermark reached its timestamp.
EARLY = -2

#: How often (seconds) a running function looks for an armed fault of its own.
POLL_S = 0.05


class PacedFinishing(CheckpointedFunction, CheckpointListener):
    """What the pacing map of both chaos jobs (records here, batches in
    :mod:`chaos.batch_job`) does besides mapping: holds each subtask to ``rate`` records per
    second, so a run lasts long enough for its faults to land (sleeps only when ahead: a
    loaded machine does not slow it more). Chained to the source, it sees each subtask's end
    of input, final checkpoint and end, and strikes the faults timed to them
    (:class:`chaos.finishing.FinishFaults`)."""

    def __init__(self, rate: float, plan_dir: str, sizes: list[int]) -> None:
        self.rate = rate
        self.plan_dir = plan_dir
        self.ends = last_ids(sizes)

    def open(self, runtime_context: RuntimeContext) -> None:
        self.start = time.monotonic()
        self.count = 0
        self.finishing = FinishFaults(self.plan_dir, runtime_context.get_index_of_this_subtask(), self.ends)

    def step(self, last_id: int, records: int) -> None:
        """``records`` more records mapped, the last of them ``last_id``."""
        self.finishing.on_record(last_id)
        self.count += records
        ahead = self.count / self.rate - (time.monotonic() - self.start)
        if ahead > 0.005:
            time.sleep(ahead)

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        pass  # no state: a checkpointed function only to see the snapshots

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        self.finishing.on_snapshot(context.get_checkpoint_id())

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.finishing.on_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        pass

    def close(self) -> None:
        finishing: FinishFaults | None = getattr(self, "finishing", None)
        if finishing is not None:  # None: closed after a failed open, nothing to strike
            finishing.on_close()


class Pace(PacedFinishing, MapFunction):
    """The record job's pacing map (:class:`PacedFinishing`), one record at a time."""

    def map(self, value: Any) -> Any:
        self.step(value, 1)
        return value


class UserFaults:
    """Raises, at most every ``POLL_S``, when the plan arms a ``user`` fault for
    ``function`` (``sum``: the running sum; ``timers``: the event-time timer function;
    ``timers-at-end``: the same, among the timers the end of input fires)."""

    def __init__(self, plan_dir: str, runtime_context: RuntimeContext, function: str) -> None:
        self.plan = FaultPlan(plan_dir)
        self.function = function
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.next_poll = 0.0

    def check(self, what: str, value: Any) -> None:
        """Called for each ``what`` (a record, a timer) the function handles."""
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + POLL_S
            fault = self.plan.claim("user", function=self.function)
            if fault is not None:
                where = f"{what} {value}"
                self.plan.record_fired(fault, subtask=self.subtask, record=where)
                raise RuntimeError(f"chaos: user function fails on purpose at {where} ({fault.name})")


class RunningSum(KeyedProcessFunction):
    """Running count and sum per key; raises when the plan arms a ``user`` fault."""

    def __init__(self, plan_dir: str) -> None:
        self.plan_dir = plan_dir

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count"))
        self.sum = runtime_context.get_state(ValueStateDescriptor("sum"))
        self.faults = UserFaults(self.plan_dir, runtime_context, "sum")

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        self.faults.check("record", value)
        count = (self.count.value() or 0) + 1
        total = (self.sum.value() or 0) + value
        self.count.update(count)
        self.sum.update(total)
        yield {"key": ctx.get_current_key(), "id": value, "count": count, "sum": total}


class EventTime(TimestampAssigner):
    """Record ``i``'s timestamp: ``STEP_MS`` per position in its source split, plus up to
    ``DISORDER_MS`` fixed per id. Counting from the split's start keeps every source
    subtask at the same event time while it runs (a split that ended emits the final
    watermark), so the watermark, the minimum over them, advances all through the run and
    windows fire while faults strike, not all at the end."""

    def __init__(self, sizes: list[int]) -> None:
        splits = UnevenNumberSequence(sizes).create_splits(len(sizes))
        self.starts = [split.position for split in splits]

    def of(self, i: int) -> int:
        start = self.starts[bisect.bisect_right(self.starts, i) - 1]
        return (i - start) * STEP_MS + _jitter(i)

    def extract_timestamp(self, value: int, record_timestamp: int) -> int:
        return self.of(value)


def _jitter(i: int) -> int:
    """``0 <= _jitter(i) < DISORDER_MS``, scattered over ids (a 32-bit integer mix: the same
    in every process, unlike ``hash``)."""
    x = (i * 0x9E3779B1) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x85EBCA77) & 0xFFFFFFFF
    x ^= x >> 13
    return x % DISORDER_MS


class CountSum(AggregateFunction):
    """A window's ``(key, count, sum)`` of its ids (immutable accumulators: the window
    state holds them across checkpoints)."""

    def __init__(self, keys: int) -> None:
        self.keys = keys

    def create_accumulator(self) -> tuple[int, int, int]:
        return (-1, 0, 0)

    def add(self, value: int, accumulator: tuple[int, int, int]) -> tuple[int, int, int]:
        return (value % self.keys, accumulator[1] + 1, accumulator[2] + value)

    def get_result(self, accumulator: tuple[int, int, int]) -> tuple[int, int, int]:
        return accumulator

    def merge(self, a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
        return (max(a[0], b[0]), a[1] + b[1], a[2] + b[2])


class HoldWindows(KeyedProcessFunction):
    """Holds each window result of its key in ``MapState`` (by window start) and emits it
    from an event-time timer ``HOLD_WINDOWS`` windows after the window's end, deriving the
    window from the timer's timestamp: timers and rows of several windows per key are in
    every checkpoint, and a window that fires twice, or a timer that fires twice, never,
    early, late or without its row, shows in the output. Raises when the plan arms a ``user``
    fault for ``timers`` (in a timer, possibly after others of the same watermark fired)."""

    def __init__(self, plan_dir: str, window_ms: int) -> None:
        self.plan_dir = plan_dir
        self.window_ms = window_ms

    def open(self, runtime_context: RuntimeContext) -> None:
        self.rows = runtime_context.get_map_state(MapStateDescriptor("rows"))
        self.faults = UserFaults(self.plan_dir, runtime_context, "timers")
        self.end_faults = UserFaults(self.plan_dir, runtime_context, "timers-at-end")

    def process_element(self, value: tuple[int, int, int], ctx: KeyedProcessFunction.Context) -> Any:
        end = ctx.timestamp()  # a window's result carries its max_timestamp()
        if end is None:
            raise RuntimeError(f"chaos: window result {value} has no timestamp (expected its window's end)")
        start = end + 1 - self.window_ms
        # A second result for a window (a window fired twice) adds to the first, not replaces
        # it (nor does its timer, deduplicated, fire again): its count and sum show it.
        count, total = self.rows.get(start) or (0, 0)
        self.rows.put(start, (count + value[1], total + value[2]))
        ctx.timer_service().register_event_time_timer(end + HOLD_WINDOWS * self.window_ms)
        return None

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:
        watermark = ctx.timer_service().current_watermark()
        if watermark == MAX_WATERMARK:  # the end of input flushes every timer left
            self.end_faults.check("end-of-input timer", timestamp)
        else:
            self.faults.check("timer", timestamp)
        if ctx.time_domain() != TimeDomain.EVENT_TIME:
            raise RuntimeError(f"chaos: timer {timestamp} fired in {ctx.time_domain()}, not event time")
        start = timestamp + 1 - (HOLD_WINDOWS + 1) * self.window_ms
        row = self.rows.get(start)
        self.rows.remove(start)
        count, total = row if row is not None else (NO_ROW, NO_ROW)
        if timestamp > watermark:
            count, total = EARLY, EARLY
        yield {"key": ctx.get_current_key(), "window_start": start, "count": count, "sum": total}


class FlakyCommitter(Committer):
    """A sink's committer that raises once when the plan arms a ``commit`` fault for it
    (before committing: the restore must commit what this attempt did not)."""

    def __init__(self, inner: Committer, plan_dir: str, sink: str) -> None:
        self.inner = inner
        self.plan = FaultPlan(plan_dir)
        self.sink = sink

    def commit(self, committables: list[Any]) -> None:
        if committables:
            fault = self.plan.claim("commit", sink=self.sink)
            if fault is not None:
                self.plan.record_fired(fault, committables=len(committables))
                raise InjectedFault(f"chaos: the {self.sink} sink's commit fails on purpose ({fault.name})")
        self.inner.commit(committables)

    def close(self) -> None:
        self.inner.close()


class ChaosFileSink(FileSink):
    def __init__(self, plan_dir: str, base_path: str) -> None:
        super().__init__(base_path, bulk_writer_factory=ParquetBulkWriters.for_records(SCHEMA))
        self.plan_dir = plan_dir

    def create_committer(self) -> Committer:
        return FlakyCommitter(super().create_committer(), self.plan_dir, "file")


class ChaosWindowSink(FileSink):
    """The event-time branch's Parquet FileSink (its commit faults are the ``windows`` sink's)."""

    def __init__(self, plan_dir: str, base_path: str) -> None:
        super().__init__(base_path, bulk_writer_factory=ParquetBulkWriters.for_records(WINDOW_SCHEMA))
        self.plan_dir = plan_dir

    def create_committer(self) -> Committer:
        return FlakyCommitter(super().create_committer(), self.plan_dir, "windows")


class ChaosDeltaSink(DeltaSink):
    def __init__(self, plan_dir: str, table_uri: str) -> None:
        super().__init__(table_uri, SCHEMA)
        self.plan_dir = plan_dir

    def create_committer(self) -> Committer:
        return FlakyCommitter(super().create_committer(), self.plan_dir, "delta")


def key_of(value: int, keys: int) -> int:
    return value % keys


def window_key(result: tuple[int, int, int]) -> int:
    return result[0]


def build(
    env: StreamExecutionEnvironment,
    run_dir: str,
    plan_dir: str,
    sizes: list[int],
    keys: int,
    rate: float,
    window_ms: int,
) -> None:
    """The job of one chaos run, writing under ``run_dir`` (``parquet/``, ``delta/``,
    ``windows/``); one source split of each size in ``sizes`` (the job's parallelism)."""
    source = env.from_source(UnevenNumberSequence(sizes), source_name="Sequence Source")
    paced = source.uid("source").map(Pace(rate, plan_dir, sizes)).uid("pace")
    counted = paced.key_by(lambda i, k=keys: key_of(i, k)).process(RunningSum(plan_dir)).uid("sum")
    counted.sink_to(ChaosFileSink(plan_dir, os.path.join(run_dir, "parquet"))).uid("parquet")
    counted.sink_to(ChaosDeltaSink(plan_dir, os.path.join(run_dir, "delta"))).uid("delta")
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(DISORDER_MS).with_timestamp_assigner(
        EventTime(sizes)
    )
    (
        paced.assign_timestamps_and_watermarks(strategy)
        .uid("timestamps")
        .key_by(lambda i, k=keys: key_of(i, k))
        .window(TumblingEventTimeWindows.of(Time.milliseconds(window_ms)))
        .aggregate(CountSum(keys))
        .uid("windows")
        .key_by(window_key)
        .process(HoldWindows(plan_dir, window_ms))
        .uid("hold")
        .sink_to(ChaosWindowSink(plan_dir, os.path.join(run_dir, "windows")))
        .uid("windows-parquet")
    )
