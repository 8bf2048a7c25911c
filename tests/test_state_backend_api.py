"""The state backends as a user chooses them: PyFlink's classes and import paths,
``env.set_state_backend`` writing Flink's configuration keys, and a real job on RocksDB that
keeps its database where it was told, reports its backend through the REST API and leaves no
local files behind."""

from __future__ import annotations

import importlib
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

from chandy import InvalidCheckpointError, JobExecutionError, StreamExecutionEnvironment
from chandy.api.state_backend import (
    EmbeddedRocksDBStateBackend,
    HashMapStateBackend,
    RocksDBStateBackend,
    StateBackend,
)
from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.config.options import SavepointFormatType
from chandy.core.functions import KeyedProcessFunction, RuntimeContext
from chandy.core.state import MapStateDescriptor, ValueStateDescriptor
from chandy.state.handles import IncrementalKeyedStateHandle
from chandy.storage.snapshot_key import environment_key
from tests.probes import Probe
from tests.test_checkpointing_e2e import checkpointing_env, drain, wait_for_checkpoints
from tests.test_restore import FILES, N, counter_job, expected, restored_env, retained_run

# ---------------------------------------------------------------------------- import paths


@pytest.mark.parametrize("module", ["chandy.datastream", "chandy.datastream.state_backend"])
@pytest.mark.parametrize(
    "name", ["StateBackend", "HashMapStateBackend", "EmbeddedRocksDBStateBackend", "RocksDBStateBackend"]
)
def test_pyflinks_import_paths_give_chandys_classes(module: str, name: str) -> None:
    """``from pyflink.datastream.state_backend import EmbeddedRocksDBStateBackend`` ports by
    replacing ``pyflink`` with ``chandy``; the re-export is the very class, not a copy."""
    loaded = importlib.import_module(module)
    assert name in loaded.__all__
    assert getattr(loaded, name) is getattr(importlib.import_module("chandy.api.state_backend"), name)


# ---------------------------------------------------------------------------- configuration keys


def _env() -> StreamExecutionEnvironment:
    return StreamExecutionEnvironment.get_execution_environment(executor="local")


def test_no_backend_is_set_by_default_and_the_hashmap_one_applies() -> None:
    env = _env()
    assert env.get_state_backend() is None
    assert "state.backend.type" not in env.get_configuration().to_dict()


def test_rocksdb_with_incremental_checkpoints_writes_flinks_keys() -> None:
    env = _env()
    backend = EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=True)
    assert env.set_state_backend(backend) is env
    config = env.get_configuration().to_dict()
    assert config["state.backend.type"] == "rocksdb"
    assert config["execution.checkpointing.incremental"] is True
    assert "state.backend.rocksdb.localdir" not in config
    assert env.get_state_backend() == backend
    assert env.get_state_backend().is_incremental_checkpoints_enabled()  # type: ignore[union-attr]


def test_incremental_left_undefined_leaves_the_configured_value() -> None:
    """Flink's ``TernaryBoolean.UNDEFINED``: the backend does not overrule the configuration."""
    env = _env().configure({"execution.checkpointing.incremental": True})
    env.set_state_backend(EmbeddedRocksDBStateBackend())
    assert env.get_configuration().to_dict()["execution.checkpointing.incremental"] is True
    assert EmbeddedRocksDBStateBackend().is_incremental_checkpoints_enabled() is False
    restored = env.get_state_backend()
    assert isinstance(restored, EmbeddedRocksDBStateBackend) and restored.is_incremental_checkpoints_enabled()

    env.set_state_backend(EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=False))
    assert env.get_configuration().to_dict()["execution.checkpointing.incremental"] is False


def test_db_storage_paths_become_the_local_directories(tmp_path: Path) -> None:
    backend = EmbeddedRocksDBStateBackend()
    backend.set_db_storage_paths(str(tmp_path / "a"), tmp_path / "b")
    assert backend.get_db_storage_paths() == [str(tmp_path / "a"), str(tmp_path / "b")]
    env = _env().set_state_backend(backend)
    assert env.get_configuration().to_dict()["state.backend.rocksdb.localdir"] == (
        f"{tmp_path / 'a'},{tmp_path / 'b'}"
    )
    assert env.get_state_backend() == backend  # read back from the key

    backend.set_db_storage_paths()
    assert backend.get_db_storage_paths() == []
    backend.set_db_storage_paths(None)
    assert backend.get_db_storage_paths() == []


