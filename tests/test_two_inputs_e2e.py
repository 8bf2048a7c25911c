"""Acceptance: a keyed join of two streams with a KeyedCoProcessFunction (orders and price
updates), exactly once across one induced failure, on the local and the Spark executor.

Orders (input 1) and price updates (input 2) are keyed by product. The join is Flink's
event-time "temporal" join: an order waits in keyed state for the watermark to pass its
timestamp (an event-time timer), then takes the latest price of its product at or before
that time; prices older than the one it took are dropped. Orders of a product without a
price yet go to a side output. Because the timer fires only once the watermark, the minimum
of both inputs', has passed the order, every price that applies has arrived by then: the
result does not depend on how the two inputs interleave, so the test computes it exactly.

The join's subtask 0 fails once, after two checkpoints completed, on the first attempt; the
job restarts from the latest checkpoint (the function's keyed state, both inputs' entries,
and its timers restored) and the collect sink, exactly once, must then hold every order
once, with its exact price.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.connectors.number_sequence import NumberSequenceSource
from chandy.core.functions import (
    CheckpointedFunction,
    CheckpointListener,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedCoProcessFunction,
    MapFunction,
    RuntimeContext,
)
from chandy.core.output_tag import OutputTag
from chandy.core.state import MapStateDescriptor
from chandy.core.watermark_strategy import WatermarkStrategy
from tests.jobs import HoldingSequence
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too
from tests.test_checkpointing_e2e import (
    cancel_keeping_results,
    drain,
    latest_checkpoint_dir,
    wait_for_checkpoints,
)

ORDERS = 6_000
PRICE_UPDATES = 600
PRODUCTS = 20
UNPRICED = OutputTag("unpriced")


def order(i: int) -> tuple[int, int]:
    """Order ``i`` (at time ``i``): ``(product, order id)``."""
    return i % PRODUCTS, i


def price_update(j: int) -> tuple[int, int]:
    """Price update ``j`` (at time ``10 j + 5``): ``(product, price)``."""
    return j % PRODUCTS, 1_000 + j


def update_time(j: int) -> int:
    return 10 * j + 5


def product_of(value: tuple[int, int]) -> int:
    return value[0]


def expected() -> list[tuple[Any, ...]]:
    """Every order with the latest price of its product at or before its time."""
    out: list[tuple[Any, ...]] = []
    for i in range(ORDERS):
        product, _ = order(i)
        applicable = [j for j in range(PRICE_UPDATES) if j % PRODUCTS == product and update_time(j) <= i]
        if applicable:
            out.append(("priced", i, product, price_update(max(applicable))[1]))
        else:
            out.append(("unpriced", i, product))
    return out


class PriceJoin(KeyedCoProcessFunction, CheckpointedFunction, CheckpointListener):
    """The event-time join; with ``fail``, fails once (subtask 0, first attempt) after two
    completed checkpoints."""

    def __init__(self, probe: Probe, fail: bool = True) -> None:
        self.probe = probe
        self.fail = fail

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        if context.is_restored():
            self.probe.add("restored")

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        pass  # keyed state and timers only

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed += 1

    def open(self, runtime_context: RuntimeContext) -> None:
        self.orders = runtime_context.get_map_state(MapStateDescriptor("orders"))
        self.prices = runtime_context.get_map_state(MapStateDescriptor("prices"))
        first_attempt = runtime_context.get_attempt_number() == 0
        self.may_fail = self.fail and first_attempt and runtime_context.get_index_of_this_subtask() == 0
        self.completed = 0

    def process_element1(self, value: tuple[int, int], ctx: KeyedCoProcessFunction.Context) -> Any:
        timestamp = ctx.timestamp()
        assert timestamp is not None
        self.orders.put(timestamp, value[1])
        ctx.timer_service().register_event_time_timer(timestamp)
        if self.may_fail and self.completed >= 2:
            self.may_fail = False
            if self.probe.add("failures") == 1:
                raise RuntimeError("induced failure in the join, after two completed checkpoints")
        return None

    def process_element2(self, value: tuple[int, int], ctx: KeyedCoProcessFunction.Context) -> Any:
        timestamp = ctx.timestamp()
        assert timestamp is not None
        self.prices.put(timestamp, value[1])
        return None

    def on_timer(self, timestamp: int, ctx: KeyedCoProcessFunction.OnTimerContext) -> Any:
        order_id = self.orders.get(timestamp)
        self.orders.remove(timestamp)
        product = ctx.get_current_key()
        times = [t for t in self.prices.keys() if t <= timestamp]
        if not times:
            yield UNPRICED, ("unpriced", order_id, product)
            return
        latest = max(times)
        for t in times:
            if t < latest:
                self.prices.remove(t)  # no later order of this product can take it
        yield "priced", order_id, product, self.prices.get(latest)


class Pace(MapFunction):
    """Slows the first attempt down so that checkpoints complete before the failure (or the
    cancel); a restarted attempt, and a job started with ``delay_s`` 0, run at full speed."""

    def __init__(self, delay_s: float = 0.0005) -> None:
        self.first_attempt_delay_s = delay_s

    def open(self, runtime_context: RuntimeContext) -> None:
        self.delay_s = self.first_attempt_delay_s if runtime_context.get_attempt_number() == 0 else 0.0

    def map(self, value: int) -> int:
        if self.delay_s:
            time.sleep(self.delay_s)
        return value


def strategy(timestamp_of: Any) -> WatermarkStrategy:
    return WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda v, t: timestamp_of(v))


def join_job(
    executor: str,
    probe: Probe,
    parallelism: int,
    *,
    fail: bool,
    delay_s: float = 0.0005,
    hold_after: int | None = None,
    **config: Any,
) -> Any:
    """Orders and prices joined by product, the join's main and side output as one stream.
    With ``hold_after``, each orders subtask stops there until cancelled (:class:`HoldingSequence`)."""
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(100)
    env.configure(
        {
            "restart-strategy.fixed-delay.delay": 50,
            "pipeline.auto-watermark-interval": "20 ms",
            "chandy.network.batch-size": 100,
            **config,
        }
    )
    orders = (
        env.from_source(HoldingSequence(0, ORDERS - 1, hold_after), strategy(lambda i: i), "orders")
        .uid("orders")
        .map(Pace(delay_s))
        .uid("pace-orders")
        .map(order)
        .uid("order")
    )
    prices = (
        env.from_source(NumberSequenceSource(0, PRICE_UPDATES - 1), strategy(update_time), "prices")
        .uid("prices")
        .map(Pace(delay_s))
        .uid("pace-prices")
        .map(price_update)
        .uid("price")
    )
    joined = (
        orders.key_by(product_of)
        .connect(prices.key_by(product_of))
        .process(PriceJoin(probe, fail))
        .uid("join")
    )
    return joined.union(joined.get_side_output(UNPRICED))


def check_exactly_once(results: list[Any]) -> None:
    counts = Counter(r[1] for r in results)
    assert {i: c for i, c in counts.items() if c != 1} == {}, "orders joined more than once"
    assert sorted(results) == sorted(expected())


@pytest.mark.slow
@on_rocksdb_too(executor="local")
def test_a_keyed_co_process_join_of_orders_and_prices_is_exactly_once_across_a_failure(executor: str) -> None:
    probe = Probe()
    results = join_job(executor, probe, 2, fail=True).execute_and_collect("orders x prices", limit=10**6)
    assert probe.get("failures") == 1
    assert probe.get("restored") >= 1, "the restarted join restored its state from a checkpoint"
    check_exactly_once(results)


@pytest.mark.slow
@on_rocksdb_too()
def test_the_join_restored_at_a_higher_parallelism_finishes_exactly_once(tmp_path: Path) -> None:
    """Cancelled after two checkpoints at parallelism 2, restored from the retained one at 3:
    each product's waiting orders, prices and timers (written by both inputs) move with its
    key group, and the two runs' outputs together are the exact join."""
    probe = Probe()
    first_dir = tmp_path / "first"
    retain = {
        "execution.checkpointing.dir": str(first_dir),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    }
    # the orders stop half-way: the first run is still running when it is cancelled, however slow the machine
    first_job = join_job("local", probe, 2, fail=False, delay_s=0.002, hold_after=ORDERS // 4, **retain)
    results = first_job.execute_and_collect("first")
    first, reader = drain(results)
    wait_for_checkpoints(first_dir, 1)
    deadline = time.monotonic() + 60
    while int(latest_checkpoint_dir(first_dir).name.split("-")[1]) < 2:  # one retained at a time
        assert time.monotonic() < deadline, "no second checkpoint completed in time"
        time.sleep(0.02)
    cancel_keeping_results(results, reader)  # the retained checkpoint is where the second run starts
    assert len(first) < ORDERS, "the first run was cancelled before it ended"

    second_job = join_job(
        "local",
        probe,
        3,
        fail=False,
        delay_s=0.0,
        **{"execution.checkpointing.dir": str(tmp_path / "second")},
    )
    second_job.get_execution_environment().set_restore_path(str(latest_checkpoint_dir(first_dir)))
    second = second_job.execute_and_collect("second", limit=10**6)
    assert probe.get("restored") >= 3, "every subtask of the second run restored"
    check_exactly_once(first + second)
