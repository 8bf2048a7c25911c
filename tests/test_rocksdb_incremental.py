"""Native RocksDB snapshots (chandy/state/rocksdb/incremental.py) on real databases and real
checkpoint directories: what an incremental checkpoint uploads and references, that only
completed checkpoints' files are reused, restores 1:1 and after rescaling (2 -> 3 -> 1, every
key exactly once), corrupt and missing shared files, in-memory storage and savepoints; and the
streamed, verified copies of ``CheckpointStorage.upload_file`` / ``StateReader.copy_to``.

The databases are written in the layout of chandy/state/rocksdb/layout.py with raw ``Rdict``s,
as the backend writes them, so these tests exercise exactly the files a job's checkpoint holds.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from chandy.core.state import MapState, MapStateDescriptor, ValueState, ValueStateDescriptor
from chandy.errors import InvalidCheckpointError
from chandy.state.backend import StateFileReader, WrittenKeyedState
from chandy.state.codec import decode, encode
from chandy.state.handles import ByteStreamStateHandle, FileStateHandle, IncrementalKeyedStateHandle
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.state.rocksdb.backend import RocksDBKeyedStateBackend
from chandy.state.rocksdb.incremental import (
    CheckpointAbortedDuringUpload,
    NativeSnapshotter,
    restore_native,
)
from chandy.state.rocksdb.layout import META_COLUMN_FAMILY, key_group_of, state_id, table_prefix
from chandy.state.rocksdb.resources import SlotMemory
from chandy.storage.checkpoint_storage import SHARED_DIR, CheckpointStorage, StateReader

log = logging.getLogger(__name__)

MAX_PARALLELISM = 128
ALL = KeyGroupRange(0, MAX_PARALLELISM - 1)


# ------------------------------------------------------------------------------ helpers


def open_db(path: str) -> Rdict:
    """A database as the backend opens one: raw mode, no WAL, the catalogue column family."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    db = Rdict(path, options, column_families={META_COLUMN_FAMILY: Options(raw_mode=True)})
    write_options = WriteOptions()
    write_options.disable_wal = True
    db.set_write_options(write_options)
    return db


def put(db: Rdict, name: str, kind: str, values: dict[Any, Any]) -> None:
    """Write ``values`` (state key -> value) of state ``name`` as the layout keys them."""
    db.get_column_family(META_COLUMN_FAMILY).put(name.encode(), kind.encode())
    sid = state_id(name)
    batch = WriteBatch(raw_mode=True)
    for key, value in values.items():
        batch.put(table_prefix(assign_to_key_group(key, MAX_PARALLELISM), sid) + encode(key), encode(value))
    write_options = WriteOptions()
    write_options.disable_wal = True
    db.write(batch, write_options)


def contents(db: Rdict) -> dict[bytes, bytes]:
    return {bytes(k): bytes(v) for k, v in db.items()}


def catalogue(db: Rdict) -> dict[str, str]:
    meta = db.get_column_family(META_COLUMN_FAMILY)
    try:
        return {bytes(k).decode(): bytes(v).decode() for k, v in meta.items()}
    finally:
        del meta


def decoded_keys(db: Rdict, name: str) -> dict[Any, Any]:
    """State key -> value of state ``name`` in ``db`` (a key twice fails)."""
    sid = state_id(name)
    found: dict[Any, Any] = {}
    for raw_key, raw_value in contents(db).items():
        if raw_key[2:6] == sid:
            key = decode(raw_key[6:])
            assert key not in found, f"{key!r} is in the database twice"
            found[key] = decode(raw_value)
    return found


def checkpoint(
    snapshotter: NativeSnapshotter,
    db: Rdict,
    storage: CheckpointStorage,
    checkpoint_id: int,
    *,
    incremental: bool = True,
    target_location: str | None = None,
    timings: list[float] | None = None,
) -> tuple[IncrementalKeyedStateHandle, WrittenKeyedState]:
    """Both parts of a native snapshot, as the task drives them (their durations in seconds
    appended to ``timings``: the synchronous part includes the memtable flush)."""
    started = time.perf_counter()
    db.flush()
    snapshot = snapshotter.take(db, checkpoint_id, {"s": "value"}, incremental=incremental)
    serializer = snapshot.serializer()
    assert serializer.step(None) and serializer.done
    result = serializer.result()
    snapshot.release()  # before the write, as the task's coordinator does
    synchronous = time.perf_counter()
    written = result.write(storage, checkpoint_id, target_location)
    if timings is not None:
        timings += [synchronous - started, time.perf_counter() - synchronous]
    (handle,) = written.handles
    assert isinstance(handle, IncrementalKeyedStateHandle)
    return handle, written


def sst_files(db: Rdict) -> set[str]:
    return {str(f["name"]).lstrip("/") for f in db.live_files()}


def assert_restores_to(
    tmp_path: Path, handle: IncrementalKeyedStateHandle, reader: StateFileReader, expected: Rdict
) -> None:
    """A 1:1 restore of ``handle`` holds exactly what ``expected`` holds now."""
    restored = restore_native(
        [handle], ALL, str(tmp_path / "restored"), str(tmp_path / "rwork"), reader, open_db
    )
    try:
        assert contents(restored) == contents(expected)
        assert catalogue(restored) == catalogue(expected)
    finally:
        restored.close()


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    # OPTIONS files (12 kB) above the threshold, CURRENT and small MANIFESTs below it
    s = CheckpointStorage(str(tmp_path / "checkpoints"), "job", inline_threshold=1024)
    s.initialize()
    return s


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Rdict]:
    database = open_db(str(tmp_path / "db"))
    yield database
    database.close()


