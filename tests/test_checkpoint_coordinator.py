"""CheckpointCoordinator: Flink's coordinator scenarios S36-S46 and the failure manager.

Everything is driven by hand: a :class:`ManualClock` and a :class:`ManualTimer` stand
in for time, and a :class:`RecordingGateway` stands in for the tasks (it records every
trigger / notify-complete / notify-aborted call per attempt, as Flink's tests do).
State that must be "discarded" is written as real files through
:meth:`CheckpointStorage.write_state`, so discarding is checked on disk.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chandy.checkpoint.completed_checkpoint import CompletedCheckpoint, CompletedCheckpointStore
from chandy.checkpoint.coordinator import CheckpointCoordinator, CheckpointCoordinatorConfiguration
from chandy.checkpoint.failure_manager import CheckpointFailureManager, CheckpointToleranceExceeded
from chandy.checkpoint.hooks import MasterTriggerRestoreHook
from chandy.checkpoint.id_counter import CheckpointIDCounter
from chandy.checkpoint.metadata import MasterState
from chandy.checkpoint.pending_checkpoint import CheckpointPlan, TaskToAck
from chandy.checkpoint.properties import CheckpointProperties
from chandy.checkpoint.stats import CheckpointStatsTracker
from chandy.config.options import ExternalizedCheckpointRetention
from chandy.errors import ConfigurationError
from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    AlignmentType,
    CheckpointException,
    CheckpointFailureReason,
    CheckpointMetrics,
    CheckpointOptions,
    CheckpointType,
    DeclineCheckpoint,
)
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.status import JobStatus
from chandy.state.handles import (
    FileStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
    OperatorStateMeta,
)
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import METADATA_FILE_NAME, CheckpointStorage
from chandy.util.clock import ManualClock
from chandy.util.threads import MainThreadChecker, WrongThreadError
from chandy.util.timer import ManualTimer

JOB_ID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
TIMEOUT_MS = 200_000
UNLIMITED = sys.maxsize
R = CheckpointFailureReason


# ---------------------------------------------------------------------- test doubles


def attempt(vertex: int, subtask: int = 0) -> ExecutionAttemptID:
    return ExecutionAttemptID(vertex, subtask, 0)


def operator_id(vertex: int) -> str:
    return f"op-{vertex}"


def task_to_ack(attempt_id: ExecutionAttemptID, parallelism: int = 1) -> TaskToAck:
    return TaskToAck(
        attempt_id,
        attempt_id.vertex_id,
        attempt_id.subtask_index,
        parallelism,
        128,
        (operator_id(attempt_id.vertex_id),),
    )


def make_plan(
    trigger: Sequence[ExecutionAttemptID],
    wait_for: Sequence[ExecutionAttemptID],
    commit: Sequence[ExecutionAttemptID] | None = None,
) -> CheckpointPlan:
    """Trigger ``trigger``, wait for ``wait_for``, notify ``commit`` (default: ``wait_for``)."""
    return CheckpointPlan(
        tuple(trigger), tuple(task_to_ack(a) for a in wait_for), tuple(wait_for if commit is None else commit)
    )


@dataclass
class RecordingGateway:
    """The tasks, as the coordinator sees them: every call is recorded per attempt."""

    triggered: list[tuple[ExecutionAttemptID, int, int, CheckpointOptions]] = field(default_factory=list)
    completed: list[tuple[ExecutionAttemptID, int, int]] = field(default_factory=list)
    aborted: list[tuple[ExecutionAttemptID, int, int]] = field(default_factory=list)

    def trigger_checkpoint(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int, options: CheckpointOptions
    ) -> bool:
        self.triggered.append((attempt_id, checkpoint_id, timestamp, options))
        return True

    def notify_checkpoint_complete(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        self.completed.append((attempt_id, checkpoint_id, timestamp))

    def notify_checkpoint_aborted(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        self.aborted.append((attempt_id, checkpoint_id, timestamp))

    def triggered_ids(self, attempt_id: ExecutionAttemptID) -> list[int]:
        return [cid for a, cid, _, _ in self.triggered if a == attempt_id]

    def trigger_timestamps(self, attempt_id: ExecutionAttemptID) -> list[int]:
        return [ts for a, _, ts, _ in self.triggered if a == attempt_id]

    def completed_ids(self, attempt_id: ExecutionAttemptID) -> list[int]:
        return [cid for a, cid, _ in self.completed if a == attempt_id]

    def aborted_ids(self, attempt_id: ExecutionAttemptID) -> list[int]:
        return [cid for a, cid, _ in self.aborted if a == attempt_id]


class ControlledHook(MasterTriggerRestoreHook):
    """A master hook whose state futures the test completes (or never completes)."""

    def __init__(self, identifier: str = "hook") -> None:
        self.identifier = identifier
        self.futures: dict[int, Future[bytes | None]] = {}

    def get_identifier(self) -> str:
        return self.identifier

    def trigger_checkpoint(self, checkpoint_id: int, timestamp: int) -> Future[bytes | None]:
        future: Future[bytes | None] = Future()
        self.futures[checkpoint_id] = future
        return future

    def restore_checkpoint(self, checkpoint_id: int, data: bytes | None) -> None:
        pass


class RaisingHook(ControlledHook):
    """A master hook that raises instead of returning a future."""

    def trigger_checkpoint(self, checkpoint_id: int, timestamp: int) -> Future[bytes | None]:
        raise RuntimeError(f"hook cannot snapshot checkpoint {checkpoint_id}")


class FullIntervalDelay(random.Random):
    """The periodic scheduler's initial delay is drawn from ``[min_pause, interval]``; this
    one always picks the full interval, so ``advance(interval)`` fires exactly one tick."""

    def randint(self, a: int, b: int) -> int:
        return b


class FlakyIDCounter(CheckpointIDCounter):
    """An id counter whose n-th calls (1-based) fail, like an unreachable ZooKeeper."""

    def __init__(self, failing_calls: Iterable[int]) -> None:
        super().__init__()
        self.failing_calls = set(failing_calls)
        self.calls = 0

    def get_and_increment(self) -> int:
        self.calls += 1
        if self.calls in self.failing_calls:
            raise OSError("checkpoint id counter unavailable")
        return super().get_and_increment()


@dataclass
class Harness:
    coordinator: CheckpointCoordinator
    gateway: RecordingGateway
    clock: ManualClock
    timer: ManualTimer
    storage: CheckpointStorage
    store: CompletedCheckpointStore
    job_failures: list[BaseException]

    def tick(self) -> None:
        """Let exactly one periodic trigger fire (see :class:`FullIntervalDelay`)."""
        interval = self.coordinator.config.interval_ms
        assert interval is not None
        self.timer.advance(interval)

    def ticks(self, n: int) -> None:
        for _ in range(n):
            self.tick()


def make_coordinator(
    plan: CheckpointPlan | Callable[[], CheckpointPlan],
    *,
    tmp_path: Path | None = None,
    interval_ms: int | None = None,
    timeout_ms: int = TIMEOUT_MS,
    min_pause_ms: int = 0,
    max_concurrent: int = 1,
    tolerable_failures: int = 10,
    retention: ExternalizedCheckpointRetention = ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS,
    retained: int = 1,
    master_hooks: Sequence[MasterTriggerRestoreHook] = (),
    id_counter: CheckpointIDCounter | None = None,
    rng: random.Random | None = None,
    main_thread: MainThreadChecker | None = None,
    gateway: RecordingGateway | None = None,
    storage: CheckpointStorage | None = None,
    store: CompletedCheckpointStore | None = None,
    exactly_once: bool = True,
    unaligned: bool = False,
    aligned_checkpoint_timeout_ms: int = 0,
    metadata_writer: Callable[[Callable[[], str | None]], Future[str | None]] | None = None,
) -> Harness:
    """A coordinator on manual time; filesystem storage under ``tmp_path`` if given.

    ``gateway``, ``storage`` and ``store`` replace the defaults with failure-injecting doubles.
    """
    clock = ManualClock(start_ms=1_000_000)
    timer = ManualTimer(clock)
    gateway = gateway or RecordingGateway()
    storage = storage or CheckpointStorage(None if tmp_path is None else str(tmp_path), JOB_ID)
    storage.initialize()
    store = store or CompletedCheckpointStore(retained)
    failures: list[BaseException] = []
    config = CheckpointCoordinatorConfiguration(
        interval_ms=interval_ms,
        timeout_ms=timeout_ms,
        min_pause_ms=min_pause_ms,
        max_concurrent=max_concurrent,
        tolerable_failures=tolerable_failures,
        retention=retention,
        exactly_once=exactly_once,
        unaligned=unaligned,
        aligned_checkpoint_timeout_ms=aligned_checkpoint_timeout_ms,
    )
    calculator = plan if callable(plan) else (lambda: plan)
    coordinator = CheckpointCoordinator(
        JOB_ID,
        config,
        plan_calculator=calculator,
        gateway=gateway,
        storage=storage,
        completed_store=store,
        id_counter=id_counter or CheckpointIDCounter(),
        stats=CheckpointStatsTracker(),
        clock=clock,
        timer=timer,
        fail_job=failures.append,
        vertex_names={},
        master_hooks=master_hooks,
        rng=rng or FullIntervalDelay(),
        main_thread=main_thread,
        metadata_writer=metadata_writer,
    )
    return Harness(coordinator, gateway, clock, timer, storage, store, failures)


def ack(
    h: Harness, attempt_id: ExecutionAttemptID, checkpoint_id: int, state: TaskStateSnapshot | None = None
) -> bool:
    return h.coordinator.receive_acknowledge_message(
        AcknowledgeCheckpoint(JOB_ID, attempt_id, checkpoint_id, CheckpointMetrics(), state)
    )


def decline(
    h: Harness,
    attempt_id: ExecutionAttemptID,
    checkpoint_id: int,
    reason: CheckpointFailureReason = R.CHECKPOINT_DECLINED,
) -> None:
    h.coordinator.receive_decline_message(
        DeclineCheckpoint(JOB_ID, attempt_id, checkpoint_id, reason, "test decline")
    )


def file_state(
    storage: CheckpointStorage, checkpoint_id: int, attempt_id: ExecutionAttemptID
) -> TaskStateSnapshot:
    """A subtask's operator state in a real file of ``chk-<checkpoint_id>`` (above the inline
    threshold, so it is a :class:`FileStateHandle`)."""
    size = storage.inline_threshold + 1
    data = (f"chk-{checkpoint_id} {attempt_id};".encode() * size)[:size]
    handle = storage.write_state(checkpoint_id, data)
    assert isinstance(handle, FileStateHandle)
    meta = OperatorStateMeta(OperatorStateDistributionMode.SPLIT_DISTRIBUTE, ((0, size),))
    subtask = OperatorSubtaskState((), (OperatorStateHandle({"offsets": meta}, handle),))
    return TaskStateSnapshot({operator_id(attempt_id.vertex_id): subtask})


def paths(state: TaskStateSnapshot) -> list[str]:
    return [handle.path for handle in state.file_handles()]


def all_exist(states: Iterable[TaskStateSnapshot]) -> bool:
    return all(os.path.exists(p) for s in states for p in paths(s))


def none_exist(states: Iterable[TaskStateSnapshot]) -> bool:
    return not any(os.path.exists(p) for s in states for p in paths(s))


def failure_reason(future: Future[CompletedCheckpoint]) -> CheckpointFailureReason:
    assert future.done(), "the trigger future is still open"
    exception = future.exception()
    assert isinstance(exception, CheckpointException), exception
    return exception.reason


def succeeded(future: Future[CompletedCheckpoint]) -> CompletedCheckpoint:
    assert future.done(), "the trigger future is still open"
    assert future.exception() is None, future.exception()
    return future.result()


def pending_ids(h: Harness) -> list[int]:
    return sorted(h.coordinator.pending_checkpoints)


A1, A2, A3 = attempt(1), attempt(2), attempt(3)


# ---------------------------------------------------------------------- S36


def test_s36_trigger_ack_complete(tmp_path: Path) -> None:
    h = make_coordinator(make_plan([A1, A2], [A1, A2]), tmp_path=tmp_path)
    coordinator = h.coordinator

    future = coordinator.trigger_checkpoint()
    assert coordinator.number_of_pending_checkpoints == 1
    assert h.store.number_of_retained_checkpoints == 0
    pending = coordinator.pending_checkpoints[1]
    assert pending.number_of_non_acknowledged_tasks == 2
    assert pending.number_of_acknowledged_tasks == 0
    assert not pending.disposed
    # the timeout canceller is scheduled
    assert [entry.due_ms for entry in h.timer.pending()] == [h.clock.now_ms() + TIMEOUT_MS]
    # both tasks were asked to checkpoint 1
    assert h.gateway.triggered_ids(A1) == [1]
    assert h.gateway.triggered_ids(A2) == [1]

    state1, state2 = file_state(h.storage, 1, A1), file_state(h.storage, 1, A2)
    assert ack(h, A2, 1, state2)
    assert pending.number_of_acknowledged_tasks == 1
    assert pending.number_of_non_acknowledged_tasks == 1
    assert not pending.disposed

    # a duplicate ack changes nothing
    assert ack(h, A2, 1, state2)
    assert pending.number_of_acknowledged_tasks == 1
    assert pending.number_of_non_acknowledged_tasks == 1
    assert not pending.disposed
    assert all_exist([state2])

    assert ack(h, A1, 1, state1)
    assert pending.disposed
    assert coordinator.number_of_pending_checkpoints == 0
    assert h.store.number_of_retained_checkpoints == 1
    assert h.timer.pending() == []  # the canceller is gone
    completed = succeeded(future)
    assert completed.checkpoint_id == 1
    assert h.store.get_latest_checkpoint() is completed
    # registered once, the duplicate ack notwithstanding; exclusive files are not counted
    assert coordinator.shared_state_registry.registered_checkpoints == {1}
    assert coordinator.shared_state_registry.references == {}
    # _metadata was written last into chk-1, next to the state files
    chk1 = h.storage.checkpoint_dir(1)
    assert completed.external_pointer == chk1
    assert os.path.isfile(os.path.join(chk1, METADATA_FILE_NAME))
    assert all_exist([state1, state2])
    # both tasks are told
    assert h.gateway.completed_ids(A1) == [1]
    assert h.gateway.completed_ids(A2) == [1]
    assert h.gateway.aborted == []

    # a second round replaces the first in a store that retains one
    future2 = coordinator.trigger_checkpoint()
    assert h.gateway.triggered_ids(A1) == [1, 2]
    state1b, state2b = file_state(h.storage, 2, A1), file_state(h.storage, 2, A2)
    assert ack(h, A1, 2, state1b)
    assert ack(h, A2, 2, state2b)
    completed2 = succeeded(future2)
    assert h.store.get_all_checkpoints() == [completed2]
    assert completed.discarded
    assert not os.path.exists(chk1)
    assert none_exist([state1, state2])
    assert all_exist([state1b, state2b])
    assert os.path.isfile(os.path.join(h.storage.checkpoint_dir(2), METADATA_FILE_NAME))
    assert coordinator.shared_state_registry.registered_checkpoints == {2}
    assert h.gateway.completed_ids(A1) == [1, 2]
    assert h.gateway.completed_ids(A2) == [1, 2]
    assert h.timer.pending() == []


def finished_state(attempt_id: ExecutionAttemptID) -> TaskStateSnapshot:
    """What a task that ended before the trigger reached it acknowledges: finished, no state."""
    return TaskStateSnapshot({operator_id(attempt_id.vertex_id): OperatorSubtaskState(finished=True)})


def test_a_task_whose_upstream_all_acknowledge_as_finished_is_triggered_itself() -> None:
    """Sources A1 and A2 feed A3. The plan saw both running, so only they are triggered; both
    had ended when the trigger arrived and acknowledge as finished, sending no barrier. The
    coordinator then triggers A3 itself (once), and the checkpoint completes on its ack;
    without that trigger the checkpoint waited for A3 until its timeout."""
    plan = CheckpointPlan(
        (A1, A2), tuple(task_to_ack(a) for a in (A1, A2, A3)), (A1, A2, A3), upstream_of={A3: (A1, A2)}
    )
    h = make_coordinator(plan)
    future = h.coordinator.trigger_checkpoint()
    assert h.gateway.triggered_ids(A3) == []

    assert ack(h, A1, 1, finished_state(A1))
    assert h.gateway.triggered_ids(A3) == []  # A2 may still send its barrier
    assert ack(h, A2, 1, finished_state(A2))
    assert h.gateway.triggered_ids(A3) == [1]
    assert not future.done()

    assert ack(h, A3, 1)
    completed = succeeded(future)
    assert h.gateway.triggered_ids(A3) == [1]
    state = completed.operator_states[operator_id(1)].subtask_states[0]
    assert state.finished


def test_a_checkpoint_that_reached_only_finished_tasks_is_not_completed() -> None:
    """The plan saw A1 -> A3 running, but both had finished when the trigger reached them: the
    checkpoint holds no state and nothing waits for it. It is not completed (Flink triggers
    none once every task finished), so the latest completed checkpoint stays the final one,
    which holds the job's last state; the failure counts against nothing."""
    plan = CheckpointPlan((A1,), tuple(task_to_ack(a) for a in (A1, A3)), (A1, A3), upstream_of={A3: (A1,)})
    h = make_coordinator(plan)
    first = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 1)
    assert ack(h, A3, 1)
    final = succeeded(first)

    second = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 2, finished_state(A1))
    assert h.gateway.triggered_ids(A3) == [2]  # its upstream ended: triggered itself
    assert ack(h, A3, 2, finished_state(A3))
    assert second.done() and second.exception() is not None
    assert h.store.get_all_checkpoints() == [final]
    assert h.coordinator.pending_checkpoints == {}


