"""Completed checkpoints: the store's retention (S56) and the ``_metadata`` file on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chandy.checkpoint.completed_checkpoint import CompletedCheckpoint, CompletedCheckpointStore
from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.checkpoint.metadata import CheckpointMetadata, MasterState, serialize
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
    KeyGroupsStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
    OperatorStateMeta,
)
from chandy.state.key_groups import KeyGroupRange
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import METADATA_FILE_NAME, CheckpointStorage

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
        checkpoint_id, serialize(metadata, storage.checkpoint_dir(checkpoint_id))
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

    metadata, directory = load_checkpoint_metadata(pointer)

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

    metadata, _ = load_checkpoint_metadata(str(moved))

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
        load_checkpoint_metadata(completed.external_pointer or "")
    assert path in str(error.value)
    assert "corrupt" in str(error.value)


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
            load_checkpoint_metadata(path)
        assert path in str(error.value), position
        if position >= header:
            assert "corrupt" in str(error.value), (position, str(error.value))
    Path(path).write_bytes(original)
    assert load_checkpoint_metadata(path)[0].checkpoint_id == completed.checkpoint_id


def test_truncated_metadata_is_a_clear_error(storage: CheckpointStorage) -> None:
    completed = finalized_checkpoint(storage)
    path = metadata_path(completed)
    Path(path).write_bytes(Path(path).read_bytes()[:10])
    with pytest.raises(InvalidCheckpointError, match="truncated") as error:
        load_checkpoint_metadata(path)
    assert path in str(error.value)


def test_checkpoint_directory_without_metadata_is_not_complete(storage: CheckpointStorage) -> None:
    storage.write_state(9, big(storage, 9))  # chk-9 holds state but no _metadata
    directory = storage.checkpoint_dir(9)
    assert os.path.isdir(directory)

    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint_metadata(directory)
    message = str(error.value)
    assert "not a complete checkpoint" in message
    assert os.path.join(directory, METADATA_FILE_NAME) in message


def test_job_directory_points_at_a_complete_checkpoint(storage: CheckpointStorage) -> None:
    completed = finalized_checkpoint(storage)
    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint_metadata(storage.job_dir)
    assert completed.external_pointer is not None
    assert completed.external_pointer in str(error.value)


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-job" / "chk-1")
    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint_metadata(missing)
    message = str(error.value)
    assert missing in message
    assert "does not exist" in message