def shared_dir(storage: CheckpointStorage) -> Path:
    return Path(storage.job_dir) / SHARED_DIR


# ------------------------------------------------------------------------------ snapshots


def test_a_checkpoint_uploads_its_sst_files_into_shared_and_its_metadata_files_privately(
    tmp_path: Path, db: Rdict, storage: CheckpointStorage
) -> None:
    put(db, "s", "value", {i: i * 10 for i in range(5000)})
    snapshotter = NativeSnapshotter("b1", ALL, str(tmp_path / "work"))
    handle, written = checkpoint(snapshotter, db, storage, 1)

    names = {name for name, _ in handle.shared}
    assert names == sst_files(db) and names and all(n.endswith(".sst") for n in names)
    assert handle.uploaded == names  # the first checkpoint has nothing to reference
    assert all(isinstance(h, FileStateHandle) for _, h in handle.shared)
    stored = sorted(os.listdir(shared_dir(storage)))
    assert stored == sorted(Path(h.path).name for _, h in handle.shared)
    private = {name for name, _ in handle.private}
    assert "CURRENT" in private and any(n.startswith("MANIFEST-") for n in private)
    assert any(n.startswith("OPTIONS-") for n in private) and not private & names
    # the OPTIONS file is larger than the inline threshold: a file in chk-1; CURRENT is inline
    assert {
        Path(h.path).parent.name for h in written.written if not Path(h.path).parent.name == "shared"
    } == {"chk-1"}
    assert isinstance(dict(handle.private)["CURRENT"], ByteStreamStateHandle)
    assert written.state_size == handle.state_size == written.checkpointed_size
    assert sorted(h.path for h in written.written) == sorted(
        h.path for _, h in (*handle.shared, *handle.private) if isinstance(h, FileStateHandle)
    )
    assert (handle.backend_id, handle.checkpoint_id, handle.key_group_range) == ("b1", 1, ALL)
    assert handle.state_kinds == (("s", "value"),)
    assert os.listdir(tmp_path / "work") == []  # the local checkpoint is gone once uploaded


def test_only_files_of_a_completed_checkpoint_are_referenced(
    tmp_path: Path, db: Rdict, storage: CheckpointStorage
) -> None:
    snapshotter = NativeSnapshotter("b1", ALL, str(tmp_path / "work"))
    put(db, "s", "value", {i: i for i in range(3000)})
    first, _ = checkpoint(snapshotter, db, storage, 1)
    put(db, "s", "value", {i: -i for i in range(10)})
    # checkpoint 1 has not completed: its uploads may still be deleted with it, so 2 uploads anew
    second, _ = checkpoint(snapshotter, db, storage, 2)
    assert second.uploaded == {name for name, _ in second.shared}
    first_paths = {h.path for _, h in first.shared}
    assert not first_paths & {h.path for _, h in second.shared}

    snapshotter.notify_checkpoint_complete(2)
    put(db, "s", "value", {i: i + 1 for i in range(10)})
    third, written = checkpoint(snapshotter, db, storage, 3)
    reused = {name for name, _ in third.shared} - third.uploaded
    assert reused == {name for name, _ in second.shared}  # everything of 2 is still live
    assert dict(third.shared)[min(reused)] == dict(second.shared)[min(reused)]  # the same file
    # the new SST files of the last update (data and catalogue), nothing else
    assert third.uploaded == sst_files(db) - {name for name, _ in second.shared} and len(third.uploaded) <= 2
    assert written.checkpointed_size < written.state_size
    assert {h.path for h in written.written}.isdisjoint(h.path for _, h in second.shared)
    # a late completion of an older checkpoint changes nothing
    snapshotter.notify_checkpoint_complete(1)
    assert snapshotter.confirmed_files() == dict(second.shared)


def test_an_aborted_checkpoint_is_forgotten_and_later_ones_restore(
    tmp_path: Path, db: Rdict, storage: CheckpointStorage
) -> None:
    snapshotter = NativeSnapshotter("b1", ALL, str(tmp_path / "work"))
    put(db, "s", "value", {i: i for i in range(3000)})
    first, _ = checkpoint(snapshotter, db, storage, 1)
    snapshotter.notify_checkpoint_complete(1)
    put(db, "s", "value", {i: "two" for i in range(100)})
    second, written = checkpoint(snapshotter, db, storage, 2)
    assert second.uploaded
    snapshotter.notify_checkpoint_aborted(2)
    storage.discard_handles(written.written)  # what the JobMaster deletes with an aborted checkpoint
    put(db, "s", "value", {i: "three" for i in range(50)})
    third, _ = checkpoint(snapshotter, db, storage, 3)
    # the files checkpoint 2 uploaded are never referenced (they are deleted); 1's are
    assert {name for name, _ in third.shared} - third.uploaded <= {name for name, _ in first.shared}
    assert not third.uploaded & second.uploaded or all(
        dict(third.shared)[n] != dict(second.shared)[n] for n in third.uploaded & second.uploaded
    )
    assert_restores_to(tmp_path, third, storage.reader(), db)


def test_an_upload_stops_when_its_checkpoint_is_aborted_and_deletes_what_it_wrote(
    tmp_path: Path, db: Rdict, storage: CheckpointStorage
) -> None:
    put(db, "s", "value", {i: i for i in range(1000)})
    snapshotter = NativeSnapshotter("b1", ALL, str(tmp_path / "work"))
    db.flush()
    snapshot = snapshotter.take(db, 7, {"s": "value"}, incremental=True)
    result = snapshot.serializer().result()
    snapshot.release()
    snapshotter.notify_checkpoint_aborted(7)
    with pytest.raises(CheckpointAbortedDuringUpload, match="checkpoint 7 was aborted"):
        result.write(storage, 7, None)
    assert os.listdir(shared_dir(storage)) == []
    assert os.listdir(tmp_path / "work") == []
    snapshotter.notify_checkpoint_complete(7)
    assert snapshotter.confirmed_files() == {}


