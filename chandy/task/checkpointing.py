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
   files and acknowledges with the handles and the metrics. (A batch operator's
   columnar state has no steps: its serializer is done at once, and the pool
   serializes the barrier's copies as it writes them.) If anything fails,
   the checkpoint is declined (``CHECKPOINT_ASYNC_EXCEPTION``) and what was
   written is deleted.

Unaligned checkpoints (``options.is_unaligned``) differ in three places. The barrier goes
downstream as a priority event (:meth:`RecordWriter.broadcast_priority_barrier`), ahead of
the queued data; so does an aligned barrier with a timeout, which downstream treats as an
announcement. At a task with inputs the barrier handler triggers the snapshot on the first
barrier and keeps collecting the data the barriers overtook (the checkpoint's channel state)
until the last channel's barrier: the acknowledgement waits for that
(:meth:`ChannelStateWriter.on_complete`), while keyed state is serialized meanwhile. The
channel state is written as one stream per subtask, each channel's items encoded in channel
order, and referenced by :class:`InputChannelStateHandle` slices from the head operator's
state, where the restore reads it (Flink keeps input channel state in the head operator's
``OperatorSubtaskState`` too). If the checkpoint is aborted before its channel state is
complete, the snapshot is dropped without an acknowledgement (the handler declined it).

Why serialize on the task thread: pickling is CPU work under CPython's
interpreter lock. On a helper thread it gets the lock only in turns with every
busy task thread, and each of its I/O calls waits for the lock again; measured
here, that stretched the serialization of 40 kB of state from 3 ms to 100 ms.
The task thread already holds the lock, and the copy-on-write copies keep the
snapshot exact while it processes records between steps. File writes, which
release the lock, stay on the pool. Columnar state is the exception: its
serialization is a sort, one gather per column and a few Arrow calls per key
group, short calls into C rather than interpreter work, so the pool does it and
the task thread's part of the checkpoint is the copy at the barrier alone.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager

from chandy.errors import find_unrecoverable
from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    CheckpointFailureReason,
    CheckpointMetrics,
    CheckpointOptions,
    CheckpointResponder,
    DeclineCheckpoint,
)
from chandy.network.barrier_handler import AlignmentMetrics
from chandy.network.channel_state import ChannelStateWriter, InputChannelState, encode_payloads
from chandy.network.events import CancelCheckpointMarker, CheckpointBarrier
from chandy.state.backend import SnapshotResult
from chandy.state.handles import (
    FileStateHandle,
    InputChannelStateHandle,
    KeyedStateHandle,
    OperatorStateHandle,
)
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
        self.channel_state: InputChannelState | None = None
        #: The serialized keyed state, once every serializer is done.
        self.serialized: dict[int, SnapshotResult] | None = None
        #: Abandoned (aborted, or the task ended): nothing more is done for it.
        self.discarded = False
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        for snapshot in self.snapshots:
            snapshot.release()

    def discard(self) -> None:
        self.discarded = True
        self.release()


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
        #: Unaligned checkpoints snapshotted here whose channel state is not complete yet: their
        #: write waits for it (see :meth:`_channel_state_complete`).
        self._awaiting: dict[int, _InFlight] = {}

    # -- the synchronous part (task thread) --------------------------------

    def checkpoint_state(
        self,
        checkpoint_id: int,
        timestamp: int,
        options: CheckpointOptions,
        alignment: AlignmentMetrics,
        channel_state: ChannelStateWriter | None = None,
    ) -> None:
        """Snapshot, forward the barrier, and write and acknowledge in the background.

        ``channel_state``: the task's writer when its barrier handler collects this
        (unaligned) checkpoint's in-flight data; the acknowledgement then waits for it."""
        self.last_checkpoint_id = max(self.last_checkpoint_id, checkpoint_id)
        if checkpoint_id in self._aborted:
            if channel_state is not None:
                channel_state.abort(checkpoint_id)
            self._broadcast(CancelCheckpointMarker(checkpoint_id))
            return
        with self._synchronous_phase(checkpoint_id):
            self.chain.prepare_snapshot_pre_barrier(checkpoint_id)
        barrier = CheckpointBarrier(checkpoint_id, timestamp, options)
        if options.is_priority:
            for writer in self.writers:
                writer.broadcast_priority_barrier(barrier)
        else:
            self._broadcast(barrier)
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
            unaligned=options.is_unaligned,
        )
        checkpoint = _InFlight(checkpoint_id, snapshots, metrics, options.target_location)
        if channel_state is not None:
            self._awaiting[checkpoint_id] = checkpoint
            channel_state.on_complete(
                checkpoint_id, lambda state: self._channel_state_complete(checkpoint, state)
            )
            if checkpoint.discarded:
                return
        self._serialize_step(checkpoint)

    def _channel_state_complete(self, checkpoint: _InFlight, state: InputChannelState | None) -> None:
        """The barrier handler finished (or dropped) the checkpoint's channel state (task thread)."""
        self._awaiting.pop(checkpoint.checkpoint_id, None)
        if checkpoint.discarded:
            return
        if state is None:
            # Aborted at the input barriers (the handler declined it) or the task ended.
            log.debug(
                "%s: checkpoint %d dropped before its channel state was complete",
                self.tdd.name_with_subtask,
                checkpoint.checkpoint_id,
            )
            checkpoint.discard()
            return
        checkpoint.channel_state = state
        if checkpoint.serialized is not None:
            self._submit(checkpoint)

    def close(self) -> None:
        """The task ends (task thread): a checkpoint still waiting for its channel state will
        never be acknowledged; decline it (see :meth:`_dropped`)."""
        for checkpoint in list(self._awaiting.values()):
            self._dropped(checkpoint)

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
        if checkpoint.discarded:
            return
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
        except Exception as exc:
            self._awaiting.pop(checkpoint.checkpoint_id, None)
            checkpoint.discard()
            if find_unrecoverable(exc) is not None:
                # State that cannot be serialized (a lock in a ValueState) fails every
                # checkpoint from now on, and again after a restart: fail the task (this runs
                # on its thread), and the job fails once instead of checkpointing in vain.
                raise
            self._fail_async(checkpoint.checkpoint_id, exc)
            return
        checkpoint.serialized = {i: s.result() for i, s in checkpoint.serializers.items()}
        checkpoint.release()  # copy-on-write can stop: the bytes are taken
        if self._awaiting.get(checkpoint.checkpoint_id) is not checkpoint:  # else its completion submits
            self._submit(checkpoint)

    def _submit(self, checkpoint: _InFlight) -> None:
        """Write the serialized state (and channel state) and acknowledge, on the pool."""
        serialized = checkpoint.serialized
        assert serialized is not None
        if self.async_executor is None:
            self._write_and_acknowledge(checkpoint, serialized)
            return
        try:
            self.async_executor.submit(self._write_and_acknowledge, checkpoint, serialized)
        except RuntimeError as exc:  # the pool was shut down: the job is going away
            self._fail_async(checkpoint.checkpoint_id, exc)

    def _dropped(self, checkpoint: _InFlight) -> None:
        """The task ended (its mailbox closed) before this checkpoint's state was serialized,
        or before its channel state was complete: decline it (Flink's
        ``CHECKPOINT_DECLINED_TASK_CLOSING``), so that the coordinator does not wait for it
        until the timeout."""
        self._awaiting.pop(checkpoint.checkpoint_id, None)
        if checkpoint.discarded:
            return
        checkpoint.discard()
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
            persisted = 0
            if checkpoint.channel_state is not None:
                size, persisted = self._write_channel_state(
                    checkpoint, checkpoint.channel_state, subtask_states, written
                )
                checkpointed_size += size
                state_size += size
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
            metrics.bytes_persisted_during_alignment = persisted
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

    def _write_channel_state(
        self,
        checkpoint: _InFlight,
        state: InputChannelState,
        subtask_states: dict[str, OperatorSubtaskState],
        written: list[FileStateHandle],
    ) -> tuple[int, int]:
        """Write the in-flight data as one stream (every channel, in channel order, each
        :func:`encode_payloads`-ed) and reference its slices from the head operator's state.
        Returns the stream's size and the bytes of in-flight data in it."""
        parts: list[bytes] = []
        slices: list[tuple[int, int, int]] = []
        offset = 0
        for channel in sorted(state.per_channel):
            payloads = state.per_channel[channel]
            if not payloads:
                continue
            data = encode_payloads(payloads)
            parts.append(data)
            slices.append((channel, offset, len(data)))
            offset += len(data)
        if not parts:
            return 0, 0
        stream = b"".join(parts)
        delegate = self.storage.write_state(checkpoint.checkpoint_id, stream, checkpoint.target_location)
        if isinstance(delegate, FileStateHandle):
            written.append(delegate)
        handles = tuple(
            InputChannelStateHandle(channel, delegate, start, length) for channel, start, length in slices
        )
        head = self.tdd.operators[0].operator_id
        current = subtask_states.get(head)
        subtask_states[head] = (
            OperatorSubtaskState(input_channel_state=handles)
            if current is None
            else dataclasses.replace(current, input_channel_state=handles)
        )
        return len(stream), state.size_bytes

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
