"""Connected streams: payments priced in euros by the exchange rate of their time.

Two streams of different types meet in one keyed operator: exchange rates
``(time, currency, rate)`` and payments ``(time, id, currency, amount)``, both keyed by
currency (``connect(...).key_by(k1, k2)``). A ``KeyedCoProcessFunction`` keeps each
currency's rates in keyed state (written by the rates input) and holds each payment in
keyed state until the watermark passes its time (an event-time timer registered by the
payments input); the timer then converts the payment with the latest rate at or before it.
A payment with no rate yet goes to a side output. Because the timer waits for the
watermark, which for a two-input operator is the minimum of both inputs', every rate that
applies has arrived: the result does not depend on how the two inputs interleave, and the
out-of-order payment p9 gets the rate of its own time, not the latest one.

Only PyFlink's names are used (but for the choice of executor): with ``pyflink`` for
``chandy`` in the imports the job is PyFlink's. Run it with
``python examples/connected_streams.py`` (``--executor local`` for threads instead of a
local Spark session); ``tests/test_connected_streams.py`` checks what it prints.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from typing import Any

from chandy.common import Duration, WatermarkStrategy
from chandy.common.typeinfo import Types
from chandy.common.watermark_strategy import TimestampAssigner
from chandy.datastream import OutputTag, StreamExecutionEnvironment
from chandy.datastream.functions import KeyedCoProcessFunction, RuntimeContext
from chandy.datastream.state import MapStateDescriptor

RATES = [
    (1000, "GBP", 1.30),
    (1000, "USD", 0.90),
    (4000, "USD", 0.92),
    (6000, "GBP", 1.25),
    (8000, "USD", 0.88),
]

PAYMENTS = [
    (500, "p1", "USD", 100.0),
    (1500, "p2", "GBP", 20.0),
    (2000, "p3", "USD", 50.0),
    (3000, "p4", "CHF", 5.0),
    (4500, "p5", "USD", 10.0),
    (5000, "p6", "GBP", 40.0),
    (7000, "p7", "GBP", 8.0),
    (9000, "p8", "USD", 200.0),
    (3500, "p9", "USD", 30.0),  # late, but within the watermark's 5 s of allowed disorder
]

NO_RATE = OutputTag("no-rate", Types.TUPLE([Types.STRING(), Types.STRING(), Types.DOUBLE()]))


class FirstFieldIsTheTime(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return int(value[0])


class ConvertAtTheRateOfTheTime(KeyedCoProcessFunction):
    """Input 1: payments; input 2: rates; both keyed by currency."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.rates = runtime_context.get_map_state(MapStateDescriptor("rates", Types.LONG(), Types.DOUBLE()))
        self.waiting = runtime_context.get_map_state(
            MapStateDescriptor("waiting", Types.LONG(), Types.PICKLED_BYTE_ARRAY())
        )

    def process_element1(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> None:
        timestamp = ctx.timestamp()
        assert timestamp is not None  # the watermark strategy gave every record one
        self.waiting.put(timestamp, value)
        ctx.timer_service().register_event_time_timer(timestamp)

    def process_element2(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> None:
        self.rates.put(value[0], value[2])

    def on_timer(self, timestamp: int, ctx: KeyedCoProcessFunction.OnTimerContext) -> Iterator[Any]:
        _, payment_id, currency, amount = self.waiting.get(timestamp)
        self.waiting.remove(timestamp)
        times = [t for t in self.rates.keys() if t <= timestamp]
        if not times:
            yield NO_RATE, (payment_id, currency, amount)
            return
        rate = self.rates.get(max(times))
        yield payment_id, currency, amount, rate, round(amount * rate, 2)


def run(executor: str) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_seconds(5)).with_timestamp_assigner(
        FirstFieldIsTheTime()
    )
    rates = env.from_collection(
        RATES, type_info=Types.TUPLE([Types.LONG(), Types.STRING(), Types.DOUBLE()])
    ).assign_timestamps_and_watermarks(strategy)
    payments = env.from_collection(
        PAYMENTS, type_info=Types.TUPLE([Types.LONG(), Types.STRING(), Types.STRING(), Types.DOUBLE()])
    ).assign_timestamps_and_watermarks(strategy)
    converted = (
        payments.connect(rates)
        .key_by(lambda payment: payment[2], lambda rate: rate[1], key_type=Types.STRING())
        .process(
            ConvertAtTheRateOfTheTime(),
            output_type=Types.TUPLE(
                [Types.STRING(), Types.STRING(), Types.DOUBLE(), Types.DOUBLE(), Types.DOUBLE()]
            ),
        )
    )
    converted.print("converted")
    converted.get_side_output(NO_RATE).print("no rate")
    env.execute("payments at the rate of their time")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--executor",
        choices=["spark", "local"],
        default="spark",
        help="local: threads; spark: a local session",
    )
    run(parser.parse_args().executor)
