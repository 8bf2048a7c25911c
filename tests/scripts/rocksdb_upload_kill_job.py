"""A job on RocksDB whose incremental checkpoints upload megabytes of SST files each, killed
with SIGKILL during an upload (and run again) by tests/test_rocksdb_incremental.py.

``python rocksdb_upload_kill_job.py OUT_DIR CHECKPOINT_DIR LOCAL_DIR JOB_ID RECORDS GATE``

A sequence, throttled until the file GATE exists -> keyed by ``x % KEYS`` -> a process function
that keeps, per key, its count, the last ``x`` and that record's payload (PAYLOAD random,
incompressible bytes, derived from ``x``) in a ValueState -> a JSON-lines FileSink, with a
checkpoint every 200 ms. About 100 records (25 MB of payloads) reach the state between two
checkpoints: each checkpoint flushes them into new SST files and uploads tens of MB into
``shared/``, which takes long enough for the test to kill the driver in the middle.

Each output record is ``{"x", "key", "count", "last", "ok"}``: ``last`` is the ``x`` the state
held before, ``ok`` whether the payload held with it was exactly that record's. Exactly once
means every ``x`` once, per key counts 1..n and each ``last`` the previous ``x`` of the key;
``ok`` everywhere means the restored database held the right bytes. ``SUMMARY <json>`` at the
end names the checkpoint it restored and the ones it completed.
"""

from __future__ import annotations

import json
import logging
import random
import sys
from typing import Any

from chandy import StreamExecutionEnvironment
from chandy.connectors import FileSink, JsonLinesEncoder
from chandy.core.functions import KeyedProcessFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor
from tests.jobs import Throttle

KEYS = 40
PAYLOAD = 256 * 1024


def payload(x: int) -> bytes:
    return random.Random(x).randbytes(PAYLOAD)


class KeepPayload(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(ValueStateDescriptor("last"))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        held = self.state.value()
        if held is None:
            count, last, ok = 1, None, True
        else:
            previous_count, last, data = held
            count, ok = previous_count + 1, data == payload(last)
        self.state.update((count, value, payload(value)))
        yield {"x": value, "key": ctx.get_current_key(), "count": count, "last": last, "ok": ok}


def main() -> None:
    out_dir, checkpoint_dir, local_dir, job_id, records, gate = sys.argv[1:7]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    env.enable_checkpointing(200)
    env.configure(
        {
            "$internal.pipeline.job-id": job_id,
            "execution.checkpointing.dir": checkpoint_dir,
            "state.backend.type": "rocksdb",
            "execution.checkpointing.incremental": True,
            "state.backend.rocksdb.localdir": local_dir,
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
        .process(KeepPayload())
        .uid("payloads")
        .sink_to(FileSink.for_row_format(out_dir, JsonLinesEncoder()).build())
        .uid("sink")
    )
    client = env.execute_async("rocksdb upload kill")
    client.get_job_execution_result()
    stats = client.get_checkpoint_statistics()
    completed = [c["id"] for c in stats["history"] if c["status"] == "COMPLETED"]
    print(
        "SUMMARY " + json.dumps({"restored": stats["latest"]["restored"], "completed": completed}), flush=True
    )


if __name__ == "__main__":
    main()
