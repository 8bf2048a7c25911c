"""The executor contract: how a JobMaster places tasks somewhere, reaches and stops them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from chandy.graph.execution_graph import ExecutionGraph
from chandy.messages.checkpoint import CheckpointOptions
from chandy.messages.ids import ExecutionAttemptID
from chandy.task.deployment import TaskDeploymentDescriptor
from chandy.task.services import TaskServices, TaskStateListener


class Deployment(ABC):
    """The running tasks of one deployment (one attempt of the whole job).

    Besides stopping them, it is the JobMaster's way to the tasks: the
    checkpoint coordinator's trigger and notifications go through it (in this
    process as mails; to Spark slots as RPC).
    """

    @abstractmethod
    def cancel(self) -> None:
        """Ask every task to stop; returns at once."""

    @abstractmethod
    def wait_stopped(self, timeout_s: float) -> bool:
        """Wait until every task's thread or process has ended; False on timeout."""

    @abstractmethod
    def trigger_checkpoint(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int, options: CheckpointOptions
    ) -> bool:
        """Ask one task to checkpoint; False if this deployment has no such task."""

    @abstractmethod
    def notify_checkpoint_complete(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None: ...

    @abstractmethod
    def notify_checkpoint_aborted(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None: ...


class Executor(ABC):
    """Places the tasks of a job."""

    def prepare(self, slots: int, checkpoint_dir: str | None, job_name: str = "") -> None:
        """Check, before anything runs, that this executor can run a job needing ``slots``
        slots with checkpoints in ``checkpoint_dir``; raise a clear error if not.
        ``job_name`` names what the executor starts for the job (Spark's application)."""

    @abstractmethod
    def deploy(
        self,
        execution_graph: ExecutionGraph,
        descriptors: list[TaskDeploymentDescriptor],
        listener: TaskStateListener,
        services: TaskServices,
    ) -> Deployment:
        """Start one task per descriptor, wired by the channels the graph defines.

        Raises if the tasks cannot be placed (a slot died while the slots started, too
        few slots came up in time): the JobMaster counts that as one more failure for the
        restart strategy, as it does a task's, so a deployment never ends a job by itself.
        When it raises it must leave none of these tasks running (the JobMaster gets no
        :class:`Deployment` to cancel them with), and it must return or raise within a
        bounded time: the JobMaster's thread waits on it."""

    def slots(self) -> list[dict[str, Any]]:
        """The processes the job's tasks run in (none apart from this one by default)."""
        return []

    def end_process(self) -> None:
        """The process is about to exit (SIGTERM), after :meth:`close`: stop what would
        outlive it and print about its end (Spark's session). Nothing by default."""

    def close(self) -> None:
        """Release what the executor holds (sessions, servers)."""
