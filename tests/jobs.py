"""Functions for end-to-end checkpointing tests (importable, so every subtask can rebuild them)."""

from __future__ import annotations

import random
from typing import Any

from chandy.core.functions import (
    CheckpointedFunction,
    FilterFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedProcessFunction,
    MapFunction,
    RuntimeContext,
)
from chandy.core.state import ListStateDescriptor, ValueStateDescriptor
from tests.probes import Probe


class OperatorStateCounter(CheckpointedFunction):
    """Counts its records in operator state; reports (attempt, subtask, count) at close."""

    def __init__(self, name: str, probe: Probe) -> None:
        self.name = name
        self.probe = probe
        self.count = 0

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        self.state = context.get_operator_state_store().get_list_state(
            ListStateDescriptor(f"{self.name}-count")
        )
        self.count = sum(self.state.get()) if context.is_restored() else 0

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        self.state.update([self.count])

    def open(self, runtime_context: RuntimeContext) -> None:
        self.attempt = runtime_context.get_attempt_number()
        self.subtask = runtime_context.get_index_of_this_subtask()

    def close(self) -> None:
        self.probe.append((self.name, self.attempt, self.subtask, self.count))


class CountingFilter(OperatorStateCounter, FilterFunction):
    def filter(self, value: Any) -> bool:
        self.count += 1
        return True


class CountingMap(OperatorStateCounter, MapFunction):
    def map(self, value: Any) -> Any:
        self.count += 1
        return value


class FailOnceMap(CountingMap):
    """Raises once, in subtask 0, somewhere between 40 % and 70 % of its expected input."""

    def __init__(self, name: str, probe: Probe, expected_per_subtask: int, seed: int) -> None:
        super().__init__(name, probe)
        rng = random.Random(seed)
        self.fail_at = rng.randint(int(0.4 * expected_per_subtask), int(0.7 * expected_per_subtask))

    def map(self, value: Any) -> Any:
        self.count += 1
        if self.subtask == 0 and self.count == self.fail_at and self.probe.add("failures") == 1:
            raise RuntimeError(f"induced failure at record {self.count}")
        return value


class KeyedCounter(KeyedProcessFunction):
    """Counts per key in keyed state; emits (key, count) when a key is complete, and
    ("overflow", key, count) if a key ever sees more records than it should."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key

    def open(self, runtime_context: RuntimeContext) -> None:
        self.counter = runtime_context.get_state(ValueStateDescriptor("count"))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        count = (self.counter.value() or 0) + 1
        self.counter.update(count)
        if count == self.per_key:
            yield ctx.get_current_key(), count
        elif count > self.per_key:
            yield "overflow", ctx.get_current_key(), count


def final_counts(probe: Probe, name: str) -> dict[int, int]:
    """Per subtask, the count its last attempt reported at close."""
    latest: dict[int, tuple[int, int]] = {}
    for entry_name, attempt, subtask, count in probe.items:
        if entry_name == name and attempt >= latest.get(subtask, (-1, 0))[0]:
            latest[subtask] = (attempt, count)
    return {subtask: count for subtask, (_, count) in latest.items()}


class SlowMap(MapFunction):
    """Sleeps ``delay_s`` per record while the shared ``budget`` (in records) lasts, across
    attempts; then runs at full speed. Makes checkpoints time out for a while."""

    def __init__(self, probe: Probe, budget: int, delay_s: float) -> None:
        self.probe = probe
        self.budget = budget
        self.delay_s = delay_s
        self.exhausted = False

    def map(self, value: Any) -> Any:
        if not self.exhausted:
            if self.probe.add("slow") <= self.budget:
                import time

                time.sleep(self.delay_s)
            else:
                self.exhausted = True  # stop asking the (file-backed) probe per record
        return value


class Throttle(MapFunction):
    """Sleeps ``delay_s`` per record (a source that cannot finish before the test acts)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def map(self, value: Any) -> Any:
        import time

        time.sleep(self.delay_s)
        return value
