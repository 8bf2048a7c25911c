"""The base of an incremental checkpoint: the coordinator names its latest completed checkpoint
in every barrier (``CheckpointOptions.base_checkpoint_id``), tasks reuse only that one's shared
files, and the registry keeps them while a checkpoint naming it is pending.

Why: a task hears that a checkpoint completed through an RPC, which the barrier of the next
one can overtake in the data channels. A task that reused the files of the last checkpoint it
*heard* of could reference files that a newer completion (which it had not heard of) subsumed
and deleted: that checkpoint failed, and with it, by default, the job. Real coordinators on
manual time, real files in ``shared/``; every test names which files exist after each event.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.checkpoint.shared_state import SharedStateRegistry
from chandy.config.options import ExternalizedCheckpointRetention
from chandy.messages.status import JobStatus
from chandy.state.handles import IncrementalKeyedStateHandle
from chandy.storage.snapshot_key import environment_key
from tests.test_checkpoint_coordinator import A1, A2, Harness, ack, decline, pending_ids, succeeded
from tests.test_checkpoint_coordinator_failures import FailingStore
from tests.test_shared_state_registry import (
    Files,
    complete,
    count_per_key,
    incremental,
    job,
    operator_states,
    referenced,
    rocksdb_env,
    shared_files_of_retained_checkpoints,
    task_state,
)


def base_of_last_trigger(h: Harness) -> int | None:
    return h.gateway.triggered[-1][3].base_checkpoint_id


def acks(h: Harness, files: Files, checkpoint_id: int, a1: tuple[list[str], list[str]]) -> None:
    """A1 acknowledges ``checkpoint_id`` referencing ``a1[0]`` and uploading ``a1[1]``; A2
    references checkpoint 1's ``x``."""
    assert ack(h, A1, checkpoint_id, task_state(incremental(files, checkpoint_id, *a1), A1.vertex_id))
    assert ack(h, A2, checkpoint_id, task_state(incremental(files, checkpoint_id, ["x"]), A2.vertex_id))


def test_the_registry_keeps_a_subsumed_base_until_the_last_checkpoint_naming_it_is_released(
    tmp_path: Path,
) -> None:
    files = Files(str(tmp_path))
    registry = SharedStateRegistry()
    registry.register_checkpoint(1, operator_states(incremental(files, 1, [], ["a", "b"])))
    registry.hold_base(2, 1)
    registry.hold_base(3, 1)
    registry.register_checkpoint(2, operator_states(incremental(files, 2, ["a"], ["c"])))
    assert registry.release_base(2) == []  # completed; 1 is still registered

    assert registry.unregister_checkpoint(1) == []  # subsumed by 2, but 3 may reference b
    assert registry.registered_checkpoints == {2} and registry.deferred_checkpoints == {1}
    assert registry.unregister_checkpoint(1) == []  # twice: nothing either
    # 3's task had not heard that 2 completed: it references b, which only 1 holds
    registry.register_checkpoint(3, operator_states(incremental(files, 3, ["a", "b"], ["d"])))
    assert registry.release_base(3) == []  # everything of 1 is 3's now (a is 2's too)
    assert registry.deferred_checkpoints == set()
    assert registry.unregister_checkpoint(2) == [files["c"]]

    registry.hold_base(4, 3)
    assert registry.unregister_checkpoint(3) == []
    assert registry.release_base(4) == [files["a"], files["b"], files["d"]]  # 4 aborted
    assert registry.references == {} and registry.registered_checkpoints == set()
    assert registry.release_base(4) == [] and registry.release_base(99) == []


def test_every_barrier_names_the_latest_completed_checkpoint_and_savepoints_none(tmp_path: Path) -> None:
    h, files = job(tmp_path, retained=1)
    registry = h.coordinator.shared_state_registry
    complete(h, files, 1, ([], ["a"]), ([], ["x"]))
    assert base_of_last_trigger(h) is None  # nothing completed before it
    assert registry.base_of(1) is None

    h.coordinator.trigger_checkpoint()
    assert base_of_last_trigger(h) == 1 and registry.base_of(2) == 1
    decline(h, A1, 2)
    assert registry.base_of(2) is None  # released with the abort
    h.coordinator.trigger_checkpoint()
    assert base_of_last_trigger(h) == 1  # 2 never completed: 1 is still the latest
    acks(h, files, 3, (["a"], ["b"]))
    assert registry.base_of(3) is None and pending_ids(h) == []

    savepoint = h.coordinator.trigger_savepoint(str(tmp_path / "savepoints"))
    assert base_of_last_trigger(h) is None  # every file of a savepoint is its own
    assert ack(h, A1, 4) and ack(h, A2, 4)
    succeeded(savepoint)
    h.coordinator.trigger_checkpoint()
    assert base_of_last_trigger(h) == 3  # an intermediate savepoint is never a base
    assert [c.checkpoint_id for c in h.store.get_all_checkpoints()] == [3]