def test_a_task_is_not_triggered_when_an_upstream_task_took_the_checkpoint() -> None:
    """A1 acknowledges as finished but A2 took the checkpoint (its barrier is on its way to
    A3): A3 waits for that barrier and is never triggered."""
    plan = CheckpointPlan(
        (A1, A2), tuple(task_to_ack(a) for a in (A1, A2, A3)), (A1, A2, A3), upstream_of={A3: (A1, A2)}
    )
    h = make_coordinator(plan)
    future = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 1, finished_state(A1))
    assert ack(h, A2, 1)
    assert ack(h, A3, 1)
    succeeded(future)
    assert h.gateway.triggered_ids(A3) == []


def test_a_task_triggered_for_finished_upstream_that_cannot_be_reached_aborts_the_checkpoint() -> None:
    """The trigger for A3 cannot be delivered (its slot is gone): the checkpoint fails at once
    rather than waiting for its timeout."""

    class Unreachable(RecordingGateway):
        def trigger_checkpoint(
            self,
            attempt_id: ExecutionAttemptID,
            checkpoint_id: int,
            timestamp: int,
            options: CheckpointOptions,
        ) -> bool:
            super().trigger_checkpoint(attempt_id, checkpoint_id, timestamp, options)
            return attempt_id != A3

    plan = CheckpointPlan((A1,), tuple(task_to_ack(a) for a in (A1, A3)), (A1, A3), upstream_of={A3: (A1,)})
    h = make_coordinator(plan, gateway=Unreachable())
    future = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 1, finished_state(A1))
    assert failure_reason(future) is R.TASK_CHECKPOINT_FAILURE
    assert h.coordinator.number_of_pending_checkpoints == 0


