"""Task metrics through real jobs on the local executor: exact record counts per task and
per operator, backpressure and idleness where the job's shape puts them, watermarks.

The jobs run on real task threads and report to a real JobMaster's metrics store
(``chandy.metrics.report-interval`` short, so the tests see live values quickly).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.core.functions import (
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedProcessFunction,
    MapFunction,
)
from chandy.core.time import MAX_WATERMARK, MIN_TIMESTAMP
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.runtime.job_master import JobMaster
from chandy.runtime.local_executor import LocalExecutor
from tests.jobs import Throttle
from tests.probes import Probe
from tests.test_watermark_propagation import PHASE, PhasedSource


class Forward(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


def local_env(parallelism: int = 2, **config: Any) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(parallelism)
    env.configure({"chandy.metrics.report-interval": "50 ms", **config})
    return env


@contextmanager
def running(env: StreamExecutionEnvironment, name: str) -> Iterator[tuple[JobMaster, threading.Thread]]:
    """The job's JobMaster, running on a thread; the job must end inside the block."""
    executor = LocalExecutor()
    job_master = JobMaster(env._build_job_graph(name), executor)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            job_master.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            errors.append(exc)
        finally:
            executor.close()

    thread = threading.Thread(target=run, name=f"test job {name}")
    thread.start()
    try:
        yield job_master, thread
    finally:
        if thread.is_alive():
            job_master.cancel("the test ended")
        thread.join(60)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def run_to_end(env: StreamExecutionEnvironment, name: str) -> JobMaster:
    with running(env, name) as (job_master, thread):
        thread.join(120)
    return job_master


def vertex_named(job_master: JobMaster, prefix: str) -> int:
    matches = [v.id for v in job_master.job_graph.vertices if v.name.startswith(prefix)]
    assert len(matches) == 1, [v.name for v in job_master.job_graph.vertices]
    return matches[0]


def operator_totals(job_master: JobMaster) -> dict[str, tuple[int, int]]:
    """(numRecordsIn, numRecordsOut) of each operator name, summed over its subtasks."""
    totals: dict[str, tuple[int, int]] = {}
    for subtask in job_master.metrics.subtask_metrics():
        for operator in subtask["operators"]:
            records_in, records_out = totals.get(operator["operator_name"], (0, 0))
            totals[operator["operator_name"]] = (
                records_in + operator["metrics"]["numRecordsIn"],
                records_out + operator["metrics"]["numRecordsOut"],
            )
    return totals


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# ---------------------------------------------------------------------- counts


def test_records_in_and_out_are_exact_per_operator_and_per_task() -> None:
    env = local_env(2)
    (
        env.from_collection(list(range(1000)))
        .name("numbers")
        .map(lambda x: x + 1)
        .name("plus one")
        .filter(lambda x: x % 2 == 0)
        .name("evens")
        .flat_map(lambda x: [x, x])
        .name("twice")
        .key_by(lambda x: x % 7)
        .process(Forward())
        .name("forward")
        .add_sink(lambda value: None)
        .name("discard")
    )
    job_master = run_to_end(env, "counts")
    assert operator_totals(job_master) == {
        "numbers": (0, 1000),
        "plus one": (1000, 1000),
        "evens": (1000, 500),
        "twice": (500, 1000),
        "forward": (1000, 1000),
        "discard": (1000, 0),
    }
    subtasks = job_master.metrics.subtask_metrics()
    assert all(s["finished"] for s in subtasks)
    source = vertex_named(job_master, "numbers")
    keyed = vertex_named(job_master, "forward")
    # The source task's records leave the chain after "twice"; the keyed task's arrive at "forward".
    assert job_master.metrics.vertex_metrics(source)["numRecordsIn"] == 0
    assert job_master.metrics.vertex_metrics(source)["numRecordsOut"] == 1000
    assert job_master.metrics.vertex_metrics(keyed)["numRecordsIn"] == 1000
    assert job_master.metrics.vertex_metrics(keyed)["numRecordsOut"] == 0
    per_subtask = [s["metrics"]["numRecordsIn"] for s in subtasks if s["vertex_id"] == keyed]
    assert len(per_subtask) == 2 and sum(per_subtask) == 1000


