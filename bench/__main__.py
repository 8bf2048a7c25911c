"""``python -m bench w1 [--records N] [--runs R]``: run a workload, print JSON and a table."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.suite import WORKLOADS

log = logging.getLogger("bench")


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in columns}
    lines = [" | ".join(c.ljust(widths[c]) for c in columns), "-|-".join("-" * widths[c] for c in columns)]
    lines += [" | ".join(_fmt(r[c]).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:.3f}"
    return str(value)


def _machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "platform": platform.platform(),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    sub = parser.add_subparsers(dest="workload", required=True)
    w1 = sub.add_parser("w1", help="keyed running count (ValueState sum)")
    w1.add_argument("--records", type=int, default=2_000_000)
    w1.add_argument("--runs", type=int, default=3)
    w1.add_argument("--parallelism", type=int, default=2)
    w1.add_argument(
        "--executor", default="local", help="local, spark, or both (local,spark) in one interleaved run"
    )
    w1.add_argument(
        "--checkpoint-interval",
        type=int,
        default=None,
        metavar="MS",
        help="also run with checkpoints every MS ms (interleaved with runs without) "
        "and report the overhead and checkpoint durations",
    )
    w1.add_argument(
        "--batch",
        action="store_true",
        help="W1v, W1 on the batch path (records as Arrow batches, running_sum), instead of W1",
    )
    failover = sub.add_parser("failover", help="recovery time after a raised exception / SIGKILL")
    failover.add_argument("--runs", type=int, default=3)
    failover.add_argument("--executors", default="local,spark")
    failover.add_argument("--kills", type=int, default=5, help="slot process kills (in one Spark job)")
    failover.add_argument("--master", default=None, help="Spark master, e.g. 'local-cluster[2,1,1024]'")
    failover.add_argument(
        "--standalone",
        type=int,
        default=0,
        metavar="WORKERS",
        help="start a Spark standalone cluster of WORKERS one-core workers on loopback and run on it",
    )
    failover.add_argument("--jvm-kills", type=int, default=0, help="executor JVM kills (in one Spark job)")
    failover.add_argument("--worker-kills", type=int, default=0, help="with --standalone: worker kills")
    failover.add_argument("--supervisor-kills", type=int, default=2, help="Spark task (supervisor) kills")
    suite = sub.add_parser(
        "run",
        help="every workload on chandy and the reference systems, "
        "side by side (installs the references under bench/.cache)",
    )
    suite.add_argument(
        "--quick", action="store_true", help="small sizes, one run, each system's main variant (< 5 minutes)"
    )
    suite.add_argument(
        "--systems",
        default="chandy,spark_ss,bytewax,pyflink,flink_sql,pathway",
        help="systems, or system:variant, comma-separated",
    )
    suite.add_argument("--workloads", default=",".join(WORKLOADS))
    suite.add_argument("--runs", type=int, default=None, help="default 3, or 1 with --quick")
    suite.add_argument("--parallelism", type=int, default=2)
    suite.add_argument(
        "--records",
        type=int,
        default=None,
        help="records of W1, W1v, W2, W5 and W5v (rounded up to whole windows) and keys of W4 and W4r, "
        "for every system",
    )
    suite.add_argument(
        "--w1v-records", type=int, default=None, help="records of W1v (after --records; default 300 M)"
    )
    suite.add_argument("--duration-s", type=float, default=None, help="length of W3 and W3v")
    suite.add_argument(
        "--update-s", type=float, default=None, help="length of W4r's updates (1 %% of the keys per second)"
    )
    suite.add_argument(
        "--w6-duration-s",
        type=float,
        default=None,
        help="length of W6 at its throttled sinks (the source emits at twice their rate)",
    )
    suite.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    suite.add_argument("--results-dir", type=Path, default=Path(__file__).parent / "results")
    suite.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="PARTIAL",
        help="finish an interrupted run: the rows its .partial.jsonl file holds "
        "are kept, the rest run (give the same options as the first time)",
    )
    suite.add_argument(
        "--markdown",
        type=Path,
        default=None,
        help="where the Markdown report goes (default bench/RESULTS.md for a full run; none for --quick)",
    )
    from bench import storage as storage_bench

    storage_bench.add_parser(sub)
    rerender = sub.add_parser(
        "report",
        help="recompute the summary, ratios, targets and "
        "Markdown of a suite run from its results JSON (no rerun)",
    )
    rerender.add_argument(
        "results",
        type=Path,
        nargs="+",
        help="a bench/results/<date>.json; with several, each workload's "
        "figures come from the last file that measured it",
    )
    rerender.add_argument("--markdown", type=Path, default=Path(__file__).parent / "RESULTS.md")
    rerender.add_argument(
        "--chart",
        type=Path,
        default=None,
        help="where the SVG bar chart of the side-by-side goes (default: results.svg beside the Markdown)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    if args.workload == "failover":
        return _failover(args)
    if args.workload == "run":
        return _run_suite(args, argv)
    if args.workload == "report":
        return _rerender(args.results, args.markdown, args.chart)
    if args.workload == "storage":
        return storage_bench.main(args)

    from bench.w1 import as_row, run_w1

    executors = args.executor.split(",")
    variants = [None] if args.checkpoint_interval is None else [None, args.checkpoint_interval]
    workload = "W1v" if args.batch else "W1"
    rows = []
    for run in range(args.runs):  # interleaved, so load changes hit every variant alike
        for executor in executors:
            # Every other run the other way round (A B, B A, ...): a drift of the machine's
            # speed, or a run that profits from the one before it, hits both variants alike.
            for interval in variants if run % 2 == 0 else variants[::-1]:
                row = as_row(
                    run_w1(
                        args.records,
                        args.parallelism,
                        executor,
                        checkpoint_interval_ms=interval,
                        batch=args.batch,
                    )
                )
                rows.append({**row, "run": run, "workload": workload.lower(), "ok": True})
    summary: dict[str, Any] = {"workload": workload, "machine": _machine(), "runs": rows}
    print_lines = []
    for executor in executors:
        mine = [r for r in rows if r["executor"] == executor]
        part: dict[str, Any] = {}
        for interval in variants:
            rates = [r["records_per_s"] for r in mine if r["checkpoint_interval_ms"] == interval]
            key = "without_checkpoints" if interval is None else f"checkpoints_every_{interval}ms"
            part[key] = {
                "median_records_per_s": statistics.median(rates),
                "min_records_per_s": min(rates),
                "max_records_per_s": max(rates),
            }
        base = part["without_checkpoints"]
        print_lines.append(
            f"{executor}: without checkpoints median "
            f"{base['median_records_per_s']:,.0f} records/s (min "
            f"{base['min_records_per_s']:,.0f}, max {base['max_records_per_s']:,.0f})"
        )
        if args.checkpoint_interval is not None:
            with_cp = [r for r in mine if r["checkpoint_interval_ms"]]
            checked = part[f"checkpoints_every_{args.checkpoint_interval}ms"]["median_records_per_s"]
            part["checkpoint_overhead_of_medians"] = 1 - checked / base["median_records_per_s"]
            part.update(paired_overhead(mine, workload.lower()))
            part["checkpoint_p50_ms_median"] = statistics.median(r["checkpoint_p50_ms"] for r in with_cp)
            part["checkpoint_p99_ms_max"] = max(r["checkpoint_p99_ms"] for r in with_cp)
            part["checkpoints_completed_total"] = sum(r["checkpoints_completed"] for r in with_cp)
            print_lines.append(
                f"{executor}: checkpoints every {args.checkpoint_interval} ms: overhead "
                f"{part['checkpoint_overhead']:.1%} (median of {len(part['checkpoint_overhead_runs'])} "
                f"pairs, each between {min(part['checkpoint_overhead_runs']):.1%} and "
                f"{max(part['checkpoint_overhead_runs']):.1%}), task CPU "
                f"{part['checkpoint_cpu_overhead']:+.1%} a record; checkpoint p50 "
                f"{part['checkpoint_p50_ms_median']:.0f} ms, p99 {part['checkpoint_p99_ms_max']:.0f}"
                f" ms ({part['checkpoints_completed_total']} checkpoints)"
            )
        summary[executor] = part
    if len(executors) == 2:
        a, b = executors
        ratio = (
            summary[b]["without_checkpoints"]["median_records_per_s"]
            / summary[a]["without_checkpoints"]["median_records_per_s"]
        )
        summary[f"{b}_over_{a}"] = ratio
        print_lines.append(f"{b} / {a} throughput: {ratio:.2f}x")
    print(json.dumps(summary, indent=2))
    print()
    print(
        _table(
            rows,
            [
                "system",
                "executor",
                "records",
                "parallelism",
                "run",
                "checkpoint_interval_ms",
                "records_per_s",
                "task_cpu_us_per_record",
                "first_to_last_s",
                "checkpoints_completed",
                "checkpoint_p50_ms",
                "checkpoint_p99_ms",
            ],
        )
    )
    print()
    print("\n".join(print_lines))
    return 0


def paired_overhead(rows: list[dict[str, Any]], workload: str) -> dict[str, Any]:
    """The checkpoint overhead of ``python -m bench w1``'s runs of one executor: each run is
    a pair (one job with checkpoints beside one without, in the same process; paired as the
    suite's report pairs them, :func:`bench.report.paired_runs`), and the overhead is the
    median over the pairs of the throughput each lost (``..._runs`` every pair's), and of the
    extra task CPU per record each spent."""
    from bench.report import paired_runs

    losses = [1 - c / u for c, u in paired_runs(rows, "records_per_s", workload)]
    cpu = [c / u - 1 for c, u in paired_runs(rows, "task_cpu_us_per_record", workload)]
    return {
        "checkpoint_overhead": statistics.median(losses),
        "checkpoint_overhead_runs": losses,
        "checkpoint_cpu_overhead": statistics.median(cpu),
        "checkpoint_cpu_overhead_runs": cpu,
    }


def _failover(args: argparse.Namespace) -> int:
    from bench.failover import run, summary_lines

    rows, cases = run(
        args.executors.split(","),
        args.runs,
        args.kills,
        args.supervisor_kills,
        master=args.master,
        standalone_workers=args.standalone,
        jvm_kills=args.jvm_kills,
        worker_kills=args.worker_kills,
    )
    summary: dict[str, Any] = {"workload": "failover", "machine": _machine(), "runs": rows, "cases": cases}
    print(json.dumps(summary, indent=2))
    print()
    print(_table(rows, ["executor", "failure", "recovery_s", "new_stage"]))
    print("\n".join(summary_lines(cases)))
    return 0


def _run_suite(args: argparse.Namespace, argv: list[str]) -> int:
    from bench import report, suite
    from bench.envs import installed_version

    sizes = suite.QUICK if args.quick else suite.FULL
    if args.records is not None:
        sizes = replace(
            sizes,
            w1_records=args.records,
            w1v_records=args.records,
            w5v_records=args.records,
            w2_records=args.records,
            w4_keys=args.records,
            w4r_keys=args.records,
            w5_records=args.records,
            w1_records_of={},
            w5_records_of={},
            slow_system_divisor={},
        )
    if args.w1v_records is not None:
        sizes = replace(sizes, w1v_records=args.w1v_records)
    if args.duration_s is not None:
        sizes = replace(sizes, w3_duration_s=args.duration_s)
    if args.update_s is not None:
        sizes = replace(sizes, w4r_update_s=args.update_s)
    if args.w6_duration_s is not None:
        sizes = replace(sizes, w6_duration_s=args.w6_duration_s)
    systems = suite.parse_systems(args.systems, args.quick)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    planned = [w for w in workloads if w in suite.PLANNED_WORKLOADS]
    if planned:
        raise SystemExit(f"not run: {suite.PLANNED_WORKLOADS[planned[0]]}")
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown workloads {sorted(unknown)}; use {', '.join(WORKLOADS)}")
    runs = args.runs or (1 if args.quick else 3)
    cases = suite.plan(systems, workloads, with_no_checkpoint_baseline=True)
    load_before = os.getloadavg()[0]
    now = datetime.now(UTC)
    name = now.strftime("%Y-%m-%d-%H%M") + ("-quick" if args.quick else "")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    partial = args.resume or args.results_dir / f"{name}.partial.jsonl"
    done = _read_partial(args.resume) if args.resume else []
    if args.resume:
        log.warning("Resuming %s: %d runs done", args.resume, len(done))
    with partial.open("a") as sink:  # every run as it ends, so a stop loses one run at most

        def keep(row: dict[str, Any]) -> None:
            sink.write(json.dumps(row) + "\n")
            sink.flush()

        rows = suite.run_suite(cases, runs, sizes, args.parallelism, args.timeout_s, on_row=keep, done=done)
    loads = [r["load_avg_1m_before"] for r in rows]
    results = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench run " + " ".join(argv[1:]),
        "runs": runs,
        "parallelism": args.parallelism,
        "sizes": sizes.__dict__,
        "machine": {
            **_machine(),
            "java": _java_version(),
            "load_avg_1m_before": load_before,
            "load_avg_1m_after": os.getloadavg()[0],
            "load_avg_1m_min": min(loads),
            "load_avg_1m_max": max(loads),
        },
        "versions": {system: installed_version(system) for system in dict.fromkeys(s for s, _ in systems)},
        **report.analysis(rows),
        "rows": rows,
    }
    json_path = args.results_dir / f"{name}.json"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    partial.unlink()
    markdown = args.markdown or (None if args.quick else Path(__file__).parent / "RESULTS.md")
    text = _write_report(results, markdown, None) if markdown is not None else report.markdown(results)
    print(json.dumps({k: results[k] for k in ("summary", "ratios", "targets")}, indent=2))
    print()
    print(text)
    logging.warning("Results: %s%s", json_path, f" and {markdown}" if markdown else "")
    return 0


def _read_results(path: Path) -> dict[str, Any]:
    try:
        results = json.loads(path.read_text())
        results["rows"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"{path}: not a suite results file ({exc}); give a "
            "bench/results/<date>.json written by 'python -m bench run'"
        ) from None
    return results


def _rerender(paths: list[Path], markdown: Path, chart: Path | None = None) -> int:
    """One file: its analysis and Markdown anew (the file is rewritten). Several: one
    report combining them, each workload from the last file that measured it (the
    files are not changed). Either way the side-by-side is drawn as an SVG bar chart
    (``chart``, default ``results.svg`` beside the Markdown), which the Markdown shows,
    and what the Markdown holds below its hand-written marker is kept."""
    from bench import report

    runs = [(path, _read_results(path)) for path in paths]
    if len(runs) == 1:
        [(path, results)] = runs
        results.update(report.analysis(results["rows"]))
        path.write_text(json.dumps(results, indent=2) + "\n")
    else:
        results = report.combine([(str(path), results) for path, results in runs])
    text = _write_report(results, markdown, chart)
    print(text)
    logging.warning("Wrote %s%s", markdown, f" and {paths[0]}" if len(paths) == 1 else "")
    return 0


def _write_report(results: dict[str, Any], markdown: Path, chart: Path | None) -> str:
    """Write the Markdown report and the chart it shows (default ``results.svg`` beside it;
    none when no reference system was measured), keeping the Markdown's hand-written part."""
    from bench import chart as bar_chart
    from bench import report

    chart = chart or markdown.with_name("results.svg")
    try:
        svg = bar_chart.svg(results["summary"], f"chandy and the reference systems, {results['date']}")
    except ValueError as exc:
        logging.warning("No chart: %s", exc)
        shown = None
    else:
        chart.write_text(svg)
        shown = os.path.relpath(chart, markdown.parent)
        logging.warning("Wrote %s", chart)
    text = report.markdown(results, chart=shown)
    text += report.hand_written(markdown.read_text() if markdown.is_file() else "")
    markdown.write_text(text)
    return text


def _read_partial(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise SystemExit(
            f"--resume {path}: no such file; give the .partial.jsonl that the "
            "interrupted run left in the results directory"
        )
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--resume {path}: not a partial results file ({exc})") from None


def _java_version() -> str:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        return f"java not found ({exc})"
    return (done.stderr or done.stdout).splitlines()[0].strip()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
