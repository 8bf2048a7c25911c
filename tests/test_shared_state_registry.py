"""The shared state registry (Flink's ``SharedStateRegistryImpl``): shared files of incremental
snapshots are deleted exactly when no retained checkpoint references them any more.

Real files in a temporary job directory (``shared/<name>`` as the storage lays them out),
real coordinators on manual time; every test names exactly which files exist afterwards.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from chandy import DataStream, StreamExecutionEnvironment
from chandy.checkpoint.completed_checkpoint import (
    CompletedCheckpoint,
    CompletedCheckpointStore,
    restored_checkpoint,
    unclaimed_properties,
)
from chandy.checkpoint.coordinator import CheckpointCoordinator
from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.checkpoint.metadata import CheckpointMetadata
from chandy.checkpoint.operator_state import OperatorState
from chandy.checkpoint.properties import CheckpointProperties
from chandy.checkpoint.shared_state import SharedStateRegistry, UnknownSharedStateError, delete_shared_files
from chandy.config.options import ExternalizedCheckpointRetention
from chandy.messages.checkpoint import CheckpointType
from chandy.messages.status import JobStatus
from chandy.state.handles import ByteStreamStateHandle, FileStateHandle, IncrementalKeyedStateHandle
from chandy.state.key_groups import KeyGroupRange
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import SHARED_DIR, CheckpointStorage
from chandy.storage.snapshot_key import environment_key
from tests.jobs import HoldingSequence, KeyedCounter, Throttle
from tests.test_checkpoint_coordinator import (
    A1,
    A2,
    JOB_ID,
    Harness,
    ack,
    decline,
    make_coordinator,
    make_plan,
    operator_id,
    pending_ids,
    succeeded,
)
from tests.test_checkpoint_coordinator_failures import FailingStore
from tests.test_checkpointing_e2e import (
    cancel_keeping_results,
    checkpointing_env,
    drain,
    latest_checkpoint_dir,
    wait_for_checkpoints,
)
from tests.test_rocksdb_incremental import _checkpoint_id, _files_written_after, _start_kill_job

R = ExternalizedCheckpointRetention
PLAN = make_plan([A1], [A1, A2])
OWN = CheckpointProperties.for_checkpoint(R.NO_EXTERNALIZED_CHECKPOINTS)


# ---------------------------------------------------------------------- building state


def shared_file(directory: str, name: str) -> FileStateHandle:
    """A real shared file ``<directory>/<name>`` (its content names it)."""
    os.makedirs(directory, exist_ok=True)
    data = f"sst {name}".encode() * 8
    path = os.path.join(directory, name)
    with open(path, "wb") as out:
        out.write(data)
    return FileStateHandle(path, len(data), hashlib.sha256(data).hexdigest())


class Files:
    """The shared files of one job directory, created on first use and reused by name (as
    an SST file keeps its name and its handle while later checkpoints reference it)."""

    def __init__(self, job_dir: str, sub: str = SHARED_DIR) -> None:
        self.directory = os.path.join(job_dir, sub)
        self.handles: dict[str, FileStateHandle] = {}

    def __getitem__(self, name: str) -> FileStateHandle:
        if name not in self.handles:
            self.handles[name] = shared_file(self.directory, name)
        return self.handles[name]

    def on_disk(self) -> set[str]:
        return set(os.listdir(self.directory)) if os.path.isdir(self.directory) else set()


def incremental(
    files: Files, checkpoint_id: int, references: Iterable[str], uploads: Iterable[str] = ()
) -> IncrementalKeyedStateHandle:
    """A RocksDB checkpoint that references ``references`` (uploaded earlier) and uploads
    ``uploads`` itself; one private file, inline."""
    uploaded = list(uploads)
    shared = tuple((f"{name}.sst", files[name]) for name in [*references, *uploaded])
    private = (("MANIFEST-000001", ByteStreamStateHandle(f"manifest-{checkpoint_id}", b"manifest")),)
    return IncrementalKeyedStateHandle(
        KeyGroupRange(0, 127),
        "backend-1",
        checkpoint_id,
        shared,
        private,
        frozenset(f"{name}.sst" for name in uploaded),
        (("count", "value"),),
    )


def task_state(handle: IncrementalKeyedStateHandle, vertex: int) -> TaskStateSnapshot:
    return TaskStateSnapshot({operator_id(vertex): OperatorSubtaskState((handle,))})


def operator_states(*handles: IncrementalKeyedStateHandle) -> list[OperatorState]:
    state = OperatorState("keyed", len(handles), 128)
    for index, handle in enumerate(handles):
        state.put_state(index, OperatorSubtaskState((handle,)))
    return [state]


def complete(
    h: Harness,
    files: Files,
    checkpoint_id: int,
    a1: tuple[Iterable[str], Iterable[str]],
    a2: tuple[Iterable[str], Iterable[str]] = ((), ()),
) -> CompletedCheckpoint:
    """Trigger checkpoint ``checkpoint_id``; A1 and A2 acknowledge with incremental state
    (``(references, uploads)`` each)."""
    future = h.coordinator.trigger_checkpoint()
    assert pending_ids(h) == [checkpoint_id]
    assert ack(h, A1, checkpoint_id, task_state(incremental(files, checkpoint_id, *a1), A1.vertex_id))
    assert ack(h, A2, checkpoint_id, task_state(incremental(files, checkpoint_id, *a2), A2.vertex_id))
    return succeeded(future)


def referenced(checkpoints: Iterable[CompletedCheckpoint]) -> set[str]:
    return {
        os.path.basename(handle.path)
        for checkpoint in checkpoints
        for state in checkpoint.operator_states.values()
        for subtask in state.subtask_states.values()
        for handle in subtask.shared_handles()
        if isinstance(handle, FileStateHandle)
    }


def job(tmp_path: Path, retained: int, **kwargs: object) -> tuple[Harness, Files]:
    h = make_coordinator(PLAN, tmp_path=tmp_path, retained=retained, **kwargs)  # type: ignore[arg-type]
    return h, Files(h.storage.job_dir)


# ---------------------------------------------------------------------- the registry alone


def test_reference_sets_over_overlapping_checkpoints_free_exactly_the_unused_files(tmp_path: Path) -> None:
    files = Files(str(tmp_path))
    registry = SharedStateRegistry()
    registry.register_checkpoint(1, operator_states(incremental(files, 1, [], ["a", "b"])))
    registry.register_checkpoint(2, operator_states(incremental(files, 2, ["a"], ["c"])))
    registry.register_checkpoint(3, operator_states(incremental(files, 3, ["a", "c"], ["d"])))
    assert {os.path.basename(p): holders for p, holders in registry.references.items()} == {
        "a": {1, 2, 3},
        "b": {1},
        "c": {2, 3},
        "d": {3},
    }

    assert registry.unregister_checkpoint(1) == [files["b"]]  # a is still held by 2 and 3
    assert registry.unregister_checkpoint(1) == []  # twice: nothing more
    assert registry.unregister_checkpoint(3) == [files["d"]]
    assert registry.unregister_checkpoint(2) == [files["a"], files["c"]]  # sorted by path
    assert registry.references == {}
    assert registry.registered_checkpoints == set()
    assert registry.unregister_checkpoint(99) == []  # never registered


def test_a_checkpoint_registered_twice_counts_once(tmp_path: Path) -> None:
    files = Files(str(tmp_path))
    registry = SharedStateRegistry()
    states = operator_states(incremental(files, 1, [], ["a"]), incremental(files, 1, [], ["b"]))
    registry.register_checkpoint(1, states)
    registry.register_checkpoint(1, states)
    assert registry.registered_checkpoints == {1}
    assert registry.unregister_checkpoint(1) == [files["a"], files["b"]]


def test_a_reference_to_a_file_no_checkpoint_holds_registers_nothing(tmp_path: Path) -> None:
    """A checkpoint may reference only files a registered checkpoint holds or that it uploaded
    itself: anything else was deleted (or is about to be), and the checkpoint is refused whole."""
    files = Files(str(tmp_path))
    registry = SharedStateRegistry()
    registry.register_checkpoint(1, operator_states(incremental(files, 1, [], ["a"])))
    assert registry.unregister_checkpoint(1) == [files["a"]]

    with pytest.raises(UnknownSharedStateError, match=r"checkpoint 2 references 1 shared state file.*/a\b"):
        registry.register_checkpoint(2, operator_states(incremental(files, 2, ["a"], ["b"])))
    assert registry.registered_checkpoints == set()
    assert registry.references == {}

    # a restored checkpoint's files were uploaded by checkpoints this registry never saw
    registry.register_checkpoint(2, operator_states(incremental(files, 2, ["a"], ["b"])), restored=True)
    assert registry.unregister_checkpoint(2) == [files["a"], files["b"]]


def test_inline_shared_handles_are_not_counted() -> None:
    """In-memory storage inlines every file: nothing to count, nothing to delete."""
    inline = ByteStreamStateHandle("x", b"sst bytes")
    handle = IncrementalKeyedStateHandle(KeyGroupRange(0, 9), "b", 1, (("1.sst", inline),), (), frozenset())
    registry = SharedStateRegistry()
    registry.register_checkpoint(1, operator_states(handle))
    registry.register_checkpoint(
        2,
        operator_states(
            IncrementalKeyedStateHandle(KeyGroupRange(0, 9), "b", 2, (("1.sst", inline),), (), frozenset())
        ),
    )
    assert registry.references == {}
    assert registry.unregister_checkpoint(1) == []


def test_deleting_is_best_effort_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = Files(str(tmp_path))
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    undeletable = FileStateHandle(str(blocker / "x"), 1, "0" * 64)  # its parent is a file
    with caplog.at_level(logging.INFO, logger="chandy.checkpoint.shared_state"):
        delete_shared_files([files["a"], undeletable, files["b"]], JOB_ID, "test", {str(tmp_path)})
    assert files.on_disk() == set()
    assert f"Could not delete shared state file {undeletable.path}" in caplog.text
    assert "Deleted 2 shared state file(s)" in caplog.text and "1 could not be deleted" in caplog.text


# ---------------------------------------------------------------------- the coordinator


def test_subsuming_deletes_exactly_the_files_no_retained_checkpoint_references(tmp_path: Path) -> None:
    h, files = job(tmp_path, retained=2)
    expected_on_disk = [
        # (checkpoint, A1 (references, uploads), A2 (references, uploads)) -> files after it
        (1, ([], ["a", "b"]), ([], ["x"]), {"a", "b", "x"}),
        (2, (["a"], ["c"]), (["x"], []), {"a", "b", "c", "x"}),
        # 3 subsumes 1: b (only 1 had it) goes; a (2 has it) and x (2, 3) stay
        (3, (["c"], ["d"]), (["x"], ["y"]), {"a", "c", "d", "x", "y"}),
        # 4 subsumes 2: a goes; c (3 and 4) stays; x (3) stays
        (4, (["c", "d"], []), (["y"], []), {"c", "d", "x", "y"}),
        # 5 subsumes 3: x (3 alone) goes; c, d, y are in 4 and 5
        (5, (["c", "d"], ["e"]), (["y"], []), {"c", "d", "e", "y"}),
    ]
    for checkpoint_id, a1, a2, after in expected_on_disk:
        complete(h, files, checkpoint_id, a1, a2)
        retained = h.store.get_all_checkpoints()
        assert files.on_disk() == after, checkpoint_id
        assert referenced(retained) == after, checkpoint_id  # no orphan, nothing missing
        assert h.coordinator.shared_state_registry.registered_checkpoints == {
            c.checkpoint_id for c in retained
        }
    assert [c.checkpoint_id for c in h.store.get_all_checkpoints()] == [4, 5]


def test_an_aborted_checkpoint_deletes_only_what_it_uploaded(tmp_path: Path) -> None:
    h, files = job(tmp_path, retained=1)
    complete(h, files, 1, ([], ["a", "b"]))
    h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 2, task_state(incremental(files, 2, ["a", "b"], ["c"]), A1.vertex_id))

    decline(h, A2, 2)

    assert pending_ids(h) == []
    assert files.on_disk() == {"a", "b"}  # c was 2's own; a and b belong to checkpoint 1
    assert h.coordinator.shared_state_registry.registered_checkpoints == {1}
    # a late acknowledgement of the aborted checkpoint: its own uploads go, nothing else
    assert not ack(h, A2, 2, task_state(incremental(files, 2, ["a"], ["z"]), A2.vertex_id))
    assert files.on_disk() == {"a", "b"}


def test_a_checkpoint_referencing_a_deleted_file_fails_instead_of_completing(tmp_path: Path) -> None:
    """A task that had not heard of checkpoint 2 yet reuses checkpoint 1's files, which 2
    subsumed: the checkpoint fails (it could never be restored), its own uploads go."""
    h, files = job(tmp_path, retained=1)
    complete(h, files, 1, ([], ["a"]))
    complete(h, files, 2, ([], ["b"]))
    assert files.on_disk() == {"b"}

    future = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 3, task_state(incremental(files, 3, ["a"], ["c"]), A1.vertex_id))
    assert ack(h, A2, 3, task_state(incremental(files, 3, [], []), A2.vertex_id))

    error = future.exception()
    assert error is not None and "no retained checkpoint holds" in str(error)
    assert [c.checkpoint_id for c in h.store.get_all_checkpoints()] == [2]
    assert not os.path.exists(h.storage.checkpoint_dir(3))
    assert files.on_disk() == {"b"}  # c (3's own upload) is gone; a was gone before
    assert h.coordinator.shared_state_registry.registered_checkpoints == {2}


def test_a_checkpoint_the_store_refuses_takes_its_uploads_with_it(tmp_path: Path) -> None:
    store = FailingStore(retained=1, failing=[2])
    h, files = job(tmp_path, retained=1, store=store)
    complete(h, files, 1, ([], ["a", "b"]))
    future = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 2, task_state(incremental(files, 2, ["a"], ["c"]), A1.vertex_id))
    assert ack(h, A2, 2, task_state(incremental(files, 2, ["b"], ["d"]), A2.vertex_id))

    assert future.exception() is not None
    assert files.on_disk() == {"a", "b"}  # checkpoint 1 is whole; c and d were 2's own
    assert h.coordinator.shared_state_registry.registered_checkpoints == {1}


def test_savepoints_are_never_registered(tmp_path: Path) -> None:
    """A savepoint's files are its own (in its directory): checkpoints subsuming everything
    around it never touch them, and it holds nothing in shared/ alive."""
    h, files = job(tmp_path, retained=1)
    complete(h, files, 1, ([], ["a"]))
    savepoint = h.coordinator.trigger_savepoint(str(tmp_path / "savepoints"))
    (name,) = os.listdir(tmp_path / "savepoints")
    location = str(tmp_path / "savepoints" / name)
    own = Files(location, "")
    for attempt in (A1, A2):  # a NATIVE savepoint: every file copied into its directory
        handle = IncrementalKeyedStateHandle(
            KeyGroupRange(0, 127),
            "backend-1",
            2,
            (),
            (("1.sst", own[f"sp-{attempt.vertex_id}"]),),
            frozenset(),
        )
        assert ack(h, attempt, 2, task_state(handle, attempt.vertex_id))
    completed = succeeded(savepoint)
    assert h.coordinator.shared_state_registry.registered_checkpoints == {1}

    complete(h, files, 3, ([], ["b"]))
    complete(h, files, 4, (["b"], []))

    assert files.on_disk() == {"b"}
    assert own.on_disk() >= {"sp-1", "sp-2"}
    assert completed.external_pointer == location


@pytest.mark.parametrize(
    ("status", "retention", "kept"),
    [
        (JobStatus.FINISHED, R.NO_EXTERNALIZED_CHECKPOINTS, False),
        (JobStatus.CANCELED, R.DELETE_ON_CANCELLATION, False),
        (JobStatus.CANCELED, R.RETAIN_ON_CANCELLATION, True),
        (JobStatus.FAILED, R.DELETE_ON_CANCELLATION, True),
    ],
)
def test_at_the_job_end_discarded_checkpoints_take_their_shared_files_retained_ones_keep_them(
    tmp_path: Path, status: JobStatus, retention: ExternalizedCheckpointRetention, kept: bool
) -> None:
    h, files = job(tmp_path, retained=2, retention=retention)
    complete(h, files, 1, ([], ["a", "b"]))
    complete(h, files, 2, (["a"], ["c"]))
    complete(h, files, 3, (["a", "c"], []))  # subsumes 1: b goes
    assert files.on_disk() == {"a", "c"}

    h.coordinator.shutdown(status)

    if kept:
        assert files.on_disk() == {"a", "c"}
        assert os.path.isdir(h.storage.checkpoint_dir(3))
    else:
        assert files.on_disk() == set()
        assert not os.path.exists(h.storage.job_dir)  # nothing left: the job directory goes too


@pytest.mark.parametrize(
    ("status", "left"),
    [(JobStatus.CANCELED, {"a", "b", "c"}), (JobStatus.FINISHED, None)],
    ids=["kept", "discarded"],
)
def test_at_the_job_end_files_no_checkpoint_ever_referenced_are_swept(
    tmp_path: Path, status: JobStatus, left: set[str] | None
) -> None:
    """An upload whose task was killed half-way (a SIGKILLed slot process or driver) was never
    acknowledged, so the registry never saw it: once the job has ended it is garbage."""
    h, files = job(tmp_path, retained=2, retention=R.RETAIN_ON_CANCELLATION)
    complete(h, files, 1, ([], ["a", "b"]))
    complete(h, files, 2, (["a"], ["c"]))
    shared_file(files.directory, "killed-upload")  # in shared/, referenced by nothing

    h.coordinator.shutdown(status)

    if left is None:
        assert not os.path.exists(h.storage.job_dir)
    else:
        assert files.on_disk() == left


def test_nothing_is_swept_while_an_unknown_checkpoint_may_reference_it(tmp_path: Path) -> None:
    """A ``chk-N`` the coordinator does not hold (unreadable, or left by a failed deletion)
    may reference any file in shared/: then only the registry's own deletions happen."""
    h, files = job(tmp_path, retained=1, retention=R.RETAIN_ON_CANCELLATION)
    complete(h, files, 1, ([], ["a"]))
    complete(h, files, 2, ([], ["b"]))  # subsumes 1: a goes
    os.makedirs(h.storage.checkpoint_dir(0))  # below this run's ids: not this run's to delete
    shared_file(files.directory, "unknown")

    h.coordinator.shutdown(JobStatus.CANCELED)

    assert files.on_disk() == {"b", "unknown"}


