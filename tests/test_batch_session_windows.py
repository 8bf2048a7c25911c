"""Event-time session windows on the batch (Arrow) path:
``KeyedBatchStream.window(EventTimeSessionWindows.with_gap(...))``.

- The same seeded, out-of-order input through the batch sessions and the record path's
  sessions in one job (one source: both see the same rows and watermarks in the same order),
  for several gaps, with and without allowed lateness: the same sessions with the same
  aggregates, and the same late rows.
- Exactly once through a raised exception after a completed checkpoint, then a savepoint and
  a restore at another parallelism.
- The errors a user can cause.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from chandy import BatchAggregateFunction, StreamExecutionEnvironment
from chandy.connectors.arrow_sources import ArrowNumberSequenceSource
from chandy.connectors.sinks import DiscardingSink
from chandy.core.functions import MapBatchesFunction
from chandy.core.time import Time
from chandy.core.windows import EventTimeSessionWindows, TumblingEventTimeWindows
from chandy.errors import InvalidProgramError, JobExecutionError
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too
from tests.test_batch_windows import (
    FUNCTIONS,
    LATE_VALUE,
    FailOnce,
    Rows,
    SumOfSquares,
    assert_caused_by,
    batch_env,
    both_paths,
    fail_then_stop_with_savepoint,
    firings,
    first_run_with_pending_windows,
    generated,
    is_subsequence,
    local_env,
    strategy,
    with_a_late_row,
)
from tests.test_unaligned_checkpoints_e2e import run


class Windows:
    """Emitted windows by kind and key, to ask whether one lies inside another."""

    def __init__(self, windows: Iterable[tuple[Any, ...]]) -> None:
        self.by_key: dict[tuple[Any, Any], list[tuple[int, int]]] = {}
        for kind, key, start, end in windows:
            self.by_key.setdefault((kind, key), []).append((start, end))

    def inside(self, window: tuple[Any, ...]) -> bool:
        """Whether ``(kind, key, start, end)`` lies inside another window of its kind and key."""
        kind, key, start, end = window
        return any(
            s <= start and e >= end and (s, e) != (start, end) for s, e in self.by_key.get((kind, key), ())
        )


@pytest.mark.parametrize(
    ("gap", "lateness"),
    [
        pytest.param(5, 0, marks=pytest.mark.slow),
        (40, 0),
        pytest.param(5, 150, marks=pytest.mark.slow),
        (40, 150),
    ],
)
def test_batch_sessions_equal_the_record_paths(gap: int, lateness: int) -> None:
    """Both paths in one job at parallelism 1, the batch path with every built-in aggregate
    and a user aggregate with a ``merge``. Without allowed lateness every session is
    emitted once on both paths. With it a session that takes late rows is emitted again (and
    may grow) once per late record on the record path and once per batch here: every batch
    emission is one of the record path's, in the same order, and the final sessions and their
    values are the same. Late rows go to the side output on both paths alike."""
    rows = Rows(6_000, keys=7, jitter=600, seed=11 + gap + lateness)
    out = both_paths(
        rows, EventTimeSessionWindows.with_gap(Time.milliseconds(gap)), lateness, user_aggregate=True
    )
    batch, reference = firings(out, "batch"), firings(out, "record")
    assert {k[0] for k in batch} == {*FUNCTIONS, "squares"}  # "squares": aggregate() with a merge
    if lateness == 0:
        assert set(batch) == set(reference)
        for window, values in reference.items():
            assert batch[window] == pytest.approx(values), window
    else:
        # A record-path emission the batch path lacks is a session that grew later in the
        # same batch: it lies inside one the batch path emitted.
        assert set(batch) <= set(reference)
        emitted = Windows(batch)
        grown = set(reference) - set(batch)
        for window in grown:
            assert emitted.inside(window), window
        again = [w for w, values in batch.items() if len(values) > 1]
        assert grown and again, "no late row joined a fired session: lateness was not exercised"
        for window, values in batch.items():
            mine, theirs = [round(v, 6) for v in values], [round(v, 6) for v in reference[window]]
            assert is_subsequence(mine, theirs), (window, mine, theirs)
            if not emitted.inside(window):  # it did not grow: its last value is the same
                assert mine[-1] == theirs[-1], (window, mine, theirs)
    late = Counter((kind, key, ts, value) for origin, kind, key, ts, _, value in out if origin == "late")
    late_batch_rows = Counter({(k, ts, v): n for (kind, k, ts, v), n in late.items() if kind == "batch"})
    late_record_rows = Counter({(k, ts, v): n for (kind, k, ts, v), n in late.items() if kind == "record"})
    assert late_batch_rows == late_record_rows
    assert late_batch_rows, "no late rows: the watermarks did not fall between the batches"
    if lateness == 0:  # every input row is in one session or late, never lost
        total = sum(v for (kind, *_), values in batch.items() if kind == "sum" for v in values)
        late_total = sum(value * n for (_, _, value), n in late_batch_rows.items())
        assert total + late_total == int(rows.values.sum())


# ---------------------------------------------------------------------- exactly once, restore

KEYS = 13
GAP_MS = 200
#: Value ``v`` happens at ``v + 1000 * (v // 500)`` ms: runs of 500 ms a second apart, so
#: every key has one session per run (its rows are 13 ms apart, under the gap).
RUN, PAUSE = 500, 1_000


def session_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    values = batch.column("value").to_numpy()
    return pa.RecordBatch.from_pydict(
        {"key": values % KEYS, "value": values, "ts": values + PAUSE * (values // RUN)}
    )


class FailOnceInSessions(FailOnce):
    """:class:`FailOnce`'s pacing and failure, with the rows in sessions."""

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return session_rows(super().map_batch(batch))


