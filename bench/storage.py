"""``python -m bench storage``: checkpoint durations to S3 beside local disk (W1, W4).

Starts a SeaweedFS S3 server on loopback (:class:`bench.s3_server.S3Server`, the test
suite's), then runs W1 (a keyed running sum, checkpoints every second: their p50 and max)
and W4 (1 M keys of 100 bytes: the final checkpoint, which holds them all) with checkpoints
in a local directory and in ``s3://``, interleaved run by run so that a change of load hits
both alike. Each run is chandy's runner in a fresh subprocess (``bench.systems.chandy_runner
--checkpoint-dir ... --conf s3.endpoint=...``), as in ``python -m bench run``. Stops the
server by its pid at the end.

An S3 server on the same machine measures what the object store's protocol costs (a
request per state file, a PUT of each whole object, no rename, no fsync) against a local
disk, not a network's latency: add that for a remote store.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.s3_server import S3Server

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
STORAGES = ("local", "s3")


def runner_command(
    workload: str, args: argparse.Namespace, work_dir: Path, checkpoint_dir: str | None, conf: dict[str, Any]
) -> list[str]:
    """The chandy runner's command for one run (its figures come back as one JSON line)."""
    size = args.w4_keys if workload == "w4" else args.records
    command = [
        sys.executable,
        "-m",
        "bench.systems.chandy_runner",
        workload,
        "--work-dir",
        str(work_dir),
        "--mode",
        args.executor,
        "--parallelism",
        str(args.parallelism),
        "--records",
        str(size),
        "--checkpoint-interval-ms",
        str(args.checkpoint_interval_ms),
    ]
    if checkpoint_dir is not None:
        command += ["--checkpoint-dir", checkpoint_dir]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return command


def run_once(command: list[str], timeout_s: float) -> dict[str, Any]:
    completed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"ok": False, "error": f"no result (exit {completed.returncode}): {completed.stderr[-2000:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every run's figures, by workload and storage."""
    root = Path(tempfile.mkdtemp(prefix="chandy-bench-storage-"))
    server = S3Server(root / "weed")
    rows: list[dict[str, Any]] = []
    try:
        server.start()
        for run in range(args.runs):
            for workload in args.workloads:
                for storage in STORAGES:
                    work_dir = root / "work" / uuid.uuid4().hex[:12]
                    work_dir.mkdir(parents=True)
                    if storage == "s3":
                        checkpoint_dir: str | None = f"{server.unique_prefix('bench')}/ck"
                        conf = server.flink_config()
                    else:
                        checkpoint_dir, conf = None, {}
                    log.warning("run %d: %s, checkpoints to %s", run + 1, workload, storage)
                    result = run_once(
                        runner_command(workload, args, work_dir, checkpoint_dir, conf), args.timeout_s
                    )
                    rows.append({"run": run + 1, "workload": workload, "storage": storage, **result})
                    shutil.rmtree(work_dir, ignore_errors=True)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {"executor": args.executor, "parallelism": args.parallelism, "runs": rows}


def summary_lines(report: dict[str, Any]) -> list[str]:
    """One line a workload and storage: medians over the runs."""
    lines = []
    rows = report["runs"]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        for storage in STORAGES:
            mine = [r for r in rows if r["workload"] == workload and r["storage"] == storage and r.get("ok")]
            failed = [
                r for r in rows if r["workload"] == workload and r["storage"] == storage and not r.get("ok")
            ]
            if failed:
                lines.append(f"{workload} {storage}: {len(failed)} run(s) failed: {failed[0].get('error')}")
            if not mine:
                continue
            if workload == "w4":
                duration = statistics.median(r["checkpoint_duration_ms"] for r in mine)
                size = statistics.median(r["checkpoint_size_bytes"] for r in mine)
                lines.append(
                    f"W4 {storage:5}: final checkpoint {duration:,.0f} ms (median of {len(mine)}), "
                    f"{size / 1e6:,.1f} MB of state"
                )
            else:
                p50 = statistics.median(r["checkpoint_p50_ms"] for r in mine)
                worst = max(r["checkpoint_max_ms"] for r in mine)
                count = sum(r["checkpoints_completed"] for r in mine)
                rate = statistics.median(r["records_per_s"] for r in mine)
                lines.append(
                    f"W1 {storage:5}: checkpoint p50 {p50:,.0f} ms (median of {len(mine)} runs), "
                    f"max {worst:,.0f} ms, {count} checkpoints; {rate:,.0f} records/s"
                )
    return lines


def main(args: argparse.Namespace) -> int:
    report = measure(args)
    print(json.dumps(report, indent=2))
    print()
    print(
        f"Checkpoint durations, local disk vs S3 (SeaweedFS on loopback), {args.executor} executor, "
        f"parallelism {args.parallelism}:"
    )
    for line in summary_lines(report):
        print(line)
    return 0 if all(r.get("ok") for r in report["runs"]) else 1


def add_parser(sub: Any) -> None:
    """``storage``'s options, on ``python -m bench``'s subcommands."""
    storage = sub.add_parser(
        "storage", help="checkpoint durations to S3 (SeaweedFS on loopback) beside local disk"
    )
    storage.add_argument("--workloads", default="w1,w4", type=lambda text: text.split(","))
    storage.add_argument("--runs", type=int, default=3)
    storage.add_argument("--executor", default="local", choices=("local", "spark"))
    storage.add_argument("--parallelism", type=int, default=2)
    storage.add_argument("--records", type=int, default=5_000_000, help="W1's records")
    storage.add_argument("--w4-keys", type=int, default=1_000_000, help="W4's keys (100 bytes each)")
    storage.add_argument("--checkpoint-interval-ms", type=int, default=1000)
    storage.add_argument("--timeout-s", type=float, default=900.0, help="per run")
