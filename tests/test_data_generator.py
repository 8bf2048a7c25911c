"""DataGeneratorSource: exact output at any parallelism, rate limiting, exact restore, argument checks."""

from __future__ import annotations

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