class SessionTotal(BatchAggregateFunction):
    """``sum("value")`` as a user aggregate (two accumulator columns, a merge and an output
    column named as the built-in's), so both give the same expected sessions."""

    def create_accumulator(self) -> dict[str, Any]:
        return {"total": 0, "rows": 0}

    def add(self, accumulator: dict[str, Any], batch: pa.RecordBatch, group_ids: Any) -> None:
        np.add.at(accumulator["total"], group_ids, batch.column("value").to_numpy())
        np.add.at(accumulator["rows"], group_ids, 1)

    def merge(self, accumulator: dict[str, Any], group_ids: Any, groups: int) -> dict[str, Any]:
        starts = np.flatnonzero(np.diff(group_ids, prepend=-1))
        return {name: np.add.reduceat(values, starts) for name, values in accumulator.items()}

    def get_result(self, accumulator: dict[str, Any]) -> dict[str, Any]:
        assert (accumulator["rows"] > 0).all()
        return {"value": accumulator["total"]}


def session_job(
    env: StreamExecutionEnvironment,
    n: int,
    rows: MapBatchesFunction,
    lateness: int = 0,
    aggregate: bool = False,
) -> Any:
    """``1..n`` as session rows into a session sum by key (uids kept across the runs); with
    ``aggregate`` the sum is :class:`SessionTotal`."""
    source = env.from_source(ArrowNumberSequenceSource(1, n), source_name="numbers").uid("numbers")
    timed = (
        source.map_batches(rows).uid("rows").assign_timestamps_and_watermarks(strategy(50)).uid("event time")
    )
    sessions = timed.key_by("key").window(EventTimeSessionWindows.with_gap(Time.milliseconds(GAP_MS)))
    sessions = sessions.allowed_lateness(lateness)
    if aggregate:
        return sessions.aggregate(SessionTotal(), {"total": "int64", "rows": "int64"}).uid("sessions")
    return sessions.sum("value").uid("sessions")


