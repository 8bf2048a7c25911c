"""Bounded sources whose splits end at different times, and faults timed to a subtask finishing.

Issue 26 §1: a two-phase-commit sink must not commit a finishing subtask's last transaction
before a checkpoint covers it, and every task waits for a final checkpoint taken after its
operators finished (Flink's FLIP-147). The faults that test it strike relative to a source
subtask's end, at one of :data:`MOMENTS`, in that subtask (``self``) or in another one
(``other``):

``end-of-input``    as the subtask maps the last record of its split
``final-snapshot``  in its snapshot of its final checkpoint (the first one after that record)
``final-complete``  at that checkpoint's completion notice (before the task ends; the sinks,
                    in the tasks after the keyed exchange, commit on the same notice)
``finished``        once its final checkpoint completed and it closes (``other`` only: a
                    finished subtask cannot fail)

The finishing subtask claims an armed ``finish`` fault when it reaches the fault's moment.
``self`` with ``raise``: it raises there. Otherwise it posts a trigger and waits (up to
:data:`STRIKE_WAIT_S`) in that very moment (its final checkpoint cannot complete meanwhile)
for another party to strike: another running source subtask takes a ``raise`` trigger and
raises, the chaos driver takes a ``kill`` trigger and SIGKILLs a slot process (this one, or
another). A trigger nobody takes is withdrawn and the fault did not happen (the finishing
subtask was the last one running).

Every source subtask marks its split ended (``ended-<last id>``) as it reads its last
record; storage faults with ``after_ended`` wait for that many marks (see
:mod:`chaos.faultyfs`), so they strike in a subtask's final checkpoint or the job's last one.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from chandy.connectors.number_sequence import NumberSequenceSource, NumberSequenceSplit
from chaos.faultyfs import SITE_METADATA, SITE_STATE, FaultPlan

#: Where a finishing fault strikes, relative to a source subtask's end of input.
MOMENTS = ("end-of-input", "final-snapshot", "final-complete", "finished")
#: Fault site of the faults timed to a subtask finishing.
SITE_FINISH = "finish"
#: How long a finishing subtask waits in its moment for another party to strike.
STRIKE_WAIT_S = 3.0
#: How often (seconds) a running source subtask looks for a trigger to take.
TRIGGER_POLL_S = 0.01


class UnevenNumberSequence(NumberSequenceSource):
    """``NumberSequenceSource`` with splits of the given sizes: subtask ``i`` reads ``sizes[i]``
    numbers (a bounded job whose splits end at very different times)."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__(0, sum(sizes) - 1)
        self.sizes = list(sizes)

    def create_splits(self, parallelism: int) -> list[NumberSequenceSplit]:
        if parallelism != len(self.sizes):
            raise ValueError(f"UnevenNumberSequence has {len(self.sizes)} splits, not {parallelism}")
        splits, start = [], 0
        for i, size in enumerate(self.sizes):
            splits.append(NumberSequenceSplit(i, start, start + size - 1))
            start += size
        return splits


def uneven_sizes(rng: random.Random, records: int, parallelism: int) -> list[int]:
    """Split sizes adding to ``records``: one split is the longest, another a tenth to
    two fifths of it, the rest anywhere between, so that paced subtasks finish at very
    different times (the shortest while the others still run)."""
    weights = [rng.uniform(0.1, 1.0) for _ in range(parallelism)]
    longest, shortest = rng.sample(range(parallelism), 2)
    weights[longest] = 1.0
    weights[shortest] = rng.uniform(0.1, 0.4)
    total = sum(weights)
    sizes = [max(1, int(records * w / total)) for w in weights]
    sizes[longest] += records - sum(sizes)
    return sizes


def last_ids(sizes: list[int]) -> frozenset[int]:
    """The last number of each split."""
    ends, start = [], 0
    for size in sizes:
        start += size
        ends.append(start - 1)
    return frozenset(ends)


def finish_params(choice: float) -> dict[str, Any]:
    """A finishing fault's moment and victim, drawn from its seeded ``choice``."""
    rng = random.Random(choice)
    moment = rng.choice(MOMENTS)
    victim = "other" if moment == "finished" or rng.random() < 0.5 else "self"
    return {"moment": moment, "victim": victim, "choice": rng.random()}