def test_release_before_the_result_is_taken_deletes_the_local_checkpoint_and_close_the_work_dir(
    tmp_path: Path, db: Rdict
) -> None:
    put(db, "s", "value", {1: 1})
    work = tmp_path / "work"
    snapshotter = NativeSnapshotter("b1", ALL, str(work))
    snapshot = snapshotter.take(db, 1, (("s", "value"),), incremental=True)
    assert os.listdir(work) == ["chk-1"]
    snapshot.release()  # the task ended before it serialized
    assert os.listdir(work) == []
    result = snapshotter.take(db, 2, (("s", "value"),), incremental=True).serializer().result()
    assert os.listdir(work) == ["chk-2"]
    del result  # taken, never written (the I/O pool was shut down): its directory goes with it
    assert os.listdir(work) == []
    snapshotter.take(db, 3, (("s", "value"),), incremental=True)
    snapshotter.close()
    assert not work.exists()


def _incremental_backend(tmp_path: Path, budget: int) -> tuple[RocksDBKeyedStateBackend, ValueState]:
    """A RocksDB backend with incremental checkpoints in ``tmp_path/backend``, and its value state."""
    backend = RocksDBKeyedStateBackend(
        ALL,
        MAX_PARALLELISM,
        directory=str(tmp_path / "backend"),
        memory=SlotMemory.of(budget),
        incremental=True,
    )
    state = backend.get_partitioned_state(ValueStateDescriptor("v"))
    assert isinstance(state, ValueState)
    return backend, state


def _backend_checkpoint(
    backend: RocksDBKeyedStateBackend, storage: CheckpointStorage, checkpoint_id: int
) -> tuple[WrittenKeyedState, float, float]:
    """The snapshot protocol as the task's coordinator drives it; the synchronous (at the
    barrier) and asynchronous (I/O pool) durations in seconds."""
    started = time.perf_counter()
    snapshot = backend.snapshot(checkpoint_id)
    serializer = snapshot.serializer()
    while not serializer.step(None):
        pass
    result = serializer.result()
    snapshot.release()
    synchronous = time.perf_counter()
    written = result.write(storage, checkpoint_id, None)
    return written, synchronous - started, time.perf_counter() - synchronous


@pytest.mark.slow
def test_after_a_checkpoint_of_1m_keys_updating_1_percent_uploads_at_most_5_percent(
    tmp_path: Path, storage: CheckpointStorage
) -> None:
    """The issue's acceptance figure, through the RocksDB backend (value state updated by key,
    its cache flushed at the barrier) into a real checkpoint directory."""
    keys = 1_000_000
    backend, state = _incremental_backend(tmp_path, 128 << 20)
    try:
        for key in range(keys):
            backend.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))
            state.update((key, "v" * 8))
        first, first_sync, first_async = _backend_checkpoint(backend, storage, 1)
        backend.notify_checkpoint_complete(1)
        for key in random.Random(15).sample(range(keys), keys // 100):
            backend.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))
            state.update((key, "updated"))
        second, second_sync, second_async = _backend_checkpoint(backend, storage, 2)
    finally:
        backend.dispose()
    log.warning(
        "1 M keys: full checkpoint %d bytes (sync %.1f ms, async %.1f ms); after 1%% updated: "
        "%d of %d bytes uploaded = %.2f%% (sync %.1f ms, async %.1f ms)",
        first.checkpointed_size,
        first_sync * 1e3,
        first_async * 1e3,
        second.checkpointed_size,
        second.state_size,
        100 * second.checkpointed_size / second.state_size,
        second_sync * 1e3,
        second_async * 1e3,
    )
    assert first.checkpointed_size == first.state_size > 10_000_000
    assert second.checkpointed_size <= 0.05 * second.state_size
    (handle,) = second.handles
    assert isinstance(handle, IncrementalKeyedStateHandle)
    assert handle.checkpointed_size == second.checkpointed_size


# ------------------------------------------------------------------------------ restore


def test_a_restore_of_the_same_range_is_the_checkpointed_database(
    tmp_path: Path, db: Rdict, storage: CheckpointStorage
) -> None:
    put(db, "s", "value", {i: ("x", i) for i in range(2000)})
    put(db, "m", "map", {i: {"a": i} for i in range(10)})
    snapshotter = NativeSnapshotter("b1", ALL, str(tmp_path / "work"))
    handle, _ = checkpoint(snapshotter, db, storage, 1)
    put(db, "s", "value", {0: "after the checkpoint"})
    expected = contents(db)
    del expected[table_prefix(assign_to_key_group(0, MAX_PARALLELISM), state_id("s")) + encode(0)]
    db_path = tmp_path / "restored"
    db_path.mkdir()
    (db_path / "stale").write_text("replaced")
    restored = restore_native(
        [handle], ALL, str(db_path), str(tmp_path / "rwork"), StateReader(storage), open_db
    )
    try:
        assert decoded_keys(restored, "s")[0] == ("x", 0)
        assert len(contents(restored)) == len(contents(db))
        assert catalogue(restored) == {"s": "value", "m": "map"}
        assert not (db_path / "stale").exists()
        restored.put(b"new", b"writable")
    finally:
        restored.close()
    assert os.listdir(tmp_path / "rwork") == []  # downloads deleted


