"""chandy's runner: ``python -m bench.systems.chandy_runner <w1|...|w6|w1v|w3v|w5v> --work-dir DIR``.

Follows the runner protocol of :mod:`bench.systems`. ``--mode`` is the executor:
``spark`` (the default, a local Spark session with one slot per subtask) or ``local``
(every subtask a thread of this process); ``rocksdb`` is the Spark executor with the
RocksDB state backend and incremental checkpoints (``state.backend.type: rocksdb``,
``execution.checkpointing.incremental: true``) instead of the heap; ``unaligned`` is the
Spark executor with unaligned checkpoints (``execution.checkpointing.unaligned.enabled:
true``, ``execution.checkpointing.aligned-checkpoint-timeout: 0``: every checkpoint
unaligned). W4r (W4 on RocksDB) runs on RocksDB with incremental checkpoints whatever the
mode. The jobs are written as a PyFlink user writes them: a ``KeyedProcessFunction``
reading and updating a ``ValueState``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.systems.w4r_records import Pacer, PhaseNotes, Phases, W4rRecords
from bench.systems.w4r_records import figures as w4r_figures
from bench.systems.w5_events import (
    BASE_MS,
    OUT_OF_ORDERNESS_MS,
    WINDOW_MS,
    ResultCheck,
    W5Events,
    WatermarkPasses,
    latency_figures,
    watermark_passed_at,
)
from bench.systems.w5_events import figures as w5_figures
from bench.systems.w6_records import Notes, W6Plan, unaligned_of
from bench.systems.w6_records import figures as w6_figures
from bench.timing import BatchTimingSink, TimingSink, read_timings
from bench.w1 import RunningSum
from chandy import StreamExecutionEnvironment
from chandy.config.options import CheckpointingOptions, NetworkOptions
from chandy.connectors import DataGeneratorSource
from chandy.connectors.arrow_sources import ArrowDataGeneratorSource, ArrowNumberSequenceSource
from chandy.connectors.number_sequence import (
    NumberSequenceReader,
    NumberSequenceSource,
    NumberSequenceSplit,
)
from chandy.core.connector import (
    Boundedness,
    Sink,
    SinkWriter,
    SinkWriterContext,
    Source,
    SourceReader,
    SourceReaderContext,
)
from chandy.core.functions import (
    CheckpointListener,
    KeyedProcessFunction,
    MapBatchesFunction,
    RuntimeContext,
)
from chandy.core.state import ValueStateDescriptor
from chandy.core.time import Time
from chandy.core.watermark_strategy import TimestampAssigner, WatermarkGenerator, WatermarkStrategy
from chandy.core.windows import TumblingEventTimeWindows
from chandy.runtime.job_client import JobClient

log = logging.getLogger("bench.chandy")

#: ``pipeline.auto-watermark-interval`` of W5 (ms): Flink's default, which PyFlink's W5 runs with too.
W5_WATERMARK_INTERVAL_MS = 200


# ------------------------------------------------------------------ shared pieces


#: ``--mode`` -> the executor it runs on.
EXECUTORS = {"spark": "spark", "local": "local", "rocksdb": "spark", "unaligned": "spark"}


def on_rocksdb(args: argparse.Namespace) -> bool:
    """Whether the job's keyed state lives in RocksDB (incremental checkpoints) rather than
    on the heap: in the ``rocksdb`` mode, and in W4r (W4 on RocksDB) whatever the mode."""
    return args.mode == "rocksdb" or args.workload == "w4r"


def environment(args: argparse.Namespace, work_dir: Path) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=EXECUTORS[args.mode])
    env.set_parallelism(args.parallelism)
    env.configure(
        {
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 3,
            "restart-strategy.fixed-delay.delay": 0,
            # every checkpoint of a run in the statistics (W4r measures each one)
            "web.checkpoints.history": 10_000,
        }
    )
    if on_rocksdb(args):
        env.configure(
            {
                "state.backend.type": "rocksdb",
                "execution.checkpointing.incremental": True,
                "state.backend.rocksdb.localdir": str(work_dir / "rocksdb"),
            }
        )
    if args.checkpoint_interval_ms > 0:
        env.enable_checkpointing(args.checkpoint_interval_ms)
        env.get_checkpoint_config().set_checkpoint_storage(
            args.checkpoint_dir or str(work_dir / "checkpoints")
        )
        if args.mode == "unaligned":
            env.configure(
                {
                    "execution.checkpointing.unaligned.enabled": True,
                    "execution.checkpointing.aligned-checkpoint-timeout": 0,
                }
            )
    network = {
        "taskmanager.network.memory.buffers-per-channel": args.buffers_per_channel,
        "chandy.network.batch-size": args.batch_size,
    }
    env.configure({key: value for key, value in network.items() if value is not None})
    env.configure(dict(setting.split("=", 1) for setting in args.conf))
    return env


def checkpoint_figures(client: JobClient, enabled: bool) -> dict[str, Any]:
    if not enabled:
        return {"checkpoints_completed": None, "checkpoint_p50_ms": None, "checkpoint_max_ms": None}
    stats = client.get_checkpoint_statistics()
    durations = stats["summary"]["end_to_end_duration"]
    kinds = [unaligned_of(c) for c in stats["history"] if c["status"] == "COMPLETED"]
    return {
        "checkpoints_completed": stats["counts"]["completed"],
        "checkpoint_p50_ms": durations["p50"],
        "checkpoint_max_ms": durations["max"],
        # of those in the history (every one: web.checkpoints.history is set above the count)
        "unaligned_checkpoints": None if None in kinds else sum(kinds),
    }


def run(env: StreamExecutionEnvironment, name: str) -> tuple[JobClient, float]:
    """Run the job to its end; the client (for its statistics) and the wall time."""
    started = time.perf_counter()
    client = env.execute_async(name)
    client.get_job_execution_result()
    return client, time.perf_counter() - started


# ------------------------------------------------------------------ w1


def w1(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    env = environment(args, work_dir)
    (
        env.from_sequence(0, args.records - 1)
        .key_by(lambda i, keys=args.keys: i % keys)
        .process(RunningSum())
        .name("running sum")
        .sink_to(TimingSink(str(work_dir)))
    )
    client, wall = run(env, "W1 keyed running count")
    return throughput_figures(args, work_dir, client, wall)


def throughput_figures(
    args: argparse.Namespace, work_dir: Path, client: JobClient, wall: float
) -> dict[str, Any]:
    """W1's (and W1v's) figures from the timing sinks' files and the job's statistics."""
    timing = read_timings(str(work_dir))
    if timing["count"] != args.records:
        raise RuntimeError(f"{timing['count']} of {args.records} records reached the sink")
    span = timing["last"] - timing["first"]
    return {
        "records": args.records,
        "records_per_s": args.records / span,
        "first_to_last_s": span,
        "wall_s": wall,
        "task_cpu_us_per_record": timing["cpu_s"] / args.records * 1e6,
        **checkpoint_figures(client, args.checkpoint_interval_ms > 0),
    }


# ------------------------------------------------------------------ w2


class HeldSequenceReader(NumberSequenceReader):
    """Reads its split's first half, then holds the rest back until a checkpoint completes.

    W2 must fail after a checkpoint completed, with records still to come. Slowing the
    keyed function down would not get there: the checkpoint's barrier queues behind the
    records already buffered in front of it, so a small N could end before any
    checkpoint did. Holding the source back instead leaves the pipeline idle, the barrier
    passes at once, and the failure always falls mid-run.
    """

    def __init__(self, hold: bool) -> None:
        super().__init__()
        self.holding = hold
        self.idle_wait_s = 0.005
        self._hold_after: int | None = None  # records read before holding back
        self._read = 0

    def add_splits(self, splits: Sequence[NumberSequenceSplit]) -> None:
        super().add_splits(splits)
        if self.holding and splits and self._hold_after is None:
            first = splits[0]
            self._hold_after = (first.end - first.position + 1) // 2

    def poll_next(self, max_records: int) -> list[int] | None:
        if self.holding and self._hold_after is not None:
            room = self._hold_after - self._read
            if room <= 0:
                return []
            max_records = min(max_records, room)
        batch = super().poll_next(max_records)
        if batch:
            self._read += len(batch)
        return batch

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.holding = False


class HeldSequenceSource(NumberSequenceSource):
    """``0..records-1`` whose first attempt holds the second half of each split back until
    a checkpoint completed (a restored attempt, after the failure, reads straight on)."""

    def __init__(self, records: int, work_dir: str) -> None:
        super().__init__(0, records - 1)
        self.work_dir = work_dir

    def create_reader(self, context: SourceReaderContext) -> NumberSequenceReader:
        first_attempt = context.attempt_number == 0 and not (Path(self.work_dir) / "raised").exists()
        return HeldSequenceReader(hold=first_attempt)


class FailingRunningSum(KeyedProcessFunction, CheckpointListener):
    """The running sum, as ``(key, count, sum)``; subtask 0 of the first attempt raises
    once, at its first record after a checkpoint completed and a quarter of its share
    was processed (the source holds back the second half until then)."""

    def __init__(self, work_dir: str, fail_after: int) -> None:
        self.work_dir = work_dir
        self.fail_after = fail_after

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(ValueStateDescriptor("count-and-sum"))
        self.armed = (
            runtime_context.get_attempt_number() == 0 and runtime_context.get_index_of_this_subtask() == 0
        )
        self.restored = runtime_context.get_attempt_number() > 0
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.checkpointed = False
        self.seen = 0

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.checkpointed = True

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        if self.seen == 0 and self.restored:
            first = Path(self.work_dir) / f"first-after-restore-{self.subtask}"
            first.write_text(repr(time.time()))
        self.seen += 1
        if self.armed and self.checkpointed and self.seen >= self.fail_after:
            (Path(self.work_dir) / "raised").write_text(repr(time.time()))
            raise RuntimeError("W2: the injected failure")
        count, total = self.state.value() or (0, 0)
        count, total = count + 1, total + value
        self.state.update((count, total))
        yield ctx.get_current_key(), count, total


class _LastSumWriter(SinkWriter):
    """Keeps each key's latest ``(count, sum)``; the table is checkpointed with the job,
    so after a restore it is the table as of the checkpoint, and the replay brings it up
    to date. Written to a file at end of input."""

    def __init__(self, path: Path, restored: tuple[Any, ...]) -> None:
        self.path = path
        self.last: dict[int, tuple[int, int]] = {}
        for table in restored:
            self.last.update(table)

    def write(self, element: Any) -> None:
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        last = self.last
        for key, count, total in elements:
            last[key] = (count, total)

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [dict(self.last)]

    def flush(self, end_of_input: bool) -> None:
        if end_of_input:
            self.path.write_text(json.dumps({str(k): v for k, v in self.last.items()}))

    def close(self) -> None:
        pass


class LastSumSink(Sink):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        return _LastSumWriter(
            Path(self.directory) / f"sums-{context.subtask_index}.json", context.restored_state
        )


def w2(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    if args.checkpoint_interval_ms <= 0:
        raise ValueError("w2 needs checkpoints: give --checkpoint-interval-ms > 0")
    env = environment(args, work_dir)
    # A quarter of subtask 0's expected share: reached before the source holds back, so
    # the failure comes at the first record after the first completed checkpoint.
    fail_after = max(1, args.records // (4 * args.parallelism))
    (
        env.from_source(HeldSequenceSource(args.records, str(work_dir)), source_name="Sequence Source")
        .key_by(lambda i, keys=args.keys: i % keys)
        .process(FailingRunningSum(str(work_dir), fail_after))
        .name("running sum")
        .sink_to(LastSumSink(str(work_dir)))
    )
    _, wall = run(env, "W2 exactly-once under failure")
    if not (work_dir / "raised").exists():
        raise RuntimeError(
            "no failure was injected: subtask 0 of the keyed function saw fewer "
            "than a quarter of its share; give more --records"
        )
    raised = float((work_dir / "raised").read_text())
    firsts = [float(p.read_text()) for p in work_dir.glob("first-after-restore-*")]
    last: dict[str, list[int]] = {}
    for part in work_dir.glob("sums-*.json"):
        last.update(json.loads(part.read_text()))
    wrong = 0
    for key in range(args.keys):
        values = range(key, args.records, args.keys)
        if last.get(str(key)) != [len(values), sum(values)]:
            wrong += 1
    return {
        "records": args.records,
        "exact": wrong == 0,
        "wrong_keys": wrong,
        "recovery_s": min(firsts) - raised,
        "wall_s": wall,
    }


# ------------------------------------------------------------------ w3


def stamped(i: int) -> tuple[int, float]:
    return i, time.time()


class StampedRunningSum(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.sum = runtime_context.get_state(ValueStateDescriptor("sum"))

    def process_element(self, value: tuple[int, float], ctx: KeyedProcessFunction.Context) -> Any:
        i, stamp = value
        self.sum.update((self.sum.value() or 0) + i)
        yield stamp


class _LatencyWriter(SinkWriter):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.latencies: list[tuple[float, float]] = []

    def write(self, element: Any) -> None:
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        now = time.time()
        self.latencies.extend((stamp, now - stamp) for stamp in elements)

    def flush(self, end_of_input: bool) -> None:
        if end_of_input:
            self.path.write_text(json.dumps(self.latencies))

    def close(self) -> None:
        pass


class LatencySink(Sink):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        return _LatencyWriter(Path(self.directory) / f"latency-{context.subtask_index}.json")


def w3(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    env = environment(args, work_dir)
    count = int(args.rate * args.duration_s)
    (
        env.from_source(
            DataGeneratorSource(stamped, count, records_per_second=args.rate), source_name="stamped"
        )
        .key_by(lambda r, keys=args.keys: r[0] % keys)
        .process(StampedRunningSum())
        .name("running sum")
        .sink_to(LatencySink(str(work_dir)))
    )
    client, wall = run(env, "W3 latency")
    return {
        **latency_figures_of(work_dir),
        "wall_s": wall,
        **checkpoint_figures(client, args.checkpoint_interval_ms > 0),
    }


def latency_figures_of(work_dir: Path) -> dict[str, Any]:
    """W3's figures from the latency sinks' files: the first second is warm-up."""
    pairs = [pair for p in work_dir.glob("latency-*.json") for pair in json.loads(p.read_text())]
    start = min(stamp for stamp, _ in pairs)
    latencies = sorted(latency * 1000 for stamp, latency in pairs if stamp >= start + 1.0)
    return {
        "records": len(latencies),
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p99_ms": percentile(latencies, 99),
        "latency_max_ms": latencies[-1],
    }


def percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        raise RuntimeError("no records measured")
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


# ------------------------------------------------------------------ w1v, w3v: the batch path


class KeyColumn(MapBatchesFunction):
    """W1's key on the batch path: appends ``key = value % keys`` to each Arrow batch, one
    numpy remainder over the column."""

    def __init__(self, keys: int) -> None:
        self.keys = keys

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        values = batch.column("value").to_numpy()
        return batch.append_column("key", pa.array(values % self.keys))


def w1v_job(env: StreamExecutionEnvironment, records: int, keys: int, directory: str) -> None:
    """W1v's job (also profiled by ``python -m bench.profile``)."""
    (
        env.from_source(ArrowNumberSequenceSource(0, records - 1), source_name="numbers")
        .map_batches(KeyColumn(keys))
        .name("key")
        .key_by("key")
        .running_sum("value")
        .name("running sum")
        .sink_to(BatchTimingSink(directory))
    )


