"""Drive one operator by hand: records, checkpoints, notifications, failure and restore.

Like Flink's ``OneInputStreamOperatorTestHarness``: the operator is the real one,
its state goes through the real operator state backend, snapshot bytes and all,
so a "restore" here is what a task does after a failure.
"""

from __future__ import annotations

from typing import Any

from chandy.state.handles import ByteStreamStateHandle
from chandy.task.operators.base import (
    StateInitializationContext,
    StateSnapshotContext,
    StreamOperator,
)
from chandy.task.runtime_context import StreamingRuntimeContext

Snapshot = tuple[bytes, dict[str, Any]] | None


class OperatorHarness:
    def __init__(
        self,
        operator: StreamOperator,
        *,
        subtask: int = 0,
        parallelism: int = 1,
        attempt: int = 0,
        config: dict[str, Any] | None = None,
        operator_id: str = "sink-under-test",
    ) -> None:
        self.operator = operator
        self.output: list[Any] = []
        operator.operator_id = operator_id
        operator.setup(
            StreamingRuntimeContext(
                job_id="job",
                job_name="harness",
                task_name="task",
                operator_name="operator",
                subtask_index=subtask,
                parallelism=parallelism,
                max_parallelism=128,
                attempt_number=attempt,
                job_parameters={"execution.checkpointing.interval": 1000, **(config or {})},
            ),
            self.output.extend,
        )

    def open(
        self, restore_from: list[Snapshot] | None = None, restored_checkpoint_id: int | None = None
    ) -> OperatorHarness:
        """Initialize (restoring every given subtask snapshot, as after redistribution) and open."""
        if restore_from is not None:
            handles = [
                (metas, ByteStreamStateHandle("x", payload))
                for snapshot in restore_from
                if snapshot is not None
                for payload, metas in [snapshot]
            ]
            self.operator.operator_state_backend.restore(handles, lambda h, r: h.data[r[0] : r[1]])
        self.operator.initialize_state(
            StateInitializationContext(
                self.operator.operator_state_backend,
                restored_checkpoint_id if restore_from is not None else None,
            )
        )
        self.operator.open()
        return self

    def process(self, *records: Any) -> None:
        self.operator.process_batch(list(records))

    def snapshot(self, checkpoint_id: int) -> Snapshot:
        """The synchronous part of a checkpoint: what the checkpoint would store."""
        self.operator.snapshot_state(StateSnapshotContext(checkpoint_id, 0))
        return self.operator.operator_state_backend.snapshot()

    def notify_complete(self, checkpoint_id: int) -> None:
        self.operator.notify_checkpoint_complete(checkpoint_id)

    def end_input(self) -> None:
        self.operator.end_input()
        self.operator.finish()

    def close(self) -> None:
        self.operator.close()
