"""A checkpoint or savepoint is data, not code (issue 27 §1; docs/security.md).

A restore unpickles state, so what it restores must be authenticated first: ``_metadata``
is signed (HMAC-SHA256) with the deployment's snapshot key and refused before anything
of it is parsed if the key does not verify it. The crafted snapshots here are what an
attacker who can write to checkpoint storage (or hands a user a savepoint) would write:
every state handle a pickle that touches a marker file when unpickled, with the SHA-256
trailer recomputed. They are built from raw bytes (``struct``, ``hashlib``), not through
chandy's writer, so they are what chandy before signing accepted.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import pickle
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from chandy.checkpoint.completed_checkpoint import discard_location
from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.checkpoint.metadata import MAGIC, VERSION_SIGNED, deserialize, parse, serialize
from chandy.config import Configuration
from chandy.errors import InvalidCheckpointError, UntrustedCheckpointError
from chandy.state.handles import FileStateHandle
from chandy.storage.snapshot_key import KEY_ENV_VAR, KEY_FILE_NAME, SnapshotKey, snapshot_key
from tests.jobs import KeyedCounter, Throttle
from tests.test_checkpointing_e2e import checkpointing_env, retained_checkpoint_of_cancelled_job
from tests.unaligned_jobs import wait_for

ROOT = Path(__file__).resolve().parents[1]


class TouchOnUnpickle:
    """A pickle that, when loaded, creates ``marker``: the stand-in for any command."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def split(data: bytes) -> tuple[int, dict[str, Any]]:
    """Version and JSON body of a ``_metadata`` (any version), read as an attacker would."""
    _, version, length = struct.unpack_from(">8sIQ", data)
    return version, json.loads(data[20 : 20 + length])


def unsigned(body: dict[str, Any], version: int = 1) -> bytes:
    """A ``_metadata`` as chandy wrote it before signing: header, body, SHA-256 trailer."""
    payload = json.dumps(body).encode()
    head = struct.pack(">8sIQ", MAGIC, version, len(payload)) + payload
    return head + hashlib.sha256(head).digest()


def handles(body: dict[str, Any]) -> list[tuple[dict[str, Any], list[list[int]]]]:
    """Every state handle of the body with the byte ranges read from it."""
    found = []
    for op in body["operators"]:
        for subtask in op["subtasks"].values():
            for keyed in subtask["keyed"]:
                found.append((keyed["delegate"], keyed["ranges"]))
            for operator in subtask["operator"]:
                for meta in operator["states"].values():
                    found.append((operator["delegate"], meta["elements"]))
    return found


def poison(directory: Path, marker: Path) -> bytes:
    """Rewrite the snapshot in ``directory`` so that each of its state handles, inline or
    file, is the marker pickle at every byte range a restore reads; return the new body's
    bytes (unsigned, checksum recomputed) and write them as its ``_metadata``."""
    version, body = split((directory / "_metadata").read_bytes())
    assert version == VERSION_SIGNED
    evil = pickle.dumps(TouchOnUnpickle(str(marker)))
    for delegate, ranges in handles(body):
        for byte_range in ranges:
            byte_range[:] = [0, len(evil)]
        if delegate["type"] == "bytes":
            delegate["data"] = base64.b64encode(evil).decode()
        else:
            (directory / delegate["path"]).write_bytes(evil)
            delegate["size"], delegate["sha256"] = len(evil), hashlib.sha256(evil).hexdigest()
    data = unsigned(body)
    (directory / "_metadata").write_bytes(data)
    return data


#: Restores that must succeed start a new source: the snapshots come from an endless one
#: (uid "src"), whose restored position would replay up to a million records.
FRESH_SOURCE = {"source_uid": "fresh-src", "execution.savepoint.ignore-unclaimed-state": True}


