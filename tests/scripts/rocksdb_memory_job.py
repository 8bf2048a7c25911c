"""A job whose keyed state is many times larger than its slot's RocksDB memory budget, run
(killed with SIGKILL, and run again) by tests/test_rocksdb_memory.py, which samples this
process's resident memory from /proc while it runs.

``python rocksdb_memory_job.py OUT_DIR CHECKPOINT_DIR LOCAL_DIR JOB_ID KEYS VALUE_BYTES BUDGET BACKEND
GATE MARKER INCREMENTAL``

A sequence ``0 .. 2 * KEYS - 1`` (parallelism 1: one slot, all of its memory in this process)
-> a map that lets the first KEYS records through at full speed, touches MARKER when the
first later one comes, and paces the rest (20 ms a record) until the file GATE exists ->
keyed by ``x % KEYS`` -> a process function: record ``x < KEYS`` writes key ``x``'s value,
VALUE_BYTES random, incompressible bytes derived from ``x`` (so the state is KEYS *
VALUE_BYTES bytes on disk, compressed or not); record ``KEYS + k`` reads key ``k`` back and
emits ``{"k": k, "ok": <the value is exactly key k's>}`` -> a JSON-lines FileSink (exactly
once). Checkpoints every 300 ms, incremental if INCREMENTAL is ``true`` and BACKEND
``rocksdb``, whose memory budget per slot (``state.backend.rocksdb.memory.fixed-per-slot``)
is BUDGET bytes; ``hashmap`` runs the same job on the heap, for contrast.

The first run is killed while paced (its state all written and checkpointed); run again
under JOB_ID, the job restores its latest checkpoint and reads every key back. ``SUMMARY
<json>`` at the end names the checkpoint it restored and the process's peak RSS (VmHWM).
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from chandy import StreamExecutionEnvironment
from chandy.connectors import FileSink, JsonLinesEncoder
from chandy.core.functions import KeyedProcessFunction, MapFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor


def value_of(key: int, size: int) -> bytes:
    return random.Random(key).randbytes(size)


class PaceAfterWrites(MapFunction):
    """Full speed through the writes; then MARKER, and 20 ms a record until GATE exists."""

    def __init__(self, keys: int, gate: str, marker: str) -> None:
        self.keys = keys
        self.gate = gate
        self.marker = marker
        self.released = False

    def map(self, value: int) -> int:
        if value >= self.keys and not self.released:
            if value == self.keys:
                Path(self.marker).touch()
            if os.path.exists(self.gate):
                self.released = True
            else:
                time.sleep(0.02)
        return value


class WriteThenRead(KeyedProcessFunction):
    def __init__(self, keys: int, value_bytes: int) -> None:
        self.keys = keys
        self.value_bytes = value_bytes

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(ValueStateDescriptor("value"))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        if value < self.keys:
            self.state.update(value_of(value, self.value_bytes))
        else:
            key = value - self.keys
            yield {"k": key, "ok": self.state.value() == value_of(key, self.value_bytes)}


def main() -> None:
    out_dir, checkpoint_dir, local_dir, job_id, keys, value_bytes, budget, backend, gate, marker = sys.argv[
        1:11
    ]
    incremental = sys.argv[11] == "true"
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    n = int(keys)
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    env.enable_checkpointing(300)
    env.configure(
        {
            "$internal.pipeline.job-id": job_id,
            "execution.checkpointing.dir": checkpoint_dir,
            "state.backend.type": backend,
            "execution.checkpointing.incremental": incremental,
            "state.backend.rocksdb.localdir": local_dir,
            "state.backend.rocksdb.memory.fixed-per-slot": int(budget),
            # small batches: a barrier waits behind at most 10 paced records
            "chandy.network.batch-size": 10,
        }
    )
    (
        env.from_sequence(0, 2 * n - 1)
        .uid("source")
        .map(PaceAfterWrites(n, gate, marker))
        .uid("pace")
        .key_by(lambda x: x % n)
        .process(WriteThenRead(n, int(value_bytes)))
        .uid("values")
        .sink_to(FileSink.for_row_format(out_dir, JsonLinesEncoder()).build())
        .uid("sink")
    )
    client = env.execute_async("rocksdb memory")
    client.get_job_execution_result()
    stats = client.get_checkpoint_statistics()
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    peak = int(status["VmHWM"].split()[0]) * 1024  # this process's peak RSS so far
    print("SUMMARY " + json.dumps({"restored": stats["latest"]["restored"], "vm_hwm": peak}), flush=True)


if __name__ == "__main__":
    main()
