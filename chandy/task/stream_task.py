"""StreamTask: one subtask of one job vertex, run by one thread in a mailbox loop.

The loop (``_run_mailbox_loop``) alternates two kinds of work on the same thread:

* mails: control actions from outside (trigger or confirm a checkpoint, cancel),
  run between batches;
* the default action: read one item from the input gate (or poll the source
  reader) and push it through the operator chain.

When there is nothing to read the task flushes its partly filled output
batches (so an idle pipeline does not hold records back) and sleeps on its
:class:`~chandy.network.wakeup.Wakeup`, which input channels, output credit
and the mailbox all signal. When an output channel has no credit the task stops
reading (backpressure travels upstream) but keeps taking mail.

The buffer timeout (``execution.buffer-timeout``, Flink's): while the task stays busy, a
record it produced leaves within the timeout. A batch expected to take longer than half of
it goes to the operators in chunks (:mod:`chandy.task.chunked_input`; a source reads fewer
records at a time), and what waited in a writer for the other half is sent: by this thread
after every batch and chunk, and by the task's :class:`~chandy.task.output_flusher.OutputFlusher`
thread while this one is inside a long call. A timeout of 0 processes and flushes one record
at a time; -1 sends only full batches (and what events flush), not even when idle.

Checkpoints: a source task checkpoints when the coordinator's trigger arrives
as a mail; a task with inputs when its barrier handler has seen the barrier on
every input (aligned for EXACTLY_ONCE, tracked for AT_LEAST_ONCE). Either way
:meth:`StreamTask.perform_checkpoint` runs on this thread between two batches.

Unaligned checkpoints: the barrier handler triggers on the first barrier and collects what
the barriers overtook into the task's :class:`ChannelStateWriter`, which the checkpoint's
acknowledgement waits for. Its alignment timeout (an aligned checkpoint going unaligned)
runs on this thread through the processing-time service. Under backpressure the loop does
not read input, but it still acts on a priority barrier that arrived, so an unaligned
checkpoint is not held up by the backlog; nor by a slow batch, which is processed in
chunks with priority barriers taken in between (:mod:`chandy.task.chunked_input`). On
restore, the head operator's channel state is handed to the input gate, which replays it
into its channels before any new input.

Stop-with-savepoint (Flink's synchronous savepoint, ``SYNC_SAVEPOINT``): a source task
stops polling its reader when the trigger arrives (with drain it first emits
MAX_WATERMARK, so every window and event-time timer downstream fires before the
barrier), takes the snapshot, and waits, serving mails, until the savepoint completed;
then it sends the end of its partitions and finishes. Every task that took a
synchronous savepoint quiesces its processing-time timers (nothing may follow the
barrier) and, when its input ends, skips ``end_input``/``finish``: the job is stopped,
not at the end of its input, and a restore continues it. It too finishes only once the
savepoint completed, so a two-phase-commit sink commits the savepoint's transactions
(on the completion notice) before its task ends.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Sequence
from typing import Any

from chandy.config import Configuration
from chandy.config.options import (
    CheckpointingMode,
    CheckpointingOptions,
    ExecutionOptions,
    MetricOptions,
    NetworkOptions,
)
from chandy.errors import InvalidCheckpointError, StorageError
from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    CheckpointFailureReason,
    CheckpointMetrics,
    CheckpointOptions,
    CheckpointType,
)
from chandy.messages.status import ExecutionState
from chandy.network.barrier_handler import (
    AlignmentMetrics,
    CheckpointBarrierHandler,
    CheckpointBarrierTracker,
    SingleCheckpointBarrierHandler,
)
from chandy.network.cancellation import TaskCancelledError
from chandy.network.channel import InputChannel, OutputChannel
from chandy.network.channel_state import ChannelStateWriter, decode_payloads
from chandy.network.checkpointed_input_gate import CheckpointedInputGate
from chandy.network.events import (
    END_OF_DATA,
    END_OF_PARTITION,
    CancelCheckpointMarker,
    CheckpointBarrier,
    RuntimeEvent,
    Watermark,
)
from chandy.network.input_gate import InputGate
from chandy.network.wakeup import Wakeup
from chandy.state.handles import FileStateHandle, InputChannelStateHandle
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import StateReader
from chandy.task.arrow_partitioners import ColumnarPartitioner
from chandy.task.arrow_writer import ArrowRecordWriter
from chandy.task.checkpointing import SubtaskCheckpointCoordinator
from chandy.task.chunked_input import PROBE_RECORDS, TARGET_CHUNK_NS, ChunkedInput
from chandy.task.deployment import TaskDeploymentDescriptor
from chandy.task.mailbox import Mailbox
from chandy.task.metrics import TaskMetrics
from chandy.task.operator_chain import OperatorChain
from chandy.task.operators.base import StreamOperator, TwoInputStreamOperator
from chandy.task.operators.source import InputStatus, SourceOperator
from chandy.task.output_flusher import OutputFlusher
from chandy.task.processing_time import ProcessingTimeService, ProcessingTimeTimer
from chandy.task.record_writer import RecordWriter
from chandy.task.services import TaskFailure, TaskServices, TaskStateListener
from chandy.util.clock import monotonic_ns_of

log = logging.getLogger(__name__)

_MORE = InputStatus.MORE_AVAILABLE
_NOTHING = InputStatus.NOTHING_AVAILABLE
_END = InputStatus.END_OF_INPUT


class StreamTask:
    """Runs one subtask's operator chain; :meth:`invoke` is the thread body."""

    def __init__(
        self,
        tdd: TaskDeploymentDescriptor,
        input_channels: Sequence[InputChannel],
        output_channels: Sequence[Sequence[OutputChannel]],
        services: TaskServices,
        listener: TaskStateListener,
    ) -> None:
        if len(output_channels) != len(tdd.outputs):
            raise ValueError("one list of output channels per output edge is required")
        if len(input_channels) != tdd.num_input_channels:
            raise ValueError("input channel count does not match the deployment")
        #: Which input of a two-input head each input channel feeds (1 or 2).
        self._input_types = tdd.input_types
        if any(tdd.input_types) and len(tdd.input_types) != len(input_channels):
            raise ValueError("a two-input task needs the input of every channel (input_types)")
        self.tdd = tdd
        self.services = services
        self.listener = listener
        self.wakeup = Wakeup()
        self.mailbox = Mailbox(self.wakeup)
        #: Wall-clock callbacks (processing-time timers, periodic watermarks), run by this thread.
        self.processing_time = ProcessingTimeService(services.clock)
        self._cancelled = False
        config = Configuration(tdd.config)
        self.batch_size = config.get(NetworkOptions.BATCH_SIZE)
        #: Rows per record batch on the batch path: what a batch source reads at a time, and
        #: what a batch edge's writer sends at once.
        self.arrow_batch_size = config.get(NetworkOptions.ARROW_BATCH_SIZE)
        self._now_ns = monotonic_ns_of(services.clock)
        timeout_ms = config.get(ExecutionOptions.BUFFER_TIMEOUT)
        if not config.get(ExecutionOptions.BUFFER_TIMEOUT_ENABLED):
            timeout_ms = -1
        #: How long a record may wait in a writer while the task is busy: half the buffer
        #: timeout (chunks of a slow batch take at most the other half); -1: no limit.
        self.flush_wait_ns = -1 if timeout_ms < 0 else timeout_ms * 1_000_000 // 2
        self.checkpointed_input: CheckpointedInputGate | None = None
        #: Collects the in-flight data of unaligned checkpoints (a task with exactly-once inputs).
        self.channel_state: ChannelStateWriter | None = None
        if input_channels:
            gate = InputGate(input_channels, self.wakeup)
            handler: CheckpointBarrierHandler
            if config.get(CheckpointingOptions.MODE) is CheckpointingMode.EXACTLY_ONCE:
                self.channel_state = ChannelStateWriter()
                handler = SingleCheckpointBarrierHandler(
                    len(input_channels),
                    gate,
                    self,
                    services.clock,
                    end_of_partition_aborts=not config.get(
                        CheckpointingOptions.CHECKPOINTS_AFTER_TASKS_FINISH
                    ),
                    timer=ProcessingTimeTimer(self.processing_time),
                    channel_state=self.channel_state,
                )
            else:
                handler = CheckpointBarrierTracker(len(input_channels), self)
            self.checkpointed_input = CheckpointedInputGate(gate, handler)
        #: Slow batches are processed in chunks (see :mod:`chandy.task.chunked_input`): of half
        #: the buffer timeout, and with unaligned checkpoints of at most TARGET_CHUNK_NS, with
        #: priority barriers taken between two chunks; without network outputs, of half the
        #: metrics report interval.
        self._chunked = self._chunking(
            config.get(CheckpointingOptions.UNALIGNED), config.get(MetricOptions.REPORT_INTERVAL)
        )
        self.checkpoints: SubtaskCheckpointCoordinator | None = None
        #: Once its operators finished, a task waits for one checkpoint taken after that
        #: before it ends, so that two-phase-commit sinks commit everything (Flink's final
        #: checkpoint; see ``_finish_operators``).
        self._needs_final_checkpoint = config.get(CheckpointingOptions.INTERVAL) is not None and config.get(
            CheckpointingOptions.CHECKPOINTS_AFTER_TASKS_FINISH
        )
        self._awaiting_final_checkpoint = False
        self._final_checkpoint_id: int | None = None
        self._final_checkpoint_done = False
        #: The end of every partition went out: the task ended without a failure.
        self._ended = False
        #: The synchronous savepoint (stop-with-savepoint) this task took, and whether it
        #: completed: the task then finishes without ending its input.
        self._sync_savepoint_id: int | None = None
        self._sync_savepoint_done = False
        #: A source task stops polling its reader once it took a synchronous savepoint.
        self._stop_polling = False
        #: Checkpoints triggered directly (every upstream task finished) while the input had
        #: not ended yet: taken once it has (see ``_on_trigger``).
        self._deferred_triggers: list[tuple[int, int, CheckpointOptions]] = []
        self._input_ended = False
        self.writers: list[RecordWriter] = []
        for spec, channels in zip(tdd.outputs, output_channels, strict=True):
            partitioner = spec.partitioner.copy()
            partitioner.setup(len(channels), tdd.subtask_index)
            for channel in channels:
                channel.bind_producer(self.wakeup, self.is_cancelled)
            if isinstance(partitioner, ColumnarPartitioner):  # a batch edge: Arrow record batches
                self.writers.append(
                    ArrowRecordWriter(channels, partitioner, self.arrow_batch_size, self._now_ns)
                )
            else:
                self.writers.append(RecordWriter(channels, partitioner, self.batch_size, self._now_ns))
        #: Sends what waited too long while this thread is busy (a buffer timeout above 0).
        self._flusher: OutputFlusher | None = None
        if self.flush_wait_ns > 0 and self.writers:
            self._flusher = OutputFlusher(
                self.writers, self.flush_wait_ns, self._now_ns, tdd.name_with_subtask, self._flusher_failed
            )
        #: Records in and out, idle and backpressured time, watermarks (read by the executor's reporter).
        self.metrics = TaskMetrics(tdd.attempt_id, self.writers)
        self.chain: OperatorChain | None = None
        self.state = ExecutionState.DEPLOYING

    def _chunking(self, unaligned: bool, report_interval_ms: int) -> ChunkedInput | None:
        """How slow batches are split, if they are: for the buffer timeout (unless -1) when the
        task sends on the network and, with unaligned checkpoints, for priority barriers
        (which only a task with inputs gets). A task that sends nothing on the network (its
        chain ends in sinks) has nothing to flush: it splits a batch only when the batch is
        expected to take longer than half the metrics report interval, so that its record
        counts (counted per batch handed to an operator) move while a slow operator works
        through it, and the rates reported (the status line's ``in`` and ``out``) are the
        records' real rate rather than 0 until the batch is done. Its chunks are that long:
        a sink whose cost is per call pays it once per half a report interval at most."""
        unaligned = unaligned and self.channel_state is not None
        flush_wait = self.flush_wait_ns if self.tdd.outputs else -1
        if flush_wait < 0 and not unaligned:
            if self.tdd.outputs:
                return None  # -1 asked for whole batches
            return ChunkedInput(None, self._now_ns, report_interval_ms * 1_000_000 // 2)
        if flush_wait < 0:
            target = TARGET_CHUNK_NS
        else:
            target = min(flush_wait, TARGET_CHUNK_NS) if unaligned else flush_wait
        return ChunkedInput(
            self.checkpointed_input if unaligned else None,
            self._now_ns,
            target,
            # The buffer timeout's promise holds from the first record on: measure it alone.
            probe_records=PROBE_RECORDS if flush_wait < 0 else 1,
            after_chunk=None if flush_wait < 0 else self._flush_due,
        )

    def _flush_due(self) -> None:
        """Send what waited ``flush_wait_ns`` in a writer (task thread; 0: everything), to the
        channels with credit. A buffer whose channel has none stays (its consumer has work
        queued anyway) and leaves with the next send, the flush before the task idles, or the
        output flusher: waiting for credit here, between the chunks of a batch, would hold
        off the priority barriers that are handled between them."""
        flush_wait = self.flush_wait_ns
        now = 0
        for writer in self.writers:
            since = writer.pending_since_ns
            if since:
                now = now or self._now_ns()
                if now - since >= flush_wait:
                    writer.flush_if_waited(now, flush_wait)

    def _flusher_failed(self, failure: BaseException) -> None:
        """The output flusher's send failed (its thread): the task fails with the error."""

        def fail() -> None:
            raise failure

        self.mailbox.put(fail, "the output flusher failed")

    def _stop_flusher(self) -> None:
        """Stop the output flusher; raise what made it fail, if anything did."""
        flusher = self._flusher
        if flusher is None:
            return
        flusher.stop()
        if flusher.failure is not None:
            raise flusher.failure

    # ------------------------------------------------------------------ control

    def is_cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Ask the task to stop (from any thread); it unwinds at its next check."""
        self._cancelled = True
        self.wakeup.signal()

    # ------------------------------------------------------------------ checkpoints

    def trigger_checkpoint_async(
        self, checkpoint_id: int, timestamp: int, options: CheckpointOptions
    ) -> None:
        """The coordinator asks this (source) task to checkpoint; runs as a mail."""
        self.mailbox.put(
            lambda: self._on_trigger(checkpoint_id, timestamp, options),
            f"checkpoint {checkpoint_id}",
            on_drop=lambda: self._decline_closed(checkpoint_id, options),
        )

    def _on_trigger(self, checkpoint_id: int, timestamp: int, options: CheckpointOptions) -> None:
        """A trigger from the coordinator. A source checkpoints now. A task with inputs is
        triggered only once every task upstream has finished (no barrier can reach it any
        more); records those tasks sent may still wait in its channels, and the snapshot
        must come after them, so it is taken once the input has ended (after ``finish``),
        before the end of the stream goes downstream."""
        if self.checkpointed_input is not None and not self._input_ended:
            self._deferred_triggers.append((checkpoint_id, timestamp, options))
            return
        self.perform_checkpoint(checkpoint_id, timestamp, options, AlignmentMetrics())

    def _take_deferred_checkpoints(self) -> None:
        """The input has ended: take the checkpoints triggered while it was being read, and
        those whose triggers arrived while the operators finished."""
        self._input_ended = True
        deferred, self._deferred_triggers = self._deferred_triggers, []
        for checkpoint_id, timestamp, options in deferred:
            self.perform_checkpoint(checkpoint_id, timestamp, options, AlignmentMetrics())
        if self.mailbox.has_mail():
            self._process_mails()

    def notify_checkpoint_complete_async(self, checkpoint_id: int) -> None:
        self.mailbox.put(lambda: self._notify_complete(checkpoint_id), f"checkpoint {checkpoint_id} complete")

    def notify_checkpoint_aborted_async(self, checkpoint_id: int) -> None:
        self.mailbox.put(lambda: self._notify_aborted(checkpoint_id), f"checkpoint {checkpoint_id} aborted")

    def perform_checkpoint(
        self,
        checkpoint_id: int,
        timestamp: int,
        options: CheckpointOptions,
        alignment: AlignmentMetrics,
        *,
        channel_state: ChannelStateWriter | None = None,
    ) -> None:
        """Snapshot this subtask for ``checkpoint_id`` (task thread, between batches).
        ``channel_state``: the barrier handler collects the checkpoint's in-flight data there."""
        if self.checkpoints is None or self.state is not ExecutionState.RUNNING:
            if channel_state is not None:
                channel_state.abort(checkpoint_id)
            self._decline_closed(checkpoint_id, options)
            self._broadcast_cancel(checkpoint_id)
            return
        if self._awaiting_final_checkpoint and self._final_checkpoint_id is None:
            self._final_checkpoint_id = checkpoint_id
        synchronous = options.checkpoint_type is CheckpointType.SYNC_SAVEPOINT
        if synchronous:
            self._stop_for_sync_savepoint(checkpoint_id, options)
        self.checkpoints.checkpoint_state(checkpoint_id, timestamp, options, alignment, channel_state)
        if synchronous:
            # Nothing may follow the savepoint's barrier: a timer firing now would emit
            # records the savepoint does not cover, and the restore fires it again.
            self.processing_time.quiesce()

    def _stop_for_sync_savepoint(self, checkpoint_id: int, options: CheckpointOptions) -> None:
        """Before the snapshot of a synchronous savepoint: a source stops polling (and with
        drain emits MAX_WATERMARK, which fires every event-time window and timer downstream
        ahead of the barrier); every task remembers to finish once it completed."""
        log.info(
            "%s stops with savepoint %d%s",
            self.tdd.name_with_subtask,
            checkpoint_id,
            " (drain)" if options.drain else "",
        )
        self._sync_savepoint_id = checkpoint_id
        if self.checkpointed_input is None and not self._awaiting_final_checkpoint:
            self._stop_polling = True
            assert self.chain is not None
            head = self.chain.head
            assert isinstance(head, SourceOperator)
            head.stop(drain=options.drain)

    def _finish_after_sync_savepoint(self) -> None:
        """Stopped with a savepoint: no end_input/finish (the input did not end; the job
        continues from the savepoint), only the wait for the savepoint's completion notice,
        on which the sinks commit it. If the savepoint fails instead, the JobMaster fails
        the job over and cancels this task."""
        self._serve_until(lambda: self._sync_savepoint_done)

    def _finish_operators(self) -> None:
        """The input ended (every channel's end of data, or the source's reader): end the
        operators' input and finish them, send the end of data on, then (with checkpointing)
        wait for the final checkpoint (Flink's FLIP-147).

        The final checkpoint is the first one this task takes after ``finish``: its barrier
        follows the end of data through every task downstream, so it covers what every
        operator emitted, stored or prepared while finishing, and its completion, which
        commits the two-phase-commit sinks' last transactions, comes before any task ends.
        A task that ended first would leave a failover nothing but an earlier checkpoint to
        restore, and the sources would read again what the sink had already committed."""
        chain = self.chain
        assert chain is not None
        final = self._needs_final_checkpoint
        chain.end_input(final_checkpoint=final)
        for writer in self.writers:
            writer.broadcast_event(END_OF_DATA)
        self._awaiting_final_checkpoint = final
        if self.checkpointed_input is not None:
            self._take_deferred_checkpoints()
        if not final:
            return
        responder = self.services.checkpoint_responder
        if responder is not None and self.checkpointed_input is None:
            from chandy.messages.checkpoint import EndOfInputReached

            responder.report_end_of_input(EndOfInputReached(self.tdd.job_id, self.tdd.attempt_id))
        self._serve_until(lambda: self._final_checkpoint_done)

    def _serve_until(self, done: Callable[[], bool]) -> None:
        """After the end of the input (or a synchronous savepoint): serve mails (triggers,
        completion notices) and, in a task with inputs, the input (barriers, the ends of the
        partitions) until ``done()``. No record may arrive now."""
        checkpointed_input = self.checkpointed_input
        while not done():
            if self.mailbox.has_mail():
                self._process_mails()
            if self._cancelled:
                raise TaskCancelledError()
            if done():
                return
            if checkpointed_input is not None and (polled := checkpointed_input.poll_next()) is not None:
                item = polled[1]
                if not isinstance(item, RuntimeEvent):
                    raise RuntimeError(
                        f"{self.tdd.name_with_subtask}: {len(item)} records arrived on input channel "
                        f"{polled[0]} after every input channel had ended its data"
                    )
                continue  # a watermark forwarded as a channel ended: event time is over
            for writer in self.writers:
                writer.flush()
            self.metrics.wait_idle(self.wakeup, 0.1)  # the input ended: waiting is idling

    def _decline_closed(self, checkpoint_id: int, options: CheckpointOptions) -> None:
        """A checkpoint reached this task when it could not take it (still starting, or its
        mailbox closed as it ended): decline it. A task that ended after its final checkpoint
        completed answers a later one as Flink does a finished task: acknowledged as finished,
        with no state, since everything it did is committed. A stop-with-savepoint whose
        trigger met a subtask just finishing (a source without a split) would otherwise fail.
        Such a task sends no barrier: the coordinator triggers the tasks it fed itself.
        Its part is unaligned when ``options`` are (as Flink reports every subtask)."""
        responder = self.services.checkpoint_responder
        if self._ended and self._final_checkpoint_done:
            log.info(
                "%s is finished: acknowledges checkpoint %d as finished",
                self.tdd.name_with_subtask,
                checkpoint_id,
            )
            if responder is not None:
                finished = {op.operator_id: OperatorSubtaskState(finished=True) for op in self.tdd.operators}
                responder.acknowledge_checkpoint(
                    AcknowledgeCheckpoint(
                        self.tdd.job_id,
                        self.tdd.attempt_id,
                        checkpoint_id,
                        CheckpointMetrics(unaligned=options.is_unaligned),
                        TaskStateSnapshot(finished),
                    )
                )
            return
        log.info(
            "%s declines checkpoint %d: %s",
            self.tdd.name_with_subtask,
            checkpoint_id,
            f"the task is {self.state.name}, not running"
            if self.state is not ExecutionState.RUNNING
            else "its mailbox closed as it fails, is cancelled or ends",
        )
        if responder is not None:
            from chandy.messages.checkpoint import DeclineCheckpoint

            responder.decline_checkpoint(
                DeclineCheckpoint(
                    self.tdd.job_id,
                    self.tdd.attempt_id,
                    checkpoint_id,
                    CheckpointFailureReason.CHECKPOINT_DECLINED_TASK_NOT_READY,
                    f"task {self.tdd.name_with_subtask} is not running",
                )
            )

    def _broadcast_cancel(self, checkpoint_id: int) -> None:
        try:
            for writer in self.writers:
                writer.broadcast_event(CancelCheckpointMarker(checkpoint_id))
        except Exception as exc:  # noqa: BLE001 - the task is ending anyway
            log.debug(
                "%s: could not forward cancel marker %d (the task is ending): %r",
                self.tdd.name_with_subtask,
                checkpoint_id,
                exc,
            )

    def _notify_complete(self, checkpoint_id: int) -> None:
        if self.chain is not None:
            self.chain.notify_checkpoint_complete(checkpoint_id)
        final = self._final_checkpoint_id
        if final is not None and checkpoint_id >= final:
            self._final_checkpoint_done = True
        sync = self._sync_savepoint_id
        if sync is not None and checkpoint_id >= sync:
            self._sync_savepoint_done = True

    def _notify_aborted(self, checkpoint_id: int) -> None:
        if checkpoint_id == self._final_checkpoint_id:
            self._final_checkpoint_id = None  # the next checkpoint will do
        if self.checkpoints is not None:
            self.checkpoints.notify_checkpoint_aborted(checkpoint_id)
        if self.channel_state is not None:
            self.channel_state.abort(checkpoint_id)  # stop collecting its in-flight data
        if self.chain is not None:
            self.chain.notify_checkpoint_aborted(checkpoint_id)

    # BarrierHandlerActions: called by the barrier handler on this thread.

    def trigger_checkpoint_on_barrier(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        # An unaligned barrier: the handler has started collecting the checkpoint's channel state.
        channel_state = self.channel_state if barrier.options.is_unaligned else None
        chunked = self._chunked
        if chunked is not None and chunked.in_batch:
            if channel_state is None:  # the gate holds announced barriers back mid-batch
                raise RuntimeError(
                    f"{self.tdd.name_with_subtask}: aligned checkpoint {barrier.checkpoint_id} triggered "
                    "in the middle of an input batch; its snapshot would lose the rest of the batch"
                )
            # Between two chunks of a batch: the rest is in-flight data of its channel, ahead
            # of anything the handler captures for that channel after this trigger.
            chunked.persist_unprocessed(barrier.checkpoint_id, channel_state)
        self.perform_checkpoint(
            barrier.checkpoint_id, barrier.timestamp, barrier.options, metrics, channel_state=channel_state
        )

    def abort_checkpoint_on_barrier(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        if self.checkpoints is not None:
            self.checkpoints.abort_checkpoint_on_barrier(checkpoint_id, reason)

    def _transition(self, state: ExecutionState, failure: TaskFailure | None = None) -> None:
        self.state = state
        self.listener.notify_task_state(self.tdd.attempt_id, state, failure)

    # ------------------------------------------------------------------ lifecycle

    def invoke(self) -> None:
        """Run the task to its end; reports every state change to the listener."""
        tdd = self.tdd
        self._transition(ExecutionState.INITIALIZING)
        failure: TaskFailure | None = None
        try:
            self.chain = OperatorChain(
                tdd,
                self.writers,
                self.services,
                self.is_cancelled,
                self.processing_time,
                self.metrics,
                mailbox=self.mailbox,
            )
            self.checkpoints = SubtaskCheckpointCoordinator(
                tdd,
                self.chain,
                self.writers,
                self.services.checkpoint_responder,
                self.services.checkpoint_storage,
                self.services.async_executor,
                self.is_cancelled,
                schedule=self.mailbox.put,
            )
            if tdd.task_restore is not None:
                self._restore_channel_state()
            self.chain.initialize_state_and_open()
            if self._cancelled:
                raise TaskCancelledError()
            self._transition(ExecutionState.RUNNING)
            if self._flusher is not None:
                self._flusher.start()
            self._run_mailbox_loop()
            # Flink quiesces the timer service when the input ends: processing-time timers
            # still pending do not fire; event-time ones fired on the final watermark.
            self.processing_time.quiesce()
            if self._sync_savepoint_id is not None:
                self._finish_after_sync_savepoint()
            else:
                self._finish_operators()
            if self.checkpointed_input is not None:
                # Upstream tasks may still checkpoint before their ends of partition: this
                # task takes part until then, and its own end of partition follows.
                self._serve_until(self.checkpointed_input.is_finished)
            self._stop_flusher()  # before the end of the stream: nothing it held may be lost
            for writer in self.writers:
                writer.broadcast_event(END_OF_PARTITION)
            self._ended = True
        except TaskCancelledError:
            pass
        except BaseException as exc:  # noqa: BLE001 - any failure fails the task, never the thread
            failure = TaskFailure.of(exc, _operator_of(exc))
        finally:
            if self._flusher is not None:
                self._flusher.stop()
            self.mailbox.close()
            if self.checkpoints is not None:
                self.checkpoints.close()
            if self.channel_state is not None:
                self.channel_state.close()
            if self.chain is not None:
                error = self.chain.close()
                if error is not None and failure is None:
                    failure = TaskFailure.of(error, _operator_of(error))
        if self._cancelled:
            self._transition(ExecutionState.CANCELED)
        elif failure is not None:
            # INFO: the JobMaster reports the failure to the user, with its traceback and attempt
            log.info(
                "%s (attempt %d) failed: %s: %s",
                tdd.name_with_subtask,
                tdd.attempt_number + 1,  # 1 for the first, as the JobMaster counts them
                failure.exception_type,
                failure.message,
            )
            self._transition(ExecutionState.FAILED, failure)
        else:
            self._transition(ExecutionState.FINISHED)

    def _restore_channel_state(self) -> None:
        """Hand the restored checkpoint's in-flight data to the input gate, which replays it
        into each channel before anything new arrives on it."""
        restore = self.tdd.task_restore
        assert restore is not None
        head = restore.state.subtask_states.get(self.tdd.operators[0].operator_id)
        if head is None or not head.input_channel_state:
            return
        checkpointed_input = self.checkpointed_input
        channels = 0 if checkpointed_input is None else checkpointed_input.gate.number_of_channels
        reader = StateReader(self.services.checkpoint_storage)
        for handle in head.input_channel_state:
            if not 0 <= handle.channel_index < channels:
                raise InvalidCheckpointError(
                    f"checkpoint {restore.checkpoint_id} holds in-flight data of input channel "
                    f"{handle.channel_index} for {self.tdd.name_with_subtask}, which has {channels} "
                    "input channels now: an unaligned checkpoint restores only into the same "
                    "topology. Restore from a savepoint or an aligned checkpoint."
                )
            assert checkpointed_input is not None and self.chain is not None
            checkpointed_input.gate.add_recovered(
                handle.channel_index, self._read_channel_state(reader, handle), self.chain.unpickling_policy()
            )

    def _read_channel_state(self, reader: StateReader, handle: InputChannelStateHandle) -> list[bytes]:
        """One channel's items; a missing, corrupt or truncated stream is one error that names
        the file, the checkpoint and what to do (a restart would only repeat it)."""
        restore = self.tdd.task_restore
        assert restore is not None
        delegate = handle.delegate
        source = f"file {delegate.path}" if isinstance(delegate, FileStateHandle) else "inline state"
        try:
            data = reader.read(delegate, (handle.offset, handle.offset + handle.length))
            if len(data) != handle.length:
                raise ValueError(f"{source} holds {len(data)} of its {handle.length} bytes")
            return decode_payloads(data, source)
        except (InvalidCheckpointError, StorageError, ValueError) as exc:
            cause = str(exc).removesuffix(" Restore from another checkpoint.").rstrip(".")
            raise InvalidCheckpointError(
                f"{self.tdd.name_with_subtask} cannot restore the in-flight data (channel state) of "
                f"its input channel {handle.channel_index} from checkpoint {restore.checkpoint_id}: "
                f"{cause}. Restore from an earlier checkpoint or a savepoint."
            ) from exc

    # ------------------------------------------------------------------ the loop

    def _run_mailbox_loop(self) -> None:
        assert self.chain is not None
        mailbox = self.mailbox
        writers = self.writers
        flush_wait_ns = self.flush_wait_ns
        flush_due = self._flush_due
        now_ns = self._now_ns
        wakeup = self.wakeup
        head = self.chain.head
        checkpointed_input = self.checkpointed_input
        if checkpointed_input is None:
            assert isinstance(head, SourceOperator)
            source: SourceOperator | None = head
            idle_wait = head.idle_wait_s
        else:
            source = None
            idle_wait = 1.0
        process_input = (
            self._process_two_inputs if isinstance(head, TwoInputStreamOperator) else self._process_input
        )
        if self._chunked is not None:  # chosen once: with -1 and aligned checkpoints, whole batches
            process_input = self._process_input_in_chunks
        # A batch source (``Source.columnar``) reads Arrow batches of arrow_batch_size rows, and
        # whatever the clock says: a batch is never cut (see chunked_input).
        columnar_source = source is not None and source.source.columnar
        batch_size = self.arrow_batch_size if columnar_source else self.batch_size
        source_chunks = None if columnar_source else self._chunked
        emitted = self.metrics.head  # the source's counters: records it emitted
        timers = self.processing_time
        clock = timers.clock
        metrics = self.metrics
        while True:
            if mailbox.has_mail():
                self._process_mails()
            if self._cancelled:
                raise TaskCancelledError()
            if self._stop_polling:
                return  # a source stopped with a savepoint
            due = timers.next_due_ms
            if due is not None and clock.now_ms() >= due:
                timers.fire_due()
            if not self._outputs_available(writers):
                if checkpointed_input is not None and checkpointed_input.has_priority_event:
                    # An unaligned barrier overtakes the backlog: act on it without reading data.
                    checkpointed_input.process_priority_events()
                    continue
                until_timer = timers.delay_until_next_ms()
                metrics.wait_backpressured(
                    wakeup, 0.1 if until_timer is None else min(0.1, until_timer / 1000)
                )
                continue
            if source is None:
                status = process_input(head)
            elif source_chunks is None:
                status = source.emit_next(batch_size)
            else:  # as many records as take at most a chunk's time
                before = emitted.records_out
                start = now_ns()
                status = source.emit_next(source_chunks.limit(batch_size))
                source_chunks.observe(now_ns() - start, emitted.records_out - before)
            if status is _MORE:
                if flush_wait_ns >= 0:
                    flush_due()
                continue
            if status is _END:
                return
            if flush_wait_ns >= 0:  # -1: not even an idle task sends a partly filled batch
                for writer in writers:
                    writer.flush()
            until_timer = timers.delay_until_next_ms()
            metrics.wait_idle(
                wakeup, idle_wait if until_timer is None else min(idle_wait, until_timer / 1000)
            )

    @staticmethod
    def _outputs_available(writers: list[RecordWriter]) -> bool:
        for writer in writers:
            if not writer.is_available():
                return False
        return True

    def _process_mails(self) -> None:
        """Run the mails queued now; mails they queue wait until after the next batch
        (a long job split into mails, like serializing a snapshot, interleaves with records)."""
        for _ in range(self.mailbox.size()):
            mail = self.mailbox.try_take()
            if mail is None:
                return
            mail.action()

    def _process_input(self, head: StreamOperator) -> InputStatus:
        checkpointed_input = self.checkpointed_input
        assert checkpointed_input is not None
        polled = checkpointed_input.poll_next()
        if polled is None:
            return _END if checkpointed_input.is_end_of_data() else _NOTHING
        item = polled[1]
        if isinstance(item, RuntimeEvent):
            self._forward_event(head, item)
            return _MORE
        self.metrics.head.records_in += len(item)
        head.process_batch(item)
        return _MORE

    def _process_input_in_chunks(self, head: StreamOperator) -> InputStatus:
        """As :meth:`_process_input` (and :meth:`_process_two_inputs`) with unaligned checkpoints
        enabled: a batch expected to be slow goes to the head in chunks, and priority barriers
        that arrive meanwhile are handled between them."""
        checkpointed_input, chunked = self.checkpointed_input, self._chunked
        assert checkpointed_input is not None and chunked is not None
        polled = checkpointed_input.poll_next()
        if polled is not None and not isinstance(polled[1], RuntimeEvent):
            channel, batch = polled
            self.metrics.head.records_in += len(batch)
            chunked.process(self._batch_input(head, channel), channel, batch)
            return _MORE
        if polled is not None:  # a watermark or watermark status the valve forwards
            self._forward_event(head, polled[1])
            return _MORE
        return _END if checkpointed_input.is_end_of_data() else _NOTHING

    def _batch_input(self, head: StreamOperator, channel: int) -> Callable[[Any], None]:
        """Where a batch of ``channel`` goes: the head, or the input of a two-input head that
        the channel belongs to."""
        if not isinstance(head, TwoInputStreamOperator):
            return head.process_batch
        return head.process_batch1 if self._input_types[channel] == 1 else head.process_batch2

    def _forward_event(self, head: StreamOperator, event: RuntimeEvent) -> None:
        """What the watermark valve forwards (a watermark, or the input going idle or
        active again) goes to the head operator."""
        if type(event) is Watermark:
            self.metrics.head.input_watermark = event.timestamp
            head.process_watermark(event.timestamp)
        else:
            head.process_watermark_status(event.idle)  # type: ignore[attr-defined]

    def _process_two_inputs(self, head: StreamOperator) -> InputStatus:
        """As :meth:`_process_input`, for a two-input head: a batch goes to the input its
        channel belongs to. Events are the same for both inputs: the gate aligns barriers
        across every channel and the valve takes the minimum watermark over all of them."""
        checkpointed_input = self.checkpointed_input
        assert checkpointed_input is not None
        polled = checkpointed_input.poll_next()
        if polled is None:
            return _END if checkpointed_input.is_end_of_data() else _NOTHING
        channel, item = polled
        if isinstance(item, RuntimeEvent):
            self._forward_event(head, item)
            return _MORE
        self.metrics.head.records_in += len(item)
        if self._input_types[channel] == 1:
            head.process_batch1(item)  # type: ignore[attr-defined]
        else:
            head.process_batch2(item)  # type: ignore[attr-defined]
        return _MORE


def _operator_of(exc: BaseException) -> str | None:
    """The innermost operator on the traceback: the one whose user code raised."""
    found: str | None = None
    tb: types.TracebackType | None = exc.__traceback__
    while tb is not None:
        owner: Any = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, StreamOperator):
            found = owner.name
        tb = tb.tb_next
    return found