def _subtask_dbs(tmp_path: Path, tag: str, parallelism: int) -> tuple[list[KeyGroupRange], list[Rdict]]:
    ranges = [KeyGroupRange.of_operator(MAX_PARALLELISM, parallelism, i) for i in range(parallelism)]
    return ranges, [open_db(str(tmp_path / f"{tag}-{i}")) for i in range(parallelism)]


def _check_exactly_once(
    dbs: list[Rdict], ranges: list[KeyGroupRange], expected: dict[str, dict[Any, Any]]
) -> None:
    """Every key of ``expected`` in exactly one database, with its value, and every entry of
    each database inside its key-group range."""
    for name, values in expected.items():
        found: dict[Any, Any] = {}
        for restored, key_groups in zip(dbs, ranges, strict=True):
            for key, value in decoded_keys(restored, name).items():
                assert key not in found, f"{name}/{key!r} restored twice"
                assert assign_to_key_group(key, MAX_PARALLELISM) in key_groups
                found[key] = value
        assert found == values
    for restored, key_groups in zip(dbs, ranges, strict=True):
        assert all(key_group_of(k) in key_groups for k in contents(restored))


def test_rescaling_2_to_3_to_1_restores_every_key_exactly_once(
    tmp_path: Path, storage: CheckpointStorage
) -> None:
    values = {i: ("v", i) for i in range(6000)}
    lists = {f"k{i}": [i, i + 1] for i in range(0, 6000, 7)}
    ranges2, dbs2 = _subtask_dbs(tmp_path, "p2", 2)
    handles2 = []
    for index, (key_groups, database) in enumerate(zip(ranges2, dbs2, strict=True)):
        put(
            database,
            "s",
            "value",
            {k: v for k, v in values.items() if assign_to_key_group(k, MAX_PARALLELISM) in key_groups},
        )
        own_lists = {k: v for k, v in lists.items() if assign_to_key_group(k, MAX_PARALLELISM) in key_groups}
        put(database, f"only-{index}", "list", own_lists)
        snapshotter = NativeSnapshotter(f"p2-{index}", key_groups, str(tmp_path / f"w2-{index}"))
        handles2.append(checkpoint(snapshotter, database, storage, 1)[0])
        database.close()

    ranges3 = [KeyGroupRange.of_operator(MAX_PARALLELISM, 3, i) for i in range(3)]
    dbs3 = [
        restore_native(
            handles2, r, str(tmp_path / f"p3-{i}"), str(tmp_path / "rw"), storage.reader(), open_db
        )
        for i, r in enumerate(ranges3)
    ]
    _check_exactly_once(dbs3, ranges3, {"s": values})
    # the middle subtask overlaps both old ones: both catalogues; the others one each
    assert catalogue(dbs3[1]) == {"s": "value", "only-0": "list", "only-1": "list"}
    assert catalogue(dbs3[0]) == {"s": "value", "only-0": "list"}
    found_lists: dict[Any, Any] = {}
    for restored in dbs3:
        for name in ("only-0", "only-1"):
            found_lists.update(decoded_keys(restored, name))
    assert found_lists == lists

    handles3 = []
    for index, (key_groups, restored) in enumerate(zip(ranges3, dbs3, strict=True)):
        snapshotter = NativeSnapshotter(f"p3-{index}", key_groups, str(tmp_path / f"w3-{index}"))
        handles3.append(checkpoint(snapshotter, restored, storage, 2)[0])
        restored.close()

    (restored1,) = [
        restore_native(handles3, ALL, str(tmp_path / "p1"), str(tmp_path / "rw"), storage.reader(), open_db)
    ]
    try:
        _check_exactly_once([restored1], [ALL], {"s": values})
        assert catalogue(restored1) == {"s": "value", "only-0": "list", "only-1": "list"}
        assert {**decoded_keys(restored1, "only-0"), **decoded_keys(restored1, "only-1")} == lists
    finally:
        restored1.close()
    assert os.listdir(tmp_path / "rw") == []


