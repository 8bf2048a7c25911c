"""Timers in real jobs: registered before a checkpoint, they fire exactly once after a
failure, and after a restore at another parallelism each fires once, on the subtask
that owns its key group.

Every key gets three timers on its first record: an event-time timer that the
watermark passes early in the run (``k + 1000``), one past every record
(``N + k``, fired by the end-of-input watermark) and a processing-time timer
``PROCESSING_DELAY_MS`` after it was registered, long enough to be pending when
the job fails or is cancelled. The keyed function knows when a completed
checkpoint holds all of its keys' timers ("ready"): the failure strikes then, or
the test cancels the first job then. A restarted (or restored) source waits until
the restored processing-time timers have fired before it lets the rest of its
records through: a bounded job's processing-time timers do not fire once its
input has ended (Flink's rule), so without the wait they could be cut off.

The timers' outputs go to the collect sink, which is exactly-once: an output
seen twice (or never) is a timer that fired twice (or was lost).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.core.functions import (
    CheckpointedFunction,
    CheckpointListener,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedProcessFunction,
    MapFunction,
    RuntimeContext,
)
from chandy.core.state import ValueStateDescriptor
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.state.key_groups import assign_key_to_parallel_operator
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too
from tests.test_checkpointing_e2e import cancel_keeping_results, drain, latest_checkpoint_dir

N = 20_000
KEYS = 20
MAX_PARALLELISM = 128
PROCESSING_DELAY_MS = 4_000
FIRED_AFTER_RESTORE = "processing timers fired after restore"


def key_of(value: int) -> int:
    return value % KEYS


class TimerJob(KeyedProcessFunction, CheckpointedFunction, CheckpointListener):
    """Sets each key's three timers on its first record; emits one output per firing.

    ``restored_run``: this job starts from a retained checkpoint (its timers fire
    "after restore" from the first attempt on). ``fail``: raise once, in the first
    attempt, on the first record after this subtask is ready.
    """

    def __init__(self, probe: Probe, run: int, restored_run: bool, fail: bool) -> None:
        self.probe = probe
        self.run = run
        self.restored_run = restored_run
        self.fail = fail

    def open(self, runtime_context: RuntimeContext) -> None:
        self.registered = runtime_context.get_state(ValueStateDescriptor("registered"))
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.attempt = runtime_context.get_attempt_number()
        parallelism = runtime_context.get_number_of_parallel_subtasks()
        max_parallelism = runtime_context.get_max_number_of_parallel_subtasks()
        self.mine = sum(
            1
            for k in range(KEYS)
            if assign_key_to_parallel_operator(k, max_parallelism, parallelism) == self.subtask
        )
        self.registered_here = 0
        self.ready_checkpoint: int | None = None
        self.ready = False

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        pass  # keyed state and timers only; the hooks below watch the checkpoints

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        if self.ready_checkpoint is None and self.registered_here == self.mine:
            self.ready_checkpoint = context.get_checkpoint_id()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if not self.ready and self.ready_checkpoint is not None and checkpoint_id >= self.ready_checkpoint:
            self.ready = True
            self.probe.add(f"ready-{self.run}")

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        if self.registered.value() is None:
            key = ctx.get_current_key()
            timers = ctx.timer_service()
            timers.register_event_time_timer(key + 1000)
            timers.register_event_time_timer(N + key)
            timers.register_processing_time_timer(timers.current_processing_time() + PROCESSING_DELAY_MS)
            self.registered.update(True)
            self.registered_here += 1
        if self.fail and self.ready and self.attempt == 0:
            self.fail = False  # one try per subtask; the first subtask to get here fails the job
            if self.probe.add("failures") == 1:
                raise RuntimeError(
                    "induced failure: every timer of this subtask is in a completed checkpoint"
                )
        return None

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:
        domain = ctx.time_domain().name
        if domain == "PROCESSING_TIME":
            after_restore = self.restored_run or self.attempt > 0
            self.probe.append(("processing", self.run, self.attempt, ctx.get_current_key()))
            if after_restore:
                self.probe.add(FIRED_AFTER_RESTORE)
            yield ("fired", ctx.get_current_key(), domain, None, self.run, self.subtask)
        else:
            yield ("fired", ctx.get_current_key(), domain, timestamp, self.run, self.subtask)


class Pace(MapFunction):
    """Slows the first attempt of a fresh job down (so it is still running when it fails or
    is cancelled); a restarted or restored source first waits until the restored
    processing-time timers fired, then runs at full speed."""

    def __init__(self, probe: Probe, restored_run: bool, delay_s: float = 0.001) -> None:
        self.probe = probe
        self.restored_run = restored_run
        self.delay_s = delay_s

    def open(self, runtime_context: RuntimeContext) -> None:
        self.waiting = self.restored_run or runtime_context.get_attempt_number() > 0

    def map(self, value: int) -> int:
        if self.waiting:
            deadline = time.monotonic() + 60
            while self.probe.get(FIRED_AFTER_RESTORE) < KEYS and time.monotonic() < deadline:
                time.sleep(0.02)
            self.waiting = False
            self.delay_s = 0.0
        if self.delay_s:
            time.sleep(self.delay_s)
        return value


def timer_job(
    executor: str,
    probe: Probe,
    parallelism: int,
    run: int,
    restored_run: bool = False,
    fail: bool = False,
    **config: Any,
) -> Any:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(100)
    env.configure(
        {
            "restart-strategy.fixed-delay.delay": 50,
            "pipeline.auto-watermark-interval": "20 ms",
            "chandy.network.batch-size": 100,  # Pace sleeps per record: 0.1 s batches
            **config,
        }
    )
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda v, t: v)
    return (
        env.from_sequence(0, N - 1)
        .uid("source")
        .map(Pace(probe, restored_run))
        .uid("pace")
        .assign_timestamps_and_watermarks(strategy)
        .uid("timestamps")
        .key_by(key_of)
        .process(TimerJob(probe, run, restored_run, fail))
        .uid("timers")
    )


def expected_firings() -> list[tuple[int, str, int | None]]:
    return sorted(
        [(k, "EVENT_TIME", k + 1000) for k in range(KEYS)]
        + [(k, "EVENT_TIME", N + k) for k in range(KEYS)]
        + [(k, "PROCESSING_TIME", None) for k in range(KEYS)],
        key=repr,
    )


def check_firings(out: list[Any], parallelism_of_run: dict[int, int]) -> None:
    """Every timer fired exactly once, on the subtask that owned its key in that run."""
    fired = [o for o in out if o[0] == "fired"]
    counts = Counter((key, domain, ts) for _, key, domain, ts, _, _ in fired)
    assert {t: c for t, c in counts.items() if c != 1} == {}, "timers that fired more than once"
    assert sorted(counts, key=repr) == expected_firings()
    for _, key, domain, ts, run, subtask in fired:
        owner = assign_key_to_parallel_operator(key, MAX_PARALLELISM, parallelism_of_run[run])
        assert subtask == owner, f"key {key}'s {domain} timer {ts} fired on subtask {subtask}, owner {owner}"


def processing_firings(probe: Probe) -> list[tuple[str, int, int, int]]:
    return [item for item in probe.items if item[0] == "processing"]


@pytest.mark.slow
@on_rocksdb_too(executor="local")
def test_timers_in_a_checkpoint_fire_exactly_once_after_a_failure(executor: str) -> None:
    probe = Probe()
    out = timer_job(executor, probe, 2, run=1, fail=True).execute_and_collect("timers", limit=10**6)
    assert probe.get("failures") >= 1  # the job failed (once: a restarted attempt does not fail)
    check_firings(out, {1: 2})
    # the processing-time timers were still pending at the failure: all fired after it
    fired = processing_firings(probe)
    assert sorted(key for _, _, attempt, key in fired if attempt > 0) == list(range(KEYS))
    assert [f for f in fired if f[2] == 0] == []


def wait_for(condition: Any, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.slow
@on_rocksdb_too(executor="local")
@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_restored_at_another_parallelism_each_timer_fires_once_on_its_owner(
    tmp_path: Path, executor: str, old: int, new: int
) -> None:
    probe = Probe()
    first_dir = tmp_path / "first"
    results = timer_job(
        executor,
        probe,
        old,
        run=1,
        **{
            "execution.checkpointing.dir": str(first_dir),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        },
    ).execute_and_collect("timers before rescaling")
    first, reader = drain(results)
    wait_for(lambda: probe.get("ready-1") >= old, "a completed checkpoint holding every subtask's timers")
    cancel_keeping_results(results, reader)  # RETAIN_ON_CANCELLATION keeps the latest checkpoint
    retained = latest_checkpoint_dir(first_dir)
    assert processing_firings(probe) == [], "a processing-time timer fired before the cancel"

    env_config = {"execution.checkpointing.dir": str(tmp_path / "second")}
    second_job = timer_job(executor, probe, new, run=2, restored_run=True, **env_config)
    second_job.get_execution_environment().set_restore_path(str(retained))
    second = second_job.execute_and_collect("timers after rescaling", limit=10**6)
    check_firings(first + second, {1: old, 2: new})
    # the timers that were pending at the cancel fired in the second run only
    assert sorted(key for _, run, _, key in processing_firings(probe) if run == 2) == list(range(KEYS))
    late = {(o[1], o[4]) for o in first + second if o[0] == "fired" and o[3] == N + o[1]}
    assert late == {(k, 2) for k in range(KEYS)}
