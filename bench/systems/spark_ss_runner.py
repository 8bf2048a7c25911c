"""Spark Structured Streaming's runner: ``python spark_ss_runner.py <w1|w2|w3|w4> --work-dir DIR``.

Follows the runner protocol of :mod:`bench.systems` (standalone: the standard library,
PySpark, pandas and pyarrow; nothing from chandy or ``bench``). ``--mode`` picks the Spark
API that keeps the keyed state:

* ``groupby`` (default): ``groupBy(key).agg(sum(value))`` in update output mode, Spark's
  built-in aggregation in the JVM, which is what most Spark users write. No Python runs
  per record (w2 adds one pandas UDF, the only way to inject the failure).
* ``pandas_state``: ``applyInPandasWithState``, the Python keyed-state API (a function per
  key and micro-batch, state as a tuple in the JVM state store).
* ``twsip``: ``transformWithStateInPandas`` (Spark 4), a ``StatefulProcessor`` with a
  ``ValueState``; it needs the RocksDB state store and the ``protobuf`` package.

How Spark maps onto the protocol (the README should say so):

* A micro-batch is Spark's unit of processing *and* of commit: every batch writes the
  offset log (``walCommit``), commits the state store (a delta file, or RocksDB files)
  and writes the commit log (``commitOffsets``). Checkpoints cannot be turned off;
  ``--checkpoint-interval-ms`` is the processing-time trigger (the least time between
  batch starts) and ``0`` runs batches back to back. The figures say
  ``"checkpoints_can_be_disabled": false``.
* w1, w2 and w4 read the built-in ``rate-micro-batch`` source: ``rowsPerBatch`` ints per
  batch, values ``0, 1, 2, ...`` generated in the JVM (the fastest source Spark has, and
  deterministic, so a restarted batch re-reads the same rows). ``rowsPerBatch``
  (``--rows-per-batch``) plays the part of Kafka's ``maxOffsetsPerTrigger``: it, not the
  trigger, decides how many rows each commit covers once a batch takes longer than the
  trigger interval. The source is unbounded; ``value < records`` filters the rows of the
  last batch past the end, and the runner stops the query once a batch has read past
  ``records``. w4 runs ``trigger(availableNow=True)``: one batch of every record.
* The checkpoint figures come from ``query.recentProgress``, one per batch that read
  rows: ``checkpoint_*_ms`` = ``walCommit`` + ``commitOffsets`` + the state operators'
  ``commitTimeMs`` (a task metric summed over the state partitions, which commit in
  parallel); ``batch_*_ms`` = ``triggerExecution`` (the whole batch);
  ``checkpoints_completed`` = batches. Every progress event is kept in
  ``<work-dir>/progress.jsonl``.
* The protocol measures from cold; Spark's first batch costs seconds (class loading, JIT,
  code generation, Python workers starting), so ``--warm-up-batches`` can run the keyed
  sum in a scratch query first, and w1 and w3 also report figures without the start.
* w3 reads Spark's ``socket`` source, fed by a thread of this runner that writes record
  ``i`` when it is due (``i / rate`` s after Spark connected) and notes ``time.time()``
  then, its stamp; a trigger reads every line that has arrived, as from a message queue,
  with no Python in the read path. Spark's ``rate`` source is second-granular (a trigger
  only sees whole elapsed seconds), which adds about half a second to every latency;
  ``--w3-source rate`` measures that for comparison.
* Spark emits per micro-batch, not per record. ``groupby`` in update mode emits each
  changed key's new sum once per batch; the Python modes emit a running sum per record.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

# At module level, not in the functions: pandas_udf reads its function's type hints, and
# with postponed annotations "pd.Series" resolves in the module's globals.
import pandas as pd
from w4r_records import STRIDE, Phases, W4rRecords
from w4r_records import figures as w4r_figures
from w5_events import (
    BASE_MS,
    DEAL,
    OUT_OF_ORDERNESS_MS,
    W5Events,
    latency_figures,
)

log = logging.getLogger("bench.spark_ss")

MODES = ("groupby", "pandas_state", "twsip")
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
# Rows per micro-batch when --rows-per-batch is not given. A batch must take longer than
# the 1000 ms trigger, or Spark waits for the trigger and W1 measures the batch size,
# not Spark: a warm groupBy reads 1 M rows in 0.35-1 s on the 2-core reference machine,
# depending on how busy the machine is (12 M in 0.9 s when quiet: it aggregates within
# each partition before the shuffle), so its W1 batches hold 12 M rows (a commit every
# 1-4 s, which favours Spark). The Python modes take seconds for 1 M rows.
DEFAULT_ROWS_PER_BATCH = 1_000_000
W1_ROWS_PER_BATCH = {"groupby": 12_000_000}
# W5's batches: see w5 (chosen so that a batch outlasts the 1 s trigger).
W5_ROWS_PER_BATCH = 2_000_000


#: w4r: how often Spark's maintenance task runs (default 60 s). With changelog checkpointing
#: it uploads the snapshots a commit leaves behind (one per ``minDeltasForSnapshot`` = 10
#: batches): at 10 s a W4r update phase of tens of seconds sees them, and the bytes a
#: checkpoint uploads include Spark's snapshots, not only its changelogs.
W4R_MAINTENANCE_INTERVAL = "10s"


# ------------------------------------------------------------------ session and queries


def make_session(args: argparse.Namespace, work_dir: Path) -> Any:
    """A local session with one core per subtask, bound to 127.0.0.1, UI off."""
    # The Python workers must be this interpreter (the venv with pandas and pyarrow), not
    # whatever ``python3`` is on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the host name may not resolve
    from pyspark.sql import SparkSession

    provider = ROCKSDB if state_store(args) == "rocksdb" else HDFS
    builder = (
        SparkSession.builder.master(f"local[{args.parallelism}]")
        .appName(f"bench spark_ss {args.workload} {args.mode}")
        .config("spark.sql.shuffle.partitions", str(args.parallelism))
        .config("spark.default.parallelism", str(args.parallelism))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.local.dir", str(work_dir / "spark-local"))
        .config("spark.sql.warehouse.dir", str(work_dir / "spark-warehouse"))
        .config("spark.sql.streaming.stateStore.providerClass", provider)
        # Keep every batch's progress: the figures are computed from all of them.
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000000")
    )
    if args.workload == "w4r":
        # RocksDB's changelog checkpointing: a commit uploads the batch's changes, and a
        # maintenance thread uploads a snapshot now and then (Spark's incremental checkpoint).
        builder = builder.config(
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true"
        ).config("spark.sql.streaming.stateStore.maintenanceInterval", W4R_MAINTENANCE_INTERVAL)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    log.info(
        "Spark %s, local[%d], state store %s", spark.version, args.parallelism, provider.rsplit(".", 1)[-1]
    )
    return spark


def state_store(args: argparse.Namespace) -> str:
    """``twsip`` and w4r (W4 on RocksDB) only run on RocksDB; the others use Spark's
    default unless told."""
    if args.mode == "twsip" or args.workload == "w4r" or args.state_store == "rocksdb":
        return "rocksdb"
    return "hdfs"


def trigger_of(args: argparse.Namespace) -> dict[str, str]:
    """The processing-time trigger; 0 means back-to-back batches (Spark has no 'off')."""
    return {"processingTime": f"{max(0, args.checkpoint_interval_ms)} milliseconds"}


def counting_source(
    spark: Any, args: argparse.Namespace, rows_per_batch: int, records: int | None = None
) -> Any:
    """``value`` = 0, 1, 2, ... (``records`` of them), ``rows_per_batch`` per micro-batch."""
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", args.parallelism)
        .load()
        .where(F.col("value") < (args.records if records is None else records))
        .select("value")
    )


def warm_up(spark: Any, args: argparse.Namespace, work_dir: Path) -> None:
    """``--warm-up-batches``: run the keyed sum for a few batches before measuring.

    Spark's first micro-batch pays for class loading, JIT compilation, code generation
    and starting the Python workers (seconds, tens of seconds on a loaded machine), which
    the protocol's figures would otherwise include (w3's first second is not enough).
    This runs the same keyed sum in a scratch query (its own checkpoint, removed after)
    so that the measured query starts warm; the time counts in ``wall_s`` only.
    """
    batches = args.warm_up_batches
    if batches <= 0:
        return
    started = time.perf_counter()
    # The Python modes pay per key and batch, so their warm-up batches are smaller.
    per_batch = max(1, min(rows_per_batch(args), 100_000 if args.mode == "groupby" else 10_000))
    result, mode = keyed_sum(counting_source(spark, args, per_batch, batches * per_batch), args)
    scratch = work_dir / "warm-up"
    query = (
        result.writeStream.format("noop")
        .outputMode(mode)
        .option("checkpointLocation", str(scratch / "checkpoint"))
        .start()
    )
    run_until(query, batches * per_batch, args.timeout_s, scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    log.info(
        "Warmed up with %d batches of %d rows in %.1f s", batches, per_batch, time.perf_counter() - started
    )


def source_offset(progress: dict[str, Any], which: str) -> Any:
    """The batch's ``startOffset`` or ``endOffset`` of its (only) source, parsed."""
    offset = progress["sources"][0].get(which)
    return json.loads(offset) if isinstance(offset, str) else offset


