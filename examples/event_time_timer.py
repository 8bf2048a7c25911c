"""Event-time timers: PyFlink's ``event_time_timer.py`` example, ported by changing its imports.

Each person's amounts are summed in keyed state; every record sets an event-time
timer two seconds after its own timestamp, and when the watermark passes a timer
the running sum is emitted. Watermarks follow the timestamps with two seconds of
allowed disorder. Run it with ``python examples/event_time_timer.py``
(``--executor local`` for threads instead of a local Spark session).

As run here the job is deterministic: watermarks are generated only at the end
of the input (``pipeline.auto-watermark-interval: 0``), so every timer fires
then, in timestamp order, and each prints the final sum. With periodic
watermarks (the default, every 200 ms) a timer may fire while records are still
arriving and print the sum so far. ``tests/test_examples.py`` compares the output
with PyFlink's (PyFlink's example also sets a one-second state TTL, which
changes nothing in a run this short; the run it is compared with leaves it out,
and ``examples/state_access.py`` shows TTL).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from typing import Any

from chandy.common import Configuration, Duration, WatermarkStrategy
from chandy.common.typeinfo import Types
from chandy.common.watermark_strategy import TimestampAssigner
from chandy.datastream import StreamExecutionEnvironment
from chandy.datastream.functions import KeyedProcessFunction, RuntimeContext
from chandy.datastream.state import ValueStateDescriptor

PAYMENTS = [
    (1000, "Alice", 110.1),
    (4000, "Bob", 30.2),
    (3000, "Alice", 20.0),
    (2000, "Bob", 53.1),
    (5000, "Alice", 13.1),
    (3000, "Bob", 3.1),
    (7000, "Bob", 16.1),
    (10000, "Alice", 20.1),
]


class FirstFieldIsTheTime(TimestampAssigner):
    """Event time is the record's first field, in milliseconds."""

    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return int(value[0])


class SumAndReportLater(KeyedProcessFunction):
    """Adds each amount to the person's total and reports the total 2 s of event time later."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.total = runtime_context.get_state(ValueStateDescriptor("total", Types.DOUBLE()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> None:
        self.total.update((self.total.value() or 0) + value[2])
        timestamp = ctx.timestamp()
        assert timestamp is not None  # the watermark strategy gave every record one
        ctx.timer_service().register_event_time_timer(timestamp + 2000)

    def on_timer(
        self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
    ) -> Iterator[tuple[str, float]]:
        yield ctx.get_current_key(), self.total.value()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executor", choices=["spark", "local"], default="spark")
    args = parser.parse_args()

    env = StreamExecutionEnvironment.get_execution_environment(executor=args.executor)
    env.configure(Configuration().set_string("pipeline.auto-watermark-interval", "0 ms"))
    env.set_parallelism(1)
    payments = env.from_collection(
        PAYMENTS, type_info=Types.TUPLE([Types.LONG(), Types.STRING(), Types.DOUBLE()])
    )
    with_time = payments.assign_timestamps_and_watermarks(
        WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_seconds(2)).with_timestamp_assigner(
            FirstFieldIsTheTime()
        )
    )
    with_time.key_by(lambda payment: payment[1]).process(SumAndReportLater()).print()
    env.execute("event-time timers")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
