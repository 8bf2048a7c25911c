"""Event-time windows on the batch (Arrow) path: ``KeyedBatchStream.window(assigner)``.

- The same seeded, out-of-order input through the batch windows and through the record
  path's window operator, in one job (one source, so both see the same rows and watermarks
  in the same order): every (key, window) gets the same sums, counts, minima, maxima, means
  and user aggregate, tumbling and sliding, with and without allowed lateness, and the same
  late rows in the late side output.
- Exactly once through a raised exception after a completed checkpoint, then a savepoint and
  a restore at another parallelism: every (key, window) is emitted once, and its sum plus the
  late rows of that key and window is the sum of its input.
- One Spark-executor job, one job with unaligned checkpoints, and the errors a user can cause.
"""

from __future__ import annotations

import json
import operator
import re
import shutil
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from chandy import BatchAggregateFunction, Duration, StreamExecutionEnvironment, WatermarkStrategy
from chandy.connectors.arrow_sources import ArrowDataGeneratorSource, ArrowNumberSequenceSource
from chandy.core.functions import MapBatchesFunction, ProcessWindowFunction
from chandy.core.output_tag import OutputTag
from chandy.core.time import Time
from chandy.core.watermark_strategy import TimestampAssigner
from chandy.core.windows import (
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from chandy.errors import InvalidProgramError, JobExecutionError
from tests.jobs import kill_a_slot_after_checkpoints
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too
from tests.test_batch_e2e import completed_checkpoints_on_disk
from tests.test_checkpointing_e2e import cancel_keeping_results, drain, latest_checkpoint_dir
from tests.test_unaligned_checkpoints_e2e import run
from tests.unaligned_jobs import completed_checkpoints, wait_for

FUNCTIONS = ("sum", "count", "min", "max", "mean")


def strategy(bound_ms: int = 0) -> WatermarkStrategy:
    return WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(bound_ms)).with_timestamp_column(
        "ts"
    )


