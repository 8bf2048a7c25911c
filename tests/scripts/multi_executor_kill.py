"""Two executor JVMs (local-cluster): a slot process is killed mid-run, then one executor JVM;
counts must stay exact."""

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

session = get_or_create_session(4, {"spark.master": "local-cluster[2,2,1024]"})
session.sparkContext.setLogLevel("ERROR")
n, keys = 100_000, 50
gate = os.path.join(tempfile.mkdtemp(prefix="multi-executor-"), "release-throttle")
env = StreamExecutionEnvironment.get_execution_environment(executor="spark")
env.set_parallelism(4)
env.enable_checkpointing(200)
env.configure({"restart-strategy.fixed-delay.delay": 0, "chandy.spark.slot-wait": "120 s"})
results = (
    env.from_sequence(0, n - 1)
    .uid("source")
    .map(Throttle(0.0001, until=gate))  # paced until both kills are done
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
# first a slot process: its supervisor forks the next one in the same stage
executor = client._job_master.executor
pool = executor._pool
os.kill(client.get_task_slots()[0]["pid"], signal.SIGKILL)
while not (
    client.restarts >= 1
    and client.get_job_status().name == "RUNNING"
    and [s["incarnation"] for s in client.get_task_slots()] == [1, 0, 0, 0]
    and all(s["alive"] for s in client.get_task_slots())
):
    assert time.monotonic() < deadline, "the killed slot process was not replaced"
    time.sleep(0.05)
same_stage = executor._pool is pool
jvms = sorted({s["jvm_pid"] for s in client.get_task_slots()})
os.kill(jvms[-1], signal.SIGKILL)  # one whole executor JVM, with its slots
release(gate)
reader.join(400)
print(
    json.dumps(
        {
            "executors_used": len(jvms),
            "restarts": client.restarts,
            "child_kill_kept_the_stage": same_stage,
            "jvm_kill_replaced_the_stage": executor._pool is not pool,
            "exact": sorted(out) == [(k, n // keys) for k in range(keys)],
            "outputs": len(out),
        }
    )
)
session.stop()
