"""Restoring a job: claim modes (NO_CLAIM keeps the snapshot, CLAIM owns it), what is refused at
submit and why, ``_metadata``'s descriptive fields, fixed job ids and the discovery of a job's
own checkpoints for a driver restart (the restart itself: tests/test_driver_restart.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from chandy import (
    ConfigurationError,
    InvalidCheckpointError,
    JobExecutionError,
    StreamExecutionEnvironment,
)
from chandy.checkpoint.completed_checkpoint import restored_checkpoint
from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.checkpoint.metadata import MAGIC, VERSION, CheckpointMetadata, deserialize, serialize
from chandy.checkpoint.properties import CheckpointProperties
from chandy.checkpoint.recovery import find_job_checkpoints
from chandy.config.options import ExternalizedCheckpointRetention
from chandy.core.functions import (
    FunctionInitializationContext,
    KeyedProcessFunction,
    MapFunction,
    RuntimeContext,
)
from chandy.core.state import ListStateDescriptor, ValueStateDescriptor
from chandy.graph.job_graph import validate_job_id
from chandy.state.heap import IncompatibleRestoredStateError
from chandy.storage.checkpoint_storage import CheckpointStorage
from chandy.storage.snapshot_key import SnapshotKey, environment_key
from tests.jobs import CountingMap, HoldingSequence, KeyedCounter, Throttle
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too
from tests.test_checkpointing_e2e import (
    cancel_keeping_results,
    checkpointing_env,
    drain,
    latest_checkpoint_dir,
    wait_for_checkpoints,
)

N, KEYS = 6_000, 6
#: Every state in a file of its own, so that a deleted snapshot cannot go unnoticed.
#: Small batches, so that a barrier waits behind a few throttled records rather than 1024.
FILES = {"execution.checkpointing.data-inline-threshold": 0, "chandy.network.batch-size": 20}


class ListCounter(KeyedProcessFunction):
    """KeyedCounter with its "count" declared as list state (a changed descriptor kind)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_list_state(ListStateDescriptor("count"))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        self.count.add(1)
        yield ctx.get_current_key(), sum(self.count.get())


