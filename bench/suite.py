"""``python -m bench run``: every workload on every system, side by side, in one run.

Each run of a workload is a fresh subprocess (a system's runner, in the system's own
virtual environment; see :mod:`bench.systems` for the protocol), so no run inherits a
warm JVM, a Spark session or a cache from the one before. The runs are interleaved:
run 1 of every system, then run 2 of every system, and so on, so that a change of load
on the machine hits every system alike instead of one of them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.envs import CACHE, ensure_env, python_of, runner_of
from bench.procs import process_stats

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent

#: Every system and the variants it is measured in; the first is its main variant.
VARIANTS: dict[str, list[str]] = {
    "chandy": ["spark", "local", "rocksdb", "unaligned"],
    "spark_ss": ["groupby", "pandas_state", "twsip"],
    "bytewax": ["processes", "workers"],
    "pyflink": ["thread", "process", "unaligned"],
    # Anchors that run no Python per record (W1 and W5; Flink SQL W3 too): Flink's JVM engine through SQL,
    # and Pathway's Rust engine.
    "flink_sql": ["per_record", "minibatch"],
    "pathway": ["subject", "csv"],
}
WORKLOADS = ("w1", "w2", "w3", "w4", "w4r", "w5", "w6", "w1v", "w3v", "w5v")
#: Workloads the harness keeps a place for that wait on a chandy feature not built yet.
#: Asking for one runs nothing and says why; once the feature lands, the workload moves
#: to ``WORKLOADS`` and every runner learns it. (W1v and W3v, the batch path's, landed.)
PLANNED_WORKLOADS: dict[str, str] = {}
#: Workloads of chandy's batch path (Arrow record batches, columnar keyed state): only
#: chandy runs them. Their reference is what the other systems do with the same records:
#: W1v's is their W1 (Spark's ``groupBy().agg()`` already runs vectorised in its JVM),
#: W3v's their W3, W5v's their W5; ask for ``w1,w1v`` to measure both sides in one run.
CHANDY_ONLY_WORKLOADS = {"w1v": "w1", "w3v": "w3", "w5v": "w5"}
#: Workloads measured with checkpoints every second and again without, for the overhead.
WITH_NO_CHECKPOINT_BASELINE = ("w1", "w1v")


@dataclass(frozen=True)
class Sizes:
    """How big each workload is. The figures are rates and percentiles, which do not
    depend on the size once a run lasts some seconds and spans several checkpoints. So
    W1 gives the fast systems more records (chandy and Spark's JVM aggregation read 2 M
    in well under a second, too short for a checkpoint interval to matter; Spark reads
    12 M rows a batch, see its runner, and five batches) and PyFlink,
    about 100 times slower per record than the others, fewer, so that every run lasts
    seconds and ends in minutes. Each result names its record count."""

    w1_records: int = 2_000_000
    w2_records: int = 2_000_000
    w3_rate: float = 1000.0
    w3_duration_s: float = 30.0
    w4_keys: int = 1_000_000
    w4_value_bytes: int = 100
    #: W4r (W4 on RocksDB, ``bench/systems/w4r_records.py``): keys loaded, then 1 % of them
    #: updated per second for ``w4r_update_s`` seconds. PyFlink's count is divided by
    #: ``slow_system_divisor`` (its load of 10 M keys alone would take 6 minutes, and it
    #: cannot process 100,000 updates a second).
    w4r_keys: int = 10_000_000
    w4r_update_fraction: float = 0.01
    w4r_update_s: float = 30.0
    #: W6 (checkpoints under backpressure, ``bench/systems/w6_records.py``): the source's rate
    #: (records/s over both subtasks; the sinks hold half of it) and the run's length at the
    #: sinks. The same rate for every system, within PyFlink's reach (about 25 k records/s
    #: through its Python functions), so the backlog each holds in flight, and the time an
    #: aligned barrier waits behind it, depend on its buffers alone.
    w6_source_rate: float = 10_000.0
    w6_duration_s: float = 40.0
    #: W1's record count where it is not ``w1_records``, by ``system:variant`` or ``system``.
    w1_records_of: dict[str, int] = field(
        default_factory=lambda: {
            "chandy": 20_000_000,
            "spark_ss:groupby": 60_000_000,
            "pyflink": 200_000,
            # their runners time three jobs (N, 2N, N) for the steady state: 4 N records a run
            "flink_sql": 10_000_000,
            "pathway": 1_000_000,
        }
    )
    #: W1v (W1 on chandy's batch path): at tens of millions of records a second, a run of
    #: several seconds and checkpoints needs hundreds of millions.
    w1v_records: int = 300_000_000
    #: W5v (W5 on chandy's batch path): millions of records a second, so tens of millions
    #: for a run of several seconds with checkpoints every second (whole windows).
    w5v_records: int = 30_000_000
    #: W2's and W4's counts are divided by this for the slow systems.
    slow_system_divisor: dict[str, int] = field(default_factory=lambda: {"pyflink": 10})
    #: W5's records (rounded up to whole windows of ``w5_per_event_second`` records), and
    #: where a system's speed asks for another count: every run spans tens of windows
    #: (PyFlink's, at about 15 k records/s, six; in process mode, at 1.5 k records/s, and
    #: Bytewax's single process of two workers, at 12 k, three and six) and ends in
    #: minutes.
    w5_records: int = 2_000_000
    w5_per_event_second: int = 100_000
    w5_records_of: dict[str, int] = field(
        default_factory=lambda: {
            "chandy": 10_000_000,
            "spark_ss": 20_000_000,
            "pyflink": 600_000,
            "pyflink:process": 300_000,
            "bytewax:workers": 600_000,
            "flink_sql": 10_000_000,
            "pathway": 500_000,
        }
    )

    def arguments(self, system: str, variant: str, workload: str) -> list[str]:
        divisor = self.slow_system_divisor.get(system, 1)
        if workload == "w1":
            records = self.w1_records_of.get(
                f"{system}:{variant}", self.w1_records_of.get(system, self.w1_records)
            )
            return ["--records", str(records)]
        if workload == "w1v":
            return ["--records", str(self.w1v_records)]
        if workload == "w2":
            return ["--records", str(self.w2_records // divisor)]
        if workload in ("w3", "w3v"):
            return ["--rate", f"{self.w3_rate:g}", "--duration-s", f"{self.w3_duration_s:g}"]
        if workload == "w4r":
            return [
                "--records",
                str(self.w4r_keys // divisor),
                "--value-bytes",
                str(self.w4_value_bytes),
                "--update-fraction",
                f"{self.w4r_update_fraction:g}",
                "--update-s",
                f"{self.w4r_update_s:g}",
            ]
        if workload in ("w5", "w5v"):
            records = self.w5_records_for(system, variant) if workload == "w5" else self.w5v_records
            windows = max(1, -(-records // self.w5_per_event_second))
            return [
                "--records",
                str(windows * self.w5_per_event_second),
                "--per-event-second",
                str(self.w5_per_event_second),
            ]
        if workload == "w6":
            return ["--rate", f"{self.w6_source_rate:g}", "--duration-s", f"{self.w6_duration_s:g}"]
        return ["--records", str(self.w4_keys // divisor), "--value-bytes", str(self.w4_value_bytes)]

    def w5_records_for(self, system: str, variant: str) -> int:
        """W5's record count for a system: whole windows (the runners refuse a partial one)."""
        records = self.w5_records_of.get(
            f"{system}:{variant}", self.w5_records_of.get(system, self.w5_records)
        )
        windows = max(1, -(-records // self.w5_per_event_second))
        return windows * self.w5_per_event_second


FULL = Sizes()
QUICK = Sizes(
    w1_records=300_000,
    w1v_records=3_000_000,
    w5v_records=3_000_000,
    w2_records=300_000,
    w3_duration_s=6.0,
    w4_keys=100_000,
    w4r_keys=200_000,
    w4r_update_s=6.0,
    w1_records_of={"pyflink": 30_000, "pathway": 200_000},
    w5_records=300_000,
    w5_records_of={"pyflink": 200_000, "pathway": 200_000},
    w6_duration_s=10.0,
)


@dataclass(frozen=True)
class Case:
    """One measurement: a system in one variant on one workload, checkpoints on or off."""

    system: str
    variant: str
    workload: str
    checkpoint_interval_ms: int = 1000

    @property
    def label(self) -> str:
        checkpoints = "" if self.checkpoint_interval_ms else ", no checkpoints"
        return f"{self.system}/{self.variant} {self.workload}{checkpoints}"


#: W4r is W4 on RocksDB: chandy runs it on its RocksDB backend whatever the variant, so
#: its Spark-executor variant is the ``rocksdb`` one (the same run, named for what it is).
W4R_VARIANT = {("chandy", "spark"): "rocksdb"}
#: The reference variants W4r runs: those on a RocksDB state of the system's own
#: (PyFlink's Python functions in its JVM, Spark's JVM aggregation; Bytewax has no RocksDB
#: state, and PyFlink's process mode, at 1.5 k records/s, would load 1 M keys for 11 minutes).
W4R_REFERENCES = {("pyflink", "thread"), ("spark_ss", "groupby")}
#: W6 (checkpoints under backpressure) compares aligned with unaligned checkpoints where both
#: exist: chandy on the Spark executor and PyFlink in thread mode, each as is (aligned) and
#: with unaligned checkpoints. Spark's micro-batch commits and Bytewax's epochs travel with
#: no barrier, so there is nothing to align; chandy's other variants and PyFlink's process
#: mode would only repeat the aligned case.
W6_CASES = {("chandy", "spark"), ("chandy", "unaligned"), ("pyflink", "thread"), ("pyflink", "unaligned")}


def plan(
    systems: list[tuple[str, str]], workloads: list[str], with_no_checkpoint_baseline: bool
) -> list[Case]:
    cases = []
    for workload in workloads:
        chosen = systems
        if workload == "w4r":
            chosen = list(
                dict.fromkeys(
                    (s, W4R_VARIANT.get((s, v), v))
                    for s, v in systems
                    if s == "chandy" or (s, v) in W4R_REFERENCES
                )
            )
            if ("chandy", "rocksdb") in chosen:  # the full-size run, once (local: one GIL for all)
                chosen = [(s, v) for s, v in chosen if s != "chandy" or v == "rocksdb"]
            for left_out in sorted({f"{s}:{v}" for s, v in systems} - {f"{s}:{v}" for s, v in chosen}):
                if not left_out.startswith("chandy:"):
                    log.warning("W4r does not run on %s (no RocksDB state there, or too slow)", left_out)
        if workload == "w6":
            chosen = [(s, v) for s, v in systems if (s, v) in W6_CASES]
            for s, v in systems:
                if (s, v) not in W6_CASES:
                    log.warning("W6 does not run on %s:%s (see W6_CASES)", s, v)
        if workload in CHANDY_ONLY_WORKLOADS:
            chosen = [(s, v) for s, v in systems if s == "chandy"]
            for left_out in dict.fromkeys(s for s, _ in systems if s != "chandy"):
                log.warning(
                    "%s runs on chandy only (its batch path); %s's figure beside it is its %s",
                    workload[0].upper() + workload[1:],
                    left_out,
                    CHANDY_ONLY_WORKLOADS[workload].upper(),
                )
        for system, variant in chosen:
            cases.append(Case(system, variant, workload))
            if workload in WITH_NO_CHECKPOINT_BASELINE and with_no_checkpoint_baseline:
                cases.append(Case(system, variant, workload, checkpoint_interval_ms=0))
    return cases


def parse_systems(spec: str, quick: bool) -> list[tuple[str, str]]:
    """``chandy,pyflink:process`` -> every variant of chandy (only its main one with
    ``quick``) and PyFlink in process mode."""
    chosen = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        system, _, variant = item.partition(":")
        if system not in VARIANTS:
            raise ValueError(f"unknown system '{system}'; use {', '.join(VARIANTS)}")
        if variant and variant not in VARIANTS[system]:
            raise ValueError(f"unknown variant '{variant}' of {system}; use {', '.join(VARIANTS[system])}")
        variants = [variant] if variant else VARIANTS[system][: 1 if quick else None]
        chosen += [(system, v) for v in variants]
    return chosen


def run_case(
    case: Case, sizes: Sizes, parallelism: int, timeout_s: float, extra: list[str] | None = None
) -> dict[str, Any]:
    """Run one case in a fresh subprocess; its JSON figures plus what was run."""
    work_dir = CACHE / "work" / uuid.uuid4().hex[:12]
    work_dir.mkdir(parents=True)
    python = python_of(case.system)
    if case.system == "chandy":
        command = [str(python), "-m", "bench.systems.chandy_runner"]
    else:
        command = [str(python), str(runner_of(case.system))]
    command += [
        case.workload,
        "--work-dir",
        str(work_dir),
        "--parallelism",
        str(parallelism),
        "--checkpoint-interval-ms",
        str(case.checkpoint_interval_ms),
        "--mode",
        case.variant,
        *sizes.arguments(case.system, case.variant, case.workload),
        *(extra or []),
    ]
    row: dict[str, Any] = {
        "system": case.system,
        "variant": case.variant,
        "workload": case.workload,
        "checkpoint_interval_ms": case.checkpoint_interval_ms,
        "load_avg_1m_before": os.getloadavg()[0],
        "machine_loop_ms": machine_loop_ms(),
    }
    started = time.monotonic()
    log.warning("Running %s", case.label)
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_session(process.pid)
        stdout, stderr = process.communicate()
        row.update(ok=False, error=f"timed out after {timeout_s:.0f} s")
        return _finish(row, started, stderr, work_dir)
    finally:
        if process.poll() is None:  # Ctrl-C while waiting: take the runner's JVMs down too
            _kill_session(process.pid)
            process.wait()
    # communicate() returned once every process holding the runner's stdout exited (its
    # JVMs do); one that never held it may still run, and the next case must not run
    # beside it. In the runs so far this waited about 2 ms.
    row["leftover_s"] = _reap_session(process.pid)
    lines = [line for line in stdout.splitlines() if line.strip().startswith("{")]
    if not lines:
        row.update(
            ok=False, error=f"the runner printed no result (exit code {process.returncode}): {_tail(stderr)}"
        )
        return _finish(row, started, stderr, work_dir)
    figures = json.loads(lines[-1])
    figures.pop("system", None)
    row["reported_variant"] = figures.pop("variant", case.variant)
    row.update(figures)
    return _finish(row, started, stderr, work_dir)


def machine_loop_ms(iterations: int = 2_000_000, repeats: int = 3) -> float:
    """How long a fixed pure-Python loop takes now (the best of ``repeats``), in ms: the
    machine's speed at the start of a run. On the shared (virtual) reference machine
    the same W1 run measured 2.0 M records/s one evening and 3.3 M two hours later;
    with the loop beside every run, a run taken while the machine was slow can be told
    apart from a regression."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        total = 0
        for i in range(iterations):
            total += i & 7
        best = min(best, time.perf_counter() - started)
    return best * 1000


def _finish(row: dict[str, Any], started: float, stderr: str, work_dir: Path) -> dict[str, Any]:
    row["run_s"] = time.monotonic() - started
    if not row.get("ok"):
        log.warning("  failed: %s", row.get("error"))
        log.debug("stderr of the failed run:\n%s", stderr)
    shutil.rmtree(work_dir, ignore_errors=True)
    return row


def _session_members(session_id: int) -> list[int]:
    """Processes of the session ``session_id`` (a runner's, made by ``start_new_session``):
    its JVMs keep the runner's process group, PySpark's worker daemon makes its own, but
    every one of them stays in the session."""
    members = []
    for pid, fields in process_stats():
        if int(fields[3]) == session_id and fields[0] != "Z":
            members.append(pid)
    return members


def _kill_session(session_id: int) -> None:
    for pid in _session_members(session_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _reap_session(session_id: int, grace_s: float = 30.0) -> float:
    """Wait until the runner's leftover processes are gone (SIGKILL after ``grace_s``);
    how long they lived on."""
    started = time.monotonic()
    while _session_members(session_id):
        if time.monotonic() - started > grace_s:
            log.warning("  killing what the runner left running after %.0f s", grace_s)
            _kill_session(session_id)
        time.sleep(0.1)
    return time.monotonic() - started


def _tail(text: str, lines: int = 5) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])[-800:]


def run_suite(
    cases: list[Case],
    runs: int,
    sizes: Sizes,
    parallelism: int,
    timeout_s: float,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    done: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every case ``runs`` times, interleaved; the environments are made first.

    ``done`` are rows of an interrupted run of the same plan (``--resume``): their
    cases are not run again, so an hour-long comparison survives a stop."""
    for system in sorted({c.system for c in cases}):
        ensure_env(system)
    rows = list(done or [])
    finished = {
        (r["run"], r["system"], r["variant"], r["workload"], r["checkpoint_interval_ms"]) for r in rows
    }
    for run in range(1, runs + 1):
        for case in cases:
            if (run, case.system, case.variant, case.workload, case.checkpoint_interval_ms) in finished:
                continue
            row = run_case(case, sizes, parallelism, timeout_s)
            row["run"] = run
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows
