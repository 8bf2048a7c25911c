"""Acceptance tests of the batch path (issue 17) in real jobs, on the local executor and on Spark.

- The batch path computes what the record path computes: the same seeded random input through
  ``key_by("key").running_sum("value")`` and through ``key_by(...).sum(...)`` gives every key
  the same running sums, in the same order.
- Exactly once across failures: a raised exception (and on Spark a SIGKILLed slot) while
  checkpoints run every 100 ms; the running sums, the per-batch aggregations and a
  ``process_batches`` function with columnar state come out as if nothing had failed.
- A retained checkpoint (2 -> 3 subtasks) and a savepoint (3 -> 1) restore the columnar state
  at another parallelism: every key's sums go on from the restored values.
- A mixed job: records -> ``to_batches()`` -> a keyed batch aggregation -> ``to_records()`` -> a
  keyed record function, exact; a key meets both keyed operators in the same subtask.

The checks read the output per key. A running sum's consecutive differences are the values
the key received, so a lost record, a record counted twice or state that did not continue
from the checkpoint shows up as a difference that is not one of the key's values.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chandy import StreamExecutionEnvironment
from chandy.api.batch_stream import BatchStream
from chandy.connectors.arrow_sources import ArrowDataGeneratorSource, ArrowNumberSequenceSource
from chandy.core.functions import (
    KeyedBatchFunction,
    KeyedBatchState,
    KeyedProcessFunction,
    MapBatchesFunction,
    RuntimeContext,
)
from chandy.core.state import ValueStateDescriptor
from chandy.core.types import Row
from tests.jobs import HoldingSequence, kill_a_slot_after_checkpoints, release
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too
from tests.test_checkpointing_e2e import (
    cancel_keeping_results,
    drain,
    latest_checkpoint_dir,
    wait_for_checkpoints,
)
from tests.test_unaligned_checkpoints_e2e import run
from tests.unaligned_jobs import completed_checkpoints, wait_for

#: End-to-end jobs on both executors, seconds each.
pytestmark = pytest.mark.slow

#: Keys of the sequence jobs: value ``v`` has key ``v % KEYS``.
KEYS = 97
#: Rows per Arrow batch in the paced jobs: small, so that a paced source hands out many batches
#: and checkpoints fall between them.
BATCH_ROWS = 500


def batch_env(
    executor: str, parallelism: int, interval_ms: int = 100, **config: Any
) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    if interval_ms:
        env.enable_checkpointing(interval_ms)
    env.configure(
        {
            "restart-strategy.fixed-delay.delay": 50,
            "web.checkpoints.history": 10_000,
            "chandy.network.arrow-batch-size": BATCH_ROWS,
            **config,
        }
    )
    return env


def by_key(pairs: Iterable[tuple[Any, Any]]) -> dict[Any, list[Any]]:
    """The values of each key, in the order they came."""
    grouped: dict[Any, list[Any]] = defaultdict(list)
    for key, value in pairs:
        grouped[key].append(value)
    return dict(grouped)


def prefix_sums(values: Iterable[int]) -> list[int]:
    return np.cumsum(np.fromiter(values, dtype=np.int64)).tolist()


# ---------------------------------------------------------------------- same results as the record path


class RandomRows:
    """Row ``i`` of a seeded random table (``key``, ``value``): the generator of an
    ``ArrowDataGeneratorSource``, and the same rows as a list for the record path."""

    def __init__(self, n: int, key_type: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        ints = rng.integers(-300, 300, size=n)
        self.keys: np.ndarray = ints if key_type == "int" else np.array([f"key-{k}" for k in ints])
        self.values: np.ndarray = rng.integers(-1_000, 1_000_000, size=n)

    def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {"key": self.keys[indices], "value": self.values[indices]}

    def records(self) -> list[tuple[Any, int]]:
        return list(zip(self.keys.tolist(), self.values.tolist(), strict=True))


@pytest.mark.parametrize("key_type", ["int", "str"])
def test_running_sums_on_the_batch_path_equal_the_record_paths(executor: str, key_type: str) -> None:
    """One source subtask (each key's rows in input order) into keyed operators of two subtasks:
    every key's running sums are the same multiset, and the same sequence, on both paths,
    and equal to the sums computed here."""
    rows = RandomRows(20_000, key_type, seed=17 if key_type == "int" else 18)
    expected = {key: prefix_sums(values) for key, values in by_key(rows.records()).items()}

    env = batch_env(executor, 2, interval_ms=0)
    source = env.from_source(ArrowDataGeneratorSource(rows, count=len(rows.values)), source_name="rows")
    assert isinstance(source, BatchStream)
    source.set_parallelism(1)
    batch_out, _ = run(source.key_by("key").running_sum("value"), "batch running sums")

    env = batch_env(executor, 2, interval_ms=0)
    record_out, _ = run(env.from_collection(rows.records()).key_by(lambda r: r[0]).sum(1), "record sums")

    assert all(isinstance(row, Row) for row in batch_out)
    batch_sums = by_key((row["key"], row["value"]) for row in batch_out)
    record_sums = by_key((key, total) for key, total in record_out)
    assert {k: Counter(v) for k, v in batch_sums.items()} == {k: Counter(v) for k, v in record_sums.items()}
    assert batch_sums == record_sums == expected


# ---------------------------------------------------------------------- exactly once across failures


def completed_checkpoints_on_disk(directory: str) -> int:
    """The id of the latest checkpoint whose metadata is written (0 before the first)."""
    ids = [int(p.parent.name.split("-")[1]) for p in Path(directory).glob("*/chk-*/_metadata")]
    return max(ids, default=0)


class PacedKeys(MapBatchesFunction):
    """Adds ``key = value % KEYS`` to each batch; sleeps ``delay_s`` per batch until the file
    ``until`` exists (so the test can act while the job runs, then let it finish at full
    speed); with ``fail_after``, raises once over every attempt (the probe counts), at its first
    batch after that many checkpoints completed."""

    def __init__(
        self,
        delay_s: float,
        until: str,
        probe: Probe | None = None,
        checkpoints: str | None = None,
        fail_after: int = 0,
    ) -> None:
        self.delay_s = delay_s
        self.until = until
        self.probe = probe
        self.checkpoints = checkpoints
        self.fail_after = fail_after
        self.armed = probe is not None
        self.released = False

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if not self.released:
            if Path(self.until).exists():
                self.released = True
            else:
                time.sleep(self.delay_s)
        if (
            self.armed
            and self.checkpoints
            and completed_checkpoints_on_disk(self.checkpoints) >= self.fail_after
        ):
            self.armed = False
            assert self.probe is not None
            if self.probe.add("failures") == 1:
                raise RuntimeError("induced failure in map_batches")
        keys = pc.remainder(batch.column("value"), KEYS)
        return batch.append_column("key", keys)


def tagged(kind: str) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """A ``map_batches`` function naming the branch a batch came from."""

    def tag(batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.append_column("kind", pa.array([kind] * batch.num_rows, pa.string()))

    return tag


class CountAndTotal(KeyedBatchFunction):
    """A ``process_batches`` function: per key a count and a total in columnar state, one
    output row per key and batch with both after the batch."""

    def process_batch(self, batch: pa.RecordBatch, state: KeyedBatchState) -> dict[str, Any]:
        values = batch.column("value").to_numpy()
        starts = np.asarray(state.offsets)[:-1]
        sizes = np.diff(np.asarray(state.offsets))
        new = np.asarray(state.is_new())
        count = np.where(new, 0, state["count"]) + sizes
        total = np.where(new, 0, state["total"]) + np.add.reduceat(values, starts)
        state["count"] = count
        state["total"] = total
        return {"key": state.keys, "count": count, "total": total}


STATE_SCHEMA = pa.schema([("count", pa.int64()), ("total", pa.int64())])
KINDS = ("running_sum", "sum", "count", "mean", "process")


def fan_out_job(env: StreamExecutionEnvironment, n: int, paced: PacedKeys) -> Any:
    """``1..n`` with ``key = value % KEYS``, into five keyed batch operators (running sum, sum,
    count, mean, ``process_batches``), each tagged, in one collected union. Every operator has
    a uid, so a restore at another parallelism finds its state."""
    keyed = (
        env.from_source(ArrowNumberSequenceSource(1, n), source_name="numbers")
        .uid("numbers")
        .map_batches(paced)
        .uid("paced keys")
        .key_by("key")
    )
    branches = {
        "running_sum": keyed.running_sum("value"),
        "sum": keyed.sum("value"),
        "count": keyed.count(),
        "mean": keyed.mean("value"),
        "process": keyed.process_batches(CountAndTotal(), STATE_SCHEMA),
    }
    tagged_branches = [
        stream.uid(kind).map_batches(tagged(kind)).uid(f"tag {kind}") for kind, stream in branches.items()
    ]
    first, *rest = tagged_branches
    return first.union(*rest)


def assert_exact(out: list[Row], n: int) -> None:
    """Every branch's output of :func:`fan_out_job` is that of a run without failures."""
    kinds = Counter(row["kind"] for row in out)
    assert set(kinds) == set(KINDS), kinds
    values = by_key((v % KEYS, v) for v in range(1, n + 1))
    totals = {key: sum(vs) for key, vs in values.items()}
    running = by_key((row["key"], row["value"]) for row in out if row["kind"] == "running_sum")
    assert set(running) == set(values)
    for key, sums in running.items():
        received = np.diff(np.asarray([0, *sums], dtype=np.int64))
        assert sorted(received.tolist()) == values[key], f"key {key}: running sums lost or repeated values"
    for kind, field, final in (
        ("sum", "value", totals),
        ("count", "count", {k: len(vs) for k, vs in values.items()}),
        ("process", "count", {k: len(vs) for k, vs in values.items()}),
        ("process", "total", totals),
    ):
        series = by_key((row["key"], row[field]) for row in out if row["kind"] == kind)
        assert {k: s[-1] for k, s in series.items()} == final, (kind, field)
        assert all(np.all(np.diff(s) > 0) for s in series.values()), f"{kind}: {field} went back or repeated"
    means = by_key((row["key"], row["value"]) for row in out if row["kind"] == "mean")
    assert {k: s[-1] for k, s in means.items()} == pytest.approx(
        {k: totals[k] / len(values[k]) for k in values}
    )


#: Unaligned checkpoints, each one unaligned (no timeout): in-flight RecordBatches become
#: Arrow channel state.
UNALIGNED = {
    "execution.checkpointing.unaligned.enabled": True,
    "execution.checkpointing.aligned-checkpoint-timeout": 0,
}


@on_rocksdb_too(executor=("local",))  # the batch operators' state stays columnar whatever the backend
@pytest.mark.parametrize("checkpoints_kind", ["aligned", "unaligned"])
def test_exactly_once_through_failures(tmp_path: Path, executor: str, checkpoints_kind: str) -> None:
    """Checkpoints every 100 ms (aligned, or all unaligned); map_batches raises once after two
    completed; on Spark a slot process is then SIGKILLed two checkpoints after the restore.
    Every branch is exact."""
    n = 200_000  # paced to 10,000 rows/s per subtask until released: 10 s at most
    probe = Probe()
    gate = str(tmp_path / "release")
    checkpoints = str(tmp_path / "checkpoints")
    unaligned_config = UNALIGNED if checkpoints_kind == "unaligned" else {}
    env = batch_env(executor, 2, **{"execution.checkpointing.dir": checkpoints, **unaligned_config})
    paced = PacedKeys(0.05, gate, probe, checkpoints, fail_after=2)
    results = fan_out_job(env, n, paced).execute_and_collect("batch exactly once")
    client = results.job_client

    def act() -> None:
        try:
            wait_for(lambda: probe.get("failures") >= 1 or client.is_done(), "the induced failure", 120)
            if executor == "spark":
                completed = client.get_checkpoint_statistics(timeout=60)["counts"]["completed"]
                kill_a_slot_after_checkpoints(client, completed + 2)
                wait_for(lambda: client.restarts >= 2 or client.is_done(), "the restart after the kill", 120)
            done = client.get_checkpoint_statistics(timeout=60)["counts"]["completed"]
            wait_for(
                lambda: (
                    client.get_checkpoint_statistics(timeout=60)["counts"]["completed"] >= done + 2
                    or client.is_done()
                ),
                "checkpoints after the restore",
                120,
            )
        finally:
            release(gate)

    actor = threading.Thread(target=act, daemon=True)
    actor.start()
    with results:
        out = list(results)
    client.get_job_execution_result(timeout=120)
    actor.join(60)

    assert probe.get("failures") >= 1
    assert client.restarts >= (2 if executor == "spark" else 1)
    stats = client.get_checkpoint_statistics()
    assert stats["counts"]["restored"] >= client.restarts  # every failure came back from a checkpoint
    kinds = [c["is_unaligned"] for c in completed_checkpoints(stats)]
    assert kinds and all(unaligned == bool(unaligned_config) for unaligned in kinds), kinds
    assert_exact(out, n)


# ---------------------------------------------------------------------- restore at another parallelism


@pytest.mark.parametrize(("first_p", "second_p", "via"), [(2, 3, "checkpoint"), (3, 1, "savepoint")])
def test_columnar_state_restores_at_another_parallelism(
    tmp_path: Path, executor: str, first_p: int, second_p: int, via: str
) -> None:
    """A paced first run keeps a checkpoint (cancelled with RETAIN_ON_CANCELLATION) or stops
    with a savepoint; the second run restores it at another parallelism and reads to the end:
    every key's sums, counts, means and process_batches state continue from the restored ones."""
    n = 200_000
    gate = str(tmp_path / "never")  # the first run stays paced
    retain = {
        "execution.checkpointing.dir": str(tmp_path / "first"),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    }
    env = batch_env(executor, first_p, interval_ms=100, **retain)
    # paced to 10,000 rows/s per subtask: 6.7 s at least at 3 subtasks, ended long before
    results = fan_out_job(env, n, PacedKeys(0.05, gate)).execute_and_collect("first run")
    first, reader = drain(results)
    client = results.job_client
    wait_for_checkpoints(tmp_path / "first", 1)  # on disk: the latest only (older ones are subsumed)
    wait_for(
        lambda: client.get_checkpoint_statistics(timeout=60)["counts"]["completed"] >= 2, "two checkpoints"
    )
    wait_for(lambda: len({row["kind"] for row in first}) == len(KINDS), "output of every branch")
    if via == "checkpoint":
        cancel_keeping_results(results, reader)
        restore_path = str(latest_checkpoint_dir(tmp_path / "first"))
    else:
        restore_path = client.stop_with_savepoint(savepoint_directory=str(tmp_path / "sp")).result(120)
        reader.join(60)
        assert not reader.is_alive()
        results.close()
    assert sum(1 for row in first if row["kind"] == "running_sum") < n  # the first run did not end

    env2 = batch_env(
        executor, second_p, interval_ms=100, **{"execution.checkpointing.dir": str(tmp_path / "second")}
    )
    env2.set_restore_path(restore_path)
    second, client = run(fan_out_job(env2, n, PacedKeys(0.0, gate)), "second run")

    assert client.get_checkpoint_statistics()["counts"]["restored"] == 1
    assert_exact(first + second, n)


# ---------------------------------------------------------------------- mixed job


class SubtaskOfKey(MapBatchesFunction):
    """Adds the subtask index of the batch operator the rows passed (``batch_subtask``)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.subtask = runtime_context.get_index_of_this_subtask()

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.append_column("batch_subtask", pa.array([self.subtask] * batch.num_rows, pa.int64()))


class RecordsSeen(KeyedProcessFunction):
    """The record path's keyed step after ``to_records()``: per key the rows seen so far (in
    a ValueState), emitted with the row's running sum and both subtask indices."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen"))
        self.subtask = runtime_context.get_index_of_this_subtask()

    def process_element(self, row: Row, ctx: KeyedProcessFunction.Context) -> Any:
        seen = (self.seen.value() or 0) + 1
        self.seen.update(seen)
        yield row.key, row.value, seen, row.batch_subtask, self.subtask