class Rows:
    """Row ``i`` of a seeded table (``key``, ``value``, ``ts``): timestamps rise 2 ms a row
    with up to ``jitter`` ms of random delay, so rows arrive out of order."""

    def __init__(self, n: int, keys: int, jitter: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.keys = rng.integers(0, keys, size=n)
        self.values = rng.integers(-1_000, 1_000, size=n)
        self.ts = np.arange(n, dtype=np.int64) * 2 - rng.integers(0, jitter, size=n)

    def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {"key": self.keys[indices], "value": self.values[indices], "ts": self.ts[indices]}


class Pace(MapBatchesFunction):
    """Sleeps a little per batch, so periodic watermarks (every millisecond) fall between
    batches and later rows are late."""

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(0.003)
        return batch


class SumOfSquares(BatchAggregateFunction):
    """A user aggregate: the sum of ``value ** 2`` per (key, window)."""

    def create_accumulator(self) -> dict[str, Any]:
        return {"squares": 0}

    def add(self, accumulator: dict[str, Any], batch: pa.RecordBatch, group_ids: Any) -> None:
        values = batch.column("value").to_numpy()
        np.add.at(accumulator["squares"], group_ids, values * values)

    def get_result(self, accumulator: dict[str, Any]) -> dict[str, Any]:
        return {"squares": accumulator["squares"]}

    def merge(self, accumulator: dict[str, Any], group_ids: Any, groups: int) -> dict[str, Any]:
        merged = np.zeros(groups, dtype=accumulator["squares"].dtype)
        np.add.at(merged, group_ids, accumulator["squares"])
        return {"squares": merged}


class AllAggregates(ProcessWindowFunction):
    """The record path's reference: every aggregate of a window's elements."""

    def process(self, key: Any, context: Any, elements: Iterable[Any]) -> Any:
        values = [row["value"] for row in elements]
        window = context.window()
        results = {
            "sum": sum(values),
            "count": len(values),
            "min": min(values),
            "max": max(values),
            "mean": sum(values) / len(values),
            "squares": sum(v * v for v in values),
        }
        for kind, value in results.items():
            yield kind, key, window.start, window.end, value


def firings(rows: list[Any], source: str) -> dict[tuple[str, int, int, int], list[Any]]:
    """The values emitted for each (kind, key, start, end), in order."""
    out: dict[tuple[str, int, int, int], list[Any]] = defaultdict(list)
    for origin, kind, key, start, end, value in rows:
        if origin == source:
            out[(kind, key, start, end)].append(value)
    return dict(out)


def both_paths(rows: Rows, windows: Any, lateness: int, user_aggregate: bool) -> list[Any]:
    """``rows`` through batch windows and the record path's windows in one job (parallelism
    1, so both see the same rows and watermarks in the same order): ("batch" | "record",
    function, key, start, end, value) per firing, ("late", "batch" | "record", key, ts, 0,
    value) per late row; ``user_aggregate``: the batch path's ``aggregate`` too ("squares")."""
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    env.configure({"pipeline.auto-watermark-interval": 1, "chandy.network.arrow-batch-size": 200})
    source = env.from_source(ArrowDataGeneratorSource(rows, count=len(rows.ts)), strategy(), "rows")
    paced = source.map_batches(Pace())
    keyed = paced.key_by("key")
    late_batch, late_record = OutputTag("late-batch"), OutputTag("late-record")

    def windowed(late: OutputTag | None = None) -> Any:
        stream = keyed.window(windows).allowed_lateness(lateness)
        return stream if late is None else stream.side_output_late_data(late)

    outputs = builtin_outputs(windowed, late_batch)
    if user_aggregate:
        squares = windowed().aggregate(SumOfSquares(), {"squares": "int64"}).to_records()
        outputs.append(
            squares.map(lambda r: ("batch", "squares", r.key, r.window_start, r.window_end, r.squares))
        )
    record = (
        paced.to_records()
        .key_by(lambda r: r["key"])
        .window(windows)
        .allowed_lateness(lateness)
        .side_output_late_data(late_record)
        .process(AllAggregates())
    )
    fired = record if user_aggregate else record.filter(lambda t: t[0] != "squares")
    outputs.append(fired.map(lambda t: ("record", *t)))
    outputs.append(
        record.get_side_output(late_record).map(lambda r: ("late", "record", r.key, r.ts, 0, r.value))
    )
    first, *rest = outputs
    out, _ = run(first.union(*rest), f"batch windows against record windows ({windows!r})")
    return list(out)


def builtin_outputs(windowed: Callable[[OutputTag | None], Any], late: OutputTag) -> list[Any]:
    """Every built-in aggregate of ``windowed(tag)`` (``sum`` with ``late`` as its late side
    output) as records ("batch", function, key, start, end, value), and the late rows as
    ("late", "batch", key, ts, 0, value)."""
    outputs = []
    for function in FUNCTIONS:
        result = getattr(windowed(late if function == "sum" else None), function)("value")
        name = "count" if function == "count" else "value"
        outputs.append(
            result.to_records().map(
                lambda r, f=function, n=name: ("batch", f, r.key, r.window_start, r.window_end, r[n])
            )
        )
        if function == "sum":
            late_rows = result.get_side_output(late).to_records()
            outputs.append(late_rows.map(lambda r: ("late", "batch", r.key, r.ts, 0, r.value)))
    return outputs


def is_subsequence(short: list[Any], long: list[Any]) -> bool:
    it = iter(long)
    return all(any(item == other for other in it) for item in short)


@pytest.mark.parametrize("assigner", ["tumbling", "sliding"])
@pytest.mark.parametrize("lateness", [0, 150])
def test_batch_windows_equal_the_record_paths(assigner: str, lateness: int) -> None:
    """Both paths in one job (parallelism 1, so rows and watermarks reach both windows in the
    same order): every (key, window) has the same aggregates. Without allowed lateness each
    is emitted once on both paths; with it a window fires again for late rows, once per
    late record on the record path and once per batch here, so the batch path's values
    are a subsequence of the record path's ending with the same value. Late rows go to
    the side output on both paths alike."""
    rows = Rows(8_000, keys=7, jitter=600, seed=5 + lateness)
    windows = (
        TumblingEventTimeWindows.of(Time.milliseconds(100))
        if assigner == "tumbling"
        else SlidingEventTimeWindows.of(Time.milliseconds(300), Time.milliseconds(100))
    )
    out = both_paths(rows, windows, lateness, user_aggregate=True)
    batch, reference = firings(out, "batch"), firings(out, "record")
    assert set(batch) == set(reference)
    assert {k[0] for k in batch} == {*FUNCTIONS, "squares"}
    for window, values in reference.items():
        mine = batch[window]
        if lateness == 0:
            assert mine == pytest.approx(values), window
        else:
            mine, values = [round(v, 6) for v in mine], [round(v, 6) for v in values]
            assert mine[-1] == values[-1] and is_subsequence(mine, values), (window, mine, values)
    late = Counter((kind, key, ts, value) for origin, kind, key, ts, _, value in out if origin == "late")
    late_batch_rows = Counter({(k, ts, v): n for (kind, k, ts, v), n in late.items() if kind == "batch"})
    late_record_rows = Counter({(k, ts, v): n for (kind, k, ts, v), n in late.items() if kind == "record"})
    assert late_batch_rows == late_record_rows
    assert late_batch_rows, "no late rows: the watermarks did not fall between the batches"
    # Every input row is in a window or late, never lost (sums over tumbling windows).
    if assigner == "tumbling":
        total = sum(v for (kind, *_), values in batch.items() if kind == "sum" for v in values[-1:])
        late_total = sum(value * n for (_, _, value), n in late_batch_rows.items())
        assert total + late_total == int(rows.values.sum())


# ---------------------------------------------------------------------- exactly once, restore


KEYS = 13
#: Event time: value ``v`` happens at ``v`` ms, 0 to 49 ms late (by ``v % 50``), so the rows
#: of a subtask are out of order by less than the 50 ms bound and none is late there.
WINDOW_MS = 200


def keyed_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    values = batch.column("value").to_numpy()
    return pa.RecordBatch.from_pydict({"key": values % KEYS, "value": values, "ts": values - values % 50})


class FailOnce(MapBatchesFunction):
    """Sleeps ``delay_s`` per batch until ``until`` exists; raises once (over every attempt)
    at its first batch after a checkpoint completed."""

    def __init__(
        self, until: str, probe: Probe | None = None, checkpoints: str | None = None, delay_s: float = 0.05
    ) -> None:
        self.until = until
        self.delay_s = delay_s
        self.probe = probe
        self.checkpoints = checkpoints

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if not Path(self.until).exists():
            time.sleep(self.delay_s)
        if (
            self.probe is not None
            and self.checkpoints
            and completed_checkpoints_on_disk(self.checkpoints) >= 1
        ):
            if self.probe.add("failures") == 1:
                raise RuntimeError("induced failure in map_batches")
        return keyed_rows(batch)


def window_job(env: StreamExecutionEnvironment, n: int, pace: FailOnce) -> Any:
    """``1..n`` as rows (key, value, ts) into a tumbling 200 ms window sum, with its late rows
    (tagged) in the same collected stream."""
    late = OutputTag("late")
    sums = windowed_rows(env, n, pace).side_output_late_data(late).sum("value").uid("window")
    late_rows = sums.get_side_output(late).map_batches(
        lambda b: {"key": b["key"], "window_start": b["ts"], "window_end": b["ts"], "value": b["value"]}
    )
    return sums.union(late_rows)


def windowed_rows(
    env: StreamExecutionEnvironment, n: int, rows: MapBatchesFunction, lateness: int = 0
) -> Any:
    """``1..n`` through ``rows`` (key, value, ts) into tumbling 200 ms windows (uids kept
    across the tests' runs, so each restores the other's state)."""
    source = env.from_source(ArrowNumberSequenceSource(1, n), source_name="numbers").uid("numbers")
    timed = (
        source.map_batches(rows).uid("rows").assign_timestamps_and_watermarks(strategy(50)).uid("event time")
    )
    return (
        timed.key_by("key")
        .window(TumblingEventTimeWindows.of(Time.milliseconds(WINDOW_MS)))
        .allowed_lateness(lateness)
    )


def assert_windows_exact(out: list[Any], n: int) -> None:
    """Every (key, window) emitted once, its sum plus its late rows' values is its input's sum."""
    emitted = Counter((r.key, r.window_start) for r in out if r.window_end != r.window_start)
    assert emitted and max(emitted.values()) == 1, [w for w, c in emitted.items() if c > 1][:5]
    totals: dict[tuple[int, int], int] = defaultdict(int)
    for r in out:
        start = r.window_start - r.window_start % WINDOW_MS
        totals[(r.key, start)] += r.value
    assert dict(totals) == expected_sums(n)


def expected_sums(n: int, combine: Callable[[int, int], int] = operator.add) -> dict[tuple[int, int], int]:
    """The sum (or ``combine``, from 0) of each (key, window start) of ``1..n`` as rows."""
    expected: dict[tuple[int, int], int] = defaultdict(int)
    values = np.arange(1, n + 1)
    ts = values - values % 50
    for key, start, value in zip(
        (values % KEYS).tolist(), (ts - ts % WINDOW_MS).tolist(), values.tolist(), strict=True
    ):
        expected[(key, start)] = combine(expected[(key, start)], value)
    return dict(expected)


# The window state stays columnar whatever the backend; RocksDB's settings on one executor
# keep the suite's time in bounds.
@on_rocksdb_too(executor=("local",))
@pytest.mark.slow
def test_exactly_once_through_a_failure_and_a_restore_at_another_parallelism(
    tmp_path: Path, executor: str
) -> None:
    """Parallelism 2 with checkpoints every 100 ms; the paced map raises once after a
    checkpoint completed (on Spark a slot process is then SIGKILLed two checkpoints after the
    restore); after the restart and more checkpoints the job stops with a savepoint (windows
    pending in it), and a second run restores it at parallelism 3."""
    n = 200_000  # paced to 10,000 rows/s per subtask: 10 s at least, stopped long before
    probe = Probe()
    gate = str(tmp_path / "never")
    checkpoints = str(tmp_path / "checkpoints")
    env = batch_env(executor, 2, checkpoints)
    first, savepoint = fail_then_stop_with_savepoint(
        window_job(env, n, FailOnce(gate, probe, checkpoints)), probe, tmp_path, kill=executor == "spark"
    )
    assert len(first) < n // WINDOW_MS * KEYS  # stopped early: windows were pending

    env2 = batch_env(executor, 3, str(tmp_path / "second"))
    env2.set_restore_path(savepoint)
    second, client2 = run(window_job(env2, n, FailOnce(str(tmp_path))), "second run")
    assert client2.get_checkpoint_statistics()["counts"]["restored"] == 1
    assert_windows_exact(first + second, n)


def fail_then_stop_with_savepoint(
    job: Any, probe: Probe, tmp_path: Path, kill: bool = False
) -> tuple[list[Any], str]:
    """Run ``job`` (whose rows fail once, counted in ``probe``) until it restarted and two
    more checkpoints completed (with ``kill``, on Spark: then SIGKILL a slot process and wait
    for that restart and two more), then stop it with a savepoint: its output and the savepoint."""
    results = job.execute_and_collect("first run")
    client = results.job_client
    first, reader = drain(results)
    wait_for_the_failure_and_checkpoints(client, probe, 2)
    if kill:
        completed = client.get_checkpoint_statistics(timeout=60)["counts"]["completed"]
        kill_a_slot_after_checkpoints(client, completed)
        wait_for(lambda: client.restarts >= 2 or client.is_done(), "the restart after the kill", 120)
        wait_for_the_failure_and_checkpoints(client, probe, 2)
        assert client.restarts >= 2 and not client.is_done()
    savepoint: str = client.stop_with_savepoint(savepoint_directory=str(tmp_path / "sp")).result(120)
    reader.join(60)
    assert not reader.is_alive()
    results.close()
    assert client.restarts >= 1
    return first, savepoint


def wait_for_the_failure_and_checkpoints(client: Any, probe: Probe, checkpoints: int) -> None:
    """Until the induced failure happened and ``checkpoints`` more completed (or the job ended)."""
    wait_for(lambda: probe.get("failures") >= 1 or client.is_done(), "the induced failure", 120)

    def completed() -> int:
        return int(client.get_checkpoint_statistics(timeout=60)["counts"]["completed"])

    done = completed()
    wait_for(
        lambda: completed() >= done + checkpoints or client.is_done(), "checkpoints after the restore", 120
    )


def batch_env(executor: str, parallelism: int, checkpoints: str, **config: Any) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(100)
    env.configure(
        {
            "restart-strategy.fixed-delay.delay": 50,
            "web.checkpoints.history": 10_000,
            "chandy.network.arrow-batch-size": 500,
            "execution.checkpointing.dir": checkpoints,
            **config,
        }
    )
    return env


@pytest.mark.slow
def test_unaligned_checkpoints_and_a_failure_keep_every_window_once(tmp_path: Path) -> None:
    """Every checkpoint unaligned (in-flight batches in the checkpoint); a failure after one
    completed; every (key, window) exact and emitted once."""
    n = 40_000
    probe = Probe()
    checkpoints = str(tmp_path / "checkpoints")
    gate = tmp_path / "release"
    env = batch_env(
        "local",
        2,
        checkpoints,
        **{
            "execution.checkpointing.unaligned.enabled": True,
            "execution.checkpointing.aligned-checkpoint-timeout": 0,
        },
    )
    results = window_job(env, n, FailOnce(str(gate), probe, checkpoints)).execute_and_collect("unaligned")
    client = results.job_client

    def release_after_a_restored_checkpoint() -> None:
        try:
            wait_for_the_failure_and_checkpoints(client, probe, 1)
        finally:
            gate.touch()

    actor = threading.Thread(target=release_after_a_restored_checkpoint, daemon=True)
    actor.start()
    with results:
        out = list(results)
    client.get_job_execution_result(timeout=120)
    actor.join(60)
    stats = client.get_checkpoint_statistics()
    assert client.restarts >= 1 and stats["counts"]["restored"] >= 1
    assert any(c["is_unaligned"] for c in completed_checkpoints(stats))
    assert_windows_exact(out, n)


# ---------------------------------------------------------------------- timestamp columns


def local_env() -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    return env


def generated(columns: dict[str, Any], count: int = 10) -> ArrowDataGeneratorSource:
    def generate(indices: np.ndarray) -> dict[str, Any]:
        return {name: make(indices) for name, make in columns.items()}

    return ArrowDataGeneratorSource(generate, count=count)


def test_an_arrow_timestamp_column_and_assign_timestamps_on_a_batch_stream() -> None:
    """A timestamp[us] column works as event time (floored to ms), here assigned on the batch
    stream rather than at its source; ``count()`` counts rows per window, of string keys, in
    a batch that spans several windows."""
    env = local_env()
    source = env.from_source(
        generated(
            {
                "key": lambda i: pa.array([f"k{x % 2}" for x in i.tolist()]),  # not an int: Arrow's take
                "ts": lambda i: pa.array(i * 400_000, pa.int64()).cast(pa.timestamp("us")),
            }
        ),
        source_name="rows",
    )
    counts = (
        source.assign_timestamps_and_watermarks(strategy())
        .key_by("key")
        .window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .count()
    )
    out, _ = run(counts, "timestamps")
    got = sorted((r.key, r.window_start, r.count) for r in out)
    expected: Counter[tuple[str, int]] = Counter((f"k{i % 2}", i * 400 // 1000 * 1000) for i in range(10))
    assert got == sorted((k, s, c) for (k, s), c in expected.items())


@pytest.mark.slow
def test_an_idle_batch_source_does_not_hold_the_window_back() -> None:
    """Source b (``with_idleness(100 ms)``) emits a row, then nothing for 2 s: marked idle, it
    leaves the watermark to source a, whose end (the last watermark) fires every window; b's
    second row then comes too late for its window and goes to the late side output. Without
    idleness b's first watermark would hold the window back until b's end."""
    env = local_env()
    env.configure({"pipeline.auto-watermark-interval": 10})
    busy = env.from_source(
        generated({"key": lambda i: np.full(len(i), "a"), "ts": lambda i: i * 10}, count=100), strategy(), "a"
    )
    quiet = env.from_source(
        ArrowDataGeneratorSource(
            lambda i: {"key": np.full(len(i), "b"), "ts": i * 5}, count=2, rate_per_second=0.5
        ),
        strategy().with_idleness(Duration.of_millis(100)),
        "b",
    )
    late = OutputTag("late")
    counts = (
        busy.union(quiet)
        .key_by("key")
        .window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .side_output_late_data(late)
        .count()
    )
    late_rows = counts.get_side_output(late).map_batches(
        lambda b: {"key": b["key"], "window_start": b["ts"], "count": pa.array([-1] * b.num_rows)}
    )
    counts = counts.map_batches(lambda b: b.select(["key", "window_start", "count"]))
    out, _ = run(counts.union(late_rows), "an idle batch source")
    assert sorted((r.key, r.window_start, r.count) for r in out) == [("a", 0, 100), ("b", 0, 1), ("b", 5, -1)]


# ---------------------------------------------------------------------- errors


class SecondField(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return 0


def test_window_without_event_time_is_refused() -> None:
    env = local_env()
    keyed = env.from_source(ArrowNumberSequenceSource(1, 10), source_name="n").key_by("value")
    with pytest.raises(InvalidProgramError, match=r"needs event time.*with_timestamp_column\('ts'\)"):
        keyed.window(TumblingEventTimeWindows.of(Time.seconds(1)))


def test_a_processing_time_window_on_batches_is_refused() -> None:
    env = local_env()
    keyed = env.from_source(generated({"ts": lambda i: i}), strategy(), "n").key_by("ts")
    with pytest.raises(
        InvalidProgramError,
        match=r"TumblingEventTimeWindows, SlidingEventTimeWindows or EventTimeSessionWindows.*to_records",
    ):
        keyed.window(ProcessingTimeSessionWindows.with_gap(Time.seconds(1)))


def test_a_per_record_assigner_on_a_batch_source_is_refused() -> None:
    env = local_env()
    assigned = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(SecondField())
    with pytest.raises(
        InvalidProgramError, match=r"per-record TimestampAssigner.*with_timestamp_column\('ts'\)"
    ):
        env.from_source(ArrowNumberSequenceSource(1, 10), assigned, "n")
    with pytest.raises(InvalidProgramError, match=r"does not say where.*with_timestamp_column"):
        env.from_source(ArrowNumberSequenceSource(1, 10), WatermarkStrategy.for_monotonous_timestamps(), "n")
    with pytest.raises(ValueError, match="not both"):
        strategy().with_timestamp_assigner(SecondField())


def test_a_timestamp_column_on_a_record_source_is_refused() -> None:
    env = local_env()
    from chandy.connectors.number_sequence import NumberSequenceSource

    with pytest.raises(InvalidProgramError, match=r"produces records.*with_timestamp_assigner"):
        env.from_source(NumberSequenceSource(1, 10), strategy(), "n")
    with pytest.raises(InvalidProgramError, match=r"carries records: use with_timestamp_assigner"):
        env.from_sequence(1, 10).assign_timestamps_and_watermarks(strategy())


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"time": lambda i: i}, r"event time from column 'ts'.*no such column.*\['time'\]"),
        ({"ts": lambda i: pa.array(np.where(i % 2 == 0, i, 0), mask=i % 2 == 1)}, r"'ts' has \d+ null"),
        ({"ts": lambda i: i.astype(str)}, r"'ts' is string; it must hold int64 epoch milliseconds"),
    ],
    ids=["missing", "null", "string"],
)
def test_a_bad_timestamp_column_fails_the_job_naming_it(columns: dict[str, Any], message: str) -> None:
    env = local_env()
    env.configure({"restart-strategy.type": "none"})
    source = env.from_source(generated(columns), strategy(), "rows")
    with pytest.raises(JobExecutionError) as failure:
        source.map_batches(lambda b: b).print()
        env.execute("bad timestamps")
    assert_caused_by(failure.value, message)


