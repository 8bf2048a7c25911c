"""The ExecutionGraph: every parallel subtask, its current attempt, and the job status.

It is the JobMaster's bookkeeping. Tasks report state changes; the graph
records them against the attempt they belong to (a report from an old attempt
is ignored) and answers the JobMaster's questions: is everything running, is
everything finished, which attempts are still alive. Job status changes go to
registered listeners (the checkpoint scheduler is one); a listener that raises
is logged and does not stop the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from chandy.graph.job_graph import DistributionPattern, JobGraph, JobVertex
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.status import ExecutionState, JobStatus
from chandy.task.deployment import (
    OutputSpec,
    TaskDeploymentDescriptor,
)
from chandy.task.services import TaskFailure
from chandy.util.clock import Clock, SystemClock

log = logging.getLogger(__name__)


#: ``listener(job_id, new_status, timestamp_ms, error)``
JobStatusListener = Callable[[str, JobStatus, int, BaseException | None], None]


@dataclass(frozen=True, order=True)
class ChannelID:
    """One channel: an edge, a producer subtask and a consumer subtask."""

    edge_index: int
    producer_subtask: int
    consumer_subtask: int


def pointwise_consumers(producer: int, producers: int, consumers: int) -> range:
    """The consumer subtasks producer ``producer`` feeds on a POINTWISE edge (Flink's
    ``EdgeManagerBuildUtil.connectPointwise``): subtask i to subtask i at equal parallelism
    (forward); with more producers, consumer j reads producers ``[j*p//c, (j+1)*p//c)``;
    with more consumers, producer i feeds ``[ceil(i*c/p), ceil((i+1)*c/p))``. Contiguous
    ranges, so every producer feeds at least one consumer and every consumer reads at
    least one producer."""
    if producers == consumers:
        return range(producer, producer + 1)
    if producers > consumers:
        consumer = ((producer + 1) * consumers - 1) // producers
        return range(consumer, consumer + 1)
    return range(-(-producer * consumers // producers), -(-(producer + 1) * consumers // producers))


def pointwise_producers(consumer: int, producers: int, consumers: int) -> range:
    """The producer subtasks consumer ``consumer`` reads on a POINTWISE edge (the inverse of
    :func:`pointwise_consumers`)."""
    if producers == consumers:
        return range(consumer, consumer + 1)
    if producers > consumers:
        return range(consumer * producers // consumers, (consumer + 1) * producers // consumers)
    producer = (consumer * producers) // consumers
    return range(producer, producer + 1)


class Execution:
    """One attempt to run one subtask."""

    __slots__ = ("attempt_id", "state", "failure")

    def __init__(self, attempt_id: ExecutionAttemptID) -> None:
        self.attempt_id = attempt_id
        self.state = ExecutionState.CREATED
        self.failure: TaskFailure | None = None


class ExecutionVertex:
    """One parallel subtask of a job vertex, across its attempts."""

    def __init__(self, job_vertex: JobVertex, subtask_index: int) -> None:
        self.job_vertex = job_vertex
        self.subtask_index = subtask_index
        self.current_execution = Execution(ExecutionAttemptID(job_vertex.id, subtask_index, 0))

    def reset_for_new_execution(self) -> Execution:
        """Start a new attempt (after a failover)."""
        old = self.current_execution.attempt_id
        self.current_execution = Execution(
            ExecutionAttemptID(old.vertex_id, old.subtask_index, old.attempt_number + 1)
        )
        return self.current_execution

    @property
    def name_with_subtask(self) -> str:
        return f"{self.job_vertex.name} ({self.subtask_index + 1}/{self.job_vertex.parallelism})"


class ExecutionGraph:
    """The parallel, running view of a JobGraph."""

    def __init__(self, job_graph: JobGraph, clock: Clock | None = None) -> None:
        self.job_graph = job_graph
        self.clock = clock or SystemClock()
        self.state = JobStatus.CREATED
        self.failure_cause: BaseException | None = None
        self.state_timestamps: dict[JobStatus, int] = {JobStatus.CREATED: self.clock.now_ms()}
        self._listeners: list[JobStatusListener] = []
        self.vertices: dict[int, list[ExecutionVertex]] = {
            v.id: [ExecutionVertex(v, i) for i in range(v.parallelism)] for v in job_graph.vertices
        }
        self._by_attempt: dict[ExecutionAttemptID, Execution] = {}
        self._index_attempts()

    @property
    def job_id(self) -> str:
        return self.job_graph.job_id

    # ------------------------------------------------------------------ status

    def register_job_status_listener(self, listener: JobStatusListener) -> None:
        self._listeners.append(listener)

    def transition_state(
        self, current: JobStatus, new: JobStatus, error: BaseException | None = None
    ) -> bool:
        """Move from ``current`` to ``new``; False (and no change) if not in ``current``."""
        if self.state is not current:
            return False
        self.state = new
        now = self.clock.now_ms()
        self.state_timestamps[new] = now
        if error is not None:
            self.failure_cause = error
        log.info(
            "Job %s (%s) switched from state %s to %s.",
            self.job_graph.job_name,
            self.job_id,
            current.value,
            new.value,
        )
        for listener in list(self._listeners):
            try:
                listener(self.job_id, new, now, error)
            except Exception:
                log.exception("job status listener %r failed", listener)
        return True

    # ------------------------------------------------------------------ executions

    def _index_attempts(self) -> None:
        self._by_attempt = {
            ev.current_execution.attempt_id: ev.current_execution for ev in self.all_execution_vertices()
        }

    def all_execution_vertices(self) -> Iterator[ExecutionVertex]:
        for subtasks in self.vertices.values():
            yield from subtasks

    def current_executions(self) -> list[Execution]:
        return [ev.current_execution for ev in self.all_execution_vertices()]

    def execution(self, attempt_id: ExecutionAttemptID) -> Execution | None:
        """The execution of a *current* attempt, or ``None`` for an old or unknown one."""
        return self._by_attempt.get(attempt_id)

    def update_execution_state(
        self, attempt_id: ExecutionAttemptID, state: ExecutionState, failure: TaskFailure | None = None
    ) -> bool:
        """Record a task's report; False if it is from an attempt that is no longer current."""
        execution = self._by_attempt.get(attempt_id)
        if execution is None:
            return False
        if execution.state.is_terminal:
            return False
        execution.state = state
        if failure is not None:
            execution.failure = failure
        return True

    def all_in_state(self, state: ExecutionState) -> bool:
        return all(e.state is state for e in self.current_executions())

    def all_terminal(self) -> bool:
        return all(e.state.is_terminal for e in self.current_executions())

    def reset_all_for_new_execution(self) -> None:
        """Every subtask gets a fresh attempt (global failover)."""
        for ev in self.all_execution_vertices():
            ev.reset_for_new_execution()
        self._index_attempts()

    # ------------------------------------------------------------------ deployment

    def output_channel_ids(self, vertex: JobVertex, subtask: int) -> list[list[ChannelID]]:
        """For each output edge of ``vertex``, the channels subtask ``subtask`` writes."""
        result = []
        for edge in vertex.outputs:
            target = self.job_graph.vertex(edge.target_vertex_id)
            if edge.pattern is DistributionPattern.POINTWISE:
                consumers = pointwise_consumers(subtask, vertex.parallelism, target.parallelism)
            else:
                consumers = range(target.parallelism)
            result.append([ChannelID(edge.index, subtask, c) for c in consumers])
        return result

    def input_channel_ids(self, vertex: JobVertex, subtask: int) -> list[ChannelID]:
        """Every channel subtask ``subtask`` of ``vertex`` reads, edge by edge."""
        result: list[ChannelID] = []
        for edge in vertex.inputs:
            source = self.job_graph.vertex(edge.source_vertex_id)
            if edge.pattern is DistributionPattern.POINTWISE:
                producers = pointwise_producers(subtask, source.parallelism, vertex.parallelism)
            else:
                producers = range(source.parallelism)
            result.extend(ChannelID(edge.index, p, subtask) for p in producers)
        return result

    @staticmethod
    def input_types(vertex: JobVertex, channels: list[ChannelID]) -> tuple[int, ...]:
        """For each of ``channels`` (:meth:`input_channel_ids`, in its order), the input of the
        head operator it feeds (``JobEdge.type_number``)."""
        by_edge = {edge.index: edge.type_number for edge in vertex.inputs}
        return tuple(by_edge[c.edge_index] for c in channels)

    def deployment_descriptor(self, ev: ExecutionVertex) -> TaskDeploymentDescriptor:
        vertex = ev.job_vertex
        channels = self.input_channel_ids(vertex, ev.subtask_index)
        outputs = tuple(
            OutputSpec(
                edge.target_vertex_id,
                self.job_graph.vertex(edge.target_vertex_id).name,
                edge.partitioner,
                len(ids),
            )
            for edge, ids in zip(
                vertex.outputs, self.output_channel_ids(vertex, ev.subtask_index), strict=True
            )
        )
        return TaskDeploymentDescriptor(
            job_id=self.job_id,
            job_name=self.job_graph.job_name,
            vertex_id=vertex.id,
            task_name=vertex.name,
            subtask_index=ev.subtask_index,
            parallelism=vertex.parallelism,
            max_parallelism=vertex.max_parallelism,
            attempt_number=ev.current_execution.attempt_id.attempt_number,
            operators=tuple(vertex.operators),
            outputs=outputs,
            num_input_channels=len(channels),
            config=self.job_graph.config,
            input_types=self.input_types(vertex, channels),
        )
