"""SubtaskCheckpointCoordinator: one subtask's part of a checkpoint.

``checkpoint_state`` runs on the task thread, inside the mailbox, between two
batches, so no record is half processed (Flink's ``performCheckpoint``):

0. a checkpoint already known to be aborted only sends a cancel marker on;
1. operators may emit what must precede the barrier;
2. the barrier goes downstream first, so downstream alignment starts early;
3. the synchronous snapshot: user ``snapshot_state`` hooks, copy-on-write
   copies of keyed state, pickled operator state. If this (or step 1) fails, the
   checkpoint is declined and the task fails, as in Flink: the operator's state may
   be half-written, so the job restores the last completed checkpoint;
4. the asynchronous part. Keyed state is serialized key group by key group in
   steps of at most a couple of milliseconds, each a mail of this task, so
   records keep flowing between the steps; then a thread pool writes the state
   files and acknowledges with the handles and the metrics. If anything fails,
   the checkpoint is declined (``CHECKPOINT_ASYNC_EXCEPTION``) and what was
   written is deleted.

Why serialize on the task thread: pickling is CPU work under CPython's
interpreter lock. On a helper thread it gets the lock only in turns with every
busy task thread, and each of its I/O calls waits for the lock again; measured
here, that stretched the serialization of 40 kB of state from 3 ms to 100 ms.
The task thread already holds the lock, and the copy-on-write copies keep the
snapshot exact while it processes records between steps. File writes, which
release the lock, stay on the pool.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager

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
from chandy.state.backend import SnapshotResult
from chandy.state.handles import FileStateHandle, KeyedStateHandle, OperatorStateHandle
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import CheckpointStorage
from chandy.task.deployment import TaskDeploymentDescriptor
from chandy.task.operator_chain import OperatorChain, OperatorSnapshot
from chandy.task.record_writer import RecordWriter

log = logging.getLogger(__name__)

_REMEMBERED_ABORTS = 64
#: Longest a serialization step holds up the task's records.
SERIALIZATION_STEP_NS = 2_000_000

#: ``schedule(action, description, on_drop)``: run ``action`` later on the task thread.
Schedule = Callable[[Callable[[], None], str, Callable[[], None]], None]


class _InFlight:
    """One checkpoint between its synchronous part and its acknowledgement."""

    def __init__(
        self,
        checkpoint_id: int,
        snapshots: list[OperatorSnapshot],
        metrics: CheckpointMetrics,
        target_location: str | None = None,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        #: A savepoint's directory: its state files go there, not into ``chk-N``.
        self.target_location = target_location
        self.snapshots = snapshots
        self.metrics = metrics
        self.started_ns = time.monotonic_ns()
        self.serializers = {i: s.keyed.serializer() for i, s in enumerate(snapshots) if s.keyed is not None}

    def release(self) -> None:
        for snapshot in self.snapshots:
            snapshot.release()


class SubtaskCheckpointCoordinator:
    """Takes, writes, acknowledges or declines this subtask's checkpoints."""

    def __init__(
        self,
        tdd: TaskDeploymentDescriptor,
        chain: OperatorChain,
        writers: Sequence[RecordWriter],
        responder: CheckpointResponder | None,
        storage: CheckpointStorage | None,
        async_executor: Executor | None,
        is_cancelled: Callable[[], bool],
        schedule: Schedule | None = None,
    ) -> None:
        self.tdd = tdd
        self.chain = chain
        self.writers = writers
        self.responder = responder
        self.storage = storage or CheckpointStorage(None, tdd.job_id)
        self.async_executor = async_executor
        self.is_cancelled = is_cancelled
        self._schedule = schedule
        self._aborted: deque[int] = deque(maxlen=_REMEMBERED_ABORTS)
        self.last_checkpoint_id = -1

    # -- the synchronous part (task thread) --------------------------------

    def checkpoint_state(
        self, checkpoint_id: int, timestamp: int, options: CheckpointOptions, alignment: AlignmentMetrics
    ) -> None:
        self.last_checkpoint_id = max(self.last_checkpoint_id, checkpoint_id)
        if checkpoint_id in self._aborted:
            self._broadcast(CancelCheckpointMarker(checkpoint_id))
            return
        with self._synchronous_phase(checkpoint_id):
            self.chain.prepare_snapshot_pre_barrier(checkpoint_id)
        self._broadcast(CheckpointBarrier(checkpoint_id, timestamp, options))
        started = time.monotonic_ns()
        # A savepoint in the CANONICAL format must restore on any state backend; a NATIVE one
        # is in the backend's own format, whatever its checkpoints use.
        savepoint = options.checkpoint_type.is_savepoint
        native = savepoint and options.format_type == "NATIVE"
        with self._synchronous_phase(checkpoint_id):
            snapshots = self.chain.snapshot_state(
                checkpoint_id,
                timestamp,
                canonical=savepoint and not native,
                native=native,
                base_checkpoint_id=options.base_checkpoint_id,
            )
        metrics = CheckpointMetrics(
            bytes_processed_during_alignment=alignment.bytes_processed_during_alignment,
            alignment_duration_ns=alignment.alignment_duration_ns,
            checkpoint_start_delay_ns=alignment.checkpoint_start_delay_ns,
            sync_duration_ms=(time.monotonic_ns() - started) // 1_000_000,
            unaligned=False,
        )
        self._serialize_step(_InFlight(checkpoint_id, snapshots, metrics, options.target_location))

    @contextmanager
    def _synchronous_phase(self, checkpoint_id: int) -> Iterator[None]:
        """A failure here fails the task, as in Flink: an operator's ``snapshot_state`` (or a
        sink writer's ``prepare_commit``) stopped half way, so its state may be half-written
        and the task cannot go on from it. The checkpoint is declined at once (the
        coordinator need not wait for its timeout) and the exception propagates to the task,
        which fails; the JobMaster then restores the last completed checkpoint."""
        try:
            yield
        except Exception as exc:
            if self.is_cancelled():
                log.info(
                    "%s: checkpoint %d stopped by the task's cancellation: %r",
                    self.tdd.name_with_subtask,
                    checkpoint_id,
                    exc,
                )
                raise
            log.warning(
                "%s: the synchronous part of checkpoint %d failed, so the task fails (its operator "
                "state may be half-written): %r",
                self.tdd.name_with_subtask,
                checkpoint_id,
                exc,
            )
            self.decline(
                checkpoint_id,
                CheckpointFailureReason.TASK_CHECKPOINT_FAILURE,
                f"{type(exc).__name__}: {exc}",
            )
            exc.add_note(
                f"raised while {self.tdd.name_with_subtask} took its snapshot of checkpoint {checkpoint_id}"
            )
            raise

    def abort_checkpoint_on_barrier(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
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
            self.responder.decline_checkpoint(
                DeclineCheckpoint(self.tdd.job_id, self.tdd.attempt_id, checkpoint_id, reason, message)
            )

    def _broadcast(self, event: CheckpointBarrier | CancelCheckpointMarker) -> None:
        for writer in self.writers:
            writer.broadcast_event(event)

    # -- the asynchronous part ------------------------------------------------

    def _serialize_step(self, checkpoint: _InFlight) -> None:
        """Serialize keyed state for a bounded time; continue later if not done."""
        deadline = time.monotonic_ns() + SERIALIZATION_STEP_NS if self._schedule else None
        try:
            for serializer in checkpoint.serializers.values():
                if not serializer.done and not serializer.step(deadline):
                    assert self._schedule is not None
                    self._schedule(
                        lambda: self._serialize_step(checkpoint),
                        f"serialize checkpoint {checkpoint.checkpoint_id}",
                        lambda: self._dropped(checkpoint),
                    )
                    return
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator as a decline
            checkpoint.release()
            self._fail_async(checkpoint.checkpoint_id, exc)
            return
        serialized = {i: s.result() for i, s in checkpoint.serializers.items()}
        checkpoint.release()  # copy-on-write can stop: the bytes are taken
        if self.async_executor is None:
            self._write_and_acknowledge(checkpoint, serialized)
            return
        try:
            self.async_executor.submit(self._write_and_acknowledge, checkpoint, serialized)
        except RuntimeError as exc:  # the pool was shut down: the job is going away
            self._fail_async(checkpoint.checkpoint_id, exc)

    def _dropped(self, checkpoint: _InFlight) -> None:
        """The task ended (its mailbox closed) before this checkpoint's state was serialized:
        decline it (Flink's ``CHECKPOINT_DECLINED_TASK_CLOSING``), so that the coordinator
        does not wait for it until the timeout."""
        checkpoint.release()
        if self.is_cancelled():
            log.info(
                "%s: checkpoint %d stopped by the task's cancellation",
                self.tdd.name_with_subtask,
                checkpoint.checkpoint_id,
            )
            return
        log.info(
            "%s ended before it wrote checkpoint %d: declining it",
            self.tdd.name_with_subtask,
            checkpoint.checkpoint_id,
        )
        self.decline(
            checkpoint.checkpoint_id,
            CheckpointFailureReason.CHECKPOINT_DECLINED_TASK_CLOSING,
            f"task {self.tdd.name_with_subtask} ended before its state was written",
        )

    def _write_and_acknowledge(self, checkpoint: _InFlight, serialized: dict[int, SnapshotResult]) -> None:
        checkpoint_id = checkpoint.checkpoint_id
        written: list[FileStateHandle] = []
        storage = self.storage
        try:
            subtask_states: dict[str, OperatorSubtaskState] = {}
            checkpointed_size = 0
            state_size = 0
            for index, snapshot in enumerate(checkpoint.snapshots):
                keyed: tuple[KeyedStateHandle, ...] = ()
                state = serialized.get(index)
                if state is not None:
                    stored = state.write(storage, checkpoint_id, checkpoint.target_location)
                    written.extend(stored.written)
                    keyed = stored.handles
                    checkpointed_size += stored.checkpointed_size
                    state_size += stored.state_size
                operator: tuple[OperatorStateHandle, ...] = ()
                if snapshot.operator is not None:
                    payload, metas = snapshot.operator
                    delegate = storage.write_state(checkpoint_id, payload, checkpoint.target_location)
                    if isinstance(delegate, FileStateHandle):
                        written.append(delegate)
                    operator = (OperatorStateHandle(metas, delegate),)
                    checkpointed_size += len(payload)
                    state_size += len(payload)
                if keyed or operator:
                    subtask_states[snapshot.operator_id] = OperatorSubtaskState(keyed, operator)
            if self.is_cancelled():
                log.debug(
                    "%s: checkpoint %d not acknowledged, the task is cancelled",
                    self.tdd.name_with_subtask,
                    checkpoint_id,
                )
                storage.discard_handles(written)
                return
            metrics = checkpoint.metrics
            metrics.async_duration_ms = (time.monotonic_ns() - checkpoint.started_ns) // 1_000_000
            metrics.checkpointed_size = checkpointed_size
            metrics.state_size = state_size
            if self.responder is not None:
                self.responder.acknowledge_checkpoint(
                    AcknowledgeCheckpoint(
                        self.tdd.job_id,
                        self.tdd.attempt_id,
                        checkpoint_id,
                        metrics,
                        TaskStateSnapshot(subtask_states) if subtask_states else None,
                    )
                )
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator as a decline
            storage.discard_handles(written)  # none unless files were written
            self._fail_async(checkpoint_id, exc)

    def _fail_async(self, checkpoint_id: int, exc: BaseException) -> None:
        """The asynchronous part failed: decline (Flink's ``CHECKPOINT_ASYNC_EXCEPTION``); the
        task goes on, its state is intact. A cancelled task declines nothing: its job is
        failing over or ending, which aborts the checkpoint anyway."""
        if self.is_cancelled():
            log.info(
                "%s: asynchronous part of checkpoint %d stopped by the task's cancellation: %r",
                self.tdd.name_with_subtask,
                checkpoint_id,
                exc,
            )
            return
        log.warning(
            "%s: asynchronous part of checkpoint %d failed: %r",
            self.tdd.name_with_subtask,
            checkpoint_id,
            exc,
        )
        self.decline(
            checkpoint_id,
            CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION,
            f"{type(exc).__name__}: {exc}",
        )
