"""The issue's memory acceptance test: keyed state many times larger than the slot's RocksDB
memory budget is written, checkpointed (incrementally or in full), restored after a SIGKILL and read
back whole, while the job process's resident memory stays under what the same job needs with
almost no state plus the budget plus a fixed overhead.

The job (tests/scripts/rocksdb_memory_job.py) runs under the local executor at parallelism 1:
one slot, every thread of it in one process of its own, so the process's peak RSS (the
kernel's high-water mark VmHWM in /proc/<pid>/status, read while it runs, just before the
SIGKILL, and by the job itself at its end) is the slot's plus the interpreter's and the
driver's. The baseline is the very same job with a state of a few hundred keys, measured in
the same test: what the process costs without state, on this machine, with this interpreter
and these libraries.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chandy.core.state import ValueStateDescriptor
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.state.rocksdb.backend import RocksDBKeyedStateBackend
from chandy.state.rocksdb.resources import SlotMemory
from chandy.storage.checkpoint_storage import CheckpointStorage, StateReader
from tests.test_rocksdb_backend import snapshot_handles

log = logging.getLogger(__name__)

SCRIPT = Path(__file__).resolve().parent / "scripts" / "rocksdb_memory_job.py"
ROOT = SCRIPT.parent.parent.parent
MB = 1 << 20

#: The slot's RocksDB budget (``state.backend.rocksdb.memory.fixed-per-slot``).
BUDGET = 16 * MB
#: Values of 4 KB of random bytes: the state on disk is KEYS * VALUE_BYTES, compression or not.
VALUE_BYTES = 4096
#: 80,000 keys of 4 KB: 312 MB of state, 19.5 times the budget.
KEYS = 80_000
#: The baseline's keys: 2 MB of state, an eighth of the budget.
BASELINE_KEYS = 500
#: What the process may take beyond the baseline and the budget: allocator fragmentation,
#: RocksDB's table readers and iterators outside the block cache, the checkpoint I/O pool's
#: buffers, batches in flight. Generous: 1-4 MB were measured (peaks of 75-78 and 71-72 MB against
#: baselines of 58 and 55); the heap backend peaks at 1,004 MB with the same state.
OVERHEAD = 48 * MB


@dataclass
class Run:
    """One run of the job: its peak RSS (VmHWM) and the largest VmRSS sampled."""

    peak_rss: int = 0
    sampled_rss: int = 0
    seconds: float = 0.0
    #: the bytes in the job's checkpoint directory once the run ended (the second run, which
    #: finishes, discards its checkpoints and their files)
    checkpoint_bytes: int = 0
    stdout: str = ""
    samples: list[tuple[float, int]] = field(default_factory=list, repr=False)


@dataclass
class Job:
    """Both runs of one job (killed after its writes were checkpointed, then restored)."""

    tmp: Path
    keys: int
    backend: str = "rocksdb"
    incremental: bool = True
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def job_dir(self) -> Path:
        return self.tmp / "checkpoints" / self.job_id

    def start(self, log_name: str) -> subprocess.Popen[str]:
        args = [
            self.tmp / "out",
            self.tmp / "checkpoints",
            self.tmp / "local",
            self.job_id,
            self.keys,
            VALUE_BYTES,
            BUDGET,
            self.backend,
            self.tmp / "gate",
            self.tmp / "marker",
            "true" if self.incremental else "false",
        ]
        with (self.tmp / log_name).open("w") as stderr, (self.tmp / f"{log_name}.out").open("w") as stdout:
            return subprocess.Popen(
                [sys.executable, str(SCRIPT), *map(str, args)],
                stdout=stdout,
                stderr=stderr,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                cwd=ROOT,
            )

    def completed_checkpoints(self) -> list[int]:
        return sorted(int(p.parent.name.removeprefix("chk-")) for p in self.job_dir.glob("chk-*/_metadata"))


def _measure(pid: int, run: Run, started: float) -> bool:
    """Reads VmRSS (the timeline) and VmHWM (the kernel's high-water mark of this process's
    RSS, which sampling cannot miss) of ``pid``; False once it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        rss, hwm = (int(fields[name].split()[0]) * 1024 for name in ("VmRSS", "VmHWM"))
    except (FileNotFoundError, ProcessLookupError, KeyError):  # gone, or a zombie without memory
        return False
    run.samples.append((time.monotonic() - started, rss))
    run.sampled_rss = max(run.sampled_rss, rss)
    run.peak_rss = max(run.peak_rss, hwm)
    return True


