"""The job of Flink's ``UnalignedCheckpointITCase``, in chandy (importable, so every subtask and
Spark slot can rebuild its functions).

Subtask ``i`` of ``n`` sources emits the longs ``i, i + n, i + 2n, ...`` (its *partition* is
``value % n``), so every record says where it came from and which record of that source must
precede it. The records cross a keyed exchange (by partition: each source's records travel one
channel, in order) into :class:`OrderCheck`, then a rebalance exchange into :class:`SlowCheck`,
which sleeps to backpressure everything upstream: in-flight data piles up in every channel,
exactly what an unaligned barrier overtakes and a checkpoint must persist and replay.

Both checks keep what they saw in checkpointed state, as Flink's verifying sink does, so a
record lost, doubled or reordered by a restore shows up as a count in state, not as a flaky
timing: :class:`OrderCheck` (keyed state, per partition) counts lost, duplicated and
out-of-order records and emits one :data:`Report` when its partition's last record arrives;
:class:`SlowCheck` (operator state, per subtask and partition) counts records and order
violations on its side of the rebalance (order per partition holds per channel) and writes
them into a probe when its last attempt closes. :class:`SlowCheck` also induces the failures:
it raises after some checkpoints completed in its attempt, a given number of times.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from chandy import StreamExecutionEnvironment
from chandy.api.datastream import DataStream
from chandy.core.functions import (
    CheckpointedFunction,
    CheckpointListener,
    FlatMapFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedProcessFunction,
    MapFunction,
    RuntimeContext,
)
from chandy.core.state import ListStateDescriptor, ValueStateDescriptor
from tests.probes import Probe

#: ``("report", partition, count, lost, duplicated, out_of_order)``: what :class:`OrderCheck`
#: emits once per source partition, when that partition's last record arrives.
Report = tuple[str, int, int, int, int, int]


class Strided(MapFunction):
    """Turns the number sequence ``0 .. n * per_subtask - 1`` into Flink's ``LongSource`` of
    UnalignedCheckpointITCase. The sequence source gives subtask ``i`` the indices
    ``i * per_subtask ..`` (its split, with its position, is its state); chained to it, this
    map makes them ``i, i + n, ..., i + (per_subtask - 1) * n``."""

    def __init__(self, parallelism: int, per_subtask: int) -> None:
        self.n = parallelism
        self.per_subtask = per_subtask

    def map(self, index: int) -> int:
        return index // self.per_subtask + (index % self.per_subtask) * self.n


class OrderCheck(KeyedProcessFunction):
    """Keyed by source partition: every value must be the previous one plus ``n``. A gap counts
    the values it skipped as lost, the previous value again as duplicated, an older one as
    out of order. Passes the values on; emits a :data:`Report` at the partition's last value."""

    def __init__(self, parallelism: int, per_subtask: int) -> None:
        self.n = parallelism
        self.per_subtask = per_subtask

    def open(self, runtime_context: RuntimeContext) -> None:
        # (last, count, lost, duplicated, out_of_order)
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen"))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Iterable[Any]:
        partition = ctx.get_current_key()
        last, count, lost, duplicated, out_of_order = self.seen.value() or (partition - self.n, 0, 0, 0, 0)
        if value == last + self.n:
            last = value
        elif value > last:
            lost += (value - last) // self.n - 1
            last = value
        elif value == last:
            duplicated += 1
        else:
            out_of_order += 1
        count += 1
        self.seen.update((last, count, lost, duplicated, out_of_order))
        yield value
        if value == partition + (self.per_subtask - 1) * self.n:
            yield ("report", partition, count, lost, duplicated, out_of_order)


