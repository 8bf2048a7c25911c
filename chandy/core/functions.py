"""User functions: the interfaces a pipeline's code implements.

Names follow PyFlink's DataStream API. Every operator also accepts a plain
callable (``ds.map(lambda x: x + 1)``); a class is needed only to use
``open(runtime_context)`` / ``close()`` or keyed state.

``process_element`` may ``yield`` any number of outputs (as in PyFlink), return
an iterable, or return ``None`` for no output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeAlias, TypeVar

from chandy.core.metrics import MetricGroup
from chandy.core.state import (
    AggregatingState,
    AggregatingStateDescriptor,
    BroadcastState,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReadOnlyBroadcastState,
    ReducingState,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueState,
    ValueStateDescriptor,
)
from chandy.core.time import TimeDomain

W = TypeVar("W")
#: PyFlink's type parameters of the window functions (they only document, as in PyFlink).
IN = TypeVar("IN")
OUT = TypeVar("OUT")
KEY = TypeVar("KEY")
W2 = TypeVar("W2")
#: The broadcast process functions' input types (PyFlink's; they only document).
IN1 = TypeVar("IN1")
IN2 = TypeVar("IN2")


class KeyedStateStore(ABC):
    """Where keyed state handles come from (a runtime context, a window's state)."""

    @abstractmethod
    def get_state(self, state_descriptor: ValueStateDescriptor) -> ValueState:
        """The current key's value state for this descriptor. Call it in ``open()`` and keep the handle: it
        always reads and writes the key of the record being processed."""

    @abstractmethod
    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        """The current key's list state for this descriptor."""

    @abstractmethod
    def get_map_state(self, state_descriptor: MapStateDescriptor) -> MapState:
        """The current key's map state for this descriptor."""

    @abstractmethod
    def get_reducing_state(self, state_descriptor: ReducingStateDescriptor) -> ReducingState:
        """The current key's reducing state for this descriptor: values added are folded by its reduce
        function."""

    @abstractmethod
    def get_aggregating_state(self, state_descriptor: AggregatingStateDescriptor) -> AggregatingState:
        """The current key's aggregating state for this descriptor: values added are folded by its
        ``AggregateFunction``."""


class TimerService(ABC):
    """Time and timers as a process function sees them (PyFlink's ``TimerService``).

    Timers are scoped to the key of the record (or timer) being processed, and a
    (key, timestamp) pair holds at most one timer of each kind: registering it
    twice fires it once. They are keyed state: checkpointed with the barrier and
    restored (on another subtask after rescaling) with their key.
    """

    @abstractmethod
    def current_processing_time(self) -> int:
        """Wall-clock milliseconds since the epoch."""

    @abstractmethod
    def current_watermark(self) -> int:
        """The operator's current event-time watermark."""

    @abstractmethod
    def register_processing_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer`` when processing time reaches ``timestamp``."""

    @abstractmethod
    def register_event_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer`` when the watermark reaches ``timestamp``."""

    @abstractmethod
    def delete_processing_time_timer(self, timestamp: int) -> None:
        """Remove the current key's processing-time timer at ``timestamp`` (nothing happens if there is
        none)."""

    @abstractmethod
    def delete_event_time_timer(self, timestamp: int) -> None:
        """Remove the current key's event-time timer at ``timestamp`` (nothing happens if there is none)."""


class RuntimeContext(KeyedStateStore):
    """What a running function knows about where it runs, and its keyed state.

    The ``get_*_state`` methods are only available in functions applied to a
    :class:`~chandy.api.datastream.KeyedStream`; anywhere else they raise a clear error.
    """

    @abstractmethod
    def get_task_name(self) -> str:
        """The name of the task (the chain of operators) this function runs in."""

    @abstractmethod
    def get_number_of_parallel_subtasks(self) -> int:
        """The operator's parallelism."""

    @abstractmethod
    def get_max_number_of_parallel_subtasks(self) -> int:
        """The operator's max parallelism: its number of key groups."""

    @abstractmethod
    def get_index_of_this_subtask(self) -> int:
        """This subtask's index, from 0 to parallelism - 1."""

    @abstractmethod
    def get_attempt_number(self) -> int:
        """0 on the first run, then one more after every restart of the job."""

    def get_task_name_with_subtasks(self) -> str:
        """The task's name with this subtask's number, ``name (2/4)``, as logs and the dashboard show it."""
        return (
            f"{self.get_task_name()} ({self.get_index_of_this_subtask() + 1}"
            f"/{self.get_number_of_parallel_subtasks()})"
        )

    @abstractmethod
    def get_job_parameter(self, key: str, default_value: str | None = None) -> str | None:
        """A value from the job's configuration, or ``default_value``."""

    @abstractmethod
    def get_metrics_group(self) -> MetricGroup:
        """The operator's metric group: counters, gauges, meters, distributions and
        histograms registered in it are reported with the task's metrics (REST API,
        Prometheus), under ``<subtask>.<operator>.<groups...>.<name>``."""


class Function:
    """Base of every user function class: optional lifecycle hooks."""

    def open(self, runtime_context: RuntimeContext) -> None:
        """Called once per subtask before the first record (and again after a restart)."""

    def close(self) -> None:
        """Called once per subtask after the last record, or when the task is cancelled."""


class MapFunction(Function):
    """Turns each record into exactly one record (``stream.map``)."""

    @abstractmethod
    def map(self, value: Any) -> Any:
        """The output for one record."""


class FlatMapFunction(Function):
    """Turns each record into any number of records (``stream.flat_map``)."""

    @abstractmethod
    def flat_map(self, value: Any) -> Iterable[Any] | None:
        """Yield (or return an iterable of) any number of outputs."""


class FilterFunction(Function):
    """Keeps the records for which ``filter`` is true (``stream.filter``)."""

    @abstractmethod
    def filter(self, value: Any) -> bool:
        """Whether the record is kept."""


class ReduceFunction(Function):
    """Folds two records of the same key (or window) into one (``reduce``); it should be associative."""

    @abstractmethod
    def reduce(self, value1: Any, value2: Any) -> Any:
        """The combination of the value so far and the next record."""


class KeySelector(Function):
    """Picks a record's key (``key_by``): records with equal keys go to the same subtask and share keyed
    state."""

    @abstractmethod
    def get_key(self, value: Any) -> Any:
        """The record's key: hashable, and the same for the same record in every process (a restore finds
        state by it)."""


class Partitioner(Function):
    """Chooses the subtask of the next operator for a key (``DataStream.partition_custom``).

    ``partition`` runs in the producing task for every record, so keep it cheap. Unlike
    PyFlink's, ``open`` and ``close`` are not called: the partitioner runs in the network
    output, outside any operator (as Flink's Java ``Partitioner``, which has neither).
    """

    @abstractmethod
    def partition(self, key: Any, num_partitions: int) -> int:
        """The partition (an int in ``[0, num_partitions)``) of ``key``."""


class ProcessFunction(Function):
    """A function over every record of a (non-keyed) stream.

    Yield ``(output_tag, value)`` to emit ``value`` to a side output.
    """

    class Context(ABC):
        """What ``process_element`` sees beside the record: its timestamp and the timer service (the
        watermark and the clock; timers need a keyed stream). Side outputs are yielded."""

        @abstractmethod
        def timestamp(self) -> int | None:
            """The record's event timestamp, or ``None`` when it carries none."""

        @abstractmethod
        def timer_service(self) -> TimerService:
            """Time queries; setting timers needs a keyed stream (a clear error here)."""

    @abstractmethod
    def process_element(self, value: Any, ctx: ProcessFunction.Context) -> Iterable[Any] | None:
        """Called for each record with ``ctx`` (its timestamp, the watermark); yield (or return) outputs, or
        ``(output_tag, value)`` for a side output."""


class KeyedProcessFunction(Function):
    """A function over every record of a keyed stream, with keyed state and timers.

    Yield ``(output_tag, value)`` to emit ``value`` to a side output.
    """

    class Context(ABC):
        """What ``process_element`` sees beside the record: its timestamp, its key and the timer service for
        that key."""

        @abstractmethod
        def timestamp(self) -> int | None:
            """The record's event timestamp (in ``on_timer``: the timer's), or ``None``."""

        @abstractmethod
        def get_current_key(self) -> Any:
            """The key of the record (or timer) being processed."""

        @abstractmethod
        def timer_service(self) -> TimerService:
            """Query time and set timers for the current key."""

    class OnTimerContext(Context):
        """What ``on_timer`` sees: the timer's time domain, its key and the timer service."""

        @abstractmethod
        def time_domain(self) -> TimeDomain:
            """Whether the firing timer was set in event time or processing time."""

    @abstractmethod
    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterable[Any] | None:
        """Called for each record, with its key's state and ``ctx`` (timestamp, current key, timer service);
        yield (or return) outputs, or ``(output_tag, value)`` for a side output."""

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterable[Any] | None:
        """A timer set through ``ctx.timer_service()`` fired; yield outputs as in
        ``process_element``."""
        return None


class CoMapFunction(Function):
    """A map over two connected streams (``ds1.connect(ds2).map(f)``): ``map1`` for each
    record of the first, ``map2`` for each of the second, one instance for both, so the two
    may share state. A ``None`` result emits nothing (PyFlink's behaviour). On connected
    keyed streams both may use keyed state, scoped to the record's key."""

    @abstractmethod
    def map1(self, value: Any) -> Any:
        """The output for a record of the first input."""

    @abstractmethod
    def map2(self, value: Any) -> Any:
        """The output for a record of the second input."""


class CoFlatMapFunction(Function):
    """A flat map over two connected streams: ``flat_map1`` / ``flat_map2`` yield (or return
    an iterable of) any number of outputs for a record of the first / second stream."""

    @abstractmethod
    def flat_map1(self, value: Any) -> Iterable[Any] | None:
        """Called for each record of the first input; yield (or return) any number of outputs."""

    @abstractmethod
    def flat_map2(self, value: Any) -> Iterable[Any] | None:
        """Called for each record of the second input; yield (or return) any number of outputs."""


class CoProcessFunction(Function):
    """A function over the records of two connected streams (``connect(...).process(f)``).

    Its context is a :class:`ProcessFunction`'s (``timestamp()``, ``timer_service()``);
    setting timers needs keyed inputs. On two keyed streams it runs as keyed (keyed state
    works, as in PyFlink), though only a :class:`KeyedCoProcessFunction` has ``on_timer``.
    Yield ``(output_tag, value)`` to emit ``value`` to a side output.
    """

    #: The context of ``process_element1/2``: the same as a ProcessFunction's.
    Context: TypeAlias = ProcessFunction.Context

    @abstractmethod
    def process_element1(self, value: Any, ctx: ProcessFunction.Context) -> Iterable[Any] | None:
        """A record of the first stream; yield outputs."""

    @abstractmethod
    def process_element2(self, value: Any, ctx: ProcessFunction.Context) -> Iterable[Any] | None:
        """A record of the second stream; yield outputs."""


class KeyedCoProcessFunction(Function):
    """A function over two connected keyed streams (``ds1.connect(ds2).key_by(k1, k2)``, or
    the connection of two ``KeyedStream``\\ s) with keyed state and timers shared by both:
    a record of either input, and a timer, sees the state of its key, whichever input set it.

    Yield ``(output_tag, value)`` to emit ``value`` to a side output.
    """

    #: The contexts are a KeyedProcessFunction's: they offer the same.
    Context: TypeAlias = KeyedProcessFunction.Context
    OnTimerContext: TypeAlias = KeyedProcessFunction.OnTimerContext

    @abstractmethod
    def process_element1(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterable[Any] | None:
        """A record of the first stream; yield outputs."""

    @abstractmethod
    def process_element2(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterable[Any] | None:
        """A record of the second stream; yield outputs."""

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterable[Any] | None:
        """A timer set through ``ctx.timer_service()`` (for either input) fired; yield outputs."""
        return None


class SinkFunction(Function):
    """Writes records somewhere outside the job (``ds.add_sink(f)``)."""

    class Context(ABC):
        """What ``invoke`` sees beside the record: its timestamp."""

        @abstractmethod
        def timestamp(self) -> int | None:
            """The record's event timestamp, or ``None`` when it has none."""

    @abstractmethod
    def invoke(self, value: Any, context: SinkFunction.Context) -> None:
        """Called for each record that reaches the sink. Writes here are at-least-once at best; a ``Sink``
        (``sink_to``) commits with the checkpoints for exactly once."""

    def finish(self) -> None:
        """Called once when the input has ended (a bounded job), before ``close()``."""


class AsyncFunction(Function, Generic[IN, OUT]):
    """A request to another system per record, without waiting for it (PyFlink's
    ``AsyncFunction``; apply it with ``AsyncDataStream.unordered_wait``/``ordered_wait``).

    ``async_invoke`` is a coroutine run on an asyncio event loop the operator owns (one
    thread per subtask), so up to ``capacity`` requests are in flight at once. It returns
    the record's outputs as a list (``[]`` for none); raising fails the job, which then
    restarts from its latest checkpoint, where the requests that were in flight are kept
    and are sent again. ``open``, ``close`` and ``timeout`` run on the task's thread.
    """

    @abstractmethod
    async def async_invoke(self, value: IN) -> list[OUT]:
        """Send the request for ``value`` and return its outputs."""

    def timeout(self, value: IN) -> list[OUT]:
        """The outputs of a request that did not complete in time; by default the job fails."""
        raise TimeoutError("Async function call has timed out for input: " + str(value))


class OperatorStateStore(ABC):
    """Operator (non-keyed) state of a function: lists redistributed on rescaling."""

    @abstractmethod
    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        """Split-distribute: on restore, the elements of all subtasks are dealt out anew."""

    @abstractmethod
    def get_union_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        """Union: on restore, every subtask gets every element of every subtask."""

    @abstractmethod
    def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> BroadcastState:
        """Broadcast (PyFlink's only operator state): a map of which each subtask keeps its
        own copy; on restore, every subtask gets one old subtask's copy. A function must
        change it alike on every subtask (from broadcast input only) to keep them equal."""


class FunctionInitializationContext(ABC):
    """What :meth:`CheckpointedFunction.initialize_state` gets."""

    @abstractmethod
    def is_restored(self) -> bool:
        """True when the job starts from a checkpoint or savepoint (after a failure too)."""

    @abstractmethod
    def get_operator_state_store(self) -> OperatorStateStore:
        """Where the function's operator (non-keyed) state lives: list, union and broadcast state by name."""

    @abstractmethod
    def get_restored_checkpoint_id(self) -> int | None:
        """The id of the checkpoint being restored, or ``None``."""


class FunctionSnapshotContext(ABC):
    """What :meth:`CheckpointedFunction.snapshot_state` gets."""

    @abstractmethod
    def get_checkpoint_id(self) -> int:
        """The id of the checkpoint being taken."""

    @abstractmethod
    def get_checkpoint_timestamp(self) -> int:
        """When the checkpoint was triggered, in milliseconds since the epoch."""


class CheckpointedFunction(ABC):
    """A function with its own checkpointed state (Flink's ``CheckpointedFunction``).

    ``initialize_state`` runs before ``open``, on a fresh start and on every
    restore; ``snapshot_state`` runs at every checkpoint, on the task thread,
    between two records: write what must survive into operator state there.
    """

    @abstractmethod
    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        """Called when a checkpoint is taken, between records: bring the operator state up to date with what
        the function holds."""

    @abstractmethod
    def initialize_state(self, context: FunctionInitializationContext) -> None:
        """Called before the first record, after a restore too: get your operator state from ``context`` (and
        whether it was restored)."""


class CheckpointListener(ABC):
    """Told when checkpoints complete or are aborted (Flink's ``CheckpointListener``).

    Notifications are best effort: one may be lost, and a later checkpoint's
    completion implies the earlier ones. Two-phase-commit sinks commit everything
    up to the completed id here.
    """

    @abstractmethod
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Called once checkpoint ``checkpoint_id`` is complete: the moment to make side effects of the
        records before it visible (commit), as they can no longer be replayed."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will not complete."""


class AggregateFunction(Function):
    """An incremental aggregation with an accumulator (PyFlink's ``AggregateFunction``):
    windows keep one accumulator per key and window instead of every record."""

    @abstractmethod
    def create_accumulator(self) -> Any:
        """A new, empty accumulator, made for every key and window before its first record."""

    @abstractmethod
    def add(self, value: Any, accumulator: Any) -> Any:
        """Add ``value``; return the new accumulator (which may be ``accumulator`` itself)."""

    @abstractmethod
    def get_result(self, accumulator: Any) -> Any:
        """The result emitted for an accumulator when its window fires."""

    @abstractmethod
    def merge(self, acc_a: Any, acc_b: Any) -> Any:
        """Two accumulators as one (merging session windows)."""


class WindowFunction(Function, Generic[IN, OUT, KEY, W]):
    """Called once per key and window with all of the window's contents."""

    @abstractmethod
    def apply(self, key: Any, window: W, inputs: Iterable[Any]) -> Iterable[Any] | None:
        """Called when a key's window fires, with the key, the window and every record in it; yield (or
        return) the results."""


class AllWindowFunction(Function, Generic[IN, OUT, W]):
    """``WindowFunction`` of a non-keyed (``window_all``) stream."""

    @abstractmethod
    def apply(self, window: W, inputs: Iterable[Any]) -> Iterable[Any] | None:
        """Called when a window of a ``window_all`` stream fires, with every record in it; yield (or return)
        the results."""


class ProcessWindowFunction(Function, Generic[IN, OUT, KEY, W]):
    """Called once per key and window with the contents and a context (window, time,
    per-window and per-key state). Yield ``(output_tag, value)`` for a side output."""

    class Context(ABC, Generic[W2]):
        """What ``process`` sees beside the records: the window, the watermark and clock, per-window and
        global keyed state."""

        @abstractmethod
        def window(self) -> Any:
            """The window being evaluated (a ``TimeWindow``, ``CountWindow``, ...)."""

        @abstractmethod
        def current_processing_time(self) -> int:
            """The current processing time, in milliseconds since the epoch."""

        @abstractmethod
        def current_watermark(self) -> int:
            """The operator's current event-time watermark."""

        @abstractmethod
        def window_state(self) -> KeyedStateStore:
            """State scoped to the key and this window (cleared with ``clear``)."""

        @abstractmethod
        def global_state(self) -> KeyedStateStore:
            """State scoped to the key, shared by all its windows."""

    @abstractmethod
    def process(
        self, key: Any, context: ProcessWindowFunction.Context[Any], elements: Iterable[Any]
    ) -> Iterable[Any] | None:
        """Called when a key's window fires, with the key, a context (the window, watermark, per-window and
        global state) and every record in it; yield (or return) the results."""

    def clear(self, context: ProcessWindowFunction.Context[Any]) -> None:
        """The window is purged: drop what ``window_state`` holds for it."""


class ProcessAllWindowFunction(Function, Generic[IN, OUT, W]):
    """``ProcessWindowFunction`` of a non-keyed (``window_all``) stream."""

    class Context(ABC, Generic[W2]):
        """What ``process`` sees beside the records: the window, the watermark and clock, per-window and
        global state."""

        @abstractmethod
        def window(self) -> Any:
            """The window being evaluated (a ``TimeWindow``, ``CountWindow``, ...)."""

        @abstractmethod
        def current_processing_time(self) -> int:
            """The current processing time, in milliseconds since the epoch."""

        @abstractmethod
        def current_watermark(self) -> int:
            """The operator's current event-time watermark."""

        @abstractmethod
        def window_state(self) -> KeyedStateStore:
            """State scoped to this window (cleared with it)."""

        @abstractmethod
        def global_state(self) -> KeyedStateStore:
            """State shared by every window of the stream."""

    @abstractmethod
    def process(
        self, context: ProcessAllWindowFunction.Context[Any], elements: Iterable[Any]
    ) -> Iterable[Any] | None:
        """Called when a window of a ``window_all`` stream fires, with a context and every record in it; yield
        (or return) the results."""

    def clear(self, context: ProcessAllWindowFunction.Context[Any]) -> None:
        """The window is purged: drop what ``window_state`` holds for it."""


class BaseBroadcastProcessFunction(Function):
    """What both broadcast process functions share (PyFlink's ``BaseBroadcastProcessFunction``).

    A broadcast process function runs on ``stream.connect(rules.broadcast(descriptor))``:
    every subtask receives every element of the broadcast side and stores what it needs in
    broadcast state (a map per :class:`MapStateDescriptor` given to ``broadcast``), which
    the elements of the other side read. Only the broadcast side may write the state, so
    every subtask keeps the same copy; a checkpoint stores it per subtask and a restore, at
    any parallelism, gives each subtask one copy. Yield ``(output_tag, value)`` from either
    side to emit ``value`` to a side output.
    """

    class BaseContext(ABC):
        """What both sides of a broadcast process function see: the record's timestamp, the watermark
        and the clock."""

        @abstractmethod
        def timestamp(self) -> int | None:
            """The element's (or firing timer's) event timestamp, or ``None``."""

        @abstractmethod
        def current_processing_time(self) -> int:
            """Wall-clock milliseconds since the epoch."""

        @abstractmethod
        def current_watermark(self) -> int:
            """The operator's current event-time watermark (the minimum of both inputs')."""

    class Context(BaseContext):
        """The broadcast side's context: read and write access to the broadcast state."""

        @abstractmethod
        def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> BroadcastState:
            """The broadcast state ``state_descriptor`` names (one given to ``broadcast``)."""

    class ReadOnlyContext(BaseContext):
        """The element side's context: read-only access to the broadcast state."""

        @abstractmethod
        def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
            """A read-only view of the broadcast state ``state_descriptor`` names."""


class BroadcastProcessFunction(BaseBroadcastProcessFunction, Generic[IN1, IN2, OUT]):
    """A function over a non-keyed stream connected with a broadcast stream (PyFlink's
    ``BroadcastProcessFunction``): ``process_element`` for each element of the non-keyed
    stream, with read-only broadcast state; ``process_broadcast_element`` for each
    broadcast element, on every subtask, with read and write access."""

    class Context(BaseBroadcastProcessFunction.Context, ABC):
        """The context of ``process_broadcast_element``."""

    class ReadOnlyContext(BaseBroadcastProcessFunction.ReadOnlyContext, ABC):
        """The context of ``process_element``."""

    @abstractmethod
    def process_element(
        self, value: Any, ctx: BroadcastProcessFunction.ReadOnlyContext
    ) -> Iterable[Any] | None:
        """Called for each record of the non-broadcast input, with read-only access to the broadcast state;
        yield (or return) outputs."""

    @abstractmethod
    def process_broadcast_element(
        self, value: Any, ctx: BroadcastProcessFunction.Context
    ) -> Iterable[Any] | None:
        """Called for each record of the broadcast input, on every subtask, with write access to the broadcast
        state; yield (or return) outputs."""


class KeyedBroadcastProcessFunction(BaseBroadcastProcessFunction, Generic[KEY, IN1, IN2, OUT]):
    """A function over a keyed stream connected with a broadcast stream (PyFlink's
    ``KeyedBroadcastProcessFunction``).

    ``process_element`` runs per element of the keyed stream with keyed state and timers
    (through the runtime context and ``ctx.timer_service()``) and read-only broadcast state;
    ``process_broadcast_element`` runs per broadcast element on every subtask, writes the
    broadcast state and reaches keyed state through ``ctx.apply_to_keyed_state`` (Java
    Flink's ``applyToKeyedState``, which PyFlink lacks): it has no current key, so it must
    not read keyed state handles directly. ``on_timer`` runs when a timer fires, with the
    timer's key current.
    """

    class Context(BaseBroadcastProcessFunction.Context, ABC):
        """The context of ``process_broadcast_element``."""

        @abstractmethod
        def apply_to_keyed_state(
            self, state_descriptor: StateDescriptor, function: Callable[[Any, Any], Any]
        ) -> None:
            """Call ``function(key, state)`` for every key of this subtask that has a value of
            the keyed state ``state_descriptor`` describes, with ``state`` scoped to that key
            (it may update or clear it). Keys are in this subtask's key groups only: every
            subtask runs this for the same broadcast element, so together they cover all keys."""

    class ReadOnlyContext(BaseBroadcastProcessFunction.ReadOnlyContext, ABC):
        """The context of ``process_element``."""

        @abstractmethod
        def timer_service(self) -> TimerService:
            """Query time and set timers for the current key."""

        @abstractmethod
        def get_current_key(self) -> Any:
            """The key of the element being processed."""

    class OnTimerContext(ReadOnlyContext, ABC):
        """The context of ``on_timer``."""

        @abstractmethod
        def time_domain(self) -> TimeDomain:
            """Whether the firing timer was set in event time or processing time."""

        @abstractmethod
        def get_current_key(self) -> Any:
            """The key of the firing timer."""

    @abstractmethod
    def process_element(
        self, value: Any, ctx: KeyedBroadcastProcessFunction.ReadOnlyContext
    ) -> Iterable[Any] | None:
        """Called for each record of the keyed input, with its key's state, timers and read-only broadcast
        state; yield (or return) outputs."""

    @abstractmethod
    def process_broadcast_element(
        self, value: Any, ctx: KeyedBroadcastProcessFunction.Context
    ) -> Iterable[Any] | None:
        """Called for each record of the broadcast input, on every subtask, with write access to the broadcast
        state and ``apply_to_keyed_state`` over every key's state; yield (or return) outputs."""

    def on_timer(
        self, timestamp: int, ctx: KeyedBroadcastProcessFunction.OnTimerContext
    ) -> Iterable[Any] | None:
        """A timer set through ``ctx.timer_service()`` fired; yield outputs as in
        ``process_element``."""
        return None


# ---------------------------------------------------------------- the batch (Arrow) path


class MapBatchesFunction(Function):
    """``BatchStream.map_batches``: one Arrow ``RecordBatch`` in, any number of rows out.

    In the spirit of PySpark's ``mapInArrow``: the function sees whole batches, so its work
    is numpy / pyarrow.compute calls over columns, not Python per row. It may return a
    ``pyarrow.RecordBatch``, a ``pyarrow.Table``, a ``dict`` of column name to array (numpy,
    Arrow or list), a pandas ``DataFrame``, or ``None`` for no output. A plain callable with
    the same signature works as well; a class is needed only for ``open`` / ``close``.
    """

    @abstractmethod
    def map_batch(self, batch: Any) -> Any:
        """The output rows of one Arrow record batch (a ``RecordBatch``, a dict of columns, or ``None`` for
        nothing)."""


class KeyedBatchState(ABC):
    """Columnar keyed state as a :class:`KeyedBatchFunction` sees it for one batch.

    One *row* per distinct key of the batch, in the order of :attr:`keys` (the order of the
    groups of the grouped batch). Reading a column gives a numpy array of the state of those
    keys (the column's default for a key without state yet); assigning one writes the new
    state of every key at once. Nothing is written until assigned, so a function that only
    reads leaves the state as it was.
    """

    @property
    @abstractmethod
    def keys(self) -> Any:
        """The distinct keys of the batch (a ``pyarrow.Array``), one per group."""

    @property
    @abstractmethod
    def offsets(self) -> Any:
        """Group ``i`` is rows ``offsets[i]:offsets[i + 1]`` of the grouped batch (numpy, len(keys) + 1)."""

    @property
    @abstractmethod
    def group_ids(self) -> Any:
        """The group of every row of the grouped batch (numpy ints, one per row)."""

    @abstractmethod
    def is_new(self) -> Any:
        """A boolean numpy array: the keys that had no state before this batch."""

    @abstractmethod
    def __getitem__(self, column: str) -> Any:
        """The state column ``column`` of the batch's keys (a numpy array, len(keys))."""

    @abstractmethod
    def __setitem__(self, column: str, values: Any) -> None:
        """Set the state column ``column`` of every key of the batch (len(keys) values)."""

    @abstractmethod
    def clear(self, mask: Any = None) -> None:
        """Drop the state of the keys where ``mask`` is true (all of the batch's keys without one)."""


class KeyedBatchFunction(Function):
    """``KeyedBatchStream.process_batches``: a vectorised keyed function with columnar state.

    PySpark's ``applyInPandasWithState`` shape, over Arrow and for every key of a batch at
    once: ``process_batch`` gets the batch *grouped by key* (the rows of one key together,
    in their arrival order; :attr:`KeyedBatchState.offsets` says where each group starts)
    and the state of those keys as columns, and returns the rows to emit (what
    :class:`MapBatchesFunction` may return), or ``None``. The state's columns and their
    types are the ``state_schema`` given to ``process_batches``; it is checkpointed per key
    group as Arrow IPC, restored and rescaled like the record path's keyed state.
    """

    @abstractmethod
    def process_batch(self, batch: Any, state: KeyedBatchState) -> Any:
        """Called with a batch grouped by key and its keys' columnar state (``state.keys``, ``state.offsets``,
        one value per key): update the state and return the output columns."""


class BatchAggregateFunction(Function):
    """``WindowedBatchStream.aggregate(fn, accumulator_schema)``: PyFlink's
    ``AggregateFunction`` for batches, one call per batch and window for all its keys.

    The accumulator of a (key, window) is a row of columns (``accumulator_schema``, kept
    as columnar keyed state, checkpointed and rescaled like every batch state). Each
    method works on numpy arrays holding one value per key:

    - :meth:`create_accumulator`: the values a new key's accumulator starts with, by
      column (a column left out starts at 0, ``False`` or ``None``);
    - :meth:`add`: the accumulators of the keys a batch brings to one window, and the
      batch's rows of that window with ``group_ids`` (the key index of every row, so
      ``np.add.at(acc["total"], group_ids, values)`` or ``np.bincount`` adds them); it
      updates the arrays in place or returns the new ones, as a dict;
    - :meth:`get_result`: the accumulators of the keys of a window that fires, to the
      output columns (a dict of equally long arrays, or a ``RecordBatch``);
    - :meth:`merge` (session windows only): combine accumulators into one per group, as
      PyFlink's ``AggregateFunction.merge`` combines two. Tumbling and sliding windows never
      merge, so a function without ``merge`` serves them; session windows refuse it.
    """

    def create_accumulator(self) -> dict[str, Any]:
        """The values a new (key, window) accumulator starts with, by column."""
        return {}

    @abstractmethod
    def add(self, accumulator: dict[str, Any], batch: Any, group_ids: Any) -> dict[str, Any] | None:
        """Add ``batch``'s rows (``pyarrow.RecordBatch``) to the accumulators of their keys:
        ``accumulator[column][group_ids[i]]`` is row ``i``'s. Update in place (return
        ``None``) or return the new columns."""

    @abstractmethod
    def get_result(self, accumulator: dict[str, Any]) -> Any:
        """The output columns of the keys whose accumulators are given (one value each)."""

    def merge(self, accumulator: dict[str, Any], group_ids: Any, groups: int) -> dict[str, Any]:
        """Combine accumulators, for session windows: row ``i`` of every column of
        ``accumulator`` belongs to group ``group_ids[i]`` (``0 .. groups - 1``, ascending, so
        a group's rows are adjacent, in the order of their sessions' starts); return a dict
        of every accumulator column with ``groups`` values, group ``g``'s at ``[g]``. A sum:
        ``out = np.zeros(groups, acc.dtype); np.add.at(out, group_ids, acc)``; a maximum:
        ``np.maximum.reduceat(acc, np.flatnonzero(np.diff(group_ids, prepend=-1)))``.

        Batch session windows give every row an accumulator of its own (``create_accumulator``
        then ``add`` with one group per row) and merge the rows and pending sessions of a key
        that overlap or touch, so a session's result does not depend on how its rows were
        grouped. Only session windows call it: the default refuses them when the job is built."""
        raise NotImplementedError(f"{type(self).__name__} has no merge(); session windows need one")

    @classmethod
    def defines_merge(cls) -> bool:
        """Whether this function overrides :meth:`merge` (session windows need it)."""
        return cls.merge is not BatchAggregateFunction.merge