def test_a_state_of_different_kinds_in_two_restored_snapshots_is_refused(
    tmp_path: Path, storage: CheckpointStorage
) -> None:
    ranges, dbs = _subtask_dbs(tmp_path, "p2", 2)
    handles = []
    for index, (key_groups, database) in enumerate(zip(ranges, dbs, strict=True)):
        put(database, "s", "value" if index == 0 else "list", {index: index})
        handles.append(
            checkpoint(NativeSnapshotter("b", key_groups, str(tmp_path / "w")), database, storage, 1)[0]
        )
        database.close()
    with pytest.raises(
        InvalidCheckpointError, match="state 's' is (list|value) state .* but (value|list) state"
    ):
        restore_native(handles, ALL, str(tmp_path / "p1"), str(tmp_path / "rw"), storage.reader(), open_db)


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_corrupt_or_missing_shared_file_names_the_file_and_the_way_out(
    tmp_path: Path, db: Rdict, storage: CheckpointStorage, damage: str
) -> None:
    put(db, "s", "value", {i: i for i in range(3000)})
    handle, _ = checkpoint(NativeSnapshotter("b1", ALL, str(tmp_path / "work")), db, storage, 1)
    victim = max((h for _, h in handle.shared), key=lambda h: h.state_size)
    assert isinstance(victim, FileStateHandle)
    if damage == "corrupt":
        with open(victim.path, "r+b") as f:
            f.seek(victim.size // 2)
            byte = f.read(1)
            f.seek(victim.size // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
    else:
        os.remove(victim.path)
    with pytest.raises(
        InvalidCheckpointError, match=f"{victim.path} is {damage}.*Restore from another checkpoint"
    ):
        restore_native(
            [handle], ALL, str(tmp_path / "restored"), str(tmp_path / "rwork"), storage.reader(), open_db
        )
    assert os.listdir(tmp_path / "rwork") == []


def test_in_memory_storage_inlines_every_file_and_references_nothing(tmp_path: Path, db: Rdict) -> None:
    storage = CheckpointStorage(None, "job")
    snapshotter = NativeSnapshotter("b1", ALL, str(tmp_path / "work"))
    put(db, "s", "value", {i: i for i in range(3000)})
    first, written = checkpoint(snapshotter, db, storage, 1)
    assert all(isinstance(h, ByteStreamStateHandle) for _, h in (*first.shared, *first.private))
    assert written.written == []
    snapshotter.notify_checkpoint_complete(1)
    assert snapshotter.confirmed_files() == {}  # no bytes of SST files kept in the task
    put(db, "s", "value", {1: "two"})
    second, _ = checkpoint(snapshotter, db, storage, 2)
    assert second.uploaded == {name for name, _ in second.shared}
    assert_restores_to(tmp_path, second, StateReader(), db)


@pytest.mark.parametrize("how", ["savepoint", "not incremental"])
def test_a_native_savepoint_or_a_full_native_snapshot_holds_every_file_itself(
    tmp_path: Path, db: Rdict, storage: CheckpointStorage, how: str
) -> None:
    snapshotter = NativeSnapshotter("b1", ALL, str(tmp_path / "work"))
    put(db, "s", "value", {i: i for i in range(3000)})
    first, _ = checkpoint(snapshotter, db, storage, 1)
    snapshotter.notify_checkpoint_complete(1)
    shared_before = sorted(os.listdir(shared_dir(storage)))
    put(db, "s", "value", {i: -i for i in range(3000)})
    target = None
    if how == "savepoint":
        target = storage.init_savepoint_location(str(tmp_path / "savepoints"))
    handle, written = checkpoint(
        snapshotter, db, storage, 2, incremental=how == "savepoint", target_location=target
    )
    assert handle.shared == () and handle.uploaded == frozenset()
    assert sorted(os.listdir(shared_dir(storage))) == shared_before
    assert {name for name, _ in handle.private} >= sst_files(db)
    expected_dir = target if target is not None else storage.checkpoint_dir(2)
    assert {os.path.dirname(h.path) for h in written.written} == {expected_dir}
    assert written.checkpointed_size == written.state_size
    assert_restores_to(tmp_path, handle, storage.reader(), db)
    # nor is it a base for later increments: they go on referencing checkpoint 1's files
    snapshotter.notify_checkpoint_complete(2)
    assert snapshotter.confirmed_files() == dict(first.shared)


# ------------------------------------------------------------------------------ storage


def test_upload_file_streams_a_large_file_and_copy_to_verifies_it(
    tmp_path: Path, storage: CheckpointStorage
) -> None:
    big = tmp_path / "big.sst"
    rng = random.Random(3)
    with open(big, "wb") as f:
        for _ in range(32):
            f.write(rng.randbytes(1 << 20))
    tracemalloc.start()
    try:
        handle = storage.upload_file(1, str(big), True)
        upload_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        copy = tmp_path / "copy.sst"
        storage.reader().copy_to(handle, str(copy))
        copy_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(handle, FileStateHandle) and handle.size == 32 << 20
    assert Path(handle.path).parent == shared_dir(storage)
    assert copy.read_bytes() == big.read_bytes()
    # chunks, not the file: far below its 32 MB
    assert upload_peak < 8 << 20 and copy_peak < 8 << 20, (upload_peak, copy_peak)


def test_upload_file_places_exclusive_files_beside_the_checkpoint_or_inline(
    tmp_path: Path, storage: CheckpointStorage
) -> None:
    small, large = tmp_path / "CURRENT", tmp_path / "OPTIONS-000007"
    small.write_bytes(b"MANIFEST-000005\n")
    large.write_bytes(b"o" * (storage.inline_threshold + 1))
    inline = storage.upload_file(3, str(small), False)
    assert isinstance(inline, ByteStreamStateHandle) and inline.data == small.read_bytes()
    exclusive = storage.upload_file(3, str(large), False)
    assert isinstance(exclusive, FileStateHandle)
    assert os.path.dirname(exclusive.path) == storage.checkpoint_dir(3)
    shared_small = storage.upload_file(3, str(small), True)  # shared files are always files
    assert isinstance(shared_small, FileStateHandle) and Path(shared_small.path).parent == shared_dir(storage)
    target = storage.init_savepoint_location(str(tmp_path / "sp"))
    in_savepoint = storage.upload_file(3, str(large), True, target)
    assert isinstance(in_savepoint, FileStateHandle) and os.path.dirname(in_savepoint.path) == target
    copied = tmp_path / "copied"
    storage.reader().copy_to(inline, str(copied))
    assert copied.read_bytes() == small.read_bytes()


def test_a_failed_upload_leaves_no_partial_file(tmp_path: Path, storage: CheckpointStorage) -> None:
    unreadable = tmp_path / "a-directory.sst"  # opening it for reading fails after the target exists
    unreadable.mkdir()
    with pytest.raises(IsADirectoryError):
        storage.upload_file(1, str(unreadable), True)
    assert os.listdir(shared_dir(storage)) == []


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "missing"])
def test_copy_to_refuses_a_damaged_file_and_leaves_nothing(
    tmp_path: Path, storage: CheckpointStorage, damage: str
) -> None:
    source = tmp_path / "000009.sst"
    source.write_bytes(os.urandom(100_000))
    handle = storage.upload_file(1, str(source), True)
    assert isinstance(handle, FileStateHandle)
    if damage == "missing":
        os.remove(handle.path)
    else:
        data = bytearray(Path(handle.path).read_bytes())
        if damage == "corrupt":
            data[500] ^= 1
        else:
            del data[-10:]
        Path(handle.path).write_bytes(bytes(data))
    local = tmp_path / "restored.sst"
    with pytest.raises(InvalidCheckpointError, match="missing" if damage == "missing" else "corrupt"):
        storage.reader().copy_to(handle, str(local))
    assert not local.exists()


