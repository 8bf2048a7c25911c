"""Control messages between the driver (JobMaster) and the slots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chandy.graph.execution_graph import ChannelID
from chandy.messages.checkpoint import CheckpointOptions
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.status import ExecutionState
from chandy.task.deployment import TaskDeploymentDescriptor
from chandy.task.services import TaskFailure

# ---------------------------------------------------------------------- slot -> driver


@dataclass(frozen=True)
class GatherAddresses:
    """A slot's supervisor, once, before it forks its first slot process: its data
    address. The driver answers with :class:`AddressesGathered` once every slot of the
    pool sent its own (or closes the connection if the pool ended first)."""

    pool_id: str
    slot_index: int
    data_address: str


@dataclass(frozen=True)
class RegisterSlot:
    """A slot process is up: connected to its peers, and ready for tasks. ``pid`` is the
    process that runs the tasks (what a killed "slot process" is)."""

    slot_index: int
    data_address: str
    host: str
    pid: int
    #: The JVM that runs this slot's Python worker (a Spark executor, or the driver in local mode).
    jvm_pid: int | None
    #: The Spark task's Python worker, which forked ``pid`` and forks its successor if it dies.
    supervisor_pid: int | None = None
    #: 0 for the slot's first process, one more for every process that replaced a dead one.
    incarnation: int = 0
    #: The slot pool (Spark job group) the slot was started for; the driver refuses another's.
    pool_id: str = ""


@dataclass(frozen=True)
class TaskStateChanged:
    attempt_id: ExecutionAttemptID
    state: ExecutionState
    failure: TaskFailure | None


@dataclass(frozen=True)
class PublishResults:
    """A batch for ``execute_and_collect``; the slot waits for :class:`ResultsAccepted`."""

    sequence: int
    collect_id: str
    subtask_index: int
    batch: list[Any]
    token: int | None


@dataclass(frozen=True)
class ForwardedLogRecord:
    slot_index: int
    #: The deployment (1 for the first run, one more after every restart).
    attempt: int
    name: str
    level: int
    message: str
    created: float
    exc_text: str | None


@dataclass(frozen=True)
class PrintedOutput:
    """Text a slot wrote to stdout or stderr (``print()``, the print sink)."""

    slot_index: int
    stream: str  # "stdout" | "stderr"
    text: str


@dataclass(frozen=True)
class Heartbeat:
    slot_index: int


# ---------------------------------------------------------------------- driver -> slot


@dataclass(frozen=True)
class AddressesGathered:
    """Every slot's data address, by slot index: the answer to :class:`GatherAddresses`."""

    addresses: dict[int, str]


@dataclass(frozen=True)
class TaskToDeploy:
    """One task for a slot. ``tdd`` comes without its operators; they travel as
    ``chain``, the bytes of :func:`~chandy.task.deployment.serialize_chain`, so that the
    message itself holds only chandy's own types. A slot that cannot import a user's
    module then still reads the message, and fails that task with an error naming the
    module, instead of losing its connection to the driver."""

    tdd: TaskDeploymentDescriptor
    chain: bytes
    inputs: tuple[ChannelID, ...]
    outputs: tuple[tuple[ChannelID, ...], ...]


@dataclass(frozen=True)
class DeployTasks:
    """Start these tasks. Channel frames carry ``generation``, so a later deployment's
    channels never see an earlier one's data."""

    generation: int
    tasks: tuple[TaskToDeploy, ...]
    channel_capacity: int


@dataclass(frozen=True)
class CancelTasks:
    generation: int


@dataclass(frozen=True)
class TriggerCheckpoint:
    attempt_id: ExecutionAttemptID
    checkpoint_id: int
    timestamp: int
    options: CheckpointOptions


@dataclass(frozen=True)
class NotifyCheckpoint:
    attempt_id: ExecutionAttemptID
    checkpoint_id: int
    completed: bool  # False: aborted


@dataclass(frozen=True)
class ResultsAccepted:
    sequence: int
    #: False when the client went away: the sink should stop.
    accepted: bool = True


@dataclass(frozen=True)
class Shutdown:
    reason: str
