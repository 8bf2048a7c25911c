"""Sink operators: the end of a stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chandy.core.connector import (
    Committer,
    PrecommittingSinkWriter,
    Sink,
    SinkWriter,
    SinkWriterContext,
    TwoPhaseCommittingSink,
)
from chandy.core.functions import SinkFunction
from chandy.core.state import ListStateDescriptor
from chandy.errors import InvalidProgramError
from chandy.task.batches import TimestampedBatch, values_of
from chandy.task.operators.base import (
    StateInitializationContext,
    StateSnapshotContext,
    StreamOperator,
    UdfOperator,
    resolve_call,
)


class _SinkContext(SinkFunction.Context):
    __slots__ = ("current_timestamp",)

    def __init__(self) -> None:
        self.current_timestamp: int | None = None

    def timestamp(self) -> int | None:
        return self.current_timestamp


class SinkFunctionOperator(UdfOperator):
    """``ds.add_sink(SinkFunction or callable)``: one call per record."""

    def open(self) -> None:
        super().open()
        self._call = resolve_call(self.user_function, "invoke")
        self._context = _SinkContext()
        self._takes_context = isinstance(self.user_function, SinkFunction)

    def process_batch(self, records: list[Any]) -> None:
        call = self._call
        if type(records) is not list:
            timed: TimestampedBatch = records  # type: ignore[assignment]
            if self._takes_context:
                ctx = self._context
                for r, ctx.current_timestamp in zip(timed.values, timed.timestamps, strict=True):
                    call(r, ctx)
                ctx.current_timestamp = None
            else:
                for r in timed.values:
                    call(r)
            return
        if self._takes_context:
            ctx = self._context
            for r in records:
                call(r, ctx)
        else:
            for r in records:
                call(r)

    def finish(self) -> None:
        if isinstance(self.user_function, SinkFunction):
            self.user_function.finish()


@dataclass(frozen=True)
class PendingCommit:
    """Committables a subtask prepared at a checkpoint and has not committed yet."""

    owner_subtask: int
    checkpoint_id: int
    committables: tuple[Any, ...]


class SinkWriterOperator(StreamOperator):
    """``ds.sink_to(Sink)``: hands whole batches to the sink's writer.

    For a :class:`TwoPhaseCommittingSink` it also runs the protocol: at a checkpoint
    the writer prepares its commit and the committables join the checkpoint (as union
    state, so that after a restore at any parallelism every subtask knows all of them
    and each commits its share); the checkpoint's completion commits them; a restore
    commits what the restored checkpoint held before anything is written. At the end of
    the input nothing is committed: the final checkpoint, taken after ``finish``,
    prepares the last transaction and its completion commits it, so every commit is one
    that a completed checkpoint accounts for (a failover restores that checkpoint or a
    later one, and nothing is written twice). Only without checkpointing (or with
    ``execution.checkpointing.checkpoints-after-tasks-finish: false``) is the writer's
    output committed at end of input.

    A plain :class:`SinkWriter` is flushed at every checkpoint (at-least-once).
    """

    PENDING_STATE = ListStateDescriptor("sink-pending-committables")
    WRITER_STATE = ListStateDescriptor("sink-writer-state")

    def __init__(self, sink: Sink) -> None:
        super().__init__()
        self.sink = sink
        self.writer: SinkWriter | None = None
        self.committer: Committer | None = None
        self.two_phase = isinstance(sink, TwoPhaseCommittingSink)
        self._pending: list[PendingCommit] = []
        self._restored = False
        self._restored_state: tuple[Any, ...] = ()
        self._restored_committables: tuple[Any, ...] = ()

    def initialize_state(self, context: StateInitializationContext) -> None:
        ctx = self.runtime_context
        assert ctx is not None
        self._pending_state = context.get_union_list_state(self.PENDING_STATE)
        self._writer_state = context.get_list_state(self.WRITER_STATE)
        if self.two_phase:
            assert isinstance(self.sink, TwoPhaseCommittingSink)
            self.committer = self.sink.create_committer()
        if not context.is_restored():
            return
        self._restored = True
        self._restored_state = tuple(self._writer_state.get())
        everything: list[PendingCommit] = list(self._pending_state.get())
        self._pending_state.clear()
        self._restored_committables = tuple(c for p in everything for c in p.committables)
        if self.committer is not None:
            index = ctx.get_index_of_this_subtask()
            parallelism = ctx.get_number_of_parallel_subtasks()
            mine = sorted(
                (p for p in everything if p.owner_subtask % parallelism == index),
                key=lambda p: p.checkpoint_id,
            )
            # The restored checkpoint completed: what it pre-committed is committed now.
            self._commit(mine)

    def open(self) -> None:
        ctx = self.runtime_context
        assert ctx is not None
        self.writer = self.sink.create_writer(
            SinkWriterContext(
                subtask_index=ctx.get_index_of_this_subtask(),
                parallelism=ctx.get_number_of_parallel_subtasks(),
                attempt_number=ctx.get_attempt_number(),
                job_id=ctx.job_id,
                job_name=ctx.job_name,
                operator_id=self.operator_id,
                is_restored=self._restored,
                restored_state=self._restored_state,
                restored_committables=self._restored_committables,
                checkpointing=bool(ctx.get_job_parameter("execution.checkpointing.interval")),
            )
        )
        if self.two_phase and not isinstance(self.writer, PrecommittingSinkWriter):
            raise TypeError(
                f"{type(self.sink).__name__} is two-phase-committing but its writer "
                f"{type(self.writer).__name__} does not prepare commits"
            )

    def process_batch(self, records: list[Any]) -> None:
        assert self.writer is not None
        if self.sink.columnar:
            # A batch sink gets each pyarrow.RecordBatch whole (Sink.columnar).
            if isinstance(records, (list, TimestampedBatch)):
                raise InvalidProgramError(
                    f"{type(self.sink).__name__} takes Arrow record batches, but a stream of records "
                    "was sunk into it: convert with .to_batches() before sink_to()"
                )
            self.writer.write_batch(records)
        else:
            self.writer.write_batch(values_of(records))

    def snapshot_state(self, context: StateSnapshotContext) -> None:
        writer = self.writer
        assert writer is not None and self.runtime_context is not None
        checkpoint_id = context.get_checkpoint_id()
        if isinstance(writer, PrecommittingSinkWriter):
            committables = writer.prepare_commit(checkpoint_id)
            if committables:
                self._pending.append(
                    PendingCommit(
                        self.runtime_context.get_index_of_this_subtask(), checkpoint_id, tuple(committables)
                    )
                )
        else:
            writer.flush(end_of_input=False)
        self._pending_state.update(self._pending)
        self._writer_state.update(writer.snapshot_state(checkpoint_id))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        ready = [p for p in self._pending if p.checkpoint_id <= checkpoint_id]
        if ready:
            self._pending = [p for p in self._pending if p.checkpoint_id > checkpoint_id]
            self._commit(ready)

    def _commit(self, pending: list[PendingCommit]) -> None:
        committables = [c for p in pending for c in p.committables]
        if committables and self.committer is not None:
            self.committer.commit(committables)

    def finish(self) -> None:
        writer = self.writer
        if writer is None:
            return
        if isinstance(writer, PrecommittingSinkWriter) and not self.final_checkpoint_follows:
            # End of input: what a final checkpoint did not already commit is committed now.
            last = writer.prepare_commit(None)
            self._commit(self._pending)
            if last and self.committer is not None:
                self.committer.commit(last)
            self._pending = []
        writer.flush(end_of_input=True)

    def close(self) -> None:
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            if self.committer is not None:
                self.committer.close()


class CollectSinkOperator(StreamOperator):
    """The sink behind ``execute_and_collect()``: sends batches to the client.

    The executor's :class:`~chandy.task.services.ResultPublisher` carries them
    (a queue in this process, RPC from a Spark slot) and blocks while the
    client's buffer is full, so a slow reader backpressures the job.

    With checkpointing on, results are exactly-once, as with Flink's collect
    sink: records are held until the checkpoint after them completes and are
    then published under that checkpoint's id. The held records are operator
    state, so a failure between completion and publication loses nothing, and
    the client drops a checkpoint id it has already seen, so a replay after a
    restore is not delivered twice. Without checkpointing, batches go out at once.

    Held records carry the ``collect_id`` of the ``execute_and_collect()`` call
    that produced them. A failover within the job re-publishes its own held
    records; a *new* job restored from a retained checkpoint or savepoint drops
    the previous job's, because that job's client already received them (they
    belong to checkpoints that completed) and the new client could not tell them
    from new results. The new job's results are what it computes after the restore.
    """

    PENDING_STATE = ListStateDescriptor("collect-sink-pending")

    def __init__(self, collect_id: str) -> None:
        super().__init__()
        self.collect_id = collect_id
        self._publisher: Any = None
        self._should_abort: Any = None
        self._exactly_once = False
        self._buffer: list[Any] = []
        self._pending: list[tuple[int, list[Any]]] = []
        self._to_publish_on_open: list[tuple[int, list[Any]]] = []

    def bind_task_services(self, services: Any, should_abort: Any) -> None:
        if services.results is None:
            raise RuntimeError("this executor cannot return collected results to the client")
        self._publisher = services.results
        self._should_abort = should_abort

    def initialize_state(self, context: StateInitializationContext) -> None:
        assert self.runtime_context is not None
        self._exactly_once = bool(self.runtime_context.get_job_parameter("execution.checkpointing.interval"))
        self._state = context.get_list_state(self.PENDING_STATE)
        if context.is_restored():
            # everything held in the restored checkpoint belongs to completed checkpoints
            own = [
                (checkpoint_id, records)
                for collect_id, checkpoint_id, records in self._state.get()
                if collect_id == self.collect_id
            ]
            self._to_publish_on_open = sorted(own, key=lambda p: p[0])

    def open(self) -> None:
        for checkpoint_id, records in self._to_publish_on_open:
            self._publish(records, checkpoint_id)
        self._to_publish_on_open = []
        self._state.clear()

    def _publish(self, records: list[Any], token: int | None) -> None:
        assert self.runtime_context is not None
        self._publisher.publish(
            self.collect_id,
            self.runtime_context.get_index_of_this_subtask(),
            records,
            token,
            self._should_abort,
        )

    def process_batch(self, records: list[Any]) -> None:
        records = values_of(records)
        if self._exactly_once:
            self._buffer.extend(records)
        else:
            self._publish(records, None)

    def snapshot_state(self, context: StateSnapshotContext) -> None:
        if self._buffer:
            self._pending.append((context.get_checkpoint_id(), self._buffer))
            self._buffer = []
        self._state.update(
            [(self.collect_id, checkpoint_id, records) for checkpoint_id, records in self._pending]
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        ready = [p for p in self._pending if p[0] <= checkpoint_id]
        self._pending = [p for p in self._pending if p[0] > checkpoint_id]
        for pending_id, records in ready:
            self._publish(records, pending_id)

    def finish(self) -> None:
        if self.final_checkpoint_follows:
            # The final checkpoint holds what is buffered; its completion publishes it.
            return
        # End of input without a final checkpoint: nothing follows, publish what is held.
        for pending_id, records in self._pending:
            self._publish(records, pending_id)
        self._pending = []
        if self._buffer:
            self._publish(self._buffer, None)
            self._buffer = []