class SlowCheck(FlatMapFunction, CheckpointedFunction, CheckpointListener):
    """After the rebalance: sleeps ``pause_s`` every ``every`` records (the backpressure),
    counts per partition the records it got and those not newer than the partition's last one
    on this subtask (a channel keeps each partition's order), in operator state; forwards the
    reports only. At close, writes ``(name, attempt, subtask, {partition: (count,
    out_of_order)})`` into the probe: the last attempt's entry is the whole run's.

    In subtask 0 it raises once ``fail_after`` checkpoints completed in its attempt, until the
    probe counted ``failures`` such raises (across attempts and processes)."""

    def __init__(
        self,
        name: str,
        probe: Probe,
        parallelism: int,
        every: int,
        pause_s: float,
        failures: int = 0,
        fail_after: int = 2,
    ) -> None:
        self.name = name
        self.probe = probe
        self.n = parallelism
        self.every = every
        self.pause_s = pause_s
        self.failures = failures
        self.fail_after = fail_after

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        self.state = context.get_operator_state_store().get_list_state(ListStateDescriptor("seen"))
        # partition -> [count, last, out_of_order]
        self.seen: dict[int, list[int]] = {}
        if context.is_restored():
            # After rescaling (from a savepoint) one subtask may get several old subtasks'
            # entries of a partition: every record after the savepoint is newer than all of them.
            for partition, count, last, out_of_order in self.state.get():
                old = self.seen.get(partition, [0, last, 0])
                self.seen[partition] = [old[0] + count, max(old[1], last), old[2] + out_of_order]

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        self.state.update([(p, c, last, o) for p, (c, last, o) in self.seen.items()])

    def open(self, runtime_context: RuntimeContext) -> None:
        self.attempt = runtime_context.get_attempt_number()
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.completed = 0
        self.may_fail = self.subtask == 0 and self.failures > 0
        self.since_pause = 0

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed += 1

    def flat_map(self, value: Any) -> Iterable[Any]:
        if isinstance(value, tuple):
            yield value
            return
        if self.may_fail and self.completed >= self.fail_after:
            self.may_fail = False  # this attempt asks the probe once
            if self.probe.add("failures") <= self.failures:
                raise RuntimeError(f"induced failure after {self.completed} completed checkpoints")
        entry = self.seen.get(value % self.n)
        if entry is None:
            self.seen[value % self.n] = [1, value, 0]
        else:
            entry[0] += 1
            if value <= entry[1]:
                entry[2] += 1
            else:
                entry[1] = value
        self.since_pause += 1
        if self.since_pause >= self.every and self.pause_s > 0:
            self.since_pause = 0
            time.sleep(self.pause_s)

    def close(self) -> None:
        counts = {p: (c, o) for p, (c, _, o) in self.seen.items()}
        self.probe.append((self.name, self.attempt, self.subtask, counts))


def unaligned_pipeline(
    env: StreamExecutionEnvironment,
    probe: Probe,
    per_subtask: int,
    *,
    every: int,
    pause_s: float,
    failures: int = 0,
    name: str = "sink",
    partitions: int | None = None,
) -> DataStream:
    """source -> keyBy(partition) -> OrderCheck -> rebalance -> SlowCheck, with stable uids
    (a later run may restore from a checkpoint of this one). ``partitions`` (default: the
    parallelism) is the ``n`` of the values: a run rescaled from a savepoint keeps the first
    run's."""
    n = partitions or env.get_parallelism()
    return (
        env.from_sequence(0, n * per_subtask - 1)
        .uid("longs")
        .map(Strided(n, per_subtask))
        .uid("strided")
        .key_by(lambda value: value % n)
        .process(OrderCheck(n, per_subtask))
        .uid("order-check")
        .rebalance()
        .flat_map(SlowCheck(name, probe, n, every, pause_s, failures))
        .uid("slow-check")
    )


def assert_exactly_once_in_order(
    reports: list[Any], probe: Probe, name: str, n: int, per_subtask: int, subtasks: int | None = None
) -> None:
    """Every partition reported once by :class:`OrderCheck` with all its records and count
    lost = duplicated = out-of-order = 0; :class:`SlowCheck`'s last attempts together got each
    partition's records exactly once, none out of order."""
    assert sorted(reports) == [("report", p, per_subtask, 0, 0, 0) for p in range(n)], reports
    latest: dict[int, tuple[int, dict[int, tuple[int, int]]]] = {}
    for entry_name, attempt, subtask, counts in probe.items:
        if entry_name == name and attempt >= latest.get(subtask, (-1, {}))[0]:
            latest[subtask] = (attempt, counts)
    expected = list(range(subtasks or n))
    assert sorted(latest) == expected, f"{name}: no close report from some subtask: {sorted(latest)}"
    for partition in range(n):
        got = [counts.get(partition, (0, 0)) for _, counts in latest.values()]
        assert sum(c for c, _ in got) == per_subtask, f"partition {partition}: {got} (per subtask)"
        assert sum(o for _, o in got) == 0, f"partition {partition} out of order after the rebalance: {got}"


def completed_checkpoints(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """The completed (non-savepoint) checkpoints of a job's statistics history, oldest first."""
    done = [h for h in stats["history"] if h["status"] == "COMPLETED" and not h["is_savepoint"]]
    return sorted(done, key=lambda h: h["id"])


def subtask_details(rest_url: str, job_id: str, checkpoint_id: int) -> list[dict[str, Any]]:
    """Every acknowledged subtask's details of one checkpoint, from the REST API
    (Flink's ``/jobs/:jobid/checkpoints/details/:checkpointid``)."""
    import httpx

    with httpx.Client(base_url=rest_url, timeout=30) as http:
        response = http.get(f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}")
        response.raise_for_status()
        tasks = response.json()["tasks"]
        subtasks = []
        for vertex in tasks:
            detail = http.get(f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{vertex}")
            detail.raise_for_status()
            subtasks.extend(s for s in detail.json()["subtasks"] if s["status"] == "completed")
        return subtasks


def wait_for(condition: Any, what: str, timeout_s: float = 60.0) -> Any:
    """Poll ``condition()`` until it returns something true (and return that)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.02)
    return value
