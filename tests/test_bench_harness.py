"""The benchmark harness keeps working: a tiny ``python -m bench run --quick`` on chandy
alone (the reference systems are not installed in tests; the full comparison is
``python -m bench run``, outside the test suite)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_bench_run_measures_every_workload_on_chandy(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--quick", "--systems", "chandy:local",
         "--records", "40000", "--duration-s", "2.5", "--results-dir", str(tmp_path),
         "--markdown", str(tmp_path / "RESULTS.md")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [result_file] = tmp_path.glob("*-quick.json")
    results = json.loads(result_file.read_text())
    rows = results["rows"]
    assert {(r["workload"], r["checkpoint_interval_ms"]) for r in rows} == {
        ("w1", 1000), ("w1", 0), ("w2", 1000), ("w3", 1000), ("w4", 1000)}
    assert all(r["ok"] for r in rows), [r.get("error") for r in rows]
    by_workload = {(r["workload"], r["checkpoint_interval_ms"]): r for r in rows}
    assert by_workload[("w1", 1000)]["records"] == 40_000
    assert by_workload[("w1", 1000)]["checkpoints_completed"] >= 1  # the final checkpoint
    assert by_workload[("w1", 0)]["checkpoints_completed"] is None
    assert by_workload[("w2", 1000)]["exact"] and by_workload[("w2", 1000)]["recovery_s"] > 0
    assert by_workload[("w3", 1000)]["records"] > 1000
    assert by_workload[("w4", 1000)]["checkpoint_size_bytes"] > 40_000 * 100
    summary = results["summary"]["chandy/local"]
    assert summary["w2_exact_runs"] == "1 of 1"
    assert "checkpoint_overhead" in summary
    assert "W3 latency p99" in (tmp_path / "RESULTS.md").read_text()