def assert_caused_by(error: BaseException, message: str) -> None:
    """``error`` or one of its causes says ``message`` (a regular expression)."""
    cause: BaseException | None = error
    messages = []
    while cause is not None:
        messages.append(str(cause))
        cause = cause.__cause__
    assert any(re.search(message, m) for m in messages), messages


# ---------------------------------------------------------------------- restores in detail


class OnlyLateRow(MapBatchesFunction):
    """The second run's rows: none of the input's (``drop``) or all of them, and in subtask
    0's first batch one late row ``(key 0, ts 0, LATE_VALUE)`` (``late``)."""

    def __init__(self, drop: bool = False, late: bool = False, value_type: str = "int64") -> None:
        self.drop, self.late, self.value_type = drop, late, value_type

    def open(self, runtime_context: Any) -> None:
        self.pending_late = self.late and runtime_context.get_index_of_this_subtask() == 0

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rows = typed_rows(batch, self.value_type)
        if self.drop:
            rows = rows.slice(0, 0)
        if self.pending_late:
            self.pending_late = False
            rows = with_a_late_row(rows)
        return rows


LATE_VALUE = 1_000_000


def with_a_late_row(rows: pa.RecordBatch) -> pa.RecordBatch:
    """``rows`` and one more, ``(key 0, value LATE_VALUE, ts 0)``: late for any window by then."""
    late = pa.RecordBatch.from_pydict({"key": [0], "value": [LATE_VALUE], "ts": [0]}, schema=rows.schema)
    return pa.Table.from_batches([rows, late]).combine_chunks().to_batches()[0]


