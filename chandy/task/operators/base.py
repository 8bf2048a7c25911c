"""The operator contract.

An operator consumes whole batches: ``process_batch`` is called once per batch
that arrives, and emits whole batches to its output, which is the next
operator's ``process_batch`` inside a chain or a record writer at the end of
it. Per-record work is a plain Python loop inside one call.

Event time: ``process_watermark(timestamp)`` is called when the watermark of the
operator's input advances (the minimum over its input channels, or the head
operator's predecessor in the chain); the default forwards it. An operator that
holds event-time timers fires the due ones first, then forwards, so everything
a watermark completes is emitted before the watermark itself. Batches may carry
timestamps (see :mod:`chandy.task.batches`); an operator that keeps them checks
the batch type once per batch.

Side outputs: ``self.side_outputs`` maps an :class:`~chandy.core.output_tag.OutputTag`
id to where that side output goes; a tag nobody consumes is absent (its records
are dropped, as in Flink).

Lifecycle, in Flink's order: ``setup`` -> ``initialize_state`` (restore) ->
``open`` -> ``process_batch``* -> ``end_input`` -> ``finish`` (flush what is
buffered) -> ``close`` (release). ``close`` also runs when the task is
cancelled or fails. Between two batches the task may call
``prepare_snapshot_pre_barrier``, ``snapshot_state`` (the synchronous part of a
checkpoint), ``notify_checkpoint_complete`` and ``notify_checkpoint_aborted``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chandy.core.functions import (
    CheckpointedFunction,
    CheckpointListener,
    Function,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    OperatorStateStore,
)
from chandy.core.state import ListStateDescriptor, MapStateDescriptor
from chandy.core.time import MIN_TIMESTAMP
from chandy.state.operator_state import HeapBroadcastState, OperatorListState, OperatorStateBackend
from chandy.task.mailbox import Mailbox
from chandy.task.processing_time import ProcessingTimeService
from chandy.task.runtime_context import StreamingRuntimeContext

#: Where an operator sends its output batches (a list, or a TimestampedBatch: see chandy.task.batches).
Emit = Callable[[Any], None]


def _discard(records: list[Any]) -> None:
    pass


def _discard_watermark(timestamp: int) -> None:
    pass


def _discard_status(idle: bool) -> None:
    pass


class StateInitializationContext(FunctionInitializationContext, OperatorStateStore):
    """What an operator (and its user function) gets in ``initialize_state``."""

    def __init__(
        self,
        operator_state_backend: OperatorStateBackend,
        restored_checkpoint_id: int | None,
        *,
        operator_restored: bool | None = None,
    ) -> None:
        self._backend = operator_state_backend
        self._restored_checkpoint_id = restored_checkpoint_id
        self._operator_restored = (
            restored_checkpoint_id is not None if operator_restored is None else operator_restored
        )

    def is_restored(self) -> bool:
        """The job starts from a checkpoint or savepoint, as in Flink: true for every operator
        of a restored job, one new in it (absent from the checkpoint) too."""
        return self._restored_checkpoint_id is not None

    def is_operator_restored(self) -> bool:
        """This operator was in the restored checkpoint (with or without state for this
        subtask). False for an operator added to the job since, which starts afresh: a new
        source plans its own splits instead of reading the none it was given."""
        return self._operator_restored

    def get_restored_checkpoint_id(self) -> int | None:
        return self._restored_checkpoint_id

    def get_operator_state_store(self) -> OperatorStateStore:
        return self

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> OperatorListState:
        return self._backend.get_list_state(state_descriptor)

    def get_union_list_state(self, state_descriptor: ListStateDescriptor) -> OperatorListState:
        return self._backend.get_union_list_state(state_descriptor)

    def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> HeapBroadcastState:
        return self._backend.get_broadcast_state(state_descriptor)


class StateSnapshotContext(FunctionSnapshotContext):
    """What an operator (and its user function) gets in ``snapshot_state``."""

    def __init__(self, checkpoint_id: int, timestamp: int) -> None:
        self._checkpoint_id = checkpoint_id
        self._timestamp = timestamp

    def get_checkpoint_id(self) -> int:
        return self._checkpoint_id

    def get_checkpoint_timestamp(self) -> int:
        return self._timestamp


class StreamOperator:
    """Base class of every operator."""

    #: True when the input is a keyed stream: records arrive as ``(key_group, key, value)``.
    keyed = False
    #: A keyed operator of the batch path: its keyed state backend is the columnar one
    #: (``chandy.state.columnar``), whatever ``state.backend.type`` says.
    columnar_state = False

    def __init__(self) -> None:
        self.name = type(self).__name__
        self.operator_id = ""
        self.output: Emit = _discard
        #: Where this operator's watermarks and idleness changes go (wired by the chain).
        self.emit_watermark: Callable[[int], None] = _discard_watermark
        self.emit_watermark_status: Callable[[bool], None] = _discard_status
        #: Side outputs by tag id (wired by the chain; an unconsumed tag is absent).
        self.side_outputs: dict[str, Emit] = {}
        #: The latest watermark this operator received.
        self.current_watermark = MIN_TIMESTAMP
        #: The task's processing-time service (set by the chain before ``open``).
        self.processing_time_service: ProcessingTimeService | None = None
        #: The task's mailbox (set by the chain before ``open``): an operator that learns of
        #: work on another thread (an async I/O result) puts a mail here, and the task thread
        #: runs it between batches, never concurrently with records or snapshots.
        self.mailbox: Mailbox | None = None
        self.runtime_context: StreamingRuntimeContext | None = None
        self.operator_state_backend = OperatorStateBackend()
        #: Set before ``finish``: a checkpoint will be taken after ``finish`` and its completion
        #: notified before the task ends (Flink's final checkpoint). A two-phase-commit sink
        #: then leaves its last transaction to that checkpoint instead of committing it in
        #: ``finish``: a commit no completed checkpoint accounts for would be repeated by the
        #: replay after a failover that restores an earlier checkpoint.
        self.final_checkpoint_follows = False

    def setup(self, runtime_context: StreamingRuntimeContext, output: Emit) -> None:
        """Bind to the task: context (and keyed state backend) and output."""
        self.runtime_context = runtime_context
        self.output = output

    def bind_task_services(self, services: Any, should_abort: Callable[[], bool]) -> None:
        """Operators that talk to the hosting process (the collect sink) take its services here."""

    def initialize_state(self, context: StateInitializationContext) -> None:
        """Restore (or create) operator state; runs before ``open``."""

    def open(self) -> None:
        """Ready to process (user functions' ``open`` runs here)."""

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        """About to forward checkpoint ``checkpoint_id``'s barrier: emit what must precede it."""

    def snapshot_state(self, context: StateSnapshotContext) -> None:
        """Write into operator state what must survive (synchronous part of a checkpoint)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` (and every earlier one) is complete."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will not complete."""

    def process_batch(self, records: list[Any]) -> None:
        """Process one input batch. Every operator with an input overrides this; a
        source operator has none, and a batch reaching it is a wiring bug."""
        raise TypeError(f"{type(self).__name__} has no input, yet received a batch")

    def process_watermark(self, timestamp: int) -> None:
        """The input's watermark advanced to ``timestamp``: nothing older will arrive."""
        self.current_watermark = timestamp
        self.emit_watermark(timestamp)

    def process_watermark_status(self, idle: bool) -> None:
        """The input became idle (``True``: it does not hold back the watermark) or active."""
        self.emit_watermark_status(idle)

    def end_input(self) -> None:
        """Every input channel has ended."""

    def finish(self) -> None:
        """No more input: emit anything still buffered."""

    def close(self) -> None:
        """Release resources; runs on success, failure and cancellation alike."""


class TwoInputStreamOperator(StreamOperator):
    """An operator with two inputs (``connect``): Flink's ``TwoInputStreamOperator``.

    The task reads the channels of both inputs from one input gate in one mailbox loop and
    hands each batch to ``process_batch1`` or ``process_batch2`` by the channel it came from.
    Everything else is shared: one barrier alignment over the channels of both inputs (so a
    checkpoint cuts both streams consistently), one watermark (the minimum over the active
    channels of both inputs, which is Flink's minimum of the two inputs' watermarks), one keyed
    state backend and one timer service when the operator is keyed. ``end_input`` runs once,
    when both inputs have ended.
    """

    def process_batch(self, records: list[Any]) -> None:
        raise TypeError(
            f"{type(self).__name__} has two inputs: a batch must go to process_batch1 or process_batch2"
        )

    def process_batch1(self, records: Any) -> None:
        """One batch of the first input (a list, a TimestampedBatch, or a KeyedBatch when keyed)."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_batch1")

    def process_batch2(self, records: Any) -> None:
        """One batch of the second input."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_batch2")


