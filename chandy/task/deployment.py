"""What a task is told when it is deployed: its chain, its channels, its place in the job.

Everything here is a plain picklable dataclass, so the same descriptor deploys
a task into this process (local executor) or into a Spark slot (cloudpickled
with the job's user functions).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chandy.messages.ids import ExecutionAttemptID
from chandy.state.snapshot import TaskStateSnapshot
from chandy.task.operators.base import StreamOperator
from chandy.task.partitioners import StreamPartitioner


@dataclass(frozen=True)
class OperatorSpec:
    """One operator of a chain and where its output goes."""

    node_id: int
    name: str
    operator_id: str
    #: Zero-argument, picklable callable that builds a fresh operator instance.
    factory: Callable[[], StreamOperator]
    keyed: bool = False
    #: Node ids of operators in the same chain that consume this one's output.
    chained_outputs: tuple[int, ...] = ()
    #: Indexes into ``TaskDeploymentDescriptor.outputs``.
    network_outputs: tuple[int, ...] = ()
    #: Side outputs: ``(tag_id, chained node ids, network output indexes)`` per consumed tag.
    side_outputs: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = ()
    #: The ``uid()`` the user set (``None``: unset), to name the operator in errors.
    uid: str | None = None


@dataclass(frozen=True)
class OutputSpec:
    """One outgoing edge of the task: the partitioner and how many consumer channels."""

    target_vertex_id: int
    target_name: str
    partitioner: StreamPartitioner
    num_channels: int


@dataclass(frozen=True)
class TaskRestore:
    """The state a subtask starts from: its share of checkpoint ``checkpoint_id``."""

    checkpoint_id: int
    state: TaskStateSnapshot


@dataclass(frozen=True)
class TaskDeploymentDescriptor:
    job_id: str
    job_name: str
    vertex_id: int
    task_name: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    attempt_number: int
    #: The chain, head first, in topological order.
    operators: tuple[OperatorSpec, ...]
    outputs: tuple[OutputSpec, ...]
    num_input_channels: int
    config: Mapping[str, Any] = field(default_factory=dict)
    #: ``None`` on a fresh start.
    task_restore: TaskRestore | None = None
    #: For each input channel, in the order of the task's input gate, which input of the head
    #: operator it feeds: 1 or 2 for a two-input operator; empty (or all 0) for one input.
    input_types: tuple[int, ...] = ()

    @property
    def attempt_id(self) -> ExecutionAttemptID:
        return ExecutionAttemptID(self.vertex_id, self.subtask_index, self.attempt_number)

    @property
    def is_source(self) -> bool:
        return self.num_input_channels == 0

    @property
    def name_with_subtask(self) -> str:
        return f"{self.task_name} ({self.subtask_index + 1}/{self.parallelism})"


def serialize_chain(vertex_name: str, operators: tuple[OperatorSpec, ...]) -> bytes:
    """The chain of a vertex as bytes: every subtask deserializes its own copy.

    As in Flink, each parallel subtask gets its own instance of every user
    function, so state a function keeps in ``self`` is never shared between
    subtasks, and a job behaves the same in one process as across Spark
    executors. A function that cannot be serialized is named in the error.
    """
    from chandy.errors import InvalidProgramError
    from chandy.util.code_pickling import dumps

    try:
        # Code objects keep their file names: a traceback from a task names the job's script.
        return dumps(operators)
    except Exception as exc:
        for spec in operators:
            try:
                dumps(spec.factory)
            except Exception as inner:
                raise InvalidProgramError(
                    f"the function of operator '{spec.name}' (task '{vertex_name}') cannot be "
                    f"serialized: {type(inner).__name__}: {inner}. Every parallel subtask gets "
                    "its own copy of each function (shipped to Spark executors too): create "
                    "files, sockets, locks and clients in open(), not in __init__"
                ) from inner
        raise InvalidProgramError(f"task '{vertex_name}' cannot be serialized: {exc}") from exc


def deserialize_chain(payload: bytes, vertex_name: str = "") -> tuple[OperatorSpec, ...]:
    """A fresh copy of a chain serialized by :func:`serialize_chain` (trusted bytes only).

    Where the chain was serialized in another process (the driver) and the functions
    refer to a module by name, this process must be able to import that module. When it
    cannot, the error says so and how to ship the module: it is the first thing to go
    wrong when a job moves from a laptop to a cluster, and a restart would only repeat
    it, so the job fails at once.
    """
    import cloudpickle

    from chandy.errors import UnrecoverableError

    task = f" of task '{vertex_name}'" if vertex_name else ""
    try:
        chain: tuple[OperatorSpec, ...] = cloudpickle.loads(payload)  # cloudpickle has no type hints
        return chain
    except ImportError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        raise UnrecoverableError(
            f"the functions{task} cannot be loaded where the task runs: {type(exc).__name__}: "
            f"{exc}. The module '{missing}' that defines them is imported there by name, so "
            "it must be importable on every Spark executor: ship it with "
            "spark.submit.pyFiles (spark-submit --py-files, SparkContext.addPyFile) or "
            "install it in the executors' Python; functions defined in the job's main "
            "script travel by value and need neither"
        ) from exc
    except Exception as exc:
        raise UnrecoverableError(
            f"the functions{task} cannot be loaded where the task runs: {type(exc).__name__}: "
            f"{exc}. The executors' Python must match the driver's: the same Python version "
            "and the same versions of the packages the functions use"
        ) from exc
