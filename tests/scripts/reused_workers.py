"""Python worker reuse on (a cluster's default): a slot's supervisor runs in a worker that
takes the next Spark task after it. Two jobs in a row, a slot process killed in the
second; prints JSON: whether both were exact and the second kept its stage."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from chandy import StreamExecutionEnvironment
from chandy.runtime.spark.session import get_or_create_session
from tests.jobs import KeyedCounter, Throttle, release

session = get_or_create_session(2, {"spark.master": "local[2]", "spark.python.worker.reuse": "true"})
session.sparkContext.setLogLevel("ERROR")
n, keys = 60_000, 20


def run(kill: bool) -> dict[str, object]:
    gate = os.path.join(tempfile.mkdtemp(prefix="reused-workers-"), "release-throttle")
    env = StreamExecutionEnvironment.get_execution_environment(executor="spark")
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    env.configure({"restart-strategy.fixed-delay.delay": 0})
    results = (
        env.from_sequence(0, n - 1)
        .map(Throttle(0.00005, until=gate))  # paced until its slots are known (and one killed)
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .execute_and_collect("reused workers")
    )
    out: list = []
    reader = threading.Thread(target=lambda: out.extend(results), daemon=True)
    reader.start()
    client = results.job_client
    deadline = time.monotonic() + 120
    while len(client.get_task_slots()) < 2 or client.get_checkpoint_statistics()["counts"]["completed"] < 1:
        assert time.monotonic() < deadline, "the job did not get going"
        time.sleep(0.05)
    slots = client.get_task_slots()
    pool = client._job_master.executor._pool
    if kill:
        os.kill(slots[1]["pid"], signal.SIGKILL)
        while client.restarts < 1:
            assert time.monotonic() < deadline, "the killed slot process was not noticed"
            time.sleep(0.05)
    release(gate)
    reader.join(120)
    return {
        "exact": sorted(out) == [(k, n // keys) for k in range(keys)],
        "restarts": client.restarts,
        "same_stage": client._job_master.executor._pool is pool,
        "supervisors": sorted(s["supervisor_pid"] for s in slots),
    }


first = run(kill=False)
second = run(kill=True)
print(json.dumps({"first": first, "second": second}))
session.stop()
