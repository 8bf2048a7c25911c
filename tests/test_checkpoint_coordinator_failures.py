"""CheckpointCoordinator under failures: Flink's ``CheckpointCoordinatorFailureTest`` and more.

A checkpoint counts as completed only once the :class:`CompletedCheckpointStore` holds it;
a trigger the gateway cannot deliver fails its checkpoint at once; a failing RPC to one
task never leaves the coordinator half-way through a completion or an abort. Faults are
injected with doubles that raise (a store, a storage, a gateway); everything else is the
real coordinator on real files, driven event by event on manual time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chandy.checkpoint.completed_checkpoint import CompletedCheckpoint, CompletedCheckpointStore
from chandy.checkpoint.failure_manager import CheckpointToleranceExceeded
from chandy.checkpoint.pending_checkpoint import CheckpointPlan
from chandy.messages.checkpoint import CheckpointException, CheckpointOptions
from chandy.messages.ids import ExecutionAttemptID
from chandy.state.snapshot import TaskStateSnapshot
from chandy.storage.checkpoint_storage import METADATA_FILE_NAME, CheckpointStorage
from tests.test_checkpoint_coordinator import (
    A1,
    A2,
    A3,
    JOB_ID,
    ControlledHook,
    Harness,
    R,
    RecordingGateway,
    ack,
    all_exist,
    decline,
    failure_reason,
    file_state,
    make_coordinator,
    make_plan,
    none_exist,
    pending_ids,
    succeeded,
)
from tests.test_completed_checkpoint_store import UndeletableStorage

# ---------------------------------------------------------------------- failure-injecting doubles


class FailingStore(CompletedCheckpointStore):
    """A store that refuses the checkpoints in ``failing`` (a store whose backend is down).

    It also records, at every ``add_checkpoint``, whether any future in ``watched`` was
    already done: a caller must not hear "completed" before the store has the checkpoint.
    """

    def __init__(self, retained: int = 1, failing: Iterable[int] = ()) -> None:
        super().__init__(retained)
        self.failing = set(failing)
        self.watched: list[Future[CompletedCheckpoint]] = []
        self.done_when_added: list[bool] = []

    def add_checkpoint(self, checkpoint: CompletedCheckpoint) -> list[CompletedCheckpoint]:
        self.done_when_added.append(any(f.done() for f in self.watched))
        if checkpoint.checkpoint_id in self.failing:
            raise OSError(f"checkpoint store unavailable, cannot add checkpoint {checkpoint.checkpoint_id}")
        return super().add_checkpoint(checkpoint)


class FailingMetadataStorage(CheckpointStorage):
    """Real local storage whose ``_metadata`` write of the checkpoints in ``failing`` reports
    an error *after* the bytes reached the disk (a failed close or fsync): the worst case,
    a ``_metadata`` file exists although the write failed."""

    def __init__(self, base_uri: str, failing: Iterable[int]) -> None:
        super().__init__(base_uri, JOB_ID)
        self.failing = set(failing)

    def write_metadata(
        self, checkpoint_id: int, data: bytes, target_location: str | None = None
    ) -> str | None:
        pointer = super().write_metadata(checkpoint_id, data, target_location)
        if checkpoint_id in self.failing:
            raise OSError(f"fsync of chk-{checkpoint_id}/_metadata failed")
        return pointer


@dataclass
class FaultyGateway(RecordingGateway):
    """Tasks behind a connection that breaks: a trigger that raises, a trigger that cannot be
    delivered (``False``: no slot, or the slot is gone), notifications that raise after
    being recorded."""

    trigger_raises: set[ExecutionAttemptID] = field(default_factory=set)
    undeliverable: set[ExecutionAttemptID] = field(default_factory=set)
    notify_raises: set[ExecutionAttemptID] = field(default_factory=set)

    def trigger_checkpoint(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int, options: CheckpointOptions
    ) -> bool:
        if attempt_id in self.trigger_raises:
            raise ConnectionResetError(f"connection to the slot of {attempt_id} was reset")
        if attempt_id in self.undeliverable:
            return False
        return super().trigger_checkpoint(attempt_id, checkpoint_id, timestamp, options)

    def notify_checkpoint_complete(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        super().notify_checkpoint_complete(attempt_id, checkpoint_id, timestamp)
        self._break_if_told(attempt_id)

    def notify_checkpoint_aborted(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        super().notify_checkpoint_aborted(attempt_id, checkpoint_id, timestamp)
        self._break_if_told(attempt_id)

    def _break_if_told(self, attempt_id: ExecutionAttemptID) -> None:
        if attempt_id in self.notify_raises:
            raise ConnectionResetError(f"connection to the slot of {attempt_id} was reset")


# ---------------------------------------------------------------------- helpers

PLAN = make_plan([A1], [A1, A2])


def checkpoint_with_files(h: Harness, checkpoint_id: int) -> tuple[Future[CompletedCheckpoint], list]:
    """Trigger checkpoint ``checkpoint_id`` and acknowledge it from A1 and A2 with real state files."""
    future = h.coordinator.trigger_checkpoint()
    assert pending_ids(h) == [checkpoint_id]
    states = [file_state(h.storage, checkpoint_id, a) for a in (A1, A2)]
    for attempt_id, state in zip((A1, A2), states, strict=True):
        assert ack(h, attempt_id, checkpoint_id, state)
    return future, states


def metadata_file(h: Harness, checkpoint_id: int) -> str:
    return os.path.join(h.storage.checkpoint_dir(checkpoint_id), METADATA_FILE_NAME)


def assert_failed_cleanly(
    h: Harness, failed_id: int, previous: list[TaskStateSnapshot], failed: list[TaskStateSnapshot]
) -> None:
    """Checkpoint ``failed_id`` left nothing behind and ``failed_id - 1`` is still the latest."""
    coordinator = h.coordinator
    assert h.store.get_latest_checkpoint() is not None
    assert h.store.get_latest_checkpoint().checkpoint_id == failed_id - 1
    assert h.store.number_of_retained_checkpoints == 1
    assert coordinator.latest_completed_checkpoint_id == failed_id - 1
    assert pending_ids(h) == []
    # nothing half-registered: only the previous checkpoint
    assert coordinator.shared_state_registry.registered_checkpoints == {failed_id - 1}
    # the failed checkpoint's state and _metadata are gone; the previous one is intact
    assert none_exist(failed) and not os.path.exists(h.storage.checkpoint_dir(failed_id))
    assert all_exist(previous) and os.path.isfile(metadata_file(h, failed_id - 1))
    # the tasks heard "aborted", never "complete"
    for attempt_id in (A1, A2):
        assert h.gateway.completed_ids(attempt_id) == [failed_id - 1]
        assert h.gateway.aborted_ids(attempt_id) == [failed_id]
    stats = coordinator.stats
    assert stats.counts["failed"] == 1 and stats.counts["in_progress"] == 0
    assert coordinator.failure_manager.continuous_failure_counter == 1


def assert_next_checkpoint_proceeds(
    h: Harness, checkpoint_id: int, previous: list[TaskStateSnapshot]
) -> None:
    future, states = checkpoint_with_files(h, checkpoint_id)
    assert succeeded(future).checkpoint_id == checkpoint_id
    assert h.store.get_latest_checkpoint() is succeeded(future)
    assert h.coordinator.latest_completed_checkpoint_id == checkpoint_id
    assert all_exist(states) and none_exist(previous)  # the previous one was subsumed
    assert h.coordinator.failure_manager.continuous_failure_counter == 0


# ---------------------------------------------------------------------- "completed" only once stored


def test_a_store_failure_keeps_the_previous_checkpoint_and_registers_nothing(tmp_path: Path) -> None:
    store = FailingStore(failing={2})
    h = make_coordinator(PLAN, tmp_path=tmp_path, store=store)
    first, previous = checkpoint_with_files(h, 1)
    succeeded(first)

    second, failed = checkpoint_with_files(h, 2)

    assert failure_reason(second) is R.FINALIZE_CHECKPOINT_FAILURE
    assert "checkpoint store unavailable" in str(second.exception())
    assert_failed_cleanly(h, 2, previous, failed)
    assert h.job_failures == []  # one failure, ten tolerated
    assert_next_checkpoint_proceeds(h, 3, previous)


def test_a_metadata_write_failure_keeps_the_previous_checkpoint_and_registers_nothing(
    tmp_path: Path,
) -> None:
    storage = FailingMetadataStorage(str(tmp_path), failing={2})
    h = make_coordinator(PLAN, storage=storage)
    first, previous = checkpoint_with_files(h, 1)
    succeeded(first)

    second, failed = checkpoint_with_files(h, 2)

    assert failure_reason(second) is R.FINALIZE_CHECKPOINT_FAILURE
    assert "fsync of chk-2/_metadata failed" in str(second.exception())
    assert not os.path.exists(metadata_file(h, 2))  # written, then discarded with chk-2
    assert_failed_cleanly(h, 2, previous, failed)
    assert_next_checkpoint_proceeds(h, 3, previous)


def test_the_callers_future_completes_only_after_the_store_accepted_the_checkpoint() -> None:
    store = FailingStore()
    h = make_coordinator(PLAN, store=store)
    future = h.coordinator.trigger_checkpoint()
    store.watched.append(future)
    assert ack(h, A1, 1) and ack(h, A2, 1)
    assert store.done_when_added == [False]
    assert succeeded(future) is store.get_latest_checkpoint()


def test_consecutive_store_failures_count_toward_the_tolerable_limit() -> None:
    """FINALIZE_CHECKPOINT_FAILURE counts (Flink); the success reset must not come first."""
    h = make_coordinator(PLAN, store=FailingStore(failing={1, 2}), tolerable_failures=1)
    for checkpoint_id in (1, 2):
        future = h.coordinator.trigger_checkpoint()
        assert ack(h, A1, checkpoint_id) and ack(h, A2, checkpoint_id)
        assert failure_reason(future) is R.FINALIZE_CHECKPOINT_FAILURE
    assert len(h.job_failures) == 1
    assert isinstance(h.job_failures[0], CheckpointToleranceExceeded)
    assert h.job_failures[0].last.reason is R.FINALIZE_CHECKPOINT_FAILURE


def test_a_store_failure_runs_the_queued_requests() -> None:
    h = make_coordinator(PLAN, store=FailingStore(failing={1}), max_concurrent=1)
    first = h.coordinator.trigger_checkpoint()
    queued = h.coordinator.trigger_checkpoint()  # waits: one checkpoint at a time
    assert pending_ids(h) == [1]
    assert ack(h, A1, 1) and ack(h, A2, 1)
    assert failure_reason(first) is R.FINALIZE_CHECKPOINT_FAILURE
    assert pending_ids(h) == [2] and h.gateway.triggered_ids(A1) == [1, 2]
    assert ack(h, A1, 2) and ack(h, A2, 2)
    assert succeeded(queued).checkpoint_id == 2


# ---------------------------------------------------------------------- failed triggers


def test_a_trigger_that_raises_aborts_the_checkpoint_at_once_and_is_not_counted() -> None:
    gateway = FaultyGateway(trigger_raises={A2})
    h = make_coordinator(make_plan([A1, A2], [A1, A2, A3]), gateway=gateway, tolerable_failures=0)

    future = h.coordinator.trigger_checkpoint()  # no exception escapes to the caller

    assert failure_reason(future) is R.TRIGGER_CHECKPOINT_FAILURE
    message = str(future.exception())
    assert str(A2) in message and "connection to the slot" in message
    assert pending_ids(h) == []
    for attempt_id in (A1, A2, A3):
        assert gateway.aborted_ids(attempt_id) == [1]
    assert h.job_failures == []  # Flink does not count trigger failures
    assert h.coordinator.failure_manager.continuous_failure_counter == 0
    # the next checkpoint proceeds, without waiting for any timeout
    gateway.trigger_raises.clear()
    second = h.coordinator.trigger_checkpoint()
    assert gateway.triggered_ids(A1) == [1, 2] and gateway.triggered_ids(A2) == [2]
    for attempt_id in (A1, A2, A3):
        assert ack(h, attempt_id, 2)
    assert succeeded(second).checkpoint_id == 2


def test_an_undeliverable_trigger_fails_the_checkpoint_at_once_with_task_checkpoint_failure() -> None:
    gateway = FaultyGateway(undeliverable={A1})
    h = make_coordinator(make_plan([A1, A2], [A1, A2]), gateway=gateway, tolerable_failures=0)

    future = h.coordinator.trigger_checkpoint()

    assert failure_reason(future) is R.TASK_CHECKPOINT_FAILURE
    assert str(A1) in str(future.exception())
    assert gateway.triggered_ids(A2) == []  # the rest is not asked for a doomed checkpoint
    assert gateway.aborted_ids(A1) == [1] and gateway.aborted_ids(A2) == [1]
    assert pending_ids(h) == [] and h.job_failures == []
    gateway.undeliverable.clear()
    second = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 2) and ack(h, A2, 2)
    assert succeeded(second).checkpoint_id == 2


def test_a_trigger_failure_after_master_hooks_lets_the_queued_request_run() -> None:
    hook = ControlledHook()
    gateway = FaultyGateway(trigger_raises={A1})
    h = make_coordinator(make_plan([A1], [A1]), gateway=gateway, master_hooks=[hook])
    first = h.coordinator.trigger_checkpoint()
    queued = h.coordinator.trigger_checkpoint()  # waits while checkpoint 1 is triggering
    assert pending_ids(h) == [1]

    hook.futures[1].set_result(b"hook state")
    h.timer.run_due()  # the hook's answer hops onto the coordinator's thread

    assert failure_reason(first) is R.TRIGGER_CHECKPOINT_FAILURE
    assert pending_ids(h) == [2]  # the queued request runs at once
    gateway.trigger_raises.clear()
    hook.futures[2].set_result(None)
    h.timer.run_due()
    assert ack(h, A1, 2)
    assert succeeded(queued).checkpoint_id == 2


def test_many_queued_requests_failing_one_after_another_do_not_recurse() -> None:
    """Each failed trigger runs the queue again; that must loop, not nest 300 deep."""
    gateway = FaultyGateway()
    h = make_coordinator(make_plan([A1], [A1]), gateway=gateway, max_concurrent=1)
    first = h.coordinator.trigger_checkpoint()
    queued = [h.coordinator.trigger_checkpoint() for _ in range(300)]
    gateway.undeliverable.add(A1)  # the slot is gone

    decline(h, A1, 1)

    assert failure_reason(first) is R.CHECKPOINT_DECLINED
    assert [failure_reason(f) for f in queued] == [R.TASK_CHECKPOINT_FAILURE] * 300
    assert pending_ids(h) == []


# ---------------------------------------------------------------------- half-done completions and aborts


def test_a_failing_complete_notification_does_not_stop_the_rest_of_the_completion() -> None:
    gateway = FaultyGateway(notify_raises={A1})
    h = make_coordinator(make_plan([A1], [A1, A2]), gateway=gateway, max_concurrent=1)
    first = h.coordinator.trigger_checkpoint()
    queued = h.coordinator.trigger_checkpoint()

    assert ack(h, A1, 1) and ack(h, A2, 1)  # notifying A1 raises: logged, not propagated

    assert succeeded(first).checkpoint_id == 1
    assert gateway.completed_ids(A1) == [1] and gateway.completed_ids(A2) == [1]
    assert h.coordinator.stats.counts["completed"] == 1
    assert pending_ids(h) == [2] and not queued.done()  # the queued request ran


def test_a_failing_abort_notification_does_not_stop_the_rest_of_the_abort() -> None:
    gateway = FaultyGateway(notify_raises={A1})
    h = make_coordinator(make_plan([A1], [A1, A2]), gateway=gateway, max_concurrent=1)
    first = h.coordinator.trigger_checkpoint()
    queued = h.coordinator.trigger_checkpoint()

    decline(h, A2, 1)

    assert failure_reason(first) is R.CHECKPOINT_DECLINED
    assert gateway.aborted_ids(A1) == [1] and gateway.aborted_ids(A2) == [1]
    assert pending_ids(h) == [2] and not queued.done()


@pytest.mark.parametrize("error", [KeyError("vertex 7"), RuntimeError("execution graph is being rebuilt")])
def test_a_plan_calculator_bug_fails_the_request_and_the_next_one_proceeds(error: Exception) -> None:
    calls: list[int] = []

    def plan() -> CheckpointPlan:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return make_plan([A1], [A1])

    h = make_coordinator(plan)
    future = h.coordinator.trigger_checkpoint()
    assert failure_reason(future) is R.TRIGGER_CHECKPOINT_FAILURE
    assert str(error) in str(future.exception())
    assert isinstance(future.exception(), CheckpointException)
    second = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 1)
    assert succeeded(second).checkpoint_id == 1


def test_a_failed_deletion_of_the_subsumed_checkpoint_does_not_fail_the_new_one(tmp_path: Path) -> None:
    storage = UndeletableStorage(str(tmp_path), JOB_ID)
    h = make_coordinator(PLAN, storage=storage)
    first, _ = checkpoint_with_files(h, 1)
    succeeded(first)

    second, states = checkpoint_with_files(h, 2)  # subsumes 1, whose deletion fails

    assert succeeded(second) is h.store.get_latest_checkpoint()
    assert os.path.isfile(metadata_file(h, 2)) and all_exist(states)
    assert h.coordinator.latest_completed_checkpoint_id == 2
    assert h.gateway.completed_ids(A1) == [1, 2] and h.gateway.aborted_ids(A1) == []
    assert h.coordinator.shared_state_registry.registered_checkpoints == {2}


def test_a_failed_deletion_does_not_stop_an_abort_half_way(tmp_path: Path) -> None:
    storage = UndeletableStorage(str(tmp_path), JOB_ID)
    h = make_coordinator(PLAN, storage=storage, max_concurrent=1)
    first = h.coordinator.trigger_checkpoint()
    queued = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 1, file_state(h.storage, 1, A1))

    decline(h, A2, 1)  # discarding chk-1 fails: logged, the abort goes on

    assert failure_reason(first) is R.CHECKPOINT_DECLINED
    assert h.gateway.aborted_ids(A1) == [1] and h.gateway.aborted_ids(A2) == [1]
    assert pending_ids(h) == [2]
    assert ack(h, A1, 2) and ack(h, A2, 2)
    assert succeeded(queued).checkpoint_id == 2