def _sample(process: subprocess.Popen[str], run: Run, stop: threading.Event) -> None:
    """Every 20 ms while the process lives. Not wait4's ru_maxrss: it counts the forked
    pytest process's RSS before the exec too."""
    started = time.monotonic()
    while not stop.is_set() and _measure(process.pid, run, started):
        stop.wait(0.02)


@contextlib.contextmanager
def _running(job: Job, log_name: str, run: Run) -> Iterator[subprocess.Popen[str]]:
    """The job started, its VmRSS sampled; at the end killed if still running, and reaped
    (``run.peak_rss``)."""
    stop = threading.Event()
    started = time.monotonic()
    process = job.start(log_name)
    sampler = threading.Thread(target=_sample, args=(process, run, stop), daemon=True)
    sampler.start()
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
        stop.set()
        sampler.join()
        run.seconds = time.monotonic() - started


def run_killed_and_restored(job: Job, timeout_s: float = 300) -> tuple[Run, Run]:
    """The first run writes every key and is SIGKILLed once a checkpoint taken after the last
    write completed; the second restores it and reads every key back. Returns both runs."""
    first, second = Run(), Run()
    with _running(job, "first.log", first) as process:
        deadline = time.monotonic() + timeout_s
        after: int | None = None
        while True:
            assert process.poll() is None, "the job ended before the kill:\n" + _tail(job.tmp / "first.log")
            assert time.monotonic() < deadline, f"no checkpoint after the writes within {timeout_s} s"
            completed = job.completed_checkpoints()
            if after is None and (job.tmp / "marker").exists():
                # a checkpoint triggered after the one in flight now completes, its barrier
                # behind the last write (one checkpoint at a time)
                after = (completed[-1] if completed else 0) + 2
            if after is not None and completed and completed[-1] >= after:
                _measure(process.pid, first, 0.0)  # the high-water mark up to the kill
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
    first.checkpoint_bytes = sum(p.stat().st_size for p in job.job_dir.rglob("*") if p.is_file())

    (job.tmp / "gate").touch()
    with _running(job, "second.log", second) as process:
        returncode = process.wait(timeout_s)
    second.stdout = (job.tmp / "second.log.out").read_text()
    assert returncode == 0, _tail(job.tmp / "second.log")
    summary = json.loads(
        next(line for line in second.stdout.splitlines() if line.startswith("SUMMARY ")).split(" ", 1)[1]
    )
    second.peak_rss = max(second.peak_rss, summary["vm_hwm"])  # its own, read at its end
    assert summary["restored"] is not None and summary["restored"]["id"] >= after, (summary, after)

    read = []
    for part in sorted((job.tmp / "out").rglob("*")):
        if part.is_file() and not part.name.startswith((".", "_")):
            read += [json.loads(line) for line in part.read_text().splitlines() if line]
    assert sorted(r["k"] for r in read) == list(range(job.keys)), "a key read back twice or never"
    assert all(r["ok"] for r in read), "a value read back after the restore differs from the one written"
    return first, second


@pytest.mark.slow
def test_a_fresh_cache_of_large_values_stays_within_its_share_writing_and_reading(tmp_path: Path) -> None:
    """A new backend's cache knows no value sizes yet: its first limit assumes small ones
    (about 15,900 entries of a 4 MB share). 20,000 values of 4 KB written, then read back by a
    backend restored from a checkpoint, must never take more than the share: the cache
    learns the sizes after a few entries (it held 15,887 of them, 64 MB, before evicting)."""
    max_parallelism = 128
    storage = CheckpointStorage(str(tmp_path / "checkpoints"), "job")
    storage.initialize()
    backends = []

    def backend(name: str) -> RocksDBKeyedStateBackend:
        (tmp_path / name).mkdir()
        made = RocksDBKeyedStateBackend(
            KeyGroupRange(0, max_parallelism - 1),
            max_parallelism,
            directory=str(tmp_path / name),
            memory=SlotMemory.of(BUDGET),
            incremental=True,
        )
        backends.append(made)
        return made

    def cached_bytes_at_most(made: RocksDBKeyedStateBackend, work: list[int]) -> int:
        state = made.get_partitioned_state(ValueStateDescriptor("v"))
        most = 0
        for key in work:
            made.set_current_key(key, assign_to_key_group(key, max_parallelism))
            if key in written:
                assert state.value() == written[key]
            else:
                written[key] = os.urandom(VALUE_BYTES)
                state.update(written[key])
            most = max(most, made.cache.total)
        return most * VALUE_BYTES

    written: dict[int, bytes] = {}
    try:
        writer = backend("writer")
        share = writer.memory.value_cache_share()
        assert cached_bytes_at_most(writer, list(range(20_000))) <= share
        handles = snapshot_handles(writer, storage, 1)
        reader = backend("reader")
        reader.restore(handles, StateReader(storage))
        assert cached_bytes_at_most(reader, list(range(20_000))) <= share
    finally:
        for made in backends:
            made.dispose()