def restore(directory: Path, executor: str, source_uid: str = "src", **config: Any) -> list[Any]:
    """Run the keyed counting job (uids ``source_uid``, "counter") restored from ``directory``."""
    # no restarts: before signing, the crafted state ran and failed the job over and over
    env = checkpointing_env(executor=executor, **{"restart-strategy.type": "none", **config})
    env.set_restore_path(str(directory))
    stream = env.from_sequence(0, 5).uid(source_uid).map(Throttle(0)).key_by(lambda x: x % 3)
    return list(stream.process(KeyedCounter(10**9)).uid("counter").execute_and_collect())


# ---------------------------------------------------------------------- crafted snapshots


@pytest.mark.parametrize("inline", [True, False], ids=["inline-state", "file-state"])
def test_a_crafted_snapshot_is_refused_and_runs_nothing(tmp_path: Path, executor: str, inline: bool) -> None:
    """Before signing, this restore unpickled the crafted state: in the driver (local) or the
    slot process (Spark) the marker appeared. Now the driver refuses the file unread."""
    threshold = 20 * 1024 if inline else 0
    retained = retained_checkpoint_of_cancelled_job(
        tmp_path / "checkpoints", **{"execution.checkpointing.data-inline-threshold": threshold}
    )
    marker = tmp_path / "ran-the-attackers-code"
    poison(retained, marker)
    kinds = {d["type"] for d, _ in handles(split((retained / "_metadata").read_bytes())[1])}
    assert kinds == {"bytes"} if inline else "file" in kinds

    with pytest.raises(InvalidCheckpointError) as error:
        restore(retained, executor)

    assert not marker.exists()
    message = str(error.value)
    assert str(retained / "_metadata") in message and "not signed" in message
    assert "--trust-snapshot" in message and "execution.state-recovery.trust-snapshot" in message


def test_a_crafted_snapshot_signed_with_another_key_is_refused(tmp_path: Path, executor: str) -> None:
    retained = retained_checkpoint_of_cancelled_job(tmp_path / "checkpoints")
    marker = tmp_path / "ran-the-attackers-code"
    _, body = split(poison(retained, marker))
    attacker = SnapshotKey(b"the attacker's own key", "attacker")
    (retained / "_metadata").write_bytes(serialize(parse(unsigned(body), "x", str(retained)), attacker))

    with pytest.raises(UntrustedCheckpointError, match="signed with another key"):
        restore(retained, executor)
    assert not marker.exists()


def test_a_savepoint_from_another_deployment_is_refused_naming_both_fixes_and_restores_when_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV_VAR, "the other deployment's key")
    retained = retained_checkpoint_of_cancelled_job(tmp_path / "elsewhere")
    monkeypatch.setenv(KEY_ENV_VAR, "this deployment's key")

    with pytest.raises(UntrustedCheckpointError) as error:
        restore(retained, "local")
    message = str(error.value)
    assert str(retained / "_metadata") in message
    assert "signed with another key" in message and "environment variable CHANDY_SNAPSHOT_KEY" in message
    assert "CHANDY_SNAPSHOT_KEY or execution.checkpointing.snapshot-key-file" in message
    assert "--trust-snapshot" in message

    restore(retained, "local", **FRESH_SOURCE, **{"execution.state-recovery.trust-snapshot": True})
    monkeypatch.setenv(KEY_ENV_VAR, "the other deployment's key")  # or: the key it was signed with
    restore(retained, "local", **FRESH_SOURCE)


def test_a_modified_metadata_with_this_deployments_key_id_is_refused_as_forged(tmp_path: Path) -> None:
    retained = retained_checkpoint_of_cancelled_job(tmp_path / "checkpoints")
    path = retained / "_metadata"
    data = bytearray(path.read_bytes())
    version, body = split(bytes(data))
    body["checkpoint_id"] += 1  # a valid body, checksum recomputed, key id kept, HMAC not
    payload = json.dumps(body).encode()
    head = struct.pack(">8sIQ", MAGIC, version, len(payload)) + payload + bytes(data[-72:-64])
    path.write_bytes(head + hashlib.sha256(head).digest() + bytes(data[-32:]))
    with pytest.raises(UntrustedCheckpointError, match="corrupt or forged"):
        load_checkpoint_metadata(str(retained), snapshot_key(Configuration()))


