"""Remote model inference with async I/O: PyFlink's ``examples/datastream/asyncio/remote_model_inference.py``.

Each comment is sent to a (simulated) remote model without waiting for the answer: up to
``capacity`` requests are in flight at once on the operator's event loop. A request that
times out on the model side (``TimeoutError``, one in three at the first attempt) is
tried again after a second, as the retry strategy says; one that is still not answered
after 10 s gets ``timeout()``'s default result. Results leave in the order they complete
(``unordered_wait_with_retry``). With checkpointing on, the requests in flight at a
checkpoint are stored in it and sent again after a failure, so each comment's result is
written once.

Ported from PyFlink by changing ``pyflink`` to ``chandy`` in the imports, with three
differences, all in ``main``:

* PyFlink's source is the Table API's ``datagen`` connector (random ``user_id`` and
  ``comments``, 100 rows/s, unbounded) converted to a DataStream; chandy has no Table API,
  so ``chandy.connectors.DataGeneratorSource`` makes the same rows: ``user_id`` is the
  row's index (unique, so a reader can check that each row gave one result), ``comments``
  a random string seeded by it. It stops after ``--records`` rows (PyFlink's never stops).
* ``--executor local`` runs the job on threads instead of a local Spark session.
* The checkpoint interval is 1 s instead of 30 s, so a short run checkpoints too.

Run it with ``python examples/async_inference.py`` (prints the results) or with
``--output DIR`` (a FileSink writes them); ``tests/test_async_io.py`` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import random
import string
import sys

from chandy.common import Encoder, Row, Time, Types
from chandy.connectors import DataGeneratorSource
from chandy.datastream import (
    AsyncDataStream,
    AsyncFunction,
    AsyncRetryStrategy,
    CheckpointingMode,
    RuntimeContext,
    StreamExecutionEnvironment,
    async_retry_predicates,
)
from chandy.datastream.connectors.file_system import FileSink, OutputFileConfig, RollingPolicy


class AsyncLLMRequest(AsyncFunction[Row, str]):
    def __init__(self) -> None:
        self.retried_keys: dict[int, bool] = {}

    def open(self, runtime_context: RuntimeContext) -> None:
        # create model inference client here
        pass

    def close(self) -> None:
        # close the model inference client here
        pass

    async def async_invoke(self, value: Row) -> list[str]:
        # issue the asynchronous request
        await asyncio.sleep(random.randint(1, 2))

        if value.user_id not in self.retried_keys and random.randint(1, 10) % 3 == 0:
            self.retried_keys[value.user_id] = True
            # remote model inference request may time out
            raise TimeoutError
        else:
            if value.user_id in self.retried_keys:
                del self.retried_keys[value.user_id]
            # remote model inference request completes
            # note that the result should be a collection even there is only one result
            analysis_result = "positive"
            result = {
                "user_id": value.user_id,
                "comments": value.comments,
                "analysis_result": analysis_result,
            }
            return [json.dumps(result)]

    def timeout(self, value: Row) -> list[str]:
        # return a default value in case timeout
        result = {"user_id": value.user_id, "comments": value.comments, "analysis_result": None}
        return [json.dumps(result)]


def comment_row(index: int) -> Row:
    """Row ``index`` of the source: what the ``datagen`` table of PyFlink's example gives."""
    rng = random.Random(index)
    return Row(user_id=index, comments="".join(rng.choices(string.ascii_lowercase + " ", k=20)))


def main(output_path: str | None, executor: str, records: int, rows_per_second: float) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.enable_checkpointing(1000, CheckpointingMode.EXACTLY_ONCE)

    # source: user_id, comments (PyFlink's example: the Table API's datagen connector)
    ds = env.from_source(
        DataGeneratorSource(comment_row, records, rows_per_second),
        source_name="source",
        type_info=Types.ROW_NAMED(["user_id", "comments"], [Types.INT(), Types.STRING()]),
    )

    # create an async retry strategy via utility class or a user defined strategy
    async_retry_strategy = AsyncRetryStrategy.fixed_delay(
        max_attempts=100,
        backoff_time_millis=1000,
        result_predicate=None,
        exception_predicate=functools.partial(
            async_retry_predicates.exception_type_predicate, expected_error_type=TimeoutError
        ),
    )

    result_stream = AsyncDataStream.unordered_wait_with_retry(
        data_stream=ds,
        async_function=AsyncLLMRequest(),
        timeout=Time.seconds(10),
        async_retry_strategy=async_retry_strategy,
        capacity=1000,
        output_type=Types.STRING(),
    )

    # define the sink
    if output_path is not None:
        result_stream.sink_to(
            sink=FileSink.for_row_format(base_path=output_path, encoder=Encoder.simple_string_encoder())
            .with_output_file_config(
                OutputFileConfig.builder().with_part_prefix("prefix").with_part_suffix(".ext").build()
            )
            .with_rolling_policy(RollingPolicy.default_rolling_policy())
            .build()
        )
    else:
        print("Printing result to stdout. Use --output to specify output path.")
        result_stream.print()

    # submit for execution
    env.execute()


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(message)s")

    parser = argparse.ArgumentParser()
    parser.add_argument("--output", dest="output", required=False, help="Output file to write results to.")
    parser.add_argument(
        "--executor",
        choices=["spark", "local"],
        default="spark",
        help="local: threads; spark: a local session",
    )
    parser.add_argument("--records", type=int, default=500, help="how many rows the source makes")
    parser.add_argument("--rows-per-second", type=float, default=100, help="the source's rate")

    known_args, _ = parser.parse_known_args(sys.argv[1:])
    main(known_args.output, known_args.executor, known_args.records, known_args.rows_per_second)
