"""Savepoints: the coordinator's savepoint paths on manual time, then whole jobs.

Unit tests drive :meth:`CheckpointCoordinator.trigger_savepoint` with the manual clock,
timer and recording gateway of ``test_checkpoint_coordinator``; state files are real
files written where a task writes them (the barrier's ``target_location``), so "the
savepoint is self-contained", "its partial directory is deleted" and "it is never
deleted" are checked on disk. The job tests take savepoints of running jobs, move them
and restore them, with exact results through a two-phase-commit FileSink.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.checkpoint.properties import CheckpointProperties
from chandy.config.options import SavepointFormatType
from chandy.connectors.data_generator import DataGeneratorSource
from chandy.connectors.file_sink import Encoder, FileSink
from chandy.core.functions import KeyedProcessFunction, MapFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.errors import ConfigurationError, JobCancelledError
from chandy.messages.checkpoint import CheckpointOptions, CheckpointType
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.status import JobStatus
from chandy.state.handles import (
    FileStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
    OperatorStateMeta,
)
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import METADATA_FILE_NAME, CheckpointStorage, read_verified
from chandy.storage.snapshot_key import environment_key
from tests.state_backends import on_rocksdb_too
from tests.test_checkpoint_coordinator import (
    FlakyIDCounter,
    Harness,
    R,
    ack,
    decline,
    failure_reason,
    file_state,
    make_coordinator,
    make_plan,
    operator_id,
    pending_ids,
    succeeded,
)

A1, A2 = ExecutionAttemptID(1, 0, 0), ExecutionAttemptID(2, 0, 0)
SAVEPOINT_NAME = re.compile(r"savepoint-0f1e2d-[0-9a-f]{12}$")


# ---------------------------------------------------------------------- unit: the coordinator


def triggered_options(h: Harness, checkpoint_id: int) -> CheckpointOptions:
    return next(o for _, cid, _, o in h.gateway.triggered if cid == checkpoint_id)


def savepoint_state(h: Harness, checkpoint_id: int, attempt_id: ExecutionAttemptID) -> TaskStateSnapshot:
    """A subtask's state file written where a task writes it: into the savepoint's directory."""
    location = triggered_options(h, checkpoint_id).target_location
    assert location is not None
    size = h.storage.inline_threshold + 1
    data = (f"sp-{checkpoint_id} {attempt_id};".encode() * size)[:size]
    handle = h.storage.write_state(checkpoint_id, data, location)
    assert isinstance(handle, FileStateHandle)
    meta = OperatorStateMeta(OperatorStateDistributionMode.SPLIT_DISTRIBUTE, ((0, size),))
    subtask = OperatorSubtaskState((), (OperatorStateHandle({"offsets": meta}, handle),))
    return TaskStateSnapshot({operator_id(attempt_id.vertex_id): subtask})


def metadata_body(directory: str) -> dict[str, Any]:
    data = Path(directory, METADATA_FILE_NAME).read_bytes()
    length = struct.unpack_from(">Q", data, 12)[0]
    body: dict[str, Any] = json.loads(data[20 : 20 + length])
    return body


def file_paths_in(body: dict[str, Any]) -> list[str]:
    out = []
    for op in body["operators"]:
        for subtask in op["subtasks"].values():
            for handle in subtask["keyed"] + subtask["operator"]:
                if handle["delegate"]["type"] == "file":
                    out.append(handle["delegate"]["path"])
    return out


def test_a_savepoint_is_one_self_contained_directory_with_relative_paths(tmp_path: Path) -> None:
    h = make_coordinator(make_plan([A1], [A1, A2]), tmp_path=tmp_path / "checkpoints")
    future = h.coordinator.trigger_savepoint(str(tmp_path / "savepoints"), SavepointFormatType.NATIVE)

    options = triggered_options(h, 1)
    assert options.checkpoint_type is CheckpointType.SAVEPOINT and not options.drain
    assert options.format_type == "NATIVE"
    location = options.target_location
    assert location is not None and SAVEPOINT_NAME.search(location)
    assert Path(location).parent == tmp_path / "savepoints" and Path(location).is_dir()
    states = [savepoint_state(h, 1, A1), savepoint_state(h, 1, A2)]
    assert ack(h, A1, 1, states[0]) and ack(h, A2, 1, states[1])

    completed = succeeded(future)
    assert completed.external_pointer == location and completed.props.is_savepoint
    # every file is inside it, referenced relative to it; nothing went to chk-N
    names = sorted(Path(f.path).name for s in states for f in s.file_handles())
    assert sorted(os.listdir(location)) == sorted([METADATA_FILE_NAME, *names])
    body = metadata_body(location)
    assert body["checkpoint_type"] == "SAVEPOINT" and body["savepoint_format"] == "NATIVE"
    assert sorted(file_paths_in(body)) == names
    assert not list((tmp_path / "checkpoints").rglob("chk-*"))
    # an intermediate savepoint is not for failover and commits nothing (Flink 1.15)
    assert h.store.get_latest_checkpoint() is None
    assert h.coordinator.latest_completed_checkpoint_id == -1
    assert h.gateway.completed == []
    stats = h.coordinator.stats.to_json()
    latest = stats["latest"]["savepoint"]
    assert latest["external_path"] == location and latest["is_savepoint"] is True
    assert latest["checkpoint_type"] == "SAVEPOINT" and latest["savepointFormat"] == "NATIVE"
    assert stats["latest"]["completed"] is None


def test_a_moved_savepoint_restores_from_its_new_place(tmp_path: Path) -> None:
    h = make_coordinator(make_plan([A1], [A1]), tmp_path=tmp_path / "checkpoints")
    future = h.coordinator.trigger_savepoint(str(tmp_path / "savepoints"))
    state = savepoint_state(h, 1, A1)
    assert ack(h, A1, 1, state)
    location = succeeded(future).external_pointer
    assert location is not None

    moved = tmp_path / "elsewhere" / "kept"
    shutil.move(location, moved)
    metadata, directory = load_checkpoint_metadata(str(moved), environment_key())

    assert directory == str(moved) and metadata.checkpoint_type == "SAVEPOINT"
    handles = [
        h for op in metadata.operator_states for s in op.subtask_states.values() for h in s.stream_handles()
    ]
    assert handles and all(isinstance(x, FileStateHandle) and x.path.startswith(str(moved)) for x in handles)
    original = state.file_handles()[0]
    moved_handle = handles[0]
    assert isinstance(moved_handle, FileStateHandle)
    assert read_verified(moved_handle) == Path(moved, Path(original.path).name).read_bytes()


def test_a_failed_savepoint_leaves_no_directory_and_is_not_counted_against_the_job(tmp_path: Path) -> None:
    h = make_coordinator(make_plan([A1], [A1, A2]), tmp_path=tmp_path / "checkpoints", tolerable_failures=0)
    future = h.coordinator.trigger_savepoint(str(tmp_path / "savepoints"))
    location = triggered_options(h, 1).target_location
    assert location is not None
    written = savepoint_state(h, 1, A1)
    assert ack(h, A1, 1, written)

    decline(h, A2, 1)

    assert failure_reason(future) is R.CHECKPOINT_DECLINED
    assert not os.path.exists(location)  # a failed savepoint is no savepoint: its files go
    assert h.job_failures == []  # with zero tolerable failures a checkpoint's decline would fail the job
    assert h.coordinator.failure_manager.continuous_failure_counter == 0
    # a task that was still writing when it failed brings a file back; the end of the job tidies it
    late = savepoint_state_at(h.storage, location)
    h.coordinator.shutdown(JobStatus.FINISHED)
    assert not os.path.exists(late) and not os.path.exists(location)
    assert os.listdir(tmp_path / "savepoints") == []


def savepoint_state_at(storage: CheckpointStorage, location: str) -> str:
    os.makedirs(location, exist_ok=True)
    handle = storage.write_state(1, b"x" * (storage.inline_threshold + 1), location)
    assert isinstance(handle, FileStateHandle)
    return handle.path


def test_a_savepoint_directory_that_cannot_be_created_fails_before_any_task_is_asked(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("in the way")
    h = make_coordinator(make_plan([A1], [A1]), tmp_path=tmp_path / "checkpoints")

    future = h.coordinator.trigger_savepoint(str(tmp_path / "a-file" / "savepoints"))

    assert failure_reason(future) is R.IO_EXCEPTION
    assert "a-file/savepoints" in str(future.exception()) and "choose a directory" in str(future.exception())
    assert h.gateway.triggered == [] and pending_ids(h) == []


def test_a_savepoint_whose_id_cannot_be_drawn_leaves_no_directory(tmp_path: Path) -> None:
    h = make_coordinator(
        make_plan([A1], [A1]), tmp_path=tmp_path / "checkpoints", id_counter=FlakyIDCounter([1])
    )

    future = h.coordinator.trigger_savepoint(str(tmp_path / "savepoints"))

    assert failure_reason(future) is R.TRIGGER_CHECKPOINT_FAILURE
    assert os.listdir(tmp_path / "savepoints") == [] and h.gateway.triggered == []


def test_the_synchronous_savepoint_stops_the_scheduler_is_stored_and_confirmed(tmp_path: Path) -> None:
    h = make_coordinator(make_plan([A1], [A1]), tmp_path=tmp_path / "checkpoints", interval_ms=100)
    h.coordinator.start_checkpoint_scheduler()
    h.tick()
    assert ack(h, A1, 1, file_state(h.storage, 1, A1))

    future = h.coordinator.trigger_savepoint(str(tmp_path / "savepoints"), synchronous=True, drain=True)

    options = triggered_options(h, 2)
    assert options.checkpoint_type is CheckpointType.SYNC_SAVEPOINT and options.drain
    assert not h.coordinator.is_periodic_checkpointing_started
    h.ticks(5)
    assert pending_ids(h) == [2]  # no periodic checkpoint after the stop's savepoint
    assert ack(h, A1, 2, savepoint_state(h, 2, A1))
    completed = succeeded(future)
    # the stop's savepoint commits (the sinks finish on it) and is what a failover restores
    assert h.gateway.completed_ids(A1) == [1, 2]
    assert h.store.get_latest_checkpoint() is completed
    assert metadata_body(str(completed.external_pointer))["checkpoint_type"] == "SYNC_SAVEPOINT"
    # ... yet it stays the user's: neither subsuming it nor the job's end deletes it
    h.coordinator.restart_checkpoint_scheduler_if_configured()
    h.tick()
    assert ack(h, A1, 3, file_state(h.storage, 3, A1))
    assert h.store.get_latest_checkpoint() is not completed
    h.coordinator.shutdown(JobStatus.FINISHED)
    assert os.path.isfile(os.path.join(str(completed.external_pointer), METADATA_FILE_NAME))


def test_drain_is_only_for_a_synchronous_savepoint(tmp_path: Path) -> None:
    h = make_coordinator(make_plan([A1], [A1]))
    with pytest.raises(ValueError, match="drain applies only"):
        h.coordinator.trigger_savepoint(str(tmp_path), drain=True)


@pytest.mark.parametrize("status", [JobStatus.FINISHED, JobStatus.CANCELED, JobStatus.FAILED])
def test_savepoints_survive_later_checkpoints_and_the_end_of_the_job(
    tmp_path: Path, status: JobStatus
) -> None:
    h = make_coordinator(make_plan([A1], [A1]), tmp_path=tmp_path / "checkpoints", retained=1)
    future = h.coordinator.trigger_savepoint(str(tmp_path / "savepoints"))
    assert ack(h, A1, 1, savepoint_state(h, 1, A1))
    savepoint = succeeded(future)
    for checkpoint_id in (2, 3):  # num-retained 1: each checkpoint subsumes the one before
        checkpoint = h.coordinator.trigger_checkpoint()
        assert ack(h, A1, checkpoint_id, file_state(h.storage, checkpoint_id, A1))
        succeeded(checkpoint)

    h.coordinator.shutdown(status)

    directory = str(savepoint.external_pointer)
    assert sorted(os.listdir(directory)) == sorted(
        [METADATA_FILE_NAME, *(Path(p).name for p in file_paths_in(metadata_body(directory)))]
    )
    load_checkpoint_metadata(directory, environment_key())  # still restorable


def test_a_savepoint_without_a_directory_of_its_own_survives_the_end_of_the_job(tmp_path: Path) -> None:
    """Through ``trigger_checkpoint(props=savepoint)`` with no target a savepoint lands in the
    job's ``chk-N``; the end of the job, which tidies ``chk-N`` directories no retained
    checkpoint owns, must still leave it alone."""
    h = make_coordinator(make_plan([A1], [A1]), tmp_path=tmp_path, retained=1)
    future = h.coordinator.trigger_checkpoint(props=CheckpointProperties.for_savepoint())
    assert ack(h, A1, 1, file_state(h.storage, 1, A1))
    savepoint = succeeded(future)
    checkpoint = h.coordinator.trigger_checkpoint()
    assert ack(h, A1, 2, file_state(h.storage, 2, A1))
    succeeded(checkpoint)

    h.coordinator.shutdown(JobStatus.FINISHED)

    assert os.path.isfile(os.path.join(str(savepoint.external_pointer), METADATA_FILE_NAME))
    load_checkpoint_metadata(str(savepoint.external_pointer), environment_key())


# ---------------------------------------------------------------------- jobs


class CountPerKey(KeyedProcessFunction):
    """Emits ``"i,key,n"``: record ``i`` was the n-th of its key (exactly-once state makes
    every key's n run 1, 2, 3, ... across restores and rescaling, with no gap or repeat)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("n"))

    def process_element(self, value: Any, ctx: Any) -> Iterable[str]:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield f"{value},{ctx.get_current_key()},{n}"


KEYS = 7


def counting_job(
    env: StreamExecutionEnvironment,
    out: Path,
    rate: float,
    *,
    restore: str | None = None,
    between: MapFunction | None = None,
) -> StreamExecutionEnvironment:
    """Numbers ``0, 1, 2, ...`` (forever, ``rate`` a second) -> a count per key -> ``out``;
    ``between``: a map after the source (chained to it)."""
    if restore is not None:
        env.set_restore_path(restore)
    numbers = env.from_source(
        DataGeneratorSource(lambda i: i, None, rate), WatermarkStrategy.no_watermarks(), "numbers"
    ).uid("numbers")
    if between is not None:
        numbers = numbers.map(between).uid("between")
    (
        numbers.key_by(lambda i: i % KEYS)
        .process(CountPerKey())
        .uid("count")
        .sink_to(FileSink.for_row_format(str(out), Encoder.simple_string_encoder()).build())
        .uid("files")
    )
    return env


def committed(out: Path) -> list[str]:
    lines = []
    for path in sorted(out.rglob("*")):
        if path.is_file() and not path.name.startswith((".", "_")):
            lines += path.read_text().splitlines()
    return lines


def assert_exact_prefix(lines: list[str], first_parallelism: int, check_counts: bool = True) -> int:
    """Exactly once: every record once, each source split's records a gap-free prefix of it
    (splits: the first run's parallelism), and (``check_counts``) every key's count 1..n.
    Returns the number of records."""
    rows = [tuple(int(x) for x in line.split(",")) for line in lines]
    numbers = [r[0] for r in rows]
    duplicates = [n for n, c in Counter(numbers).items() if c > 1]
    assert not duplicates, f"records written twice: {sorted(duplicates)[:10]}"
    for split in range(first_parallelism):
        mine = sorted(n for n in numbers if n % first_parallelism == split)
        assert mine == list(range(split, split + first_parallelism * len(mine), first_parallelism)), (
            f"split {split} has a gap"
        )
    by_key: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for number, key, n in rows:
        assert key == number % KEYS
        by_key[key].append((number, n))
    for key, seen in by_key.items() if check_counts else ():
        counts = sorted(n for _, n in seen)
        assert counts == list(range(1, len(seen) + 1)), f"key {key}: counts {counts[:20]}..."
    return len(rows)


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def checkpointing_env(
    tmp_path: Path, parallelism: int, executor: str = "local", **config: Any
) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(200)
    env.configure(
        {
            "execution.checkpointing.dir": str(tmp_path / "checkpoints"),
            "restart-strategy.fixed-delay.delay": 50,
            **config,
        }
    )
    return env


@on_rocksdb_too()
def test_a_savepoint_of_a_running_job_moved_elsewhere_restores_exactly(tmp_path: Path) -> None:
    """Job A runs without periodic checkpoints (a savepoint needs none), takes a savepoint
    and is cancelled: nothing is committed, the savepoint holds the sink's prepared parts.
    Moved elsewhere, it starts job B at another parallelism, which commits them and goes on;
    its stop leaves an exact prefix of every source split, every key counted once."""
    out = tmp_path / "out"
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    env.configure(
        {
            "execution.checkpointing.savepoint-dir": str(tmp_path / "sp"),
            "execution.checkpointing.data-inline-threshold": 0,  # every state in a file
        }
    )
    client = counting_job(env, out, 2000).execute_async("savepoint, then cancel")
    wait_for(lambda: parts_written(out) >= 2, 60, "both sink subtasks writing")

    path = client.trigger_savepoint().result(60)  # into the configured directory

    assert Path(path).parent == tmp_path / "sp" and re.fullmatch(
        r"savepoint-[0-9a-f]{6}-[0-9a-f]{12}", Path(path).name
    )
    assert client.get_job_status() is JobStatus.RUNNING  # a savepoint does not stop the job
    body = metadata_body(path)
    assert body["checkpoint_type"] == "SAVEPOINT" and body["savepoint_format"] == "CANONICAL"
    referenced = file_paths_in(body)
    assert referenced and all(not p.startswith("/") for p in referenced)  # relative: inside it
    assert sorted(os.listdir(path)) == sorted([METADATA_FILE_NAME, *referenced])
    assert client.get_checkpoint_statistics()["latest"]["savepoint"]["external_path"] == path
    client.cancel()
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(60)
    assert os.path.isdir(path)  # chandy never deletes a savepoint
    assert committed(out) == []  # an intermediate savepoint commits nothing

    moved = tmp_path / "moved" / "my-savepoint"
    shutil.move(path, moved)
    restored = counting_job(checkpointing_env(tmp_path, 3), out, 2000, restore=str(moved)).execute_async(
        "restored"
    )
    wait_for(lambda: len(committed(out)) > 600, 60, "records committed after the restore")
    stop_path = restored.stop_with_savepoint(savepoint_directory=str(tmp_path / "sp2")).result(60)
    restored.get_job_execution_result(60)

    assert Path(stop_path).parent == tmp_path / "sp2"
    total = assert_exact_prefix(committed(out), 2)
    assert total > 600


def parts_written(out: Path) -> int:
    return len(list(out.glob(".part-*"))) if out.exists() else 0


def test_a_savepoint_needs_a_directory(tmp_path: Path) -> None:
    env = counting_job(checkpointing_env(tmp_path, 1), tmp_path / "out", 500)
    client = env.execute_async("no savepoint directory")
    try:
        for future in (client.trigger_savepoint(), client.stop_with_savepoint(True)):
            with pytest.raises(ConfigurationError) as error:
                future.result(10)
            message = str(error.value)
            assert "execution.checkpointing.savepoint-dir" in message and "savepoint_directory" in message
        assert client.get_job_status() is JobStatus.RUNNING
    finally:
        client.cancel()


def test_a_source_added_since_the_savepoint_reads_all_its_input_and_a_finished_one_none(
    tmp_path: Path,
) -> None:
    """A job restored from a savepoint with a source it did not have (a new uid) starts that
    source afresh: it plans its splits and reads them all, exactly once. A source that had
    finished when the savepoint was taken, restored at a higher parallelism, reads nothing
    again (its subtasks, the one new since too, are told they were in the savepoint)."""
    out = tmp_path / "out"

    def job(env: StreamExecutionEnvironment, *, new_source: bool) -> StreamExecutionEnvironment:
        numbers = env.from_source(
            DataGeneratorSource(lambda i: f"n {i}", None, 2000), WatermarkStrategy.no_watermarks(), "numbers"
        ).uid("numbers")
        done = env.from_source(
            DataGeneratorSource(lambda i: f"done {i}", 50), WatermarkStrategy.no_watermarks(), "done"
        ).uid("done")
        stream = numbers.union(done)
        if new_source:
            added = env.from_source(
                DataGeneratorSource(lambda i: f"added {i}", 300), WatermarkStrategy.no_watermarks(), "added"
            ).uid("added")
            stream = stream.union(added)
        sink = FileSink.for_row_format(str(out), Encoder.simple_string_encoder()).build()
        stream.sink_to(sink).uid("files")
        return env

    first = job(checkpointing_env(tmp_path, 2), new_source=False).execute_async("before")

    def lines_of(prefix: str) -> list[str]:
        return [line for line in committed(out) if line.startswith(prefix + " ")]

    wait_for(lambda: len(lines_of("done")) == 50 and len(lines_of("n")) > 200, 60, "both sources committed")
    savepoint = first.stop_with_savepoint(savepoint_directory=str(tmp_path / "sp")).result(60)
    first.get_job_execution_result(60)

    env = checkpointing_env(tmp_path, 3)
    env.set_restore_path(savepoint)
    second = job(env, new_source=True).execute_async("after")
    wait_for(lambda: len(lines_of("added")) == 300, 60, "the new source's records committed")
    wait_for(lambda: len(lines_of("n")) > 1000, 60, "the restored source going on")
    second.stop_with_savepoint(savepoint_directory=str(tmp_path / "sp2")).result(60)
    second.get_job_execution_result(60)

    assert Counter(lines_of("added")) == Counter(f"added {i}" for i in range(300))
    assert Counter(lines_of("done")) == Counter(f"done {i}" for i in range(50))  # not read again
    numbers = [int(line.split()[1]) for line in lines_of("n")]
    assert len(numbers) == len(set(numbers))  # the restored source read on, nothing twice