def typed_rows(batch: pa.RecordBatch, value_type: str) -> pa.RecordBatch:
    rows = keyed_rows(batch)
    return rows.set_column(1, "value", rows.column("value").cast(value_type))


class TypedRows(FailOnce):
    """:class:`FailOnce`'s pacing, its rows' value column as ``value_type`` (of Arrow type
    null, only nulls, in its first batch if ``null_first``)."""

    def __init__(self, until: str, value_type: str, delay_s: float = 0.05, null_first: bool = False) -> None:
        super().__init__(until, delay_s=delay_s)
        self.value_type = value_type
        self.null_first = null_first

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rows = super().map_batch(batch)
        if self.null_first:
            self.null_first = False
            return rows.set_column(1, "value", pa.nulls(rows.num_rows))
        return rows.set_column(1, "value", rows.column("value").cast(self.value_type))


def restore_job(
    env: StreamExecutionEnvironment,
    n: int,
    rows: MapBatchesFunction,
    function: str = "sum",
    lateness: int = 0,
) -> Any:
    """:func:`window_job`'s graph (same uids) with ``function`` and ``lateness``; each output
    row says the Arrow type of its aggregate column (``type``)."""
    result = getattr(windowed_rows(env, n, rows, lateness), function)("value").uid("window")
    return result.map_batches(
        lambda b: b.append_column("type", pa.array([str(b.column("value").type)] * b.num_rows))
    )