# ---------------------------------------------------------------------- the key's defaults


def test_without_a_configured_key_one_is_generated_beside_the_storage_and_restores_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default deployment: no key configured. The key file appears once in the storage
    root, 0600, and a savepoint moved elsewhere restores (rescaled) under the same config."""
    monkeypatch.delenv(KEY_ENV_VAR)
    root = tmp_path / "checkpoints"
    retained = retained_checkpoint_of_cancelled_job(root)
    key_file = root / KEY_FILE_NAME
    assert key_file.is_file() and (key_file.stat().st_mode & 0o777) == 0o600
    secret = key_file.read_bytes()

    moved = tmp_path / "moved" / "savepoint-1"
    moved.parent.mkdir()
    retained.rename(moved)
    config = {"execution.checkpointing.dir": str(root)}
    restore(moved, "local", **FRESH_SOURCE, **config)  # restores
    env = checkpointing_env(parallelism=3, **{"execution.savepoint.ignore-unclaimed-state": True, **config})
    env.set_restore_path(str(moved))  # rescaled
    stream = env.from_sequence(0, 5).uid("fresh-src").map(Throttle(0)).key_by(lambda x: x % 3)
    list(stream.process(KeyedCounter(10**9)).uid("counter").execute_and_collect())
    assert key_file.read_bytes() == secret

    # another storage root is another deployment: refused, naming its key file
    with pytest.raises(UntrustedCheckpointError) as error:
        restore(moved, "local", **{"execution.checkpointing.dir": str(tmp_path / "other")})
    assert f"key file {tmp_path / 'other' / KEY_FILE_NAME}" in str(error.value)


def test_without_a_key_or_a_directory_the_users_own_key_signs_and_a_savepoint_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer's job names no key and no directory, writes a savepoint to a directory
    given with the request, and the next job restores from it: signed and checked with the
    user's own key, generated once under ~/.config/chandy (0700 / 0600)."""
    monkeypatch.delenv(KEY_ENV_VAR)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    env = checkpointing_env(interval_ms=30)
    results = (
        env.from_sequence(0, 10**6)
        .uid("endless-src")  # not restored below: its position would replay the million
        .map(Throttle(0.0001))
        .key_by(lambda x: x % 3)
        .process(KeyedCounter(10**9))
        .uid("counter")
        .execute_and_collect()
    )
    with results:
        client = results.job_client
        wait_for(lambda: client.get_checkpoint_statistics()["counts"]["completed"] > 0, "a checkpoint")
        savepoint = client.stop_with_savepoint(savepoint_directory=str(tmp_path / "sp"))
        location = Path(savepoint.result(60))
        list(results)
    key_file = tmp_path / "config" / "chandy" / "snapshot-key"
    assert (key_file.stat().st_mode & 0o777) == 0o600
    assert (key_file.parent.stat().st_mode & 0o777) == 0o700
    assert not (tmp_path / "sp" / KEY_FILE_NAME).exists()  # nothing beside the savepoint signs it
    restore(location, "local", **FRESH_SOURCE)  # restores, with no configuration

    # another user's key (another config home) does not accept it
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "other-user"))
    with pytest.raises(UntrustedCheckpointError):
        restore(location, "local", **FRESH_SOURCE)


def test_drivers_starting_at_once_agree_on_one_generated_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV_VAR)
    code = (
        "import sys; from chandy.storage.snapshot_key import key_at_root; "
        "sys.stdout.write(key_at_root(sys.argv[1]).secret.decode())"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "root")], stdout=subprocess.PIPE, env=env
        )
        for _ in range(4)
    ]
    secrets = {p.communicate(timeout=60)[0] for p in processes}
    assert len(secrets) == 1 and (tmp_path / "root" / KEY_FILE_NAME).read_bytes().strip() in secrets
    assert [p.name for p in (tmp_path / "root").iterdir()] == [KEY_FILE_NAME]  # no temporary left