def test_copy_to_an_existing_local_file_is_refused_and_keeps_it(
    tmp_path: Path, storage: CheckpointStorage
) -> None:
    source = tmp_path / "src"
    source.write_bytes(b"s" * 50_000)
    handle = storage.upload_file(1, str(source), True)
    existing = tmp_path / "existing"
    existing.write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        storage.reader().copy_to(handle, str(existing))
    assert existing.read_bytes() == b"mine"


def test_upload_and_copy_stream_through_fsspec_filesystems_too(tmp_path: Path) -> None:
    """Object stores (here fsspec's memory://) take the same streamed, verified copies."""
    storage = CheckpointStorage(f"memory://{tmp_path.name}", "job", inline_threshold=1024)
    storage.initialize()
    source = tmp_path / "000011.sst"
    source.write_bytes(os.urandom(3 << 20))
    handle = storage.upload_file(1, str(source), True)
    assert isinstance(handle, FileStateHandle) and handle.path.startswith("memory://")
    assert storage.fs.size(handle.path) == 3 << 20
    local = tmp_path / "copy"
    storage.reader().copy_to(handle, str(local))
    assert local.read_bytes() == source.read_bytes()
    storage.fs.delete(handle.path)
    with pytest.raises(InvalidCheckpointError, match="is missing"):
        storage.reader().copy_to(handle, str(tmp_path / "again"))


# ------------------------------------------------------------------------------ a real job, killed


KILL_SCRIPT = Path(__file__).resolve().parent / "scripts" / "rocksdb_upload_kill_job.py"
KILL_RECORDS = 3000
KILL_KEYS = 40


def _start_kill_job(tmp_path: Path, job_id: str, log_name: str) -> subprocess.Popen[str]:
    root = KILL_SCRIPT.parent.parent.parent
    args = [
        tmp_path / "out",
        tmp_path / "checkpoints",
        tmp_path / "local",
        job_id,
        KILL_RECORDS,
        tmp_path / "gate",
    ]
    with (tmp_path / log_name).open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, str(KILL_SCRIPT), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "PYTHONPATH": str(root)},
            cwd=root,
        )


def _checkpoint_id(metadata: Path) -> int:
    return int(metadata.parent.name.removeprefix("chk-"))


def _files_written_after(directory: Path, moment_ns: int) -> list[Path]:
    found = []
    for path in directory.iterdir() if directory.exists() else ():
        try:
            if path.stat().st_mtime_ns > moment_ns:
                found.append(path)
        except FileNotFoundError:  # deleted meanwhile (no checkpoint references it any more)
            pass
    return found


@pytest.mark.slow
def test_a_sigkill_during_an_sst_upload_leaves_a_checkpoint_that_is_complete_or_ignored(
    tmp_path: Path,
) -> None:
    """The issue's acceptance test: a real job on RocksDB (tests/scripts/rocksdb_upload_kill_job.py,
    tens of MB of SST files per checkpoint) is killed with SIGKILL while an SST file is being
    written into shared/; run again under its job id it resumes from the latest checkpoint
    with a _metadata, and its output is exactly once with every payload restored intact."""
    job_id = uuid.uuid4().hex
    job_dir = tmp_path / "checkpoints" / job_id
    first = _start_kill_job(tmp_path, job_id, "first.log")
    try:
        deadline = time.monotonic() + 240
        while True:
            assert first.poll() is None, (
                "the job ended before the kill:\n" + (tmp_path / "first.log").read_text()[-5000:]
            )
            assert time.monotonic() < deadline, "no upload after a completed checkpoint within 240 s"
            try:  # the latest completed checkpoint (one is retained: older ones are subsumed)
                completed = max((p for p in job_dir.glob("chk-*/_metadata")), key=_checkpoint_id)
                completed_id, completed_ns = _checkpoint_id(completed), completed.stat().st_mtime_ns
            except (ValueError, FileNotFoundError):
                continue
            # after a few checkpoints (later ones reference earlier ones' files), an SST file
            # written after the latest completed one: the next checkpoint is uploading
            if completed_id >= 3 and _files_written_after(job_dir / SHARED_DIR, completed_ns):
                first.send_signal(signal.SIGKILL)
                break
            time.sleep(0.001)
    finally:
        first.kill()
        first.wait(30)
        assert first.stdout is not None
        first.stdout.close()

    metadata = {
        int(p.parent.name.removeprefix("chk-")): p.read_bytes() for p in job_dir.glob("chk-*/_metadata")
    }
    shared = {p.name for p in (job_dir / SHARED_DIR).iterdir()}
    referenced = {name for name in shared if any(name.encode() in data for data in metadata.values())}
    orphans = shared - referenced
    log.warning(
        "killed with checkpoints %s complete; shared/ holds %d files (%d MB), %d of them (%d MB) "
        "of the checkpoint being uploaded",
        sorted(metadata),
        len(shared),
        sum((job_dir / SHARED_DIR / n).stat().st_size for n in shared) >> 20,
        len(orphans),
        sum((job_dir / SHARED_DIR / n).stat().st_size for n in orphans) >> 20,
    )
    assert orphans, "the kill came after the uploading checkpoint completed: nothing was tested"
    assert referenced  # the completed checkpoints' files are all there

    (tmp_path / "gate").touch()  # the second run need not be paced
    second = _start_kill_job(tmp_path, job_id, "second.log")
    stdout, _ = second.communicate(timeout=600)
    assert second.returncode == 0, (tmp_path / "second.log").read_text()[-8000:]
    summary = json.loads(
        next(line for line in stdout.splitlines() if line.startswith("SUMMARY ")).split(" ", 1)[1]
    )
    assert summary["restored"]["id"] == max(metadata), summary  # the incomplete one is ignored

    records = []
    for part in sorted((tmp_path / "out").rglob("*")):
        if part.is_file() and not part.name.startswith((".", "_")):
            records += [json.loads(line) for line in part.read_text().splitlines() if line]
    xs = sorted(r["x"] for r in records)
    assert xs == list(range(KILL_RECORDS)), "records lost or written twice"
    assert all(r["ok"] for r in records), "a restored payload differs from the one checkpointed"
    by_key: dict[int, list[dict[str, Any]]] = {}
    for record in sorted(records, key=lambda r: r["count"]):
        by_key.setdefault(record["key"], []).append(record)
    for key, seen in by_key.items():
        assert [r["count"] for r in seen] == list(range(1, len(seen) + 1)), key
        assert [r["last"] for r in seen] == [None] + [r["x"] for r in seen[:-1]], key