def first_run_with_pending_windows(
    tmp_path: Path, job: Any, via: str, parallelism: int = 2
) -> tuple[list[Any], str]:
    """A paced first run at ``parallelism`` with windows emitted and others pending, ended by
    a savepoint or cancelled keeping its latest checkpoint; its output and the restore path."""
    checkpoints = tmp_path / "first"
    env = batch_env(
        "local",
        parallelism,
        str(checkpoints),
        **{"execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"},
    )
    results = job(env).execute_and_collect("first run")
    client = results.job_client
    first, reader = drain(results)
    wait_for(lambda: len(first) >= 2 * KEYS, "windows emitted", 120)
    done = int(client.get_checkpoint_statistics(timeout=60)["counts"]["completed"])
    wait_for(
        lambda: client.get_checkpoint_statistics(timeout=60)["counts"]["completed"] >= done + 2,
        "checkpoints after the first windows",
        120,
    )
    if via == "checkpoint":
        cancel_keeping_results(results, reader)
        return first, str(latest_checkpoint_dir(checkpoints))
    savepoint = client.stop_with_savepoint(savepoint_directory=str(tmp_path / "sp")).result(120)
    reader.join(60)
    assert not reader.is_alive()
    results.close()
    return first, savepoint


@pytest.mark.slow
@pytest.mark.parametrize(("function", "null_first"), [("min", False), ("max", False), ("max", True)])
def test_a_restored_window_firing_before_any_batch_keeps_the_column_type(
    tmp_path: Path, function: str, null_first: bool
) -> None:
    """int32 values: the first run's min/max are int32; the second run (restored from a
    savepoint at another parallelism) gets no rows at all, so its windows fire from restored
    state alone, and are int32 too (the type is in the state, not learnt from a batch). With
    ``null_first`` each subtask's first batch has a value column of only nulls (Arrow type
    null): the windows made after it learn the type."""
    n = 200_000
    gate = str(tmp_path / "never")
    first, savepoint = first_run_with_pending_windows(
        tmp_path,
        lambda env: restore_job(env, n, TypedRows(gate, "int32", null_first=null_first), function),
        "savepoint",
    )
    env2 = batch_env("local", 3, str(tmp_path / "second"))
    env2.set_restore_path(savepoint)
    second, _ = run(restore_job(env2, n, OnlyLateRow(drop=True, value_type="int32"), function), "second run")
    assert first and second
    assert {r.type for r in first} == {"int32"}
    assert {r.type for r in second} == {"int32"}