def test_the_key_file_option_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV_VAR)
    key_file = tmp_path / "key"
    key_file.write_text("a secret kept outside the storage\n")
    config = Configuration({"execution.checkpointing.snapshot-key-file": str(key_file)})
    key = snapshot_key(config)
    assert key is not None and key.secret == b"a secret kept outside the storage"
    assert key.source == f"key file {key_file}" and "secret" not in repr(key)


# ---------------------------------------------------------------------- resource bounds


def signed_body(body: dict[str, Any] | bytes) -> bytes:
    """``body`` as a file this deployment signed (what a bounded parser must still survive)."""
    key = snapshot_key(Configuration())
    assert key is not None
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = struct.pack(">8sIQ", MAGIC, VERSION_SIGNED, len(payload)) + payload + key.key_id
    head += hashlib.sha256(head).digest()
    return head + key.sign(head)


BODY: dict[str, Any] = {
    "checkpoint_id": 1,
    "job_id": "j",
    "timestamp": 1,
    "checkpoint_type": "SAVEPOINT",
    "operators": [],
    "master_states": [],
}


def test_a_parallelism_of_a_billion_is_refused_at_once(tmp_path: Path) -> None:
    """It took the driver to 2 GB in 16 s; now the reader refuses it before sizing anything."""
    op = {"operator_id": "op", "parallelism": 1e9, "max_parallelism": 1e9, "subtasks": {}}
    (tmp_path / "_metadata").write_bytes(signed_body({**BODY, "operators": [op]}))
    started = time.monotonic()
    with pytest.raises(InvalidCheckpointError, match="'parallelism' 1000000000.0 is outside 1..32768"):
        restore(tmp_path, "local")
    assert time.monotonic() - started < 30  # a job's start and end; not minutes
    inspect = chandy_command("checkpoint", "inspect", str(tmp_path))  # before: ran out of memory
    assert inspect.returncode == 1 and "is outside 1..32768" in inspect.stderr