# ---------------------------------------------------------------------- restored checkpoints


def restored(
    h: Harness, files: Files, checkpoint_id: int, names: list[str], props: CheckpointProperties
) -> CompletedCheckpoint:
    """A retained checkpoint on disk (another run's) as the job takes it over."""
    metadata = CheckpointMetadata(
        checkpoint_id, JOB_ID, 1_000, "CHECKPOINT", operator_states(incremental(files, checkpoint_id, names))
    )
    return restored_checkpoint(metadata, str(h.storage.job_dir) + f"/old-chk-{checkpoint_id}", props)


def restore(coordinator: CheckpointCoordinator, checkpoints: list[CompletedCheckpoint]) -> None:
    latest = checkpoints[-1]
    coordinator.restore_from(
        latest.checkpoint_id,
        [],
        is_savepoint=False,
        external_pointer=latest.external_pointer,
        restored=checkpoints,
    )


def test_a_no_claim_restore_is_never_registered_so_its_files_are_never_deleted(tmp_path: Path) -> None:
    h, files = job(tmp_path, retained=1)
    old = restored(h, files, 7, ["r1", "r2"], unclaimed_properties(CheckpointType.CHECKPOINT))
    restore(h.coordinator, [old])
    assert h.coordinator.shared_state_registry.registered_checkpoints == set()

    complete(h, files, 8, ([], ["a"]))  # the first checkpoint after a restore uploads anew
    complete(h, files, 9, (["a"], []))
    h.coordinator.shutdown(JobStatus.FINISHED)

    assert files.on_disk() == {"r1", "r2"}