@pytest.mark.slow
def test_a_retained_checkpoint_restores_every_window_once_at_another_parallelism(tmp_path: Path) -> None:
    """Cancelled at parallelism 2 keeping its latest checkpoint (windows pending in it), the
    job restores at parallelism 3 and reads to the end: every (key, window) exact, once."""
    n = 200_000
    gate = str(tmp_path / "never")
    first, checkpoint = first_run_with_pending_windows(
        tmp_path, lambda env: window_job(env, n, FailOnce(gate)), "checkpoint"
    )
    assert len(first) < n // WINDOW_MS * KEYS  # windows were pending
    env2 = batch_env("local", 3, str(tmp_path / "second"))
    env2.set_restore_path(checkpoint)
    second, client = run(window_job(env2, n, FailOnce(str(tmp_path))), "second run")
    assert client.get_checkpoint_statistics()["counts"]["restored"] == 1
    assert_windows_exact(first + second, n)


@pytest.mark.slow
@pytest.mark.parametrize("via", ["checkpoint", "savepoint"])
def test_allowed_lateness_across_a_restore(tmp_path: Path, via: str) -> None:
    """Allowed lateness longer than the whole input, so every window stays in the state: the
    windows that fired before the checkpoint are not emitted again after the restore (their
    keys' ``fired`` markers), except key 0's first window, which gets a late row in the
    second run's first batch (before the restored job's first watermark) and fires again
    with it; every (key, window)'s last value is exact."""
    n = 50_000
    gate = str(tmp_path / "never")
    lateness = 2 * n
    first, path = first_run_with_pending_windows(
        tmp_path,
        lambda env: restore_job(env, n, TypedRows(gate, "int64", delay_s=0.1), lateness=lateness),
        via,
    )
    assert any((r.key, r.window_start) == (0, 0) for r in first)  # fired before the checkpoint
    env2 = batch_env("local", 3, str(tmp_path / "second"))
    env2.set_restore_path(path)
    second, _ = run(restore_job(env2, n, OnlyLateRow(late=True), lateness=lateness), "second run")

    emitted: dict[tuple[int, int], list[int]] = defaultdict(list)
    for r in first + second:
        emitted[(r.key, r.window_start)].append(r.value)
    expected = expected_sums(n)
    expected[(0, 0)] += LATE_VALUE
    assert {w: v[-1] for w, v in emitted.items()} == expected
    assert emitted[(0, 0)] == [expected[(0, 0)] - LATE_VALUE, expected[(0, 0)]]
    again = {w: v for w, v in emitted.items() if len(v) > 1 and w != (0, 0)}
    assert not again, list(again.items())[:5]


