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
    w1.add_argument("--executor", default="local")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from bench.w1 import as_row, run_w1

    rows = [as_row(run_w1(args.records, args.parallelism, args.executor)) for _ in range(args.runs)]
    rates = [r["records_per_s"] for r in rows]
    summary = {"workload": "W1", "machine": _machine(), "runs": rows,
               "median_records_per_s": statistics.median(rates),
               "min_records_per_s": min(rates), "max_records_per_s": max(rates)}
    print(json.dumps(summary, indent=2))
    print()
    print(_table(rows, ["system", "executor", "records", "parallelism", "records_per_s",
                        "first_to_last_s", "wall_s"]))
    print(f"\nmedian {summary['median_records_per_s']:,.0f} records/s "
          f"(min {summary['min_records_per_s']:,.0f}, max {summary['max_records_per_s']:,.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
