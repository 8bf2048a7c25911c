"""What the executor gives a task besides its channels, and how the task reports back.

These are the narrow interfaces between a task and the process that hosts it:
the local executor implements them with direct calls and queues, the Spark
executor with RPC to the driver. A task never knows which.
"""

from __future__ import annotations

import traceback
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from chandy.errors import find_unrecoverable
from chandy.messages.checkpoint import CheckpointResponder
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.metrics import MetricsListener
from chandy.messages.status import ExecutionState
from chandy.storage.checkpoint_storage import CheckpointStorage
from chandy.util.clock import Clock, SystemClock


@dataclass(frozen=True)
class TaskFailure:
    """Why a task failed, in a form that crosses process boundaries.

    ``exception`` is the original object when it could be kept (in-process or
    picklable); ``traceback_text`` always holds the formatted traceback.
    ``unrecoverable`` is decided where the exception is raised, since the object
    may not survive the trip to the JobMaster: an :class:`~chandy.errors.UnrecoverableError`
    anywhere in its chain fails the job instead of restarting it.
    """

    exception: BaseException | None
    exception_type: str
    message: str
    traceback_text: str
    operator_name: str | None
    unrecoverable: bool = False

    @staticmethod
    def of(exc: BaseException, operator_name: str | None) -> TaskFailure:
        return TaskFailure(
            exc,
            type(exc).__name__,
            str(exc),
            "".join(traceback.format_exception(exc)),
            operator_name,
            find_unrecoverable(exc) is not None,
        )


class TaskStateListener(Protocol):
    """Receives every state change of a task (the JobMaster, or an RPC stub to it)."""

    def notify_task_state(
        self, attempt_id: ExecutionAttemptID, state: ExecutionState, failure: TaskFailure | None = None
    ) -> None: ...


class ResultPublisher(Protocol):
    """Carries the batches of ``execute_and_collect()`` to the client."""

    def publish(
        self, collect_id: str, subtask_index: int, batch: list[Any], token: int | None, should_abort: Any
    ) -> None:
        """Hand over ``batch``; may block while the client is slow (backpressure).

        ``token`` is the id of the checkpoint that committed the batch (``None``:
        not checkpointed); a token at or below one already published is dropped.
        """
        ...


@dataclass
class TaskServices:
    """Per-process services a task uses."""

    results: ResultPublisher | None = None
    #: Where acknowledgements and declines of checkpoints go (the coordinator).
    checkpoint_responder: CheckpointResponder | None = None
    #: Where state files are written.
    checkpoint_storage: CheckpointStorage | None = None
    #: Runs the asynchronous part of checkpoints, off the task threads.
    async_executor: Executor | None = None
    #: Processing time of the tasks (injected in tests; the system clock otherwise).
    clock: Clock = field(default_factory=SystemClock)
    #: Where the tasks' metrics reports go (the JobMaster), when the executor reports by call.
    metrics: MetricsListener | None = None
    #: What the state backends of a slot share (RocksDB's cache and write buffers), by slot.
    state_resources: dict[Any, Any] = field(default_factory=dict)
