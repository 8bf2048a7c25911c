"""The benchmark harness keeps working: a tiny ``python -m bench run --quick`` on chandy
alone (the reference systems are not installed in tests; the full comparison is
``python -m bench run``, outside the test suite)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

import pytest

from bench import report
from bench.profile import by_area, checkpoint_path, profiled_run
from bench.systems.w5_events import (
    OUT_OF_ORDERNESS_MS,
    ResultCheck,
    W5Events,
    WatermarkPasses,
    latency_figures,
    verify,
    watermark_passed_at,
)
from bench.systems.w5_events import figures as w5_figures

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
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
        ("w4r", 1000),
        ("w5", 1000),
        ("w1v", 1000),
        ("w1v", 0),
        ("w3v", 1000),
        ("w5v", 1000),
    }
    assert all(r["ok"] for r in rows), [r.get("error") for r in rows]
    by_workload = {(r["workload"], r["checkpoint_interval_ms"]): r for r in rows}
    assert by_workload[("w1", 1000)]["records"] == 40_000
    assert by_workload[("w1", 1000)]["checkpoints_completed"] >= 1  # the final checkpoint
    assert by_workload[("w1", 0)]["checkpoints_completed"] is None
    assert by_workload[("w2", 1000)]["exact"] and by_workload[("w2", 1000)]["recovery_s"] > 0
    assert by_workload[("w3", 1000)]["records"] > 1000
    assert by_workload[("w4", 1000)]["checkpoint_size_bytes"] > 40_000 * 100
    w4r = by_workload[("w4r", 1000)]  # on RocksDB, incremental, whatever the variant
    assert w4r["keys"] == 40_000 and w4r["updates"] == 2_400 and w4r["checkpoints_measured"] >= 3
    assert 0 < w4r["uploaded_p50_bytes"] < w4r["full_size_bytes"]  # incremental: not the whole state
    w5 = by_workload[("w5", 1000)]
    assert w5["records"] == 100_000  # rounded up to a whole window
    assert w5["exact"] and w5["results"] == 10_000 and w5["records_per_s"] > 0
    assert all(r["machine_loop_ms"] > 0 for r in rows)
    assert by_workload[("w1", 1000)]["task_cpu_us_per_record"] > 0
    w1v = by_workload[("w1v", 1000)]  # the batch path: W1's records as Arrow batches
    assert (
        w1v["records"] == 40_000 and w1v["checkpoints_completed"] >= 1 and w1v["task_cpu_us_per_record"] > 0
    )
    assert by_workload[("w3v", 1000)]["records"] > 1000 and by_workload[("w3v", 1000)]["latency_p99_ms"] > 0
    w5v = by_workload[("w5v", 1000)]  # W5's events as Arrow batches, the batch path's windows
    assert w5v["records"] == 100_000 and w5v["exact"] and w5v["results"] == 10_000
    summary = results["summary"]["chandy/local"]
    assert summary["w2_exact_runs"] == "1 of 1" and summary["w5_exact_runs"] == "1 of 1"
    assert summary["w5v_exact_runs"] == "1 of 1"
    assert "checkpoint_overhead" in summary and "checkpoint_cpu_overhead" in summary
    text = (tmp_path / "RESULTS.md").read_text()
    assert "W3 latency p99" in text
    assert "sanity pass" in text  # nobody should quote a --quick run's figures


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_an_interrupted_run_resumes_without_rerunning_what_it_kept_and_report_rewrites_its_markdown(
    tmp_path: Path,
) -> None:
    # One W1 run serves both: `report` renders its saved rows again, then a resume keeps its
    # first row (one `bench run` fewer than a test for each: 3-5 s)
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

    markdown = tmp_path / "again.md"
    rendered = _bench("report", str(done), "--markdown", str(markdown))
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
    unknown = _bench("run", "--quick", "--workloads", "w9")
    assert unknown.returncode != 0 and "unknown workloads ['w9']" in unknown.stderr

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


def test_w1_in_one_process_pairs_each_batch_run_with_checkpoints_with_its_neighbour_without() -> None:
    """``python -m bench w1 --batch``: W1v's runs, in one process, alternate which variant
    goes first, and the overhead is the median of each pair's own difference."""
    command = ["w1", "--batch", "--records", "3000000", "--runs", "2", "--checkpoint-interval", "100"]
    result = subprocess.run(
        [sys.executable, "-m", "bench", *command],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parent.parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.split("\n\n")[0])
    assert summary["workload"] == "W1v"
    runs = summary["runs"]
    # Every run counted all its records at the sink (run_w1 raises otherwise), on the batch path.
    order = [(r["run"], r["checkpoint_interval_ms"]) for r in runs]
    assert order == [(0, None), (0, 100), (1, 100), (1, None)]
    assert all(r["batch"] and r["records"] == 3_000_000 and r["task_cpu_us_per_record"] > 0 for r in runs)
    assert sum(r["checkpoints_completed"] for r in runs) > 0
    part = summary["local"]
    losses = [1 - runs[i]["records_per_s"] / runs[j]["records_per_s"] for i, j in ((1, 0), (2, 3))]
    assert part["checkpoint_overhead_runs"] == pytest.approx(losses)
    assert part["checkpoint_overhead"] == pytest.approx(sum(losses) / 2)
    assert "median of 2 pairs" in result.stdout


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
    assert "(2026-11-23 19:34 UTC, `first.json`, 1 run(s) of each case)" in text  # each source its own count


