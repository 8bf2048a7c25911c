"""A job that runs until Ctrl-C; prints its slots (JSON) once a checkpoint completed."""

from __future__ import annotations

import json
import sys
import time

from chandy import StreamExecutionEnvironment
from tests.jobs import KeyedCounter, Throttle

env = StreamExecutionEnvironment.get_execution_environment(executor="spark")
env.set_parallelism(2)
env.enable_checkpointing(100)
env.configure(
    {
        "execution.checkpointing.dir": sys.argv[1],
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "chandy.network.batch-size": 10,  # barriers and the cancel wait behind 10 paced records, not 1024
    }
)
env.from_sequence(0, 10**9).map(Throttle(0.0005)).key_by(lambda x: x % 10).process(
    KeyedCounter(10**12)
).print()
client = env.execute_async("endless")
while True:
    try:
        if client.get_checkpoint_statistics()["counts"]["completed"] >= 1:
            break
    except Exception:  # noqa: BLE001 - not running yet
        pass
    time.sleep(0.1)
print(json.dumps(client.get_task_slots()), flush=True)
try:
    client.get_job_execution_result()
except KeyboardInterrupt:
    client.cancel()
    try:
        client.get_job_execution_result(timeout=60)
    except Exception:  # noqa: BLE001 - cancelled, as asked
        pass
    raise