# ---------------------------------------------------------------------- S37


def test_s37_decline_discards_the_checkpoint_and_its_state(tmp_path: Path) -> None:
    h = make_coordinator(make_plan([A1, A2], [A1, A2]), tmp_path=tmp_path)
    future = h.coordinator.trigger_checkpoint()
    state1 = file_state(h.storage, 1, A1)
    assert ack(h, A1, 1, state1)

    decline(h, A2, 1)

    assert failure_reason(future) is R.CHECKPOINT_DECLINED
    assert h.coordinator.number_of_pending_checkpoints == 0
    assert h.store.number_of_retained_checkpoints == 0
    assert none_exist([state1])
    assert h.gateway.aborted_ids(A1) == [1]
    assert h.gateway.completed == []
    # no new checkpoint was triggered
    assert h.gateway.triggered_ids(A1) == [1]
    # a late ack for the declined checkpoint: its state is discarded at once
    late = file_state(h.storage, 1, A1)
    assert not ack(h, A1, 1, late)
    assert none_exist([late])


def test_s37_decline_of_one_of_two_pending_checkpoints() -> None:
    h = make_coordinator(make_plan([A1, A2], [A1, A2]), max_concurrent=2)
    future1 = h.coordinator.trigger_checkpoint()
    future2 = h.coordinator.trigger_checkpoint()
    assert pending_ids(h) == [1, 2]
    pending1, pending2 = h.coordinator.pending_checkpoints[1], h.coordinator.pending_checkpoints[2]

    decline(h, A1, 1)

    assert pending1.disposed
    assert failure_reason(future1) is R.CHECKPOINT_DECLINED
    assert pending_ids(h) == [2]
    assert not pending2.disposed
    assert not future2.done()
    # no new checkpoint is triggered
    assert h.gateway.triggered_ids(A1) == [1, 2]
    assert h.gateway.triggered_ids(A2) == [1, 2]
    assert h.coordinator.failure_manager.continuous_failure_counter == 1

    # further declines of the discarded checkpoint, from any task, are ignored
    decline(h, A1, 1)
    decline(h, A2, 1)
    assert pending_ids(h) == [2]
    assert not pending2.disposed
    assert h.coordinator.failure_manager.continuous_failure_counter == 1
    assert h.gateway.aborted_ids(A1) == [1]
    assert h.gateway.triggered_ids(A1) == [1, 2]

    h.coordinator.shutdown(JobStatus.CANCELED)
    assert pending2.disposed
    assert failure_reason(future2) is R.CHECKPOINT_COORDINATOR_SHUTDOWN


# ---------------------------------------------------------------------- S38


def test_s38_concurrent_checkpoints_with_separate_trigger_ack_commit_sets() -> None:
    trigger1, trigger2 = attempt(10), attempt(11)
    ack1, ack2, ack3 = attempt(20), attempt(21), attempt(22)
    commit = attempt(30)
    h = make_coordinator(
        make_plan([trigger1, trigger2], [ack1, ack2, ack3], [commit]), max_concurrent=UNLIMITED, retained=2
    )

    future1 = h.coordinator.trigger_checkpoint()
    assert ack(h, ack3, 1)
    future2 = h.coordinator.trigger_checkpoint()
    assert pending_ids(h) == [1, 2]
    assert h.gateway.triggered_ids(trigger1) == [1, 2]
    assert h.gateway.triggered_ids(trigger2) == [1, 2]
    assert h.gateway.triggered_ids(ack1) == []

    assert ack(h, ack1, 1)
    assert ack(h, ack1, 2)
    assert not future1.done()
    assert ack(h, ack2, 1)  # the third ack of checkpoint 1
    assert succeeded(future1).checkpoint_id == 1
    assert pending_ids(h) == [2]
    assert h.gateway.completed_ids(commit) == [1]

    assert ack(h, ack3, 2)
    assert not future2.done()
    assert ack(h, ack2, 2)
    assert succeeded(future2).checkpoint_id == 2
    assert pending_ids(h) == []
    assert h.gateway.completed_ids(commit) == [1, 2]
    # only the commit set is notified
    for other in (trigger1, trigger2, ack1, ack2, ack3):
        assert h.gateway.completed_ids(other) == []
    assert [c.checkpoint_id for c in h.store.get_all_checkpoints()] == [1, 2]
    assert h.gateway.aborted == []


# ---------------------------------------------------------------------- S39


def test_s39_completed_checkpoint_subsumes_older_pending(tmp_path: Path) -> None:
    trigger1, trigger2 = attempt(10), attempt(11)
    acks = [attempt(20), attempt(21), attempt(22)]
    commit = attempt(30)
    h = make_coordinator(
        make_plan([trigger1, trigger2], acks, [commit]),
        tmp_path=tmp_path,
        max_concurrent=UNLIMITED,
        tolerable_failures=0,
        retention=ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS,
    )
    future1 = h.coordinator.trigger_checkpoint()
    future2 = h.coordinator.trigger_checkpoint()

    cp1_states = [file_state(h.storage, 1, a) for a in acks[:2]]
    for a, state in zip(acks[:2], cp1_states, strict=True):
        assert ack(h, a, 1, state)
    cp2_states = [file_state(h.storage, 2, a) for a in acks]
    for a, state in zip(acks, cp2_states, strict=True):
        assert ack(h, a, 2, state)

    assert succeeded(future2).checkpoint_id == 2
    assert failure_reason(future1) is R.CHECKPOINT_SUBSUMED
    assert pending_ids(h) == []
    assert none_exist(cp1_states)
    assert all_exist(cp2_states)
    assert h.gateway.completed_ids(commit) == [2]
    assert h.gateway.aborted_ids(commit) == [1]
    assert h.job_failures == []  # a subsumed checkpoint is no failure

    # a late ack for checkpoint 1 has its state discarded immediately
    late = file_state(h.storage, 1, acks[2])
    assert all_exist([late])
    assert not ack(h, acks[2], 1, late)
    assert none_exist([late])
    assert all_exist(cp2_states)

    h.coordinator.shutdown(JobStatus.FINISHED)
    assert none_exist(cp2_states)
    assert h.store.number_of_retained_checkpoints == 0


