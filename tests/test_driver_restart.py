"""Driver restart (Flink's application-mode HA over the checkpoint directory): a driver that
is SIGKILLed mid-job and submitted again under its fixed job id resumes from its latest
completed checkpoint, checkpoint ids continuing, and its FileSink output is exactly once.

The job runs as a real driver process (tests/scripts/driver_restart_job.py), on the local
executor (fast) and on Spark local mode, where the test also proves that nothing of the
killed run (the Spark JVM, the slot processes) lives on to write into the output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.jobs import release
from tests.state_backends import on_rocksdb_too

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "driver_restart_job.py"
RECORDS = 6_000
KEYS = 7


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _completed_ids(job_dir: Path) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1]) for p in job_dir.glob("chk-*/_metadata"))


def _start(
    executor: str, out: Path, checkpoints: Path, job_id: str, log: Path, gate: Path
) -> subprocess.Popen[str]:
    """The driver, its log into ``log`` (a pipe nobody reads while waiting would fill and stall it),
    paced until ``gate`` exists."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYSPARK_PYTHON", None)
    with log.open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, str(SCRIPT), executor, *map(str, (out, checkpoints, job_id, RECORDS, gate))],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            cwd=ROOT,
        )


def _output(out: Path) -> list[dict[str, Any]]:
    """Every record in a committed part file (names starting with '.' are not committed)."""
    records = []
    for part in sorted(out.rglob("*")):
        if part.is_file() and not part.name.startswith((".", "_")):
            records += [json.loads(line) for line in part.read_text().splitlines() if line]
    return records


def _assert_exactly_once(records: list[dict[str, Any]]) -> None:
    xs = sorted(r["x"] for r in records)
    duplicated = sorted({x for x in xs if xs.count(x) > 1}) if len(xs) != len(set(xs)) else []
    assert not duplicated, f"records written twice: {duplicated[:20]}"
    assert xs == list(range(RECORDS)), f"{RECORDS - len(set(xs))} records lost"
    counts: dict[int, list[int]] = defaultdict(list)
    for record in records:
        assert record["key"] == record["x"] % KEYS
        counts[record["key"]].append(record["count"])
    for key, seen in counts.items():  # keyed state came back: counts go on from the checkpoint
        assert sorted(seen) == list(range(1, len(seen) + 1)), key


def _summary(stdout: str) -> dict[str, Any]:
    line = next(line for line in stdout.splitlines() if line.startswith("SUMMARY "))
    summary: dict[str, Any] = json.loads(line.removeprefix("SUMMARY "))
    return summary


def _kill_then_resume(tmp_path: Path, executor: str) -> tuple[list[int], dict[str, Any], str]:
    """Run the job, SIGKILL its driver once it completed checkpoint 3 or later, run it again;
    returns the completed checkpoint ids on disk at the kill, the second run's summary, its log."""
    out, checkpoints = tmp_path / "out", tmp_path / "checkpoints"
    job_id = uuid.uuid4().hex
    job_dir = checkpoints / job_id
    first_log, gate = tmp_path / "first.log", tmp_path / "release-throttle"
    first = _start(executor, out, checkpoints, job_id, first_log, gate)
    slots: list[dict[str, Any]] = []

    def reached_checkpoint_3() -> bool:
        assert first.poll() is None, "the first run ended early:\n" + first_log.read_text()[-5000:]
        ids = _completed_ids(job_dir)
        return bool(ids) and ids[-1] >= 3

    try:
        if executor == "spark":
            assert first.stdout is not None
            line = first.stdout.readline()
            assert line.startswith("SLOTS "), line + first_log.read_text()[-5000:]
            slots = json.loads(line.removeprefix("SLOTS "))
        _wait_for(reached_checkpoint_3, 240, "checkpoint 3")
        first.send_signal(signal.SIGKILL)  # the driver only, as a crash would
    finally:
        first.kill()
        first.wait(30)
        assert first.stdout is not None
        first.stdout.close()  # not read to its end: a survivor of the kill may hold it open
    at_kill = _completed_ids(job_dir)
    if slots:
        # The Spark JVM exits when its driver's pipe closes; slot processes when their
        # supervisor (a Spark Python worker) dies or their driver connection closes.
        processes = (
            {s["pid"] for s in slots} | {s["supervisor_pid"] for s in slots} | {s["jvm_pid"] for s in slots}
        )
        assert all(processes), slots
        _wait_for(lambda: not any(_pid_alive(p) for p in processes), 30, "the killed run's processes to end")
    committed = _output(out)
    assert 0 < len(committed) < RECORDS, f"the first run committed {len(committed)} records before the kill"

    release(str(gate))  # the first run is gone: the second, which resumes it, need not be paced
    second_log = tmp_path / "second.log"
    second = _start(executor, out, checkpoints, job_id, second_log, gate)
    stdout, _ = second.communicate(timeout=600)
    log = second_log.read_text()
    assert second.returncode == 0, log[-8000:]
    return at_kill, _summary(stdout), log


def _assert_resumed_exactly_once(tmp_path: Path, executor: str) -> None:
    at_kill, summary, log = _kill_then_resume(tmp_path, executor)
    _assert_exactly_once(_output(tmp_path / "out"))
    restored = summary["restored"]
    assert restored is not None and restored["id"] == at_kill[-1], (at_kill, restored)
    assert "resumes from its checkpoint" in log
    assert min(summary["completed"]) > at_kill[-1]  # ids continue after the highest on disk


@pytest.mark.slow
@on_rocksdb_too()  # the new one restores from shared/
def test_a_killed_local_driver_resumes_from_its_latest_checkpoint_exactly_once(tmp_path: Path) -> None:
    _assert_resumed_exactly_once(tmp_path, "local")


@pytest.mark.slow
def test_a_killed_spark_driver_takes_its_slots_along_and_resumes_exactly_once(tmp_path: Path) -> None:
    _assert_resumed_exactly_once(tmp_path, "spark")