@pytest.mark.slow
def test_memtables_stay_within_the_write_buffer_managers_share_while_large_values_pour_in(
    tmp_path: Path,
) -> None:
    """RocksDB's default 64 MB write buffer let memtables take several times the write buffer
    manager's share of a 16 MB budget (6 MB): 12.8 MB here, 59 MB during a checkpoint of the
    acceptance job below, whose flush lagged. 188 MB of 4 KB values written through the
    backend keep them within the share (at most two memtables of half of it, plus a batch)."""
    (tmp_path / "db").mkdir()
    backend = RocksDBKeyedStateBackend(
        KeyGroupRange(0, 127), 128, directory=str(tmp_path / "db"), memory=SlotMemory.of(BUDGET)
    )
    try:
        state = backend.get_partitioned_state(ValueStateDescriptor("v"))
        share = backend.memory.write_buffer_manager.get_buffer_size()
        most = 0
        for key in range(48_000):
            backend.set_current_key(key, assign_to_key_group(key, 128))
            state.update(os.urandom(VALUE_BYTES))
            if key % 50 == 0:
                most = max(most, backend.db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0)
        assert most <= share * 3 // 2, f"memtables took {most / MB:.1f} MB of a {share / MB:.1f} MB share"
    finally:
        backend.dispose()


def _tail(path: Path) -> str:
    return path.read_text()[-8000:]


@pytest.mark.slow
@pytest.mark.parametrize(
    "incremental", [pytest.param(True, id="incremental"), pytest.param(False, id="full")]
)
def test_state_many_times_the_budget_is_written_checkpointed_restored_and_read_within_it(
    tmp_path: Path, incremental: bool
) -> None:
    """The issue's acceptance test: 312 MB of RocksDB state (19.5 times a 16 MB budget) is
    written, checkpointed (incrementally or in full), killed with SIGKILL, restored and read back key by
    key with exact values, and neither run's peak RSS exceeds the baseline's (the same job
    with 2 MB of state) plus the budget plus a fixed overhead. Before the two fixes of
    5b564b6 and a7d8d71 (a cache that had not learned its values' sizes; memtables of up to
    59 MB) the runs peaked at 224 and 134 MB; the heap backend takes 1,004 MB for this state.
    Full checkpoints peaked at 710-735 and 720 MB while a canonical snapshot held its pickles
    in memory (twice) and its restore read the whole file; spilled to a local file and
    restored key group by key group, 85 and 91 MB (baselines 57 and 58)."""
    (tmp_path / "baseline").mkdir()
    (tmp_path / "large").mkdir()
    try:
        baseline = run_killed_and_restored(Job(tmp_path / "baseline", BASELINE_KEYS, incremental=incremental))
        large = run_killed_and_restored(Job(tmp_path / "large", KEYS, incremental=incremental))
    finally:  # a GB of databases and checkpoints (pytest keeps the last runs' temporary directories)
        for job in ("baseline", "large"):
            for directory in ("local", "checkpoints"):
                shutil.rmtree(tmp_path / job / directory, ignore_errors=True)
    checkpointed = large[0].checkpoint_bytes
    log.warning(
        "RocksDB state %d MB (%d MB checkpointed, %s) on a %d MB budget: peak RSS written+checkpointed "
        "%d MB (%.1f s), restored+read %d MB (%.1f s); baseline (%d keys) %d MB, %d MB",
        KEYS * VALUE_BYTES // MB,
        checkpointed // MB,
        "incremental" if incremental else "full",
        BUDGET // MB,
        large[0].peak_rss // MB,
        large[0].seconds,
        large[1].peak_rss // MB,
        large[1].seconds,
        BASELINE_KEYS,
        baseline[0].peak_rss // MB,
        baseline[1].peak_rss // MB,
    )
    # the latest checkpoint references every value (random bytes: no compression), 10x the budget
    assert checkpointed >= KEYS * VALUE_BYTES * 9 // 10 >= 10 * BUDGET, (
        "the state never reached the checkpoint"
    )
    for phase, run, base in zip(("written and checkpointed", "restored and read"), large, baseline):
        limit = base.peak_rss + BUDGET + OVERHEAD
        assert run.peak_rss <= limit, (
            f"{phase}: peak RSS {run.peak_rss // MB} MB > baseline {base.peak_rss // MB} MB + budget "
            f"{BUDGET // MB} MB + overhead {OVERHEAD // MB} MB"
        )