# ---------------------------------------------------------------------- W5's harness


def _small_events() -> W5Events:
    # 1,000 records per 100 ms block (coprime to the deal), 100 keys, two sources
    return W5Events(records=40_000, keys=100, per_event_second=10_000, parallelism=2)


def test_w5_events_are_out_of_order_within_the_bound_and_every_window_sum_has_its_closed_form() -> None:
    events = _small_events()
    records = events.records_of(range(events.records))

    assert records == [(i % 100, i, events.timestamp(i)) for i in range(events.records)]
    assert records[5:9] == events.records_of(range(5, 9))
    assert events.records_of(range(1, 3001, 2)) == records[1:3001:2]
    sums: dict[tuple[int, int], int] = {}
    for key, value, timestamp in records:
        window = events.window_of(timestamp)
        assert window == value // events.per_event_second  # the blocks tile the windows
        sums[window, key] = sums.get((window, key), 0) + value
    assert sums == {(w, k): events.expected_sum(w, k) for w in range(events.windows) for k in range(100)}
    for source in range(events.parallelism):  # each source subtask reads its stride
        largest, disorder = 0, 0
        for _, _, timestamp in records[source :: events.parallelism]:
            largest = max(largest, timestamp)
            disorder = max(disorder, largest - timestamp)
            # the thresholds fall on block starts: the last record read tells when one is passed
        assert 50 < disorder < 100 < OUT_OF_ORDERNESS_MS
    assert sorted(events.strided(n) for n in range(events.records)) == list(range(events.records))
    assert [events.strided(n) for n in (0, 1, 20_000, 20_001)] == [0, 2, 1, 3]


def test_w5_source_notes_when_its_largest_timestamp_passes_each_window_fire_threshold() -> None:
    events = _small_events()
    by_record = WatermarkPasses(events)
    by_batch = WatermarkPasses(events)
    for batch_start in range(0, events.records, 500):
        batch = events.records_of(range(batch_start, batch_start + 500))
        for _, i, timestamp in batch:
            by_record.observe(timestamp, now=float(i))
        last = batch[-1][1]
        by_batch.observe_batch(events.timestamp_floor(last), now=float(last))

    # window w fires once a timestamp >= its end + 200 ms was read: the first record of
    # the block starting there, record (w + 1.2) * per_event_second
    assert by_record.passed == {0: 12_000.0, 1: 22_000.0, 2: 32_000.0}
    assert by_batch.passed == {0: 12_499.0, 1: 22_499.0, 2: 32_499.0}
    assert by_batch.first == 499.0
    assert 3 not in by_record.passed  # the last window fires at the end of the input


def _checked(events: W5Events, skip: Collection[tuple[int, int]] = (), extra: int = 0) -> ResultCheck:
    check = ResultCheck(events)
    for window in range(events.windows):
        for key in range(events.keys):
            if (window, key) not in skip:
                check.add(
                    key, events.expected_sum(window, key), events.window_start(window) + 999, 1000 * window
                )
    for _ in range(extra):
        check.add(7, events.expected_sum(1, 7), events.window_start(1), 1000)
    return check


