"""A bounded job with a fixed job id, run (and killed, and run again) by tests/test_driver_restart.py.

``python driver_restart_job.py EXECUTOR OUT_DIR CHECKPOINT_DIR JOB_ID RECORDS GATE``

A sequence, throttled until the file GATE exists (the test creates it once it killed the
first run: the run it submits again need not be paced) -> a keyed running count (ValueState)
-> a JSON-lines FileSink, with checkpoints every 200 ms. Each output record is
``{"x": x, "key": k, "count": c}``: with exactly-once output every ``x`` appears once, and
per key the counts are 1..n with no gap (state restored) and no repeat (no record processed
twice into the output). On Spark it prints ``SLOTS <json>`` once a checkpoint completed, so
the test knows which processes belong to this run; at the end ``SUMMARY <json>`` with the
checkpoints it restored and completed.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from chandy import StreamExecutionEnvironment
from chandy.connectors import FileSink, JsonLinesEncoder
from chandy.core.functions import KeyedProcessFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor
from tests.jobs import Throttle

KEYS = 7


class CountPerKey(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count"))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        yield {"x": value, "key": ctx.get_current_key(), "count": count}


def _has_completed_a_checkpoint(client: Any) -> bool:
    try:
        return bool(client.get_checkpoint_statistics()["counts"]["completed"])
    except Exception:  # noqa: BLE001 - the job is not running yet
        return False


def main() -> None:
    executor, out_dir, checkpoint_dir, job_id, records, gate = sys.argv[1:7]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    env.enable_checkpointing(200)
    env.configure(
        {
            "$internal.pipeline.job-id": job_id,
            "execution.checkpointing.dir": checkpoint_dir,
            "execution.checkpointing.data-inline-threshold": 0,
            "restart-strategy.fixed-delay.delay": 100,
            # small batches: a barrier waits behind at most 10 throttled records, not 1024
            "chandy.network.batch-size": 10,
        }
    )
    (
        env.from_sequence(0, int(records) - 1)
        .uid("source")
        .map(Throttle(0.002, until=gate))
        .uid("throttle")
        .key_by(lambda x: x % KEYS)
        .process(CountPerKey())
        .uid("count")
        .sink_to(FileSink.for_row_format(out_dir, JsonLinesEncoder()).build())
        .uid("sink")
    )
    client = env.execute_async("driver restart")
    if executor == "spark":  # once a checkpoint completed, so that every slot has registered
        while not _has_completed_a_checkpoint(client):
            time.sleep(0.05)
        print("SLOTS " + json.dumps(client.get_task_slots()), flush=True)
    client.get_job_execution_result()
    stats = client.get_checkpoint_statistics()
    completed = [c["id"] for c in stats["history"] if c["status"] == "COMPLETED"]
    print(
        "SUMMARY " + json.dumps({"restored": stats["latest"]["restored"], "completed": completed}), flush=True
    )


if __name__ == "__main__":
    main()
