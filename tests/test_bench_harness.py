"""The benchmark harness keeps working: a tiny ``python -m bench run --quick`` on chandy
alone (the reference systems are not installed in tests; the full comparison is
``python -m bench run``, outside the test suite)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parent.parent


def test_quick_bench_run_measures_every_workload_on_chandy(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "run",
            "--quick",
            "--systems",
            "chandy:local",
            "--records",
            "40000",
            "--duration-s",
            "2.5",
            "--results-dir",
            str(tmp_path),
            "--markdown",
            str(tmp_path / "RESULTS.md"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [result_file] = tmp_path.glob("*-quick.json")
    results = json.loads(result_file.read_text())
    rows = results["rows"]
    assert {(r["workload"], r["checkpoint_interval_ms"]) for r in rows} == {
        ("w1", 1000),
        ("w1", 0),
        ("w2", 1000),
        ("w3", 1000),
        ("w4", 1000),
    }
    assert all(r["ok"] for r in rows), [r.get("error") for r in rows]
    by_workload = {(r["workload"], r["checkpoint_interval_ms"]): r for r in rows}
    assert by_workload[("w1", 1000)]["records"] == 40_000
    assert by_workload[("w1", 1000)]["checkpoints_completed"] >= 1  # the final checkpoint
    assert by_workload[("w1", 0)]["checkpoints_completed"] is None
    assert by_workload[("w2", 1000)]["exact"] and by_workload[("w2", 1000)]["recovery_s"] > 0
    assert by_workload[("w3", 1000)]["records"] > 1000
    assert by_workload[("w4", 1000)]["checkpoint_size_bytes"] > 40_000 * 100
    assert all(r["machine_loop_ms"] > 0 for r in rows)
    assert by_workload[("w1", 1000)]["task_cpu_us_per_record"] > 0
    summary = results["summary"]["chandy/local"]
    assert summary["w2_exact_runs"] == "1 of 1"
    assert "checkpoint_overhead" in summary and "checkpoint_cpu_overhead" in summary
    text = (tmp_path / "RESULTS.md").read_text()
    assert "W3 latency p99" in text
    assert "sanity pass" in text  # nobody should quote a --quick run's figures


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_an_interrupted_run_resumes_without_rerunning_what_it_kept(tmp_path: Path) -> None:
    options = [
        "run",
        "--quick",
        "--systems",
        "chandy:local",
        "--workloads",
        "w1",
        "--records",
        "20000",
        "--results-dir",
        str(tmp_path),
    ]
    first = _bench(*options)
    assert first.returncode == 0, first.stderr[-3000:]
    [done] = tmp_path.glob("*-quick.json")
    kept = json.loads(done.read_text())["rows"][0]  # W1 with checkpoints
    done.unlink()
    kept["run_s"] = -1.0  # a mark: a rerun would measure it anew
    partial = tmp_path / "stopped.partial.jsonl"
    partial.write_text(json.dumps(kept) + "\n")

    resumed = _bench(*options, "--resume", str(partial))

    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not partial.exists()  # folded into the results
    [result_file] = tmp_path.glob("*-quick.json")
    rows = json.loads(result_file.read_text())["rows"]
    assert sorted(r["checkpoint_interval_ms"] for r in rows) == [0, 1000]
    assert [r["run_s"] for r in rows if r["checkpoint_interval_ms"]] == [-1.0]


def test_report_rewrites_the_markdown_from_saved_rows_and_bad_input_is_named(tmp_path: Path) -> None:
    done = _bench(
        "run",
        "--quick",
        "--systems",
        "chandy:local",
        "--workloads",
        "w1",
        "--records",
        "20000",
        "--results-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [result_file] = tmp_path.glob("*-quick.json")
    markdown = tmp_path / "again.md"

    rendered = _bench("report", str(result_file), "--markdown", str(markdown))

    assert rendered.returncode == 0, rendered.stderr[-3000:]
    assert any(
        line.startswith("| chandy/local ") and "| W1 throughput " in line
        for line in markdown.read_text().splitlines()
    )
    not_results = tmp_path / "not-results.json"
    not_results.write_text("{}")
    refused = _bench("report", str(not_results), "--markdown", str(markdown))
    assert refused.returncode != 0 and "not a suite results file" in refused.stderr
    missing = _bench("run", "--quick", "--resume", str(tmp_path / "nope.partial.jsonl"))
    assert missing.returncode != 0 and "no such file" in missing.stderr
    planned = _bench("run", "--quick", "--workloads", "w1v")
    assert planned.returncode != 0 and "vectorised path" in planned.stderr


def _w1_row(run: int, interval_ms: int, records_per_s: float, cpu_us: float) -> dict[str, object]:
    return {
        "system": "chandy",
        "variant": "spark",
        "workload": "w1",
        "run": run,
        "ok": True,
        "checkpoint_interval_ms": interval_ms,
        "records": 1000,
        "records_per_s": records_per_s,
        "task_cpu_us_per_record": cpu_us,
    }


def test_checkpoint_overhead_compares_each_run_with_its_neighbour_without_checkpoints() -> None:
    # run 3 fell into a slow spell of the machine halfway: its checkpointed half ran at
    # half speed. Comparing the two medians would call that a 29 % overhead.
    rows = [
        _w1_row(1, 1000, 1.0e6, 0.63),
        _w1_row(1, 0, 1.05e6, 0.60),
        _w1_row(2, 1000, 2.0e6, 0.62),
        _w1_row(2, 0, 2.1e6, 0.60),
        _w1_row(3, 1000, 1.5e6, 0.61),
        _w1_row(3, 0, 3.0e6, 0.60),
    ]

    part = report.summarize(rows)["chandy/spark"]

    assert part["checkpoint_overhead"] == pytest.approx(1 - 1 / 1.05)
    assert part["checkpoint_overhead_runs"]["max"] == pytest.approx(0.5)
    assert part["checkpoint_cpu_overhead"] == pytest.approx(0.62 / 0.60 - 1)
    assert part["task_cpu_us_per_record_without_checkpoints"]["median"] == pytest.approx(0.60)
    [check] = [t for t in report.targets(report.summarize(rows)) if "overhead" in t["target"]]
    assert check["met"] and check["measured"] == "4.8%"
    text = report.figures_table(report.summarize(rows))
    assert "W1 checkpoint CPU overhead" in text and "3.3%" in text


def _results(command: str, rows: list[dict[str, object]]) -> dict[str, object]:
    return {
        "date": "2026-11-23 19:34 UTC",
        "command": command,
        "runs": 1,
        "parallelism": 2,
        "versions": {"chandy": "0.1"},
        "rows": rows,
        "machine": {
            "cpus": 2,
            "platform": "Linux",
            "python": "3.11",
            "java": "17",
            "load_avg_1m_before": 0.5,
            "load_avg_1m_after": 0.7,
        },
    }


def test_a_report_of_several_runs_takes_each_workload_whole_from_the_last_run_measuring_it() -> None:
    w2 = {
        "system": "chandy",
        "variant": "spark",
        "workload": "w2",
        "run": 1,
        "ok": True,
        "checkpoint_interval_ms": 1000,
        "records": 1000,
        "recovery_s": 0.03,
        "exact": True,
        "load_avg_1m_before": 0.4,
    }
    first = _results("python -m bench run", [{**_w1_row(1, 1000, 1.0e6, 0.6), "load_avg_1m_before": 0.4}, w2])
    again = _results(
        "python -m bench run --workloads w1", [{**_w1_row(1, 1000, 3.0e6, 0.5), "load_avg_1m_before": 0.9}]
    )

    combined = report.combine([("first.json", first), ("again.json", again)])

    part = combined["summary"]["chandy/spark"]
    assert part["records_per_s"]["median"] == 3.0e6  # W1 from the later run only
    assert part["recovery_s"]["median"] == 0.03  # W2 kept from the first
    assert [(s["file"], s["workloads"]) for s in combined["sources"]] == [
        ("first.json", ["w2"]),
        ("again.json", ["w1"]),
    ]
    text = report.markdown(combined)
    assert "W2 from `python -m bench run`" in text
    assert "W1 from `python -m bench run --workloads w1`" in text
