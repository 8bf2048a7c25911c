"""Two executor JVMs (local-cluster); one is killed mid-run; counts must stay exact."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from chandy import StreamExecutionEnvironment
from chandy.runtime.spark.session import get_or_create_session
from tests.jobs import KeyedCounter, Throttle

session = get_or_create_session(4, {"spark.master": "local-cluster[2,2,1024]"})
session.sparkContext.setLogLevel("ERROR")
n, keys = 100_000, 50
env = StreamExecutionEnvironment.get_execution_environment(executor="spark")
env.set_parallelism(4)
env.enable_checkpointing(200)
env.configure({"restart-strategy.fixed-delay.delay": 0, "chandy.spark.slot-wait": "120 s"})
results = (
    env.from_sequence(0, n - 1)
    .uid("source")
    .map(Throttle(0.0001))
    .uid("throttle")
    .key_by(lambda x: x % keys)
    .process(KeyedCounter(n // keys))
    .uid("counter")
    .execute_and_collect("multi executor")
)
out: list = []
reader = threading.Thread(target=lambda: out.extend(results), daemon=True)
reader.start()
client = results.job_client
deadline = time.monotonic() + 300
while len(client.get_task_slots()) < 4 or client.get_checkpoint_statistics()["counts"]["completed"] < 2:
    assert time.monotonic() < deadline, "the job did not get going"
    time.sleep(0.1)
jvms = sorted({s["jvm_pid"] for s in client.get_task_slots()})
os.kill(jvms[-1], signal.SIGKILL)  # one whole executor JVM, with its slots
reader.join(400)
print(
    json.dumps(
        {
            "executors_used": len(jvms),
            "restarts": client.restarts,
            "exact": sorted(out) == [(k, n // keys) for k in range(keys)],
            "outputs": len(out),
        }
    )
)
session.stop()
