"""Functions for end-to-end checkpointing tests (importable, so every subtask can rebuild them)."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from chandy.connectors.number_sequence import NumberSequenceReader, NumberSequenceSource
from chandy.core.connector import SourceReaderContext
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
    """Sleeps ``delay_s`` per record (a source that cannot finish before the test acts).

    With ``until`` (a file's path), only until that file exists: a test that needs the job
    running while it kills or stops something calls :func:`release` once it is done, and
    the rest of the input runs at full speed instead of being paced for nothing (in every
    process and attempt: the file is the signal, looked for at most every 10 ms)."""

    def __init__(self, delay_s: float, until: str | None = None) -> None:
        self.delay_s = delay_s
        self.until = until
        self.released = False
        self._next_look = 0.0

    def map(self, value: Any) -> Any:
        import time

        if self.until is not None:
            now = time.monotonic()
            if now >= self._next_look:
                if os.path.exists(self.until):
                    self.released, self.until = True, None  # for good: no more looking
                self._next_look = now + 0.01
        if not self.released:
            time.sleep(self.delay_s)
        return value


class HoldingSequence(NumberSequenceSource):
    """``from_sequence(start, end)`` whose readers stop after ``hold_after`` numbers each and
    then emit nothing until the job is cancelled: idle, so checkpoints go on. A test that
    must act while the job still runs (cancel it after a checkpoint, take a savepoint) waits
    for the event it needs, never for time: the job cannot finish first, however slow or
    loaded the machine. ``hold_after=None`` reads to the end (the same source's state, for
    the run that restores).

    With ``more_per_checkpoint``, each completed checkpoint lets every reader emit that many
    more: a job that must see some checkpoints before its end gets them, paced by the
    checkpoints themselves instead of by sleeps. With ``until`` (a file's path), the hold ends
    for good once that file exists (:func:`release`): the test lets the job finish once it saw
    what it waited for."""

    def __init__(
        self,
        start: int,
        end: int,
        hold_after: int | None,
        more_per_checkpoint: int = 0,
        until: str | None = None,
    ) -> None:
        super().__init__(start, end)
        self.hold_after = hold_after
        self.more_per_checkpoint = more_per_checkpoint
        self.until = until

    def create_reader(self, context: SourceReaderContext) -> NumberSequenceReader:
        return _HoldingReader(self.hold_after, self.more_per_checkpoint, self.until)


class _HoldingReader(NumberSequenceReader):
    def __init__(self, hold_after: int | None, more_per_checkpoint: int, until: str | None) -> None:
        super().__init__()
        self.left = hold_after
        self.more_per_checkpoint = more_per_checkpoint
        self.until = until

    def poll_next(self, max_records: int) -> list[int] | None:
        if self.left == 0 and self.until is not None and os.path.exists(self.until):
            self.left = None  # released
        if self.left is None:
            return super().poll_next(max_records)
        if self.left == 0:
            return []  # held: nothing available until a checkpoint completes or the release, or for good
        batch = super().poll_next(min(max_records, self.left))
        self.left -= len(batch or [])
        return batch

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.left is not None:
            self.left += self.more_per_checkpoint


def release(until: str) -> None:
    """Lets every :class:`Throttle` waiting ``until`` this file run at full speed (and every
    :class:`HoldingSequence` waiting for it go on)."""
    Path(until).touch()


def kill_a_slot_after_checkpoints(client: Any, checkpoints: int, timeout_s: float = 300.0) -> None:
    """SIGKILL the Python worker of Spark slot 1 (its tasks die with it) once ``checkpoints``
    checkpoints completed; run on a background thread of a Spark test. Gives up silently when
    the job ends or ``timeout_s`` passes first: the test's restarts assertion reports it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:  # on a loaded machine the JobMaster may take a while to answer
            if client.get_checkpoint_statistics(timeout=60)["counts"]["completed"] >= checkpoints:
                break
        except TimeoutError:
            pass
        if client.is_done() or time.monotonic() > deadline:
            return
        time.sleep(0.05)
    victim = client.get_task_slots()[1]["pid"]
    assert victim != os.getpid()
    os.kill(victim, signal.SIGKILL)