def finish_storage_params(choice: float) -> dict[str, str]:
    """A ``finish-storage`` fault, drawn from its seeded ``choice``: which write (``metadata``
    or ``state``), what it does (``raise`` or ``hang``), and after the ``first`` split ended
    (a subtask's final checkpoint) or ``all`` of them (the job's final checkpoint)."""
    rng = random.Random(choice)
    return {
        "site": SITE_METADATA if rng.random() < 0.5 else SITE_STATE,
        "after": "first" if rng.random() < 0.5 else "all",
        "action": "raise" if rng.random() < 0.5 else "hang",
    }


class FinishFaults:
    """The finishing faults of one source subtask (an attempt of it), called by the chaos
    job's pacing map: for each record, snapshot, completion notice, and at its close."""

    def __init__(self, plan_dir: str, subtask: int, ends: frozenset[int]) -> None:
        self.plan = FaultPlan(plan_dir)
        self.subtask = subtask
        self.ends = ends
        #: This attempt read its split's last record.
        self.ended = False
        #: The first checkpoint it snapshotted after that: its final checkpoint.
        self.final_id: int | None = None
        self.final_done = False
        self.next_poll = 0.0

    def on_record(self, value: int) -> None:
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + TRIGGER_POLL_S
            self._take_trigger(f"record {value}")
        if value in self.ends:
            self.ended = True
            self.plan.mark(f"ended-{value}")
            self._moment("end-of-input", f"its last record {value}")

    def on_snapshot(self, checkpoint_id: int) -> None:
        self._take_trigger(f"its snapshot of checkpoint {checkpoint_id}")
        if self.ended and self.final_id is None:
            self.final_id = checkpoint_id
            self._moment("final-snapshot", f"its snapshot of its final checkpoint {checkpoint_id}")

    def on_complete(self, checkpoint_id: int) -> None:
        self._take_trigger(f"checkpoint {checkpoint_id}'s completion notice")
        if self.final_id is not None and checkpoint_id >= self.final_id and not self.final_done:
            self.final_done = True
            self._moment("final-complete", f"its final checkpoint {checkpoint_id}'s completion notice")

    def on_close(self) -> None:
        if self.final_done:  # not a cancelled attempt: it finished
            self._moment("finished", "its end (final checkpoint complete)")

    def _take_trigger(self, where: str) -> None:
        """Another subtask asked for a failure now: raise here."""
        taken = self.plan.take_trigger("raise", skip_from=self.subtask)
        if taken is None:
            return
        fault, trigger = taken
        struck = f"subtask {self.subtask} raised at {where}"
        self.plan.record_fired(fault, struck=True, struck_by=struck)
        raise RuntimeError(
            f"chaos: subtask {self.subtask} fails on purpose as subtask {trigger['from']} reached "
            f"{trigger['where']} ({fault.name})"
        )

    def _moment(self, moment: str, where: str) -> None:
        fault = self.plan.claim(SITE_FINISH, moment=moment)
        if fault is None:
            return
        details = {"subtask": self.subtask, "record": f"subtask {self.subtask} at {where}"}
        if fault.action == "raise" and fault.params["victim"] == "self":
            self.plan.record_fired(fault, struck=True, struck_by="it raised", **details)
            raise RuntimeError(f"chaos: subtask {self.subtask} fails on purpose at {where} ({fault.name})")
        self.plan.record_fired(fault, struck=False, **details)
        self.plan.post_trigger(fault, **{"from": self.subtask, "pid": os.getpid(), "where": where})
        if self._wait_struck(fault.name):
            return
        if self.plan.withdraw_trigger(fault.name):
            self.plan.record_fired(fault, gave_up="no other party took the trigger")
            return
        self._wait_struck(fault.name)  # taken just before the withdrawal: it strikes soon

    def _wait_struck(self, name: str) -> bool:
        """Wait in this moment (the subtask's final checkpoint cannot complete meanwhile)
        until the fault struck (or its taker gave up): whether it did."""
        deadline = time.monotonic() + STRIKE_WAIT_S
        while time.monotonic() < deadline:
            record = self.plan.fired(name) or {}
            if record.get("struck") or record.get("gave_up"):
                return True
            time.sleep(0.005)
        return False
