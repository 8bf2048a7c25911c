"""The executor contract: how a JobMaster places tasks somewhere and stops them."""

from __future__ import annotations

from abc import ABC, abstractmethod

from chandy.graph.execution_graph import ExecutionGraph
from chandy.task.deployment import TaskDeploymentDescriptor
from chandy.task.services import TaskServices, TaskStateListener


class Deployment(ABC):
    """The running tasks of one deployment (one attempt of the whole job)."""

    @abstractmethod
    def cancel(self) -> None:
        """Ask every task to stop; returns at once."""

    @abstractmethod
    def wait_stopped(self, timeout_s: float) -> bool:
        """Wait until every task's thread or process has ended; False on timeout."""


class Executor(ABC):
    """Places the tasks of a job."""

    @abstractmethod
    def deploy(self, execution_graph: ExecutionGraph, descriptors: list[TaskDeploymentDescriptor],
               listener: TaskStateListener, services: TaskServices) -> Deployment:
        """Start one task per descriptor, wired by the channels the graph defines."""

    def close(self) -> None:
        """Release what the executor holds (sessions, servers)."""
