"""Broadcast rules + keyed events (dynamic filtering), exactly once, on both executors.

Events ``(key, seq)`` pass a threshold on their amount; which threshold depends on the
event's rule version, and the versions' rules arrive on a broadcast stream while the events
flow, so the rule stream changes mid-job. An event whose rule has not arrived yet waits in
keyed state; when the rule comes, ``process_broadcast_element`` releases the waiting events
of every key through ``ctx.apply_to_keyed_state``. The output therefore does not depend on
how the two inputs interleave: it is exactly the events that pass their version's threshold,
once each (the collect sink is exactly-once), which the tests compare with the expected list.

A failure strikes once a completed checkpoint holds some rules: the rule source does not send
them again after the restart, so an event that still needs one is filtered only if the broadcast
state came back from the checkpoint. Restoring a retained checkpoint at another parallelism
(a new subtask has no old subtask of its own) must give every new subtask the rules too:
without them its events would wait forever and be missing from the output.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.core.functions import (
    CheckpointedFunction,
    CheckpointListener,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedBroadcastProcessFunction,
    RuntimeContext,
)
from chandy.core.state import ListStateDescriptor, MapStateDescriptor
from tests.jobs import Throttle
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too
from tests.test_checkpointing_e2e import cancel_keeping_results, drain, latest_checkpoint_dir
from tests.test_timers_e2e import wait_for

N = 4_000
KEYS = 24
THRESHOLDS = {1: 10, 2: 50, 3: 25, 4: 80}
VERSIONS = len(THRESHOLDS)
RULES = MapStateDescriptor("rules")
PENDING = ListStateDescriptor("pending")
READY_TO_FAIL = "ready to fail"


def version_of(seq: int) -> int:
    return seq * VERSIONS // N + 1


def amount_of(seq: int) -> int:
    return (seq * 37) % 100


def expected() -> list[tuple[int, int, int]]:
    return sorted(
        (seq % KEYS, seq, amount_of(seq)) for seq in range(N) if amount_of(seq) >= THRESHOLDS[version_of(seq)]
    )


class DynamicFilter(KeyedBroadcastProcessFunction, CheckpointedFunction, CheckpointListener):
    """The dynamic filter. ``fail``: raise once, in the first attempt, on subtask 0, after a
    completed checkpoint holds ``fail_after_rules`` rules. Reports to the probe when each rule
    arrives (and how many events the subtask had processed by then), when a completed
    checkpoint holds every rule ("ready-<run>"), and on the first element of each attempt which
    rules the subtask's broadcast state holds."""

    def __init__(self, probe: Probe, run: int, fail: bool = False, fail_after_rules: int = 2) -> None:
        self.probe = probe
        self.run = run
        self.fail = fail
        self.fail_after_rules = fail_after_rules

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        pass  # keyed and broadcast state only; the hooks watch the checkpoints

    def open(self, runtime_context: RuntimeContext) -> None:
        self.pending = runtime_context.get_list_state(PENDING)
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.attempt = runtime_context.get_attempt_number()
        self.processed = 0
        self.rules_here = 0
        self.checkpoint_with: dict[int, int] = {}  # rules held at each checkpoint
        self.emitted = 0
        self.emitted_at: dict[int, int] = {}  # records emitted before each checkpoint
        self.ready_for_failure = False
        self.reported_ready = False

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        self.checkpoint_with[context.get_checkpoint_id()] = self.rules_here
        self.emitted_at[context.get_checkpoint_id()] = self.emitted

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        held = max((n for c, n in self.checkpoint_with.items() if c <= checkpoint_id), default=0)
        if held >= self.fail_after_rules and not self.ready_for_failure:
            self.ready_for_failure = True
            if self.fail and self.attempt == 0 and self.subtask == 0:
                self.probe.add(READY_TO_FAIL)
        if held == VERSIONS and not self.reported_ready:
            self.reported_ready = True
            # What the completed checkpoint's collect results hold, reported first: a test that
            # cancels once "ready" waits until its client received them, since the next job,
            # restored from the checkpoint, does not deliver them again.
            emitted = max((n for c, n in self.emitted_at.items() if c <= checkpoint_id), default=0)
            self.probe.add(f"ready-{self.run}-records", emitted)
            self.probe.add(f"ready-{self.run}")

    def process_element(self, value: Any, ctx: KeyedBroadcastProcessFunction.ReadOnlyContext) -> Any:
        rules = ctx.get_broadcast_state(RULES)
        if self.processed == 0:
            self.rules_here = len(rules.keys())
            self.probe.append(("first element", self.run, self.attempt, self.subtask, sorted(rules.keys())))
        self.processed += 1
        if self.fail and self.ready_for_failure and self.attempt == 0 and self.subtask == 0:
            self.fail = False
            if self.probe.add("failures") == 1:
                raise RuntimeError("induced failure: a completed checkpoint holds broadcast rules")
        key, seq = value
        threshold = rules.get(version_of(seq))
        if threshold is None:
            self.pending.add(seq)  # its rule has not arrived: wait for it
        elif amount_of(seq) >= threshold:
            self.emitted += 1
            yield key, seq, amount_of(seq)

    def process_broadcast_element(self, value: Any, ctx: KeyedBroadcastProcessFunction.Context) -> Any:
        version, threshold = value
        rules = ctx.get_broadcast_state(RULES)
        rules.put(version, threshold)
        self.rules_here = len(rules.keys())
        self.probe.append(("rule", self.run, self.attempt, self.subtask, version, self.processed))
        released: list[tuple[int, int, int]] = []

        def release(key: Any, pending: Any) -> None:
            waiting = []
            for seq in pending.get():
                if version_of(seq) != version:
                    waiting.append(seq)
                elif amount_of(seq) >= threshold:
                    released.append((key, seq, amount_of(seq)))
            if waiting:
                pending.update(waiting)
            else:
                pending.clear()

        ctx.apply_to_keyed_state(PENDING, release)
        self.emitted += len(released)
        return released