def test_a_base_subsumed_while_a_checkpoint_naming_it_is_pending_keeps_its_files(tmp_path: Path) -> None:
    """Two checkpoints pending, both with base 1. 2 completes and subsumes 1; 3's task, which
    has not heard of 2, references b (only 1 holds it). Without the deferral b was deleted
    when 2 completed and checkpoint 3 failed (the job with it, at 0 tolerable failures)."""
    h, files = job(tmp_path, retained=1, max_concurrent=2, tolerable_failures=0)
    complete(h, files, 1, ([], ["a", "b"]), ([], ["x"]))
    second = h.coordinator.trigger_checkpoint()
    third = h.coordinator.trigger_checkpoint()
    assert pending_ids(h) == [2, 3] and [o.base_checkpoint_id for *_, o in h.gateway.triggered[-2:]] == [1, 1]

    acks(h, files, 2, (["a"], ["c"]))
    succeeded(second)
    assert files.on_disk() == {"a", "b", "c", "x"}  # b waits for 3
    assert h.coordinator.shared_state_registry.deferred_checkpoints == {1}

    acks(h, files, 3, (["a", "b"], ["d"]))
    completed = succeeded(third)
    # 3 subsumed 2 (c goes) and released 1, whose files 3 holds now
    assert files.on_disk() == {"a", "b", "d", "x"} == referenced([completed])
    assert h.coordinator.shared_state_registry.registered_checkpoints == {3}
    assert h.coordinator.shared_state_registry.deferred_checkpoints == set()
    assert h.job_failures == []


def test_a_checkpoint_naming_a_subsumed_base_frees_its_files_when_it_aborts(tmp_path: Path) -> None:
    h, files = job(tmp_path, retained=1, max_concurrent=3)
    complete(h, files, 1, ([], ["a", "b"]), ([], ["x"]))
    for _ in range(3):
        h.coordinator.trigger_checkpoint()
    assert pending_ids(h) == [2, 3, 4]
    acks(h, files, 2, (["a"], ["c"]))  # completes, subsumes 1: 3 and 4 may still reference b
    assert pending_ids(h) == [3, 4] and files.on_disk() == {"a", "b", "c", "x"}

    decline(h, A1, 3)
    assert files.on_disk() == {"a", "b", "c", "x"}  # 4 still names 1
    decline(h, A2, 4)
    assert files.on_disk() == {"a", "c", "x"} == referenced(h.store.get_all_checkpoints())
    assert h.coordinator.shared_state_registry.deferred_checkpoints == set()


def test_a_checkpoint_the_store_refuses_releases_its_base(tmp_path: Path) -> None:
    h, files = job(tmp_path, retained=1, max_concurrent=2, store=FailingStore(retained=1, failing=[3]))
    complete(h, files, 1, ([], ["a", "b"]), ([], ["x"]))
    h.coordinator.trigger_checkpoint()
    third = h.coordinator.trigger_checkpoint()
    acks(h, files, 2, (["a"], ["c"]))
    acks(h, files, 3, (["a", "b"], ["d"]))  # refused: its own d goes, and b with 1
    assert third.exception() is not None
    assert files.on_disk() == {"a", "c", "x"} == referenced(h.store.get_all_checkpoints())
    assert h.coordinator.shared_state_registry.registered_checkpoints == {2}
    assert h.coordinator.shared_state_registry.deferred_checkpoints == set()


def test_at_shutdown_a_deferred_base_goes_with_the_pending_checkpoint_naming_it(tmp_path: Path) -> None:
    h, files = job(
        tmp_path,
        retained=1,
        max_concurrent=2,
        retention=ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION,
    )
    complete(h, files, 1, ([], ["a", "b"]), ([], ["x"]))
    h.coordinator.trigger_checkpoint()
    h.coordinator.trigger_checkpoint()
    acks(h, files, 2, (["a"], ["c"]))
    assert files.on_disk() == {"a", "b", "c", "x"}

    h.coordinator.shutdown(JobStatus.CANCELED)

    assert files.on_disk() == {"a", "c", "x"}  # checkpoint 2 is retained, b was only 1's
    assert os.path.isdir(h.storage.checkpoint_dir(2))


def test_in_a_job_on_rocksdb_a_checkpoint_reuses_exactly_files_of_the_one_before(tmp_path: Path) -> None:
    """The base travels from the coordinator through the barriers and the operator chain to
    the RocksDB backend: with one checkpoint pending at a time, each checkpoint's base is the
    one before it, so of the two retained, the newer one references (besides its own uploads)
    only files the older one holds, and it does reuse some."""
    env = rocksdb_env(
        tmp_path, **{"execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"}
    )
    results = count_per_key(env, 10**8, 5_000, 0.00002).execute_and_collect()
    deadline = time.monotonic() + 120
    while not any(int(p.parent.name[4:]) >= 8 for p in (tmp_path / "checkpoints").glob("*/chk-*/_metadata")):
        assert time.monotonic() < deadline, "8 checkpoints did not complete in time"
        time.sleep(0.05)
    results.close()

    (job_dir,) = [p for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()]
    retained, _ = shared_files_of_retained_checkpoints(job_dir)
    older, newer = ({h.backend_id: h for h in incremental_handles(d)} for d in retained)
    assert older.keys() == newer.keys() and len(newer) == 2  # the same two backends
    reused_any = False
    for backend_id, handle in newer.items():
        base = {name: file for name, file in older[backend_id].shared}
        reused = {name: file for name, file in handle.shared if name not in handle.uploaded}
        assert all(base.get(name) == file for name, file in reused.items()), backend_id
        reused_any = reused_any or bool(reused)
    assert reused_any, "no file was reused: the base did not reach the backends"


def incremental_handles(directory: Path) -> list[IncrementalKeyedStateHandle]:
    metadata, _ = load_checkpoint_metadata(str(directory), environment_key())
    return [
        handle
        for state in metadata.operator_states
        for subtask in state.subtask_states.values()
        for handle in subtask.managed_keyed_state
        if isinstance(handle, IncrementalKeyedStateHandle)
    ]
