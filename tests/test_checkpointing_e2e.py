"""Checkpoints in real jobs: exactly-once through failures, timeouts, retained checkpoints,
restore from a path (also at another parallelism), corrupt metadata, statistics."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from chandy import (
    CheckpointingMode,
    ConfigurationError,
    ExternalizedCheckpointRetention,
    InvalidCheckpointError,
    JobExecutionError,
    StorageError,
    StreamExecutionEnvironment,
)
from chandy.core.functions import CheckpointListener, SinkFunction
from chandy.errors import JobCancelledError
from tests.jobs import (
    CountingFilter,
    CountingMap,
    FailOnceMap,
    HoldingSequence,
    KeyedCounter,
    SlowMap,
    Throttle,
    final_counts,
    release,
)
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too


def checkpointing_env(
    parallelism: int = 2,
    interval_ms: int = 200,
    mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE,
    executor: str = "local",
    **config: Any,
) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(interval_ms, mode)
    env.configure({"restart-strategy.fixed-delay.delay": 50, **config})
    return env


def counting_pipeline(
    env: StreamExecutionEnvironment, probe: Probe, n: int, keys: int, fail: bool = True
) -> Any:
    """StreamCheckpointingITCase's shape: parallel source (offsets in state), filter,
    shuffle, map with an operator-state counter, a map that fails once, a keyed counter."""
    p = env.get_parallelism()
    stream = (
        env.from_sequence(0, n - 1)
        .uid("source")
        .filter(CountingFilter("filter", probe))
        .uid("filter")
        .shuffle()
        .map(CountingMap("map", probe))
        .uid("map")
    )
    if fail:
        stream = stream.map(FailOnceMap("failing", probe, n // p, seed=n)).uid("failing")
    return stream.key_by(lambda x: x % keys).process(KeyedCounter(n // keys)).uid("counter")


def assert_exactly_once(out: list[Any], probe: Probe, n: int, keys: int, names: list[str]) -> None:
    assert [o for o in out if o[0] == "overflow"] == []
    assert sorted(out) == [(k, n // keys) for k in range(keys)]  # every key once, count exact
    for name in names:
        assert sum(final_counts(probe, name).values()) == n, (name, final_counts(probe, name))


@pytest.mark.slow
@on_rocksdb_too(executor=("local", "spark"))  # Spark: RocksDB in slot processes, failover across them
def test_exactly_once_under_failure(executor: str) -> None:
    n, keys = 2_000_000, 1000
    probe = Probe()
    env = checkpointing_env(executor=executor)
    out = counting_pipeline(env, probe, n, keys).execute_and_collect("exactly once", limit=10**7)
    assert probe.get("failures") >= 1  # the failure really happened (and restore replayed past it)
    assert_exactly_once(out, probe, n, keys, ["filter", "map", "failing"])


@pytest.mark.slow
def test_at_least_once_never_loses_records(executor: str) -> None:
    n, keys = 400_000, 500
    probe = Probe()
    env = checkpointing_env(executor=executor, mode=CheckpointingMode.AT_LEAST_ONCE)
    out = counting_pipeline(env, probe, n, keys).execute_and_collect(limit=10**7)
    completed = {o[0] for o in out if o[0] != "overflow"}
    assert completed == set(range(keys))  # every key reached its full count (or more)
    for name in ("filter", "map", "failing"):
        assert sum(final_counts(probe, name).values()) >= n


def test_timed_out_checkpoints_are_aborted_and_the_job_goes_on(executor: str) -> None:
    probe = Probe()
    # A slow phase (3 calls of 1 s) holds barriers back far longer than the timeout: a task
    # takes a checkpoint between two records of a slow batch (it processes it in chunks for
    # the buffer timeout), but not inside one call. Outside it checkpoints take a fraction of
    # the timeout, even on a loaded machine.
    env = checkpointing_env(
        executor=executor,
        interval_ms=50,
        **{
            "execution.checkpointing.timeout": 600,
            "execution.checkpointing.tolerable-failed-checkpoints": 100,
        },
    )
    env.from_sequence(0, 2999).map(SlowMap(probe, budget=3, delay_s=1.0)).key_by(lambda x: x % 10).process(
        KeyedCounter(300)
    ).print()
    client = env.execute_async("slow")
    result = client.get_job_execution_result(timeout=120)
    stats = client.get_checkpoint_statistics()
    expired = [
        h
        for h in stats["history"]
        if h["status"] == "FAILED" and h["failure_message"].startswith("CHECKPOINT_EXPIRED")
    ]
    assert expired, stats["history"]
    assert result.restarts == 0  # tolerated: the job went on


def test_too_many_timed_out_checkpoints_fail_the_job_over_and_it_recovers(executor: str) -> None:
    n, keys = 30_000, 30
    probe = Probe()
    env = checkpointing_env(
        executor=executor,
        interval_ms=50,
        **{
            "execution.checkpointing.timeout": 600,
            "execution.checkpointing.tolerable-failed-checkpoints": 0,
            "web.checkpoints.history": 10_000,  # the expired one must not scroll out of the history
        },
    )
    results = (
        env.from_sequence(0, n - 1)
        .map(SlowMap(probe, budget=3, delay_s=1.0))
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .execute_and_collect()
    )
    with results:
        out = list(results)
    assert results.job_client.restarts >= 1  # the first timeout failed the job over ...
    assert sorted(out) == [(k, n // keys) for k in range(keys)]  # ... and nothing was lost
    history = results.job_client.get_checkpoint_statistics()["history"]
    failed = sorted((h for h in history if h["status"] == "FAILED"), key=lambda h: h["id"])
    # The first checkpoint that failed expired, and that is what failed the job over; the
    # ones after it failed because of the failover (JOB_FAILOVER_REGION) or not at all.
    assert failed and failed[0]["failure_message"].startswith("CHECKPOINT_EXPIRED"), history


class CheckpointRecorder(SinkFunction, CheckpointListener):
    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def invoke(self, value: Any, context: SinkFunction.Context) -> None:
        pass

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.probe.append(checkpoint_id)


def test_checkpoint_listeners_hear_completed_checkpoints_and_stats_are_flinks_shape(executor: str) -> None:
    probe = Probe()
    gate = os.path.join(probe.directory, "release-throttle")
    env = checkpointing_env(executor=executor, parallelism=1, interval_ms=30)
    # the source holds half-way until the test heard three checkpoints: the job cannot end first
    numbers = HoldingSequence(0, 50_000, hold_after=25_000, until=gate)
    env.from_source(numbers, source_name="numbers").add_sink(CheckpointRecorder(probe))
    client = env.execute_async("listener")
    deadline = time.monotonic() + 60
    while len(probe.items) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    stats = client.get_checkpoint_statistics()
    release(gate)  # three were heard while it ran: the rest of the input goes on
    client.get_job_execution_result(timeout=120)
    ids = list(probe.items)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert set(stats) == {"counts", "summary", "latest", "history"}
    assert set(stats["counts"]) == {"restored", "total", "in_progress", "completed", "failed"}
    assert stats["counts"]["completed"] >= 3
    latest = stats["latest"]["completed"]
    assert latest["status"] == "COMPLETED" and latest["className"] == "completed"
    assert latest["num_acknowledged_subtasks"] == latest["num_subtasks"]
    assert set(stats["summary"]["end_to_end_duration"]) == {
        "min",
        "max",
        "avg",
        "p50",
        "p90",
        "p95",
        "p99",
        "p999",
    }


def drain(results: Any) -> tuple[list[Any], threading.Thread]:
    """Read a collect iterator on a background thread (until it is closed, or its job is
    cancelled)."""
    into: list[Any] = []

    def read() -> None:
        try:
            for record in results:
                into.append(record)
        except JobCancelledError:
            pass  # cancel_keeping_results: everything delivered was read

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return into, thread


def cancel_keeping_results(results: Any, reader: threading.Thread, timeout_s: float = 60) -> None:
    """Cancel the job behind a collect iterator that :func:`drain` reads, and wait until the
    reader took every result the job delivered. ``results.close()`` cancels too, but drops the
    results delivered and not read yet: a restore from the retained checkpoint does not deliver
    them again (they were delivered), so the two runs together would miss them."""
    results.job_client.cancel()
    reader.join(timeout_s)
    assert not reader.is_alive(), "the collect iterator did not end after the job was cancelled"


def wait_for_checkpoints(base: Path, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list(base.glob("*/chk-*/_metadata"))) < count:
        assert time.monotonic() < deadline, "no checkpoint completed in time"
        time.sleep(0.02)


def latest_checkpoint_dir(base: Path) -> Path:
    candidates = [p for p in base.glob("*/chk-*") if (p / "_metadata").exists()]
    assert candidates, list(base.rglob("*"))
    return max(candidates, key=lambda p: int(p.name.split("-")[1]))


@pytest.mark.slow
@on_rocksdb_too(executor=("local", "spark"))  # Spark: slots download and clip shared files
@pytest.mark.parametrize("new_parallelism", [2, 3])
def test_restore_a_retained_checkpoint_after_cancel(
    tmp_path: Path, new_parallelism: int, executor: str
) -> None:
    n, keys = 40_000, 40
    probe = Probe()
    retain = {
        "execution.checkpointing.dir": str(tmp_path),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    }
    env = checkpointing_env(executor=executor, interval_ms=50, **retain)
    # Each source subtask stops half-way: the first run is still running when the test cancels
    # it after its first checkpoint, however slow the machine (no key is complete: nothing collected).
    results = (
        env.from_source(HoldingSequence(0, n - 1, hold_after=n // 4), source_name="numbers")
        .uid("source")
        .map(CountingMap("map", probe))
        .uid("map")
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .uid("counter")
        .execute_and_collect("first run")
    )
    first, reader = drain(results)
    wait_for_checkpoints(tmp_path, 1)
    cancel_keeping_results(results, reader)  # RETAIN_ON_CANCELLATION keeps its checkpoint
    retained = latest_checkpoint_dir(tmp_path)
    assert len({p.parent for p in tmp_path.glob("*/chk-*")}) == 1

    env2 = checkpointing_env(
        executor=executor,
        parallelism=new_parallelism,
        interval_ms=100,
        **{"execution.checkpointing.dir": str(tmp_path / "second")},
    )
    env2.set_restore_path(str(retained))
    second = (
        env2.from_source(HoldingSequence(0, n - 1, hold_after=None), source_name="numbers")
        .uid("source")
        .map(CountingMap("map", probe))
        .uid("map")
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .uid("counter")
        .execute_and_collect("second run", limit=10**6)
    )
    assert sorted(first + second) == [(k, n // keys) for k in range(keys)]
    # operator state came back too: the restored counters continue where the checkpoint was
    assert sum(final_counts(probe, "map").values()) == n


def test_cancelled_job_without_retention_leaves_nothing(tmp_path: Path, executor: str) -> None:
    env = checkpointing_env(
        executor=executor, interval_ms=50, **{"execution.checkpointing.dir": str(tmp_path)}
    )
    results = env.from_sequence(0, 10**6).map(Throttle(0.0001)).execute_and_collect()
    with results:
        next(results)
    assert not list(tmp_path.glob("*/chk-*"))


def retained_checkpoint_of_cancelled_job(
    directory: Path, counter_uid: str = "counter", **config: Any
) -> Path:
    """Run an endless keyed job with RETAIN_ON_CANCELLATION, cancel it after its first
    checkpoint, and return the retained checkpoint's directory."""
    env = checkpointing_env(
        interval_ms=30,
        **{
            "execution.checkpointing.dir": str(directory),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
            **config,
        },
    )
    results = (
        env.from_sequence(0, 10**6)
        .uid("src")
        .map(Throttle(0.0001))
        .key_by(lambda x: x % 3)
        .process(KeyedCounter(10**9))
        .uid(counter_uid)
        .execute_and_collect()
    )
    wait_for_checkpoints(directory, 1)
    results.close()
    return latest_checkpoint_dir(directory)


