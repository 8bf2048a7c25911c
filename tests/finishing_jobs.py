"""A bounded job whose subtasks end at different times, and faults timed to a subtask's end.

Subtask 0 reads a short split and ends; subtask 1 reads a long one, paced until the fault has
struck, so the fault lands while subtask 0 is finishing (or has finished) and subtask 1 still
runs. Signals between subtasks are files in one directory: the subtasks are threads on the
local executor and processes on Spark, and every attempt of every subtask sees the same files.
A fault strikes once (the directory ``struck`` is created atomically by the one that raises).
"""

from __future__ import annotations

import os
import time
from typing import Any

from chandy.core.functions import (
    CheckpointedFunction,
    CheckpointListener,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedProcessFunction,
    MapFunction,
    ReduceFunction,
    RuntimeContext,
)
from chandy.core.state import ValueStateDescriptor
from chaos.finishing import UnevenNumberSequence

#: Where a fault strikes, relative to subtask 0 ending its input:
#: ``end-of-input``: as subtask 0 maps the last record of its split (before its end of input,
#: so before its final checkpoint is triggered);
#: ``final-snapshot``: in a snapshot of a checkpoint taken after subtask 0 read its last record
#: (its final checkpoint, pending);
#: ``final-complete``: as a checkpoint taken after that completes, in the completion notice
#: (the map is ahead of the sink in its chain: the sink has not committed yet);
#: ``finished``: once subtask 0's task has ended (its final transaction committed).
MOMENTS = ("end-of-input", "final-snapshot", "final-complete", "finished")

__all__ = [
    "MOMENTS",
    "FaultNearTheEnd",
    "RunningCount",
    "SlowCountSum",
    "UnevenNumberSequence",
    "position_in_split",
]


class FaultNearTheEnd(MapFunction, CheckpointedFunction, CheckpointListener):
    """Identity map that raises once in subtask ``victim`` at ``moment`` (see :data:`MOMENTS`).

    Subtask 1 sleeps ``pace_s`` per record until the fault struck, so it is still running when
    subtask 0 ends. ``last_of_split0`` is the last number subtask 0 reads."""

    def __init__(self, signals: str, moment: str, victim: int, last_of_split0: int, pace_s: float) -> None:
        if moment not in MOMENTS:
            raise ValueError(f"moment must be one of {MOMENTS}")
        if moment == "finished" and victim == 0:
            raise ValueError("a finished subtask cannot fail")
        self.signals = signals
        self.moment = moment
        self.victim = victim
        self.last_of_split0 = last_of_split0
        self.pace_s = pace_s
        self.seen_last = False
        self.struck_seen = False

    # -- the signals

    def _path(self, name: str) -> str:
        return os.path.join(self.signals, name)

    def _signal(self, name: str) -> None:
        with open(self._path(name), "a"):
            pass

    def _signalled(self, name: str) -> bool:
        return os.path.exists(self._path(name))

    def _strike(self, where: str) -> None:
        try:
            os.mkdir(self._path("struck"))
        except FileExistsError:
            return
        raise RuntimeError(f"induced fault in subtask {self.subtask} at {self.moment} ({where})")

    def _struck(self) -> bool:
        if not self.struck_seen:
            self.struck_seen = self._signalled("struck")
        return self.struck_seen

    # -- the function

    def open(self, runtime_context: RuntimeContext) -> None:
        self.subtask = runtime_context.get_index_of_this_subtask()

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        pass

    def map(self, value: Any) -> Any:
        if self.subtask == 0 and value == self.last_of_split0:
            self.seen_last = True
            self._signal("ended")
            if self.moment == "end-of-input" and self.victim == 0:
                self._strike("its last record")
        elif self.subtask == 1 and not self._struck():
            if self.victim == 1 and (
                (self.moment == "end-of-input" and self._signalled("ended"))
                or (self.moment == "finished" and self._signalled("closed"))
            ):
                self._strike(f"record {value}")
            time.sleep(self.pace_s)
        return value

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        self._at_checkpoint("final-snapshot", context.get_checkpoint_id(), "the snapshot")

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._at_checkpoint("final-complete", checkpoint_id, "the completion")

    def _at_checkpoint(self, moment: str, checkpoint_id: int, what: str) -> None:
        """At ``moment`` of checkpoint ``checkpoint_id``: subtask 0, past its last record, marks
        the checkpoint as its final one (and strikes if it is the victim); subtask 1 strikes
        at that checkpoint or a later one, if it is the victim."""
        if self.moment != moment or self._struck():
            return
        if self.subtask == 0 and self.seen_last:
            self._signal(f"final-{checkpoint_id}")
            if self.victim == 0:
                self._strike(f"{what} of checkpoint {checkpoint_id}")
        elif self.subtask == 1 and self.victim == 1 and self._final_at_or_before(checkpoint_id):
            self._strike(f"{what} of checkpoint {checkpoint_id}")

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        pass

    def _final_at_or_before(self, checkpoint_id: int) -> bool:
        """Subtask 0 took (or was told of) a checkpoint after its last record, up to this one."""
        return any(
            name.startswith("final-") and int(name[6:]) <= checkpoint_id for name in os.listdir(self.signals)
        )

    def close(self) -> None:
        if self.subtask == 0 and self.seen_last:
            self._signal("closed")


class RunningCount(KeyedProcessFunction):
    """Each record as ``{"v": value, "k": key, "c": running count of its key}``."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count"))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        yield {"v": value, "k": ctx.get_current_key(), "c": count}


def position_in_split(sizes: list[int], value: int) -> int:
    """``value``'s position in its split of :class:`UnevenNumberSequence` ``sizes``: an event
    time on which every split starts at 0, so the splits' event times overlap (a short split
    ends at an event time a long one reaches much later)."""
    start = 0
    for size in sizes:
        if value < start + size:
            return value - start
        start += size
    raise ValueError(f"{value} is in no split of {sizes}")


class SlowCountSum(ReduceFunction):
    """Sums ``(key, count, sum)`` tuples, sleeping ``pace_s`` per call: a window task slower
    than its sources, so the ends of their splits (records, final watermark) are still in its
    input channels when an unaligned barrier overtakes them."""

    def __init__(self, pace_s: float) -> None:
        self.pace_s = pace_s

    def reduce(self, value1: Any, value2: Any) -> Any:
        time.sleep(self.pace_s)
        return (value1[0], value1[1] + value2[1], value1[2] + value2[2])
