"""W1, keyed running count: N ints, key = i % 10_000, a keyed ValueState sum, a discarding sink.

The keyed function is written as a PyFlink user would write it: a
``KeyedProcessFunction`` that reads and updates a ``ValueState`` and yields the
new sum for every record. With ``batch``, the job is W1v, W1 on the batch path
(``bench.systems.chandy_runner.w1v_job``).

``python -m bench w1`` runs its jobs one after another in this process, so every run
after the first finds the Spark session, its executors and their Python workers warm,
and a run with checkpoints sits right beside one without: the pairs' differences are
what a checkpoint costs, with far less of the spread between separate processes (a
suite run starts a new process, and a new Spark, per run).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.timing import TimingSink, read_timings
from chandy import StreamExecutionEnvironment
from chandy.core.functions import KeyedProcessFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor

KEYS = 10_000


class RunningSum(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.sum = runtime_context.get_state(ValueStateDescriptor("sum"))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        current = self.sum.value()
        current = value if current is None else current + value
        self.sum.update(current)
        yield current


@dataclass
class W1Result:
    system: str
    executor: str
    records: int
    parallelism: int
    checkpoint_interval_ms: int | None
    records_per_s: float
    wall_s: float
    first_to_last_s: float
    checkpoints_completed: int = 0
    checkpoint_p50_ms: float = 0.0
    checkpoint_p99_ms: float = 0.0
    checkpoint_max_ms: float = 0.0
    #: CPU seconds of the sinks' processes between their first and last records, per record
    #: (see ``bench.timing.read_timings``).
    task_cpu_us_per_record: float = 0.0
    batch: bool = False


def run_w1(
    n: int,
    parallelism: int = 2,
    executor: str = "local",
    config: dict[str, Any] | None = None,
    checkpoint_interval_ms: int | None = None,
    batch: bool = False,
) -> W1Result:
    """One W1 run (W1v's with ``batch``); with ``checkpoint_interval_ms``, checkpoints go to
    a local directory."""
    with tempfile.TemporaryDirectory(prefix="chandy-w1-") as tmp:
        env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
        env.set_parallelism(parallelism)
        if config:
            env.configure(config)
        if checkpoint_interval_ms is not None:
            env.enable_checkpointing(checkpoint_interval_ms)
            env.get_checkpoint_config().set_checkpoint_storage(f"{tmp}/checkpoints")
        if batch:
            from bench.systems.chandy_runner import w1v_job

            w1v_job(env, n, KEYS, tmp)
        else:
            (
                env.from_sequence(0, n - 1)
                .key_by(lambda i: i % KEYS)
                .process(RunningSum())
                .name("running sum")
                .sink_to(TimingSink(tmp))
            )
        started = time.perf_counter()
        client = env.execute_async("W1v keyed running sum, batch path" if batch else "W1 keyed running count")
        client.get_job_execution_result()
        wall = time.perf_counter() - started
        timing = read_timings(tmp)
        stats = client.get_checkpoint_statistics() if checkpoint_interval_ms else None
    if timing["count"] != n:
        raise RuntimeError(f"W1 lost records: {timing['count']} of {n} arrived")
    span = timing["last"] - timing["first"]
    result = W1Result(
        "chandy",
        executor,
        n,
        parallelism,
        checkpoint_interval_ms,
        n / span if span > 0 else float("inf"),
        wall,
        span,
        task_cpu_us_per_record=timing["cpu_s"] / n * 1e6,
        batch=batch,
    )
    if stats is not None:
        durations = stats["summary"]["end_to_end_duration"]
        result.checkpoints_completed = stats["counts"]["completed"]
        result.checkpoint_p50_ms = durations["p50"]
        result.checkpoint_p99_ms = durations["p99"]
        result.checkpoint_max_ms = durations["max"]
    return result


def as_row(result: W1Result) -> dict[str, Any]:
    return asdict(result)