def test_corrupt_metadata_is_refused_naming_the_file(tmp_path: Path, executor: str) -> None:
    retained = retained_checkpoint_of_cancelled_job(tmp_path)
    metadata = retained / "_metadata"
    data = bytearray(metadata.read_bytes())
    data[len(data) // 2] ^= 0x01
    metadata.write_bytes(bytes(data))

    env2 = checkpointing_env(executor=executor)
    env2.set_restore_path(str(retained))
    env2.from_sequence(0, 10).print()
    with pytest.raises(InvalidCheckpointError) as info:
        env2.execute()
    assert str(metadata) in str(info.value) and "corrupt" in str(info.value)


def test_restore_from_missing_or_incomplete_checkpoint_is_refused(tmp_path: Path) -> None:
    env = checkpointing_env()
    env.set_restore_path(str(tmp_path / "nope" / "chk-3"))
    env.from_sequence(0, 10).print()
    with pytest.raises(InvalidCheckpointError, match="does not exist"):
        env.execute()
    incomplete = tmp_path / "job" / "chk-7"
    incomplete.mkdir(parents=True)
    (incomplete / "some-state-file").write_bytes(b"x")
    env.set_restore_path(str(incomplete))
    env.from_sequence(0, 10).print()
    with pytest.raises(InvalidCheckpointError, match="not a complete checkpoint"):
        env.execute()


def test_restore_refuses_state_of_operators_that_are_gone(tmp_path: Path, executor: str) -> None:
    retained = retained_checkpoint_of_cancelled_job(tmp_path, counter_uid="old-counter")
    env2 = checkpointing_env(executor=executor)
    env2.set_restore_path(str(retained))
    env2.from_sequence(0, 10).uid("src").key_by(lambda x: x % 3).process(KeyedCounter(10**9)).uid(
        "new-counter"
    ).print()
    with pytest.raises(InvalidCheckpointError, match="ignore-unclaimed-state"):
        env2.execute()
    env2.configure({"execution.state-recovery.ignore-unclaimed-state": True})
    env2.from_sequence(0, 10).uid("src").key_by(lambda x: x % 3).process(KeyedCounter(10**9)).uid(
        "new-counter"
    ).print()
    env2.execute()  # skips the unclaimed state, as asked


def test_invalid_checkpoint_settings_are_rejected_at_execute(tmp_path: Path) -> None:
    env = checkpointing_env()
    env.get_checkpoint_config().set_externalized_checkpoint_retention(
        ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION
    )
    env.from_sequence(0, 10).print()
    with pytest.raises(ConfigurationError, match="execution.checkpointing.dir"):
        env.execute()
    with pytest.raises(ConfigurationError, match="execution.checkpointing.interval"):
        checkpointing_env(interval_ms=5)
    env = checkpointing_env(**{"execution.checkpointing.mode": "sometimes"})
    env.from_sequence(0, 10).print()
    with pytest.raises(ConfigurationError, match="EXACTLY_ONCE, AT_LEAST_ONCE"):
        env.execute()
    env = checkpointing_env(**{"execution.checkpointing.storage": "filesystem"})
    env.from_sequence(0, 10).print()
    with pytest.raises(ConfigurationError, match="execution.checkpointing.dir"):
        env.execute()


def test_unwritable_checkpoint_storage_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = checkpointing_env(**{"execution.checkpointing.dir": str(blocker / "checkpoints")})
    env.from_sequence(0, 10).print()
    with pytest.raises(StorageError, match="not writable"):
        env.execute()


def test_checkpoint_config_setters_write_flink_keys() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    config = env.get_checkpoint_config()
    assert not config.is_checkpointing_enabled() and config.get_checkpoint_interval() == -1
    env.enable_checkpointing(1000, CheckpointingMode.AT_LEAST_ONCE)
    config.set_checkpoint_timeout(5000).set_min_pause_between_checkpoints(100)
    config.set_max_concurrent_checkpoints(2).set_tolerable_checkpoint_failure_number(3)
    config.set_checkpoint_storage("file:///tmp/somewhere")
    raw = env.get_configuration().to_dict()
    assert raw["execution.checkpointing.interval"] == 1000
    assert raw["execution.checkpointing.mode"] is CheckpointingMode.AT_LEAST_ONCE
    assert raw["execution.checkpointing.timeout"] == 5000
    assert raw["execution.checkpointing.min-pause"] == 100
    assert raw["execution.checkpointing.max-concurrent-checkpoints"] == 2
    assert raw["execution.checkpointing.tolerable-failed-checkpoints"] == 3
    assert raw["execution.checkpointing.dir"] == "file:///tmp/somewhere"
    assert config.get_checkpoint_timeout() == 5000
    assert env.get_checkpointing_mode() is CheckpointingMode.AT_LEAST_ONCE
    defaults = StreamExecutionEnvironment.get_execution_environment().get_checkpoint_config()
    assert defaults.get_checkpoint_timeout() == 600_000
    assert defaults.get_max_concurrent_checkpoints() == 1
    assert defaults.get_min_pause_between_checkpoints() == 0
    assert defaults.get_tolerable_checkpoint_failure_number() == 0
    assert defaults.get_num_retained_checkpoints() == 1


@on_rocksdb_too(executor="local")
def test_checkpoints_written_in_flinks_layout_and_subsumed_ones_deleted(
    tmp_path: Path, executor: str
) -> None:
    env = checkpointing_env(
        executor=executor,
        parallelism=1,
        interval_ms=20,
        **{
            "execution.checkpointing.dir": str(tmp_path),
            "execution.checkpointing.num-retained": 2,
            "execution.checkpointing.data-inline-threshold": 0,
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        },
    )
    results = (
        env.from_sequence(0, 10**6)
        .map(Throttle(0.0001))
        .key_by(lambda x: x % 100)
        .process(KeyedCounter(10**9))
        .execute_and_collect()
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*/chk-*/_metadata"))) < 2 or not any(
        int(p.parent.name[4:]) >= 4 for p in tmp_path.glob("*/chk-*/_metadata")
    ):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    results.close()
    (job_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (job_dir / "shared").is_dir() and (job_dir / "taskowned").is_dir()
    complete = sorted(int(p.name[4:]) for p in job_dir.glob("chk-*") if (p / "_metadata").exists())
    assert len(complete) == 2 and complete[1] == complete[0] + 1  # older ones were deleted
    state_files = [f for f in (job_dir / f"chk-{complete[1]}").iterdir() if f.name != "_metadata"]
    assert state_files  # threshold 0: state lives in files next to _metadata
    assert not [f for f in job_dir.rglob("*.inprogress")]
    assert os.path.getsize(job_dir / f"chk-{complete[1]}" / "_metadata") > 0


@on_rocksdb_too(executor="local", incremental=False)  # chk-N alone is self-contained when full
def test_a_retained_checkpoint_can_be_moved_and_still_restores(tmp_path: Path, executor: str) -> None:
    n, keys = 20_000, 20
    retain = {
        "execution.checkpointing.dir": str(tmp_path / "original"),
        "execution.checkpointing.data-inline-threshold": 0,
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    }
    env = checkpointing_env(executor=executor, interval_ms=50, **retain)
    results = (  # each source subtask stops half-way: running until cancelled, nothing collected
        env.from_source(HoldingSequence(0, n - 1, hold_after=n // 4), source_name="numbers")
        .uid("source")
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .uid("counter")
        .execute_and_collect("first run")
    )
    first, reader = drain(results)
    wait_for_checkpoints(tmp_path / "original", 1)
    cancel_keeping_results(results, reader)
    assert first == []
    retained = latest_checkpoint_dir(tmp_path / "original")
    assert [f for f in retained.iterdir() if f.name != "_metadata"]  # state lives in files
    moved = tmp_path / "archive" / "my-checkpoint"
    moved.parent.mkdir()
    retained.rename(moved)
    env2 = checkpointing_env(executor=executor, interval_ms=100)
    env2.set_restore_path(str(moved / "_metadata"))
    second = (
        env2.from_source(HoldingSequence(0, n - 1, hold_after=None), source_name="numbers")
        .uid("source")
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .uid("counter")
        .execute_and_collect("second run", limit=10**6)
    )
    assert sorted(second) == [(k, n // keys) for k in range(keys)]


def test_a_corrupt_state_file_is_refused_naming_it(tmp_path: Path, executor: str) -> None:
    retained = retained_checkpoint_of_cancelled_job(
        tmp_path, **{"execution.checkpointing.data-inline-threshold": 0}
    )
    victims = sorted(f for f in retained.iterdir() if f.name != "_metadata")
    # same size, other bytes: only the checksum can tell, when a task reads it
    victims[0].write_bytes(b"garbage" + victims[0].read_bytes()[7:])
    env2 = checkpointing_env(executor=executor)
    env2.set_restore_path(str(retained))
    env2.from_sequence(0, 10).uid("src").key_by(lambda x: x % 3).process(KeyedCounter(10**9)).uid(
        "counter"
    ).print()
    started = time.monotonic()
    with pytest.raises(JobExecutionError, match="corrupt") as info:
        env2.execute()
    assert victims[0].name in str(info.value)
    assert time.monotonic() - started < 30  # no endless restarts: restoring again cannot help
    # truncated or deleted: refused before anything runs
    victims[0].write_bytes(b"short")
    env2.from_sequence(0, 10).uid("src").key_by(lambda x: x % 3).process(KeyedCounter(10**9)).uid(
        "counter"
    ).print()
    with pytest.raises(InvalidCheckpointError, match="corrupt: it has 5 bytes"):
        env2.execute()
    victims[0].unlink()
    env2.from_sequence(0, 10).uid("src").key_by(lambda x: x % 3).process(KeyedCounter(10**9)).uid(
        "counter"
    ).print()
    with pytest.raises(InvalidCheckpointError, match="is missing"):
        env2.execute()


class SlowFinishSink(SinkFunction):
    """Takes ``delay_s`` in ``finish()``: a task still busy ending its input (flushing a
    buffer, waiting for async requests) while the rest of the job checkpoints."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def invoke(self, value: Any, context: SinkFunction.Context) -> None:
        pass

    def finish(self) -> None:
        time.sleep(self.delay_s)


@pytest.mark.slow
def test_a_task_busy_finishing_after_its_upstream_finished_does_not_stall_checkpoints() -> None:
    """Flink's FLIP-147 plan: a running task whose every upstream task has finished gets no
    barrier any more, so it is triggered directly, and it takes that checkpoint once its
    input has ended (in-flight records of the finished upstream first). Before, the
    checkpoint waited for an acknowledgement that never came until its timeout: the job
    below, whose other branch needs one more checkpoint to finish, took the whole minute."""
    env = checkpointing_env(
        parallelism=1,
        interval_ms=100,
        **{"execution.checkpointing.timeout": "60 s", "restart-strategy.type": "none"},
    )
    env.from_collection(list(range(10))).add_sink(SlowFinishSink(2.0)).disable_chaining()
    env.from_sequence(1, 1500).map(Throttle(0.002)).add_sink(SlowFinishSink(0.0))
    client = env.execute_async("finishing while checkpointing")
    started = time.monotonic()
    client.get_job_execution_result(timeout=40)
    assert time.monotonic() - started < 40
    stats = client.get_checkpoint_statistics()
    failures = [c["failure_message"] for c in stats["history"] if c["status"] == "FAILED"]
    # A trigger that reaches a task which has just finished is declined by it, and the job's
    # end cancels the checkpoint in progress (Flink's too); what must not happen is a
    # checkpoint left waiting for the finishing task until it expires.
    assert not [f for f in failures if "EXPIRED" in f], failures
    assert stats["counts"]["completed"] >= 3
