"""The runtime context a running function sees (PyFlink's ``RuntimeContext``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chandy.core.functions import RuntimeContext
from chandy.core.metrics import MetricGroup
from chandy.core.state import (
    AggregatingState,
    AggregatingStateDescriptor,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    State,
    StateDescriptor,
    ValueState,
    ValueStateDescriptor,
)
from chandy.errors import InvalidProgramError, NotKeyedError
from chandy.state.backend import KeyedStateBackend
from chandy.task.user_metrics import OperatorMetricGroup


class StreamingRuntimeContext(RuntimeContext):
    """Where an operator runs; keyed state if its input is a keyed stream."""

    def __init__(
        self,
        *,
        job_id: str,
        job_name: str,
        task_name: str,
        operator_name: str,
        subtask_index: int,
        parallelism: int,
        max_parallelism: int,
        attempt_number: int,
        job_parameters: Mapping[str, Any],
        keyed_state_backend: KeyedStateBackend | None = None,
        metric_group: OperatorMetricGroup | None = None,
    ) -> None:
        """``metric_group``: the operator's, which its task reports; without one (a test
        harness), a group of its own that nobody reports."""
        self.job_id = job_id
        self.job_name = job_name
        self._task_name = task_name
        self.operator_name = operator_name
        self._subtask_index = subtask_index
        self._parallelism = parallelism
        self._max_parallelism = max_parallelism
        self._attempt_number = attempt_number
        self._job_parameters = dict(job_parameters)
        self.keyed_state_backend = keyed_state_backend
        self._metric_group = metric_group

    def get_task_name(self) -> str:
        return self._task_name

    def get_number_of_parallel_subtasks(self) -> int:
        return self._parallelism

    def get_max_number_of_parallel_subtasks(self) -> int:
        return self._max_parallelism

    def get_index_of_this_subtask(self) -> int:
        return self._subtask_index

    def get_attempt_number(self) -> int:
        return self._attempt_number

    def get_job_parameter(self, key: str, default_value: str | None = None) -> str | None:
        value = self._job_parameters.get(key)
        return default_value if value is None else str(value)

    def get_metrics_group(self) -> MetricGroup:
        if self._metric_group is None:
            self._metric_group = OperatorMetricGroup(self.operator_name)
        return self._metric_group

    def _keyed(self, descriptor: StateDescriptor) -> State:
        if self.keyed_state_backend is None:
            raise NotKeyedError(
                f"keyed state '{descriptor.name}' requested in operator '{self.operator_name}', "
                "whose input is not keyed. Keyed state is only available on a keyed stream: "
                "call key_by(...) before this operator (for state of the whole subtask, use "
                "operator state: CheckpointedFunction)."
            )
        return self.keyed_state_backend.get_partitioned_state(descriptor)

    @staticmethod
    def _wrong_kind(descriptor: StateDescriptor, state: State, kind: str) -> InvalidProgramError:
        return InvalidProgramError(
            f"state '{descriptor.name}' is described by a {type(descriptor).__name__}, which gives "
            f"{type(state).__name__}, not {kind}: describe it with a {kind}Descriptor"
        )

    def get_state(self, state_descriptor: ValueStateDescriptor) -> ValueState:
        state = self._keyed(state_descriptor)
        if not isinstance(state, ValueState):
            raise self._wrong_kind(state_descriptor, state, "ValueState")
        return state

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        state = self._keyed(state_descriptor)
        if not isinstance(state, ListState):
            raise self._wrong_kind(state_descriptor, state, "ListState")
        return state

    def get_map_state(self, state_descriptor: MapStateDescriptor) -> MapState:
        state = self._keyed(state_descriptor)
        if not isinstance(state, MapState):
            raise self._wrong_kind(state_descriptor, state, "MapState")
        return state

    def get_reducing_state(self, state_descriptor: ReducingStateDescriptor) -> ReducingState:
        state = self._keyed(state_descriptor)
        if not isinstance(state, ReducingState):
            raise self._wrong_kind(state_descriptor, state, "ReducingState")
        return state

    def get_aggregating_state(self, state_descriptor: AggregatingStateDescriptor) -> AggregatingState:
        state = self._keyed(state_descriptor)
        if not isinstance(state, AggregatingState):
            raise self._wrong_kind(state_descriptor, state, "AggregatingState")
        return state