def expected_sessions(n: int) -> dict[tuple[int, int, int], int]:
    """(key, start, end) -> sum of every session of ``1..n``."""
    values = np.arange(1, n + 1)
    ts = values + PAUSE * (values // RUN)
    out: dict[tuple[int, int], list[int]] = {}
    for key, run_index, t, v in zip(
        (values % KEYS).tolist(), (values // RUN).tolist(), ts.tolist(), values.tolist(), strict=True
    ):
        start, end, total = out.get((key, run_index), [t, t, 0])
        out[(key, run_index)] = [min(start, t), max(end, t), total + v]
    return {(key, s, e + GAP_MS): total for (key, _), (s, e, total) in out.items()}


# The session states stay columnar whatever the backend; RocksDB's settings on one executor
# keep the suite's time in bounds.
@on_rocksdb_too(executor=("local",))
@pytest.mark.slow
def test_sessions_exactly_once_through_a_failure_and_a_restore_at_another_parallelism(
    tmp_path: Path, executor: str
) -> None:
    """Parallelism 2 with checkpoints every 100 ms; the paced map raises once after a
    checkpoint completed (on Spark a slot process is then SIGKILLed too); after the restarts
    and more checkpoints the job stops with a savepoint (sessions pending in it), and a second
    run restores it at parallelism 3: every session is emitted once, with the sum of its rows."""
    sessions_exactly_once(tmp_path, executor, aggregate=False)


@pytest.mark.slow
def test_a_user_aggregates_sessions_exactly_once_through_a_failure_and_a_restore(tmp_path: Path) -> None:
    """As the test above, the sum a user aggregate with two accumulator columns and a merge:
    its accumulators are checkpointed, merged across the restore and rescaled like the built-ins'."""
    sessions_exactly_once(tmp_path, "local", aggregate=True)


def sessions_exactly_once(tmp_path: Path, executor: str, aggregate: bool) -> None:
    n = 100_000
    probe = Probe()
    checkpoints = str(tmp_path / "checkpoints")
    env = batch_env(executor, 2, checkpoints)
    rows = FailOnceInSessions(str(tmp_path / "never"), probe, checkpoints)
    first, savepoint = fail_then_stop_with_savepoint(
        session_job(env, n, rows, aggregate=aggregate), probe, tmp_path, kill=executor == "spark"
    )
    expected = expected_sessions(n)
    assert len(first) < len(expected)  # stopped early: sessions were pending

    env2 = batch_env(executor, 3, str(tmp_path / "second"))
    env2.set_restore_path(savepoint)
    second, client2 = run(
        session_job(env2, n, FailOnceInSessions(str(tmp_path)), aggregate=aggregate), "second run"
    )
    assert client2.get_checkpoint_statistics()["counts"]["restored"] == 1
    emitted = Counter((r.key, r.window_start, r.window_end) for r in first + second)
    assert max(emitted.values()) == 1, [w for w, c in emitted.items() if c > 1][:5]
    assert {(r.key, r.window_start, r.window_end): r.value for r in first + second} == expected


class SessionRowsWithALateRow(MapBatchesFunction):
    """The second run's rows: the input's as session rows, and in subtask 0's first batch
    one row ``(key 0, ts 0, LATE_VALUE)`` that touches key 0's first session."""

    def open(self, runtime_context: Any) -> None:
        self.pending_late = runtime_context.get_index_of_this_subtask() == 0

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rows = session_rows(batch)
        if self.pending_late:
            self.pending_late = False
            rows = with_a_late_row(rows)
        return rows


@pytest.mark.slow
def test_allowed_lateness_across_a_restore_fires_only_the_session_that_grew(tmp_path: Path) -> None:
    """Allowed lateness longer than the input, so every session stays in the state: the
    sessions that fired before the savepoint are not emitted again after the restore (at
    another parallelism), except key 0's first, which a row of the second run touches: it
    grows to start at 0 and fires again with that row in its sum."""
    n = 20_000
    lateness = 10 * n
    first, savepoint = first_run_with_pending_windows(
        tmp_path,
        lambda env: session_job(env, n, FailOnceInSessions(str(tmp_path / "never"), delay_s=0.1), lateness),
        "savepoint",
    )
    key0 = min((s for s in expected_sessions(n) if s[0] == 0), key=lambda s: s[1])
    assert (0, key0[1], key0[2]) in {(r.key, r.window_start, r.window_end) for r in first}
    env2 = batch_env("local", 3, str(tmp_path / "second"))
    env2.set_restore_path(savepoint)
    second, _ = run(session_job(env2, n, SessionRowsWithALateRow(), lateness), "second run")

    emitted = Counter((r.key, r.window_start, r.window_end) for r in first + second)
    assert max(emitted.values()) == 1, [w for w, c in emitted.items() if c > 1][:5]
    expected = expected_sessions(n)
    grown = expected.pop(key0)
    expected[(0, 0, key0[2])] = grown + LATE_VALUE
    expected[key0] = grown  # emitted before the savepoint, before it grew
    assert {(r.key, r.window_start, r.window_end): r.value for r in first + second} == expected


class SquaresWithoutMerge(SumOfSquares):
    """A user aggregate as tumbling windows take it: no ``merge``."""

    merge = BatchAggregateFunction.merge


def test_dynamic_gaps_and_aggregates_without_merge_on_batch_sessions_are_refused() -> None:
    env = local_env()
    keyed = env.from_source(generated({"ts": lambda i: i}), strategy(), "n").key_by("ts")
    with pytest.raises(InvalidProgramError, match=r"sessions of one gap.*with_gap.*to_records"):
        keyed.window(EventTimeSessionWindows.with_dynamic_gap(lambda row: 10))
    windowed = keyed.window(EventTimeSessionWindows.with_gap(Time.milliseconds(10)))
    with pytest.raises(InvalidProgramError, match=r"SquaresWithoutMerge.merge\(accumulator, group_ids"):
        windowed.aggregate(SquaresWithoutMerge(), {"squares": "int64"})
    with pytest.raises(InvalidProgramError, match=r"\['count', 'end'\] would share a name.*rename"):
        windowed.aggregate(SumOfSquares(), {"squares": "int64", "end": "int64", "count": "int64"})
    # The same function without merge serves tumbling windows.
    tumbling = keyed.window(TumblingEventTimeWindows.of(Time.milliseconds(10)))
    tumbling.aggregate(SquaresWithoutMerge(), {"squares": "int64"})


class MergeLosingAGroup(SumOfSquares):
    def merge(self, accumulator: dict[str, Any], group_ids: Any, groups: int) -> dict[str, Any]:
        return {"squares": super().merge(accumulator, group_ids, groups)["squares"][:-1]}


def test_a_merge_returning_the_wrong_number_of_groups_fails_the_job_once_naming_it() -> None:
    env = local_env()
    env.configure({"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 3})
    columns = {"key": lambda i: i % 2, "value": lambda i: i, "ts": lambda i: i}
    rows = env.from_source(generated(columns, count=20), strategy(), "rows")
    sessions = rows.key_by("key").window(EventTimeSessionWindows.with_gap(Time.milliseconds(10)))
    sessions.aggregate(MergeLosingAGroup(), {"squares": "int64"}).to_records().sink_to(DiscardingSink())
    client = env.execute_async("a merge losing a group")
    with pytest.raises(JobExecutionError) as failure:
        client.get_job_execution_result(timeout=120)
    assert_caused_by(failure.value, r"MergeLosingAGroup\).*merge\(\) returned \{'squares': \d+\} values for")
    assert client.restarts == 0  # it would recur on every restart: it fails once


def test_event_times_too_far_apart_for_one_batch_fail_naming_the_cause() -> None:
    """Two keys in one batch, one row far in the past and one far in the future: the sort
    key would overflow, and the job fails saying why and what to do."""
    env = local_env()
    env.configure({"restart-strategy.type": "none"})
    far = 2**62
    columns = {"key": lambda i: i % 2, "value": lambda i: i, "ts": lambda i: np.where(i % 2 == 0, -far, far)}
    rows = env.from_source(generated(columns, count=2), strategy(), "far apart")
    gap = EventTimeSessionWindows.with_gap(Time.milliseconds(10))
    with pytest.raises(JobExecutionError) as failure:
        rows.key_by("key").window(gap).sum("value").print()
        env.execute("far apart")
    assert_caused_by(failure.value, r"too wide to sort as one int64.*smaller batches")
