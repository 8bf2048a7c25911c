"""A checkpointing job submitted to a standalone cluster (tests/test_standalone_cluster.py).

Usage: ``cluster_job.py CONTROL_DIR [--faults]``. Prints one JSON line per phase; without
``--faults`` the job holds until the test creates ``CONTROL_DIR/released``. With
``--faults``, while the job runs: SIGKILL a slot process, then an executor JVM (each
recovery timed from the kill to the next completed checkpoint), then asks the test to
kill a whole worker (``kill-worker``, with an executor JVM of that worker) and waits
until the test has started a replacement (``CONTROL_DIR/worker-replaced``). The counts
must be exact through all of it. The job's functions live here, so they travel by value:
the workers need only chandy installed, not this test suite.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from chandy import StreamExecutionEnvironment
from chandy.core.functions import KeyedProcessFunction, MapFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor

N, KEYS = 30_000, 30
#: How long one phase may take before the job gives up and says where it stuck (the test's
#: own bound is larger, so the job's report, not pytest's timeout, ends a stuck run).
DEADLINE_S = 150


class PacedUntil(MapFunction):
    """Slows the source down until ``gate`` exists, so that the faults land mid-run: its
    last fifth ten times slower than the rest (about 30 s more), which leaves a slow recovery
    time to finish before the input runs out. Never blocked: barriers still pass."""

    def __init__(self, gate: str) -> None:
        self.gate = gate
        self.open_gate = False

    def map(self, value: Any) -> Any:
        if not self.open_gate:
            if os.path.exists(self.gate):
                self.open_gate = True
            else:
                time.sleep(0.01 if value >= N * 4 // 5 else 0.0005)
        return value


class Count(KeyedProcessFunction):
    """Emits each key's count once, when it reaches its share of the input."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count"))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        if count == N // KEYS:
            yield ctx.get_current_key(), count


def say(phase: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"phase": phase, **fields}) + "\n")
    sys.stdout.flush()


def wait_until(condition: Any, what: str, describe: Any = None) -> None:
    """Wait for ``condition``; past the deadline, print a ``stuck`` phase (what was awaited
    and, from ``describe``, what the job looked like) and raise."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            say("stuck", waiting_for=what, **(describe() if describe else {}))
            raise TimeoutError(what)
        time.sleep(0.05)


def main() -> None:
    # the warmer's decisions go to the job's stderr (the test shows it when a spare stays cold)
    warmer_log = logging.getLogger("chandy.runtime.spark.spares")
    warmer_log.setLevel(logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    warmer_log.addHandler(handler)
    control = Path(sys.argv[1])
    faults = "--faults" in sys.argv[2:]
    gate = control / "released"
    env = StreamExecutionEnvironment.get_execution_environment(executor="spark")
    env.set_parallelism(2)
    env.enable_checkpointing(200)
    env.configure(
        {
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 10,
            "restart-strategy.fixed-delay.delay": 0,
            "chandy.spark.slot-wait": "120 s",
            "chandy.rest.enabled": False,
            "execution.checkpointing.dir": (control / "checkpoints").as_uri(),
        }
    )
    results = (
        env.from_sequence(0, N - 1)
        .uid("source")
        .map(PacedUntil(str(gate)))
        .uid("paced")
        .key_by(lambda x: x % KEYS)
        .process(Count())
        .uid("count")
        .execute_and_collect("cluster job")
    )
    out: list[Any] = []
    reader = threading.Thread(target=lambda: out.extend(results), daemon=True)
    reader.start()
    client = results.job_client

    def completed() -> int:
        return int(client.get_checkpoint_statistics()["counts"]["completed"])

    def running_with(restarts: int) -> bool:
        slots = client.get_task_slots()
        return (
            client.restarts >= restarts
            and client.get_job_status().name == "RUNNING"
            and len(slots) == 2
            and all(s["alive"] for s in slots)
        )

    def describe() -> dict[str, Any]:
        return {
            "status": client.get_job_status().name,
            "restarts": client.restarts,
            "checkpoints": client.get_checkpoint_statistics()["counts"],
            "slots": client.get_task_slots(),
        }

    def recovered_after(restarts: int, checkpoints: int) -> None:
        # Recovered: running again on two live slots with a checkpoint completed since the
        # fault. A slow recovery (a JVM to start on a loaded machine) may let the paced source
        # run out meanwhile: a job that restarted and then finished has recovered too.
        def recovered() -> bool:
            if client.get_job_status().name == "FINISHED":
                return client.restarts >= restarts
            return running_with(restarts) and completed() > checkpoints

        wait_until(
            recovered,
            f"a recovery (restart {restarts}, a checkpoint after {checkpoints})",
            describe,
        )

    wait_until(lambda: running_with(0) and completed() >= 2, "the job to get going", describe)
    slots = client.get_task_slots()
    say("running", slots=[{"pid": s["pid"], "jvm_pid": s["jvm_pid"]} for s in slots])
    recoveries: dict[str, float] = {}
    pool = client._job_master.executor._pool
    kept_the_stage = replaced_the_stage = False
    if faults:
        for what, pid in (("slot process", slots[0]["pid"]), ("executor JVM", slots[1]["jvm_pid"])):
            restarts, checkpoints = client.restarts, completed()
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            recovered_after(restarts + 1, checkpoints)
            recoveries[what] = round(time.monotonic() - killed, 2)
            if what == "slot process":
                kept_the_stage = client._job_master.executor._pool is pool
            else:
                replaced_the_stage = client._job_master.executor._pool is not pool
        restarts, checkpoints = client.restarts, completed()
        say("kill-worker", jvm_pid=client.get_task_slots()[0]["jvm_pid"])
        killed = time.monotonic()
        wait_until(lambda: (control / "worker-replaced").exists(), "the test did not replace the worker")
        recovered_after(restarts + 1, checkpoints)
        recoveries["worker"] = round(time.monotonic() - killed, 2)
        gate.touch()
    else:  # the test looks at the cluster while the job runs, then lets it finish
        wait_until(gate.exists, "the test did not release the job")
    reader.join(DEADLINE_S)
    say(
        "done",
        exact=sorted(out) == [(k, N // KEYS) for k in range(KEYS)],
        outputs=len(out),
        restarts=client.restarts,
        recoveries=recoveries,
        slot_kill_kept_the_stage=kept_the_stage,
        jvm_kill_replaced_the_stage=replaced_the_stage,
    )


if __name__ == "__main__":
    main()