# ---------------------------------------------------------------------- S40


def test_s40_timeout_discards_the_pending_checkpoint(tmp_path: Path) -> None:
    h = make_coordinator(make_plan([A1, A2], [A1, A2]), tmp_path=tmp_path)
    future = h.coordinator.trigger_checkpoint()
    pending = h.coordinator.pending_checkpoints[1]
    state1 = file_state(h.storage, 1, A1)
    assert ack(h, A1, 1, state1)
    assert len(h.timer.pending()) == 1

    assert h.timer.advance(TIMEOUT_MS) == 1  # the canceller fires

    assert pending.disposed
    assert h.coordinator.number_of_pending_checkpoints == 0
    assert h.store.number_of_retained_checkpoints == 0
    assert none_exist([state1])
    assert h.gateway.completed == []
    assert failure_reason(future) is R.CHECKPOINT_EXPIRED
    stats = h.coordinator.stats.get_checkpoint(1)
    assert stats is not None
    assert stats.status == "FAILED"
    assert stats.failure_message is not None
    assert R.CHECKPOINT_EXPIRED.name in stats.failure_message
    assert h.coordinator.stats.counts["failed"] == 1
    assert h.coordinator.stats.counts["completed"] == 0

    # the late ack of the other task: its state is discarded, nothing completes
    late = file_state(h.storage, 1, A2)
    assert not ack(h, A2, 1, late)
    assert none_exist([late])
    assert h.gateway.completed == []


# ---------------------------------------------------------------------- S42


@pytest.mark.parametrize("max_concurrent", [1, 2, 5])
def test_s42_max_concurrent_checkpoints(max_concurrent: int) -> None:
    h = make_coordinator(
        make_plan([A1], [A1]),
        interval_ms=10,
        min_pause_ms=0,
        timeout_ms=TIMEOUT_MS,
        max_concurrent=max_concurrent,
    )
    h.coordinator.start_checkpoint_scheduler()

    h.ticks(max_concurrent)
    assert h.gateway.triggered_ids(A1) == list(range(1, max_concurrent + 1))

    h.ticks(5)  # nothing more while n are pending
    assert h.gateway.triggered_ids(A1) == list(range(1, max_concurrent + 1))

    assert ack(h, A1, 1)
    h.tick()
    assert h.gateway.triggered_ids(A1) == list(range(1, max_concurrent + 2))

    h.ticks(5)
    assert h.gateway.triggered_ids(A1) == list(range(1, max_concurrent + 2))
    assert h.coordinator.number_of_pending_checkpoints == max_concurrent


def test_s42_max_concurrent_with_subsumption() -> None:
    h = make_coordinator(
        make_plan([A1], [A1]), interval_ms=10, min_pause_ms=0, timeout_ms=TIMEOUT_MS, max_concurrent=2
    )
    h.coordinator.start_checkpoint_scheduler()
    h.ticks(2)
    assert pending_ids(h) == [1, 2]

    assert ack(h, A1, 2)  # completes 2 and subsumes 1
    assert [c.checkpoint_id for c in h.store.get_all_checkpoints()] == [2]
    h.ticks(2)
    assert pending_ids(h) == [3, 4]
    assert h.gateway.triggered_ids(A1) == [1, 2, 3, 4]
    h.ticks(3)
    assert h.gateway.triggered_ids(A1) == [1, 2, 3, 4]


# ---------------------------------------------------------------------- S43


def test_s43_periodic_scheduling_waits_for_running_tasks() -> None:
    task_state = {"status": "CREATED"}

    def plan_calculator() -> CheckpointPlan:
        if task_state["status"] != "RUNNING":
            raise CheckpointException(R.NOT_ALL_REQUIRED_TASKS_RUNNING)
        return make_plan([A1], [A1])

    h = make_coordinator(plan_calculator, interval_ms=10, tolerable_failures=0)
    h.coordinator.start_checkpoint_scheduler()
    h.ticks(5)
    assert h.gateway.triggered == []
    assert h.coordinator.number_of_pending_checkpoints == 0
    assert h.job_failures == []

    # a manual trigger says why
    assert failure_reason(h.coordinator.trigger_checkpoint()) is R.NOT_ALL_REQUIRED_TASKS_RUNNING

    task_state["status"] = "RUNNING"
    h.tick()
    assert h.gateway.triggered_ids(A1) == [1]
    assert h.coordinator.number_of_pending_checkpoints == 1


# ---------------------------------------------------------------------- S44


def _assert_ids_and_timestamps(h: Harness, expected_ids: list[int], not_before_ms: int) -> None:
    ids = h.gateway.triggered_ids(A1)
    timestamps = h.gateway.trigger_timestamps(A1)
    assert ids == expected_ids
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert all(a <= b for a, b in itertools.pairwise(timestamps))
    assert all(ts >= not_before_ms for ts in timestamps)


def test_s44_periodic_triggering_stop_and_restart() -> None:
    h = make_coordinator(make_plan([A1], [A1]), interval_ms=10, max_concurrent=UNLIMITED)
    start = h.clock.now_ms()
    assert h.coordinator.is_periodic_checkpointing_configured
    assert not h.coordinator.is_periodic_checkpointing_started

    h.coordinator.job_status_listener(JOB_ID, JobStatus.RUNNING, start, None)
    assert h.coordinator.is_periodic_checkpointing_started
    h.ticks(5)
    _assert_ids_and_timestamps(h, [1, 2, 3, 4, 5], start)

    h.coordinator.job_status_listener(JOB_ID, JobStatus.CANCELLING, h.clock.now_ms(), None)
    assert not h.coordinator.is_periodic_checkpointing_started
    h.ticks(10)
    _assert_ids_and_timestamps(h, [1, 2, 3, 4, 5], start)

    h.coordinator.start_checkpoint_scheduler()
    h.ticks(3)
    _assert_ids_and_timestamps(h, [1, 2, 3, 4, 5, 6, 7, 8], start)

    h.coordinator.stop_checkpoint_scheduler()
    h.ticks(10)
    _assert_ids_and_timestamps(h, [1, 2, 3, 4, 5, 6, 7, 8], start)

    h.coordinator.job_status_listener(JOB_ID, JobStatus.RUNNING, h.clock.now_ms(), None)
    h.ticks(2)
    _assert_ids_and_timestamps(h, list(range(1, 11)), start)


# ---------------------------------------------------------------------- S45


def _first_trigger_time_after(h: Harness, count_before: int, limit_ms: int) -> int:
    """Advance 1 ms at a time until trigger number ``count_before + 1`` happens; its time."""
    for _ in range(limit_ms):
        if len(h.gateway.triggered) > count_before:
            break
        h.timer.advance(1)
    assert len(h.gateway.triggered) > count_before, f"no checkpoint triggered in {limit_ms} ms"
    return h.gateway.triggered[count_before][2]


def test_s45_min_pause_is_measured_from_completion() -> None:
    """interval 12 ms < min pause 50 ms (Flink then schedules at the min pause)."""
    h = make_coordinator(
        make_plan([A1], [A1]), interval_ms=12, min_pause_ms=50, max_concurrent=1, rng=random.Random(45)
    )
    h.coordinator.start_checkpoint_scheduler()
    _first_trigger_time_after(h, 0, limit_ms=1_000)
    assert h.gateway.triggered_ids(A1) == [1]
    h.timer.advance(100)  # cp1 is slow; ticks meanwhile do not trigger
    assert h.gateway.triggered_ids(A1) == [1]

    completion = h.clock.now_ms()
    assert ack(h, A1, 1)
    assert h.store.get_latest_checkpoint() is not None

    triggered_at = _first_trigger_time_after(h, 1, limit_ms=1_000)
    assert h.gateway.triggered_ids(A1) == [1, 2]
    assert triggered_at >= completion + 50


def test_s45_min_pause_holds_when_completion_subsumes_an_older_pending() -> None:
    """Same rule when the completing checkpoint aborts an older pending one on the way."""
    h = make_coordinator(
        make_plan([A1], [A1]), interval_ms=60, min_pause_ms=50, max_concurrent=2, rng=random.Random(45)
    )
    h.coordinator.start_checkpoint_scheduler()
    _first_trigger_time_after(h, 1, limit_ms=1_000)
    h.timer.advance(60)  # a third tick waits in the queue
    assert pending_ids(h) == [1, 2]

    completion = h.clock.now_ms()
    assert ack(h, A1, 2)  # completes 2, subsumes 1
    assert [c.checkpoint_id for c in h.store.get_all_checkpoints()] == [2]

    triggered_at = _first_trigger_time_after(h, 2, limit_ms=1_000)
    assert h.gateway.triggered_ids(A1) == [1, 2, 3]
    assert triggered_at >= completion + 50


