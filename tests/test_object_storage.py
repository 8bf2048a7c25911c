"""Checkpoints, savepoints and sinks in an object store: a real S3 server (SeaweedFS) on
loopback, reached through s3fs with Flink's ``s3.*`` keys, on both executors.

Jobs checkpoint to ``s3://chandy/<prefix>/ck`` with every state in a file (inline threshold
0), fail once, restore and must come out exact; savepoints go to ``s3://.../sp`` and
restore at another parallelism. The configuration reaches the Spark slot processes with the
job (the slots were started before the test set anything).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.errors import JobCancelledError
from tests.jobs import FailOnceMap, HoldingSequence, KeyedCounter
from tests.probes import Probe
from tests.s3_server import S3Server


def s3_env(
    s3_server: S3Server,
    prefix: str,
    executor: str,
    parallelism: int = 2,
    interval_ms: int = 100,
    **config: Any,
) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(interval_ms)
    env.configure(
        s3_server.flink_config(
            **{
                "execution.checkpointing.dir": f"{prefix}/ck",
                "execution.checkpointing.savepoint-dir": f"{prefix}/sp",
                "execution.checkpointing.data-inline-threshold": 0,  # every state in an object
                "restart-strategy.fixed-delay.delay": 50,
                **config,
            }
        )
    )
    return env


def key_counts(env: StreamExecutionEnvironment, source: HoldingSequence, keys: int, per_key: int) -> Any:
    """numbers -> (key, count) once a key has ``per_key`` records; uids fixed for a restore."""
    return (
        env.from_source(source, source_name="numbers")
        .uid("numbers")
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(per_key))
        .uid("count")
    )


def wait_for_checkpoints(client: Any, count: int, timeout_s: float = 120.0) -> None:
    """Until ``count`` checkpoints completed (the job's tasks run and write to S3)."""
    deadline = time.monotonic() + timeout_s
    while client.get_checkpoint_statistics(timeout=60)["counts"]["completed"] < count:
        assert not client.is_done(), client.get_job_execution_result(1)
        assert time.monotonic() < deadline, f"fewer than {count} checkpoints in {timeout_s} s"
        time.sleep(0.02)


def objects(s3_server: S3Server, prefix: str) -> list[str]:
    """Every key under ``prefix`` (an s3:// URI), relative to it."""
    root = prefix.removeprefix("s3://")
    fs = s3_server.fs()
    return sorted(p.removeprefix(root + "/") for p in fs.find(root))


@pytest.mark.quick  # the object-store checkpoint path on Spark stays in the quick subset
def test_checkpoints_in_s3_are_exactly_once_through_a_failure(
    executor: str, s3_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The source is paced by the checkpoints (1,000 more records per subtask after each), so
    the failure comes after some completed: the restore reads its state back from S3."""
    n, keys = 20_000, 20
    probe = Probe()
    prefix = s3_server.unique_prefix("ck")
    env = s3_env(s3_server, prefix, executor)
    out = (
        env.from_source(HoldingSequence(0, n - 1, hold_after=1000, more_per_checkpoint=1000), source_name="n")
        .map(FailOnceMap("failing", probe, n // 2, seed=3))
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .execute_and_collect("checkpoints in s3", limit=10**6)
    )
    assert probe.get("failures") >= 1
    assert sorted(out) == [(k, n // keys) for k in range(keys)]
    restores = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Restoring job")]
    assert restores and f"({prefix}/ck/" in restores[0], restores  # state read back from the bucket


def test_a_savepoint_in_s3_restores_at_another_parallelism(executor: str, s3_server: S3Server) -> None:
    """Job A holds after a few records per subtask, takes a savepoint into S3 and is
    cancelled; job B restores it at parallelism 3 and counts every key exactly."""
    n, keys = 6_000, 12
    prefix = s3_server.unique_prefix("sp")
    env = s3_env(s3_server, prefix, executor)
    key_counts(env, HoldingSequence(0, n - 1, hold_after=500), keys, n // keys).print()
    client = env.execute_async("savepoint into s3")
    wait_for_checkpoints(client, 1)  # every task runs
    savepoint = client.trigger_savepoint().result(120)
    assert savepoint.startswith(f"{prefix}/sp/savepoint-")
    client.cancel()
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(120)
    saved = objects(s3_server, savepoint)
    assert "_metadata" in saved and len(saved) > 1  # its state files beside it

    restored = s3_env(s3_server, prefix, executor, parallelism=3)
    restored.set_restore_path(savepoint)
    out = key_counts(restored, HoldingSequence(0, n - 1, hold_after=None), keys, n // keys)
    assert sorted(out.execute_and_collect("restored from s3", limit=10**6)) == [
        (k, n // keys) for k in range(keys)
    ]