def chandy_command(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``chandy`` command of this tree in a process of its own (a hang fails, bounded)."""
    command = [sys.executable, "-c", "from chandy.cli.main import main; main()", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def test_json_nested_deep_is_an_invalid_checkpoint_not_a_recursion_error() -> None:
    for depth in (100, 100_000):
        nested = b"[" * depth + b"]" * depth
        body = json.dumps({**BODY, "master_states": "NESTED"}).encode().replace(b'"NESTED"', nested)
        with pytest.raises(InvalidCheckpointError, match="nested"):
            deserialize(signed_body(body), "deep/_metadata", key=snapshot_key(Configuration()))


def fifo_savepoint(tmp_path: Path) -> Path:
    """A signed savepoint whose one state file is a FIFO nobody writes to."""
    directory = tmp_path / "savepoint"
    directory.mkdir()
    os.mkfifo(directory / "state")
    keyed = {
        "key_group_range": [0, 127],
        "ranges": [[0, 0]] * 128,
        "delegate": {"type": "file", "path": "state", "size": 0, "sha256": hashlib.sha256().hexdigest()},
    }
    subtask = {"finished": False, "keyed": [keyed], "operator": []}
    op = {"operator_id": "op", "parallelism": 1, "max_parallelism": 128, "subtasks": {"0": subtask}}
    (directory / "_metadata").write_bytes(signed_body({**BODY, "operators": [op]}))
    return directory


def run_bounded(target: Any, *args: Any) -> Any:
    """``target(*args)`` in a daemon thread: a hang fails the test instead of hanging it."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(target(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert outcome, f"{target.__name__} hangs"
    return outcome[0]


def test_a_state_file_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    directory = fifo_savepoint(tmp_path)
    error = run_bounded(load_checkpoint_metadata, str(directory), snapshot_key(Configuration()))
    assert isinstance(error, InvalidCheckpointError) and "FIFO" in str(error)
    from chandy.storage.checkpoint_storage import read_verified

    handle = FileStateHandle(str(directory / "state"), 0, hashlib.sha256().hexdigest())
    error = run_bounded(read_verified, handle)
    assert isinstance(error, InvalidCheckpointError) and "FIFO" in str(error)


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_inspect_verify_returns_on_a_fifo_or_dev_zero(tmp_path: Path, target: str) -> None:
    directory = fifo_savepoint(tmp_path)
    if target == "/dev/zero":
        (directory / "state").unlink()
        (directory / "state").symlink_to("/dev/zero")
    result = chandy_command("checkpoint", "inspect", "--verify", str(directory))
    assert result.returncode == 1
    assert "not a regular file" in result.stdout.lower() or "not a regular file" in result.stderr.lower()


def test_metadata_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    directory = tmp_path / "savepoint"
    directory.mkdir()
    os.mkfifo(directory / "_metadata")
    error = run_bounded(load_checkpoint_metadata, str(directory), None)
    assert isinstance(error, InvalidCheckpointError) and "FIFO" in str(error)


def test_a_relative_path_leaving_the_snapshot_is_refused() -> None:
    subtask = {"finished": False, "keyed": [], "operator": []}
    subtask["operator"] = [
        {"states": {}, "delegate": {"type": "file", "path": "../../etc/passwd", "size": 1, "sha256": "0"}}
    ]
    op = {"operator_id": "op", "parallelism": 1, "max_parallelism": 1, "subtasks": {"0": subtask}}
    with pytest.raises(InvalidCheckpointError, match="leaves the checkpoint's directory"):
        parse(signed_body({**BODY, "operators": [op]}), "m", "/x/savepoint")


# ---------------------------------------------------------------------- CLAIM deletes only itself


def test_claim_deletes_nothing_outside_the_snapshot(tmp_path: Path) -> None:
    """A claimed snapshot whose metadata names an absolute path elsewhere: once subsumed, its
    own directory goes and the file elsewhere stays (before, it was deleted)."""
    retained = retained_checkpoint_of_cancelled_job(
        tmp_path / "checkpoints", **{"execution.checkpointing.data-inline-threshold": 0}
    )
    outside = tmp_path / "precious.txt"
    outside.write_bytes(b"not the job's")
    _, body = split((retained / "_metadata").read_bytes())
    delegate, _ = handles(body)[0]
    delegate.update(
        path=str(outside), size=outside.stat().st_size, sha256=hashlib.sha256(b"not the job's").hexdigest()
    )
    metadata = parse(unsigned(body), "m", str(retained))
    discard_location(str(retained), metadata.operator_states)
    assert outside.read_bytes() == b"not the job's"
    assert not retained.exists()


def test_the_shared_state_registry_deletes_only_inside_shared_roots(tmp_path: Path) -> None:
    from chandy.checkpoint.shared_state import delete_shared_files

    shared = tmp_path / "job" / "shared"
    shared.mkdir(parents=True)
    inside, outside = shared / "a.sst", tmp_path / "precious.txt"
    for path in (inside, outside):
        path.write_bytes(b"x")
    escaping = FileStateHandle(str(shared / ".." / ".." / "precious.txt"), 1, "")
    delete_shared_files(
        [FileStateHandle(str(inside), 1, ""), FileStateHandle(str(outside), 1, ""), escaping],
        "job",
        "test",
        {str(shared)},
    )
    assert not inside.exists() and outside.exists()


def test_chandy_run_trust_snapshot_sets_the_option() -> None:
    from chandy.cli.run import job_config

    config = job_config(None, "/archive/savepoint-1", False, None, (), trust_snapshot=True)
    assert config["execution.state-recovery.trust-snapshot"] is True
    assert "execution.state-recovery.trust-snapshot" not in job_config(None, "/x", False, None, ())