def test_a_configured_backend_is_reported_by_get_state_backend() -> None:
    env = _env().configure({"state.backend.type": "rocksdb", "state.backend.rocksdb.localdir": "/x, /y"})
    backend = env.get_state_backend()
    assert isinstance(backend, EmbeddedRocksDBStateBackend)
    assert backend.get_db_storage_paths() == ["/x", "/y"]
    assert not backend.is_incremental_checkpoints_enabled()
    # Flink 1.x's key for the backend still reads
    assert _env().configure({"state.backend": "hashmap"}).get_state_backend() == HashMapStateBackend()


def test_switching_back_to_the_hashmap_backend() -> None:
    env = _env().set_state_backend(EmbeddedRocksDBStateBackend(True))
    env.set_state_backend(HashMapStateBackend())
    assert env.get_configuration().to_dict()["state.backend.type"] == "hashmap"
    assert env.get_state_backend() == HashMapStateBackend()
    assert str(HashMapStateBackend()) == "HashMapStateBackend"
    assert "incremental=TRUE" in str(EmbeddedRocksDBStateBackend(True))


def test_the_settings_reach_the_job_as_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program's backend wins over what `chandy run` passed, like every program setting."""
    monkeypatch.setenv(
        "CHANDY_CONFIG", '{"state.backend.type": "hashmap", "state.backend.incremental": false}'
    )
    env = _env().set_state_backend(EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=True))
    backend = env.get_state_backend()
    assert isinstance(backend, EmbeddedRocksDBStateBackend) and backend.is_incremental_checkpoints_enabled()


# ---------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("value", ["rocksdb", None, EmbeddedRocksDBStateBackend, 1])
def test_set_state_backend_refuses_what_is_not_a_backend_naming_the_fix(value: Any) -> None:
    with pytest.raises(TypeError, match=r"set_state_backend\(\) takes a state backend.*state\.backend\.type"):
        _env().set_state_backend(value)


@pytest.mark.parametrize("value", ["true", 1, 0, "None"])
def test_incremental_must_be_a_bool_or_none(value: Any) -> None:
    with pytest.raises(TypeError, match=r"enable_incremental_checkpointing=.*True, False or None"):
        EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=value)


def test_db_storage_paths_must_be_paths() -> None:
    backend = EmbeddedRocksDBStateBackend()
    with pytest.raises(TypeError, match=r"str or os.PathLike, got 3 \(int\)"):
        backend.set_db_storage_paths(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty path"):
        backend.set_db_storage_paths("")
    with pytest.raises(ValueError, match=r"contains ','.*separate directories"):
        backend.set_db_storage_paths("/data/a,b")
    assert backend.get_db_storage_paths() == []  # a refused call changes nothing


def test_the_base_class_is_abstract() -> None:
    with pytest.raises(TypeError):
        StateBackend()  # type: ignore[abstract]


def test_pyflink_1x_rocksdb_state_backend_is_deprecated_and_sets_the_checkpoint_directory(
    tmp_path: Path,
) -> None:
    with pytest.warns(DeprecationWarning, match=r"EmbeddedRocksDBStateBackend\(\).*set_checkpoint_storage"):
        backend = RocksDBStateBackend(str(tmp_path), enable_incremental_checkpointing=True)
    env = _env().set_state_backend(backend)
    config = env.get_configuration().to_dict()
    assert config["execution.checkpointing.dir"] == str(tmp_path)
    assert config["state.backend.type"] == "rocksdb"
    assert config["execution.checkpointing.incremental"] is True
    assert env.get_checkpoint_config().get_checkpoint_storage() == str(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match="checkpoint_data_uri"):
            RocksDBStateBackend(42)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- a real job


class CountAndLook(KeyedProcessFunction):
    """Counts per key in value state and remembers each value in map state; the first record of
    each subtask records what the local directory holds while the job runs (its RocksDB
    instances), a key's 20th its count and map keys."""

    def __init__(self, probe: Probe, local_dir: str) -> None:
        self.probe = probe
        self.local_dir = local_dir
        self.looked = False

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count"))
        self.seen = runtime_context.get_map_state(MapStateDescriptor("seen"))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        if not self.looked:
            self.looked = True
            self.probe.append(("look", sorted(os.listdir(self.local_dir))))
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        self.seen.put(value, count)
        if count == 20:
            self.probe.append(("done", ctx.get_current_key(), count, sorted(self.seen.keys())))
        return ()


def _run_and_ask_the_rest_api_for_the_backend(env: StreamExecutionEnvironment) -> str:
    """Runs the job to its end; the ``state_backend`` of Flink's ``CheckpointConfigInfo``."""
    client = env.execute_async("state backend api job")
    client.get_job_execution_result(timeout=120)
    assert env.rest_url is not None
    try:
        url = f"{env.rest_url}/jobs/{client.get_job_id()}/checkpoints/config"
        return str(httpx.get(url, timeout=30).json()["state_backend"])
    finally:
        env.close()


def test_a_job_on_rocksdb_keeps_its_state_in_the_local_directory_and_reports_its_backend(
    tmp_path: Path,
) -> None:
    local_dir = tmp_path / "rocksdb"
    local_dir.mkdir()
    probe = Probe(str(tmp_path / "probe"))
    env = _env()
    env.set_parallelism(2)
    env.enable_checkpointing(50)
    backend = EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=True)
    backend.set_db_storage_paths(str(local_dir))
    env.set_state_backend(backend)
    env.from_sequence(0, 999).key_by(lambda x: x % 50).process(CountAndLook(probe, str(local_dir))).uid(
        "count"
    ).print()
    assert _run_and_ask_the_rest_api_for_the_backend(env) == "EmbeddedRocksDBStateBackend"

    looks = [item[1] for item in probe.items if item[0] == "look"]
    assert len(looks) == 2 and all(looks), f"no RocksDB files under {local_dir}: {looks}"
    done = sorted(item[1:] for item in probe.items if item[0] == "done")
    assert done == [(k, 20, list(range(k, 1000, 50))) for k in range(50)]  # value and map state
    assert list(local_dir.iterdir()) == [], "the RocksDB instances' directories outlived the job"