def _complete_at(h: Harness, checkpoint_id: int) -> int:
    """Complete a manual checkpoint now; its completion time."""
    future = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, checkpoint_id)
    assert succeeded(future).checkpoint_id == checkpoint_id
    return h.clock.now_ms()


def test_s45_a_manual_trigger_waits_in_the_queue_until_the_min_pause_ends() -> None:
    h = make_coordinator(make_plan([A1], [A1]), min_pause_ms=1_000)
    completion = _complete_at(h, 1)
    h.timer.advance(100)

    manual = h.coordinator.trigger_checkpoint()

    assert h.gateway.triggered_ids(A1) == [1] and not manual.done()  # queued, not refused
    h.timer.advance(899)
    assert h.gateway.triggered_ids(A1) == [1] and pending_ids(h) == []
    h.timer.advance(1)  # the pause ends: a timer runs the queue
    assert h.gateway.triggered_ids(A1) == [1, 2]
    assert h.gateway.trigger_timestamps(A1)[1] == completion + 1_000
    assert ack(h, A1, 2)
    assert succeeded(manual).checkpoint_id == 2


def test_s45_a_savepoint_is_not_delayed_by_the_min_pause_and_overtakes_a_waiting_request() -> None:
    h = make_coordinator(make_plan([A1], [A1]), min_pause_ms=1_000)
    _complete_at(h, 1)
    manual = h.coordinator.trigger_checkpoint()
    savepoint = h.coordinator.trigger_checkpoint(props=CheckpointProperties.for_savepoint())

    assert h.gateway.triggered_ids(A1) == [1, 2]  # the savepoint, at once
    assert h.gateway.triggered[-1][3].checkpoint_type is CheckpointType.SAVEPOINT
    h.timer.advance(500)
    assert ack(h, A1, 2)
    assert succeeded(savepoint).props.is_savepoint
    # the manual request still waits: the pause now counts from the savepoint's completion
    h.timer.advance(999)
    assert h.gateway.triggered_ids(A1) == [1, 2] and not manual.done()
    h.timer.advance(1)
    assert ack(h, A1, 3)
    assert succeeded(manual).checkpoint_id == 3


def test_s45_periodic_requests_are_still_dropped_and_rescheduled_within_the_min_pause() -> None:
    h = make_coordinator(make_plan([A1], [A1]), interval_ms=100, min_pause_ms=1_000)
    h.coordinator.start_checkpoint_scheduler()
    completion = _complete_at(h, 1)
    periodic = h.coordinator.trigger_checkpoint(is_periodic=True)
    assert failure_reason(periodic) is R.MINIMUM_TIME_BETWEEN_CHECKPOINTS
    assert _first_trigger_time_after(h, 1, limit_ms=2_000) == completion + 1_000


def test_s42_a_savepoint_is_not_stuck_behind_a_periodic_request_waiting_for_a_slot() -> None:
    h = make_coordinator(make_plan([A1], [A1]), interval_ms=10, max_concurrent=1)
    h.coordinator.start_checkpoint_scheduler()
    h.tick()
    h.tick()  # checkpoint 1 is pending; the next periodic request waits for its slot
    assert pending_ids(h) == [1]

    savepoint = h.coordinator.trigger_checkpoint(props=CheckpointProperties.for_savepoint())

    assert pending_ids(h) == [1, 2]  # forced: triggered at once, past the queued request
    assert ack(h, A1, 2)
    assert succeeded(savepoint).props.is_savepoint


@pytest.mark.parametrize("end", ["shutdown", "failover"])
def test_s45_a_request_waiting_for_the_min_pause_fails_when_the_coordinator_stops(end: str) -> None:
    h = make_coordinator(make_plan([A1], [A1]), min_pause_ms=1_000)
    _complete_at(h, 1)
    manual = h.coordinator.trigger_checkpoint()
    if end == "shutdown":
        h.coordinator.shutdown(JobStatus.CANCELED)
        assert failure_reason(manual) is R.CHECKPOINT_COORDINATOR_SHUTDOWN
    else:
        h.coordinator.abort_pending_checkpoints(R.JOB_FAILOVER_REGION)
        assert failure_reason(manual) is R.JOB_FAILOVER_REGION
    assert h.timer.pending() == []  # no wake-up left behind
    h.timer.advance(5_000)
    assert h.gateway.triggered_ids(A1) == [1]


# ---------------------------------------------------------------------- S46


def test_s46_periodic_trigger_after_scheduler_stop_fails_but_manual_works() -> None:
    h = make_coordinator(make_plan([A1], [A1]), interval_ms=10, tolerable_failures=0)
    h.coordinator.start_checkpoint_scheduler()
    h.coordinator.stop_checkpoint_scheduler()

    periodic = h.coordinator.trigger_checkpoint(is_periodic=True)
    assert failure_reason(periodic) is R.PERIODIC_SCHEDULER_SHUTDOWN
    assert h.gateway.triggered == []

    manual = h.coordinator.trigger_checkpoint(is_periodic=False)
    assert h.gateway.triggered_ids(A1) == [1]
    assert ack(h, A1, 1)
    assert succeeded(manual).checkpoint_id == 1
    assert h.job_failures == []


def test_s46_trigger_while_coordinator_shuts_down() -> None:
    h = make_coordinator(make_plan([A1], [A1]), interval_ms=10)
    h.coordinator.start_checkpoint_scheduler()
    in_flight = h.coordinator.trigger_checkpoint()
    assert h.coordinator.number_of_pending_checkpoints == 1

    h.coordinator.shutdown(JobStatus.CANCELED)

    assert failure_reason(in_flight) is R.CHECKPOINT_COORDINATOR_SHUTDOWN
    assert failure_reason(h.coordinator.trigger_checkpoint()) is R.CHECKPOINT_COORDINATOR_SHUTDOWN
    assert failure_reason(h.coordinator.trigger_checkpoint(is_periodic=True)) is (
        R.CHECKPOINT_COORDINATOR_SHUTDOWN
    )
    h.ticks(5)
    assert h.gateway.triggered_ids(A1) == [1]
    assert h.timer.pending() == []


def test_s46_second_trigger_while_triggering_is_queued_and_runs_afterwards() -> None:
    hook = ControlledHook()
    h = make_coordinator(make_plan([A1], [A1]), interval_ms=10**9, max_concurrent=2, master_hooks=[hook])
    h.coordinator.start_checkpoint_scheduler()

    first = h.coordinator.trigger_checkpoint(is_periodic=True)
    assert list(hook.futures) == [1]
    assert h.coordinator.pending_checkpoints[1].triggering
    second = h.coordinator.trigger_checkpoint(is_periodic=False)
    # queued: not started while the first is triggering
    assert list(hook.futures) == [1]
    assert pending_ids(h) == [1]
    assert h.gateway.triggered == []

    hook.futures[1].set_result(b"master-1")
    h.timer.run_due()
    assert h.gateway.triggered_ids(A1) == [1]
    assert list(hook.futures) == [1, 2]  # the queued request runs now
    hook.futures[2].set_result(b"master-2")
    h.timer.run_due()
    assert h.gateway.triggered_ids(A1) == [1, 2]

    assert ack(h, A1, 1)
    assert ack(h, A1, 2)
    assert succeeded(first).master_states == [MasterState("hook", b"master-1")]
    assert succeeded(second).master_states == [MasterState("hook", b"master-2")]


def test_s46_id_counter_failure_fails_the_trigger() -> None:
    h = make_coordinator(make_plan([A1], [A1]), tolerable_failures=0, id_counter=FlakyIDCounter([1]))
    failed = h.coordinator.trigger_checkpoint()
    assert failure_reason(failed) is R.TRIGGER_CHECKPOINT_FAILURE
    assert h.coordinator.number_of_pending_checkpoints == 0
    assert h.gateway.triggered == []

    ok = h.coordinator.trigger_checkpoint()
    assert h.gateway.triggered_ids(A1) == [1]
    assert ack(h, A1, 1)
    assert succeeded(ok).checkpoint_id == 1
    assert h.job_failures == []


