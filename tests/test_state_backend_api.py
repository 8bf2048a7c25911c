"""The state backends as a user chooses them: PyFlink's classes and import paths,
``env.set_state_backend`` writing Flink's configuration keys, and a real job on RocksDB that
keeps its database where it was told, reports its backend through the REST API and leaves no
local files behind."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

from chandy import StreamExecutionEnvironment
from chandy.api.state_backend import (
    EmbeddedRocksDBStateBackend,
    HashMapStateBackend,
    RocksDBStateBackend,
    StateBackend,
)

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


def test_a_job_on_the_hashmap_backend_reports_it() -> None:
    env = _env()
    env.enable_checkpointing(50)
    env.from_sequence(0, 99).key_by(lambda x: x % 5).reduce(lambda a, b: a + b).uid("sum").print()
    assert _run_and_ask_the_rest_api_for_the_backend(env) == "HashMapStateBackend"
