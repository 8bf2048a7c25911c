"""The operators of one task, wired output to input.

Inside a chain an operator's output *is* the next operator's ``process_batch``
(a bound method): a batch goes down the chain as nested calls, with no copy,
no queue and no thread switch. Where a node feeds several consumers the batch
is handed to each in turn; the receivers never mutate their input list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from chandy.state.heap import HeapKeyedStateBackend
from chandy.state.key_groups import KeyGroupRange
from chandy.task.deployment import TaskDeploymentDescriptor
from chandy.task.operators.base import Emit, StreamOperator
from chandy.task.record_writer import RecordWriter
from chandy.task.runtime_context import StreamingRuntimeContext
from chandy.task.services import TaskServices

log = logging.getLogger(__name__)


def _fan_out(targets: Sequence[Emit]) -> Emit:
    if not targets:
        return lambda records: None
    if len(targets) == 1:
        return targets[0]
    fixed = tuple(targets)

    def emit(records: list[Any]) -> None:
        for target in fixed:
            target(records)
    return emit


class OperatorChain:
    """Builds, wires and drives the lifecycle of a task's operators."""

    def __init__(self, tdd: TaskDeploymentDescriptor, writers: Sequence[RecordWriter],
                 services: TaskServices, should_abort: Callable[[], bool]) -> None:
        self.tdd = tdd
        self.specs = tdd.operators
        self.operators: dict[int, StreamOperator] = {}
        for spec in self.specs:
            operator = spec.factory()
            operator.name = spec.name
            operator.operator_id = spec.operator_id
            self.operators[spec.node_id] = operator
        key_group_range = KeyGroupRange.of_operator(tdd.max_parallelism, tdd.parallelism,
                                                    tdd.subtask_index)
        # Wire from the tail so that every target exists before its source is set up.
        for spec in reversed(self.specs):
            operator = self.operators[spec.node_id]
            targets: list[Emit] = [self.operators[n].process_batch for n in spec.chained_outputs]
            targets += [writers[i].emit_batch for i in spec.network_outputs]
            backend = (HeapKeyedStateBackend(key_group_range, tdd.max_parallelism)
                       if spec.keyed else None)
            context = StreamingRuntimeContext(
                job_id=tdd.job_id, job_name=tdd.job_name, task_name=tdd.task_name,
                operator_name=spec.name, subtask_index=tdd.subtask_index,
                parallelism=tdd.parallelism, max_parallelism=tdd.max_parallelism,
                attempt_number=tdd.attempt_number, job_parameters=tdd.config,
                keyed_state_backend=backend)
            operator.setup(context, _fan_out(targets))
            operator.bind_task_services(services, should_abort)
        self.head = self.operators[self.specs[0].node_id]
        self._opened: list[StreamOperator] = []

    def in_order(self) -> list[StreamOperator]:
        """Operators head first (topological order)."""
        return [self.operators[spec.node_id] for spec in self.specs]

    def open(self) -> None:
        """Open tail first, so every operator's consumers are ready before it emits."""
        for operator in reversed(self.in_order()):
            operator.open()
            self._opened.append(operator)

    def end_input(self) -> None:
        """Input ended: tell the head, then let every operator flush, head first."""
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