def test_a_claimed_restore_is_registered_and_its_files_go_once_unused(tmp_path: Path) -> None:
    h, files = job(tmp_path, retained=1)
    old = restored(h, files, 7, ["r1", "r2"], OWN)
    restore(h.coordinator, [old])
    assert h.coordinator.shared_state_registry.registered_checkpoints == {7}

    complete(h, files, 8, ([], ["a"]))

    assert files.on_disk() == {"a"}


def test_a_driver_restarts_own_checkpoints_are_registered(tmp_path: Path) -> None:
    """Retained checkpoints 5 and 6 of the previous run share r2; a store of 2 keeps both,
    then the new run's checkpoints subsume them one by one."""
    h, files = job(tmp_path, retained=2)
    own = [restored(h, files, 5, ["r1", "r2"], OWN), restored(h, files, 6, ["r2", "r3"], OWN)]
    restore(h.coordinator, own)
    assert h.coordinator.shared_state_registry.registered_checkpoints == {5, 6}

    complete(h, files, 7, ([], ["a"]))  # subsumes 5: r1 goes, r2 stays (6)
    assert files.on_disk() == {"r2", "r3", "a"}
    complete(h, files, 8, (["a"], []))  # subsumes 6
    assert files.on_disk() == {"a"}


def test_restoring_more_checkpoints_than_retained_subsumes_the_oldest_at_once(tmp_path: Path) -> None:
    h, files = job(tmp_path, retained=1)
    own = [restored(h, files, 5, ["r1", "r2"], OWN), restored(h, files, 6, ["r2", "r3"], OWN)]
    restore(h.coordinator, own)
    assert files.on_disk() == {"r2", "r3"}
    assert h.coordinator.shared_state_registry.registered_checkpoints == {6}