class Pace(Throttle):
    """Sleeps ``delay_s`` per record in the first attempt of a run (so the job is still running
    when rules arrive, when it fails or when the test cancels it); full speed after a restart.
    With ``hold``, ``(records, counter, value)``: after that many records, waits until the
    probe's counter reaches the value, so that a slow machine cannot run out of input before
    the failure or the checkpoint the test waits for."""

    def __init__(self, delay_s: float, probe: Probe, hold: tuple[int, str, int] | None = None) -> None:
        super().__init__(delay_s)
        self.probe = probe
        self.hold = hold
        self.seen = 0

    def open(self, runtime_context: RuntimeContext) -> None:
        if runtime_context.get_attempt_number() > 0:
            self.delay_s = 0.0
            self.hold = None

    def map(self, value: Any) -> Any:
        self.seen += 1
        if self.hold is not None and self.seen == self.hold[0]:
            _, counter, target = self.hold
            deadline = time.monotonic() + 60
            while self.probe.get(counter) < target and time.monotonic() < deadline:
                time.sleep(0.02)
        return super().map(value)


def rules_job(
    executor: str,
    probe: Probe,
    parallelism: int,
    run: int,
    *,
    pace: tuple[float, float],
    hold: tuple[str, int] | None = None,
    fail: bool = False,
) -> Any:
    """The dynamic filter over paced events and rules (``pace``: seconds per event and per
    rule in a run's first attempt); with ``hold``, ``(counter, value)``, the events halfway
    wait for that probe counter."""
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(100)
    env.configure({"restart-strategy.fixed-delay.delay": 50, "chandy.network.batch-size": 50})
    events = (
        env.from_sequence(0, N - 1)
        .uid("events")
        .map(Pace(pace[0], probe, None if hold is None else (N // parallelism // 2, *hold)))
        .uid("pace events")
        .map(lambda seq: (seq % KEYS, seq))
        .uid("event")
    )
    rules = (
        env.from_collection(sorted(THRESHOLDS.items()))
        .uid("rules")
        .map(Pace(pace[1], probe))
        .uid("pace rules")
        .set_parallelism(1)
    )
    return (
        events.key_by(lambda event: event[0])
        .connect(rules.broadcast(RULES))
        .process(DynamicFilter(probe, run, fail))
        .uid("dynamic filter")
    )


@pytest.mark.slow
@on_rocksdb_too(executor="local")
def test_rules_that_change_mid_job_filter_exactly_once_across_a_failure(executor: str) -> None:
    probe = Probe()
    job = rules_job(executor, probe, 2, run=1, pace=(0.001, 0.25), hold=(READY_TO_FAIL, 1), fail=True)
    out = job.execute_and_collect("dynamic filtering", limit=10**6)
    assert probe.get("failures") == 1, "the job failed once"
    assert sorted(out) == expected()
    arrivals = [item for item in probe.items if item[0] == "rule"]
    assert {(subtask, version) for _, _, attempt, subtask, version, _ in arrivals if attempt == 0} >= {
        (s, v) for s in range(2) for v in (1, 2)
    }, "every subtask got the first rules before the failure"
    assert any(version >= 2 and processed > 0 for _, _, _, _, version, processed in arrivals), (
        "a rule changed after events had been filtered (mid-job)"
    )
    restarted = [item for item in probe.items if item[0] == "first element" and item[2] > 0]
    assert restarted, "the restarted attempt processed events"
    for _, _, _, subtask, versions in restarted:
        assert versions[:2] == [1, 2], (
            f"subtask {subtask} restarted without the checkpointed rules: {versions}"
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("executor", "old", "new", "state_backend"),
    [
        ("local", 2, 3, "hashmap"),
        ("local", 3, 1, "hashmap"),
        ("spark", 2, 3, "hashmap"),
        ("local", 3, 1, "rocksdb"),
    ],
    ids=["local-2-3", "local-3-1", "spark-2-3", "local-3-1-rocksdb"],
    indirect=["state_backend"],
)
def test_a_restore_at_another_parallelism_gives_every_subtask_the_broadcast_state(
    tmp_path: Path, executor: str, old: int, new: int, state_backend: str, request: pytest.FixtureRequest
) -> None:
    if executor == "spark":
        request.getfixturevalue("spark_session")
    probe = Probe()
    first_dir = tmp_path / "first"
    first_job = rules_job(executor, probe, old, run=1, pace=(0.004, 0.0), hold=("ready-1", old))
    first_job.get_execution_environment().configure(
        {
            "execution.checkpointing.dir": str(first_dir),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        }
    )
    results = first_job.execute_and_collect("rules before rescaling")
    first, reader = drain(results)
    wait_for(
        lambda: probe.get("ready-1") >= old, "a completed checkpoint holding every rule on every subtask"
    )
    wait_for(lambda: len(first) >= probe.get("ready-1-records"), "the completed checkpoint's results")
    cancel_keeping_results(results, reader)  # RETAIN_ON_CANCELLATION keeps the latest checkpoint
    assert len(first) < len(expected()), "the first run was cancelled before its end"

    second_job = rules_job(executor, probe, new, run=2, pace=(0.0, 0.0))
    second_job.get_execution_environment().configure(
        {"execution.checkpointing.dir": str(tmp_path / "second")}
    )
    second_job.get_execution_environment().set_restore_path(str(latest_checkpoint_dir(first_dir)))
    second = second_job.execute_and_collect("rules after rescaling", limit=10**6)
    assert sorted(first + second) == expected()
    starts = {item[3]: item[4] for item in probe.items if item[0] == "first element" and item[1] == 2}
    assert starts == {subtask: list(THRESHOLDS) for subtask in range(new)}, (
        "every subtask of the restored job starts with every rule, none sent again"
    )
    assert not [item for item in probe.items if item[0] == "rule" and item[1] == 2]