def w1v(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """W1 on the batch path (issue 17): ``ArrowNumberSequenceSource`` -> ``map_batches`` adding
    the key -> ``key_by("key")`` -> ``running_sum("value")`` (one row per input row, as W1's
    running sum) -> a discarding sink that takes whole batches."""
    env = environment(args, work_dir)
    w1v_job(env, args.records, args.keys, str(work_dir))
    client, wall = run(env, "W1v keyed running sum, batch path")
    return {
        **throughput_figures(args, work_dir, client, wall),
        "arrow_batch_size": env.get_configuration().get(NetworkOptions.ARROW_BATCH_SIZE),
    }


class StampedRows:
    """W3v's rows: ``value`` = the index, ``stamp`` = the wall-clock time the source made the
    batch (W3 stamps each record as its source emits it)."""

    def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {"value": indices, "stamp": np.full(len(indices), time.time())}


class _BatchLatencyWriter(_LatencyWriter):
    def write_batch(self, elements: Any) -> None:
        now = time.time()
        stamps = elements.column("stamp").to_numpy()
        self.latencies.extend(zip(stamps.tolist(), (now - stamps).tolist(), strict=True))


class BatchLatencySink(LatencySink):
    """W3's latency sink on the batch path: each row's ``now - stamp``, one clock read per batch."""

    columnar = True

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        return _BatchLatencyWriter(Path(self.directory) / f"latency-{context.subtask_index}.json")


def w3v(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """W3 on the batch path: ``rate`` rows/s from an ``ArrowDataGeneratorSource`` (rate-limited,
    so a poll takes only the rows due), W1v's key and running sum, latency at the sink."""
    env = environment(args, work_dir)
    count = int(args.rate * args.duration_s)
    (
        env.from_source(
            ArrowDataGeneratorSource(StampedRows(), count, rate_per_second=args.rate), source_name="stamped"
        )
        .map_batches(KeyColumn(args.keys))
        .name("key")
        .key_by("key")
        .running_sum("value")
        .name("running sum")
        .sink_to(BatchLatencySink(str(work_dir)))
    )
    client, wall = run(env, "W3v latency, batch path")
    return {
        **latency_figures_of(work_dir),
        "wall_s": wall,
        **checkpoint_figures(client, args.checkpoint_interval_ms > 0),
    }


# ------------------------------------------------------------------ w4


class KeyValue:
    """Record ``i``: key ``i`` and a value of ``value_bytes`` bytes (distinct per key)."""

    def __init__(self, value_bytes: int) -> None:
        self.filler = b"v" * max(0, value_bytes - 8)

    def __call__(self, i: int) -> tuple[int, bytes]:
        return i, i.to_bytes(8, "big") + self.filler


class StoreValue(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.value = runtime_context.get_state(ValueStateDescriptor("value"))

    def process_element(self, record: tuple[int, bytes], ctx: KeyedProcessFunction.Context) -> Any:
        self.value.update(record[1])
        return ()


def w4(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    if args.checkpoint_interval_ms <= 0:
        raise ValueError("w4 measures a checkpoint: give --checkpoint-interval-ms > 0")
    env = environment(args, work_dir)
    (
        env.from_source(
            DataGeneratorSource(KeyValue(args.value_bytes), args.records), source_name="key-values"
        )
        .key_by(lambda r: r[0])
        .process(StoreValue())
        .name("store value")
        .sink_to(TimingSink(str(work_dir)))
    )
    client, wall = run(env, "W4 state size")
    # The last checkpoint is the final one, taken after every source ended: it covers
    # every record.
    latest = client.get_checkpoint_statistics()["latest"]["completed"]
    return {
        "keys": args.records,
        "value_bytes": args.value_bytes,
        "checkpoint_duration_ms": latest["end_to_end_duration"],
        "checkpoint_size_bytes": latest["state_size"],
        "wall_s": wall,
    }


# ------------------------------------------------------------------ w4r


class W4rReader(SourceReader):
    """W4r's records (``w4r_records``): split ``s`` counts positions ``j``
    (``NumberSequenceSplit``), position ``j`` is record ``j * parallelism + s``; the load as
    fast as the job takes it, the updates paced to the run's rate."""

    idle_wait_s = 0.002

    def __init__(self, records: W4rRecords) -> None:
        self.records = records
        self.pacer = Pacer(records, time.monotonic)
        self._splits: list[NumberSequenceSplit] = []

    def add_splits(self, splits: Sequence[NumberSequenceSplit]) -> None:
        self._splits.extend(NumberSequenceSplit(s.split_id, s.position, s.end) for s in splits)

    def poll_next(self, max_records: int) -> list[tuple[int, int, bytes]] | None:
        records = self.records
        step = records.parallelism
        while self._splits:
            split = self._splits[0]
            if split.position > split.end:
                self._splits.pop(0)
                continue
            first = split.position * step + split.split_id
            count = min(split.end + 1 - split.position, max_records)
            if first >= records.keys or first + (count - 1) * step >= records.keys:
                count = self.pacer.due_until(first, step, count)  # updates: only those due
            split.position += count
            return [(records.key(p), p, records.value(p)) for p in range(first, first + count * step, step)]
        return None

    def snapshot_state(self, checkpoint_id: int) -> list[NumberSequenceSplit]:
        return [NumberSequenceSplit(s.split_id, s.position, s.end) for s in self._splits]


class W4rSource(Source):
    def __init__(self, records: W4rRecords) -> None:
        self.records = records

    def get_boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED

    def create_splits(self, parallelism: int) -> list[NumberSequenceSplit]:
        if parallelism != self.records.parallelism:
            raise ValueError(
                f"W4r's records are laid out for {self.records.parallelism} source subtasks, "
                f"not {parallelism}"
            )
        share = self.records.records // parallelism
        return [NumberSequenceSplit(s, 0, share - 1) for s in range(parallelism)]

    def create_reader(self, context: SourceReaderContext) -> W4rReader:
        return W4rReader(self.records)


class W4rStore(KeyedProcessFunction):
    """The key's value in a ``ValueState``, noting when the load and the updates went by
    (written at ``close``)."""

    def __init__(self, directory: str, keys: int) -> None:
        self.directory = directory
        self.keys = keys

    def open(self, runtime_context: RuntimeContext) -> None:
        self.value = runtime_context.get_state(ValueStateDescriptor("value"))
        self.notes = PhaseNotes(self.keys)
        self.path = Path(self.directory) / (
            f"phases-{runtime_context.get_index_of_this_subtask()}-{runtime_context.get_attempt_number()}.json"
        )

    def process_element(self, record: tuple[int, int, bytes], ctx: KeyedProcessFunction.Context) -> Any:
        self.value.update(record[2])
        self.notes.observe(record[1], time.time())
        return ()

    def close(self) -> None:
        self.path.write_text(json.dumps(self.notes.to_json()))


def w4r(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """W4 on RocksDB (``w4r_records``): the load, then 1 % of the keys updated per second,
    checkpoints every second, on the RocksDB backend with incremental checkpoints. Each
    checkpoint's ``checkpointed_size`` (what it uploaded) and ``state_size`` (the whole
    state it references) come from the job's checkpoint statistics (the REST API's)."""
    if args.checkpoint_interval_ms <= 0:
        raise ValueError("w4r measures checkpoints: give --checkpoint-interval-ms > 0")
    records = W4rRecords(
        args.records, args.value_bytes, args.update_fraction, args.update_s, args.parallelism
    )
    env = environment(args, work_dir)
    (
        env.from_source(W4rSource(records), source_name="w4r-records")
        .key_by(lambda r: r[0])
        .process(W4rStore(str(work_dir), records.keys))
        .name("store value")
        .sink_to(TimingSink(str(work_dir)))
    )
    client, wall = run(env, "W4r state on RocksDB")
    history = client.get_checkpoint_statistics()["history"]
    checkpoints = [
        {
            "id": c["id"],
            "trigger_ms": c["trigger_timestamp"],
            "duration_ms": c["end_to_end_duration"],
            "uploaded_bytes": c["checkpointed_size"],
            "full_bytes": c["state_size"],
        }
        for c in reversed(history)
        if c["status"] == "COMPLETED"
    ]
    phases = Phases.merge([json.loads(p.read_text()) for p in sorted(work_dir.glob("phases-*.json"))])
    return {
        **w4r_figures(records, phases, checkpoints, args.checkpoint_interval_ms),
        "state_backend": "rocksdb, incremental",
        "wall_s": wall,
    }


# ------------------------------------------------------------------ w5


class W5Reader(SourceReader):
    """W5's events, batch by batch (``W5Events.records_of``), noting when the first was
    read and, per batch (by its last record), when the largest timestamp read passed each
    window's fire threshold; the notes are written when the input ends.

    Split ``s`` counts positions ``j`` (``NumberSequenceSplit``, importable wherever the
    checkpoint is restored): position ``j`` is record ``j * parallelism + s``."""

    def __init__(self, events: W5Events, path: Path) -> None:
        self.events = events
        self.path = path
        self.passes = WatermarkPasses(events)
        self.cpu_first = 0.0
        self._splits: list[NumberSequenceSplit] = []

    def add_splits(self, splits: Sequence[NumberSequenceSplit]) -> None:
        self._splits.extend(NumberSequenceSplit(s.split_id, s.position, s.end) for s in splits)

    def poll_next(self, max_records: int) -> list[tuple[int, int, int]] | None:
        step = self.events.parallelism
        while self._splits:
            split = self._splits[0]
            if split.position > split.end:
                self._splits.pop(0)
                continue
            stop = min(split.end + 1, split.position + max_records)
            indexes = range(split.position * step + split.split_id, stop * step + split.split_id, step)
            split.position = stop
            if self.passes.first is None:
                self.cpu_first = time.process_time()
            self.passes.observe_batch(self.events.timestamp_floor(indexes[-1]), time.time())
            return self.records_of(indexes)
        if not self.path.exists():
            notes = {**self.passes.to_json(), "pid": os.getpid(), "cpu_first": self.cpu_first}
            self.path.write_text(json.dumps(notes))
        return None

    def snapshot_state(self, checkpoint_id: int) -> list[NumberSequenceSplit]:
        return [NumberSequenceSplit(s.split_id, s.position, s.end) for s in self._splits]

    def records_of(self, indexes: range) -> Any:
        """The records ``indexes`` as the source emits them."""
        return self.events.records_of(indexes)


class W5Source(Source):
    """Source subtask ``s`` of ``p`` reads records ``s, s + p, ...`` (see ``w5_events``)."""

    def __init__(self, events: W5Events, directory: str) -> None:
        self.events = events
        self.directory = directory

    def get_boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED

    def create_splits(self, parallelism: int) -> list[NumberSequenceSplit]:
        if parallelism != self.events.parallelism:
            raise ValueError(
                f"W5's events are laid out for {self.events.parallelism} source subtasks, not {parallelism}"
            )
        share = self.events.records // parallelism
        return [NumberSequenceSplit(s, 0, share - 1) for s in range(parallelism)]

    def create_reader(self, context: SourceReaderContext) -> W5Reader:
        path = Path(self.directory) / f"passes-{context.subtask_index}-{context.attempt_number}.json"
        return W5Reader(self.events, path)


class EventTimestamp(TimestampAssigner):
    """The record's own timestamp, its third field."""

    def extract_timestamp(self, value: tuple[int, int, int], record_timestamp: int) -> int:
        return value[2]


class NotedWatermarks(WatermarkGenerator):
    """Flink's bounded out-of-orderness watermarks, noting the wall-clock time at which
    the watermark this generator hands out first reaches each window's last millisecond:
    the source emits it then (the emitter asks every ``pipeline.auto-watermark-interval``
    and forwards what advanced). One small file write per window."""

    def __init__(self, out_of_orderness_ms: int, events: W5Events, directory: str) -> None:
        super().__init__(out_of_orderness_ms)
        self.events = events
        self.path = Path(directory) / f"emitted-{os.getpid()}-{id(self)}.jsonl"
        self.window = 0

    def current_watermark(self) -> int:
        watermark = super().current_watermark()
        if watermark >= self.events.fire_threshold(self.window) - OUT_OF_ORDERNESS_MS - 1:
            now = time.time()
            with self.path.open("a") as f:
                while watermark >= self.events.fire_threshold(self.window) - OUT_OF_ORDERNESS_MS - 1:
                    f.write(json.dumps([self.window, now]) + "\n")
                    self.window += 1
        return watermark


class NotedBoundedOutOfOrderness(WatermarkStrategy):
    """``for_bounded_out_of_orderness`` whose generators note when they emit each window's
    watermark (:class:`NotedWatermarks`)."""

    def __init__(self, events: W5Events, directory: str) -> None:
        super().__init__(OUT_OF_ORDERNESS_MS)
        self.events = events
        self.directory = directory

    def create_watermark_generator(self) -> WatermarkGenerator:
        return NotedWatermarks(OUT_OF_ORDERNESS_MS, self.events, self.directory)


def sum_values(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    """The window's reduce: the values' sum; key and a timestamp of the window kept."""
    return a[0], a[1] + b[1], a[2]


class _ResultWriter(SinkWriter):
    def __init__(self, events: W5Events, path: Path) -> None:
        self.path = path
        self.check = ResultCheck(events)

    def write(self, element: Any) -> None:
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        now_ms = int(time.time() * 1000)
        add = self.check.add
        for key, total, timestamp in elements:
            add(key, total, timestamp, now_ms)

    def flush(self, end_of_input: bool) -> None:
        if end_of_input:
            notes = {**self.check.to_json(), "pid": os.getpid(), "cpu_last": time.process_time()}
            self.path.write_text(json.dumps(notes))

    def close(self) -> None:
        pass


class ResultCheckSink(Sink):
    """Checks every window result as it arrives (``ResultCheck``)."""

    def __init__(self, events: W5Events, directory: str) -> None:
        self.events = events
        self.directory = directory

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        path = Path(self.directory) / f"results-{context.subtask_index}-{context.attempt_number}.json"
        return _ResultWriter(self.events, path)


def task_cpu_s(passes: list[dict[str, Any]], checks: list[dict[str, Any]]) -> float:
    """CPU seconds of the processes running W5's tasks, from a source's first batch to a
    sink's end of input, once per process (a slot process runs its subtask of every task;
    the local executor runs them all in one): unlike throughput, other tenants of the
    machine do not move it."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for p in passes:
        first[p["pid"]] = min(p["cpu_first"], first.get(p["pid"], p["cpu_first"]))
    for c in checks:
        last[c["pid"]] = max(c["cpu_last"], last.get(c["pid"], c["cpu_last"]))
    return sum(last[pid] - first[pid] for pid in last if pid in first)


def w5(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Keyed tumbling event-time window, as a PyFlink user writes it: ``from_source`` with
    a bounded out-of-orderness strategy and a timestamp assigner, ``key_by``,
    ``window(TumblingEventTimeWindows.of(Time.seconds(1)))``, ``reduce``. Besides the
    figures every runner reports, ``emitted_latency_*`` count from the moment the sources
    emitted the watermark passing a window's end (the brief's definition for chandy),
    which leaves out the wait for the periodic watermark."""
    events = W5Events(args.records, args.keys, args.per_event_second, args.parallelism)
    directory = str(work_dir)
    env = environment(args, work_dir)
    env.configure({"pipeline.auto-watermark-interval": W5_WATERMARK_INTERVAL_MS})  # the default, as PyFlink's
    strategy = NotedBoundedOutOfOrderness(events, directory).with_timestamp_assigner(EventTimestamp())
    (
        env.from_source(W5Source(events, directory), strategy, "events")
        .key_by(lambda r: r[0])
        .window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .reduce(sum_values)
        .name("window sum")
        .sink_to(ResultCheckSink(events, directory))
    )
    client, wall = run(env, "W5 keyed tumbling event-time window")
    return w5_run_figures(events, work_dir, client, wall, args.checkpoint_interval_ms > 0)


def w5_run_figures(
    events: W5Events, work_dir: Path, client: JobClient, wall: float, checkpoints: bool
) -> dict[str, Any]:
    """W5's (and W5v's) figures from the notes of the run's sources, sinks and watermark
    generators in ``work_dir``; raises if the results are not exact."""
    passes = [json.loads(p.read_text()) for p in sorted(work_dir.glob("passes-*.json"))]
    checks = [json.loads(p.read_text()) for p in sorted(work_dir.glob("results-*.json"))]
    figures = w5_figures(events, passes, checks)
    emitted: list[dict[str, Any]] = []
    for path in sorted(work_dir.glob("emitted-*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        emitted.append({"passed": {str(w): t for w, t in lines}})
    emitted_latency = latency_figures(watermark_passed_at(events, emitted), checks)
    return {
        **figures,
        "task_cpu_us_per_record": task_cpu_s(passes, checks) / events.records * 1e6,
        **{f"emitted_{k}": v for k, v in emitted_latency.items() if k.startswith("latency_")},
        "auto_watermark_interval_ms": W5_WATERMARK_INTERVAL_MS,
        "wall_s": wall,
        **checkpoint_figures(client, checkpoints),
    }


# ------------------------------------------------------------------ w5v: W5 on the batch path


class W5BatchReader(W5Reader):
    """W5's events as Arrow batches (columns ``key``, ``value``, ``ts``): the records
    ``W5Events.records_of`` gives, with the same notes, computed for a whole poll by copying
    a precomputed period. A source subtask reads records ``i = r * p + s`` (``r`` its
    position); ``i % keys`` and ``i``'s place in its 100 ms block repeat every ``period``
    positions, over which the timestamps advance by a whole number of blocks: a poll is
    a dozen slices of the period's keys and timestamps (the latter shifted), not several
    divisions per row (24 ns a row before, a few now)."""

    def __init__(self, events: W5Events, path: Path) -> None:
        super().__init__(events, path)
        p, block, keys = events.parallelism, events.block, events.keys
        self._period = math.lcm(block // math.gcd(block, p), keys // math.gcd(keys, p))
        #: Timestamps advance this much (ms) per period: its records span whole blocks.
        self._shift = self._period * p // block * (block * WINDOW_MS // events.per_event_second)
        self._patterns: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _pattern(self, split: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and timestamps (from ``BASE_MS``) of positions ``0..period-1`` of ``split``."""
        pattern = self._patterns.get(split)
        if pattern is None:
            events = self.events
            i = np.arange(self._period, dtype=np.int64) * events.parallelism + split
            j = i % events.block
            dealt = j * 7919 % events.block * WINDOW_MS // events.per_event_second  # w5_events.DEAL
            ts = (i - j) * WINDOW_MS // events.per_event_second + dealt
            pattern = self._patterns[split] = (i % events.keys, ts)
        return pattern

    def records_of(self, indexes: range) -> pa.RecordBatch:
        p = self.events.parallelism
        n = len(indexes)
        split, first = indexes.start % p, indexes.start // p
        keys, stamps = self._pattern(split)
        key = np.empty(n, dtype=np.int64)
        ts = np.empty(n, dtype=np.int64)
        period, done = self._period, 0
        while done < n:
            number, at = divmod(first + done, period)
            take = min(period - at, n - done)
            key[done : done + take] = keys[at : at + take]
            np.add(stamps[at : at + take], BASE_MS + number * self._shift, out=ts[done : done + take])
            done += take
        value = np.arange(indexes.start, indexes.stop, indexes.step, dtype=np.int64)
        return pa.RecordBatch.from_arrays(
            [pa.array(key), pa.array(value), pa.array(ts)], ["key", "value", "ts"]
        )


class W5BatchSource(W5Source):
    """:class:`W5Source` reading Arrow batches (a batch source: ``columnar``)."""

    columnar = True

    def create_reader(self, context: SourceReaderContext) -> W5BatchReader:
        path = Path(self.directory) / f"passes-{context.subtask_index}-{context.attempt_number}.json"
        return W5BatchReader(self.events, path)


class _BatchResultWriter(_ResultWriter):
    """:class:`ResultCheck` for a batch of window results (``key``, ``window_start``,
    ``value``), in numpy: the same counts, wrong sums and arrival times per window."""

    def write_batch(self, elements: Any) -> None:
        now_ms = int(time.time() * 1000)
        check, events = self.check, self.check.events
        keys = elements.column("key").to_numpy()
        totals = elements.column("value").to_numpy()
        windows = (elements.column("window_start").to_numpy() - BASE_MS) // WINDOW_MS
        for window in np.unique(windows).tolist():
            mask = windows == window
            if not 0 <= window < events.windows:
                check.outside += int(mask.sum())
                continue
            key, total = keys[mask], totals[mask]
            check.count += len(key)
            valid = (key >= 0) & (key < events.keys)
            check.wrong += int((~valid).sum())
            key, total = key[valid], total[valid]
            seen = check.seen.get(window)
            if seen is None:
                seen = check.seen[window] = bytearray(events.keys)
            counts = np.frombuffer(seen, dtype=np.uint8)
            np.add.at(counts, key, 1)  # the byte wraps only past 255 results for one key and window
            count = events.per_key_and_window
            expected = (
                count * (window * events.per_event_second + key) + events.keys * count * (count - 1) // 2
            )
            check.wrong += int((total != expected).sum())
            for source, n in enumerate(np.bincount(key % events.parallelism, minlength=events.parallelism)):
                if n:
                    arrivals = check.arrivals.setdefault((window, source), Counter())
                    arrivals[now_ms] += int(n)


class BatchResultCheckSink(ResultCheckSink):
    """:class:`ResultCheckSink` for a batch stream (``columnar``: whole record batches)."""

    columnar = True

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        path = Path(self.directory) / f"results-{context.subtask_index}-{context.attempt_number}.json"
        return _BatchResultWriter(self.events, path)


def w5v_job(env: StreamExecutionEnvironment, events: W5Events, directory: str) -> None:
    """W5v's job (also profiled by ``python -m bench.profile``)."""
    strategy = NotedBoundedOutOfOrderness(events, directory).with_timestamp_column("ts")
    (
        env.from_source(W5BatchSource(events, directory), strategy, "events")
        .key_by("key")
        .window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .sum("value")
        .name("window sum")
        .sink_to(BatchResultCheckSink(events, directory))
    )


def w5v(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """W5 on the batch path: the same events as Arrow batches from a batch source whose
    strategy names the ``ts`` column, ``key_by("key")``, a 1 s tumbling event-time window,
    ``sum("value")``, and the same exact check of every (key, window), vectorised."""
    events = W5Events(args.records, args.keys, args.per_event_second, args.parallelism)
    env = environment(args, work_dir)
    env.configure({"pipeline.auto-watermark-interval": W5_WATERMARK_INTERVAL_MS})
    w5v_job(env, events, str(work_dir))
    client, wall = run(env, "W5v keyed tumbling event-time window, batch path")
    return {
        **w5_run_figures(events, work_dir, client, wall, args.checkpoint_interval_ms > 0),
        "arrow_batch_size": env.get_configuration().get(NetworkOptions.ARROW_BATCH_SIZE),
    }


# ------------------------------------------------------------------ w6


class W6Reader(NumberSequenceReader):
    """W6's source subtask: the ints of its split, paced to its share of the source rate on
    a schedule that never forgives what the pipeline held back (``w6_records``): behind
    schedule, it hands out full batches. Its notes are written when its input ends."""

    idle_wait_s = 0.002

    def __init__(self, plan: W6Plan, path: Path) -> None:
        super().__init__()
        self.pacer = plan.source_pacer(time.monotonic)
        self.notes = Notes()
        self.path = path

    def poll_next(self, max_records: int) -> list[int] | None:
        due = self.pacer.due(self.notes.count, max_records)
        if not due:
            return []
        batch = super().poll_next(due)
        if batch:
            self.notes.observe(len(batch), time.time())
        elif batch is None and not self.path.exists():
            self.notes.behind_s = self.pacer.behind_s(self.notes.count)
            self.path.write_text(json.dumps(self.notes.to_json()))
        return batch


class W6Source(NumberSequenceSource):
    """``0..records-1`` in ``parallelism`` contiguous splits, paced (:class:`W6Reader`)."""

    def __init__(self, plan: W6Plan, directory: str) -> None:
        super().__init__(0, plan.records - 1)
        self.plan = plan
        self.directory = directory

    def create_reader(self, context: SourceReaderContext) -> W6Reader:
        path = Path(self.directory) / f"source-{context.subtask_index}-{context.attempt_number}.json"
        return W6Reader(self.plan, path)


class _ThrottledWriter(SinkWriter):
    """Discards records, holding its share of the sink rate: after each batch it sleeps
    until that many records are due (chandy hands a sink whole batches)."""

    def __init__(self, plan: W6Plan, path: Path) -> None:
        self.pacer = plan.sink_pacer(time.monotonic)
        self.notes = Notes()
        self.path = path

    def write(self, element: Any) -> None:
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        self.pacer.start()
        self.notes.observe(len(elements), time.time())
        wait = self.pacer.wait_s(self.notes.count)
        if wait > 0:
            time.sleep(wait)

    def flush(self, end_of_input: bool) -> None:
        if end_of_input:
            self.path.write_text(json.dumps(self.notes.to_json()))

    def close(self) -> None:
        pass


class ThrottledSink(Sink):
    def __init__(self, plan: W6Plan, directory: str) -> None:
        self.plan = plan
        self.directory = directory

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        path = Path(self.directory) / f"sink-{context.subtask_index}-{context.attempt_number}.json"
        return _ThrottledWriter(self.plan, path)


def w6_checkpoints(client: JobClient) -> list[dict[str, Any]]:
    """Every completed checkpoint from the job's statistics (Flink's REST names: a history
    entry's ``checkpoint_type`` or ``is_unaligned``, and ``persisted_data``)."""
    history = client.get_checkpoint_statistics()["history"]
    return [
        {
            "id": c["id"],
            "trigger_ms": c["trigger_timestamp"],
            "duration_ms": c["end_to_end_duration"],
            "unaligned": unaligned_of(c),
            "persisted_bytes": c.get("persisted_data"),
        }
        for c in reversed(history)
        if c["status"] == "COMPLETED" and not c.get("is_savepoint")
    ]


def w6(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Checkpoints under backpressure (``w6_records``): W1's keyed running sum between a
    source paced to ``--rate`` and a sink holding half of it, for ``--duration-s``."""
    if args.checkpoint_interval_ms <= 0:
        raise ValueError("w6 measures checkpoints: give --checkpoint-interval-ms > 0")
    plan = W6Plan(args.rate, args.duration_s, args.parallelism, args.keys)
    env = environment(args, work_dir)
    (
        env.from_source(W6Source(plan, str(work_dir)), source_name="paced numbers")
        .key_by(lambda i, keys=args.keys: i % keys)
        .process(RunningSum())
        .name("running sum")
        .sink_to(ThrottledSink(plan, str(work_dir)))
    )
    client, wall = run(env, "W6 checkpoints under backpressure")
    config = env.get_configuration()
    sources = [json.loads(p.read_text()) for p in sorted(work_dir.glob("source-*.json"))]
    sinks = [json.loads(p.read_text()) for p in sorted(work_dir.glob("sink-*.json"))]
    return {
        **w6_figures(plan, sources, sinks, w6_checkpoints(client)),
        "unaligned_enabled": config.get(CheckpointingOptions.UNALIGNED),
        "aligned_checkpoint_timeout_ms": config.get(CheckpointingOptions.ALIGNED_CHECKPOINT_TIMEOUT),
        "buffers_per_channel": config.get(NetworkOptions.BUFFERS_PER_CHANNEL),
        "batch_size": config.get(NetworkOptions.BATCH_SIZE),
        "wall_s": wall,
    }


# ------------------------------------------------------------------ main


WORKLOADS = {
    "w1": w1,
    "w1v": w1v,
    "w2": w2,
    "w3": w3,
    "w3v": w3v,
    "w4": w4,
    "w4r": w4r,
    "w5": w5,
    "w5v": w5v,
    "w6": w6,
}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.systems.chandy_runner")
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--work-dir", required=True, type=Path)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument(
        "--update-fraction", type=float, default=0.01, help="w4r: keys updated per second (a fraction)"
    )
    parser.add_argument("--update-s", type=float, default=20.0, help="w4r: seconds of updates")
    parser.add_argument(
        "--per-event-second", type=int, default=100_000, help="w5, w5v: records per second of event time"
    )
    parser.add_argument(
        "--mode",
        choices=sorted(EXECUTORS),
        default="spark",
        help="the executor (default spark); rocksdb: the Spark executor with the RocksDB state backend; "
        "unaligned: the Spark executor with unaligned checkpoints",
    )
    parser.add_argument(
        "--buffers-per-channel",
        type=int,
        default=None,
        help="taskmanager.network.memory.buffers-per-channel (credits per input channel; default chandy's)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="chandy.network.batch-size (records per batch)"
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="execution.checkpointing.dir: a path or URI, s3://bucket/ck (default <work-dir>/checkpoints)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a configuration key of the job (again for more), e.g. s3.endpoint=http://127.0.0.1:8333",
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "system": "chandy",
        "variant": f"{EXECUTORS[args.mode]} executor"
        + (", RocksDB state backend" if on_rocksdb(args) else "")
        + (", unaligned checkpoints" if args.mode == "unaligned" else ""),
        "workload": args.workload,
    }
    try:
        result.update(WORKLOADS[args.workload](args, args.work_dir))
        result["ok"] = True
    except Exception as exc:  # reported in the JSON, as the protocol says
        log.exception("chandy %s failed", args.workload)
        result.update(ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}")
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