def test_w5_verification_names_missing_duplicated_and_wrong_results_and_fails_the_run() -> None:
    events = _small_events()
    exact = verify(events, [_checked(events).to_json()])
    assert exact["exact"] and exact["results"] == exact["results_expected"] == 400

    split = (
        _checked(events, skip={(w, k) for w in range(4) for k in range(0, 100, 2)}),
        _checked(events, skip={(w, k) for w in range(4) for k in range(1, 100, 2)}),
    )
    assert verify(events, [c.to_json() for c in split])["exact"]  # two sink subtasks, one whole

    broken = _checked(events, skip={(2, 5)}, extra=1)
    broken.add(3, 1, events.window_start(0), 0)  # a wrong sum
    broken.add(3, 1, events.window_start(9), 0)  # a window the events do not have
    verdict = verify(events, [broken.to_json()])
    assert verdict["missing_results"] == 1
    assert verdict["duplicate_results"] == 2  # (1, 7) once more, (0, 3) once more
    assert verdict["wrong_sums"] == 1 and verdict["results_outside_windows"] == 1
    assert not verdict["exact"]
    passes = [{"first": 0.0, "passed": {}}]
    with pytest.raises(RuntimeError, match="1 missing, 2 duplicated, 1 with a wrong sum"):
        w5_figures(events, passes, [broken.to_json()])


def test_w5_latency_counts_from_the_last_source_unless_each_key_has_its_own_clock() -> None:
    events = _small_events()
    passes = [
        {"first": 0.0, "passed": {"0": 1.0, "1": 2.0, "2": 3.0}},
        {"first": 0.0, "passed": {"0": 1.5, "1": 2.0, "2": 3.25}},
    ]
    assert watermark_passed_at(events, passes)[(2, 0)] == 3.25  # the minimum watermark
    assert watermark_passed_at(events, passes, per_key_source=True)[(2, 0)] == 3.0
    assert (3, 0) not in watermark_passed_at(events, passes)  # fired by the end of input
    check = ResultCheck(events)
    for key in range(events.keys):  # window 2's results arrive 10 ms (even keys) or 20 ms after 3.25 s
        check.add(key, events.expected_sum(2, key), events.window_start(2), 3260 + 10 * (key % 2))
        check.add(key, events.expected_sum(1, key), events.window_start(1), 2100)

    shared = latency_figures(watermark_passed_at(events, passes), [check.to_json()])
    per_key = latency_figures(watermark_passed_at(events, passes, True), [check.to_json()])

    assert (shared["latency_min_ms"], shared["latency_max_ms"]) == (10.0, 100.0)
    assert shared["latency_results"] == 200 and shared["latency_windows"] == 2  # window 0 is warm-up
    assert shared["latency_p50_ms"] == 20.0 and shared["window_complete_p50_ms"] == 20.0
    # each key from its own source: even keys' window 2 passed at 3.0 s, odd keys' at 3.25 s
    assert (per_key["latency_min_ms"], per_key["latency_max_ms"]) == (20.0, 260.0)


def test_w5_sizes_are_whole_windows_and_its_figures_do_not_mix_with_w1s() -> None:
    from bench.suite import FULL, QUICK

    assert FULL.arguments("chandy", "spark", "w5") == [
        "--records",
        "10000000",
        "--per-event-second",
        "100000",
    ]
    assert QUICK.arguments("bytewax", "processes", "w5")[1] == "300000"
    assert (
        replace(QUICK, w5_records=40_000, w5_records_of={}).arguments("chandy", "local", "w5")[1] == "100000"
    )

    def row(system: str, variant: str, workload: str, rate: float, **more: object) -> dict[str, object]:
        return {
            "system": system,
            "variant": variant,
            "workload": workload,
            "run": 1,
            "ok": True,
            "checkpoint_interval_ms": 1000,
            "records": 1000,
            "records_per_s": rate,
            **more,
        }

    rows = [
        row("chandy", "spark", "w1", 3.0e6),
        row("chandy", "spark", "w5", 1.6e6, latency_p99_ms=300.0, exact=True),
        row("bytewax", "processes", "w5", 0.5e6, latency_p99_ms=900.0, exact=True),
        row("bytewax", "workers", "w5", 0.4e6, exact=True),
        row("pyflink", "thread", "w5", 0.02e6, exact=True),
        {**row("pyflink", "process", "w5", 0.0), "ok": False, "error": "RuntimeError: not exact"},
    ]

    summary = report.summarize(rows)

    assert summary["chandy/spark"]["records_per_s"]["median"] == 3.0e6
    assert summary["chandy/spark"]["w5_records_per_s"]["median"] == 1.6e6
    assert summary["pyflink/process"]["w5_exact_runs"] == "0 of 1"
    ratios = report.ratios(summary)["chandy/spark"]
    assert ratios["bytewax/processes"]["w5_latency_p99_ms"] == pytest.approx(3.0)
    checks = {c["target"]: (c["measured"], c["met"]) for c in report.targets(summary)}
    assert checks["W5 >= 1.5 M records/s"] == ("1.60 M records/s", True)
    assert checks["W5 >= 3x bytewax (best variant: bytewax/processes)"] == ("3.20x", True)
    assert checks["W5 >= 50x pyflink (best variant: pyflink/thread)"] == ("80.00x", True)
    text = report.figures_table(summary)
    assert "W5 throughput" in text and "W5 every window's sums exact, once" in text