def test_a_window_follows_the_late_side_output_directly() -> None:
    """The late rows of a 100 ms window carry the input's event-time column, so a window with
    a longer allowed lateness counts them without assign_timestamps_and_watermarks."""
    env = local_env()
    env.configure({"pipeline.auto-watermark-interval": 1, "chandy.network.arrow-batch-size": 200})
    rows = Rows(4_000, keys=3, jitter=600, seed=11)
    source = env.from_source(ArrowDataGeneratorSource(rows, count=len(rows.ts)), strategy(), "rows")
    late = OutputTag("late")
    counts = (
        source.map_batches(Pace())
        .key_by("key")
        .window(TumblingEventTimeWindows.of(Time.milliseconds(100)))
        .side_output_late_data(late)
        .count()
    )
    recounted = (
        counts.get_side_output(late)
        .key_by("key")
        .window(TumblingEventTimeWindows.of(Time.milliseconds(100)))
        .allowed_lateness(10_000)
        .count()
        .map_batches(
            lambda b: {
                "kind": pa.array(["late"] * b.num_rows),
                "n": b["count"],
                "key": b["key"],
                "window_start": b["window_start"],
            }
        )
    )
    on_time = counts.map_batches(
        lambda b: {
            "kind": pa.array(["on time"] * b.num_rows),
            "n": b["count"],
            "key": b["key"],
            "window_start": b["window_start"],
        }
    )
    out, _ = run(on_time.union(recounted), "a window after the late side output")
    final: dict[tuple[str, int, int], int] = {}
    for r in out:
        final[(r.kind, r.key, r.window_start)] = r.n  # a late window's last firing counts them all
    late_total = sum(n for (kind, *_), n in final.items() if kind == "late")
    on_time_total = sum(n for (kind, *_), n in final.items() if kind == "on time")
    assert late_total, "no late rows: the watermarks did not fall between the batches"
    assert late_total + on_time_total == len(rows.ts)


