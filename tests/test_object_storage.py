"""Checkpoints, savepoints and sinks in an object store: a real S3 server (SeaweedFS) on
loopback, reached through s3fs with Flink's ``s3.*`` keys, on both executors.

Jobs checkpoint to ``s3://chandy/<prefix>/ck`` with every state in a file (inline threshold
0), fail once, restore and must come out exact; savepoints go to ``s3://.../sp`` and
restore at another parallelism. The configuration reaches the Spark slot processes with the
job (the slots were started before the test set anything).
"""

from __future__ import annotations

import io
import json
import logging
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from chandy import StreamExecutionEnvironment
from chandy.config import Configuration
from chandy.connectors.delta_sink import DeltaSink
from chandy.connectors.file_sink import FileSink, JsonLinesEncoder, ParquetBulkWriters
from chandy.core.connector import SinkWriterContext
from chandy.errors import InvalidProgramError, JobCancelledError, StorageError
from chandy.storage.filesystem import FsspecFileSystem, ObjectStoreOptions, resolve
from chandy.storage.multipart import S3Uploads
from chandy.storage.snapshot_key import snapshot_key
from tests.jobs import FailOnceMap, HoldingSequence, KeyedCounter
from tests.probes import Probe
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server


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


# ---------------------------------------------------------------------- sinks into S3

SINKS = ("rows", "parquet", "delta")
NUMBERS = pa.schema([("n", pa.int64())])


def sink_into(kind: str, uri: str) -> Any:
    if kind == "rows":
        return FileSink.for_row_format(uri, JsonLinesEncoder()).build()
    if kind == "parquet":
        return FileSink.for_bulk_format(uri, ParquetBulkWriters.for_records(NUMBERS)).build()
    return DeltaSink(uri, NUMBERS)


def committed_numbers(s3_server: S3Server, kind: str, uri: str) -> list[int]:
    """What a reader of ``uri`` sees: committed parts (no hidden names), or the Delta table."""
    if kind == "delta":
        options = ObjectStoreOptions.from_configuration(s3_server.flink_config())
        table = DeltaTable(uri, storage_options=options.rust_object_store_options()).to_pyarrow_table()
        return [int(n) for n in table.column("n").to_pylist()]
    fs = s3_server.fs()
    numbers: list[int] = []
    for key in fs.find(uri.removeprefix("s3://")):
        if key.rsplit("/", 1)[-1].startswith((".", "_")):
            continue
        data = fs.cat_file(key)
        if kind == "rows":
            numbers += [json.loads(line)["n"] for line in data.decode().splitlines()]
        else:
            numbers += pq.read_table(io.BytesIO(data)).column("n").to_pylist()
    return numbers


def uploads_left(s3_server: S3Server, uri: str) -> list[str]:
    """Multipart uploads under ``uri`` neither completed nor aborted."""
    return [
        key
        for key, _ in S3Uploads(ObjectStoreOptions.from_configuration(s3_server.flink_config())).in_progress(
            uri
        )
    ]