def test_a_snapshot_dropped_unwritten_neither_holds_up_the_disposal_nor_stays_on_disk(tmp_path: Path) -> None:
    """A result never written (the I/O pool was shut down) takes its local checkpoint (hard
    links that keep SST files alive) with it, and the disposed backend's directory goes at
    once (the backend waits for the ``chk-*`` directories of uploads in flight)."""
    backend, state = _incremental_backend(tmp_path, 64 << 20)
    backend.set_current_key(1, assign_to_key_group(1, MAX_PARALLELISM))
    state.update(1)
    snapshot = backend.snapshot(1)
    snapshot.serializer().result()  # taken and dropped
    snapshot.release()
    del snapshot
    gc.collect()
    assert os.listdir(backend.work_dir) == []
    backend.dispose()
    assert not (tmp_path / "backend").exists()


def test_backends_rescaled_2_to_3_to_1_from_native_checkpoints_read_every_key_once(
    tmp_path: Path, storage: CheckpointStorage
) -> None:
    """The same rescaling through the backend: value and map state written through their
    handles, native checkpoints restored into 3 backends then 1, read back through the
    handles and counted with apply_to_all_keys (each key exactly once, each where it belongs)."""
    keys = range(3000)
    value_descriptor = ValueStateDescriptor("v")
    map_descriptor = MapStateDescriptor("m")

    def backend(tag: str, key_groups: KeyGroupRange) -> RocksDBKeyedStateBackend:
        return RocksDBKeyedStateBackend(
            key_groups,
            MAX_PARALLELISM,
            directory=str(tmp_path / tag),
            memory=SlotMemory.of(32 << 20),
            incremental=True,
        )

    def native_checkpoints(backends: list[RocksDBKeyedStateBackend], checkpoint_id: int) -> list[Any]:
        handles = []
        for b in backends:
            written, _, _ = _backend_checkpoint(b, storage, checkpoint_id)
            handles += written.handles
            b.dispose()
        return handles

    def restored(parallelism: int, handles: list[Any]) -> list[RocksDBKeyedStateBackend]:
        backends = []
        for index in range(parallelism):
            b = backend(
                f"p{parallelism}-{index}", KeyGroupRange.of_operator(MAX_PARALLELISM, parallelism, index)
            )
            b.restore([h for h in handles if h.intersection(b.key_group_range)], StateReader(storage))
            backends.append(b)
        return backends

    def check(backends: list[RocksDBKeyedStateBackend]) -> None:
        seen: list[Any] = []
        for b in backends:
            own: list[Any] = []
            b.apply_to_all_keys(value_descriptor, lambda key, _: own.append(key))
            assert own and all(assign_to_key_group(k, MAX_PARALLELISM) in b.key_group_range for k in own)
            seen += own
            value, entries = (
                b.get_partitioned_state(value_descriptor),
                b.get_partitioned_state(map_descriptor),
            )
            assert isinstance(value, ValueState) and isinstance(entries, MapState)
            for key in keys:
                if assign_to_key_group(key, MAX_PARALLELISM) in b.key_group_range:
                    b.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))
                    assert value.value() == ("v", key)
                    assert dict(entries.items()) == {"a": key, "b": -key}
        assert sorted(seen) == list(keys)

    original = []
    for index in range(2):
        b = backend(f"p2-{index}", KeyGroupRange.of_operator(MAX_PARALLELISM, 2, index))
        value, entries = b.get_partitioned_state(value_descriptor), b.get_partitioned_state(map_descriptor)
        assert isinstance(value, ValueState) and isinstance(entries, MapState)
        for key in keys:
            if assign_to_key_group(key, MAX_PARALLELISM) in b.key_group_range:
                b.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))
                value.update(("v", key))
                entries.put_all({"a": key, "b": -key})
        original.append(b)
    three = restored(3, native_checkpoints(original, 1))
    check(three)
    one = restored(1, native_checkpoints(three, 2))
    try:
        check(one)
    finally:
        for b in one:
            b.dispose()


# ------------------------------------------------------------------------------ the base checkpoint


