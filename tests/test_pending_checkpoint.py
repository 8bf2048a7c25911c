"""PendingCheckpoint on its own (Flink's PendingCheckpointTest, scenario S54)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chandy.checkpoint.metadata import MasterState
from chandy.checkpoint.pending_checkpoint import (
    CheckpointPlan,
    IllegalCheckpointStateError,
    PendingCheckpoint,
    TaskAcknowledgeResult,
    TaskToAck,
)
from chandy.checkpoint.properties import CheckpointProperties
from chandy.config.options import ExternalizedCheckpointRetention
from chandy.messages.checkpoint import (
    CheckpointException,
    CheckpointFailureReason,
    CheckpointMetrics,
)
from chandy.messages.ids import ExecutionAttemptID
from chandy.state.handles import (
    FileStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
    OperatorStateMeta,
)
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import METADATA_FILE_NAME, CheckpointStorage
from chandy.util.clock import ManualClock
from chandy.util.timer import ManualTimer

JOB_ID = "5e1f0c0ffee0c0ffee0c0ffee0c0ffee"
CHECKPOINT_ID = 7
R = CheckpointFailureReason

A1 = ExecutionAttemptID(1, 0, 0)
A2 = ExecutionAttemptID(2, 0, 0)
STRANGER = ExecutionAttemptID(9, 0, 0)

CHECKPOINT = CheckpointProperties.for_checkpoint(ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS)
SAVEPOINT = CheckpointProperties.for_savepoint()
SYNC_SAVEPOINT = CheckpointProperties.for_savepoint(synchronous=True)


def operator_id(attempt_id: ExecutionAttemptID) -> str:
    return f"op-{attempt_id.vertex_id}"


def plan_of(attempts: Sequence[ExecutionAttemptID]) -> CheckpointPlan:
    tasks = tuple(TaskToAck(a, a.vertex_id, a.subtask_index, 1, 128, (operator_id(a),)) for a in attempts)
    return CheckpointPlan(tuple(attempts), tasks, tuple(attempts))


@dataclass
class Fixture:
    pending: PendingCheckpoint
    storage: CheckpointStorage
    discarded: list[TaskStateSnapshot | None] = field(default_factory=list)


def make_pending(
    storage: CheckpointStorage,
    *,
    props: CheckpointProperties = CHECKPOINT,
    attempts: Sequence[ExecutionAttemptID] = (A1, A2),
    master_hooks: tuple[str, ...] = (),
) -> Fixture:
    """A pending checkpoint whose discard callback deletes the files (as the coordinator's)."""
    discarded: list[TaskStateSnapshot | None] = []

    def discard(state: TaskStateSnapshot | None) -> None:
        discarded.append(state)
        if state is not None and storage.is_persistent:
            storage.discard_handles(state.file_handles())

    pending = PendingCheckpoint(
        JOB_ID, CHECKPOINT_ID, 1_000, plan_of(attempts), master_hooks, props, storage, discard
    )
    return Fixture(pending, storage, discarded)


@pytest.fixture
def fs_storage(tmp_path: Path) -> CheckpointStorage:
    storage = CheckpointStorage(str(tmp_path), JOB_ID)
    storage.initialize()
    return storage


@pytest.fixture
def memory_storage() -> CheckpointStorage:
    return CheckpointStorage(None, JOB_ID)


def file_state(storage: CheckpointStorage, attempt_id: ExecutionAttemptID) -> TaskStateSnapshot:
    size = storage.inline_threshold + 1
    handle = storage.write_state(CHECKPOINT_ID, bytes([attempt_id.vertex_id]) * size)
    assert isinstance(handle, FileStateHandle)
    meta = OperatorStateMeta(OperatorStateDistributionMode.UNION, ((0, size),))
    return TaskStateSnapshot(
        {operator_id(attempt_id): OperatorSubtaskState((), (OperatorStateHandle({"state": meta}, handle),))}
    )


def exists(state: TaskStateSnapshot) -> bool:
    return all(os.path.exists(h.path) for h in state.file_handles())


def ack(
    pending: PendingCheckpoint, attempt_id: ExecutionAttemptID, state: TaskStateSnapshot | None = None
) -> TaskAcknowledgeResult:
    return pending.acknowledge_task(attempt_id, state, CheckpointMetrics())


# ---------------------------------------------------------------------- subsumption


@pytest.mark.parametrize("props", [SAVEPOINT, SYNC_SAVEPOINT], ids=["savepoint", "sync-savepoint"])
def test_savepoints_cannot_be_subsumed(
    memory_storage: CheckpointStorage, props: CheckpointProperties
) -> None:
    pending = make_pending(memory_storage, props=props).pending
    assert not pending.can_be_subsumed()
    with pytest.raises(IllegalCheckpointStateError):
        pending.abort(R.CHECKPOINT_SUBSUMED)
    assert not pending.disposed
    assert not pending.completion_future.done()
    # any other reason still aborts it
    pending.abort(R.CHECKPOINT_DECLINED)
    assert pending.disposed


def test_checkpoints_can_be_subsumed(memory_storage: CheckpointStorage) -> None:
    pending = make_pending(memory_storage).pending
    assert pending.can_be_subsumed()
    pending.abort(R.CHECKPOINT_SUBSUMED)
    assert pending.disposed


# ---------------------------------------------------------------------- completion future


@pytest.mark.parametrize("reason", [R.CHECKPOINT_DECLINED, R.CHECKPOINT_EXPIRED, R.CHECKPOINT_SUBSUMED])
def test_completion_future_is_done_after_abort(
    memory_storage: CheckpointStorage, reason: CheckpointFailureReason
) -> None:
    pending = make_pending(memory_storage).pending
    assert not pending.completion_future.done()
    pending.abort(reason)
    assert pending.completion_future.done()
    exception = pending.completion_future.exception()
    assert isinstance(exception, CheckpointException)
    assert exception.reason is reason
    assert pending.failure_cause is exception


def test_finalize_requires_all_acknowledgements(fs_storage: CheckpointStorage) -> None:
    pending = make_pending(fs_storage).pending
    with pytest.raises(IllegalCheckpointStateError):
        pending.finalize_checkpoint(2_000)
    assert ack(pending, A1) is TaskAcknowledgeResult.SUCCESS
    with pytest.raises(IllegalCheckpointStateError):
        pending.finalize_checkpoint(2_000)
    assert not pending.completion_future.done()
    assert not os.path.exists(os.path.join(fs_storage.checkpoint_dir(CHECKPOINT_ID), METADATA_FILE_NAME))

    assert ack(pending, A2) is TaskAcknowledgeResult.SUCCESS
    completed = pending.finalize_checkpoint(2_000)
    assert completed.checkpoint_id == CHECKPOINT_ID
    assert os.path.isfile(os.path.join(fs_storage.checkpoint_dir(CHECKPOINT_ID), METADATA_FILE_NAME))
    assert pending.disposed


def test_finalize_leaves_the_future_open_until_the_store_has_the_checkpoint(
    fs_storage: CheckpointStorage,
) -> None:
    """Flink completes the future only once the store accepted the checkpoint."""
    pending = make_pending(fs_storage).pending
    ack(pending, A1)
    ack(pending, A2)
    completed = pending.finalize_checkpoint(2_000)
    assert not pending.completion_future.done()
    pending.mark_stored(completed)
    assert pending.completion_future.result(timeout=0) is completed


def test_a_finalized_checkpoint_the_store_refused_fails_its_future(fs_storage: CheckpointStorage) -> None:
    pending = make_pending(fs_storage).pending
    ack(pending, A1)
    ack(pending, A2)
    pending.finalize_checkpoint(2_000)
    refused = CheckpointException(R.FINALIZE_CHECKPOINT_FAILURE, OSError("store unavailable"))
    pending.fail_storing(refused)
    assert pending.completion_future.exception(timeout=0) is refused
    assert pending.failure_cause is refused


def test_finalize_of_a_discarded_checkpoint_is_illegal(memory_storage: CheckpointStorage) -> None:
    pending = make_pending(memory_storage).pending
    ack(pending, A1)
    ack(pending, A2)
    pending.abort(R.CHECKPOINT_EXPIRED)
    with pytest.raises(IllegalCheckpointStateError):
        pending.finalize_checkpoint(2_000)


# ---------------------------------------------------------------------- state discarding


@pytest.mark.parametrize("reason", [R.CHECKPOINT_DECLINED, R.CHECKPOINT_EXPIRED, R.CHECKPOINT_SUBSUMED])
def test_abort_discards_received_state(
    fs_storage: CheckpointStorage, reason: CheckpointFailureReason
) -> None:
    fixture = make_pending(fs_storage)
    state = file_state(fs_storage, A1)
    assert ack(fixture.pending, A1, state) is TaskAcknowledgeResult.SUCCESS
    assert exists(state)

    fixture.pending.abort(reason)

    assert fixture.discarded == [state]
    assert not any(os.path.exists(h.path) for h in state.file_handles())
    assert not os.path.exists(fs_storage.checkpoint_dir(CHECKPOINT_ID))


def test_finalize_keeps_received_state(fs_storage: CheckpointStorage) -> None:
    fixture = make_pending(fs_storage)
    states = [file_state(fs_storage, a) for a in (A1, A2)]
    for attempt_id, state in zip((A1, A2), states, strict=True):
        ack(fixture.pending, attempt_id, state)
    fixture.pending.finalize_checkpoint(2_000)
    assert fixture.discarded == []
    assert all(exists(s) for s in states)


# ---------------------------------------------------------------------- stateless tasks


def test_ack_without_state_is_a_stateless_task(memory_storage: CheckpointStorage) -> None:
    pending = make_pending(memory_storage).pending
    assert ack(pending, A1, None) is TaskAcknowledgeResult.SUCCESS
    assert operator_id(A1) in pending.operator_states
    assert pending.operator_states[operator_id(A1)].subtask_states == {}

    assert ack(pending, A2, None) is TaskAcknowledgeResult.SUCCESS
    completed = pending.finalize_checkpoint(2_000)
    assert set(completed.operator_states) == {operator_id(A1), operator_id(A2)}
    assert all(s.subtask_states == {} for s in completed.operator_states.values())


# ---------------------------------------------------------------------- canceller


def test_canceller_cannot_be_set_on_a_disposed_checkpoint(memory_storage: CheckpointStorage) -> None:
    timer = ManualTimer(ManualClock())
    pending = make_pending(memory_storage).pending
    pending.abort(R.CHECKPOINT_EXPIRED)
    handle = timer.schedule(1_000, lambda: None)
    assert not pending.set_canceller_handle(handle)


def test_abort_cancels_the_canceller(memory_storage: CheckpointStorage) -> None:
    timer = ManualTimer(ManualClock())
    pending = make_pending(memory_storage).pending
    handle = timer.schedule(1_000, lambda: None)
    assert pending.set_canceller_handle(handle)
    assert not pending.set_canceller_handle(timer.schedule(1_000, lambda: None))  # only once
    pending.abort(R.CHECKPOINT_DECLINED)
    assert handle.cancelled


def test_finalize_cancels_the_canceller(memory_storage: CheckpointStorage) -> None:
    timer = ManualTimer(ManualClock())
    pending = make_pending(memory_storage, attempts=(A1,)).pending
    handle = timer.schedule(1_000, lambda: None)
    assert pending.set_canceller_handle(handle)
    ack(pending, A1)
    pending.finalize_checkpoint(2_000)
    assert handle.cancelled


# ---------------------------------------------------------------------- full acknowledgement


def test_fully_acknowledged_needs_tasks_and_master_hooks(memory_storage: CheckpointStorage) -> None:
    pending = make_pending(memory_storage, attempts=(A1,), master_hooks=("a", "b")).pending
    assert not pending.is_fully_acknowledged
    ack(pending, A1)
    assert not pending.is_fully_acknowledged
    pending.acknowledge_master_state("a", MasterState("a", b"state-a"))
    assert not pending.is_fully_acknowledged
    pending.acknowledge_master_state("b", None)  # a hook without state
    assert pending.is_fully_acknowledged
    assert pending.master_states == [MasterState("a", b"state-a")]
    completed = pending.finalize_checkpoint(2_000)
    assert completed.master_states == [MasterState("a", b"state-a")]


def test_master_hooks_alone_do_not_complete(memory_storage: CheckpointStorage) -> None:
    pending = make_pending(memory_storage, attempts=(A1,), master_hooks=("a",)).pending
    pending.acknowledge_master_state("a", MasterState("a", b"x"))
    assert not pending.is_fully_acknowledged
    with pytest.raises(IllegalCheckpointStateError):
        pending.finalize_checkpoint(2_000)


# ---------------------------------------------------------------------- ack results


def test_acknowledge_results(memory_storage: CheckpointStorage) -> None:
    pending = make_pending(memory_storage).pending
    assert ack(pending, A1) is TaskAcknowledgeResult.SUCCESS
    assert ack(pending, A1) is TaskAcknowledgeResult.DUPLICATE
    assert ack(pending, STRANGER) is TaskAcknowledgeResult.UNKNOWN
    assert pending.number_of_acknowledged_tasks == 1
    assert pending.number_of_non_acknowledged_tasks == 1
    pending.abort(R.CHECKPOINT_DECLINED)
    assert ack(pending, A2) is TaskAcknowledgeResult.DISCARDED
    assert ack(pending, A1) is TaskAcknowledgeResult.DISCARDED


def test_ack_after_finalize_is_discarded(memory_storage: CheckpointStorage) -> None:
    pending = make_pending(memory_storage, attempts=(A1,)).pending
    ack(pending, A1)
    pending.finalize_checkpoint(2_000)
    assert ack(pending, A1) is TaskAcknowledgeResult.DISCARDED
