"""Drive one operator by hand: records, checkpoints, notifications, failure and restore.

Like Flink's ``OneInputStreamOperatorTestHarness``: the operator is the real one,
its state goes through the real operator state backend, snapshot bytes and all,
so a "restore" here is what a task does after a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from chandy.state.handles import ByteStreamStateHandle, KeyGroupsStateHandle
from chandy.state.heap import HeapKeyedStateBackend, SerializedKeyedState
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.storage.checkpoint_storage import StateReader
from chandy.task.batches import KeyedBatch, TimestampedBatch
from chandy.task.operators.base import (
    Emit,
    StateInitializationContext,
    StateSnapshotContext,
    StreamOperator,
    TwoInputStreamOperator,
)
from chandy.task.processing_time import ProcessingTimeService
from chandy.task.runtime_context import StreamingRuntimeContext
from chandy.util.clock import ManualClock

Snapshot = tuple[bytes, dict[str, Any]] | None
MAX_PARALLELISM = 128


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
        keyed_state_backend: HeapKeyedStateBackend | None = None,
        output: Emit | None = None,
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
                max_parallelism=MAX_PARALLELISM,
                attempt_number=attempt,
                job_parameters={"execution.checkpointing.interval": 1000, **(config or {})},
                keyed_state_backend=keyed_state_backend,
            ),
            output or self.output.extend,
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
            self.operator.operator_state_backend.restore(handles, StateReader().read)
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


@dataclass
class KeyedSnapshot:
    """What a checkpoint stores of one keyed operator subtask: keyed state bytes (per key
    group, as the task serializes them) and operator state."""

    keyed: SerializedKeyedState | None
    operator: Snapshot


def _timed(batch: Any) -> list[tuple[Any, int | None]]:
    if type(batch) is list:
        return [(v, None) for v in batch]
    assert type(batch) is TimestampedBatch, f"unexpected batch type {type(batch).__name__}"
    return list(batch)


class KeyedOperatorHarness(OperatorHarness):
    """One subtask of a keyed operator: a heap backend for its key-group range, a
    ManualClock processing time, records with keys (and timestamps), watermarks, side
    outputs, and snapshots restorable at another parallelism (Flink's
    ``KeyedOneInputStreamOperatorTestHarness``).

    ``batches`` holds every emitted batch as it was (a list or a TimestampedBatch);
    :meth:`records` flattens them to ``(value, timestamp)``.
    """

    def __init__(
        self,
        operator: StreamOperator,
        key_selector: Callable[[Any], Any],
        *,
        subtask: int = 0,
        parallelism: int = 1,
        clock: ManualClock | None = None,
        side_output_tags: Iterable[str] = (),
        attempt: int = 0,
    ) -> None:
        self.key_selector = key_selector
        self.key_group_range = KeyGroupRange.of_operator(MAX_PARALLELISM, parallelism, subtask)
        self.clock = clock or ManualClock(start_ms=1_000)
        self.backend = HeapKeyedStateBackend(self.key_group_range, MAX_PARALLELISM, clock=self.clock)
        self.batches: list[Any] = []
        super().__init__(
            operator,
            subtask=subtask,
            parallelism=parallelism,
            attempt=attempt,
            operator_id="keyed-under-test",
            keyed_state_backend=self.backend,
            output=self.batches.append,
        )
        self.processing_time = ProcessingTimeService(self.clock)
        operator.processing_time_service = self.processing_time
        self.watermarks: list[int] = []
        operator.emit_watermark = self.watermarks.append
        self.side_batches: dict[str, list[Any]] = {tag: [] for tag in side_output_tags}
        operator.side_outputs = {tag: batches.append for tag, batches in self.side_batches.items()}

    def owns(self, key: Any) -> bool:
        """True if ``key`` belongs to this subtask's key groups."""
        return assign_to_key_group(key, MAX_PARALLELISM) in self.key_group_range

    def open_keyed(
        self, restore_from: list[KeyedSnapshot] | None = None, restored_checkpoint_id: int | None = None
    ) -> KeyedOperatorHarness:
        """Restore keyed state from every given subtask snapshot (this subtask takes its key
        groups, as after redistribution) and operator state, then initialize and open."""
        if restore_from is not None:
            handles = [
                KeyGroupsStateHandle(s.key_group_range, s.ranges, ByteStreamStateHandle("x", s.payload))
                for snapshot in restore_from
                if (s := snapshot.keyed) is not None
            ]
            self.backend.restore(handles, StateReader())  # type: ignore[attr-defined]
            self.open([s.operator for s in restore_from], restored_checkpoint_id or 1)
        else:
            self.open()
        return self

    def process_records(
        self, values: Iterable[Any], timestamps: Iterable[int | None] | None = None, input_number: int = 0
    ) -> None:
        """One KeyedBatch of ``values`` (all must belong to this subtask), with a timestamp
        column if ``timestamps`` is given; to input 1 or 2 of a two-input operator if
        ``input_number`` says so (its key selector then takes the records of both)."""
        batch = KeyedBatch() if timestamps is None else KeyedBatch.with_timestamps()
        for value in values:
            key = self.key_selector(value)
            kg = assign_to_key_group(key, MAX_PARALLELISM)
            if kg not in self.key_group_range:
                raise ValueError(f"key {key!r} (key group {kg}) is not this subtask's {self.key_group_range}")
            batch.key_groups.append(kg)
            batch.keys.append(key)
            batch.values.append(value)
        if timestamps is not None:
            assert batch.timestamps is not None
            batch.timestamps.extend(timestamps)
        if input_number == 0:
            self.operator.process_batch(batch)  # type: ignore[arg-type]
        else:
            assert isinstance(self.operator, TwoInputStreamOperator)
            (self.operator.process_batch1 if input_number == 1 else self.operator.process_batch2)(batch)

    def watermark(self, timestamp: int) -> None:
        self.operator.process_watermark(timestamp)

    def advance_processing_time(self, ms: float) -> int:
        """Move the clock and run the due processing-time callbacks (as the task loop does)."""
        self.clock.advance_ms(ms)
        return self.processing_time.fire_due()

    def records(self) -> list[tuple[Any, int | None]]:
        return [r for batch in self.batches for r in _timed(batch)]

    def values(self) -> list[Any]:
        return [v for v, _ in self.records()]

    def side_records(self, tag: str) -> list[tuple[Any, int | None]]:
        return [r for batch in self.side_batches[tag] for r in _timed(batch)]

    def snapshot_keyed(self, checkpoint_id: int) -> KeyedSnapshot:
        """The checkpoint of this subtask: operator hooks, copy-on-write keyed copy,
        serialized key group by key group, released."""
        operator_state = self.snapshot(checkpoint_id)
        snapshot = self.backend.snapshot()
        try:
            keyed = None if snapshot.is_empty else snapshot.serialize()
        finally:
            snapshot.release()
        return KeyedSnapshot(keyed, operator_state)