def test_a_job_on_the_hashmap_backend_reports_it() -> None:
    env = _env()
    env.enable_checkpointing(50)
    env.from_sequence(0, 99).key_by(lambda x: x % 5).reduce(lambda a, b: a + b).uid("sum").print()
    assert _run_and_ask_the_rest_api_for_the_backend(env) == "HashMapStateBackend"


@pytest.mark.parametrize("state_backend", ["rocksdb"], indirect=True)
def test_the_suites_rocksdb_runs_put_every_environment_on_rocksdb(state_backend: str) -> None:
    """What tests.state_backends.on_rocksdb_too relies on: a test's own environments (and the
    `chandy run` it starts) inherit the backend from CHANDY_CONFIG, so its RocksDB run cannot
    silently be a second run on the heap."""
    backend = _env().get_state_backend()
    assert isinstance(backend, EmbeddedRocksDBStateBackend)
    assert backend.is_incremental_checkpoints_enabled()
    (local_dir,) = backend.get_db_storage_paths()
    assert Path(local_dir).is_dir()


# ---------------------------------------------------------------------------- switching backends

HASHMAP = {"state.backend.type": "hashmap"}
ROCKSDB = {"state.backend.type": "rocksdb", "execution.checkpointing.incremental": True}


def _stop_with_savepoint(
    env: StreamExecutionEnvironment, base: Path, format_type: SavepointFormatType
) -> tuple[list[Any], Path]:
    """Runs the counter job (tests.test_restore) until its first checkpoint, stops it with a
    savepoint under ``base / "savepoints"``: its output, and the savepoint."""
    results = counter_job(env, N // 4).execute_and_collect("until the savepoint")  # holds half-way
    out, reader = drain(results)
    wait_for_checkpoints(base / "checkpoints", 1)
    # Two completed checkpoints of this job: a source subtask that got no split at the new
    # parallelism has finished by then and the coordinator knows it. A savepoint triggered
    # while it was finishing was declined by it (stop-with-savepoint failed, seen under load).
    deadline = time.monotonic() + 120
    while results.job_client.get_checkpoint_statistics(timeout=60)["counts"]["completed"] < 2:
        assert time.monotonic() < deadline, "no two checkpoints in 120 s"
        time.sleep(0.02)
    savepoint = results.job_client.stop_with_savepoint(
        savepoint_directory=str(base / "savepoints"), format_type=format_type
    ).result(60)
    reader.join(30)
    return out, Path(savepoint)


def _env_on(backend: dict[str, Any], base: Path, parallelism: int) -> StreamExecutionEnvironment:
    return checkpointing_env(
        parallelism=parallelism,
        interval_ms=50,
        **{"execution.checkpointing.dir": str(base / "checkpoints"), **FILES, **backend},
    )


def test_canonical_savepoints_move_a_job_from_the_heap_to_rocksdb_and_back_at_other_parallelisms(
    tmp_path: Path,
) -> None:
    """docs/state-backends.md's way to switch backends: heap (2) -> RocksDB with incremental
    checkpoints (3) -> heap (1), through CANONICAL savepoints; every key counted exactly once."""
    first, on_heap = _stop_with_savepoint(
        _env_on(HASHMAP, tmp_path / "a", 2), tmp_path / "a", SavepointFormatType.CANONICAL
    )
    env = _env_on(ROCKSDB, tmp_path / "b", 3)
    env.set_restore_path(str(on_heap))
    second, on_rocksdb = _stop_with_savepoint(env, tmp_path / "b", SavepointFormatType.CANONICAL)
    env = _env_on(HASHMAP, tmp_path / "c", 1)
    env.set_restore_path(str(on_rocksdb))
    third = list(counter_job(env).execute_and_collect("back on the heap"))
    assert sorted(first + second + third) == expected()


@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "full-checkpoints"])
def test_a_native_savepoint_is_self_contained_restores_on_rocksdb_and_is_refused_on_the_heap(
    tmp_path: Path, incremental: bool
) -> None:
    """NATIVE is RocksDB's own files whether or not the job's checkpoints are incremental
    (as in Flink): moved away from its job, it restores rescaled on RocksDB only."""
    backend = {**ROCKSDB, "execution.checkpointing.incremental": incremental}
    first, savepoint = _stop_with_savepoint(
        _env_on(backend, tmp_path / "a", 2), tmp_path / "a", SavepointFormatType.NATIVE
    )
    metadata, _ = load_checkpoint_metadata(str(savepoint), environment_key())
    keyed = [
        h
        for op in metadata.operator_states
        for s in op.subtask_states.values()
        for h in s.managed_keyed_state
    ]
    assert keyed and all(isinstance(h, IncrementalKeyedStateHandle) for h in keyed)
    moved = tmp_path / "moved" / savepoint.name
    moved.parent.mkdir()
    savepoint.rename(moved)
    shutil.rmtree(tmp_path / "a")  # nothing of the job that took it, shared/ included, is needed

    env = _env_on(HASHMAP, tmp_path / "b", 2)
    env.set_restore_path(str(moved))
    counter_job(env).print()
    with pytest.raises(JobExecutionError) as refused:
        env.execute("native savepoint on the heap")
    message = str(refused.value)
    assert "native snapshot" in message and "state.backend.type: rocksdb" in message
    assert "CANONICAL" in message

    env = _env_on(ROCKSDB, tmp_path / "c", 3)
    env.set_restore_path(str(moved))
    second = list(counter_job(env).execute_and_collect("native savepoint on RocksDB, rescaled"))
    assert sorted(first + second) == expected()


def test_an_incremental_checkpoint_needs_its_shared_files_and_moves_with_its_job_directory(
    tmp_path: Path,
) -> None:
    """docs/state-backends.md: a retained incremental checkpoint is its chk-N *and* the files of
    its job's shared/; moved alone it is refused naming the missing file, moved with its job
    directory it restores."""
    first, retained = retained_run(tmp_path / "a", **ROCKSDB)
    job_dir = retained.parent
    assert [p for p in (job_dir / "shared").iterdir()], "an incremental checkpoint shares its SST files"

    alone = tmp_path / "alone" / retained.name
    alone.parent.mkdir()
    shutil.copytree(retained, alone)
    with pytest.raises(InvalidCheckpointError, match=r"shared state file .*/alone/shared/.* is missing"):
        env = restored_env(tmp_path / "b", alone, **ROCKSDB)
        counter_job(env).print()
        env.execute("a checkpoint without its shared files")

    archive = tmp_path / "archive" / job_dir.name
    archive.parent.mkdir()
    job_dir.rename(archive)
    env = restored_env(tmp_path / "c", archive / retained.name, **ROCKSDB)
    second = list(counter_job(env).execute_and_collect("moved with its job directory"))
    assert sorted(first + second) == expected()
