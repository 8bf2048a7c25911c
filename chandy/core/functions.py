"""User functions: the interfaces a pipeline's code implements.

Names follow PyFlink's DataStream API. Every operator also accepts a plain
callable (``ds.map(lambda x: x + 1)``); a class is needed only to use
``open(runtime_context)`` / ``close()`` or keyed state.

``process_element`` may ``yield`` any number of outputs (as in PyFlink), return
an iterable, or return ``None`` for no output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from chandy.core.state import (
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    ValueState,
    ValueStateDescriptor,
)


class RuntimeContext(ABC):
    """What a running function knows about where it runs, and its keyed state.

    The ``get_*_state`` methods are only available in functions applied to a
    :class:`~chandy.api.datastream.KeyedStream`; anywhere else they raise a clear error.
    """

    @abstractmethod
    def get_task_name(self) -> str: ...

    @abstractmethod
    def get_number_of_parallel_subtasks(self) -> int: ...

    @abstractmethod
    def get_max_number_of_parallel_subtasks(self) -> int: ...

    @abstractmethod
    def get_index_of_this_subtask(self) -> int: ...

    @abstractmethod
    def get_attempt_number(self) -> int:
        """0 on the first run, then one more after every restart of the job."""

    def get_task_name_with_subtasks(self) -> str:
        return (
            f"{self.get_task_name()} ({self.get_index_of_this_subtask() + 1}"
            f"/{self.get_number_of_parallel_subtasks()})"
        )

    @abstractmethod
    def get_job_parameter(self, key: str, default_value: str | None = None) -> str | None:
        """A value from the job's configuration, or ``default_value``."""

    @abstractmethod
    def get_state(self, state_descriptor: ValueStateDescriptor) -> ValueState: ...

    @abstractmethod
    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState: ...

    @abstractmethod
    def get_map_state(self, state_descriptor: MapStateDescriptor) -> MapState: ...

    @abstractmethod
    def get_reducing_state(self, state_descriptor: ReducingStateDescriptor) -> ReducingState: ...


class Function:
    """Base of every user function class: optional lifecycle hooks."""

    def open(self, runtime_context: RuntimeContext) -> None:
        """Called once per subtask before the first record (and again after a restart)."""

    def close(self) -> None:
        """Called once per subtask after the last record, or when the task is cancelled."""


class MapFunction(Function):
    @abstractmethod
    def map(self, value: Any) -> Any: ...


class FlatMapFunction(Function):
    @abstractmethod
    def flat_map(self, value: Any) -> Iterable[Any] | None:
        """Yield (or return an iterable of) any number of outputs."""


class FilterFunction(Function):
    @abstractmethod
    def filter(self, value: Any) -> bool: ...


class ReduceFunction(Function):
    @abstractmethod
    def reduce(self, value1: Any, value2: Any) -> Any: ...


class KeySelector(Function):
    @abstractmethod
    def get_key(self, value: Any) -> Any: ...


class ProcessFunction(Function):
    """A function over every record of a (non-keyed) stream."""

    class Context(ABC):
        @abstractmethod
        def timestamp(self) -> int | None:
            """The record's event timestamp, or ``None`` when it carries none."""

    @abstractmethod
    def process_element(self, value: Any, ctx: ProcessFunction.Context) -> Iterable[Any] | None: ...


class KeyedProcessFunction(Function):
    """A function over every record of a keyed stream, with keyed state."""

    class Context(ABC):
        @abstractmethod
        def timestamp(self) -> int | None:
            """The record's event timestamp, or ``None`` when it carries none."""

        @abstractmethod
        def get_current_key(self) -> Any:
            """The key of the record being processed."""

    @abstractmethod
    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterable[Any] | None: ...


class SinkFunction(Function):
    """Writes records somewhere outside the job (``ds.add_sink(f)``)."""

    class Context(ABC):
        @abstractmethod
        def timestamp(self) -> int | None: ...

    @abstractmethod
    def invoke(self, value: Any, context: SinkFunction.Context) -> None: ...

    def finish(self) -> None:
        """Called once when the input has ended (a bounded job), before ``close()``."""


class OperatorStateStore(ABC):
    """Operator (non-keyed) state of a function: lists redistributed on rescaling."""

    @abstractmethod
    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        """Split-distribute: on restore, the elements of all subtasks are dealt out anew."""

    @abstractmethod
    def get_union_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        """Union: on restore, every subtask gets every element of every subtask."""


class FunctionInitializationContext(ABC):
    """What :meth:`CheckpointedFunction.initialize_state` gets."""

    @abstractmethod
    def is_restored(self) -> bool:
        """True when the job starts from a checkpoint or savepoint (after a failure too)."""

    @abstractmethod
    def get_operator_state_store(self) -> OperatorStateStore: ...

    @abstractmethod
    def get_restored_checkpoint_id(self) -> int | None:
        """The id of the checkpoint being restored, or ``None``."""


class FunctionSnapshotContext(ABC):
    """What :meth:`CheckpointedFunction.snapshot_state` gets."""

    @abstractmethod
    def get_checkpoint_id(self) -> int: ...

    @abstractmethod
    def get_checkpoint_timestamp(self) -> int: ...


class CheckpointedFunction(ABC):
    """A function with its own checkpointed state (Flink's ``CheckpointedFunction``).

    ``initialize_state`` runs before ``open``, on a fresh start and on every
    restore; ``snapshot_state`` runs at every checkpoint, on the task thread,
    between two records: write what must survive into operator state there.
    """

    @abstractmethod
    def snapshot_state(self, context: FunctionSnapshotContext) -> None: ...

    @abstractmethod
    def initialize_state(self, context: FunctionInitializationContext) -> None: ...


class CheckpointListener(ABC):
    """Told when checkpoints complete or are aborted (Flink's ``CheckpointListener``).

    Notifications are best effort: one may be lost, and a later checkpoint's
    completion implies the earlier ones. Two-phase-commit sinks commit everything
    up to the completed id here.
    """

    @abstractmethod
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None: ...

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will not complete."""