FIRST_WINDOWS = Path(__file__).parent / "data" / "batch-window-v1"


class Int32Rows(MapBatchesFunction):
    """``tests/data/batch-window-v1``'s rows: key, value as int32, ts."""

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return typed_rows(batch, "int32")


@pytest.mark.slow
def test_a_savepoint_of_the_first_batch_windows_still_restores(tmp_path: Path) -> None:
    """A savepoint written before the output type was in the window state (see
    ``tests/data/batch-window-v1``) restores at another parallelism: the windows that had
    fired (kept for their lateness) are not emitted again, every pending one fires once with
    its exact maximum, and in the column's type."""
    n = 200_000
    savepoint = tmp_path / "savepoint"
    shutil.copytree(FIRST_WINDOWS / "savepoint", savepoint)
    first = [tuple(row) for row in json.loads((FIRST_WINDOWS / "emitted.json").read_text())]
    # signed by the deployment that wrote it; its origin is known: trusted deliberately
    env = batch_env(
        "local", 3, str(tmp_path / "checkpoints"), **{"execution.state-recovery.trust-snapshot": True}
    )
    env.set_restore_path(str(savepoint))
    source = env.from_source(ArrowNumberSequenceSource(1, n), source_name="numbers").uid("numbers")
    maxima = (
        source.map_batches(Int32Rows())
        .uid("rows")
        .assign_timestamps_and_watermarks(strategy(50))
        .uid("event time")
        .key_by("key")
        .window(TumblingEventTimeWindows.of(Time.milliseconds(WINDOW_MS)))
        .allowed_lateness(1000)
        .max("value")
        .uid("window")
    )
    typed = maxima.map_batches(
        lambda b: b.append_column("type", pa.array([str(b.column("value").type)] * b.num_rows))
    )
    second, client = run(typed, "restore of the first batch windows")
    assert client.get_checkpoint_statistics()["counts"]["restored"] == 1
    assert {r.type for r in second} == {"int32"}
    emitted = Counter([*((k, s) for k, s, _ in first), *((r.key, r.window_start) for r in second)])
    assert max(emitted.values()) == 1, [w for w, c in emitted.items() if c > 1][:5]
    got = {(k, s): v for k, s, v in first} | {(r.key, r.window_start): r.value for r in second}
    assert got == expected_sums(n, max)