class UdfOperator(StreamOperator):
    """An operator around a user function (a :class:`Function` or a plain callable)."""

    def __init__(self, user_function: Any) -> None:
        super().__init__()
        self.user_function = user_function

    def initialize_state(self, context: StateInitializationContext) -> None:
        if isinstance(self.user_function, CheckpointedFunction):
            self.user_function.initialize_state(context)

    def open(self) -> None:
        if isinstance(self.user_function, Function):
            assert self.runtime_context is not None
            self.user_function.open(self.runtime_context)

    def snapshot_state(self, context: StateSnapshotContext) -> None:
        if isinstance(self.user_function, CheckpointedFunction):
            self.user_function.snapshot_state(context)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if isinstance(self.user_function, CheckpointListener):
            self.user_function.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if isinstance(self.user_function, CheckpointListener):
            self.user_function.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> None:
        if isinstance(self.user_function, Function):
            self.user_function.close()


def resolve_call(user_function: object, method: str) -> Callable[..., Any]:
    """The callable to invoke: ``user_function.<method>`` for a function class, else itself."""
    bound: Callable[..., Any] | None = getattr(user_function, method, None)
    if bound is not None and isinstance(user_function, Function):
        return bound
    if callable(user_function):
        return user_function
    raise TypeError(f"{user_function!r} is neither callable nor has a '{method}' method")
