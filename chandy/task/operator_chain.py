"""The operators of one task, wired output to input.

Inside a chain an operator's output *is* the next operator's ``process_batch``
(a bound method): a batch goes down the chain as nested calls, with no copy,
no queue and no thread switch. Where a node feeds several consumers the batch
is handed to each in turn; the receivers never mutate their input list.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chandy.network.events import ACTIVE, IDLE, Watermark
from chandy.state.backend import KeyedStateBackend, KeyedStateSnapshot
from chandy.state.columnar import ColumnarKeyedStateBackend
from chandy.state.factory import keyed_state_backend_factory
from chandy.state.handles import OperatorStateMeta
from chandy.state.key_groups import KeyGroupRange
from chandy.state.unpickling import UnpicklingPolicy
from chandy.storage.checkpoint_storage import StateReader
from chandy.task.deployment import OperatorSpec, TaskDeploymentDescriptor
from chandy.task.mailbox import Mailbox
from chandy.task.metrics import (
    OperatorCounters,
    TaskMetrics,
    counting_input,
    counting_output,
    watermark_input,
    watermark_output,
)
from chandy.task.operators.base import (
    Emit,
    StateInitializationContext,
    StateSnapshotContext,
    StreamOperator,
)
from chandy.task.processing_time import ProcessingTimeService
from chandy.task.record_writer import RecordWriter
from chandy.task.runtime_context import StreamingRuntimeContext
from chandy.task.services import TaskServices
from chandy.task.user_code import unpickling_policy

log = logging.getLogger(__name__)


def _fan_out(targets: Sequence[Callable[[Any], None]]) -> Callable[[Any], None]:
    """One call that hands its argument to every target in turn (a batch, a watermark, a status)."""
    if not targets:
        return lambda item: None
    if len(targets) == 1:
        return targets[0]
    fixed = tuple(targets)

    def emit(item: Any) -> None:
        for target in fixed:
            target(item)

    return emit


def _broadcast_watermark(writer: RecordWriter) -> Callable[[int], None]:
    def emit(timestamp: int) -> None:
        writer.broadcast_event(Watermark(timestamp))

    return emit


def _broadcast_status(writer: RecordWriter) -> Callable[[bool], None]:
    def emit(idle: bool) -> None:
        writer.broadcast_event(IDLE if idle else ACTIVE)

    return emit


def _describe_operator(spec: OperatorSpec) -> str:
    uid = f"uid '{spec.uid}'" if spec.uid is not None else "no uid"
    return f"operator '{spec.name}' ({uid})"


@dataclass
class OperatorSnapshot:
    """The synchronous part of one operator's checkpoint, to be written asynchronously."""

    operator_id: str
    keyed: KeyedStateSnapshot | None
    operator: tuple[bytes, dict[str, OperatorStateMeta]] | None

    def release(self) -> None:
        if self.keyed is not None:
            self.keyed.release()


