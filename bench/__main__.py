"""``python -m bench w1 [--records N] [--runs R]``: run a workload, print JSON and a table."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
from typing import Any


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in columns}
    lines = [" | ".join(c.ljust(widths[c]) for c in columns),
             "-|-".join("-" * widths[c] for c in columns)]
    lines += [" | ".join(_fmt(r[c]).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:.3f}"
    return str(value)


def _machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0], "platform": platform.platform()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    sub = parser.add_subparsers(dest="workload", required=True)
    w1 = sub.add_parser("w1", help="keyed running count (ValueState sum)")
    w1.add_argument("--records", type=int, default=2_000_000)
    w1.add_argument("--runs", type=int, default=3)
    w1.add_argument("--parallelism", type=int, default=2)
    w1.add_argument("--executor", default="local",
                    help="local, spark, or both (local,spark) in one interleaved run")
    w1.add_argument("--checkpoint-interval", type=int, default=None, metavar="MS",
                    help="also run with checkpoints every MS ms (interleaved with runs without) "
                         "and report the overhead and checkpoint durations")
    failover = sub.add_parser("failover", help="recovery time after a raised exception / SIGKILL")
    failover.add_argument("--runs", type=int, default=3)
    failover.add_argument("--executors", default="local,spark")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.workload == "failover":
        return _failover(args)

    from bench.w1 import as_row, run_w1

    executors = args.executor.split(",")
    variants = [None] if args.checkpoint_interval is None else [None, args.checkpoint_interval]
    rows = []
    for _ in range(args.runs):  # interleaved, so load changes hit every variant alike
        for executor in executors:
            for interval in variants:
                rows.append(as_row(run_w1(args.records, args.parallelism, executor,
                                          checkpoint_interval_ms=interval)))
    summary: dict[str, Any] = {"workload": "W1", "machine": _machine(), "runs": rows}
    print_lines = []
    for executor in executors:
        mine = [r for r in rows if r["executor"] == executor]
        part: dict[str, Any] = {}
        for interval in variants:
            rates = [r["records_per_s"] for r in mine if r["checkpoint_interval_ms"] == interval]
            key = "without_checkpoints" if interval is None else f"checkpoints_every_{interval}ms"
            part[key] = {"median_records_per_s": statistics.median(rates),
                         "min_records_per_s": min(rates), "max_records_per_s": max(rates)}
        base = part["without_checkpoints"]
        print_lines.append(f"{executor}: without checkpoints median "
                           f"{base['median_records_per_s']:,.0f} records/s (min "
                           f"{base['min_records_per_s']:,.0f}, max {base['max_records_per_s']:,.0f})")
        if args.checkpoint_interval is not None:
            with_cp = [r for r in mine if r["checkpoint_interval_ms"]]
            checked = part[f"checkpoints_every_{args.checkpoint_interval}ms"]["median_records_per_s"]
            part["checkpoint_overhead"] = 1 - checked / base["median_records_per_s"]
            part["checkpoint_p50_ms_median"] = statistics.median(r["checkpoint_p50_ms"] for r in with_cp)
            part["checkpoint_p99_ms_max"] = max(r["checkpoint_p99_ms"] for r in with_cp)
            part["checkpoints_completed_total"] = sum(r["checkpoints_completed"] for r in with_cp)
            print_lines.append(
                f"{executor}: checkpoints every {args.checkpoint_interval} ms: overhead "
                f"{part['checkpoint_overhead']:.1%}, checkpoint p50 "
                f"{part['checkpoint_p50_ms_median']:.0f} ms, p99 {part['checkpoint_p99_ms_max']:.0f}"
                f" ms ({part['checkpoints_completed_total']} checkpoints)")
        summary[executor] = part
    if len(executors) == 2:
        a, b = executors
        ratio = (summary[b]["without_checkpoints"]["median_records_per_s"]
                 / summary[a]["without_checkpoints"]["median_records_per_s"])
        summary[f"{b}_over_{a}"] = ratio
        print_lines.append(f"{b} / {a} throughput: {ratio:.2f}x")
    print(json.dumps(summary, indent=2))
    print()
    print(_table(rows, ["system", "executor", "records", "parallelism", "checkpoint_interval_ms",
                        "records_per_s", "first_to_last_s", "checkpoints_completed",
                        "checkpoint_p50_ms", "checkpoint_p99_ms"]))
    print()
    print("\n".join(print_lines))
    return 0


def _failover(args: argparse.Namespace) -> int:
    from bench.failover import measure_recovery

    cases = [(e, f) for e in args.executors.split(",") for f in ("exception", "kill")
             if not (e == "local" and f == "kill")]
    rows = [measure_recovery(e, f) for _ in range(args.runs) for e, f in cases]
    summary: dict[str, Any] = {"workload": "failover", "machine": _machine(), "runs": rows}
    for executor, failure in cases:
        values = [r["recovery_s"] for r in rows if (r["executor"], r["failure"]) == (executor, failure)]
        summary[f"{executor}_{failure}_median_s"] = statistics.median(values)
    print(json.dumps(summary, indent=2))
    print()
    print(_table(rows, ["executor", "failure", "recovery_s"]))
    for executor, failure in cases:
        print(f"{executor} after {failure}: median {summary[f'{executor}_{failure}_median_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
