"""W1, keyed running count: N ints, key = i % 10_000, a keyed ValueState sum, a discarding sink.

The keyed function is written as a PyFlink user would write it: a
``KeyedProcessFunction`` that reads and updates a ``ValueState`` and yields the
new sum for every record.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.timing import TimingSink, read_timings
from chandy import StreamExecutionEnvironment
from chandy.api.functions import KeyedProcessFunction, RuntimeContext
from chandy.api.state import ValueStateDescriptor

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
    records_per_s: float
    wall_s: float
    first_to_last_s: float


def run_w1(n: int, parallelism: int = 2, executor: str = "local",
           config: dict[str, Any] | None = None) -> W1Result:
    with tempfile.TemporaryDirectory(prefix="chandy-w1-") as tmp:
        env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
        env.set_parallelism(parallelism)
        if config:
            env.configure(config)
        (env.from_sequence(0, n - 1)
            .key_by(lambda i: i % KEYS)
            .process(RunningSum()).name("running sum")
            .sink_to(TimingSink(tmp)))
        started = time.perf_counter()
        env.execute("W1 keyed running count")
        wall = time.perf_counter() - started
        timing = read_timings(tmp)
    if timing["count"] != n:
        raise RuntimeError(f"W1 lost records: {timing['count']} of {n} arrived")
    span = timing["last"] - timing["first"]
    return W1Result("chandy", executor, n, parallelism, n / span if span > 0 else float("inf"),
                    wall, span)


def as_row(result: W1Result) -> dict[str, Any]:
    return asdict(result)
