"""The examples the README tells users to run still run and give the right answer."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent


def test_kafka_to_parquet_example_commits_every_order_once(tmp_path: Path) -> None:
    """It starts its own broker, so it runs with no Kafka around, and owns that broker:
    the process ends only once the broker is stopped."""
    output = tmp_path / "out"
    records = 20_000
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "kafka_to_parquet.py"),
            "--executor",
            "local",
            "--records",
            str(records),
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Stopped the local Kafka broker" in done.stderr

    rows = pq.read_table(output).to_pylist()
    assert sorted(row["order_id"] for row in rows) == list(range(records))
    by_customer: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_customer[row["customer"]].append(row)
    for orders in by_customer.values():  # running totals without a gap or a repeat
        orders.sort(key=lambda row: row["customer_orders"])
        assert [row["customer_orders"] for row in orders] == list(range(1, len(orders) + 1))
        assert orders[-1]["customer_total"] == sum(row["amount"] for row in orders)


def test_kafka_to_parquet_example_refuses_an_output_directory_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "old-part").write_text("x")
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "kafka_to_parquet.py"), "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "is not empty" in done.stderr