def mixed_records() -> list[tuple[int, int]]:
    rng = np.random.default_rng(23)
    keys, values = rng.integers(0, 400, 10_000), rng.integers(1, 100, 10_000)
    return [(int(k), int(v)) for k, v in zip(keys, values, strict=True)]


def mixed_job(
    env: StreamExecutionEnvironment, records: list[tuple[int, int]], hold_after: int | None = None
) -> Any:
    """the records (the first ``hold_after`` only, then none until cancelled: see
    :class:`HoldingSequence`) -> to_batches() -> key_by("key").running_sum("value") -> map_batches
    -> to_records() -> key_by(row.key).process(...). The source and to_batches have one subtask,
    so each key's rows stay in order."""
    schema = pa.schema([("key", pa.int64()), ("value", pa.int64())])
    return (
        env.from_source(HoldingSequence(0, len(records) - 1, hold_after), source_name="positions")
        .uid("records")
        .set_parallelism(1)
        .map(lambda i: records[i])
        .uid("pace")
        .set_parallelism(1)
        .to_batches(schema)
        .uid("to batches")
        .set_parallelism(1)
        .key_by("key")
        .running_sum("value")
        .uid("running sum")
        .map_batches(SubtaskOfKey())
        .uid("subtask")
        .to_records()
        .uid("to records")
        .key_by(lambda row: row.key)
        .process(RecordsSeen())
        .uid("seen")
    )