def test_s46_queued_requests_still_run_after_an_id_counter_failure() -> None:
    hook = ControlledHook()
    h = make_coordinator(
        make_plan([A1], [A1]),
        max_concurrent=UNLIMITED,
        tolerable_failures=0,
        master_hooks=[hook],
        id_counter=FlakyIDCounter([2]),
    )
    first = h.coordinator.trigger_checkpoint()
    second = h.coordinator.trigger_checkpoint()  # queued; its id will fail
    third = h.coordinator.trigger_checkpoint()  # queued
    assert list(hook.futures) == [1]

    hook.futures[1].set_result(None)
    h.timer.run_due()
    assert failure_reason(second) is R.TRIGGER_CHECKPOINT_FAILURE
    assert list(hook.futures) == [1, 2]
    hook.futures[2].set_result(None)
    h.timer.run_due()
    assert h.gateway.triggered_ids(A1) == [1, 2]

    assert ack(h, A1, 1)
    assert ack(h, A1, 2)
    assert succeeded(first).checkpoint_id == 1
    assert succeeded(third).checkpoint_id == 2
    assert h.job_failures == []


def test_s46_master_hook_that_never_completes_expires_before_tasks_are_asked() -> None:
    hook = ControlledHook()
    h = make_coordinator(make_plan([A1], [A1]), max_concurrent=2, master_hooks=[hook])
    first = h.coordinator.trigger_checkpoint()
    queued = h.coordinator.trigger_checkpoint()
    assert list(hook.futures) == [1]

    h.timer.advance(TIMEOUT_MS)

    assert failure_reason(first) is R.CHECKPOINT_EXPIRED
    assert h.gateway.triggered == []
    stats = h.coordinator.stats.get_checkpoint(1)
    assert stats is not None
    assert stats.status == "FAILED"
    # the coordinator is no longer "triggering": the queued request runs
    assert list(hook.futures) == [1, 2]
    assert pending_ids(h) == [2]

    # the hook of the expired checkpoint answers late: still no task is asked for it
    hook.futures[1].set_result(b"late")
    h.timer.run_due()
    assert h.gateway.triggered == []

    hook.futures[2].set_result(b"ok")
    h.timer.run_due()
    assert h.gateway.triggered_ids(A1) == [2]
    assert ack(h, A1, 2)
    assert succeeded(queued).checkpoint_id == 2


@pytest.mark.parametrize("raising", [False, True], ids=["failed-future", "raises"])
def test_s46_master_hook_failure_fails_the_trigger(raising: bool) -> None:
    hook = RaisingHook() if raising else ControlledHook()
    h = make_coordinator(make_plan([A1], [A1]), master_hooks=[hook], tolerable_failures=0)
    future = h.coordinator.trigger_checkpoint()
    if not raising:
        hook.futures[1].set_exception(RuntimeError("hook failed"))
    h.timer.run_due()

    assert failure_reason(future) is R.TRIGGER_CHECKPOINT_FAILURE
    assert h.gateway.triggered == []
    assert h.coordinator.number_of_pending_checkpoints == 0
    assert h.job_failures == []  # trigger failures are not counted (as in Flink)


# ---------------------------------------------------------------------- failure manager


def _expire_one(h: Harness) -> None:
    future = h.coordinator.trigger_checkpoint()
    h.timer.advance(TIMEOUT_MS)
    assert failure_reason(future) is R.CHECKPOINT_EXPIRED


def _complete_one(h: Harness) -> None:
    future = h.coordinator.trigger_checkpoint()
    checkpoint_id = max(h.coordinator.pending_checkpoints)
    assert ack(h, A1, checkpoint_id)
    succeeded(future)


def test_failure_manager_one_timeout_is_tolerated_the_second_fails_the_job() -> None:
    h = make_coordinator(make_plan([A1], [A1]), tolerable_failures=1)
    _expire_one(h)
    assert h.job_failures == []
    _expire_one(h)
    assert len(h.job_failures) == 1
    assert isinstance(h.job_failures[0], CheckpointToleranceExceeded)
    assert h.job_failures[0].last.reason is R.CHECKPOINT_EXPIRED


def test_failure_manager_success_resets_the_count() -> None:
    h = make_coordinator(make_plan([A1], [A1]), tolerable_failures=1)
    _expire_one(h)
    _complete_one(h)
    _expire_one(h)
    assert h.job_failures == []
    _expire_one(h)
    assert len(h.job_failures) == 1


def test_failure_manager_tolerable_zero_fails_on_first_timeout() -> None:
    h = make_coordinator(make_plan([A1], [A1]), tolerable_failures=0)
    _expire_one(h)
    assert len(h.job_failures) == 1


@pytest.mark.parametrize("reason", [R.CHECKPOINT_DECLINED, R.CHECKPOINT_ASYNC_EXCEPTION])
def test_failure_manager_counts_declines_and_async_failures(reason: CheckpointFailureReason) -> None:
    h = make_coordinator(make_plan([A1], [A1]), tolerable_failures=1)
    first = h.coordinator.trigger_checkpoint()
    decline(h, A1, 1, reason)
    assert failure_reason(first) is reason
    assert h.job_failures == []
    h.coordinator.trigger_checkpoint()
    decline(h, A1, 2, reason)
    assert len(h.job_failures) == 1


def test_failure_manager_mixed_counted_failures_add_up() -> None:
    h = make_coordinator(make_plan([A1], [A1]), tolerable_failures=2)
    _expire_one(h)
    h.coordinator.trigger_checkpoint()
    decline(h, A1, 2, R.CHECKPOINT_DECLINED)
    assert h.job_failures == []
    h.coordinator.trigger_checkpoint()
    decline(h, A1, 3, R.CHECKPOINT_ASYNC_EXCEPTION)
    assert len(h.job_failures) == 1


def test_failure_manager_ignores_cancellation_barrier_declines() -> None:
    h = make_coordinator(make_plan([A1], [A1]), tolerable_failures=0)
    for checkpoint_id in (1, 2, 3):
        future = h.coordinator.trigger_checkpoint()
        decline(h, A1, checkpoint_id, R.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)
        assert failure_reason(future) is R.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER
    assert h.job_failures == []
    assert h.coordinator.failure_manager.continuous_failure_counter == 0


def test_failure_manager_ignores_subsumed_checkpoints() -> None:
    h = make_coordinator(make_plan([A1], [A1]), tolerable_failures=0, max_concurrent=UNLIMITED)
    futures = [h.coordinator.trigger_checkpoint() for _ in range(4)]
    assert ack(h, A1, 4)  # subsumes 1, 2, 3
    assert [failure_reason(f) for f in futures[:3]] == [R.CHECKPOINT_SUBSUMED] * 3
    assert h.job_failures == []
    assert h.coordinator.failure_manager.continuous_failure_counter == 0


@pytest.mark.parametrize(
    ("reason", "counted"),
    [
        (R.CHECKPOINT_DECLINED, True),
        (R.CHECKPOINT_EXPIRED, True),
        (R.CHECKPOINT_ASYNC_EXCEPTION, True),
        (R.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER, False),
        (R.CHECKPOINT_SUBSUMED, False),
        # Flink's choice: a store or _metadata failure counts; a trigger that raised or
        # could not be delivered does not (the JobMaster fails a lost slot over itself)
        (R.FINALIZE_CHECKPOINT_FAILURE, True),
        (R.TRIGGER_CHECKPOINT_FAILURE, False),
        (R.TASK_CHECKPOINT_FAILURE, False),
    ],
)
def test_failure_manager_unit(reason: CheckpointFailureReason, counted: bool) -> None:
    failures: list[BaseException] = []
    manager = CheckpointFailureManager(1, failures.append)
    manager.handle_checkpoint_exception(CheckpointException(reason), 1)
    assert manager.continuous_failure_counter == (1 if counted else 0)
    assert failures == []
    manager.handle_checkpoint_exception(CheckpointException(reason), 2)
    assert len(failures) == (1 if counted else 0)
    # the same checkpoint is counted once
    manager.handle_checkpoint_exception(CheckpointException(reason), 2)
    assert len(failures) == (1 if counted else 0)
    manager.handle_checkpoint_success(3)
    assert manager.continuous_failure_counter == 0