def as_count(offset: Any) -> int:
    """An offset as a record count: the sources here count records (or seconds)."""
    if offset is None:
        return 0
    return int(offset["offset"]) if isinstance(offset, dict) else int(offset)


def end_offset(progress: dict[str, Any]) -> int:
    """How many source records the batch has read up to (its end offset, as a count)."""
    return as_count(source_offset(progress, "endOffset"))


def start_offset(progress: dict[str, Any]) -> int:
    return as_count(source_offset(progress, "startOffset"))


def run_until(
    query: Any,
    read_past: int,
    timeout_s: float,
    work_dir: Path,
    to_records: Callable[[int], int] = lambda offset: offset,
    on_batch: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Wait until a committed batch has read ``read_past`` records, then stop the query.

    A progress event is posted after the batch committed, so when one shows the end offset
    at or past ``read_past`` every record is in the state and the sink. A failed query
    raises here (``awaitTermination`` re-raises its exception). Returns the progress of
    the batches that read rows, up to that one, in batch order; all progress events are
    appended to ``progress.jsonl`` in the work dir, for a closer look. ``on_batch`` is
    called with the id of each batch whose progress this loop sees first (w4r looks at the
    checkpoint directory then).
    """
    deadline = time.monotonic() + timeout_s
    done = None
    seen = None
    try:
        while True:
            ended = query.awaitTermination(0.02)  # True: ended by itself (availableNow)
            last = query.lastProgress
            if on_batch is not None and last is not None and last["batchId"] != seen:
                seen = last["batchId"]
                on_batch(seen)
            if (
                last is not None
                and last["numInputRows"] > 0
                and to_records(end_offset(json.loads(last.json))) >= read_past
            ):
                done = last["batchId"]
                if not ended:
                    stop_between_batches(query, last)
                break
            if ended:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the query did not read {read_past} records in {timeout_s} s")
    finally:
        progress = [json.loads(p.json) for p in query.recentProgress]
        query.stop()
        with open(work_dir / "progress.jsonl", "a") as f:
            f.writelines(json.dumps(p) + "\n" for p in progress)
    if done is None:
        raise RuntimeError(f"the query ended before reading {read_past} records")
    batches: dict[int, dict[str, Any]] = {}
    for p in progress:
        if p["numInputRows"] > 0 and "addBatch" in p["durationMs"] and p["batchId"] <= done:
            batches[p["batchId"]] = p
    return [batches[b] for b in sorted(batches)]


def stop_between_batches(query: Any, last: Any) -> None:
    """Stop the query, if it can be done soon, when no batch is running.

    The counting source is unbounded, so the trigger may already run a batch of rows past
    the end (filtered out); stopping interrupts it, and Spark then logs errors about
    cancelled jobs and interrupted threads that mean nothing. Waiting for that batch to
    end (if it does within twice the last batch's time, at most 10 s) avoids most of them.
    """
    patience = min(10.0, 2 * last["durationMs"].get("triggerExecution", 0) / 1000)
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline and query.isActive:
        status = query.status
        current = query.lastProgress
        if not status["isTriggerActive"] or current["batchId"] != last["batchId"]:
            break
        time.sleep(0.005)
    query.stop()


def epoch_s(iso: str) -> float:
    """A progress ``timestamp`` (the trigger's start, ISO 8601 UTC) as epoch seconds."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def batch_end_s(progress: dict[str, Any]) -> float:
    """When the batch ended: committed, its output written."""
    return epoch_s(progress["timestamp"]) + progress["durationMs"]["triggerExecution"] / 1000


def checkpoint_ms(progress: dict[str, Any]) -> float:
    """A batch's commit work: offset log + state store commit(s) + commit log.

    ``stateOperators[].commitTimeMs`` is a task metric summed over the state store's
    partitions (they commit in parallel, so it can exceed the wall time it took).
    """
    durations = progress["durationMs"]
    state = sum(op.get("commitTimeMs", 0) for op in progress.get("stateOperators", []))
    return durations.get("walCommit", 0) + durations.get("commitOffsets", 0) + state


def percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        raise RuntimeError("nothing measured")
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def batch_figures(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-batch commit and batch durations, as the protocol's checkpoint figures."""
    commits = sorted(checkpoint_ms(p) for p in batches)
    triggers = sorted(float(p["durationMs"]["triggerExecution"]) for p in batches)
    state_commits = sorted(
        float(sum(op.get("commitTimeMs", 0) for op in p["stateOperators"])) for p in batches
    )
    return {
        "checkpoints_completed": len(batches),
        "checkpoint_p50_ms": percentile(commits, 50),
        "checkpoint_max_ms": commits[-1],
        "state_commit_p50_ms": percentile(state_commits, 50),
        "batch_p50_ms": percentile(triggers, 50),
        "batch_max_ms": triggers[-1],
        "checkpoints_can_be_disabled": False,
    }


# ------------------------------------------------------------------ the keyed running sum


def write_once(path: Path, text: str) -> bool:
    """Create ``path`` with ``text`` unless it exists (atomic across worker processes)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


class Failure:
    """W2's injected failure, shared by every mode; markers are files in the work dir.

    ``attempt`` is the query start (0 the first, 1 the restart from the checkpoint); it is
    fixed when the query is defined, so no task of the failing attempt can mistake itself
    for the restored one. Picklable: it goes to the Python workers with the function.
    """

    def __init__(self, work_dir: Path, fail_value: int, attempt: int) -> None:
        self.work_dir = str(work_dir)
        self.fail_value = fail_value
        self.attempt = attempt

    def seen(self, values: Any) -> None:
        """Called with each chunk of values (a pandas Series) the keyed function gets."""
        if self.attempt > 0:
            first = Path(self.work_dir) / "first-after-restore"
            if not first.exists():
                write_once(first, repr(time.time()))
            return
        if bool((values == self.fail_value).any()):
            commits = Path(self.work_dir) / "checkpoint" / "commits"
            deadline = time.monotonic() + 120
            while not (commits / "0").exists():  # fail only once a batch has committed
                if time.monotonic() > deadline:
                    raise RuntimeError("W2: no batch committed before the failure point")
                time.sleep(0.005)
            if write_once(Path(self.work_dir) / "raised", repr(time.time())):
                raise RuntimeError("W2: the injected failure")


def keyed_sum(df: Any, args: argparse.Namespace, failure: Failure | None = None) -> tuple[Any, str]:
    """``(key, total)``: each key's running sum of its values, in ``args.mode``'s API.

    Returns the DataFrame and its output mode. ``groupby`` emits each changed key once per
    batch; the Python modes emit one row per record, as the protocol's keyed function does.
    """
    from pyspark.sql import functions as F

    keyed = df.select((F.col("value") % args.keys).alias("key"), F.col("value"))
    if args.mode == "groupby":
        if failure is not None:
            keyed = keyed.select("key", failure_gate(failure)(F.col("value")).alias("value"))
        return keyed.groupBy("key").agg(F.sum("value").alias("total")), "update"
    if args.mode == "pandas_state":
        return keyed.groupBy("key").applyInPandasWithState(
            running_sum_function(failure),
            outputStructType="key long, total long",
            stateStructType="total long",
            outputMode="Update",
            timeoutConf="NoTimeout",
        ), "update"
    return keyed.groupBy("key").transformWithStateInPandas(
        statefulProcessor=running_sum_processor(failure),
        outputStructType="key long, total long",
        outputMode="Update",
        timeMode="None",
    ), "update"


def failure_gate(failure: Failure) -> Any:
    """For ``groupby``: a pandas UDF passing values through, raising at the failure point.

    Spark's aggregation runs in the JVM, so the failure has to come from Python code put
    in front of it; the UDF costs a Python round trip per Arrow batch of values.
    """
    from pyspark.sql.functions import pandas_udf

    def gate(values: pd.Series) -> pd.Series:
        failure.seen(values)
        return values

    return pandas_udf(gate, "long")  # type: ignore[call-overload]


def running_sums(
    chunks: Iterator[pd.DataFrame], total: int, failure: Failure | None
) -> tuple[list[pd.DataFrame], int]:
    """Both Python stateful APIs: the running sum of every record, from the key's
    ``total`` so far; the output frames and the new total."""
    out = []
    for chunk in chunks:
        values = chunk["value"]
        if failure is not None:
            failure.seen(values)
        sums = values.cumsum() + total
        total = int(sums.iat[-1])
        out.append(pd.DataFrame({"key": chunk["key"], "total": sums}))
    return out, total


def running_sum_function(failure: Failure | None) -> Callable[..., Iterator[Any]]:
    """``applyInPandasWithState``'s function: a running sum per record, state = the sum."""

    def running_sum(
        key: tuple[Any, ...], chunks: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        out, total = running_sums(chunks, state.get[0] if state.exists else 0, failure)
        state.update((total,))
        yield from out

    return running_sum


def running_sum_processor(failure: Failure | None) -> Any:
    """``transformWithStateInPandas``'s processor: the same running sum in a ValueState."""
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

    class RunningSum(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.total = handle.getValueState("total", "total long")

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            current = self.total.get()
            out, total = running_sums(rows, int(current[0]) if current is not None else 0, failure)
            self.total.update((total,))
            yield from out

        def close(self) -> None:
            pass

    return RunningSum()


def check_mode_available(args: argparse.Namespace) -> None:
    """Fail early, with the reason, when this PySpark cannot run ``--mode twsip``."""
    if args.mode != "twsip":
        return
    from pyspark.sql import GroupedData

    if not hasattr(GroupedData, "transformWithStateInPandas"):
        import pyspark

        raise NotImplementedError(
            f"PySpark {pyspark.__version__} has no transformWithStateInPandas (Spark 4.0+)"
        )
    try:
        import google.protobuf  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "transformWithStateInPandas needs the 'protobuf' package (its "
            "state API talks protobuf to the JVM); install protobuf>=6.33.5,<7 "
            "in the spark_ss environment"
        ) from exc


def rows_per_batch(args: argparse.Namespace, default: int = DEFAULT_ROWS_PER_BATCH) -> int:
    """``--rows-per-batch``, or ``default``: the batch size decides the commit frequency."""
    return args.rows_per_batch or default


# ------------------------------------------------------------------ w1


def w1(spark: Any, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Throughput: ``records`` ints through the keyed sum into Spark's ``noop`` sink.

    ``records_per_s`` counts from the end of the first batch (when the first records
    reach the sink) to the end of the last, over the records of the batches after the
    first, so the first batch's query planning, code generation and Python worker start
    stay out, as the protocol leaves start-up out. ``records_per_s_incl_first_batch``
    counts every record from the start of the first batch. With one batch only the
    latter exists, and ``records_per_s`` is that.
    """
    started = time.perf_counter()
    per_batch = min(
        rows_per_batch(args, W1_ROWS_PER_BATCH.get(args.mode, DEFAULT_ROWS_PER_BATCH)), args.records
    )
    result, mode = keyed_sum(counting_source(spark, args, per_batch), args)
    query = (
        result.writeStream.format("noop")
        .outputMode(mode)
        .option("checkpointLocation", str(work_dir / "checkpoint"))
        .trigger(**trigger_of(args))
        .start()
    )
    batches = run_until(query, args.records, args.timeout_s, work_dir)
    wall = time.perf_counter() - started
    first_start, first_end = epoch_s(batches[0]["timestamp"]), batch_end_s(batches[0])
    last_end = batch_end_s(batches[-1])
    incl_first = args.records / (last_end - first_start)
    if len(batches) > 1:
        span = last_end - first_end
        steady = (args.records - end_offset(batches[0])) / span
    else:
        span, steady = last_end - first_start, incl_first
    return {
        "records": args.records,
        "records_per_s": steady,
        "first_to_last_s": span,
        "records_per_s_incl_first_batch": incl_first,
        "first_batch_ms": batches[0]["durationMs"]["triggerExecution"],
        "rows_per_batch": per_batch,
        "query_s": wall,
        "batches_shorter_than_the_trigger": sum(
            1 for b in batches[1:] if float(b["durationMs"]["triggerExecution"]) < args.checkpoint_interval_ms
        ),
        **batch_figures(batches),
    }


# ------------------------------------------------------------------ w2


def expected_sum(key: int, records: int, keys: int) -> int:
    """``sum(i for i in range(records) if i % keys == key)`` in closed form."""
    count = max(0, math.ceil((records - key) / keys))
    return count * key + keys * count * (count - 1) // 2


def last_sums_sink(directory: Path) -> Callable[[Any, int], None]:
    """A foreachBatch sink keeping each batch's last sum per key in ``batch-<id>.json``.

    Idempotent per batch id (a replayed batch overwrites its file, atomically), which with
    Spark's replay of the uncommitted batch gives exactly-once output.
    """
    directory.mkdir(parents=True, exist_ok=True)

    def write(df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        rows = df.groupBy("key").agg(F.max("total").alias("total")).collect()
        part = directory / f".batch-{batch_id:08d}.tmp"
        part.write_text(json.dumps({int(r["key"]): int(r["total"]) for r in rows}))
        os.replace(part, directory / f"batch-{batch_id:08d}.json")

    return write


def w2(spark: Any, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Exactly-once: fail once at record N // 2, restart the query from its checkpoint.

    Spark's recovery is a restart of the query from the same ``checkpointLocation``: it
    reloads the last committed state version and re-runs the uncommitted batch with the
    same offsets. Local mode does not retry failed tasks (``local[n]`` allows one attempt),
    so the raised exception fails the query, which the runner restarts, as a supervisor
    would. The batch size is capped at N // 4 so that the failure falls in a batch after
    the first committed one.
    """
    if args.checkpoint_interval_ms < 0:
        raise ValueError("w2 needs a trigger interval >= 0")
    started = time.perf_counter()
    per_batch = max(1, min(rows_per_batch(args), args.records // 4))
    sums_dir = work_dir / "sums"
    errors = []
    for attempt in range(2):
        failure = Failure(work_dir, args.records // 2, attempt)
        result, mode = keyed_sum(counting_source(spark, args, per_batch), args, failure)
        query = (
            result.writeStream.foreachBatch(last_sums_sink(sums_dir))
            .outputMode(mode)
            .option("checkpointLocation", str(work_dir / "checkpoint"))
            .trigger(**trigger_of(args))
            .start()
        )
        try:
            run_until(query, args.records, args.timeout_s, work_dir)
            break
        except Exception as exc:
            if attempt > 0 or not (work_dir / "raised").exists():
                raise
            errors.append(f"{type(exc).__name__}")
            log.info(
                "The query failed as injected (%s); restarting it from the checkpoint", type(exc).__name__
            )
    wall = time.perf_counter() - started
    if not errors:
        raise RuntimeError("the injected failure did not fail the query")
    last: dict[int, int] = {}
    for part in sorted(sums_dir.glob("batch-*.json")):
        last.update({int(k): v for k, v in json.loads(part.read_text()).items()})
    wrong = sum(
        1
        for key in range(min(args.keys, args.records))
        if last.get(key) != expected_sum(key, args.records, args.keys)
    )
    wrong += sum(1 for key in last if not 0 <= key < min(args.keys, args.records))
    raised = float((work_dir / "raised").read_text())
    first = float((work_dir / "first-after-restore").read_text())
    return {
        "records": args.records,
        "exact": wrong == 0,
        "wrong_keys": wrong,
        "recovery_s": first - raised,
        "rows_per_batch": per_batch,
        "query_s": wall,
        "failure_in": "pandas UDF before the aggregation"
        if args.mode == "groupby"
        else "the keyed state function",
    }


# ------------------------------------------------------------------ w3


class LineFeeder(threading.Thread):
    """W3's source: writes ``total`` lines ``"<i>"`` at ``rate`` per second to Spark's
    ``socket`` source, noting ``time.time()`` when each was sent (its stamp).

    Spark's socket source connects to this server when the query starts and a JVM thread
    appends every line it receives to a buffer; each trigger takes what has arrived since
    the last one, as from a message queue, with no Python in the read path. Stamps stay
    here, by line number (the source's offsets count lines), since Spark's ``groupBy``
    aggregation cannot carry a stamp per record to the sink.
    """

    def __init__(self, rate: float, total: int) -> None:
        super().__init__(name="w3-line-feeder", daemon=True)
        self.rate, self.total = rate, total
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.stamps: list[float] = []
        self.stopped = threading.Event()
        self.error: OSError | None = None

    def run(self) -> None:
        try:
            self.server.settimeout(600)
            conn, _ = self.server.accept()
            with conn:
                t0, sent = time.time(), 0
                while sent < self.total and not self.stopped.is_set():
                    due = min(self.total, int((time.time() - t0) * self.rate) + 1)
                    if due > sent:
                        now = time.time()
                        conn.sendall(b"".join(b"%d\n" % i for i in range(sent, due)))
                        self.stamps.extend([now] * (due - sent))
                        sent = due
                    else:
                        time.sleep(0.0005)
                self.stopped.wait()  # closing early would only make Spark log a warning
        except OSError as exc:  # a socket error or time-out; reported by the runner
            self.error = exc
        finally:
            self.server.close()


def w3(spark: Any, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Latency: ``rate`` records/s for ``duration_s`` through the keyed sum.

    The sink is a ``foreachBatch`` that writes the batch's output (Spark's ``noop`` writer,
    which runs the stateful operator) and notes the wall-clock time it was done. Every
    record of batch ``b`` reached the sink then, so its latency is that time minus the
    record's stamp, found by the batch's offset range. The records of the first second
    are dropped, as the protocol says.

    Spark's first micro-batch is slow (class loading, code generation, Python workers
    starting: seconds, more on a loaded machine), and the records that arrive meanwhile
    wait for it, which dropping the first second does not cover: ``--warm-up-batches``
    starts the measured query warm, and ``latency_*_second_half`` only count the records
    stamped in the second half of the run.

    ``--w3-source rate`` uses Spark's ``rate`` source instead: its offsets are whole
    seconds since its start, so a record only becomes readable once the second it is
    stamped in is over, which adds about half a second to every latency (the stamp is the
    source's ``timestamp``, ``start + i / rate``).
    """
    from pyspark.sql import functions as F

    started = time.perf_counter()
    total = int(args.rate * args.duration_s)
    feeder = None
    if args.w3_source == "rate":
        if args.rate != int(args.rate):
            raise ValueError("the rate source needs a whole number of rows per second")
        source = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", int(args.rate))
            .option("numPartitions", args.parallelism)
            .load()
            .select("value")
        )
    else:
        feeder = LineFeeder(args.rate, total)
        feeder.start()
        source = (
            spark.readStream.format("socket")
            .option("host", "127.0.0.1")
            .option("port", feeder.port)
            .load()
            .select(F.col("value").cast("long").alias("value"))
        )
    result, mode = keyed_sum(source.where(F.col("value") < total), args)
    sink_times: dict[int, float] = {}

    def sink(df: Any, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()
        sink_times[batch_id] = time.time()

    query = (
        result.writeStream.foreachBatch(sink)
        .outputMode(mode)
        .option("checkpointLocation", str(work_dir / "checkpoint"))
        .trigger(**trigger_of(args))
        .start()
    )
    try:
        if feeder is None:
            # The rate source counts whole seconds since its start, which it logs first.
            start = rate_source_start(work_dir / "checkpoint", query)
            per_s = int(args.rate)
            batches = run_until(
                query,
                total,
                args.duration_s + args.timeout_s,
                work_dir,
                to_records=lambda seconds: seconds * per_s,
            )
            ranges = [(start_offset(p) * per_s, end_offset(p) * per_s) for p in batches]
            stamps = [start + i / args.rate for i in range(total)]
        else:
            # Socket offsets are the last line's number (-1 before any).
            batches = run_until(
                query, total, args.duration_s + args.timeout_s, work_dir, to_records=lambda offset: offset + 1
            )
            ranges = [(start_offset_or(p, -1) + 1, end_offset(p) + 1) for p in batches]
            stamps = feeder.stamps
    finally:
        if feeder is not None:
            feeder.stopped.set()
    if feeder is not None and feeder.error is not None:
        raise RuntimeError(f"the line feeder failed: {feeder.error!r}")
    query_s = time.perf_counter() - started
    latencies, second_half = [], []
    warm_up_until, half_from = stamps[0] + 1.0, stamps[total // 2]
    for p, (first, end) in zip(batches, ranges, strict=True):
        done = sink_times[p["batchId"]]
        for i in range(first, min(end, total)):
            if stamps[i] >= warm_up_until:
                latencies.append((done - stamps[i]) * 1000)
                if stamps[i] >= half_from:
                    second_half.append(latencies[-1])
    latencies.sort()
    second_half.sort()
    return {
        "records": len(latencies),
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p99_ms": percentile(latencies, 99),
        "latency_max_ms": latencies[-1],
        "latency_p50_ms_second_half": percentile(second_half, 50),
        "latency_p99_ms_second_half": percentile(second_half, 99),
        "first_batch_ms": batches[0]["durationMs"]["triggerExecution"],
        "source": args.w3_source,
        "query_s": query_s,
        **batch_figures(batches),
    }


def start_offset_or(progress: dict[str, Any], initial: int) -> int:
    """The start offset as a number, ``initial`` for the first batch (it has none)."""
    offset = source_offset(progress, "startOffset")
    return initial if offset is None else as_count(offset)


def rate_source_start(checkpoint: Path, query: Any) -> float:
    """The rate source's start time (epoch s), from the metadata it writes first."""
    path = checkpoint / "sources" / "0" / "0"
    deadline = time.monotonic() + 600
    while not path.exists():
        if not query.isActive or time.monotonic() > deadline:
            query.awaitTermination(0)
            raise RuntimeError("the rate source did not log its start time")
        time.sleep(0.01)
    time.sleep(0.05)  # written through a temporary file and a rename, but be safe
    return int(path.read_text().split("\n")[1].strip()) / 1000


# ------------------------------------------------------------------ w4


def w4(spark: Any, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """State size: ``records`` distinct keys with ``value_bytes``-byte values, one batch.

    The query runs with ``trigger(availableNow=True)``, with which ``rate-micro-batch``
    reads exactly one batch of ``rowsPerBatch`` = ``records`` rows and the query ends: the
    commit of that batch is the first (and only) checkpoint, and it covers every record
    (the trigger interval plays no part here). ``checkpoint_size_bytes`` is what the
    checkpoint's ``state`` directory then holds on disk, Hadoop's ``.crc`` files included:
    for the default store the version's delta files, LZ4-compressed (the value is the
    key's 8 bytes then ``v`` filler, as in the other runners, so it compresses well); for
    RocksDB its SST files and the version's zip. ``checkpoint_duration_ms`` is the batch's
    commit work as in w1; the default store writes its delta file while the batch updates
    the state, so most of the writing is in ``state_update_ms``, not in the commit.
    """
    from pyspark.sql import functions as F

    started = time.perf_counter()
    filler = b"v" * max(0, args.value_bytes - 8)
    source = counting_source(spark, args, args.records)
    keyed = source.select(
        F.col("value").alias("key"),
        F.concat(F.unhex(F.lpad(F.hex("value"), 16, "0")), F.lit(filler)).alias("payload"),
    )
    if args.mode == "groupby":
        result = keyed.groupBy("key").agg(F.max("payload").alias("payload"))
    elif args.mode == "pandas_state":
        result = keyed.groupBy("key").applyInPandasWithState(
            store_value_function(),
            outputStructType="key long",
            stateStructType="payload binary",
            outputMode="Update",
            timeoutConf="NoTimeout",
        )
    else:
        result = keyed.groupBy("key").transformWithStateInPandas(
            statefulProcessor=store_value_processor(),
            outputStructType="key long",
            outputMode="Update",
            timeMode="None",
        )
    checkpoint = work_dir / "checkpoint"
    # availableNow: rate-micro-batch then reads one batch of rowsPerBatch rows and the query
    # ends, so the checkpoint holds that batch's state version and nothing after it.
    query = (
        result.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    batches = run_until(query, args.records, args.timeout_s, work_dir)
    wall = time.perf_counter() - started
    batch = batches[0]
    operators = batch["stateOperators"]
    return {
        "keys": args.records,
        "value_bytes": args.value_bytes,
        "checkpoint_duration_ms": checkpoint_ms(batch),
        "checkpoint_size_bytes": directory_bytes(checkpoint / "state"),
        "state_commit_ms": sum(op.get("commitTimeMs", 0) for op in operators),
        "state_update_ms": sum(op.get("allUpdatesTimeMs", 0) for op in operators),
        "state_memory_bytes": sum(op.get("memoryUsedBytes", 0) for op in operators),
        "state_rows": sum(op.get("numRowsTotal", 0) for op in operators),
        "batch_ms": batch["durationMs"]["triggerExecution"],
        "state_store": state_store(args),
        "query_s": wall,
    }


def store_value_function() -> Callable[..., Iterator[Any]]:
    """``applyInPandasWithState``'s function for w4: keep the key's value; emit nothing."""

    def store(key: tuple[Any, ...], chunks: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        for chunk in chunks:
            state.update((bytes(chunk["payload"].iat[-1]),))
        return iter(())

    return store


def store_value_processor() -> Any:
    """``transformWithStateInPandas``'s processor for w4: the value in a ValueState."""
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

    class StoreValue(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.value = handle.getValueState("payload", "payload binary")

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            for chunk in rows:
                self.value.update((bytes(chunk["payload"].iat[-1]),))
            return iter(())

        def close(self) -> None:
            pass

    return StoreValue()


def directory_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (Hadoop's ``.crc`` side files included)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ------------------------------------------------------------------ w4r

#: Rows per micro-batch of W4r's load (the largest divisor of the key count at most this):
#: Spark's hash aggregation holds a batch's keys in memory before the state store sees them.
W4R_LOAD_ROWS_PER_BATCH = 2_000_000


def w4r_load_rows_per_batch(keys: int) -> int:
    """Rows per load batch: a divisor of ``keys``, so the load's last batch ends on the last key."""
    for batches in range(-(-keys // W4R_LOAD_ROWS_PER_BATCH), keys + 1):
        if keys % batches == 0:
            return keys // batches
    return keys


class NewFiles:
    """The bytes of the files that appeared under a directory since the last look: what a
    micro-batch uploaded to the checkpoint location (state store changelogs, snapshots,
    offset and commit logs). Deleted files (Spark's maintenance drops old versions) do not
    subtract. ``loaded_state_bytes``: what the state store's directory held at the first
    look, right after the load: every key's value once, in the load's changelogs (later the
    directory also keeps the versions Spark retains, ``minBatchesToRetain``, so its size
    is no longer the state's)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.known: dict[str, int] = {}
        self.per_batch: dict[int, int] = {}
        self.present_state = 0
        self.look()
        self.loaded_state_bytes = self.present_state

    def look(self) -> int:
        added = 0
        present: dict[str, int] = {}
        for path in self.root.rglob("*"):
            try:
                if not path.is_file():
                    continue
                size = path.stat().st_size
            except OSError:  # removed meanwhile
                continue
            name = str(path)
            if name not in self.known:
                added += size
            elif size > self.known[name]:
                added += size - self.known[name]
            present[name] = size
        self.known.update(present)
        state = str(self.root / "state") + os.sep
        self.present_state = sum(size for name, size in present.items() if name.startswith(state))
        return added

    def batch_done(self, batch_id: int) -> None:
        self.per_batch[batch_id] = self.per_batch.get(batch_id, 0) + self.look()


def w4r(spark: Any, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """W4 on RocksDB (``w4r_records``): ``groupBy(key).agg(max(value))`` on the RocksDB
    state store with changelog checkpointing (the value starts with the record number, so
    the largest is the latest).

    Queries one after the other on one checkpoint location, as a source whose rate
    changes: the load (``rate-micro-batch``, every key once, in batches of up to 2 M rows,
    each an ``availableNow`` query of one batch), then, restarted from the load's
    checkpoint, the updates: ``rate`` rows per batch with a 1 s processing-time trigger, so
    one commit (Spark's checkpoint) per second of updates.
    Each batch's ``uploaded_bytes`` is what appeared in the checkpoint directory by the
    time its progress was seen (the changelog files, a snapshot the maintenance thread
    uploaded meanwhile, the offset and commit logs); its duration is the commit work as in
    w1 (``checkpoint_ms``); the full size is what the state store's directory in the
    checkpoint location held after the load (``NewFiles``). The first update batch (the
    restart: it reloads the state store) is not measured; the load's throughput is its
    rows over its batches' time (the restarts between them left out), without the first
    batch (start-up), as w1 does, with the figure that counts it beside it.
    """
    from pyspark.sql import functions as F

    records = W4rRecords(
        args.records, args.value_bytes, args.update_fraction, args.update_s, args.parallelism
    )
    keys = records.keys
    filler = b"v" * max(0, args.value_bytes - 8)
    checkpoint = work_dir / "checkpoint"

    def start(per_batch: int, trigger: dict[str, str]) -> Any:
        source = counting_source(spark, args, per_batch, records.records)
        keyed = source.select(
            F.when(F.col("value") < keys, F.col("value"))
            .otherwise((F.col("value") - keys) * STRIDE % keys)
            .alias("key"),
            F.concat(F.unhex(F.lpad(F.hex("value"), 16, "0")), F.lit(filler)).alias("payload"),
        )
        result = keyed.groupBy("key").agg(F.max("payload").alias("payload"))
        return (
            result.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    started = time.perf_counter()
    load_per_batch = w4r_load_rows_per_batch(keys)
    loads: list[dict[str, Any]] = []
    for done in range(load_per_batch, keys + 1, load_per_batch):
        # availableNow: one batch of load_per_batch rows, then the query ends. A query
        # running batches back to back could commit one more, of updates, unpaced.
        loads += run_until(start(load_per_batch, {"availableNow": True}), done, args.timeout_s, work_dir)
    if end_offset(loads[-1]) != keys:
        raise RuntimeError(f"the load ended at row {end_offset(loads[-1])}, not {keys}")
    uploads = NewFiles(checkpoint)
    updates = run_until(
        start(records.rate, trigger_of(args)),
        records.records,
        args.timeout_s,
        work_dir,
        on_batch=uploads.batch_done,
    )
    wall = time.perf_counter() - started
    updates = [b for b in updates if start_offset(b) >= keys]
    phases = Phases(
        load_first=epoch_s(loads[0]["timestamp"]),
        load_last=batch_end_s(loads[-1]),
        load_count=sum(int(b["numInputRows"]) for b in loads),
        update_first=epoch_s(updates[0]["timestamp"]),
        # a batch shorter than the trigger waits for it: the updates' time runs to then
        update_last=max(
            batch_end_s(updates[-1]), epoch_s(updates[-1]["timestamp"]) + args.checkpoint_interval_ms / 1000
        ),
        update_count=sum(int(b["numInputRows"]) for b in updates),
    )
    checkpoints = [
        {
            "batch": b["batchId"],
            "trigger_ms": epoch_s(b["timestamp"]) * 1000,
            "duration_ms": checkpoint_ms(b),
            "uploaded_bytes": uploads.per_batch.get(b["batchId"], 0),
            "full_bytes": uploads.loaded_state_bytes,
        }
        for b in updates[1:]  # the first: the restart reloads the state store
    ]
    found = w4r_figures(records, phases, checkpoints, 0)
    load_ms = [float(b["durationMs"]["triggerExecution"]) for b in loads]
    steady_load = (keys - int(loads[0]["numInputRows"])) / sum(load_ms[1:]) * 1000 if len(loads) > 1 else None
    every_load = keys / sum(load_ms) * 1000
    return {
        **found,
        "load_records_per_s": steady_load or every_load,
        "load_records_per_s_incl_first_batch": every_load,
        "load_rows_per_batch": load_per_batch,
        "update_batch_p50_ms": percentile(
            sorted(float(b["durationMs"]["triggerExecution"]) for b in updates), 50
        ),
        "state_commit_p50_ms": percentile(
            sorted(float(sum(op.get("commitTimeMs", 0) for op in b["stateOperators"])) for b in updates[1:]),
            50,
        ),
        "state_store": "RocksDBStateStoreProvider, changelog checkpointing",
        "query_s": wall,
    }


# ------------------------------------------------------------------ main


# ------------------------------------------------------------------ w5


def w5_source(spark: Any, args: argparse.Namespace, events: W5Events, per_batch: int) -> Any:
    """W5's events from ``rate-micro-batch``: ``value`` is record ``i``, its key and
    timestamp computed in the JVM by the formula of ``W5Events.timestamp``. The source is
    unbounded: the records from ``records`` on carry event time past the last window, so
    that the watermark passes it (Spark has no end of input that would fire it); their
    windows are not checked."""
    from pyspark.sql import functions as F

    block, rate = events.block, events.per_event_second
    timestamp_ms = (
        f"{BASE_MS} + ((value - value % {block}) + (value % {block}) * {DEAL} % {block}) * 1000 div {rate}"
    )
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", per_batch)
        .option("numPartitions", args.parallelism)
        .load()
        .select(
            (F.col("value") % events.keys).alias("key"),
            F.col("value"),
            F.timestamp_millis(F.expr(timestamp_ms)).alias("ts"),
        )
    )


class W5Sink:
    """``foreachBatch``: checks the batch's window results in the JVM and collects one row
    per window (count, distinct keys, key range, wrong sums), noting the wall-clock time
    after that: every result of the batch has reached the sink by then. Results of the
    filler windows past the events are dropped unchecked."""

    def __init__(self, events: W5Events) -> None:
        self.events = events
        self.batches: dict[int, tuple[float, list[tuple[int, int, int, int, int, int]]]] = {}
        self.done = threading.Event()

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        events = self.events
        count = events.per_key_and_window
        window = (F.unix_millis(F.col("window.start")) - BASE_MS) / 1000
        expected = F.lit(count) * (window.cast("long") * events.per_event_second + F.col("key")) + F.lit(
            events.keys * count * (count - 1) // 2
        )
        rows = (
            df.select(window.cast("long").alias("w"), "key", (F.col("total") != expected).alias("bad"))
            .where(F.col("w") < events.windows)
            .groupBy("w")
            .agg(
                F.count("*").alias("n"),
                F.countDistinct("key").alias("distinct"),
                F.min("key").alias("lo"),
                F.max("key").alias("hi"),
                F.sum(F.col("bad").cast("long")).alias("bad"),
            )
            .collect()
        )
        now = time.time()
        self.batches[batch_id] = (
            now,
            [
                (int(r["w"]), int(r["n"]), int(r["distinct"]), int(r["lo"]), int(r["hi"]), int(r["bad"]))
                for r in rows
            ],
        )
        if any(r[0] == events.windows - 1 for r in self.batches[batch_id][1]):
            self.done.set()

    def verdict(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """``verify``'s figures for Spark's per-window rows, and the arrivals in
        ``ResultCheck``'s form (every result of a batch arrived at its sink time; Spark's
        watermark is global, so all results count as of source 0)."""
        events = self.events
        seen: dict[int, int] = {}
        missing = duplicated = wrong = 0
        arrivals: dict[str, dict[str, int]] = {}
        for batch_id in sorted(self.batches):
            at, rows = self.batches[batch_id]
            for w, n, distinct, lo, hi, bad in rows:
                wrong += bad
                if w in seen:  # a window emitted twice (in two batches)
                    duplicated += n
                    continue
                seen[w] = n
                duplicated += n - distinct
                if distinct != events.keys or lo != 0 or hi != events.keys - 1:
                    missing += max(0, events.keys - distinct)
                    wrong += 0 if (lo, hi) == (0, events.keys - 1) else 1
                arrivals[f"{w}/0"] = {str(int(at * 1000)): n}
        missing += sum(events.keys for w in range(events.windows) if w not in seen)
        results = sum(n for _, rows in self.batches.values() for _, n, *_ in rows)
        verdict = {
            "exact": missing == duplicated == wrong == 0,
            "results": results,
            "results_expected": events.windows * events.keys,
            "missing_results": missing,
            "duplicate_results": duplicated,
            "wrong_sums": wrong,
            "results_outside_windows": 0,
        }
        return verdict, [{"arrivals": arrivals}]


def w5(spark: Any, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """W5 keyed tumbling event-time window: ``groupBy(window(ts, "1 second"), key)
    .agg(sum(value))`` after ``withWatermark("ts", "200 milliseconds")``, append mode (each
    window's sums emitted once, when the watermark passed its end), into a checking
    ``foreachBatch`` sink.

    Spark computes its watermark at the end of a micro-batch from the largest event time
    the batch read, and a window whose end it passed is emitted by the next batch. So a
    window's watermark passed at the end of the first batch whose largest event time
    (``eventTime.max`` of its progress) reached the window's end + 200 ms, and its results
    reached the sink when the ``foreachBatch`` of the batch emitting them was done.

    ``records_per_s`` is the rate of the batches after the first up to the one that read
    the last event: their rows over the time from the end of the first to the end of
    that one (like w1, leaving out the first batch's start-up);
    ``records_per_s_incl_first_batch`` counts from the first batch's start.
    """
    if args.mode != "groupby":
        raise NotImplementedError(
            f"w5 runs in groupby mode only (Spark's window aggregation); {args.mode} has no "
            "event-time window in this runner"
        )
    started = time.perf_counter()
    events = W5Events(args.records, args.keys, args.per_event_second, args.parallelism)
    per_batch = rows_per_batch(args, W5_ROWS_PER_BATCH)
    from pyspark.sql import functions as F

    result = (
        w5_source(spark, args, events, per_batch)
        .withWatermark("ts", f"{OUT_OF_ORDERNESS_MS} milliseconds")
        .groupBy(F.window("ts", "1 second"), "key")
        .agg(F.sum("value").alias("total"))
    )
    sink = W5Sink(events)
    query = (
        result.writeStream.foreachBatch(sink)
        .outputMode("append")
        .option("checkpointLocation", str(work_dir / "checkpoint"))
        .trigger(**trigger_of(args))
        .start()
    )
    deadline = time.monotonic() + args.timeout_s
    try:
        while not sink.done.is_set():
            if query.awaitTermination(0.05):
                raise RuntimeError("the query ended before emitting the last window")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the last window was not emitted in {args.timeout_s} s")
        stop_between_batches(query, query.lastProgress)
    finally:
        progress = [json.loads(p.json) for p in query.recentProgress]
        query.stop()
        with open(work_dir / "progress.jsonl", "a") as f:
            f.writelines(json.dumps(p) + "\n" for p in progress)
    wall = time.perf_counter() - started
    batches = {p["batchId"]: p for p in progress if p["numInputRows"] > 0 and "addBatch" in p["durationMs"]}
    ordered = [batches[b] for b in sorted(batches)]
    verdict, arrivals = sink.verdict()
    if not verdict["exact"]:
        raise RuntimeError(
            f"W5 results are not exact: {verdict['missing_results']} missing, "
            f"{verdict['duplicate_results']} duplicated, {verdict['wrong_sums']} wrong"
        )
    passed_at: dict[tuple[int, int], float] = {}
    for p in ordered:
        largest = p.get("eventTime", {}).get("max")
        if largest is None:
            continue
        largest_ms = round(epoch_s(largest) * 1000)
        for w in range(events.windows):
            if (w, 0) not in passed_at and largest_ms >= events.fire_threshold(w):
                passed_at[(w, 0)] = batch_end_s(p)
    reading = [p for p in ordered if start_offset(p) < events.records]
    first_start, first_end = epoch_s(ordered[0]["timestamp"]), batch_end_s(ordered[0])
    if len(reading) > 1:
        span = batch_end_s(reading[-1]) - first_end
        steady = sum(p["numInputRows"] for p in reading[1:]) / span
    else:
        span = batch_end_s(reading[-1]) - first_start
        steady = events.records / span
    return {
        "records": events.records,
        "records_per_s": steady,
        "first_to_last_s": span,
        "records_per_s_incl_first_batch": events.records / (batch_end_s(reading[-1]) - first_start),
        "windows": events.windows,
        "keys": events.keys,
        "records_per_event_second": events.per_event_second,
        "out_of_orderness_ms": OUT_OF_ORDERNESS_MS,
        **verdict,
        **latency_figures(passed_at, arrivals),
        "first_batch_ms": ordered[0]["durationMs"]["triggerExecution"],
        "rows_per_batch": per_batch,
        "query_s": wall,
        **batch_figures(ordered),
    }


WORKLOADS = {"w1": w1, "w2": w2, "w3": w3, "w4": w4, "w4r": w4r, "w5": w5}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python spark_ss_runner.py", description=__doc__.split("\n", 1)[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--work-dir", required=True, type=Path)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument(
        "--checkpoint-interval-ms",
        type=int,
        default=1000,
        help="the processing-time trigger; 0 = batches back to back (Spark "
        "commits every batch, it cannot turn checkpoints off)",
    )
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument(
        "--update-fraction", type=float, default=0.01, help="w4r: keys updated per second (a fraction)"
    )
    parser.add_argument("--update-s", type=float, default=20.0, help="w4r: seconds of updates")
    parser.add_argument(
        "--per-event-second", type=int, default=100_000, help="w5: records per second of event time"
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="groupby",
        help="the Spark API holding the keyed state (default groupby)",
    )
    parser.add_argument(
        "--rows-per-batch",
        type=int,
        default=0,
        help="rate-micro-batch rowsPerBatch for w1/w2 (default "
        f"{DEFAULT_ROWS_PER_BATCH:,}; w2 caps it at records // 4; w4 reads "
        "every record in one batch)",
    )
    parser.add_argument(
        "--state-store",
        choices=["default", "rocksdb"],
        default="default",
        help="default: Spark's HDFS-backed in-memory store (twsip: RocksDB, which it requires)",
    )
    parser.add_argument(
        "--w3-source",
        choices=["socket", "rate"],
        default="socket",
        help="w3's source: Spark's socket source fed by this runner at the "
        "rate (default), or Spark's rate source (second-granular: adds "
        "about 0.5 s)",
    )
    parser.add_argument(
        "--warm-up-batches",
        type=int,
        default=0,
        help="run the keyed sum for this many batches (100,000 rows; 10,000 "
        "in the Python modes) before the measured query, so that it starts "
        "warm (default 0: measure from cold, as the protocol does)",
    )
    parser.add_argument(
        "--driver-memory", default="2g", help="the local JVM's heap (state of the default store is on it)"
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=1800.0,
        help="give up on a query that has not finished after this long",
    )
    return parser.parse_args(argv)


def raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM as Ctrl-C, so the query and the session are stopped on the way out."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    args = parse(argv)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.setLevel(logging.INFO)
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"system": "spark_ss", "variant": args.mode, "workload": args.workload}
    code = 0
    spark = None
    try:
        check_mode_available(args)
        spark = make_session(args, args.work_dir)
        result["session_start_s"] = time.perf_counter() - started
        log.info("Session up in %.1f s", result["session_start_s"])
        warm_up(spark, args, args.work_dir)
        result["warm_up_batches"] = args.warm_up_batches
        result.update(WORKLOADS[args.workload](spark, args, args.work_dir))
        result["wall_s"] = time.perf_counter() - started  # session start included
        result["spark_version"] = spark.version
        result["ok"] = True
    except KeyboardInterrupt as exc:
        result.update(ok=False, error=f"KeyboardInterrupt: {exc}")
        code = 130
    except Exception as exc:  # reported in the JSON, as the protocol says
        log.exception("spark_ss %s (%s) failed", args.workload, args.mode)
        result.update(ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}")
    finally:
        if spark is not None:
            stop(spark)
        shutil.rmtree(args.work_dir / "spark-local", ignore_errors=True)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return code


def stop(spark: Any) -> None:
    """Stop every query this session runs, then the session (and its JVM's work)."""
    for query in spark.streams.active:
        try:
            query.stop()
        except Exception:  # stopping anyway; the session stop below ends it
            log.warning("Could not stop query %s cleanly", query.id, exc_info=True)
    spark.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