class PassThrough(KeyedProcessFunction):
    """Keeps a keyed value state (so it has state to claim) and emits every record."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen"))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        self.seen.update((self.seen.value() or 0) + 1)
        yield value


class OpenCounter(MapFunction):
    """Counts how often subtask 0 opened (once per attempt) in a file: restarts show."""

    def __init__(self, path: str) -> None:
        self.path = path

    def open(self, runtime_context: RuntimeContext) -> None:
        if runtime_context.get_index_of_this_subtask() == 0:
            with open(self.path, "a") as f:
                f.write("open\n")

    def map(self, value: Any) -> Any:
        return value


#: A restored run that must take checkpoints of its own before it ends: each source subtask
#: emits 250 numbers per completed checkpoint (at least 1,500 are left after a retained run).
PACED = {"hold_after": 250, "more_per_checkpoint": 250}


def counter_job(
    env: StreamExecutionEnvironment,
    hold_after: int | None = None,
    more_per_checkpoint: int = 0,
    *,
    uid: str = "counter",
    extra: bool = False,
) -> Any:
    """A sequence into a keyed count (see :class:`HoldingSequence` for ``hold_after`` and
    ``more_per_checkpoint``); ``extra`` adds a second stateful operator."""
    source = HoldingSequence(0, N - 1, hold_after, more_per_checkpoint)
    stream = env.from_source(source, source_name="numbers").uid("source").map(Throttle(0.0)).uid("throttle")
    if extra:
        stream = stream.key_by(lambda x: x % 2).process(PassThrough()).uid("extra")
    return stream.key_by(lambda x: x % KEYS).process(KeyedCounter(N // KEYS)).uid(uid)


def retained_run(base: Path, *, extra: bool = False, **config: Any) -> tuple[list[Any], Path]:
    """Run the counter job, cancel it after its first checkpoint; its output and retained checkpoint.
    Its source subtasks stop half-way, so the job is still running then (no key is complete)."""
    env = checkpointing_env(
        interval_ms=30,
        **{
            "execution.checkpointing.dir": str(base),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
            **FILES,
            **config,
        },
    )
    results = counter_job(env, N // 4, extra=extra).execute_and_collect("first run")
    out, reader = drain(results)
    wait_for_checkpoints(base, 1)
    cancel_keeping_results(results, reader)
    return out, latest_checkpoint_dir(base)


def contents(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` with the SHA-256 of its bytes."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def expected() -> list[tuple[int, int]]:
    return [(k, N // KEYS) for k in range(KEYS)]


def restored_env(
    base: Path, restore: Path, parallelism: int = 2, **config: Any
) -> StreamExecutionEnvironment:
    env = checkpointing_env(
        parallelism=parallelism,
        interval_ms=20,
        **{"execution.checkpointing.dir": str(base), **FILES, **config},
    )
    env.set_restore_path(str(restore))
    return env


# ---------------------------------------------------------------------- claim modes


@pytest.mark.slow
@on_rocksdb_too()
def test_no_claim_never_deletes_the_restored_checkpoint_and_the_next_one_stands_alone(tmp_path: Path) -> None:
    first, retained = retained_run(tmp_path / "a")
    before = contents(retained)

    # A run that finishes after many checkpoints of its own (one retained at a time).
    env = restored_env(tmp_path / "b", retained)
    results = counter_job(env, **PACED).execute_and_collect("finishes")
    second = list(results)
    stats = results.job_client.get_checkpoint_statistics()
    assert stats["counts"]["completed"] >= 5, stats["counts"]
    assert stats["latest"]["restored"]["external_path"] == str(retained)
    assert sorted(first + second) == expected()
    assert contents(retained) == before, "the job deleted or changed files of the snapshot it started from"

    # A run that is cancelled after checkpoints of its own, its last one retained.
    env = restored_env(
        tmp_path / "c",
        retained,
        **{"execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"},
    )
    results = counter_job(env, 250).execute_and_collect("cancelled")  # holds: no key completes
    third, reader = drain(results)
    wait_for_checkpoints(tmp_path / "c", 1)
    deadline = time.monotonic() + 120
    while results.job_client.get_checkpoint_statistics()["counts"]["completed"] < 3:
        assert time.monotonic() < deadline, "the held job took no 3 checkpoints in 120 s"
        time.sleep(0.01)
    cancel_keeping_results(results, reader)
    assert contents(retained) == before

    # That run's checkpoint needs nothing of the snapshot the run started from.
    shutil.rmtree(retained.parent.parent)
    own = latest_checkpoint_dir(tmp_path / "c")
    env = restored_env(tmp_path / "d", own)
    fourth = list(counter_job(env).execute_and_collect("from the restored run's checkpoint"))
    assert sorted(first + third + fourth) == expected()


@pytest.mark.slow
@on_rocksdb_too()
def test_claim_deletes_the_restored_checkpoint_once_subsumed(tmp_path: Path) -> None:
    first, retained = retained_run(tmp_path / "a")
    env = restored_env(tmp_path / "b", retained, **{"execution.state-recovery.claim-mode": "CLAIM"})
    results = counter_job(env, **PACED).execute_and_collect("claims")
    second = list(results)
    assert sorted(first + second) == expected()
    assert results.job_client.get_checkpoint_statistics()["counts"]["completed"] >= 2
    assert not retained.exists(), "a claimed checkpoint is deleted once a newer one subsumed it"


def as_savepoint(checkpoint: Path, target: Path) -> Path:
    """A copy of a retained checkpoint that says it is a savepoint (what a savepoint is on disk)."""
    shutil.copytree(checkpoint, target)
    metadata, _ = load_checkpoint_metadata(str(target), suite_key())
    metadata.checkpoint_type = "SAVEPOINT"
    (target / "_metadata").write_bytes(serialize(metadata, suite_key(), str(target)))
    return target


@pytest.mark.slow
@on_rocksdb_too(incremental=False)  # as_savepoint copies chk-N alone, as a savepoint is
def test_claim_owns_even_a_savepoint_and_no_claim_keeps_it_also_at_another_parallelism(
    tmp_path: Path,
) -> None:
    first, retained = retained_run(tmp_path / "a")
    kept = as_savepoint(retained, tmp_path / "savepoints" / "savepoint-000001-kept")
    claimed = as_savepoint(retained, tmp_path / "savepoints" / "savepoint-000002-claimed")
    before = contents(kept)

    env = restored_env(tmp_path / "b", kept, parallelism=3)
    results = counter_job(env, **PACED).execute_and_collect("no claim, rescaled")
    assert sorted(first + list(results)) == expected()
    assert results.job_client.get_checkpoint_statistics()["latest"]["restored"]["is_savepoint"] is True
    assert contents(kept) == before

    env = restored_env(
        tmp_path / "c", claimed, parallelism=3, **{"execution.savepoint-restore-mode": "CLAIM"}
    )
    assert (
        sorted(first + list(counter_job(env, **PACED).execute_and_collect("claim, rescaled"))) == expected()
    )
    assert not claimed.exists()


# ---------------------------------------------------------------------- refused at submit


def test_state_of_a_removed_operator_is_refused_naming_it_and_both_fixes(tmp_path: Path) -> None:
    _, retained = retained_run(tmp_path / "a", extra=True)
    env = restored_env(tmp_path / "b", retained)
    counter_job(env).print()
    with pytest.raises(InvalidCheckpointError) as info:
        env.execute()
    message = str(info.value)
    assert str(retained) in message
    assert "uid 'extra'" in message and "KeyedProcess" in message
    assert "execution.state-recovery.ignore-unclaimed-state: true" in message
    assert "--allow-non-restored-state" in message
    assert ".uid('extra')" in message
    assert "uid 'counter'" not in message  # only what has no place in the new job


def test_with_ignore_unclaimed_state_a_removed_operators_state_is_skipped(tmp_path: Path) -> None:
    first, retained = retained_run(tmp_path / "a", extra=True)
    env = restored_env(tmp_path / "b", retained, **{"execution.state-recovery.ignore-unclaimed-state": True})
    second = list(counter_job(env).execute_and_collect())
    assert sorted(first + second) == expected()  # the kept operator's state came back


def test_a_changed_max_parallelism_is_refused_naming_operator_uid_and_fix(tmp_path: Path) -> None:
    _, retained = retained_run(tmp_path / "a")
    env = restored_env(tmp_path / "b", retained)
    env.set_max_parallelism(256)
    counter_job(env).print()
    with pytest.raises(InvalidCheckpointError) as info:
        env.execute()
    message = str(info.value)
    assert "uid 'counter'" in message and "max parallelism 128" in message and "now has 256" in message
    assert "set_max_parallelism(128)" in message


def test_keyed_state_for_an_operator_no_longer_keyed_is_refused_at_submit(tmp_path: Path) -> None:
    _, retained = retained_run(tmp_path / "a")
    env = restored_env(tmp_path / "b", retained)
    env.from_sequence(0, 10).uid("source").map(Throttle(0.0)).uid("throttle").map(lambda x: x).uid(
        "counter"
    ).print()
    with pytest.raises(InvalidCheckpointError) as info:
        env.execute()
    assert "uid 'counter'" in str(info.value) and "keyed stream" in str(info.value)


def fails_at_once(env: StreamExecutionEnvironment, *parts: str) -> JobExecutionError:
    """Run the job: it must fail without a single restart, with every one of ``parts`` in the error."""
    client = env.execute_async()
    with pytest.raises(JobExecutionError) as info:
        client.get_job_execution_result(timeout=120)
    message = str(info.value)
    for part in parts:
        assert part in message, (part, message)
    assert client.restarts == 0, "an incompatible state must fail the job, not restart it"
    return info.value


@on_rocksdb_too(executor="local")
def test_a_state_that_changed_kind_fails_the_job_at_once_naming_everything(
    tmp_path: Path, executor: str
) -> None:
    _, retained = retained_run(tmp_path / "a")
    env = restored_env(tmp_path / "b", retained, executor=executor)
    opened = tmp_path / "opened"
    (
        env.from_sequence(0, N - 1)
        .uid("source")
        .map(OpenCounter(str(opened)))
        .uid("throttle")
        .key_by(lambda x: x % KEYS)
        .process(ListCounter())
        .uid("counter")
        .print()
    )
    error = fails_at_once(
        env,
        "uid 'counter'",
        "state 'count'",
        "as value state",
        "as list state",
        "ValueStateDescriptor",
        "ignore-unclaimed-state",  # the way to start the operator without its state
    )
    if executor == "local":
        assert isinstance(error.__cause__, IncompatibleRestoredStateError)
    assert opened.read_text().count("open") == 1


# ---------------------------------------------------------------------- _metadata


def test_metadata_names_uids_operators_and_state_kinds(tmp_path: Path) -> None:
    _, retained = retained_run(tmp_path / "a")
    metadata, _ = load_checkpoint_metadata(str(retained), suite_key())
    by_uid = {op.uid: op for op in metadata.operator_states}
    counter = by_uid["counter"]
    assert counter.name is not None and "KeyedProcess" in counter.name
    kinds = {
        kind for s in counter.subtask_states.values() for h in s.managed_keyed_state for kind in h.state_kinds
    }
    assert ("count", "value") in kinds
    assert by_uid["source"].name is not None


def _v1_file(body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = struct.pack(">8sIQ", MAGIC, 1, len(payload)) + payload
    return head + hashlib.sha256(head).digest()


def test_metadata_written_before_the_optional_fields_existed_still_reads() -> None:
    assert VERSION == 1  # optional fields did not need a new version
    old = {
        "checkpoint_id": 7,
        "job_id": "j",
        "timestamp": 1,
        "checkpoint_type": "CHECKPOINT",
        "operators": [
            {
                "operator_id": "op",
                "parallelism": 1,
                "max_parallelism": 128,
                "subtasks": {
                    "0": {
                        "finished": False,
                        "keyed": [
                            {
                                "key_group_range": [0, 1],
                                "ranges": [[0, 1], [1, 2]],
                                "delegate": {"type": "bytes", "name": "x", "data": "AAA="},
                            }
                        ],
                        "operator": [],
                    }
                },
            }
        ],
        "master_states": [],
    }
    metadata = deserialize(_v1_file(old), "old/_metadata", trust=True)
    (operator,) = metadata.operator_states
    assert operator.uid is None and operator.name is None
    assert operator.subtask_states[0].managed_keyed_state[0].state_kinds == ()
    # written again, it reads back the same, and with the fields set they round-trip
    operator.uid, operator.name = "u", "Map"
    again = deserialize(serialize(metadata, suite_key()), "new/_metadata", key=suite_key())
    assert (again.operator_states[0].uid, again.operator_states[0].name) == ("u", "Map")
    assert again.operator_states[0].describe() == "operator 'Map' (uid 'u', operator id op)"


# ---------------------------------------------------------------------- job ids and driver restart discovery


def test_a_fixed_job_id_must_be_32_hex_digits() -> None:
    assert validate_job_id("ABCDEF0123456789abcdef0123456789") == "abcdef0123456789abcdef0123456789"
    for bad in ("", "abc", "g" * 32, "0" * 33, "my-job"):
        with pytest.raises(ConfigurationError, match=r"32 hexadecimal digits.*python -c"):
            validate_job_id(bad)
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.configure({"$internal.pipeline.job-id": "not-a-job-id"})
    env.from_sequence(0, 3).print()
    with pytest.raises(ConfigurationError, match="job-id"):
        env.execute()
    env.configure({"$internal.pipeline.job-id": "0123456789ABCDEF0123456789abcdef"})
    collected = env.from_sequence(0, 3).execute_and_collect()
    assert sorted(collected) == [0, 1, 2, 3]
    assert collected.job_client.get_job_id() == "0123456789abcdef0123456789abcdef"


def test_discovery_takes_the_latest_valid_checkpoint_and_ids_go_on_after_all_on_disk(tmp_path: Path) -> None:
    _, retained = retained_run(tmp_path / "a")
    job_dir = retained.parent
    storage = CheckpointStorage(str(tmp_path / "a"), job_dir.name)
    source_id = int(retained.name.split("-")[1])
    good = [source_id + 1, source_id + 2]
    for checkpoint_id in good:  # copies of the retained one, renumbered: valid checkpoints
        target = job_dir / f"chk-{checkpoint_id}"
        shutil.copytree(retained, target)
        metadata, _ = load_checkpoint_metadata(str(target), suite_key())
        metadata.checkpoint_id = checkpoint_id
        (target / "_metadata").write_bytes(serialize(metadata, suite_key(), str(target)))
    corrupt = job_dir / f"chk-{source_id + 3}"
    shutil.copytree(job_dir / f"chk-{good[-1]}", corrupt)
    data = bytearray((corrupt / "_metadata").read_bytes())
    data[40] ^= 1
    (corrupt / "_metadata").write_bytes(bytes(data))
    missing_file = job_dir / f"chk-{source_id + 4}"
    shutil.copytree(job_dir / f"chk-{good[-1]}", missing_file)
    metadata, _ = load_checkpoint_metadata(str(missing_file), suite_key())
    metadata.checkpoint_id = source_id + 4
    (missing_file / "_metadata").write_bytes(serialize(metadata, suite_key(), str(missing_file)))
    next(p for p in missing_file.iterdir() if p.name != "_metadata").unlink()
    (job_dir / f"chk-{source_id + 5}").mkdir()  # a checkpoint the driver never completed

    found = find_job_checkpoints(storage)
    assert [c.metadata.checkpoint_id for c in found.completed] == [source_id, *good]
    assert found.latest is not None and found.latest.directory == str(job_dir / f"chk-{good[-1]}")
    assert {s.checkpoint_id: s for s in found.skipped}.keys() == {source_id + 3, source_id + 4}
    reasons = {s.checkpoint_id: s.reason for s in found.skipped}
    assert "corrupt" in reasons[source_id + 3] and "missing" in reasons[source_id + 4]
    assert found.incomplete == (source_id + 5,)
    assert found.next_checkpoint_id == source_id + 6


@pytest.mark.slow
@on_rocksdb_too()  # its own retained checkpoints, shared files included, are the job's again
def test_a_job_submitted_again_under_its_id_owns_its_checkpoints_and_skips_broken_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = "feedc0de" * 4
    fixed = {"$internal.pipeline.job-id": job_id}
    first, retained = retained_run(tmp_path, **fixed)
    job_dir = tmp_path / job_id
    assert retained.parent == job_dir
    newest = int(retained.name.split("-")[1])
    broken = job_dir / f"chk-{newest + 1}"
    shutil.copytree(retained, broken)
    (broken / "_metadata").write_bytes(b"CHANDYCK" + b"\0" * 10)  # truncated
    (job_dir / f"chk-{newest + 2}").mkdir()

    # A path given as well is overridden by the job's own, newer checkpoints (Flink's HA).
    _, elsewhere = retained_run(tmp_path / "other")
    env = restored_env(tmp_path, elsewhere, **fixed)
    results = counter_job(env, **PACED).execute_and_collect("again")
    second = list(results)
    assert sorted(first + second) == expected()
    stats = results.job_client.get_checkpoint_statistics()
    assert stats["latest"]["restored"]["id"] == newest
    assert min(c["id"] for c in stats["history"]) > newest + 2
    messages = [r.getMessage() for r in caplog.records]
    resumed = next(i for i, m in enumerate(messages) if "was submitted again" in m)
    assert f"ids continue at {newest + 3}" in messages[resumed]
    first_trigger = next(m for m in messages[resumed:] if m.startswith("Triggering checkpoint"))
    assert first_trigger.startswith(f"Triggering checkpoint {newest + 3} ")  # after every chk-N on disk
    assert str(broken) in caplog.text and "truncated" in caplog.text
    assert not retained.exists()  # its own: deleted once subsumed
    assert not (job_dir / f"chk-{newest + 2}").exists()  # never completed: deleted
    assert broken.exists()  # unusable but complete-looking: left for inspection


@pytest.mark.slow
@on_rocksdb_too()
def test_a_real_savepoint_is_kept_by_no_claim_and_deleted_by_claim_once_subsumed(tmp_path: Path) -> None:
    env = checkpointing_env(interval_ms=30, **{"execution.checkpointing.dir": str(tmp_path / "a"), **FILES})
    results = counter_job(env, N // 4).execute_and_collect("stopped with a savepoint")  # holds half-way
    first, reader = drain(results)
    wait_for_checkpoints(tmp_path / "a", 1)
    savepoint = Path(
        results.job_client.stop_with_savepoint(savepoint_directory=str(tmp_path / "savepoints")).result(60)
    )
    reader.join(30)
    before = contents(savepoint)

    env = restored_env(tmp_path / "b", savepoint, parallelism=3)
    assert sorted(first + list(counter_job(env, **PACED).execute_and_collect())) == expected()
    assert contents(savepoint) == before

    env = restored_env(
        tmp_path / "c", savepoint, parallelism=1, **{"execution.state-recovery.claim-mode": "CLAIM"}
    )
    results = counter_job(env, **PACED).execute_and_collect()
    assert sorted(first + list(results)) == expected()
    assert results.job_client.get_checkpoint_statistics()["latest"]["restored"]["is_savepoint"] is True
    assert not savepoint.exists()


def test_deleting_a_claimed_checkpoint_that_cannot_be_deleted_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    props = CheckpointProperties.for_checkpoint(ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS)
    metadata = CheckpointMetadata(3, "j", 1, "CHECKPOINT", [])
    claimed = restored_checkpoint(metadata, "nosuchscheme://bucket/chk-3", props)
    assert claimed.discard_on_subsume()  # the store's subsumption and the job's end must go on
    assert "Could not delete the claimed checkpoint at nosuchscheme://bucket/chk-3" in caplog.text


def test_a_fixed_job_id_with_nothing_of_its_own_on_disk_starts_from_the_restore_path(tmp_path: Path) -> None:
    first, retained = retained_run(tmp_path / "a")
    env = restored_env(tmp_path / "b", retained, **{"$internal.pipeline.job-id": "ab" * 16})
    results = counter_job(env).execute_and_collect()
    assert sorted(first + list(results)) == expected()
    assert results.job_client.get_checkpoint_statistics()["latest"]["restored"]["external_path"] == str(
        retained
    )


class UnionCountingMap(CountingMap):
    """CountingMap with its operator state declared as a union list instead of a split list."""

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        self.state = context.get_operator_state_store().get_union_list_state(
            ListStateDescriptor(f"{self.name}-count")
        )
        self.count = sum(self.state.get())


def test_operator_state_that_changed_distribution_mode_fails_the_job_at_once(tmp_path: Path) -> None:
    def job(env: StreamExecutionEnvironment, counting: CountingMap) -> Any:
        return (
            env.from_source(HoldingSequence(0, N - 1, N // 4), source_name="numbers")  # holds half-way
            .uid("source")
            .map(Throttle(0.0))
            .uid("throttle")
            .map(counting)
            .uid("map")
            .key_by(lambda x: x % KEYS)
            .process(KeyedCounter(N // KEYS))
            .uid("counter")
        )

    base = tmp_path / "a"
    retain = {"execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"}
    env = checkpointing_env(interval_ms=30, **{"execution.checkpointing.dir": str(base), **FILES, **retain})
    results = job(env, CountingMap("map", Probe())).execute_and_collect()
    _, reader = drain(results)
    wait_for_checkpoints(base, 1)
    cancel_keeping_results(results, reader)

    env = restored_env(tmp_path / "b", latest_checkpoint_dir(base))
    job(env, UnionCountingMap("map", Probe())).print()
    error = fails_at_once(
        env, "uid 'map'", "operator state 'map-count'", "SPLIT_DISTRIBUTE", "get_list_state", "UNION"
    )
    assert isinstance(error.__cause__, IncompatibleRestoredStateError)


def suite_key() -> SnapshotKey:
    """The test suite's snapshot key (tests/conftest.py), which the jobs here sign and check with."""
    key = environment_key()
    assert key is not None
    return key