def test_aborting_for_a_failover_does_not_trigger_a_queued_request() -> None:
    """Regression: a queued periodic request used the slot freed by the failover's abort,
    triggering the tasks being cancelled; that checkpoint expired after the restart and
    failed the job over again, forever."""
    source = attempt(1)
    h = make_coordinator(make_plan([source], [source]), interval_ms=10, max_concurrent=1)
    h.coordinator.start_checkpoint_scheduler()
    h.tick()
    assert len(h.coordinator.pending_checkpoints) == 1
    h.tick()  # a periodic request waits in the queue (max concurrent 1)
    triggered_before = len(h.gateway.triggered)
    h.coordinator.stop_checkpoint_scheduler()  # the job left RUNNING
    h.coordinator.abort_pending_checkpoints(R.JOB_FAILOVER_REGION)
    assert h.coordinator.pending_checkpoints == {}
    assert len(h.gateway.triggered) == triggered_before  # nothing new was triggered


# ---------------------------------------------------------------------- thread confinement


def _from_another_thread(action: Callable[[], object]) -> BaseException | None:
    """Run ``action`` on a fresh thread; the exception it raised, if any."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rpc-intruder") as pool:
        return pool.submit(action).exception()


def test_a_bound_main_thread_checker_makes_calls_from_other_threads_fail_loudly() -> None:
    checker = MainThreadChecker("CheckpointCoordinator")
    checker.bind_to_current_thread()
    h = make_coordinator(make_plan([A1], [A1]), interval_ms=10, main_thread=checker)
    c = h.coordinator
    future = c.trigger_checkpoint()  # the owner's thread: accepted
    entry_points: list[Callable[[], object]] = [
        c.trigger_checkpoint,
        lambda: ack(h, A1, 1),
        lambda: decline(h, A1, 1),
        lambda: c.abort_pending_checkpoints(R.JOB_FAILOVER_REGION),
        c.restore_latest_checkpointed_state,
        lambda: c.restore_from(7, [], is_savepoint=False, external_pointer=None),
        lambda: c.shutdown(JobStatus.CANCELED),
        lambda: c.job_status_listener(JOB_ID, JobStatus.RUNNING, 0, None),
        c.start_checkpoint_scheduler,
        c.stop_checkpoint_scheduler,
    ]
    for action in entry_points:
        error = _from_another_thread(action)
        assert isinstance(error, WrongThreadError), action
        assert "rpc-intruder" in str(error)
    # none of the refused calls changed anything
    assert pending_ids(h) == [1] and not future.done() and not c.shutdown_called
    assert not c.is_periodic_checkpointing_started
    # a timer action run by a thread other than the owner's is refused too
    c.start_checkpoint_scheduler()
    assert isinstance(_from_another_thread(h.tick), WrongThreadError)
    assert isinstance(_from_another_thread(lambda: h.timer.advance(TIMEOUT_MS)), WrongThreadError)
    # and on the owner's thread everything still works
    assert ack(h, A1, 1)
    assert succeeded(future).checkpoint_id == 1


def test_an_unbound_main_thread_checker_accepts_any_thread() -> None:
    h = make_coordinator(make_plan([A1], [A1]))
    future: list[Future[CompletedCheckpoint]] = []
    assert _from_another_thread(lambda: future.append(h.coordinator.trigger_checkpoint())) is None
    assert _from_another_thread(lambda: ack(h, A1, 1)) is None
    assert succeeded(future[0]).checkpoint_id == 1


# ---------------------------------------------------------------------- tidying at the end


@pytest.mark.parametrize(
    ("retention", "status", "kept"),
    [
        (ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS, JobStatus.FINISHED, []),
        (ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION, JobStatus.CANCELED, [3]),
    ],
)
def test_a_late_state_file_of_an_aborted_checkpoint_is_deleted_when_the_job_ends(
    tmp_path: Path, retention: ExternalizedCheckpointRetention, status: JobStatus, kept: list[int]
) -> None:
    # A cancelled attempt (or one whose slot process was killed) may write its state file
    # after its checkpoint was aborted and its directory deleted; no ack ever discards it.
    # The chaos suite found such files left behind by finished jobs.
    h = make_coordinator(make_plan([A1, A2], [A1, A2]), tmp_path=tmp_path, retention=retention)
    restored = h.storage.checkpoint_dir(1)  # the checkpoint this job was restored from
    os.makedirs(restored)
    open(os.path.join(restored, METADATA_FILE_NAME), "wb").close()
    h.coordinator.restore_from(1, [], is_savepoint=False, external_pointer=restored)

    h.coordinator.trigger_checkpoint()  # checkpoint 2: declined, its directory deleted
    decline(h, A2, 2)
    late = file_state(h.storage, 2, A1)  # ...and then a late write lands in it
    assert all_exist([late])
    future = h.coordinator.trigger_checkpoint()  # checkpoint 3 completes
    assert ack(h, A1, 3, file_state(h.storage, 3, A1)) and ack(h, A2, 3, file_state(h.storage, 3, A2))
    succeeded(future)

    h.coordinator.shutdown(status)

    assert none_exist([late])
    assert h.storage.checkpoint_ids_on_disk() == [1, *kept]  # the restored one is never touched


# ---------------------------------------------------------------------- alignment (issue 16)


def alignments(h: Harness) -> list[tuple[AlignmentType, int | None]]:
    return [(o.alignment, o.aligned_checkpoint_timeout_ms) for a, _, _, o in h.gateway.triggered if a == A1]


@pytest.mark.parametrize(
    ("exactly_once", "unaligned", "timeout_ms", "checkpoint", "savepoint"),
    [
        (True, False, 0, (AlignmentType.ALIGNED, None), (AlignmentType.ALIGNED, None)),
        (True, False, 5_000, (AlignmentType.ALIGNED, None), (AlignmentType.ALIGNED, None)),
        (True, True, 0, (AlignmentType.UNALIGNED, None), (AlignmentType.FORCED_ALIGNED, None)),
        (True, True, 5_000, (AlignmentType.ALIGNED, 5_000), (AlignmentType.FORCED_ALIGNED, None)),
        (False, False, 0, (AlignmentType.AT_LEAST_ONCE, None), (AlignmentType.AT_LEAST_ONCE, None)),
    ],
    ids=["aligned", "aligned-timeout-ignored", "unaligned", "aligned-with-timeout", "at-least-once"],
)
def test_every_barrier_carries_the_alignment_of_its_checkpoint(
    exactly_once: bool,
    unaligned: bool,
    timeout_ms: int,
    checkpoint: tuple[AlignmentType, int | None],
    savepoint: tuple[AlignmentType, int | None],
) -> None:
    """Flink's ``CheckpointOptions.forConfig``: savepoints are always aligned."""
    h = make_coordinator(
        make_plan([A1], [A1]),
        interval_ms=100,
        exactly_once=exactly_once,
        unaligned=unaligned,
        aligned_checkpoint_timeout_ms=timeout_ms,
    )
    h.coordinator.start_checkpoint_scheduler()
    h.tick()
    assert ack(h, A1, 1)
    stop = h.coordinator.trigger_checkpoint(props=CheckpointProperties.for_savepoint())
    assert ack(h, A1, 2)
    assert succeeded(stop).props.is_savepoint
    h.tick()
    assert alignments(h) == [checkpoint, savepoint, checkpoint]
    options = [o for _, _, _, o in h.gateway.triggered]
    unaligned_checkpoint = checkpoint[0] is AlignmentType.UNALIGNED
    assert [o.is_unaligned for o in options] == [unaligned_checkpoint, False, unaligned_checkpoint]
    assert not options[1].is_priority  # a savepoint's barrier never overtakes


@pytest.mark.parametrize(
    ("exactly_once", "max_concurrent", "message"),
    [
        (
            False,
            1,
            "execution.checkpointing.unaligned.enabled is true but execution.checkpointing.mode is "
            "AT_LEAST_ONCE: unaligned checkpoints need EXACTLY_ONCE",
        ),
        (
            True,
            2,
            "execution.checkpointing.unaligned.enabled is true but "
            "execution.checkpointing.max-concurrent-checkpoints is 2: unaligned checkpoints run one at a "
            "time",
        ),
    ],
)
def test_unaligned_checkpoints_refuse_settings_they_cannot_work_with(
    exactly_once: bool, max_concurrent: int, message: str
) -> None:
    with pytest.raises(ConfigurationError) as error:
        make_coordinator(
            make_plan([A1], [A1]),
            exactly_once=exactly_once,
            max_concurrent=max_concurrent,
            unaligned=True,
            interval_ms=1_000,
        )
    assert message in str(error.value)
    assert "disable unaligned checkpoints" in str(error.value)
    # the same settings without unaligned checkpoints are fine
    make_coordinator(
        make_plan([A1], [A1]), exactly_once=exactly_once, max_concurrent=max_concurrent, interval_ms=1_000
    )
    # and so are they without periodic checkpoints: savepoints are aligned whatever the settings
    make_coordinator(
        make_plan([A1], [A1]), exactly_once=exactly_once, max_concurrent=max_concurrent, unaligned=True
    )


