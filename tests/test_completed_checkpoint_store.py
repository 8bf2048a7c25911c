"""Completed checkpoints: the store's retention (S56) and the ``_metadata`` file on disk."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from chandy.checkpoint.completed_checkpoint import CompletedCheckpoint, CompletedCheckpointStore
from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.checkpoint.metadata import (
    MAGIC,
    VERSION_SIGNED,
    CheckpointMetadata,
    MasterState,
    parse,
    serialize,
)
from chandy.checkpoint.pending_checkpoint import CheckpointPlan, PendingCheckpoint, TaskToAck
from chandy.checkpoint.properties import CheckpointProperties
from chandy.config.options import ExternalizedCheckpointRetention
from chandy.errors import InvalidCheckpointError
from chandy.messages.checkpoint import CheckpointMetrics
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.status import JobStatus
from chandy.state.handles import (
    ByteStreamStateHandle,
    FileStateHandle,
    IncrementalKeyedStateHandle,
    KeyGroupsStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
    OperatorStateMeta,
)
from chandy.state.key_groups import KeyGroupRange
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import METADATA_FILE_NAME, CheckpointStorage
from chandy.storage.snapshot_key import SnapshotKey

JOB_ID = "c0mp1e7edc0mp1e7edc0mp1e7edc0mp1"
CHECKPOINT = CheckpointProperties.for_checkpoint(ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS)


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    storage = CheckpointStorage(str(tmp_path), JOB_ID)
    storage.initialize()
    return storage


def big(storage: CheckpointStorage, fill: int) -> bytes:
    return bytes([fill % 256]) * (storage.inline_threshold + 1)


def completed_checkpoint(
    storage: CheckpointStorage, checkpoint_id: int, props: CheckpointProperties = CHECKPOINT
) -> CompletedCheckpoint:
    """A completed checkpoint with a real ``chk-N`` directory: a state file and ``_metadata``."""
    handle = storage.write_state(checkpoint_id, big(storage, checkpoint_id))
    assert isinstance(handle, FileStateHandle)
    metadata = CheckpointMetadata(
        checkpoint_id, JOB_ID, 1_000 * checkpoint_id, props.checkpoint_type.value, []
    )
    pointer = storage.write_metadata(
        checkpoint_id, serialize(metadata, storage.signing_key(), storage.checkpoint_dir(checkpoint_id))
    )
    return CompletedCheckpoint(
        job_id=JOB_ID,
        checkpoint_id=checkpoint_id,
        timestamp=1_000 * checkpoint_id,
        completion_timestamp=1_000 * checkpoint_id + 10,
        operator_states={},
        props=props,
        external_pointer=pointer,
        storage=storage,
    )


def on_disk(checkpoint: CompletedCheckpoint) -> bool:
    assert checkpoint.external_pointer is not None
    return os.path.isfile(os.path.join(checkpoint.external_pointer, METADATA_FILE_NAME))


# ---------------------------------------------------------------------- S56 retention


@pytest.mark.parametrize("retained", [0, -1])
def test_store_must_retain_at_least_one(retained: int) -> None:
    with pytest.raises(ValueError, match="at least one"):
        CompletedCheckpointStore(retained)


def test_empty_store() -> None:
    store = CompletedCheckpointStore(1)
    assert store.get_latest_checkpoint() is None
    assert store.get_all_checkpoints() == []
    assert store.number_of_retained_checkpoints == 0


def test_add_two_latest_is_the_last_and_all_in_order(storage: CheckpointStorage) -> None:
    store = CompletedCheckpointStore(2)
    first, second = completed_checkpoint(storage, 1), completed_checkpoint(storage, 2)
    assert store.add_checkpoint(first) == []
    assert store.add_checkpoint(second) == []
    assert store.get_latest_checkpoint() is second
    assert store.get_all_checkpoints() == [first, second]
    assert store.number_of_retained_checkpoints == 2
    assert not first.discarded
    assert on_disk(first)
    assert on_disk(second)


def test_retain_one_each_add_discards_the_previous(storage: CheckpointStorage) -> None:
    store = CompletedCheckpointStore(1)
    checkpoints = [completed_checkpoint(storage, i) for i in range(1, 5)]
    for index, checkpoint in enumerate(checkpoints):
        subsumed = store.add_checkpoint(checkpoint)
        assert store.number_of_retained_checkpoints == 1
        assert store.get_latest_checkpoint() is checkpoint
        assert on_disk(checkpoint)
        if index == 0:
            assert subsumed == []
        else:
            previous = checkpoints[index - 1]
            assert subsumed == [previous]
            assert previous.discarded
            assert not os.path.exists(storage.checkpoint_dir(previous.checkpoint_id))
    assert [c.discarded for c in checkpoints] == [True, True, True, False]


class UndeletableStorage(CheckpointStorage):
    """Real local storage whose deletions fail with an error that is not an ``OSError``
    (an object store's client error, say), so the storage itself does not swallow it."""

    def discard_checkpoint(self, checkpoint_id: int) -> None:
        raise RuntimeError(f"the object store refused to delete chk-{checkpoint_id}")


def test_a_failed_deletion_of_a_subsumed_checkpoint_does_not_fail_the_add(tmp_path: Path) -> None:
    """The new checkpoint is in once added: reporting the add failed would make the
    coordinator discard a checkpoint the store holds as its latest."""
    storage = UndeletableStorage(str(tmp_path), JOB_ID)
    storage.initialize()
    store = CompletedCheckpointStore(1)
    first, second = completed_checkpoint(storage, 1), completed_checkpoint(storage, 2)
    store.add_checkpoint(first)
    assert store.add_checkpoint(second) == [first]
    assert store.get_all_checkpoints() == [second]
    assert on_disk(first)  # left behind (and logged), nothing worse


def test_savepoints_in_the_store_are_not_deleted_when_subsumed(storage: CheckpointStorage) -> None:
    store = CompletedCheckpointStore(1)
    savepoint = completed_checkpoint(storage, 1, CheckpointProperties.for_savepoint())
    store.add_checkpoint(savepoint)
    store.add_checkpoint(completed_checkpoint(storage, 2))
    assert store.get_all_checkpoints()[0].checkpoint_id == 2
    assert on_disk(savepoint)


def test_shutdown_finished_discards_all(storage: CheckpointStorage) -> None:
    store = CompletedCheckpointStore(3)
    checkpoints = [completed_checkpoint(storage, i) for i in range(1, 4)]
    for checkpoint in checkpoints:
        store.add_checkpoint(checkpoint)

    store.shutdown(JobStatus.FINISHED)

    assert all(c.discarded for c in checkpoints)
    assert not any(os.path.exists(storage.checkpoint_dir(c.checkpoint_id)) for c in checkpoints)
    assert store.number_of_retained_checkpoints == 0
    assert store.get_latest_checkpoint() is None
    assert store.get_all_checkpoints() == []


def test_shutdown_cancelled_retains_with_retain_on_cancellation(storage: CheckpointStorage) -> None:
    props = CheckpointProperties.for_checkpoint(ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION)
    store = CompletedCheckpointStore(1)
    checkpoint = completed_checkpoint(storage, 1, props)
    store.add_checkpoint(checkpoint)
    store.shutdown(JobStatus.CANCELED)
    assert not checkpoint.discarded
    assert on_disk(checkpoint)
    assert store.number_of_retained_checkpoints == 0


# ---------------------------------------------------------------------- _metadata


OPERATORS = ("source", "window")


def finalized_checkpoint(storage: CheckpointStorage, checkpoint_id: int = 3) -> CompletedCheckpoint:
    """Two subtasks of a keyed window (file + inline state) and a stateless source, plus a
    master hook's state, finalized into ``chk-<checkpoint_id>``."""
    max_parallelism = 128
    window = [ExecutionAttemptID(2, i, 0) for i in range(2)]
    source = ExecutionAttemptID(1, 0, 0)
    tasks = [TaskToAck(source, 1, 0, 1, max_parallelism, ("source",))]
    tasks += [TaskToAck(a, 2, a.subtask_index, 2, max_parallelism, ("window",)) for a in window]
    plan = CheckpointPlan((source,), tuple(tasks), (source, *window))
    pending = PendingCheckpoint(
        JOB_ID, checkpoint_id, 5_000, plan, ("enumerator",), CHECKPOINT, storage, lambda state: None
    )

    pending.acknowledge_task(source, None, CheckpointMetrics())
    for a in window:
        key_groups = KeyGroupRange.of_operator(max_parallelism, 2, a.subtask_index)
        keyed_file = storage.write_state(checkpoint_id, big(storage, a.subtask_index))
        assert isinstance(keyed_file, FileStateHandle)
        keyed = KeyGroupsStateHandle(
            key_groups, tuple((k, k + 1) for k in range(len(key_groups))), keyed_file
        )
        inline = storage.write_state(checkpoint_id, b"small operator state")
        assert isinstance(inline, ByteStreamStateHandle)
        operator = OperatorStateHandle(
            {
                "buffer": OperatorStateMeta(
                    OperatorStateDistributionMode.SPLIT_DISTRIBUTE, ((0, 5), (5, 20))
                ),
                "rules": OperatorStateMeta(OperatorStateDistributionMode.BROADCAST, ((0, 20),)),
            },
            inline,
        )
        state = TaskStateSnapshot({"window": OperatorSubtaskState((keyed,), (operator,))})
        pending.acknowledge_task(a, state, CheckpointMetrics())
    pending.acknowledge_master_state("enumerator", MasterState("enumerator", b"\x00splits\xff"))
    return pending.finalize_checkpoint(6_000)


def metadata_path(checkpoint: CompletedCheckpoint) -> str:
    assert checkpoint.external_pointer is not None
    return os.path.join(checkpoint.external_pointer, METADATA_FILE_NAME)


@pytest.mark.parametrize("via_file", [False, True], ids=["directory", "metadata-file"])
def test_metadata_round_trip(storage: CheckpointStorage, via_file: bool) -> None:
    completed = finalized_checkpoint(storage)
    pointer = metadata_path(completed) if via_file else completed.external_pointer
    assert pointer is not None

    metadata, directory = load_checkpoint_metadata(pointer, storage.signing_key())

    assert directory == completed.external_pointer
    assert metadata.checkpoint_id == completed.checkpoint_id
    assert metadata.job_id == JOB_ID
    assert metadata.timestamp == completed.timestamp
    assert metadata.checkpoint_type == "CHECKPOINT"
    assert {s.operator_id: s for s in metadata.operator_states} == completed.operator_states
    assert metadata.master_states == [MasterState("enumerator", b"\x00splits\xff")]


def test_metadata_stores_paths_relative_to_the_checkpoint(storage: CheckpointStorage, tmp_path: Path) -> None:
    """A retained checkpoint can be moved and still loads (paths inside it are relative)."""
    completed = finalized_checkpoint(storage)
    assert completed.external_pointer is not None
    moved = tmp_path / "moved-chk"
    os.rename(completed.external_pointer, moved)

    metadata, _ = load_checkpoint_metadata(str(moved), storage.signing_key())

    window = next(s for s in metadata.operator_states if s.operator_id == "window")
    for subtask in window.subtask_states.values():
        for handle in subtask.stream_handles():
            if isinstance(handle, FileStateHandle):
                assert handle.path.startswith(str(moved) + os.sep)
                assert os.path.isfile(handle.path)


def test_metadata_with_a_flipped_byte_in_the_body_is_corrupt(storage: CheckpointStorage) -> None:
    completed = finalized_checkpoint(storage)
    path = metadata_path(completed)
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(path).write_bytes(bytes(data))

    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint_metadata(completed.external_pointer or "", storage.signing_key())
    assert path in str(error.value)
    assert "corrupt" in str(error.value)


@pytest.mark.slow
def test_any_flipped_byte_is_a_clear_error(storage: CheckpointStorage) -> None:
    """Every single-byte flip is refused with an error naming the file, never a wrong restore;
    past the fixed header (magic, version) the error says the file is corrupt."""
    completed = finalized_checkpoint(storage)
    path = metadata_path(completed)
    original = Path(path).read_bytes()
    header = 8 + 4  # magic, version
    for position in range(len(original)):
        data = bytearray(original)
        data[position] ^= 0x01
        Path(path).write_bytes(bytes(data))
        with pytest.raises(InvalidCheckpointError) as error:
            load_checkpoint_metadata(path, storage.signing_key())
        assert path in str(error.value), position
        if position >= header:
            assert "corrupt" in str(error.value), (position, str(error.value))
    Path(path).write_bytes(original)
    assert load_checkpoint_metadata(path, storage.signing_key())[0].checkpoint_id == completed.checkpoint_id


def test_truncated_metadata_is_a_clear_error(storage: CheckpointStorage) -> None:
    completed = finalized_checkpoint(storage)
    path = metadata_path(completed)
    Path(path).write_bytes(Path(path).read_bytes()[:10])
    with pytest.raises(InvalidCheckpointError, match="truncated") as error:
        load_checkpoint_metadata(path, storage.signing_key())
    assert path in str(error.value)


def test_checkpoint_directory_without_metadata_is_not_complete(storage: CheckpointStorage) -> None:
    storage.write_state(9, big(storage, 9))  # chk-9 holds state but no _metadata
    directory = storage.checkpoint_dir(9)
    assert os.path.isdir(directory)

    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint_metadata(directory, storage.signing_key())
    message = str(error.value)
    assert "not a complete checkpoint" in message
    assert os.path.join(directory, METADATA_FILE_NAME) in message


def test_job_directory_points_at_a_complete_checkpoint(storage: CheckpointStorage) -> None:
    completed = finalized_checkpoint(storage)
    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint_metadata(storage.job_dir, storage.signing_key())
    assert completed.external_pointer is not None
    assert completed.external_pointer in str(error.value)


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-job" / "chk-1")
    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint_metadata(missing, None)
    message = str(error.value)
    assert missing in message
    assert "does not exist" in message


# ---------------------------------------------------------------------- _metadata version 2


def local_file(tmp_path: Path, name: str, size: int) -> str:
    path = tmp_path / "local" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes((name.encode() * size)[:size])
    return str(path)


def incremental_handle(
    storage: CheckpointStorage, tmp_path: Path, checkpoint_id: int, key_groups: KeyGroupRange
) -> IncrementalKeyedStateHandle:
    """A RocksDB checkpoint uploaded through the storage: two SST files into ``shared/``, a
    large private MANIFEST into ``chk-N`` and a small inline CURRENT."""
    big_size = storage.inline_threshold + 1
    shared = tuple(
        (
            name,
            storage.upload_file(checkpoint_id, local_file(tmp_path, f"{key_groups.start}-{name}", 100), True),
        )
        for name in ("000010.sst", "000011.sst")
    )
    private = tuple(
        (
            name,
            storage.upload_file(
                checkpoint_id, local_file(tmp_path, f"{key_groups.start}-{name}", size), False
            ),
        )
        for name, size in (("MANIFEST-000005", big_size), ("CURRENT", 16))
    )
    return IncrementalKeyedStateHandle(
        key_groups,
        f"backend-{key_groups.start}",
        checkpoint_id,
        shared,
        private,
        frozenset({"000011.sst"}),
        (("_timer_state/t", "timers"), ("count", "value")),  # sorted, as backends record them
    )


def finalized_incremental_checkpoint(
    storage: CheckpointStorage, tmp_path: Path, checkpoint_id: int = 4
) -> CompletedCheckpoint:
    """Two subtasks of a keyed operator with RocksDB incremental state, finalized into ``chk-N``."""
    attempts = [ExecutionAttemptID(1, i, 0) for i in range(2)]
    tasks = tuple(TaskToAck(a, 1, a.subtask_index, 2, 128, ("keyed",)) for a in attempts)
    plan = CheckpointPlan(tuple(attempts), tasks, tuple(attempts))
    pending = PendingCheckpoint(
        JOB_ID, checkpoint_id, 5_000, plan, (), CHECKPOINT, storage, lambda state: None
    )
    for a in attempts:
        handle = incremental_handle(
            storage, tmp_path, checkpoint_id, KeyGroupRange.of_operator(128, 2, a.subtask_index)
        )
        state = TaskStateSnapshot({"keyed": OperatorSubtaskState((handle,))})
        pending.acknowledge_task(a, state, CheckpointMetrics())
    return pending.finalize_checkpoint(6_000)


def version_of(path: str) -> int:
    return int.from_bytes(Path(path).read_bytes()[8:12], "big")


def test_incremental_handles_round_trip_in_a_version_2_file(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    completed = finalized_incremental_checkpoint(storage, tmp_path)
    path = metadata_path(completed)

    metadata, _ = load_checkpoint_metadata(path, storage.signing_key())

    assert version_of(path) == VERSION_SIGNED
    assert {s.operator_id: s for s in metadata.operator_states} == completed.operator_states
    handle = metadata.operator_states[0].subtask_states[1].managed_keyed_state[0]
    assert isinstance(handle, IncrementalKeyedStateHandle)
    assert handle.uploaded == frozenset({"000011.sst"})
    assert handle.state_kinds == (("_timer_state/t", "timers"), ("count", "value"))
    # on disk: shared files relative to the job directory, the MANIFEST relative to chk-N
    body = json.loads(Path(path).read_bytes()[20:-72])
    stored = body["operators"][0]["subtasks"]["0"]["keyed"][0]
    assert stored["type"] == "incremental"
    assert all(h["path"].startswith("../shared/") for _, h in stored["shared"])
    manifest, current = dict(stored["private"])["MANIFEST-000005"], dict(stored["private"])["CURRENT"]
    assert manifest["type"] == "file" and "/" not in manifest["path"]
    assert current["type"] == "bytes"


def test_a_job_directory_moved_whole_keeps_incremental_checkpoints_restorable(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    completed = finalized_incremental_checkpoint(storage, tmp_path)
    moved = tmp_path / "moved-job"
    os.rename(storage.job_dir, moved)

    metadata, _ = load_checkpoint_metadata(str(moved / "chk-4"), storage.signing_key())

    files = [
        handle
        for subtask in metadata.operator_states[0].subtask_states.values()
        for handle in (*subtask.stream_handles(), *subtask.shared_handles())
        if isinstance(handle, FileStateHandle)
    ]
    assert len(files) == 6  # 2 subtasks x (2 shared + 1 private MANIFEST)
    assert all(h.path.startswith(str(moved) + os.sep) and os.path.isfile(h.path) for h in files)
    assert completed.checkpoint_id == metadata.checkpoint_id


def test_a_missing_shared_file_is_named_before_a_restore(storage: CheckpointStorage, tmp_path: Path) -> None:
    completed = finalized_incremental_checkpoint(storage, tmp_path)
    (gone, *_) = sorted(os.listdir(os.path.join(storage.job_dir, "shared")))
    os.remove(os.path.join(storage.job_dir, "shared", gone))

    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint_metadata(completed.external_pointer or "", storage.signing_key())
    message = str(error.value)
    assert f"shared state file {os.path.join(storage.job_dir, 'shared', gone)}" in message
    assert "is missing" in message and "shared/" in message and "Restore from another checkpoint" in message


def test_every_checkpoint_is_written_signed_as_version_4(storage: CheckpointStorage) -> None:
    """Version 4 (signed) whatever the content: an older chandy refuses it by version."""
    completed = finalized_checkpoint(storage)
    assert version_of(metadata_path(completed)) == VERSION_SIGNED == 4


def metadata_file(version: int, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = struct.pack(">8sIQ", MAGIC, version, len(payload)) + payload
    return head + hashlib.sha256(head).digest()


def one_keyed_operator(keyed: dict[str, Any]) -> dict[str, Any]:
    return {
        "checkpoint_id": 7,
        "job_id": "j",
        "timestamp": 1,
        "checkpoint_type": "CHECKPOINT",
        "operators": [
            {
                "operator_id": "op",
                "parallelism": 1,
                "max_parallelism": 128,
                "subtasks": {"0": {"finished": False, "keyed": [keyed], "operator": []}},
            }
        ],
        "master_states": [],
    }


KEY_GROUPS_V1 = {
    "key_group_range": [0, 1],
    "ranges": [[0, 1], [1, 2]],
    "delegate": {"type": "file", "path": "abc", "size": 2, "sha256": "00"},
}
INCREMENTAL_V2 = {
    "type": "incremental",
    "key_group_range": [0, 127],
    "backend_id": "b",
    "checkpoint_id": 6,
    "shared": [["1.sst", {"type": "file", "path": "../shared/u1", "size": 9, "sha256": "11"}]],
    "private": [["CURRENT", {"type": "bytes", "name": "c", "data": "AAA="}]],
    "uploaded": [],
}


@pytest.mark.parametrize("version", [1, 2])
def test_version_1_and_2_files_are_read(version: int) -> None:
    (operator,) = parse(
        metadata_file(version, one_keyed_operator(KEY_GROUPS_V1)), "m", "/j/chk-7"
    ).operator_states
    (handle,) = operator.subtask_states[0].managed_keyed_state
    assert isinstance(handle, KeyGroupsStateHandle)
    assert handle.delegate == FileStateHandle("/j/chk-7/abc", 2, "00")


def test_an_incremental_handle_reads_relative_to_the_job_directory() -> None:
    (operator,) = parse(metadata_file(2, one_keyed_operator(INCREMENTAL_V2)), "m", "/j/chk-7").operator_states
    (handle,) = operator.subtask_states[0].managed_keyed_state
    assert handle == IncrementalKeyedStateHandle(
        KeyGroupRange(0, 127),
        "b",
        6,
        (("1.sst", FileStateHandle("/j/shared/u1", 9, "11")),),
        (("CURRENT", ByteStreamStateHandle("c", b"\x00\x00")),),
    )
    key = SnapshotKey(b"k", "test")
    again = serialize(
        parse(metadata_file(2, one_keyed_operator(INCREMENTAL_V2)), "m", "/j/chk-7"), key, "/j/chk-7"
    )
    assert again[8:12] == (VERSION_SIGNED).to_bytes(4, "big")


@pytest.mark.parametrize("version", [0, 5, 2**32 - 1])
def test_an_unknown_version_is_refused_naming_it(version: int) -> None:
    with pytest.raises(InvalidCheckpointError) as error:
        parse(metadata_file(version, one_keyed_operator(KEY_GROUPS_V1)), "x/_metadata")
    assert f"x/_metadata has metadata format version {version}; this chandy reads versions 1, 2, 3, 4" in str(
        error.value
    )


@pytest.mark.parametrize(
    ("version", "keyed"),
    [
        (1, INCREMENTAL_V2),  # version 1 cannot hold one: no writer put it there
        (2, {**INCREMENTAL_V2, "type": "changelog"}),
        (2, {k: v for k, v in INCREMENTAL_V2.items() if k != "uploaded"}),
    ],
    ids=["incremental-in-v1", "unknown-type", "field-missing"],
)
def test_an_unreadable_keyed_handle_is_a_clear_error(version: int, keyed: dict[str, Any]) -> None:
    with pytest.raises(
        InvalidCheckpointError, match="x/_metadata has a valid checksum but an unreadable body"
    ):
        parse(metadata_file(version, one_keyed_operator(keyed)), "x/_metadata")


def test_a_flipped_byte_in_a_version_2_file_is_corrupt(storage: CheckpointStorage, tmp_path: Path) -> None:
    path = metadata_path(finalized_incremental_checkpoint(storage, tmp_path))
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0x01
    Path(path).write_bytes(bytes(data))
    with pytest.raises(InvalidCheckpointError, match="corrupt"):
        load_checkpoint_metadata(path, storage.signing_key())