def assert_mixed_exact(out: list[tuple[Any, ...]], records: list[tuple[int, int]], subtasks: int) -> None:
    """Every key's running sums and the record path's counts, in order; each key met both keyed
    steps in the same subtask (the key hash is one on both paths)."""
    values = by_key(records)
    got = by_key((key, (total, seen)) for key, total, seen, _, _ in out)
    assert got == {
        key: list(zip(prefix_sums(vs), range(1, len(vs) + 1), strict=True)) for key, vs in values.items()
    }
    met = {(batch_subtask, record_subtask) for _, _, _, batch_subtask, record_subtask in out}
    assert all(a == b for a, b in met), met
    assert {a for a, _ in met} == set(range(subtasks))  # every subtask had keys


def test_a_mixed_job_crosses_from_records_to_batches_and_back(executor: str) -> None:
    """Records -> batches -> a keyed batch aggregation -> records -> a keyed record function: exact."""
    records = mixed_records()
    out, _ = run(mixed_job(batch_env(executor, 2, interval_ms=0), records), "mixed")
    assert_mixed_exact(out, records, 2)


def test_a_mixed_job_restores_its_record_and_columnar_state_at_another_parallelism(
    tmp_path: Path, executor: str
) -> None:
    """The mixed job keeps a checkpoint at 2 subtasks and restores it at 3: the columnar running
    sums and the record path's ValueState both go on, and a key still meets both keyed steps in
    one subtask (key groups mean the same in either state)."""
    records = mixed_records()
    retain = {
        "execution.checkpointing.dir": str(tmp_path / "first"),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    }
    half = len(records) // 2  # the first run holds there: it is still running when it is cancelled
    results = mixed_job(batch_env(executor, 2, **retain), records, hold_after=half).execute_and_collect(
        "first"
    )
    first, reader = drain(results)
    wait_for_checkpoints(tmp_path / "first", 1)
    wait_for(lambda: len(first) > 100, "the first run's output")
    cancel_keeping_results(results, reader)
    assert len(first) <= half

    env2 = batch_env(executor, 3, **{"execution.checkpointing.dir": str(tmp_path / "second")})
    env2.set_restore_path(str(latest_checkpoint_dir(tmp_path / "first")))
    second, client = run(mixed_job(env2, records), "second")

    assert client.get_checkpoint_statistics()["counts"]["restored"] == 1
    assert_mixed_exact(first + second, records, 3)