def test_a_negative_aligned_checkpoint_timeout_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="aligned-checkpoint-timeout': -1 ms"):
        make_coordinator(make_plan([A1], [A1]), unaligned=True, aligned_checkpoint_timeout_ms=-1)


def ack_with(
    h: Harness, attempt_id: ExecutionAttemptID, checkpoint_id: int, metrics: CheckpointMetrics
) -> bool:
    return h.coordinator.receive_acknowledge_message(
        AcknowledgeCheckpoint(JOB_ID, attempt_id, checkpoint_id, metrics, None)
    )


def test_statistics_report_persisted_in_flight_data_and_unaligned_checkpoints() -> None:
    """Flink's shapes: ``alignment.persisted`` per subtask, ``persisted_data`` per vertex, per
    checkpoint and in the summary; a checkpoint with any unaligned subtask is an
    UNALIGNED_CHECKPOINT (an aligned one, and every savepoint, keeps its type)."""
    h = make_coordinator(make_plan([A1], [A1, A2, A3]), unaligned=True, aligned_checkpoint_timeout_ms=50)
    # checkpoint 1: the source (no inputs) and A2 stayed aligned, A3 timed out and persisted 300 bytes
    h.coordinator.trigger_checkpoint()
    assert ack_with(h, A1, 1, CheckpointMetrics())
    assert ack_with(h, A2, 1, CheckpointMetrics(bytes_processed_during_alignment=40))
    assert ack_with(h, A3, 1, CheckpointMetrics(unaligned=True, bytes_persisted_during_alignment=300))
    # checkpoint 2: aligned everywhere
    h.coordinator.trigger_checkpoint()
    for a in (A1, A2, A3):
        assert ack_with(h, a, 2, CheckpointMetrics())
    # checkpoint 3: unaligned at two subtasks
    h.coordinator.trigger_checkpoint()
    assert ack_with(h, A1, 3, CheckpointMetrics(unaligned=True))
    assert ack_with(h, A2, 3, CheckpointMetrics(unaligned=True, bytes_persisted_during_alignment=100))
    assert ack_with(h, A3, 3, CheckpointMetrics(unaligned=True, bytes_persisted_during_alignment=20))

    body = h.coordinator.stats.to_json()
    history = {c["id"]: c for c in body["history"]}
    assert [history[i]["checkpoint_type"] for i in (1, 2, 3)] == [
        "UNALIGNED_CHECKPOINT",
        "CHECKPOINT",
        "UNALIGNED_CHECKPOINT",
    ]
    assert [history[i]["is_unaligned"] for i in (1, 2, 3)] == [True, False, True]
    assert [history[i]["persisted_data"] for i in (1, 2, 3)] == [300, 0, 120]
    assert history[1]["processed_data"] == 40
    persisted = body["summary"]["persisted_data"]
    assert (persisted["min"], persisted["max"], persisted["avg"]) == (0, 300, 140)

    first = h.coordinator.stats.get_checkpoint(1)
    assert first is not None
    task = first.task_json(A3.vertex_id)
    (subtask,) = task["subtasks"]
    assert subtask["alignment"]["persisted"] == 300 and subtask["unaligned_checkpoint"] is True
    assert task["persisted_data"] == 300 and task["alignment_buffered"] == 0
    assert first.task_json(A2.vertex_id)["processed_data"] == 40


def test_a_savepoint_keeps_its_type_in_the_statistics() -> None:
    h = make_coordinator(make_plan([A1], [A1]), unaligned=True)
    h.coordinator.trigger_checkpoint(props=CheckpointProperties.for_savepoint())
    assert ack_with(h, A1, 1, CheckpointMetrics())
    (entry,) = h.coordinator.stats.to_json()["history"]
    assert entry["checkpoint_type"] == "SAVEPOINT" and entry["is_unaligned"] is False


# ---------------------------------------------------------------------- _metadata off the thread


class HeldMetadataWriter:
    """The JobMaster's I/O pool as a test drives it: each ``_metadata`` write waits until the
    test runs it (:meth:`finish`), as a write to a hanging object store waits."""

    def __init__(self) -> None:
        self.held: list[tuple[Callable[[], str | None], Future[str | None]]] = []

    def __call__(self, write: Callable[[], str | None]) -> Future[str | None]:
        future: Future[str | None] = Future()
        self.held.append((write, future))
        return future

    def finish(self) -> None:
        write, future = self.held.pop(0)
        try:
            future.set_result(write())
        except Exception as exc:  # noqa: BLE001 - handed to the coordinator
            future.set_exception(exc)


def test_a_metadata_write_that_hangs_is_aborted_at_the_timeout(tmp_path: Path) -> None:
    """Storage hangs while _metadata is written: the checkpoint still expires on time (the
    write is off the coordinator's thread), and a write that lands after the abort is deleted."""
    writer = HeldMetadataWriter()
    h = make_coordinator(make_plan([A1], [A1]), tmp_path=tmp_path, metadata_writer=writer)
    future = h.coordinator.trigger_checkpoint()
    state = file_state(h.storage, 1, A1)
    assert ack(h, A1, 1, state)
    assert len(writer.held) == 1 and not future.done()  # being written: still pending
    assert h.coordinator.number_of_pending_checkpoints == 1

    h.timer.advance(TIMEOUT_MS)  # the canceller fires while the write hangs

    assert failure_reason(future) is R.CHECKPOINT_EXPIRED
    assert h.coordinator.number_of_pending_checkpoints == 0 and none_exist([state])
    writer.finish()  # the storage comes back: _metadata lands in the deleted chk-1
    assert (tmp_path / JOB_ID / "chk-1" / "_metadata").exists()
    h.timer.run_due()
    assert not (tmp_path / JOB_ID / "chk-1").exists()  # deleted again: no checkpoint there
    assert h.store.number_of_retained_checkpoints == 0 and h.gateway.completed == []


def test_a_checkpoint_completes_once_its_metadata_write_returns(tmp_path: Path) -> None:
    writer = HeldMetadataWriter()
    h = make_coordinator(make_plan([A1], [A1]), tmp_path=tmp_path, metadata_writer=writer)
    future = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 1, file_state(h.storage, 1, A1))
    assert h.gateway.completed == []  # nothing commits before _metadata is durable
    writer.finish()
    assert not future.done()  # the continuation runs on the coordinator's thread
    h.timer.run_due()
    completed = succeeded(future)
    assert completed.external_pointer == str(tmp_path / JOB_ID / "chk-1")
    assert h.gateway.completed_ids(A1) == [1]


def test_a_failed_metadata_write_fails_the_checkpoint_not_the_job(tmp_path: Path) -> None:
    writer = HeldMetadataWriter()
    h = make_coordinator(make_plan([A1], [A1]), tmp_path=tmp_path, metadata_writer=writer)
    future = h.coordinator.trigger_checkpoint()
    state = file_state(h.storage, 1, A1)
    assert ack(h, A1, 1, state)
    _, held = writer.held.pop(0)
    held.set_exception(OSError("S3 at http://127.0.0.1:1: writing _metadata failed"))
    h.timer.run_due()
    assert failure_reason(future) is R.FINALIZE_CHECKPOINT_FAILURE
    assert none_exist([state]) and h.job_failures == []


def test_a_metadata_write_that_landed_completes_its_checkpoint_at_the_jobs_end(tmp_path: Path) -> None:
    """_metadata is on disk (a client saw it and cancelled the job) but its continuation has
    not run yet: the job's end completes the checkpoint instead of aborting it."""
    writer = HeldMetadataWriter()
    h = make_coordinator(
        make_plan([A1], [A1]),
        tmp_path=tmp_path,
        metadata_writer=writer,
        retention=ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION,
    )
    future = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 1, file_state(h.storage, 1, A1))
    writer.finish()  # landed; the continuation waits in the timer queue
    h.coordinator.finish_finalizing(1.0)
    h.coordinator.shutdown(JobStatus.CANCELED)
    assert succeeded(future).checkpoint_id == 1
    assert (tmp_path / JOB_ID / "chk-1" / METADATA_FILE_NAME).exists()  # retained
    h.timer.run_due()  # the continuation, late: nothing more happens
    assert (tmp_path / JOB_ID / "chk-1" / METADATA_FILE_NAME).exists()