# ---------------------------------------------------------------------- a real job on RocksDB


def shared_files_of_retained_checkpoints(job_dir: Path) -> tuple[list[Path], set[str]]:
    """The retained checkpoints (complete ``chk-N``) and every shared file their ``_metadata``
    references (read as a restore reads it)."""
    retained = sorted(
        (p for p in job_dir.glob("chk-*") if (p / "_metadata").exists()), key=lambda p: int(p.name[4:])
    )
    referenced: set[str] = set()
    for directory in retained:
        # loading also checks that every file exists
        metadata, _ = load_checkpoint_metadata(str(directory), environment_key())
        for state in metadata.operator_states:
            for subtask in state.subtask_states.values():
                referenced.update(h.path for h in subtask.shared_handles() if isinstance(h, FileStateHandle))
    return retained, referenced


def rocksdb_env(tmp_path: Path, **config: Any) -> StreamExecutionEnvironment:
    """Two subtasks on RocksDB with incremental checkpoints every 20 ms, two retained."""
    return checkpointing_env(
        parallelism=2,
        interval_ms=20,
        **{
            "state.backend.type": "rocksdb",
            "execution.checkpointing.incremental": True,
            "execution.checkpointing.dir": str(tmp_path / "checkpoints"),
            "execution.checkpointing.num-retained": 2,
            "state.backend.rocksdb.localdir": str(tmp_path / "rocksdb"),
            **config,
        },
    )