def test_side_outputs_count_as_the_operators_output() -> None:
    from chandy.core.functions import ProcessFunction
    from chandy.core.output_tag import OutputTag

    odd = OutputTag("odd")

    class Split(ProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            if value % 2:
                yield odd, value
            else:
                yield value

    env = local_env(1)
    main = env.from_collection(list(range(100))).name("numbers").process(Split()).name("split")
    main.get_side_output(odd).add_sink(lambda value: None).name("odd sink")
    main.add_sink(lambda value: None).name("even sink")
    totals = operator_totals(run_to_end(env, "side outputs"))
    assert totals["split"] == (100, 100)
    assert totals["odd sink"] == (50, 0)
    assert totals["even sink"] == (50, 0)


# ---------------------------------------------------------------------- busy, idle, backpressure

TIGHT = {"chandy.network.batch-size": 8, "taskmanager.network.memory.buffers-per-channel": 1}


def lifetime_ms(totals: dict[str, Any]) -> int:
    """Busy + idle + backpressured: the task's whole life so far."""
    return sum(int(totals[f"accumulate{k}TimeMs"]) for k in ("Busy", "Idle", "BackPressured"))


def watch(
    env: StreamExecutionEnvironment, until: tuple[str, str, float]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Run the job; once vertex ``until[0]``'s metric ``until[1]`` exceeds ``until[2]``, take
    every vertex's live metrics; then let the job end. Live and final metrics by vertex name."""
    prefix, metric, threshold = until

    def by_name(job_master: JobMaster) -> dict[str, dict[str, Any]]:
        return {v.name: job_master.metrics.vertex_metrics(v.id) for v in job_master.job_graph.vertices}

    with running(env, f"{prefix} {metric}") as (job_master, thread):
        watched = vertex_named(job_master, prefix)
        wait_until(
            lambda: job_master.metrics.vertex_metrics(watched).get(metric, 0) > threshold,
            f"{metric} of {prefix} above {threshold}",
        )
        live = by_name(job_master)
        thread.join(120)
    return live, by_name(job_master)


def test_a_slow_sink_backpressures_the_source() -> None:
    env = local_env(1, **TIGHT)
    env.from_collection(list(range(400))).name("numbers").rebalance().map(Throttle(0.003)).name(
        "slow"
    ).add_sink(lambda value: None)
    live, final = watch(env, until=("numbers", "backPressuredTimeMsPerSecond", 500))
    slow = next(metrics for name, metrics in live.items() if name.startswith("slow"))
    assert slow["busyTimeMsPerSecond"] > 500
    totals = next(metrics for name, metrics in final.items() if name.startswith("numbers"))
    assert totals["accumulateBackPressuredTimeMs"] > 0.5 * lifetime_ms(totals), totals


def test_a_fast_sink_leaves_the_source_unbackpressured_and_the_sink_idle() -> None:
    env = local_env(1, **TIGHT)
    env.from_collection(list(range(400))).name("numbers").map(Throttle(0.003)).name(
        "slow"
    ).rebalance().add_sink(lambda value: None).name("discard")
    live, final = watch(env, until=("discard", "idleTimeMsPerSecond", 800))
    source = next(metrics for name, metrics in live.items() if name.startswith("numbers"))
    assert source["busyTimeMsPerSecond"] > 500
    totals = next(metrics for name, metrics in final.items() if name.startswith("numbers"))
    assert lifetime_ms(totals) > 1000  # 400 records at 3 ms
    # a tenth, against more than half behind a slow sink (above): on a loaded machine (the
    # suite runs on every core) the sink's thread may wait for a core while a buffer is full,
    # which cost the source 4 % in one run
    assert totals["accumulateBackPressuredTimeMs"] < 0.1 * lifetime_ms(totals), totals


@pytest.mark.slow
def test_rates_follow_the_records_while_the_job_runs() -> None:
    env = local_env(1, **TIGHT)  # batches of 8 records, 32 ms each: a steady flow
    env.from_collection(list(range(500))).name("numbers").map(Throttle(0.004)).name("paced").add_sink(
        lambda value: None
    ).name("discard")

    def paced() -> dict[str, Any]:
        subtasks = [s for s in job_master.metrics.subtask_metrics() if not s["finished"]]
        found = [o["metrics"] for s in subtasks for o in s["operators"] if o["operator_name"] == "paced"]
        return found[0] if found else {}

    with running(env, "rates") as (job_master, thread):
        # at most 250 records/s (4 ms each): positive, and bounded by the pace. Both rates are
        # read from one report: on a loaded machine the next one may come after the input ended
        seen: list[dict[str, Any]] = []

        def flowing() -> bool:
            seen.append(paced())
            return (
                seen[-1].get("numRecordsInPerSecond", 0) > 50
                and seen[-1].get("numRecordsOutPerSecond", 0) > 0
            )

        wait_until(flowing, "positive input and output rates")
        assert seen[-1]["numRecordsOutPerSecond"] < 300
        thread.join(120)
    (subtask,) = job_master.metrics.subtask_metrics()
    assert subtask["finished"]  # ended: nothing flows any more
    assert subtask["metrics"]["numRecordsInPerSecond"] == 0
    assert all(o["metrics"]["numRecordsOutPerSecond"] == 0 for o in subtask["operators"])


# ---------------------------------------------------------------------- watermarks


def test_watermarks_are_reported_per_task_and_operator() -> None:
    probe = Probe()
    env = local_env(1, **{"pipeline.auto-watermark-interval": "20 ms"})
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda v, t: v)
    # PhasedSource: the three records at once, then nothing until the probe's phase moves on
    env.from_source(PhasedSource([[100, 200, 300]], probe), strategy, "events").rebalance().map(
        lambda x: x
    ).name("downstream").add_sink(lambda value: None).name("discard")

    def input_watermark(job_master: JobMaster, vertex: int) -> int:
        return int(job_master.metrics.vertex_metrics(vertex).get("currentInputWatermark", MIN_TIMESTAMP))

    with running(env, "watermarks") as (job_master, thread):
        source = vertex_named(job_master, "events")
        downstream = vertex_named(job_master, "downstream")
        # for_monotonous_timestamps: the watermark is the highest timestamp minus 1
        wait_until(lambda: input_watermark(job_master, downstream) == 299, "watermark 299 downstream")
        live = job_master.metrics.vertex_metrics(source)
        assert live["currentOutputWatermark"] == 299
        assert live["currentInputWatermark"] == MIN_TIMESTAMP  # a source has no input
        operators = {
            o["operator_name"]: o["metrics"]
            for s in job_master.metrics.subtask_metrics()
            for o in s["operators"]
        }
        assert operators["downstream"]["currentInputWatermark"] == 299
        assert operators["downstream"]["currentOutputWatermark"] == 299
        assert operators["discard"]["currentInputWatermark"] == 299
        probe.add(PHASE)  # the end of input
        thread.join(120)
    assert input_watermark(job_master, downstream) == MAX_WATERMARK  # the end of input
    assert job_master.metrics.vertex_metrics(downstream)["currentOutputWatermark"] == MAX_WATERMARK


class SlowSnapshot(MapFunction, CheckpointedFunction):
    """Passes records on; its part of every checkpoint takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        pass

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        time.sleep(self.seconds)

    def map(self, value: Any) -> Any:
        return value


def test_a_source_waiting_for_the_final_checkpoint_is_idle_not_busy() -> None:
    env = local_env(1)
    env.enable_checkpointing(2000)
    env.from_collection(list(range(10))).name("numbers").rebalance().map(SlowSnapshot(0.8)).name(
        "slow snapshot"
    ).add_sink(lambda value: None)
    job_master = run_to_end(env, "final checkpoint")
    totals = job_master.metrics.vertex_metrics(vertex_named(job_master, "numbers"))
    # the source read its ten records at once, then waited (serving mails) for a checkpoint
    # taken after its end of input to complete: at least the 0.8 s of the slow snapshot
    assert totals["accumulateIdleTimeMs"] >= 600, totals
    assert totals["accumulateBusyTimeMs"] < 400, totals