@pytest.mark.parametrize("kind", SINKS)
def test_sinks_into_s3_are_exactly_once_through_a_failure(
    kind: str, executor: str, s3_server: S3Server
) -> None:
    """Rows, Parquet and Delta into s3://, a failure after some checkpoints: every number is
    committed once, and no upload of the failed attempt is left in the bucket."""
    n = 8_000
    probe = Probe()
    prefix = s3_server.unique_prefix(kind)
    env = s3_env(s3_server, prefix, executor)
    (
        env.from_source(HoldingSequence(0, n - 1, hold_after=500, more_per_checkpoint=500), source_name="n")
        .map(FailOnceMap("failing", probe, n // 2, seed=5))
        .map(lambda x: {"n": x})
        .sink_to(sink_into(kind, f"{prefix}/out"))
    )
    env.execute(f"{kind} into s3")
    assert probe.get("failures") >= 1
    numbers = committed_numbers(s3_server, kind, f"{prefix}/out")
    assert sorted(numbers) == list(range(n))  # none lost, none twice
    assert uploads_left(s3_server, f"{prefix}/out") == []


def test_a_part_uploaded_but_not_committed_is_invisible_and_a_restore_commits_it(s3_server: S3Server) -> None:
    """The failure between upload and commit: at the checkpoint the part is uploaded and not
    completed (nothing under its name); the task dies before the checkpoint's notice. The
    restored attempt commits what the checkpoint holds (twice is once) and aborts the upload
    the checkpoint does not hold."""
    uri = f"{s3_server.unique_prefix('commit')}/out"
    sink = FileSink.for_row_format(uri, JsonLinesEncoder()).build()
    sink.configure(s3_server.flink_config())
    first = sink.create_writer(SinkWriterContext(0, 1, 0, "job", "job"))
    first.write_batch([{"n": 1}, {"n": 2}])
    checkpointed = first.prepare_commit(1)  # in checkpoint 1
    first.write_batch([{"n": 3}])
    lost = first.prepare_commit(2)  # checkpoint 2 never completes
    fs = s3_server.fs()
    assert fs.find(uri.removeprefix("s3://")) == []  # nothing visible, not even a hidden name
    assert len(uploads_left(s3_server, uri)) == 2
    # the task dies here, its writer never closed; the job restores checkpoint 1
    committer = sink.create_committer()
    committer.commit(checkpointed)
    committer.commit(checkpointed)  # a replayed commit changes nothing
    restored = sink.create_writer(
        SinkWriterContext(0, 1, 1, "job", "job", is_restored=True, restored_committables=tuple(checkpointed))
    )
    restored.close()
    assert committed_numbers(s3_server, "rows", uri) == [1, 2]
    assert uploads_left(s3_server, uri) == []  # checkpoint 2's upload was aborted
    assert lost and lost[0].final_path not in fs.find(uri.removeprefix("s3://"))


# ---------------------------------------------------------------------- outages, credentials


@pytest.mark.slow  # about 5 s: the outage lasts until a checkpoint has expired (2 s timeout)
def test_an_outage_fails_checkpoints_on_time_and_the_job_resumes_exactly(
    executor: str, s3_server: S3Server
) -> None:
    """The server freezes (every request hangs) while the job checkpoints into it and commits
    its files there: checkpoints expire at their 2 s timeout, within tolerance; the JobMaster
    answers the whole time; once the server is back the job goes on and ends exactly once.
    The outage lasts until a checkpoint has expired (an event, not a guess at time)."""
    n, timeout_ms = 6_000, 2_000
    prefix = s3_server.unique_prefix("outage")
    env = s3_env(
        s3_server,
        prefix,
        executor,
        interval_ms=200,
        **{
            "execution.checkpointing.timeout": timeout_ms,
            "execution.checkpointing.tolerable-failed-checkpoints": 1000,
        },
    )
    (
        env.from_source(HoldingSequence(0, n - 1, hold_after=300, more_per_checkpoint=300), source_name="n")
        .map(lambda x: {"n": x})
        .sink_to(sink_into("rows", f"{prefix}/out"))
    )
    client = env.execute_async("outage")
    wait_for_checkpoints(client, 2)
    latencies = []
    with s3_server.outage():
        deadline = time.monotonic() + 120
        while True:
            asked = time.monotonic()
            stats = client.get_checkpoint_statistics(timeout=60)
            latencies.append(time.monotonic() - asked)
            if stats["counts"]["failed"] >= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    client.get_job_execution_result(300)

    assert stats["counts"]["failed"] >= 1, "no checkpoint expired while the storage hung"
    assert max(latencies) < timeout_ms / 1000, f"the JobMaster stalled: {max(latencies):.1f} s"
    # the history as the outage ended: it keeps the latest checkpoints only, and on a loaded
    # machine the completed ones after the outage pushed the expired ones out by the job's end
    failed = [c for c in stats["history"] if c["status"] == "FAILED"]
    assert failed and all("EXPIRED" in c["failure_message"] for c in failed), failed
    assert all(c["end_to_end_duration"] < timeout_ms + 2_000 for c in failed), failed  # on time
    assert client.restarts == 0  # within tolerance: no failover
    assert sorted(committed_numbers(s3_server, "rows", f"{prefix}/out")) == list(range(n))
    assert uploads_left(s3_server, f"{prefix}/out") == []


def test_wrong_credentials_are_one_clear_error_at_submission(
    s3_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong secret: the job fails before any task runs, with one error that names the
    storage and the cause; no restart. For checkpoint storage and for a sink alike."""
    prefix = s3_server.unique_prefix("creds")
    env = s3_env(s3_server, prefix, "local", **{"s3.secret-key": "not the secret"})
    env.from_sequence(0, 10).print()
    with pytest.raises(StorageError) as raised:
        env.execute("wrong secret")
    message = str(raised.value)
    assert f"checkpoint storage '{prefix}/ck'" in message and s3_server.endpoint in message
    assert "signature" in message and "s3.secret-key" in message
    assert not [r for r in caplog.records if "Restarting job" in r.getMessage()]
    others = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert others == [], others  # the one error, not a trail of others from the same cause

    sink_env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    sink_env.configure(s3_server.flink_config(**{"s3.access-key": "nobody"}))
    sink_env.from_sequence(0, 10).map(lambda x: {"n": x}).sink_to(sink_into("rows", f"{prefix}/out"))
    with pytest.raises(InvalidProgramError) as refused:
        sink_env.execute("wrong key")
    assert f"FileSink cannot write to '{prefix}/out'" in str(refused.value)
    assert s3_server.endpoint in str(refused.value)


def test_the_aws_environment_variables_work_and_flinks_keys_win(
    executor: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No s3.* key at all: AWS_ENDPOINT_URL and the key pair of the submitting process reach
    every task (a Spark slot started before they were set too). Then wrong variables with
    Flink's keys set: the keys win."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    prefix = s3_server.unique_prefix("env")
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    env.configure(
        {"execution.checkpointing.dir": f"{prefix}/ck", "execution.checkpointing.data-inline-threshold": 0}
    )
    n = 2_000
    (
        env.from_source(HoldingSequence(0, n - 1, hold_after=250, more_per_checkpoint=250), source_name="n")
        .map(lambda x: {"n": x})
        .sink_to(sink_into("rows", f"{prefix}/out"))
    )
    env.execute("aws variables")
    assert sorted(committed_numbers(s3_server, "rows", f"{prefix}/out")) == list(range(n))

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    options = ObjectStoreOptions.from_configuration(s3_server.flink_config())
    assert options.s3_endpoint_url == s3_server.endpoint and options.s3_access_key == ACCESS_KEY
    assert SECRET_KEY not in repr(options)


def test_flinks_keys_map_to_s3fs_and_delta_rs_options() -> None:
    """Flink's spellings (the older s3.access.key too), a bare endpoint as https, path style."""
    options = ObjectStoreOptions.from_configuration(
        {
            "s3.endpoint": "minio:9000",
            "s3.access.key": "ak",
            "s3.secret.key": "sk",
            "s3.path.style.access": "true",
        },
        environ={"AWS_ACCESS_KEY_ID": "env-ak", "AWS_SESSION_TOKEN": "env-token", "AWS_REGION": "eu-west-1"},
    )
    assert options.fsspec_kwargs("s3") == {
        "use_listings_cache": False,
        "endpoint_url": "https://minio:9000",
        "key": "ak",
        "secret": "sk",
        "client_kwargs": {"region_name": "eu-west-1"},
        "config_kwargs": {"s3": {"addressing_style": "path"}},
    }  # the variables' session token belongs to their key pair, not to the configured one
    assert options.rust_object_store_options() == {
        "AWS_ENDPOINT_URL": "https://minio:9000",
        "AWS_ACCESS_KEY_ID": "ak",
        "AWS_SECRET_ACCESS_KEY": "sk",
        "AWS_REGION": "eu-west-1",
        "AWS_FORCE_PATH_STYLE": "true",
    }
    assert "sk" not in repr(options) and options.fsspec_kwargs("gs") == {}


def test_the_snapshot_key_kept_in_an_s3_checkpoint_directory(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without CHANDY_SNAPSHOT_KEY the key is generated into <checkpoint dir>/.chandy-snapshot-key
    in the bucket, created exclusively (a conditional PUT): a second driver reads the same key."""
    monkeypatch.delenv("CHANDY_SNAPSHOT_KEY")
    prefix = s3_server.unique_prefix("key")
    config = Configuration(s3_server.flink_config(**{"execution.checkpointing.dir": f"{prefix}/ck"}))
    first = snapshot_key(config)
    second = snapshot_key(config)
    assert first is not None and second is not None and first.secret == second.secret
    assert first.source == f"key file {prefix}/ck/.chandy-snapshot-key"
    fs, path = resolve(
        f"{prefix}/ck/.chandy-snapshot-key", options=ObjectStoreOptions.from_configuration(config)
    )
    assert isinstance(fs, FsspecFileSystem) and not fs.create_exclusive(path, b"another key")  # taken
    assert fs.read(path).strip() == first.secret


def test_the_test_s3_servers_ports_are_below_the_ephemeral_range() -> None:
    """Ports drawn for weed are ones no outgoing connection of a parallel test can take
    between the draw and weed's bind (the kernel picks those from the ephemeral range)."""
    from bench.s3_server import _ephemeral_ports, free_port

    low, _ = _ephemeral_ports()
    assert all(10000 <= free_port() < low for _ in range(50))


@pytest.mark.slow  # weed takes ~40 s to exit after a failed bind
def test_the_test_s3_server_starts_on_other_ports_when_one_drawn_free_was_taken(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite runs in parallel: a port drawn free may be bound by another process before
    weed binds it. weed exits ("address already in use") and the server starts on new ports
    instead of failing every S3 test of the run."""
    import socket

    import bench.s3_server

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = bench.s3_server.free_port
    # the volume server's port is drawn fourth (after the S3, master and master gRPC ones)
    calls = {"n": 0}

    def free_port_with_one_taken() -> int:
        calls["n"] += 1
        return int(taken.getsockname()[1]) if calls["n"] == 4 else real()

    monkeypatch.setattr(bench.s3_server, "free_port", free_port_with_one_taken)
    server = S3Server(tmp_path)
    try:
        assert server._ports["volume"] == taken.getsockname()[1]
        server.start()
        assert server._ports["volume"] != taken.getsockname()[1]
        assert server.fs().exists("chandy")
        assert "address already in use" in server.log_path.read_text()
    finally:
        server.stop()
        taken.close()