def based_checkpoint(
    snapshotter: NativeSnapshotter,
    db: Rdict,
    storage: CheckpointStorage,
    checkpoint_id: int,
    base: int | None,
) -> IncrementalKeyedStateHandle:
    """Both parts of a native snapshot whose barrier names ``base`` as its base checkpoint."""
    db.flush()
    snapshot = snapshotter.take(db, checkpoint_id, {"s": "value"}, incremental=True, base_checkpoint_id=base)
    result = snapshot.serializer().result()
    snapshot.release()
    (handle,) = result.write(storage, checkpoint_id, None).handles
    assert isinstance(handle, IncrementalKeyedStateHandle)
    return handle


def reused(handle: IncrementalKeyedStateHandle) -> dict[str, Any]:
    return {name: h for name, h in handle.shared if name not in handle.uploaded}


def names(handle: IncrementalKeyedStateHandle) -> set[str]:
    return {name for name, _ in handle.shared}


def test_a_snapshot_reuses_exactly_the_files_of_its_base_whatever_the_task_heard(
    tmp_path: Path, db: Rdict, storage: CheckpointStorage
) -> None:
    """The barrier's base completed (the coordinator said so), whether or not the notice of it
    reached the task, and its files are kept while the checkpoint is pending; the checkpoint
    the task last heard of may be subsumed already, its files deleted."""
    snapshotter = NativeSnapshotter("b1", ALL, str(tmp_path / "work"))
    put(db, "s", "value", {i: i for i in range(3000)})
    first = based_checkpoint(snapshotter, db, storage, 1, None)
    assert first.uploaded == names(first)

    put(db, "s", "value", {i: -i for i in range(10)})
    second = based_checkpoint(snapshotter, db, storage, 2, 1)  # the notice of 1 never came
    assert reused(second) == dict(first.shared)  # the same handles: nothing of 1 uploaded again
    assert second.uploaded == names(second) - names(first) != set()
    assert snapshotter.remembered_checkpoints() == [1, 2] and snapshotter.confirmed_files() == {}

    snapshotter.notify_checkpoint_complete(1)  # late: 2 completed meanwhile and is the base of 3
    put(db, "s", "value", {i: i + 1 for i in range(10)})
    third = based_checkpoint(snapshotter, db, storage, 3, 2)
    assert reused(third) == dict(second.shared)  # what 2 uploaded too, not only 1's files
    assert third.uploaded == names(third) - names(second) != set()
    assert snapshotter.remembered_checkpoints() == [2, 3]  # 1 is no base any more
    assert_restores_to(tmp_path, third, storage.reader(), db)

    put(db, "s", "value", {1: "four"})
    fourth = based_checkpoint(snapshotter, db, storage, 4, None)  # no base: everything uploaded
    assert fourth.uploaded == names(fourth) and reused(fourth) == {}
    snapshotter.notify_checkpoint_aborted(4)
    snapshotter.notify_checkpoint_complete(3)
    assert snapshotter.remembered_checkpoints() == [3]
    # a base this snapshotter never wrote (a savepoint, or taken before a restore): no reuse
    restarted = NativeSnapshotter("b2", ALL, str(tmp_path / "work2"))
    fifth = based_checkpoint(restarted, db, storage, 5, 3)
    assert fifth.uploaded == names(fifth)
    assert_restores_to(tmp_path, fifth, storage.reader(), db)


def test_a_task_hearing_late_of_completions_never_references_a_deleted_file(
    tmp_path: Path, db: Rdict, storage: CheckpointStorage
) -> None:
    """The race that failed jobs, event by event, through a real coordinator (one retained
    checkpoint, no tolerable failure): the notice that checkpoint 1 completed reaches the task
    only after the barrier of 2, and the notice of 2 only after the barrier of 3. Reusing the
    files of the last checkpoint the task had heard of, 2 uploaded everything anew and 3
    referenced 1's files, which 2 had subsumed and deleted: checkpoint 3 failed, and the job."""
    from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
    from tests.test_checkpoint_coordinator import A1, ack, make_coordinator, make_plan, operator_id, succeeded

    h = make_coordinator(make_plan([A1], [A1]), storage=storage, retained=1, tolerable_failures=0)
    snapshotter = NativeSnapshotter("b1", ALL, str(tmp_path / "work"))

    def barrier() -> IncrementalKeyedStateHandle:
        """The task takes the checkpoint of the last trigger and acknowledges it."""
        _, checkpoint_id, _, options = h.gateway.triggered[-1]
        handle = based_checkpoint(snapshotter, db, storage, checkpoint_id, options.base_checkpoint_id)
        state = TaskStateSnapshot({operator_id(A1.vertex_id): OperatorSubtaskState((handle,))})
        assert ack(h, A1, checkpoint_id, state)
        return handle

    put(db, "s", "value", {i: i for i in range(3000)})
    first_future = h.coordinator.trigger_checkpoint()
    first = barrier()
    succeeded(first_future)
    put(db, "s", "value", {i: -i for i in range(10)})
    second_future = h.coordinator.trigger_checkpoint()
    second = barrier()  # the notice of 1 is still on its way
    succeeded(second_future)  # subsumes 1
    snapshotter.notify_checkpoint_complete(1)
    put(db, "s", "value", {i: i * 3 for i in range(10)})
    third_future = h.coordinator.trigger_checkpoint()
    third = barrier()  # the notice of 2 is still on its way

    assert succeeded(third_future).checkpoint_id == 3
    assert h.job_failures == []
    assert [c.checkpoint_id for c in h.store.get_all_checkpoints()] == [3]
    assert set(reused(second)) == names(first)  # its base: 1, which the task had not heard of
    # exactly the files 3 references are in shared/: 1's unused ones went when 2 subsumed it
    assert sorted(os.listdir(shared_dir(storage))) == sorted(
        Path(file.path).name for _, file in third.shared if isinstance(file, FileStateHandle)
    )
    assert_restores_to(tmp_path, third, storage.reader(), db)
