"""PendingCheckpoint: a checkpoint that was triggered and is collecting acknowledgements."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from chandy.checkpoint.completed_checkpoint import CompletedCheckpoint
from chandy.checkpoint.metadata import CheckpointMetadata, MasterState, serialize
from chandy.checkpoint.operator_state import OperatorState
from chandy.checkpoint.properties import CheckpointProperties
from chandy.messages.checkpoint import (
    CheckpointException,
    CheckpointFailureReason,
    CheckpointMetrics,
)
from chandy.messages.ids import ExecutionAttemptID
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import CheckpointStorage
from chandy.util.timer import Cancellable

log = logging.getLogger(__name__)


class TaskAcknowledgeResult(enum.Enum):
    SUCCESS = "SUCCESS"
    DUPLICATE = "DUPLICATE"  # this task acknowledged before
    UNKNOWN = "UNKNOWN"  # not a task of this checkpoint
    DISCARDED = "DISCARDED"  # the checkpoint was already discarded


@dataclass(frozen=True)
class TaskToAck:
    """A subtask whose acknowledgement a checkpoint waits for, and what it reports on."""

    attempt_id: ExecutionAttemptID
    vertex_id: int
    subtask_index: int
    parallelism: int
    max_parallelism: int
    operator_ids: tuple[str, ...]
    #: The operators' ``uid()`` (``None``: unset) and names, parallel to ``operator_ids``;
    #: recorded in ``_metadata`` so a restore error or an inspection can name them.
    operator_uids: tuple[str | None, ...] = ()
    operator_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckpointPlan:
    """Which subtasks to trigger (running sources), wait for and notify (all running), for one
    checkpoint, and which had already finished (recorded as finished, not asked)."""

    tasks_to_trigger: tuple[ExecutionAttemptID, ...]
    tasks_to_wait_for: tuple[TaskToAck, ...]
    tasks_to_commit_to: tuple[ExecutionAttemptID, ...]
    finished_tasks: tuple[TaskToAck, ...] = ()
    #: For each task to wait for that is not triggered, the running tasks whose barriers it
    #: waits for. A task the plan saw running may have ended before the trigger reached it;
    #: it then acknowledges as finished and sends no barrier, so once every upstream task of
    #: a waiting task did that, the coordinator triggers the waiting task itself (FLIP-147's
    #: plan, decided again as tasks turn out to have finished).
    upstream_of: Mapping[ExecutionAttemptID, tuple[ExecutionAttemptID, ...]] = field(default_factory=dict)


class IllegalCheckpointStateError(RuntimeError):
    """A checkpoint was used in a way its state does not allow (a bug, not a user error)."""


class PendingCheckpoint:
    """Collects the acknowledgements of one checkpoint until it is complete or aborted."""

    def __init__(
        self,
        job_id: str,
        checkpoint_id: int,
        checkpoint_timestamp: int,
        plan: CheckpointPlan,
        master_hook_ids: tuple[str, ...],
        props: CheckpointProperties,
        storage: CheckpointStorage,
        discard: Callable[[TaskStateSnapshot | None], None],
        io_executor: Callable[[Callable[[], object]], object] | None = None,
        *,
        target_location: str | None = None,
    ) -> None:
        self.job_id = job_id
        #: A savepoint's own directory (every file of it goes there); ``None``: ``chk-N``.
        self.target_location = target_location
        self.checkpoint_id = checkpoint_id
        self.checkpoint_timestamp = checkpoint_timestamp
        self.props = props
        self.plan = plan
        self.storage = storage
        self._discard_state = discard
        self._io: Callable[[Callable[[], object]], object] = io_executor or (lambda action: action())
        self.not_yet_acknowledged_tasks: dict[ExecutionAttemptID, TaskToAck] = {
            t.attempt_id: t for t in plan.tasks_to_wait_for
        }
        self.acknowledged_tasks: set[ExecutionAttemptID] = set()
        #: The tasks this checkpoint was sent to: the plan's, then any triggered because
        #: all their upstream tasks acknowledged as finished.
        self.triggered_tasks: set[ExecutionAttemptID] = set(plan.tasks_to_trigger)
        #: Tasks that acknowledged as finished (they had ended): no barrier comes from them.
        self.ended_tasks: set[ExecutionAttemptID] = set()
        self.operator_states: dict[str, OperatorState] = {}
        self.not_yet_acknowledged_master_states: set[str] = set(master_hook_ids)
        self.master_states: list[MasterState] = []
        self.task_metrics: dict[ExecutionAttemptID, CheckpointMetrics] = {}
        self._received: list[TaskStateSnapshot] = []
        self.completion_future: Future[CompletedCheckpoint] = Future()
        self._canceller: Cancellable | None = None
        self.disposed = False
        self.failure_cause: CheckpointException | None = None
        #: True while master hooks run and sources are being triggered.
        self.triggering = True
        #: True while its ``_metadata`` is being written (off the coordinator's thread).
        self.finalizing = False
        for task in plan.finished_tasks:
            for operator_id in task.operator_ids:
                self._operator_state(task, operator_id).put_state(
                    task.subtask_index, OperatorSubtaskState(finished=True)
                )

    # -- acknowledgements ---------------------------------------------------

    @property
    def number_of_non_acknowledged_tasks(self) -> int:
        return len(self.not_yet_acknowledged_tasks)

    @property
    def number_of_acknowledged_tasks(self) -> int:
        return len(self.acknowledged_tasks)

    @property
    def is_fully_acknowledged(self) -> bool:
        return not self.not_yet_acknowledged_tasks and not self.not_yet_acknowledged_master_states

    def acknowledge_task(
        self, attempt_id: ExecutionAttemptID, state: TaskStateSnapshot | None, metrics: CheckpointMetrics
    ) -> TaskAcknowledgeResult:
        if self.disposed:
            return TaskAcknowledgeResult.DISCARDED
        task = self.not_yet_acknowledged_tasks.pop(attempt_id, None)
        if task is None:
            if attempt_id in self.acknowledged_tasks:
                return TaskAcknowledgeResult.DUPLICATE
            return TaskAcknowledgeResult.UNKNOWN
        self.acknowledged_tasks.add(attempt_id)
        self.task_metrics[attempt_id] = metrics
        for operator_id in task.operator_ids:
            operator_state = self._operator_state(task, operator_id)
            subtask_state = None if state is None else state.subtask_states.get(operator_id)
            if subtask_state is not None:  # a stateless subtask contributes nothing
                operator_state.put_state(task.subtask_index, subtask_state)
        if state is not None:
            self._received.append(state)
            if state.is_finished:
                self.ended_tasks.add(attempt_id)
        return TaskAcknowledgeResult.SUCCESS

    def take_tasks_whose_upstream_ended(self) -> list[ExecutionAttemptID]:
        """The waiting tasks that no barrier can reach any more, because every upstream task
        they wait for acknowledged as finished; each is returned once (marked triggered)."""
        ready = [
            attempt_id
            for attempt_id, upstream in self.plan.upstream_of.items()
            if upstream
            and attempt_id not in self.triggered_tasks
            and attempt_id in self.not_yet_acknowledged_tasks
            and all(u in self.ended_tasks for u in upstream)
        ]
        self.triggered_tasks.update(ready)
        return ready

    def _operator_state(self, task: TaskToAck, operator_id: str) -> OperatorState:
        operator_state = self.operator_states.get(operator_id)
        if operator_state is None:
            index = task.operator_ids.index(operator_id)
            operator_state = self.operator_states[operator_id] = OperatorState(
                operator_id,
                task.parallelism,
                task.max_parallelism,
                uid=task.operator_uids[index] if index < len(task.operator_uids) else None,
                name=task.operator_names[index] if index < len(task.operator_names) else None,
            )
        return operator_state

    def acknowledge_master_state(self, identifier: str, state: MasterState | None) -> None:
        """A master hook finished; ``None`` state counts as acknowledged but is not stored."""
        if self.disposed or identifier not in self.not_yet_acknowledged_master_states:
            return
        self.not_yet_acknowledged_master_states.discard(identifier)
        if state is not None:
            self.master_states.append(state)

    # -- lifecycle ----------------------------------------------------------

    def can_be_subsumed(self) -> bool:
        return not self.props.is_savepoint

    def set_canceller_handle(self, handle: Cancellable) -> bool:
        """Remember the timeout canceller; False (and the caller cancels it) if disposed."""
        if self.disposed or self._canceller is not None:
            return False
        self._canceller = handle
        return True

    def finalize_checkpoint(self, completion_timestamp: int) -> CompletedCheckpoint:
        """Write ``_metadata`` (last, atomically) and turn into a CompletedCheckpoint, all on
        the calling thread: :meth:`serialized_metadata`, :meth:`write_metadata`, :meth:`complete`.

        The completion future stays open: the checkpoint is not complete until the
        :class:`CompletedCheckpointStore` holds it, so the coordinator settles the future
        afterwards with :meth:`mark_stored` or :meth:`fail_storing` (as Flink does). If
        writing ``_metadata`` fails, nothing is disposed and the caller aborts.
        """
        data = self.serialized_metadata()
        pointer = None if data is None else self.write_metadata(data)
        return self.complete(pointer, completion_timestamp)

    def serialized_metadata(self) -> bytes | None:
        """``_metadata``'s bytes, signed (``None``: in-memory storage writes none). On the
        coordinator's thread: it reads the acknowledged state, which only that thread changes."""
        if self.disposed:
            raise IllegalCheckpointStateError(f"checkpoint {self.checkpoint_id} is discarded")
        if not self.is_fully_acknowledged:
            raise IllegalCheckpointStateError(f"checkpoint {self.checkpoint_id} is not fully acknowledged")
        if self.target_location is None and not self.storage.is_persistent:
            return None
        base = self.target_location
        if base is None:
            base = self.storage.checkpoint_dir(self.checkpoint_id)
        savepoint_format = self.props.savepoint_format
        metadata = CheckpointMetadata(
            self.checkpoint_id,
            self.job_id,
            self.checkpoint_timestamp,
            self.props.checkpoint_type.value,
            list(self.operator_states.values()),
            list(self.master_states),
            savepoint_format=None if savepoint_format is None else savepoint_format.value,
        )
        return serialize(metadata, self.storage.signing_key(self.target_location), base)

    def write_metadata(self, data: bytes) -> str | None:
        """Write ``_metadata`` into the checkpoint's (or savepoint's) directory; returns the
        external pointer. Storage I/O only, touching nothing else of this object: the
        coordinator runs it on its I/O executor, so a hanging object store never blocks the
        JobMaster's thread (Flink finalizes on its I/O executor too)."""
        return self.storage.write_metadata(self.checkpoint_id, data, self.target_location)

    def complete(self, pointer: str | None, completion_timestamp: int) -> CompletedCheckpoint:
        """The CompletedCheckpoint, once ``_metadata`` is at ``pointer`` (or in memory)."""
        if self.disposed:
            raise IllegalCheckpointStateError(f"checkpoint {self.checkpoint_id} is discarded")
        completed = CompletedCheckpoint(
            job_id=self.job_id,
            checkpoint_id=self.checkpoint_id,
            timestamp=self.checkpoint_timestamp,
            completion_timestamp=completion_timestamp,
            operator_states=dict(self.operator_states),
            master_states=list(self.master_states),
            props=self.props,
            external_pointer=pointer,
            storage=self.storage,
        )
        self._dispose(release_state=False)
        return completed

    def mark_stored(self, completed: CompletedCheckpoint) -> None:
        """The store accepted the finalized checkpoint: only now is it complete for the caller."""
        self.completion_future.set_result(completed)

    def fail_storing(self, exception: CheckpointException) -> None:
        """The store refused the finalized checkpoint: it never completed (its files are
        the coordinator's to discard, as they now belong to the CompletedCheckpoint)."""
        self.failure_cause = exception
        self.completion_future.set_exception(exception)

    def abort(
        self, reason: CheckpointFailureReason, cause: BaseException | str | None = None
    ) -> CheckpointException:
        """Discard the checkpoint and the state it received."""
        if reason is CheckpointFailureReason.CHECKPOINT_SUBSUMED and not self.can_be_subsumed():
            raise IllegalCheckpointStateError(
                f"savepoint {self.checkpoint_id} cannot be subsumed by a checkpoint"
            )
        exception = CheckpointException(reason, cause)
        if self.disposed:
            return exception
        self.failure_cause = exception
        if not self.completion_future.done():
            self.completion_future.set_exception(exception)
        self._dispose(release_state=True)
        return exception

    def _dispose(self, release_state: bool) -> None:
        self.disposed = True
        self.triggering = False
        if self._canceller is not None:
            self._canceller.cancel()
        if release_state:
            received, checkpoint_id, storage = self._received, self.checkpoint_id, self.storage
            location = self.target_location

            def discard() -> None:
                for snapshot in received:
                    self._discard_state(snapshot)
                if location is None:
                    storage.discard_checkpoint(checkpoint_id)
                else:  # a failed savepoint's partial directory goes too: it is not a savepoint
                    storage.discard_checkpoint(checkpoint_id, location)

            self._io(discard)
        self._received = []
        self.not_yet_acknowledged_tasks.clear()

    def __repr__(self) -> str:
        return (
            f"PendingCheckpoint({self.checkpoint_id}, acked={len(self.acknowledged_tasks)}, "
            f"waiting={len(self.not_yet_acknowledged_tasks)})"
        )
