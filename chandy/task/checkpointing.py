"""SubtaskCheckpointCoordinator: one subtask's part of a checkpoint.

``checkpoint_state`` runs on the task thread, inside the mailbox, between two
batches, so no record is half processed (Flink's ``performCheckpoint``):

0. a checkpoint already known to be aborted only sends a cancel marker on;
1. operators may emit what must precede the barrier;
2. the barrier goes downstream first, so downstream alignment starts early;
3. the synchronous snapshot: user ``snapshot_state`` hooks, copy-on-write
   copies of keyed state, pickled operator state;
4. the asynchronous part is handed to a thread pool: serialize keyed state per
   key group, write the state files, and acknowledge with the handles and the
   metrics. If anything fails there, the checkpoint is declined
   (``CHECKPOINT_ASYNC_EXCEPTION``) and what was written is deleted.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    CheckpointFailureReason,
    CheckpointMetrics,
    CheckpointOptions,
    CheckpointResponder,
    DeclineCheckpoint,
)
from chandy.network.barrier_handler import AlignmentMetrics
from chandy.network.events import CancelCheckpointMarker, CheckpointBarrier
from chandy.state.handles import FileStateHandle, KeyGroupsStateHandle, OperatorStateHandle
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import CheckpointStorage
from chandy.task.deployment import TaskDeploymentDescriptor
from chandy.task.operator_chain import OperatorChain, OperatorSnapshot
from chandy.task.record_writer import RecordWriter

log = logging.getLogger(__name__)

_REMEMBERED_ABORTS = 64


class SubtaskCheckpointCoordinator:
    """Takes, writes, acknowledges or declines this subtask's checkpoints."""

    def __init__(self, tdd: TaskDeploymentDescriptor, chain: OperatorChain,
                 writers: Sequence[RecordWriter], responder: CheckpointResponder | None,
                 storage: CheckpointStorage | None, async_executor: Executor | None,
                 is_cancelled: Callable[[], bool]) -> None:
        self.tdd = tdd
        self.chain = chain
        self.writers = writers
        self.responder = responder
        self.storage = storage or CheckpointStorage(None, tdd.job_id)
        self.async_executor = async_executor
        self.is_cancelled = is_cancelled
        self._aborted: deque[int] = deque(maxlen=_REMEMBERED_ABORTS)
        self.last_checkpoint_id = -1

    # -- the synchronous part (task thread) --------------------------------

    def checkpoint_state(self, checkpoint_id: int, timestamp: int, options: CheckpointOptions,
                         alignment: AlignmentMetrics) -> None:
        self.last_checkpoint_id = max(self.last_checkpoint_id, checkpoint_id)
        if checkpoint_id in self._aborted:
            self._broadcast(CancelCheckpointMarker(checkpoint_id))
            return
        self.chain.prepare_snapshot_pre_barrier(checkpoint_id)
        self._broadcast(CheckpointBarrier(checkpoint_id, timestamp, options))
        started = time.monotonic_ns()
        try:
            snapshots = self.chain.snapshot_state(checkpoint_id, timestamp)
        except Exception as exc:  # noqa: BLE001 - the checkpoint fails, the task goes on
            log.warning("%s could not snapshot checkpoint %d: %r", self.tdd.name_with_subtask,
                        checkpoint_id, exc)
            self.decline(checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED,
                         f"{type(exc).__name__}: {exc}")
            return
        metrics = CheckpointMetrics(
            bytes_processed_during_alignment=alignment.bytes_processed_during_alignment,
            alignment_duration_ns=alignment.alignment_duration_ns,
            checkpoint_start_delay_ns=alignment.checkpoint_start_delay_ns,
            sync_duration_ms=(time.monotonic_ns() - started) // 1_000_000,
            unaligned=False)
        if self.async_executor is None:
            self._async_part(checkpoint_id, snapshots, metrics)
        else:
            try:
                self.async_executor.submit(self._async_part, checkpoint_id, snapshots, metrics)
            except RuntimeError:  # the executor is shutting down: the job is going away
                for snapshot in snapshots:
                    snapshot.release()

    def abort_checkpoint_on_barrier(self, checkpoint_id: int,
                                    reason: CheckpointFailureReason) -> None:
        """The barrier handler gave up on ``checkpoint_id``: decline, and tell downstream."""
        self.last_checkpoint_id = max(self.last_checkpoint_id, checkpoint_id)
        self.decline(checkpoint_id, reason, "aborted at the input barriers")
        self._broadcast(CancelCheckpointMarker(checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """The coordinator aborted it; if its barrier comes later, only forward a cancel marker."""
        if checkpoint_id > self.last_checkpoint_id:
            self._aborted.append(checkpoint_id)

    def decline(self, checkpoint_id: int, reason: CheckpointFailureReason, message: str) -> None:
        if self.responder is not None:
            self.responder.decline_checkpoint(DeclineCheckpoint(
                self.tdd.job_id, self.tdd.attempt_id, checkpoint_id, reason, message))

    def _broadcast(self, event: CheckpointBarrier | CancelCheckpointMarker) -> None:
        for writer in self.writers:
            writer.broadcast_event(event)

    # -- the asynchronous part (thread pool) -------------------------------

    def _async_part(self, checkpoint_id: int, snapshots: list[OperatorSnapshot],
                    metrics: CheckpointMetrics) -> None:
        started = time.monotonic_ns()
        written: list[FileStateHandle] = []
        storage = self.storage
        try:
            subtask_states: dict[str, OperatorSubtaskState] = {}
            size = 0
            for snapshot in snapshots:
                keyed: tuple[KeyGroupsStateHandle, ...] = ()
                if snapshot.keyed is not None:
                    try:
                        serialized = snapshot.keyed.serialize()
                    finally:
                        snapshot.keyed.release()
                    if serialized.payload:
                        delegate = storage.write_state(checkpoint_id, serialized.payload)
                        if isinstance(delegate, FileStateHandle):
                            written.append(delegate)
                        keyed = (KeyGroupsStateHandle(serialized.key_group_range,
                                                      serialized.ranges, delegate),)
                        size += len(serialized.payload)
                operator: tuple[OperatorStateHandle, ...] = ()
                if snapshot.operator is not None:
                    payload, metas = snapshot.operator
                    delegate = storage.write_state(checkpoint_id, payload)
                    if isinstance(delegate, FileStateHandle):
                        written.append(delegate)
                    operator = (OperatorStateHandle(metas, delegate),)
                    size += len(payload)
                if keyed or operator:
                    subtask_states[snapshot.operator_id] = OperatorSubtaskState(keyed, operator)
            if self.is_cancelled():
                storage.discard_handles(written)
                return
            metrics.async_duration_ms = (time.monotonic_ns() - started) // 1_000_000
            metrics.checkpointed_size = size
            metrics.state_size = size
            if self.responder is not None:
                self.responder.acknowledge_checkpoint(AcknowledgeCheckpoint(
                    self.tdd.job_id, self.tdd.attempt_id, checkpoint_id, metrics,
                    TaskStateSnapshot(subtask_states) if subtask_states else None))
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator as a decline
            for snapshot in snapshots:
                snapshot.release()
            if self.storage.is_persistent:
                storage.discard_handles(written)
            if not self.is_cancelled():
                log.warning("%s: asynchronous part of checkpoint %d failed: %r",
                            self.tdd.name_with_subtask, checkpoint_id, exc)
                self.decline(checkpoint_id, CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION,
                             f"{type(exc).__name__}: {exc}")
