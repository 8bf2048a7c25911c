"""Unaligned checkpoints and the aligned-checkpoint timeout in real jobs (issue 16's acceptance
tests), on the local executor and on Spark.

The job is Flink's ``UnalignedCheckpointITCase`` (``tests/unaligned_jobs.py``): sources whose
subtask ``i`` emits ``i, i + n, ...``, a keyed and a rebalance exchange, a slow last stage that
backpressures everything, and checks in state that count every record lost, duplicated or
out of order. Each test also asserts from the checkpoint statistics that what it claims to
exercise happened (unaligned checkpoints that persisted in-flight data, or none at all), so it
cannot pass by checkpointing some other way.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from chandy import InvalidCheckpointError, StreamExecutionEnvironment
from tests.jobs import kill_a_slot_after_checkpoints
from tests.probes import Probe
from tests.test_checkpointing_e2e import cancel_keeping_results, drain
from tests.unaligned_jobs import (
    assert_exactly_once_in_order,
    completed_checkpoints,
    subtask_details,
    unaligned_pipeline,
    wait_for,
)

#: End-to-end jobs on both executors, several seconds each.
pytestmark = pytest.mark.slow

#: Small batches, so that a backpressured channel holds several of them (4 credits each) and
#: an aligned barrier waits behind ~1 k records per channel, not 4 k.
BATCH_SIZE = 256


def unaligned_env(executor: str, parallelism: int, **config: Any) -> StreamExecutionEnvironment:
    """Checkpoints every 100 ms, unaligned (PyFlink's ``enable_unaligned_checkpoints``); fast
    restarts; every checkpoint kept in the statistics history."""
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(100)
    env.get_checkpoint_config().enable_unaligned_checkpoints()
    env.configure(
        {
            "restart-strategy.fixed-delay.delay": 50,
            "chandy.network.batch-size": BATCH_SIZE,
            "web.checkpoints.history": 10_000,
            **config,
        }
    )
    return env


def run(stream: Any, name: str) -> tuple[list[Any], Any]:
    """Run the job to its end; its collected records and its client."""
    results = stream.execute_and_collect(name)
    with results:
        out = list(results)
    client = results.job_client
    client.get_job_execution_result(timeout=60)
    return out, client


def unaligned_with_data(checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in checkpoints if c["is_unaligned"] and c["persisted_data"] > 0]


def kill_a_slot_after_the_failures(client: Any, probe: Probe, failures: int) -> None:
    """Once the induced failures are over, kill a slot two checkpoints later: a kill while the
    job restarts after an induced failure would merge into that failover."""
    wait_for(lambda: probe.get("failures") >= failures or client.is_done(), "the induced failures")
    completed = client.get_checkpoint_statistics(timeout=60)["counts"]["completed"]
    kill_a_slot_after_checkpoints(client, completed + 2)


def test_unaligned_checkpoints_keep_every_record_once_and_in_order_through_failures(executor: str) -> None:
    """Flink's UnalignedCheckpointITCase: unaligned checkpoints every 100 ms under
    backpressure, three induced failures (on Spark also a slot process killed), and still
    count lost = duplicated = out-of-order = 0 for every source subtask."""
    parallelism = 3 if executor == "local" else 2
    per_subtask = 40_000 if executor == "local" else 50_000
    failures = 3
    probe = Probe()
    env = unaligned_env(executor, parallelism)
    stream = unaligned_pipeline(env, probe, per_subtask, every=4, pause_s=0.001, failures=failures)
    results = stream.execute_and_collect("unaligned through failures")
    client = results.job_client
    if executor == "spark":
        killer = threading.Thread(target=kill_a_slot_after_the_failures, args=(client, probe, failures))
        killer.start()
    with results:
        out = list(results)
    client.get_job_execution_result(timeout=60)
    if executor == "spark":
        killer.join(60)

    assert_exactly_once_in_order(out, probe, "sink", parallelism, per_subtask)
    assert probe.get("failures") >= failures
    assert client.restarts >= failures + (1 if executor == "spark" else 0)
    stats = client.get_checkpoint_statistics()
    assert stats["counts"]["restored"] >= failures  # every failure came back from a checkpoint
    checkpoints = completed_checkpoints(stats)
    assert checkpoints, stats["counts"]
    assert unaligned_with_data(checkpoints), [
        (c["id"], c["is_unaligned"], c["persisted_data"]) for c in checkpoints
    ]
    assert stats["summary"]["persisted_data"]["max"] > 0


@pytest.mark.parametrize("timeout_ms", [0, 60_000], ids=["timeout-0", "timeout-60s"])
def test_aligned_checkpoint_timeout_decides_every_checkpoint(executor: str, timeout_ms: int) -> None:
    """With unaligned checkpoints enabled, a timeout of 0 makes every checkpoint unaligned;
    one far above the alignment time keeps every checkpoint aligned (nothing persisted),
    and they still complete under backpressure."""
    parallelism, per_subtask = 2, 12_000
    probe = Probe()
    env = unaligned_env(
        executor, parallelism, **{"execution.checkpointing.aligned-checkpoint-timeout": timeout_ms}
    )
    out, client = run(unaligned_pipeline(env, probe, per_subtask, every=4, pause_s=0.001), "aligned timeout")

    assert_exactly_once_in_order(out, probe, "sink", parallelism, per_subtask)
    checkpoints = completed_checkpoints(client.get_checkpoint_statistics())
    kinds = [(c["id"], c["is_unaligned"], c["persisted_data"]) for c in checkpoints]
    assert len(checkpoints) >= 2, kinds
    if timeout_ms == 0:
        assert all(c["is_unaligned"] for c in checkpoints), [k for k in kinds if not k[1]]
        assert unaligned_with_data(checkpoints), kinds
    else:
        unaligned = [c for c in checkpoints if c["is_unaligned"] or c["persisted_data"]]
        assert env.rest_url is not None
        assert not unaligned, {
            c["id"]: subtask_details(env.rest_url, client.get_job_id(), c["id"]) for c in unaligned
        }
        # ...and the barriers did wait behind the backlog (else this proves nothing about the timeout)
        subtasks = [
            s for c in checkpoints for s in subtask_details(env.rest_url, client.get_job_id(), c["id"])
        ]
        assert any(s["alignment"]["duration"] > 0 for s in subtasks), subtasks


def test_an_alignment_longer_than_the_timeout_switches_to_unaligned_midway(executor: str) -> None:
    """A timeout of 50 ms with a backlog that takes about half a second to drain: each checkpoint
    starts aligned (its barriers wait, so some subtask reports an alignment time), switches to
    unaligned when the timer fires, persists what its barriers then overtake and completes;
    every record still arrives once and in order."""
    parallelism, per_subtask = 2, 6_000
    probe = Probe()
    env = unaligned_env(executor, parallelism, **{"execution.checkpointing.aligned-checkpoint-timeout": 50})
    stream = unaligned_pipeline(env, probe, per_subtask, every=2, pause_s=0.001)
    out, client = run(stream, "switch midway")

    assert_exactly_once_in_order(out, probe, "sink", parallelism, per_subtask)
    checkpoints = completed_checkpoints(client.get_checkpoint_statistics())
    switched = unaligned_with_data(checkpoints)
    assert switched, [(c["id"], c["is_unaligned"], c["persisted_data"]) for c in checkpoints]
    assert env.rest_url is not None
    subtasks = [s for c in switched for s in subtask_details(env.rest_url, client.get_job_id(), c["id"])]
    waited_then_switched = [
        s for s in subtasks if s["unaligned_checkpoint"] and s["alignment"]["duration"] > 0
    ]
    assert waited_then_switched, subtasks
    assert any(s["alignment"]["persisted"] > 0 for s in subtasks), subtasks


def run_until_in_flight_data_is_checkpointed(
    env: StreamExecutionEnvironment, probe: Probe, per_subtask: int
) -> tuple[Any, Any, list[Any], threading.Thread]:
    """Start the job slow enough never to finish (SlowCheck ``first``) and return once an
    unaligned checkpoint with in-flight data completed: its collect iterator, its client, the
    list a reader thread fills with its records, and that thread."""
    first = unaligned_pipeline(env, probe, per_subtask, every=1, pause_s=0.002, name="first")
    results = first.execute_and_collect("first run")
    client = results.job_client
    out, reader = drain(results)

    def checkpointed_in_flight_data() -> bool:
        return bool(unaligned_with_data(completed_checkpoints(client.get_checkpoint_statistics(timeout=60))))

    wait_for(checkpointed_in_flight_data, "an unaligned checkpoint with in-flight data")
    return results, client, out, reader


def test_a_retained_unaligned_checkpoint_restores_at_its_parallelism_and_refuses_rescaling(
    tmp_path: Path, executor: str
) -> None:
    """A checkpoint holding in-flight data restores exactly once at the parallelism it was
    taken at (the in-flight records are replayed into their channels); at another
    parallelism the restore is refused with an error that names the cause and the fixes."""
    parallelism, per_subtask = 2, 100_000
    retain = {
        "execution.checkpointing.dir": str(tmp_path / "first"),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    }
    probe = Probe()
    env = unaligned_env(executor, parallelism, **retain)
    results, client, first_out, reader = run_until_in_flight_data_is_checkpointed(env, probe, per_subtask)
    cancel_keeping_results(results, reader)  # RETAIN_ON_CANCELLATION keeps its latest checkpoint
    retained_dirs = [p.parent for p in (tmp_path / "first").glob("*/chk-*/_metadata")]
    assert len(retained_dirs) == 1, retained_dirs
    retained = retained_dirs[0]
    retained_id = int(retained.name.split("-")[1])
    (retained_stats,) = [
        c for c in completed_checkpoints(client.get_checkpoint_statistics()) if c["id"] == retained_id
    ]
    assert retained_stats["is_unaligned"] and retained_stats["persisted_data"] > 0, retained_stats

    rescaled = unaligned_env(executor, parallelism + 1)
    rescaled.set_restore_path(str(retained))
    unaligned_pipeline(
        rescaled, probe, per_subtask, every=1, pause_s=0.0, name="rescaled", partitions=parallelism
    ).print()
    with pytest.raises(InvalidCheckpointError) as info:
        rescaled.execute("rescaled")
    message = str(info.value)
    assert "parallelism" in message and "savepoint" in message and "aligned" in message, message

    again = unaligned_env(executor, parallelism, **{"execution.checkpointing.dir": str(tmp_path / "second")})
    again.set_restore_path(str(retained))
    second = unaligned_pipeline(again, probe, per_subtask, every=1, pause_s=0.0, name="second")
    second_out, second_client = run(second, "second run")
    assert second_client.get_checkpoint_statistics()["counts"]["restored"] == 1
    assert_exactly_once_in_order(first_out + second_out, probe, "second", parallelism, per_subtask)


def test_a_savepoint_of_an_unaligned_job_is_aligned_and_rescales(tmp_path: Path, executor: str) -> None:
    """The way out the refusal names: a savepoint taken while unaligned checkpoints run under
    backpressure is aligned (it holds no in-flight data), and the job restores from it at
    another parallelism exactly once."""
    parallelism, per_subtask = 2, 100_000
    probe = Probe()
    env = unaligned_env(executor, parallelism)
    results, client, first_out, reader = run_until_in_flight_data_is_checkpointed(env, probe, per_subtask)
    savepoint = client.stop_with_savepoint(savepoint_directory=str(tmp_path)).result(120)
    reader.join(60)
    results.close()
    (taken,) = [c for c in client.get_checkpoint_statistics()["history"] if c["is_savepoint"]]
    assert taken["status"] == "COMPLETED" and not taken["is_unaligned"], taken
    assert taken["persisted_data"] == 0, taken

    rescaled = unaligned_env(executor, parallelism + 1)
    rescaled.set_restore_path(savepoint)
    stream = unaligned_pipeline(
        rescaled, probe, per_subtask, every=1, pause_s=0.0, name="rescaled", partitions=parallelism
    )
    second_out, _ = run(stream, "rescaled run")
    assert_exactly_once_in_order(
        first_out + second_out, probe, "rescaled", parallelism, per_subtask, subtasks=parallelism + 1
    )