def test_w4r_loads_every_key_once_then_updates_distinct_keys_at_its_rate() -> None:
    from bench.systems.w4r_records import Pacer, W4rRecords

    records = W4rRecords(keys=1000, update_fraction=0.01, update_s=5.5, parallelism=2)
    assert (records.rate, records.updates, records.records) == (10, 56, 1056)  # 55, rounded up to 2 x 28
    # two contiguous splits of the numbers read as two interleaved strides of the records
    read = [records.strided(n) for n in range(records.records)]
    assert sorted(read) == list(range(records.records))
    assert read[:3] == [0, 2, 4] and read[records.records // 2 : records.records // 2 + 2] == [1, 3]
    assert [records.key(p) for p in range(records.keys)] == list(range(records.keys))
    updated = [records.key(p) for p in range(records.keys, records.records)]
    assert len(set(updated)) == records.updates and updated[:2] == [0, 1_000_003 % 1000]
    assert records.value(1234)[:8] == (1234).to_bytes(8, "big") and len(records.value(1234)) == 100
    assert records.value(records.keys + 1) > records.value(5)  # the latest value is the largest
    assert records.text_value(42) == "42|" + "x" * 97
    with pytest.raises(ValueError, match="twice"):
        W4rRecords(keys=100, update_fraction=0.5, update_s=3)

    now = [100.0]
    pacer = Pacer(records, lambda: now[0])
    assert pacer.due_until(records.keys - 4, 2, 50) == 2 + 1  # the load's last two, the first update
    assert pacer.wait_s(records.keys + 2) == pytest.approx(0.2)  # subtask 0's next: 2 records of 10/s later
    now[0] += 0.45
    assert pacer.due_until(records.keys + 2, 2, 50) == 2  # due at +0.2 and +0.4, not +0.6


def test_w4r_figures_are_over_the_checkpoints_of_the_steady_update_phase() -> None:
    from bench.systems.w4r_records import PhaseNotes, Phases, W4rRecords, figures

    records = W4rRecords(keys=1000, update_fraction=0.01, update_s=5.0, parallelism=2)
    notes = [PhaseNotes(records.keys), PhaseNotes(records.keys)]
    for p in range(records.records):
        notes[p % 2].observe(p, 10.0 + p / 500 if p < records.keys else 13.0 + (p - records.keys) / 10)
    phases = Phases.merge([n.to_json() for n in notes])
    assert (phases.load_first, phases.load_last, phases.update_last) == (10.0, 11.998, 17.9)

    def checkpoint(at_s: float, duration: float, uploaded: int, full: int = 1000) -> dict[str, float]:
        return {
            "trigger_ms": at_s * 1000,
            "duration_ms": duration,
            "uploaded_bytes": uploaded,
            "full_bytes": full,
        }

    found = figures(
        records,
        phases,
        [
            checkpoint(12.5, 900, 800),  # after the load, within an interval of it: its tail
            checkpoint(13.1, 30, 20),
            checkpoint(14.1, 50, 40),
            checkpoint(15.1, 40, 600),  # a compaction
            checkpoint(17.95, 10, 10),  # after the last update: the job's final one
        ],
        interval_ms=1000,
    )

    assert found["checkpoints_measured"] == 3 and found["checkpoints_completed"] == 5
    assert (found["checkpoint_p50_ms"], found["checkpoint_max_ms"]) == (40.0, 50.0)
    assert (found["uploaded_p50_bytes"], found["uploaded_max_bytes"], found["uploaded_mean_bytes"]) == (
        40.0,
        600.0,
        220.0,
    )
    assert found["uploaded_fraction_p50"] == pytest.approx(0.04)
    assert found["load_records_per_s"] == pytest.approx(1000 / 1.998)
    assert found["update_records_per_s"] == pytest.approx(50 / 4.9)
    with pytest.raises(RuntimeError, match="no checkpoint was triggered during"):
        figures(records, phases, [checkpoint(12.5, 900, 800)], interval_ms=1000)
    with pytest.raises(RuntimeError, match="loaded 999 of 1000 keys"):
        figures(records, replace(phases, load_count=999), [], interval_ms=1000)


def test_w4r_runs_chandy_on_rocksdb_beside_the_references_with_a_rocksdb_state() -> None:
    from bench.suite import FULL, parse_systems, plan

    every = parse_systems("chandy,spark_ss,bytewax,pyflink", quick=False)
    assert [(c.system, c.variant) for c in plan(every, ["w4r"], with_no_checkpoint_baseline=True)] == [
        ("chandy", "rocksdb"),
        ("spark_ss", "groupby"),
        ("pyflink", "thread"),
    ]
    assert [c.variant for c in plan(parse_systems("chandy", quick=True), ["w4r"], True)] == ["rocksdb"]
    assert [c.variant for c in plan(parse_systems("chandy:local", quick=True), ["w4r"], True)] == ["local"]
    assert FULL.arguments("chandy", "rocksdb", "w4r")[:2] == ["--records", "10000000"]
    assert FULL.arguments("pyflink", "thread", "w4r")[:2] == ["--records", "1000000"]


def test_rocksdb_targets_hold_w4r_to_the_issue_and_w1_on_rocksdb_to_half_the_heap() -> None:
    def row(variant: str, workload: str, **figures: float) -> dict[str, object]:
        return {
            "system": "chandy",
            "variant": variant,
            "workload": workload,
            "run": 1,
            "ok": True,
            "checkpoint_interval_ms": 1000,
            **figures,
        }

    rows = [
        row("spark", "w1", records=1000, records_per_s=3.0e6),
        row("rocksdb", "w1", records=1000, records_per_s=1.2e6),
        row(
            "rocksdb",
            "w4r",
            keys=10_000_000,
            checkpoint_p50_ms=150.0,
            uploaded_fraction_p50=0.08,
            uploaded_p50_bytes=4e6,
        ),
        {**row("thread", "w4r", keys=1_000_000, uploaded_p50_bytes=1e6), "system": "pyflink"},
    ]

    summary = report.summarize(rows)
    checks = {c["target"]: (c["measured"], c["met"]) for c in report.targets(summary)}

    assert checks["W4r incremental checkpoint p50 <= 200 ms (chandy/rocksdb)"] == ("150 ms", True)
    assert checks["W4r uploaded per checkpoint (p50) <= 5% of the full size"] == ("8.00%", False)
    assert checks["W1 on RocksDB >= 0.5x the heap's (chandy/rocksdb / chandy/spark)"] == ("0.40x", False)
    # bytes uploaded scale with the keys updated per second: compared per key
    assert report.ratios(summary)["chandy/rocksdb"]["pyflink/thread"][
        "w4r_uploaded_p50_bytes"
    ] == pytest.approx(2.5)
    assert "W4r uploaded p50 / full size" in report.figures_table(summary)


class _ManualClock:
    """``time.monotonic`` for the W6 pacers, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_w6_source_never_forgives_what_it_was_held_back_and_the_sink_holds_half_its_rate() -> None:
    from bench.systems.w6_records import W6Plan

    plan = W6Plan(source_rate=10_000, duration_s=40, parallelism=2)
    assert (plan.sink_rate, plan.records) == (5_000, 200_000)  # 40 s at the sinks
    clock = _ManualClock()
    source = plan.source_pacer(clock)  # 5,000 records/s per subtask
    assert source.due(0, 1024) == 1  # the first record at once
    clock.now += 0.01
    assert source.due(1, 1024) == 50  # records 1..50 due within 10 ms
    clock.now += 2.0  # held back by backpressure for 2 s: 10,000 records overdue
    assert source.due(51, 1024) == 1024  # full batches, nothing forgiven
    assert source.behind_s(1075) == pytest.approx(2.01 - 1074 / 5_000)
    sink = plan.sink_pacer(clock)  # 2,500 records/s per subtask
    sink.start()
    assert sink.wait_s(500) == pytest.approx(0.2)  # 500 records are due over 0.2 s
    clock.now += 0.3
    assert sink.wait_s(500) == 0.0  # behind its pace: no sleep


def _w6_checkpoint(
    checkpoint_id: int, trigger_s: float, duration_ms: int, **extra: object
) -> dict[str, object]:
    return {"id": checkpoint_id, "trigger_ms": trigger_s * 1000, "duration_ms": duration_ms, **extra}


def test_w6_figures_are_over_the_checkpoints_taken_while_the_sources_were_held_back() -> None:
    from bench.systems.w6_records import W6Plan, figures, unaligned_of

    plan = W6Plan(source_rate=1_000, duration_s=10, parallelism=2)  # 5,000 records
    sources = [{"first": 999.0, "last": 1005.0, "count": 2_500, "behind_s": 4.0}] * 2
    sinks = [{"first": 1000.0, "last": 1010.0, "count": 2_500, "behind_s": 0.0}] * 2
    checkpoints = [
        _w6_checkpoint(1, 999.5, 5, unaligned=True, persisted_bytes=10),  # before the first record
        _w6_checkpoint(2, 1001.0, 300, unaligned=True, persisted_bytes=4_000),
        _w6_checkpoint(3, 1002.0, 100, unaligned=True, persisted_bytes=2_000),
        _w6_checkpoint(4, 1003.0, 200, unaligned=False, persisted_bytes=0),
        _w6_checkpoint(5, 1008.0, 9, unaligned=True, persisted_bytes=1),  # the backlog draining
    ]

    found = figures(plan, sources, sinks, checkpoints)

    assert found["records_per_s"] == pytest.approx(500.0)  # half the source rate
    assert (found["checkpoints_completed"], found["checkpoints_under_backpressure"]) == (5, 3)
    assert (found["checkpoint_p50_ms"], found["checkpoint_p99_ms"]) == (200.0, 300.0)
    assert found["unaligned_checkpoints"] == 2
    assert (found["persisted_p50_bytes"], found["persisted_max_bytes"]) == (2_000.0, 4_000.0)
    assert [c["trigger_s"] for c in found["checkpoints"]] == [1.0, 2.0, 3.0]
    assert found["source_behind_s"] == 4.0
    # a system that reports neither leaves the figures out instead of claiming 0
    bare = [
        {"id": c["id"], "trigger_ms": c["trigger_ms"], "duration_ms": c["duration_ms"]} for c in checkpoints
    ]
    assert figures(plan, sources, sinks, bare)["unaligned_checkpoints"] is None
    assert figures(plan, sources, sinks, bare)["persisted_p50_bytes"] is None
    with pytest.raises(RuntimeError, match="the sinks saw 4999 records, expected 5000"):
        figures(plan, sources, [sinks[0], {**sinks[1], "count": 2_499}], checkpoints)
    with pytest.raises(RuntimeError, match="no checkpoint was triggered while the sources were held back"):
        figures(plan, sources, sinks, checkpoints[:1])
    # Flink's REST history names the kind; chandy may also say is_unaligned
    assert unaligned_of({"checkpoint_type": "UNALIGNED_CHECKPOINT"}) is True
    assert unaligned_of({"checkpoint_type": "CHECKPOINT"}) is False
    assert unaligned_of({"is_unaligned": True, "checkpoint_type": "CHECKPOINT"}) is True
    assert unaligned_of({}) is None


def test_w6_runs_aligned_and_unaligned_on_chandy_and_pyflink_only() -> None:
    from bench.suite import FULL, QUICK, parse_systems, plan

    every = parse_systems("chandy,spark_ss,bytewax,pyflink", quick=False)
    assert [(c.system, c.variant) for c in plan(every, ["w6"], with_no_checkpoint_baseline=True)] == [
        ("chandy", "spark"),
        ("chandy", "unaligned"),
        ("pyflink", "thread"),
        ("pyflink", "unaligned"),
    ]
    assert plan(parse_systems("chandy:local", quick=True), ["w6"], True) == []
    assert FULL.arguments("pyflink", "unaligned", "w6") == ["--rate", "10000", "--duration-s", "40"]
    assert QUICK.arguments("chandy", "unaligned", "w6")[-1] == "10"


def _row(
    system: str, variant: str, workload: str, run: int = 1, interval: int = 1000, **figures: object
) -> dict[str, object]:
    """A successful run's row as the suite saves it."""
    return {
        "system": system,
        "variant": variant,
        "workload": workload,
        "run": run,
        "ok": True,
        "checkpoint_interval_ms": interval,
        **figures,
    }


def test_unaligned_targets_pair_w1_runs_and_w6_ratios_compare_like_with_like() -> None:
    row = _row

    w6 = {"records": 200_000, "checkpoints_under_backpressure": 10}
    rows = [
        row("chandy", "spark", "w1", 1, records=1000, records_per_s=3.0e6, task_cpu_us_per_record=0.50),
        row("chandy", "unaligned", "w1", 1, records=1000, records_per_s=2.94e6, task_cpu_us_per_record=0.51),
        row("chandy", "spark", "w1", 2, records=1000, records_per_s=2.0e6, task_cpu_us_per_record=0.50),
        row("chandy", "unaligned", "w1", 2, records=1000, records_per_s=1.8e6, task_cpu_us_per_record=0.55),
        row("chandy", "spark", "w6", **w6, checkpoint_p99_ms=3300.0, unaligned_checkpoints=0),
        row("chandy", "unaligned", "w6", **w6, checkpoint_p99_ms=80.0, unaligned_checkpoints=10),
        row("pyflink", "thread", "w6", **w6, checkpoint_p99_ms=6600.0, unaligned_checkpoints=0),
        row("pyflink", "unaligned", "w6", **w6, checkpoint_p99_ms=40.0, unaligned_checkpoints=9),
    ]

    summary = report.summarize(rows)
    checks = {c["target"]: (c["measured"], c["met"]) for c in report.targets(summary)}

    # paired per run: 2 % and 10 % lost, median 6 %
    assert summary["chandy/unaligned"]["w1_unaligned_overhead"] == pytest.approx(0.06)
    assert summary["chandy/unaligned"]["w1_unaligned_cpu_overhead"] == pytest.approx((0.02 + 0.10) / 2)
    assert checks[
        "W1 unaligned checkpoints cost <= 5% throughput against aligned (chandy/unaligned vs chandy/spark)"
    ] == ("6.0%", False)
    assert checks["W6 unaligned checkpoint p99 under backpressure <= 1000 ms (chandy/unaligned)"] == (
        "80 ms (10 of 10 unaligned)",
        True,
    )
    assert checks["W6 aligned checkpoints wait for the backlog: p99 > 1000 ms (chandy/spark)"] == (
        "3300 ms",
        True,
    )
    ratios = report.ratios(summary)
    assert ratios["chandy/spark"]["pyflink/thread"]["w6_checkpoint_p99_ms"] == pytest.approx(2.0)
    assert ratios["chandy/unaligned"]["pyflink/unaligned"]["w6_checkpoint_p99_ms"] == pytest.approx(0.5)
    assert "w6_checkpoint_p99_ms" not in ratios["chandy/unaligned"]["pyflink/thread"]  # unaligned vs aligned
    text = report.figures_table(summary)
    assert "W6 checkpoints under backpressure that were unaligned" in text and "9 of 10" in text


def test_w1v_runs_on_chandy_only_and_is_compared_with_the_references_w1() -> None:
    from bench.suite import FULL, parse_systems, plan

    chosen = parse_systems("chandy:spark,spark_ss:groupby", quick=False)
    cases = plan(chosen, ["w1", "w1v", "w3v"], with_no_checkpoint_baseline=True)
    assert [(c.system, c.workload, c.checkpoint_interval_ms) for c in cases] == [
        ("chandy", "w1", 1000),
        ("chandy", "w1", 0),
        ("spark_ss", "w1", 1000),
        ("spark_ss", "w1", 0),
        ("chandy", "w1v", 1000),
        ("chandy", "w1v", 0),
        ("chandy", "w3v", 1000),
    ]
    assert FULL.arguments("chandy", "spark", "w1v") == ["--records", "300000000"]
    assert FULL.arguments("chandy", "spark", "w3v") == ["--rate", "1000", "--duration-s", "30"]

    def row(
        system: str, variant: str, workload: str, run: int, interval: int, **figures: object
    ) -> dict[str, object]:
        return _row(system, variant, workload, run, interval, records=1000, **figures)

    rows = [
        row("chandy", "spark", "w1", 1, 1000, records_per_s=3.0e6),
        row("chandy", "spark", "w1v", 1, 1000, records_per_s=33.0e6, task_cpu_us_per_record=0.055),
        row("chandy", "spark", "w1v", 1, 0, records_per_s=34.0e6, task_cpu_us_per_record=0.050),
        row("chandy", "spark", "w1v", 2, 1000, records_per_s=20.0e6, task_cpu_us_per_record=0.060),
        row("chandy", "spark", "w1v", 2, 0, records_per_s=40.0e6, task_cpu_us_per_record=0.050),
        row("chandy", "spark", "w3v", 1, 1000, latency_p50_ms=1.0, latency_p99_ms=4.0),
        row("spark_ss", "groupby", "w1", 1, 1000, records_per_s=11.0e6, latency_p99_ms=800.0),
        row("spark_ss", "groupby", "w3", 1, 1000, latency_p50_ms=500.0, latency_p99_ms=800.0),
    ]

    summary = report.summarize(rows)
    part = summary["chandy/spark"]
    # paired per run: 1 - 33/34 and 1 - 20/40, median of the two
    assert part["w1v_checkpoint_overhead"] == pytest.approx(((1 - 33 / 34) + 0.5) / 2)
    assert part["w1v_task_cpu_us_per_record"]["median"] == pytest.approx(0.0575)
    assert "checkpoint_overhead" not in part  # W1 had no run without checkpoints
    ratios = report.ratios(summary)["chandy/spark"]["spark_ss/groupby"]
    assert ratios["w1v_records_per_s"] == pytest.approx(26.5 / 11)  # against Spark's W1
    assert ratios["records_per_s"] == pytest.approx(3 / 11)
    assert ratios["w3v_latency_p99_ms"] == pytest.approx(200.0)
    checks = {c["target"]: (c["measured"], c["met"]) for c in report.targets(summary)}
    assert checks["W1v >= 3x spark_ss's W1 (best variant: spark_ss/groupby)"] == ("2.41x", False)
    assert checks["W1v >= 30 M records/s"] == ("26.50 M records/s", False)
    assert checks["W1v checkpoint overhead <= 2%"][1] is False
    assert checks["W3v latency p99 <= 5 ms"] == ("4 ms", True)
    text = report.figures_table(summary) + report.ratios_table(summary)
    assert "W1v checkpoint overhead" in text and "W1v task CPU per record without checkpoints" in text
    assert "W1v throughput (batch path) vs the reference's W1 throughput" in text


def test_the_profile_on_the_cpu_clock_counts_no_waiting(tmp_path: Path) -> None:
    """``python -m bench.profile --cpu-clock --checkpoint-path``: every thread timed by its own
    CPU clock, so the main thread waiting for the job's end, and the tasks waiting for input,
    count (almost) nothing; on the wall clock they dominate. The checkpoint path is listed."""
    areas: dict[bool, float] = {}
    for cpu_clock in (False, True):
        stats, run = profiled_run(2_000_000, 1, 100, 20, cpu_clock=cpu_clock)
        by = by_area(stats)
        areas[cpu_clock] = by.get("threads: waits and locks", 0.0) / sum(by.values())
        lines = checkpoint_path(stats, run["checkpoints"])
        assert lines[0] == f"checkpoint path ({run['checkpoints']} checkpoints completed), cumulative:"
    assert areas[True] < 0.2 < areas[False], areas


def test_w5v_runs_on_chandy_only_and_is_compared_with_the_references_w5() -> None:
    from bench.suite import FULL, parse_systems, plan

    chosen = parse_systems("chandy:spark,spark_ss:groupby", quick=False)
    cases = plan(chosen, ["w5", "w5v"], with_no_checkpoint_baseline=True)
    assert [(c.system, c.workload, c.checkpoint_interval_ms) for c in cases] == [
        ("chandy", "w5", 1000),
        ("spark_ss", "w5", 1000),
        ("chandy", "w5v", 1000),
    ]
    assert FULL.arguments("chandy", "spark", "w5v") == [
        "--records",
        "30000000",
        "--per-event-second",
        "100000",
    ]
    rows = [
        _row("chandy", "spark", "w5", 1, 1000, records=1000, records_per_s=1.0e6, exact=True),
        _row("chandy", "spark", "w5v", 1, 1000, records=1000, records_per_s=4.0e6, exact=True),
        _row("spark_ss", "groupby", "w5", 1, 1000, records=1000, records_per_s=0.5e6, exact=True),
    ]
    summary = report.summarize(rows)
    assert summary["chandy/spark"]["w5v_exact_runs"] == "1 of 1"
    ratios = report.ratios(summary)["chandy/spark"]["spark_ss/groupby"]
    assert ratios["w5v_records_per_s"] == pytest.approx(8.0)  # against Spark's W5
    checks = {c["target"]: (c["measured"], c["met"]) for c in report.targets(summary)}
    assert checks["W5v >= 3x spark_ss's W5 (best variant: spark_ss/groupby)"] == ("8.00x", True)
    assert checks["W5v >= 3.3 M records/s"] == ("4.00 M records/s", True)
    text = report.figures_table(summary) + report.ratios_table(summary)
    assert "W5v throughput (batch path) vs the reference's W5 throughput" in text
    assert "W5v every window's sums exact, once" in text
