"""DataGeneratorSource: exact output at any parallelism, rate limiting, exact restore, argument checks."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.connectors import DataGeneratorSource
from chandy.core.connector import Boundedness, SourceReaderContext
from tests.jobs import KeyedCounter
from tests.test_checkpointing_e2e import (
    cancel_keeping_results,
    checkpointing_env,
    drain,
    latest_checkpoint_dir,
    wait_for_checkpoints,
)


def labelled(i: int) -> tuple[int, str]:
    return i, f"record-{i}"


@pytest.mark.parametrize(("parallelism", "count"), [(1, 1000), (3, 1000)])
def test_bounded_output_is_exact(executor: str, parallelism: int, count: int) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    out = env.from_source(DataGeneratorSource(labelled, count)).execute_and_collect(limit=10**6)
    expected = [labelled(i) for i in range(count)]
    if parallelism == 1:
        assert out == expected  # one subtask generates in index order
    else:
        assert sorted(out) == expected


@pytest.mark.slow
def test_rate_limit_spreads_records_over_time(executor: str) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    results = env.from_source(DataGeneratorSource(str, 200, records_per_second=100)).execute_and_collect()
    arrivals: list[tuple[float, Any]] = []
    with results:
        for record in results:
            arrivals.append((time.monotonic(), record))
    assert sorted(r for _, r in arrivals) == sorted(str(i) for i in range(200))
    first = arrivals[0][0]
    # 200 records at 100/s (50/s in each of 2 subtasks): about 2 s from first to last
    assert arrivals[-1][0] - first >= 1.5
    # never faster than the rate (a stalled subtask does not catch up in a burst either)
    in_first_second = sum(1 for t, _ in arrivals if t - first < 1.0)
    assert in_first_second <= 100 + 10, in_first_second


def test_rate_limited_reader_emits_small_batches_and_never_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    source = DataGeneratorSource(lambda i: i, None, records_per_second=2000)
    readers = [source.create_reader(SourceReaderContext(i, 2, 0)) for i in range(2)]
    for i, reader in enumerate(readers):
        reader.add_splits(source.create_splits(2)[i::2])
    reader = readers[0]
    assert reader.idle_wait_s <= 0.05
    started = time.monotonic()
    batches: list[list[Any]] = []
    immediate_repolls: list[list[Any]] = []
    pause = time.sleep

    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"poll_next slept {seconds} s: it must return at once, due or not")

    while time.monotonic() - started < 0.5:
        # returns at once, due or not: a poll that sleeps fails (not a wall-clock bound, which
        # a loaded machine breaks by descheduling the test between two readings of the clock)
        monkeypatch.setattr(time, "sleep", no_sleep)
        batch = reader.poll_next(1024)
        batches.append(batch)
        again = reader.poll_next(1024)  # at once: (almost always) nothing due yet
        monkeypatch.setattr(time, "sleep", pause)
        batches.append(again)
        immediate_repolls.append(again)
        time.sleep(reader.idle_wait_s)
    emitted = [r for b in batches for r in b]
    assert max(len(b) for b in batches) <= 1000 * 0.05 + 1  # small batches: a short burst at most
    # nothing due: an empty poll, not a sleep
    assert sum(1 for b in immediate_repolls if b == []) >= 0.8 * len(immediate_repolls)
    assert 300 <= len(emitted) <= 560  # about 1000/s for this subtask's half of the rate
    assert emitted == list(range(0, 2 * len(emitted), 2))  # subtask 0 of 2: every 2nd index


def test_unbounded_splits_cover_every_index_once_across_rescaling() -> None:
    source = DataGeneratorSource(lambda i: i, None)
    assert source.get_boundedness() is Boundedness.CONTINUOUS_UNBOUNDED
    readers = [source.create_reader(SourceReaderContext(i, 2, 0)) for i in range(2)]
    out: list[int] = []
    for i, reader in enumerate(readers):
        reader.add_splits(source.create_splits(2)[i::2])
        out += reader.poll_next(10) + reader.poll_next(7)
    splits = [s for r in readers for s in r.snapshot_state(1)]
    # restore at parallelism 3: the third subtask gets no split and idles
    rescaled = [source.create_reader(SourceReaderContext(i, 3, 1)) for i in range(3)]
    for i, reader in enumerate(rescaled):
        reader.add_splits(splits[i::3])
        for _ in range(5):
            out += reader.poll_next(10)
    assert rescaled[2].poll_next(10) == []  # unbounded: an idle reader never ends
    assert sorted(out) == list(range(len(out)))  # no index twice, none skipped
    assert len(out) == 2 * 17 + 2 * 50


def test_restore_from_a_retained_checkpoint_continues_without_duplicates_or_gaps(
    tmp_path: Path, executor: str
) -> None:
    n, keys = 6000, 30

    def pipeline(env: StreamExecutionEnvironment, rate: float | None) -> Any:
        return (
            env.from_source(DataGeneratorSource(lambda i: i, n, records_per_second=rate))
            .uid("gen")
            .key_by(lambda x: x % keys)
            .process(KeyedCounter(n // keys))
            .uid("counter")
        )

    env = checkpointing_env(
        executor=executor,
        interval_ms=50,
        **{
            "execution.checkpointing.dir": str(tmp_path / "first"),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        },
    )
    # 600 records/s: 10 s for all, and the test cancels the job after its third checkpoint
    # (every 50 ms; each after more records), so the first run cannot end first on a loaded machine.
    results = pipeline(env, 600).execute_and_collect("first run")
    first, reader = drain(results)
    wait_for_checkpoints(tmp_path / "first", 1)
    deadline = time.monotonic() + 60
    while results.job_client.get_checkpoint_statistics(timeout=60)["counts"]["completed"] < 3:
        assert time.monotonic() < deadline, "no 3 checkpoints in 60 s"
        time.sleep(0.01)
    cancel_keeping_results(results, reader)
    assert len(first) < keys  # no key was complete
    retained = latest_checkpoint_dir(tmp_path / "first")

    env2 = checkpointing_env(
        executor=executor,
        parallelism=3,
        interval_ms=100,
        **{"execution.checkpointing.dir": str(tmp_path / "second")},
    )
    env2.set_restore_path(str(retained))
    second = pipeline(env2, None).execute_and_collect("second run", limit=10**6)
    out = first + second
    assert [o for o in out if o[0] == "overflow"] == []  # no index generated twice ...
    assert sorted(set(out)) == [(k, n // keys) for k in range(keys)]  # ... and none skipped


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("not callable", 10), TypeError, "generator_function must be callable"),
        ((str, 1.5), TypeError, "count must be an int"),
        ((str, True), TypeError, "count must be an int"),
        ((str, -1), ValueError, "count must be >= 0"),
        ((str, 10, "fast"), TypeError, "records_per_second must be a number"),
        ((str, 10, 0), ValueError, "records_per_second must be a finite number > 0"),
        ((str, 10, -5.0), ValueError, "records_per_second must be a finite number > 0"),
        ((str, 10, math.inf), ValueError, "records_per_second must be a finite number > 0"),
        ((str, 10, math.nan), ValueError, "records_per_second must be a finite number > 0"),
    ],
)
def test_bad_arguments_are_rejected_naming_the_argument(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        DataGeneratorSource(*args)


def test_fewer_records_than_subtasks_and_count_zero() -> None:
    source = DataGeneratorSource(str, 2)
    assert source.get_boundedness() is Boundedness.BOUNDED
    out = []
    for i in range(3):
        reader = source.create_reader(SourceReaderContext(i, 3, 0))
        reader.add_splits(source.create_splits(3)[i::3])
        while (batch := reader.poll_next(10)) is not None:
            out += batch
    assert sorted(out) == ["0", "1"]  # one subtask had an empty range and simply ended
    reader = DataGeneratorSource(str, 0).create_reader(SourceReaderContext(0, 1, 0))
    reader.add_splits(DataGeneratorSource(str, 0).create_splits(1))
    assert reader.poll_next(10) is None  # count 0: ends at once


def _run_to(
    source: DataGeneratorSource, parallelism: int, stop_at: int
) -> tuple[list[int], list[Any], list[Any]]:
    """Fresh readers of ``source`` at ``parallelism``, polled until ``stop_at`` records came
    out; what they emitted, their splits and their shared state (a checkpoint's)."""
    readers = [source.create_reader(SourceReaderContext(i, parallelism, 0)) for i in range(parallelism)]
    for i, reader in enumerate(readers):
        reader.add_splits(source.create_splits(parallelism)[i::parallelism])
    out: list[int] = []
    while len(out) < stop_at:
        for reader in readers:
            out += reader.poll_next(min(7, stop_at - len(out))) or []
    splits = [s for r in readers for s in r.snapshot_state(1)]
    shared = [e for r in readers for e in r.snapshot_shared_state(1)]
    return out, splits, shared


def _restore(
    source: DataGeneratorSource, parallelism: int, splits: list[Any], shared: list[Any]
) -> list[int]:
    """Restore ``source`` at ``parallelism`` from a checkpoint's splits and shared state, as the
    source operator does, and read to the end."""
    out: list[int] = []
    for i in range(parallelism):
        reader = source.create_reader(SourceReaderContext(i, parallelism, 1))
        reader.restore_shared_state(shared)
        reader.add_splits(splits[i::parallelism])
        while (batch := reader.poll_next(50)) is not None:
            out += batch
    return out


@pytest.mark.parametrize(("before", "after"), [(1, 1), (2, 3), (3, 2)])
def test_a_restore_with_a_larger_count_generates_up_to_the_new_count(before: int, after: int) -> None:
    """count=200 stopped at 150, restored with count=400: every index of [0, 400) once (it
    used to stop at 199, silently)."""
    first, splits, shared = _run_to(DataGeneratorSource(lambda i: i, 200), before, 150)
    second = _restore(DataGeneratorSource(lambda i: i, 400), after, splits, shared)
    assert sorted(first + second) == list(range(400))


@pytest.mark.parametrize(("before", "after"), [(1, 1), (2, 3)])
def test_a_restore_with_a_smaller_count_stops_at_it_and_warns_naming_both(
    before: int, after: int, caplog: pytest.LogCaptureFixture
) -> None:
    first, splits, shared = _run_to(DataGeneratorSource(lambda i: i, 200), before, 150)
    with caplog.at_level(logging.WARNING, logger="chandy.connectors"):
        second = _restore(DataGeneratorSource(lambda i: i, 100), after, splits, shared)
    assert all(i < 100 for i in second)
    assert sorted(set(range(100)) - set(first)) == sorted(second)  # what was left below 100, once
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "restored with count=100 from a checkpoint taken with count=200" in warnings[0]


def test_an_unbounded_restore_of_a_bounded_generator_goes_on_past_the_old_count() -> None:
    first, splits, shared = _run_to(DataGeneratorSource(lambda i: i, 200), 2, 150)
    source = DataGeneratorSource(lambda i: i, None)
    readers = [source.create_reader(SourceReaderContext(i, 2, 1)) for i in range(2)]
    out: list[int] = []
    for i, reader in enumerate(readers):
        reader.restore_shared_state(shared)
        reader.add_splits(splits[i::2])
    for _ in range(20):  # 20 rounds of 2 x 25: well past index 500
        for reader in readers:
            out += reader.poll_next(25)
    everything = first + out
    assert len(set(everything)) == len(everything)  # no index twice ...
    assert set(range(500)) <= set(everything)  # ... and none below 500 skipped


@pytest.mark.slow
def test_a_retained_checkpoint_restored_with_twice_the_count_generates_every_index_once(
    tmp_path: Path,
) -> None:
    """End to end, through a real checkpoint (the count travels in the readers' shared state)
    and a restore at another parallelism: a job of count n, cancelled early, restored with
    count 2n, counts every key of [0, 2n) exactly once."""
    n, keys = 3000, 30

    def pipeline(env: StreamExecutionEnvironment, count: int, rate: float | None) -> Any:
        return (
            env.from_source(DataGeneratorSource(lambda i: i, count, records_per_second=rate))
            .uid("gen")
            .key_by(lambda x: x % keys)
            .process(KeyedCounter(2 * n // keys))
            .uid("counter")
        )

    env = checkpointing_env(
        interval_ms=50,
        **{
            "execution.checkpointing.dir": str(tmp_path / "first"),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        },
    )
    results = pipeline(env, n, 600).execute_and_collect("first run")
    first, reader = drain(results)
    deadline = time.monotonic() + 60
    while results.job_client.get_checkpoint_statistics(timeout=60)["counts"]["completed"] < 3:
        assert time.monotonic() < deadline, "no 3 checkpoints in 60 s"
        time.sleep(0.01)
    cancel_keeping_results(results, reader)
    retained = latest_checkpoint_dir(tmp_path / "first")

    env2 = checkpointing_env(
        parallelism=3, interval_ms=100, **{"execution.checkpointing.dir": str(tmp_path / "second")}
    )
    env2.set_restore_path(str(retained))
    second = pipeline(env2, 2 * n, None).execute_and_collect("second run", limit=10**6)
    out = first + second
    assert [o for o in out if o[0] == "overflow"] == []  # no index generated twice ...
    assert sorted(set(out)) == [(k, 2 * n // keys) for k in range(keys)]  # ... up to 2n, none skipped