class OperatorChain:
    """Builds, wires and drives the lifecycle of a task's operators."""

    def __init__(
        self,
        tdd: TaskDeploymentDescriptor,
        writers: Sequence[RecordWriter],
        services: TaskServices,
        should_abort: Callable[[], bool],
        processing_time_service: ProcessingTimeService | None = None,
        metrics: TaskMetrics | None = None,
        mailbox: Mailbox | None = None,
    ) -> None:
        self.tdd = tdd
        self.processing_time_service = processing_time_service or ProcessingTimeService(services.clock)
        self.specs = tdd.operators
        self.operators: dict[int, StreamOperator] = {}
        for spec in self.specs:
            operator = spec.factory()
            operator.name = spec.name
            operator.operator_id = spec.operator_id
            operator.operator_state_backend.owner = _describe_operator(spec)
            self.operators[spec.node_id] = operator
        #: Records and watermarks in and out of each operator, counted per batch (see task.metrics).
        self.counters = {spec.node_id: OperatorCounters(spec.operator_id, spec.name) for spec in self.specs}
        counters = self.counters

        def chained_input(node_id: int) -> Emit:
            return counting_input(self.operators[node_id].process_batch, counters[node_id])

        key_group_range = KeyGroupRange.of_operator(tdd.max_parallelism, tdd.parallelism, tdd.subtask_index)
        create_backend = keyed_state_backend_factory(tdd.config, services.state_resources, tdd.subtask_index)
        tails: list[OperatorCounters] = []
        # Wire from the tail so that every target exists before its source is set up.
        for spec in reversed(self.specs):
            operator = self.operators[spec.node_id]
            mine = counters[spec.node_id]
            targets: list[Emit] = [chained_input(n) for n in spec.chained_outputs]
            targets += [writers[i].emit_batch for i in spec.network_outputs]
            for i in itertools.chain(spec.network_outputs, *(network for _, _, network in spec.side_outputs)):
                writers[i].producer, writers[i].consumer = (
                    _describe_operator(spec),
                    tdd.outputs[i].target_name,
                )
            # Watermarks and statuses go everywhere records go, side outputs included.
            consumers = list(spec.chained_outputs)
            network = [writers[i] for i in spec.network_outputs]
            side: dict[str, Emit] = {}
            for tag_id, chained, network_indexes in spec.side_outputs:
                side[tag_id] = counting_output(
                    _fan_out(
                        [chained_input(n) for n in chained] + [writers[i].emit_batch for i in network_indexes]
                    ),
                    mine,
                )
                consumers += chained
                network += [writers[i] for i in network_indexes]
            if not consumers:
                tails.append(mine)
            backend: KeyedStateBackend | None = None
            if spec.keyed:
                # A keyed batch operator keeps its state in columns, whatever state.backend.type says.
                make_backend = ColumnarKeyedStateBackend if operator.columnar_state else create_backend
                backend = make_backend(
                    key_group_range, tdd.max_parallelism, _describe_operator(spec), services.clock
                )
            context = StreamingRuntimeContext(
                job_id=tdd.job_id,
                job_name=tdd.job_name,
                task_name=tdd.task_name,
                operator_name=spec.name,
                subtask_index=tdd.subtask_index,
                parallelism=tdd.parallelism,
                max_parallelism=tdd.max_parallelism,
                attempt_number=tdd.attempt_number,
                job_parameters=tdd.config,
                keyed_state_backend=backend,
                metric_group=mine.user_metrics,
            )
            operator.setup(context, counting_output(_fan_out(targets), mine))
            operator.side_outputs = side
            operator.emit_watermark = watermark_output(
                _fan_out(
                    [watermark_input(self.operators[n].process_watermark, counters[n]) for n in consumers]
                    + [_broadcast_watermark(w) for w in network]
                ),
                mine,
            )
            operator.emit_watermark_status = _fan_out(
                [self.operators[n].process_watermark_status for n in consumers]
                + [_broadcast_status(w) for w in network]
            )
            operator.processing_time_service = self.processing_time_service
            operator.mailbox = mailbox
            operator.bind_task_services(services, should_abort)
        self.head = self.operators[self.specs[0].node_id]
        self._unpickling: UnpicklingPolicy | None = None
        if metrics is not None:
            metrics.bind_chain([counters[spec.node_id] for spec in self.specs], tails[::-1])
        self._opened: list[StreamOperator] = []
        if tdd.task_restore is not None:
            try:
                self._restore(tdd, StateReader(services.checkpoint_storage))
            except BaseException:
                # The task never gets this chain to close: its state backends (a RocksDB
                # database and its directory) are disposed of here.
                self.close()
                raise

    def unpickling_policy(self) -> UnpicklingPolicy:
        """What the restore may unpickle (:mod:`chandy.state.unpickling`): the fixed
        allowlist, the classes of the job's own modules (read off this chain's operators)
        and the configured modules. Found once, at the first restore that needs it."""
        if self._unpickling is None:
            self._unpickling = unpickling_policy(self.tdd.config, self.operators.values())
        return self._unpickling

    def _restore(self, tdd: TaskDeploymentDescriptor, reader: StateReader) -> None:
        """Load this subtask's share of the restored checkpoint into every operator (read
        with ``reader``: the job's storage knows how to reach an ``s3://`` checkpoint)."""
        assert tdd.task_restore is not None
        states = tdd.task_restore.state.subtask_states
        policy = self.unpickling_policy()
        for spec in self.specs:
            state = states.get(spec.operator_id)
            if state is None:
                continue
            operator = self.operators[spec.node_id]
            backend = operator.runtime_context.keyed_state_backend if operator.runtime_context else None
            if state.managed_keyed_state:
                if not isinstance(backend, KeyedStateBackend):
                    raise RuntimeError(
                        f"operator '{spec.name}' has keyed state in the checkpoint "
                        "but is not on a keyed stream any more"
                    )
                backend.restore(state.managed_keyed_state, reader, policy)
            operator.operator_state_backend.restore(
                [(h.states, h.delegate) for h in state.managed_operator_state], reader.read, policy
            )

    def in_order(self) -> list[StreamOperator]:
        """Operators head first (topological order)."""
        return [self.operators[spec.node_id] for spec in self.specs]

    def initialize_state_and_open(self) -> None:
        """Tail first, so every operator's consumers are ready before it emits:
        ``initialize_state`` (restore) then ``open`` for each operator."""
        restore = self.tdd.task_restore
        restored = restore.checkpoint_id if restore else None
        in_checkpoint = set(restore.state.subtask_states) if restore else set()
        for spec in reversed(self.specs):
            operator = self.operators[spec.node_id]
            operator.initialize_state(
                StateInitializationContext(
                    operator.operator_state_backend,
                    restored,
                    operator_restored=spec.operator_id in in_checkpoint,
                )
            )
            operator.open()
            self._opened.append(operator)

    # -- checkpoints ----------------------------------------------------------

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        for operator in self.in_order():
            operator.prepare_snapshot_pre_barrier(checkpoint_id)

    def snapshot_state(
        self,
        checkpoint_id: int,
        timestamp: int,
        *,
        canonical: bool = False,
        native: bool = False,
        base_checkpoint_id: int | None = None,
    ) -> list[OperatorSnapshot]:
        """The synchronous part: each operator's own snapshot hook, then the keyed state
        backend's synchronous snapshot (``canonical`` for a savepoint any backend restores,
        ``native`` for a NATIVE savepoint in the backend's own format;
        an incremental one references only files of ``base_checkpoint_id``, the barrier's
        base) and serialized operator state."""
        context = StateSnapshotContext(checkpoint_id, timestamp)
        taken: list[OperatorSnapshot] = []
        try:
            for spec in self.specs:
                operator = self.operators[spec.node_id]
                operator.snapshot_state(context)
                backend = operator.runtime_context.keyed_state_backend if operator.runtime_context else None
                keyed = (
                    backend.snapshot(
                        checkpoint_id,
                        canonical=canonical,
                        native=native,
                        base_checkpoint_id=base_checkpoint_id,
                    )
                    if isinstance(backend, KeyedStateBackend) and backend.has_state()
                    else None
                )
                taken.append(
                    OperatorSnapshot(spec.operator_id, keyed, operator.operator_state_backend.snapshot())
                )
        except BaseException:
            for snapshot in taken:
                snapshot.release()
            raise
        return taken

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for operator in self.in_order():
            backend = self._keyed_backend(operator)
            if backend is not None:  # first: an incremental backend confirms its uploads
                backend.notify_checkpoint_complete(checkpoint_id)
            operator.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        for operator in self.in_order():
            backend = self._keyed_backend(operator)
            if backend is not None:
                backend.notify_checkpoint_aborted(checkpoint_id)
            operator.notify_checkpoint_aborted(checkpoint_id)

    @staticmethod
    def _keyed_backend(operator: StreamOperator) -> KeyedStateBackend | None:
        context = operator.runtime_context
        return context.keyed_state_backend if context is not None else None

    def end_input(self, *, final_checkpoint: bool = False) -> None:
        """Input ended: tell the head, then let every operator flush, head first.

        ``final_checkpoint``: the task takes a checkpoint after this and waits for its
        completion before it ends, so an operator may leave its last external commit to that
        checkpoint (see :attr:`StreamOperator.final_checkpoint_follows`)."""
        for operator in self.in_order():
            operator.final_checkpoint_follows = final_checkpoint
        self.head.end_input()
        for operator in self.in_order():
            operator.finish()

    def close(self) -> BaseException | None:
        """Close every opened operator, even if some fail; returns the first error."""
        first: BaseException | None = None
        while self._opened:
            operator = self._opened.pop()
            try:
                operator.close()
            except Exception as exc:  # noqa: BLE001 - every operator must get its close()
                log.warning("closing operator %s failed: %r", operator.name, exc)
                first = first or exc
        for operator in self.operators.values():
            ctx = operator.runtime_context
            if ctx is not None and ctx.keyed_state_backend is not None:
                ctx.keyed_state_backend.dispose()
        return first