def count_per_key(
    env: StreamExecutionEnvironment, records: int, keys: int, delay_s: float, hold_after: int | None = None
) -> DataStream:
    """A keyed count over ``keys`` keys, paced so that many checkpoints fall into it; with
    ``hold_after``, each source subtask stops there until cancelled (:class:`HoldingSequence`)."""
    source = HoldingSequence(0, records - 1, hold_after)
    paced = env.from_source(source, source_name="numbers").map(Throttle(delay_s))
    return paced.key_by(lambda x: x % keys).process(KeyedCounter(records // keys))


@pytest.mark.slow
def test_a_job_on_rocksdb_leaves_no_orphan_in_shared_and_deletes_nothing_referenced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Many incremental checkpoints, two retained: RocksDB's compactions replace SST files, so
    files go out of use all the time. After the job is cancelled (its checkpoints retained),
    ``shared/`` holds exactly the files the two retained checkpoints reference."""
    env = rocksdb_env(
        tmp_path, **{"execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"}
    )
    results = count_per_key(env, 10**8, 5_000, 0.00002).execute_and_collect()
    with caplog.at_level(logging.INFO, logger="chandy.checkpoint.shared_state"):
        deadline = time.monotonic() + 120
        while not any(
            int(p.parent.name[4:]) >= 30 for p in (tmp_path / "checkpoints").glob("*/chk-*/_metadata")
        ):
            assert time.monotonic() < deadline, "30 checkpoints did not complete in time"
            time.sleep(0.05)
        results.close()

    (job_dir,) = [p for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()]
    retained, referenced = shared_files_of_retained_checkpoints(job_dir)
    assert len(retained) == 2
    on_disk = {str(p) for p in (job_dir / "shared").iterdir()}
    assert referenced, "the retained checkpoints hold no shared file: not an incremental RocksDB job"
    assert on_disk == referenced  # no orphan, and nothing referenced was deleted
    # compactions made files unused: they went as checkpoints were subsumed, not only at the end
    assert "shared state file(s) of job" in caplog.text and "was subsumed" in caplog.text
    assert "Could not delete" not in caplog.text


@pytest.mark.slow
def test_a_finished_job_on_rocksdb_leaves_no_shared_file(tmp_path: Path) -> None:
    """Retention keeps nothing of a finished job: its checkpoints, their shared files and the
    job directory go."""
    env = rocksdb_env(tmp_path)
    count_per_key(env, 30_000, 500, 0.00005).add_sink(lambda value: None)
    assert env.execute("finished on rocksdb").job_id
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_a_job_directory_moved_whole_restores_its_incremental_checkpoint(tmp_path: Path) -> None:
    """``_metadata`` stores shared files relative to the job directory: after the whole job
    directory is moved (``shared/`` with it), its retained checkpoint restores exactly once."""
    n, keys = 20_000, 20
    env = rocksdb_env(
        tmp_path, **{"execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"}
    )
    # each source subtask stops half-way: still running when it is cancelled (no key complete)
    results = count_per_key(env, n, keys, 0.0, hold_after=n // 4).execute_and_collect("first run")
    first, reader = drain(results)
    wait_for_checkpoints(tmp_path / "checkpoints", 2)
    cancel_keeping_results(results, reader)
    retained = latest_checkpoint_dir(tmp_path / "checkpoints")
    assert shared_files_of_retained_checkpoints(retained.parent)[1]  # it references shared files
    moved = tmp_path / "archive" / "moved-job"
    moved.parent.mkdir()
    retained.parent.rename(moved)

    again = checkpointing_env(parallelism=3, interval_ms=100, **{"state.backend.type": "rocksdb"})
    again.set_restore_path(str(moved / retained.name))
    second = count_per_key(again, n, keys, 0.0).execute_and_collect("second run", limit=10**6)

    assert sorted(first + list(second)) == [(k, n // keys) for k in range(keys)]


def test_nothing_is_swept_where_jobs_share_one_directory(tmp_path: Path) -> None:
    """With ``create-subdir: false`` every job writes into the same ``shared/``: another one
    may be uploading there right now."""
    storage = CheckpointStorage(str(tmp_path), JOB_ID, create_subdir=False)
    h, files = job(tmp_path, retained=1, storage=storage)
    complete(h, files, 1, ([], ["a"]))
    shared_file(files.directory, "another-jobs-upload")

    h.coordinator.shutdown(JobStatus.FINISHED)

    assert files.on_disk() == {"another-jobs-upload"}  # a went with its checkpoint


def reap(process: subprocess.Popen[str]) -> None:
    """Kill (if still alive) and wait for a driver whose output nobody reads to its end."""
    process.kill()
    process.wait(30)
    if process.stdout is not None:
        process.stdout.close()


@pytest.mark.slow
def test_uploads_of_a_killed_driver_are_tidied_when_its_job_ends_after_a_restart(tmp_path: Path) -> None:
    """The driver is SIGKILLed while an SST file is being uploaded into shared/ (files no
    checkpoint will ever reference); the job, submitted again under its id, adopts its
    checkpoints, finishes, and leaves nothing: its checkpoints, their shared files, the
    killed upload's files and the job directory all go."""
    job_id = uuid.uuid4().hex
    job_dir = tmp_path / "checkpoints" / job_id
    first = _start_kill_job(tmp_path, job_id, "first.log")
    try:
        deadline = time.monotonic() + 240
        while first.poll() is None and time.monotonic() < deadline:
            latest = max(job_dir.glob("chk-*/_metadata"), key=_checkpoint_id, default=None)
            try:
                if latest is not None and _checkpoint_id(latest) >= 3:
                    if _files_written_after(job_dir / SHARED_DIR, latest.stat().st_mtime_ns):
                        first.send_signal(signal.SIGKILL)
                        break
            except FileNotFoundError:  # subsumed meanwhile
                pass
            time.sleep(0.001)
    finally:
        reap(first)
    retained, referenced = shared_files_of_retained_checkpoints(job_dir)
    orphans = {str(p) for p in (job_dir / SHARED_DIR).iterdir()} - referenced
    assert retained and orphans, "the kill came at no upload: nothing was tested"

    (tmp_path / "gate").touch()
    second = _start_kill_job(tmp_path, job_id, "second.log")
    second.communicate(timeout=600)
    log = (tmp_path / "second.log").read_text()
    assert second.returncode == 0, log[-8000:]
    assert "no checkpoint referenced them (uploads that never completed)" in log
    assert not job_dir.exists(), sorted(str(p) for p in job_dir.rglob("*"))


class SlowToDeleteStorage(CheckpointStorage):
    """Checkpoint storage whose deletion of a ``chk-N`` waits until the test lets it go."""

    def __init__(self, base: str) -> None:
        super().__init__(base, JOB_ID)
        self.deleting = threading.Event()
        self.go = threading.Event()

    def discard_checkpoint(self, checkpoint_id: int, target_location: str | None = None) -> None:
        self.deleting.set()
        assert self.go.wait(30)
        super().discard_checkpoint(checkpoint_id, target_location)


def test_a_subsumed_checkpoints_shared_files_go_only_after_its_directory(tmp_path: Path) -> None:
    """On a pool of two I/O threads the shared files of a subsumed checkpoint went beside its
    chk-N: a crash in between left a chk-N whose _metadata names deleted files, which a driver
    restart finds broken and keeps for good. They go after it now."""
    pool = ThreadPoolExecutor(2)
    try:
        storage = SlowToDeleteStorage(str(tmp_path))
        h = make_coordinator(
            PLAN, tmp_path=tmp_path, storage=storage, store=CompletedCheckpointStore(1, pool.submit)
        )
        h.coordinator._io = pool.submit
        files = Files(storage.job_dir)
        complete(h, files, 1, ([], ["a"]))
        complete(h, files, 2, ([], ["b"]))  # subsumes 1, whose "a" nothing references
        assert storage.deleting.wait(10)
        time.sleep(0.2)  # the other I/O thread would have deleted "a" by now
        assert files.on_disk() == {"a", "b"}
        storage.go.set()
        deadline = time.monotonic() + 10
        while files.on_disk() != {"b"} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert files.on_disk() == {"b"}
        assert not os.path.exists(storage.checkpoint_dir(1))
    finally:
        pool.shutdown(wait=True)
