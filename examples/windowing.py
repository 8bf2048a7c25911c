"""Event-time windows: PyFlink's windowing examples, ported by changing their imports.

PyFlink ships one example per window kind under ``pyflink/examples/datastream/windowing/``;
this file runs the same jobs on chandy and prints what PyFlink prints, line for line
(``tests/test_examples.py`` holds PyFlink's output and compares):

    python examples/windowing.py tumbling          # TumblingEventTimeWindows, 5 ms
    python examples/windowing.py sliding           # SlidingEventTimeWindows, 5 ms every 2 ms
    python examples/windowing.py session           # EventTimeSessionWindows, 5 ms gap
    python examples/windowing.py dynamic-session   # a gap taken from each record
    python examples/windowing.py count             # count windows of 2 records per key

Each record is ``(word, timestamp)`` (``(number, word)`` for count windows); the
timestamp doubles as the event time. The time windows count records per window and
emit ``(key, window start, window end, count)``. ``--executor local`` runs on
threads instead of a local Spark session; ``--output DIR`` writes part files
instead of printing.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable
from typing import Any

from chandy.common import Encoder, Time, Types, WatermarkStrategy
from chandy.common.watermark_strategy import TimestampAssigner
from chandy.datastream import DataStream, ProcessWindowFunction, StreamExecutionEnvironment, WindowFunction
from chandy.datastream.connectors.file_system import FileSink, OutputFileConfig, RollingPolicy
from chandy.datastream.window import (
    CountWindow,
    EventTimeSessionWindows,
    SessionWindowTimeGapExtractor,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowAssigner,
)

#: The records of PyFlink's time-window examples (the session examples have no ``('hi', 5)``).
WORDS = [("hi", 1), ("hi", 2), ("hi", 3), ("hi", 4), ("hi", 5), ("hi", 8), ("hi", 9), ("hi", 15)]
#: The records of PyFlink's count-window example.
NUMBERS = [(1, "hi"), (2, "hello"), (3, "hi"), (4, "hello"), (5, "hi"), (6, "hello"), (6, "hello")]

WORD_AND_TIME = Types.TUPLE([Types.STRING(), Types.INT()])
WINDOW_COUNT = Types.TUPLE([Types.STRING(), Types.INT(), Types.INT(), Types.INT()])


class SecondFieldIsTheTime(TimestampAssigner):
    """Event time is the record's second field, in milliseconds."""

    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return int(value[1])


class GapIsTheTime(SessionWindowTimeGapExtractor):
    """A session closes after a gap as long as the record's own timestamp."""

    def extract(self, element: Any) -> int:
        return int(element[1])


class CountPerWindow(ProcessWindowFunction[tuple, tuple, str, TimeWindow]):
    """One line per window: which key, where the window lies, how many records it holds."""

    def process(
        self, key: str, context: ProcessWindowFunction.Context, elements: Iterable[tuple]
    ) -> list[tuple]:
        window = context.window()
        return [(key, window.start, window.end, sum(1 for _ in elements))]


class SumPerWindow(WindowFunction[tuple, tuple, str, CountWindow]):
    """The sum of the numbers of a count window."""

    def apply(self, key: str, window: CountWindow, inputs: Iterable[tuple]) -> list[tuple]:
        return [(key, sum(number for number, _ in inputs))]


def time_windows(
    env: StreamExecutionEnvironment, assigner: WindowAssigner, records: list[tuple]
) -> DataStream:
    """Count the records of each event-time window of ``assigner``."""
    words = env.from_collection(records, type_info=WORD_AND_TIME)
    with_time = words.assign_timestamps_and_watermarks(
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(SecondFieldIsTheTime())
    )
    return (
        with_time.key_by(lambda record: record[0], key_type=Types.STRING())
        .window(assigner)
        .process(CountPerWindow(), WINDOW_COUNT)
    )


def count_windows(env: StreamExecutionEnvironment) -> DataStream:
    """Sum the numbers of each word, two records at a time."""
    numbers = env.from_collection(NUMBERS, type_info=Types.TUPLE([Types.INT(), Types.STRING()]))
    return (
        numbers.key_by(lambda record: record[1], key_type=Types.STRING())
        .count_window(2)
        .apply(SumPerWindow(), Types.TUPLE([Types.STRING(), Types.INT()]))
    )


def build(env: StreamExecutionEnvironment, kind: str) -> DataStream:
    if kind == "tumbling":
        return time_windows(env, TumblingEventTimeWindows.of(Time.milliseconds(5)), WORDS)
    if kind == "sliding":
        return time_windows(
            env, SlidingEventTimeWindows.of(Time.milliseconds(5), Time.milliseconds(2)), WORDS
        )
    sessions = [record for record in WORDS if record[1] != 5]
    if kind == "session":
        return time_windows(env, EventTimeSessionWindows.with_gap(Time.milliseconds(5)), sessions)
    if kind == "dynamic-session":
        return time_windows(env, EventTimeSessionWindows.with_dynamic_gap(GapIsTheTime()), sessions)
    return count_windows(env)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=["tumbling", "sliding", "session", "dynamic-session", "count"])
    parser.add_argument("--output", help="write the results as files under this directory")
    parser.add_argument("--executor", choices=["spark", "local"], default="spark")
    args = parser.parse_args()

    env = StreamExecutionEnvironment.get_execution_environment(executor=args.executor)
    env.set_parallelism(1)  # one subtask: the results in one file, in order
    results = build(env, args.kind)
    if args.output is not None:
        results.sink_to(
            FileSink.for_row_format(args.output, Encoder.simple_string_encoder())
            .with_output_file_config(OutputFileConfig.builder().with_part_prefix("windows").build())
            .with_rolling_policy(RollingPolicy.default_rolling_policy())
            .build()
        )
    else:
        print("Printing result to stdout. Use --output to specify output path.")
        results.print()
    env.execute(f"{args.kind} windows")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
