"""``python -m bench report`` draws RESULTS.md's side-by-side as an SVG bar chart."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from bench import chart
from bench.report import HAND_WRITTEN, summarize

ROOT = Path(__file__).resolve().parent.parent
SVG = "{http://www.w3.org/2000/svg}"

#: One W1 run of each system: records/s and checkpoint p50, as a suite run records them.
FIGURES = {
    ("chandy", "spark"): (3_300_000.0, 17.0),
    ("spark_ss", "groupby"): (11_400_000.0, 215.0),
    ("spark_ss", "pandas_state"): (167_000.0, 207.0),
    ("bytewax", "processes"): (486_000.0, 55.0),
    ("pyflink", "thread"): (27_500.0, 572.0),
}


def _results(figures: dict[tuple[str, str], tuple[float, float]]) -> dict[str, Any]:
    rows = [
        {
            "system": system,
            "variant": variant,
            "workload": "w1",
            "checkpoint_interval_ms": 1000,
            "ok": True,
            "records": 1_000_000,
            "records_per_s": rate,
            "checkpoint_p50_ms": p50,
            "load_avg_1m_before": 0.5,
            "machine_loop_ms": 49.0,
        }
        for (system, variant), (rate, p50) in figures.items()
    ]
    return {
        "date": "2026-11-29 12:00 UTC",
        "command": "python -m bench run --workloads w1",
        "runs": 1,
        "parallelism": 2,
        "machine": {
            "cpus": 2,
            "platform": "Linux",
            "python": "3.11.7",
            "java": "openjdk 17",
            "load_avg_1m_before": 0.5,
            "load_avg_1m_after": 0.4,
            "load_avg_1m_min": 0.3,
            "load_avg_1m_max": 0.9,
        },
        "versions": {"chandy": "0.1.0"},
        "rows": rows,
    }


def _report(tmp_path: Path, results: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "run.json").write_text(json.dumps(results))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "report",
            str(tmp_path / "run.json"),
            "--markdown",
            str(tmp_path / "R.md"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_report_writes_the_chart_the_markdown_shows_and_keeps_the_hand_written_part(tmp_path: Path) -> None:
    (tmp_path / "R.md").write_text(f"# old report\n\n{HAND_WRITTEN}\n\n## Measured by hand\n\nkept\n")
    done = _report(tmp_path, _results(FIGURES))
    assert done.returncode == 0, done.stderr[-3000:]

    markdown = (tmp_path / "R.md").read_text()
    assert "![chandy (Spark executor) beside each reference's best variant](results.svg)" in markdown
    assert "# old report" not in markdown
    assert markdown.endswith(f"{HAND_WRITTEN}\n\n## Measured by hand\n\nkept\n")

    root = ET.fromstring((tmp_path / "results.svg").read_text())
    texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    assert "W1 throughput (records/s, higher is better)" in texts
    assert "W1 checkpoint p50 (ms, lower is better)" in texts
    # chandy and each reference's best variant for that figure: Spark's groupby has the higher
    # throughput, its pandas_state the shorter checkpoints
    labels = [t for t in texts if "/" in t and " " not in t]
    assert labels == [
        *("chandy/spark", "spark_ss/groupby", "bytewax/processes", "pyflink/thread"),
        *("chandy/spark", "spark_ss/pandas_state", "bytewax/processes", "pyflink/thread"),
    ]
    assert "3,300,000 records/s" in texts
    assert "27,500 records/s  (chandy 120x better)" in texts
    assert "11,400,000 records/s  (chandy 3.5x worse)" in texts
    bars = {
        float(r.get("width") or 0)
        for r in root.iter(f"{SVG}rect")
        if r.get("height") == str(chart.BAR_H) and r.get("fill") == chart.COLOURS["pyflink"]
    }
    assert bars and min(bars) > 0  # the smallest figure still gets a visible bar


def test_bars_are_ordered_and_log_scaled() -> None:
    summary = summarize(_results(FIGURES)["rows"])
    [(throughput, bars), (checkpoint, _)] = chart.panels(summary)
    assert throughput.key == "records_per_s" and checkpoint.key == "checkpoint_p50_ms"
    assert [b.label for b in bars] == [
        "chandy/spark",
        "spark_ss/groupby",
        "bytewax/processes",
        "pyflink/thread",
    ]
    assert [b.value for b in bars] == [3_300_000.0, 11_400_000.0, 486_000.0, 27_500.0]


def test_a_run_without_a_reference_system_has_no_chart_and_says_why(tmp_path: Path) -> None:
    done = _report(tmp_path, _results({("chandy", "spark"): (3_300_000.0, 17.0)}))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "No chart: no figure to chart" in done.stderr
    assert not (tmp_path / "results.svg").exists()
    assert "results.svg" not in (tmp_path / "R.md").read_text()


def test_the_committed_chart_is_the_one_results_md_shows() -> None:
    assert "](results.svg)" in (ROOT / "bench" / "RESULTS.md").read_text()
    ET.fromstring((ROOT / "bench" / "results.svg").read_text())
    assert "](bench/results.svg)" in (ROOT / "README.md").read_text()
