"""PyFlink 2.3's ``examples/datastream/event_time_timer.py`` as run for ``event-time-timer.txt``.

Three changes, each to make the run comparable: no state TTL (not in chandy yet), the state
typed DOUBLE instead of FLOAT (a FLOAT state rounds to 32 bits; Python computes in 64),
and watermarks only at the end of the input (``pipeline.auto-watermark-interval: 0``) with
one subtask, so that which timers fire before the last record does not depend on timing.
Run with PyFlink's interpreter: ``python event_time_timer.pyflink.py``.
"""

from pyflink.common import Configuration, Duration, WatermarkStrategy
from pyflink.common.typeinfo import Types
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor


class Sum(KeyedProcessFunction):
    def __init__(self):
        self.state = None

    def open(self, runtime_context: RuntimeContext):
        self.state = runtime_context.get_state(ValueStateDescriptor("state", Types.DOUBLE()))

    def process_element(self, value, ctx: "KeyedProcessFunction.Context"):
        current = self.state.value()
        if current is None:
            current = 0
        current += value[2]
        self.state.update(current)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + 2000)

    def on_timer(self, timestamp: int, ctx: "KeyedProcessFunction.OnTimerContext"):
        yield ctx.get_current_key(), self.state.value()


class MyTimestampAssigner(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp: int) -> int:
        return int(value[0])


def event_timer_timer_demo():
    env = StreamExecutionEnvironment.get_execution_environment()
    env.configure(Configuration().set_string("pipeline.auto-watermark-interval", "0 ms"))
    env.set_parallelism(1)
    ds = env.from_collection(
        collection=[
            (1000, "Alice", 110.1),
            (4000, "Bob", 30.2),
            (3000, "Alice", 20.0),
            (2000, "Bob", 53.1),
            (5000, "Alice", 13.1),
            (3000, "Bob", 3.1),
            (7000, "Bob", 16.1),
            (10000, "Alice", 20.1),
        ],
        type_info=Types.TUPLE([Types.LONG(), Types.STRING(), Types.DOUBLE()]),
    )
    ds = ds.assign_timestamps_and_watermarks(
        WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_seconds(2)).with_timestamp_assigner(
            MyTimestampAssigner()
        )
    )
    ds.key_by(lambda value: value[1]).process(Sum()).print()
    env.execute()


if __name__ == "__main__":
    event_timer_timer_demo()
