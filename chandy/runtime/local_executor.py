"""The local executor (Flink's MiniCluster): every subtask a thread in this process.

Channels are in-memory :class:`~chandy.network.channel.LocalChannel` objects, so
records move between tasks by reference. User functions do not: every subtask
deserializes its own copy of its chain, exactly as a Spark slot would. It is what tests use and what runs a
job when no cluster is wanted.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from chandy.config import Configuration
from chandy.config.options import MetricOptions, NetworkOptions
from chandy.graph.execution_graph import ChannelID, ExecutionGraph
from chandy.messages.checkpoint import CheckpointOptions
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.status import ExecutionState
from chandy.network.channel import LocalChannel
from chandy.runtime.executor import Deployment, Executor
from chandy.task.deployment import TaskDeploymentDescriptor, deserialize_chain, serialize_chain
from chandy.task.metrics import MetricsReporter
from chandy.task.services import TaskFailure, TaskServices, TaskStateListener
from chandy.task.stream_task import StreamTask

log = logging.getLogger(__name__)


class _ReportingListener:
    """Sends a task's last metrics before its end reaches the JobMaster, so a finished
    job's counts are final."""

    def __init__(self, listener: TaskStateListener, reporter: MetricsReporter) -> None:
        self._listener = listener
        self._reporter = reporter

    def notify_task_state(
        self, attempt_id: ExecutionAttemptID, state: ExecutionState, failure: TaskFailure | None = None
    ) -> None:
        if state.is_terminal:
            self._reporter.task_ended(attempt_id)
        self._listener.notify_task_state(attempt_id, state, failure)


class LocalDeployment(Deployment):
    """The task threads of one attempt, and the thread reporting their metrics; owns them
    until they have ended (the executor stops the reporter when it closes)."""

    def __init__(
        self,
        tasks: list[StreamTask],
        channels: dict[ChannelID, LocalChannel],
        reporter: MetricsReporter | None = None,
    ) -> None:
        self.tasks = tasks
        self.channels = channels
        self.reporter = reporter
        self._by_attempt = {t.tdd.attempt_id: t for t in tasks}
        self.threads = [
            threading.Thread(target=t.invoke, name=f"chandy {t.tdd.name_with_subtask}", daemon=True)
            for t in tasks
        ]

    def start(self) -> None:
        if self.reporter is not None:
            for task in self.tasks:
                self.reporter.register(task.metrics)
            self.reporter.start()
        for thread in self.threads:
            thread.start()

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()
        for channel in self.channels.values():
            channel.close()

    def trigger_checkpoint(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int, options: CheckpointOptions
    ) -> bool:
        task = self._by_attempt.get(attempt_id)
        if task is None:
            return False
        task.trigger_checkpoint_async(checkpoint_id, timestamp, options)
        return True

    def notify_checkpoint_complete(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        task = self._by_attempt.get(attempt_id)
        if task is not None:
            task.notify_checkpoint_complete_async(checkpoint_id)

    def notify_checkpoint_aborted(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        task = self._by_attempt.get(attempt_id)
        if task is not None:
            task.notify_checkpoint_aborted_async(checkpoint_id)

    def wait_stopped(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for thread, task in zip(self.threads, self.tasks, strict=True):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning(
                    "%s did not stop within %.0f s (a user function may be blocked); "
                    "its thread is left behind as a daemon",
                    task.tdd.name_with_subtask,
                    timeout_s,
                )
                return False
        if self.reporter is not None:
            self.reporter.stop()  # every task ended: nothing more to report
        return True


class LocalExecutor(Executor):
    """Runs every task as a thread of this process.

    Metrics: each deployment's reporter calls ``services.metrics`` (the JobMaster) every
    ``chandy.metrics.report-interval``; :meth:`close` stops the last one.
    """

    def __init__(self) -> None:
        self._deployment: LocalDeployment | None = None

    def deploy(
        self,
        execution_graph: ExecutionGraph,
        descriptors: list[TaskDeploymentDescriptor],
        listener: TaskStateListener,
        services: TaskServices,
    ) -> LocalDeployment:
        config = Configuration(execution_graph.job_graph.config)
        capacity = config.get(NetworkOptions.BUFFERS_PER_CHANNEL)
        reporter: MetricsReporter | None = None
        if services.metrics is not None:
            reporter = MetricsReporter(
                execution_graph.job_id,
                config.get(MetricOptions.REPORT_INTERVAL) / 1000,
                services.metrics.report_metrics,
                f"chandy metrics {execution_graph.job_id}",
                stop_when_empty=True,
            )
            listener = _ReportingListener(listener, reporter)
        channels: dict[ChannelID, LocalChannel] = {}

        def channel(cid: ChannelID) -> LocalChannel:
            found = channels.get(cid)
            if found is None:
                found = channels[cid] = LocalChannel(capacity, name=str(cid))
            return found

        chains = {
            v.id: serialize_chain(v.name, tuple(v.operators)) for v in execution_graph.job_graph.vertices
        }
        tasks = []
        for descriptor in descriptors:
            tdd = dataclasses.replace(descriptor, operators=deserialize_chain(chains[descriptor.vertex_id]))
            vertex = execution_graph.job_graph.vertex(tdd.vertex_id)
            inputs = [channel(c) for c in execution_graph.input_channel_ids(vertex, tdd.subtask_index)]
            outputs = [
                [channel(c) for c in edge]
                for edge in execution_graph.output_channel_ids(vertex, tdd.subtask_index)
            ]
            tasks.append(StreamTask(tdd, inputs, outputs, services, listener))
        if self._deployment is not None and self._deployment.reporter is not None:
            self._deployment.reporter.stop()  # the previous attempt's, should it still run
        deployment = self._deployment = LocalDeployment(tasks, channels, reporter)
        deployment.start()
        return deployment

    def close(self) -> None:
        deployment = self._deployment
        if deployment is not None and deployment.reporter is not None:
            deployment.reporter.stop()
