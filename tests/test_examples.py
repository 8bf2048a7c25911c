"""The examples the README tells users to run still run and give the right answer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
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


#: PyFlink 2.3's own output of its examples ``pyflink/examples/datastream/windowing/*.py``, run
#: with the real PyFlink (a local mini cluster) and stored verbatim; ``examples/windowing.py``
#: runs the same jobs on chandy.
PYFLINK_OUTPUTS = Path(__file__).resolve().parent / "pyflink_outputs"


def _run_windowing_example(kind: str, *options: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "windowing.py"), kind, *options],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session", "dynamic-session", "count"])
@pytest.mark.slow
def test_windowing_example_prints_what_pyflink_prints(kind: str) -> None:
    """Line for line, in PyFlink's order (one subtask: windows fire in event-time order)."""
    expected = (PYFLINK_OUTPUTS / f"windowing-{kind}.txt").read_text(encoding="utf-8")
    assert _run_windowing_example(kind, "--executor", "local").splitlines() == expected.splitlines()


@pytest.mark.slow
def test_windowing_example_runs_on_spark() -> None:
    """The default executor, as a user runs it."""
    expected = (PYFLINK_OUTPUTS / "windowing-session.txt").read_text(encoding="utf-8")
    assert _run_windowing_example("session").splitlines() == expected.splitlines()


@pytest.mark.slow
def test_event_time_timer_example_prints_what_pyflink_prints() -> None:
    """PyFlink's timer example (as adapted in event_time_timer.pyflink.py beside the output):
    every timer fires at the end of the input, each printing its key's total. Flink does not
    order timers of equal timestamps (Alice's and Bob's at 5 s), so neither does the check."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "event_time_timer.py"), "--executor", "local"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = (PYFLINK_OUTPUTS / "event-time-timer.txt").read_text(encoding="utf-8")
    assert sorted(done.stdout.splitlines()) == sorted(expected.splitlines())
    assert len(done.stdout.splitlines()) == 8, "one line per distinct (key, timer)"


@pytest.mark.slow
def test_windowing_example_writes_files_with_output(tmp_path: Path) -> None:
    _run_windowing_example("tumbling", "--executor", "local", "--output", str(tmp_path))
    lines = sorted(
        line
        for part in tmp_path.rglob("windows*")
        if part.is_file()
        for line in part.read_text().splitlines()
    )
    assert lines == sorted(["('hi', 0, 5, 4)", "('hi', 5, 10, 3)", "('hi', 15, 20, 1)"])


def _code_blocks(page: str) -> list[tuple[str, str]]:
    """``(language, code)`` of each fenced block of a Markdown page, in order."""
    return re.findall(r"```(\w+)\n(.*?)```", page, re.S)


@pytest.mark.slow
def test_the_event_time_guides_example_prints_what_it_says() -> None:
    """docs/event-time.md's complete example runs as printed (on the local executor) and
    prints the lines the page shows after it."""
    blocks = _code_blocks((ROOT / "docs" / "event-time.md").read_text(encoding="utf-8"))
    (language, code), (shown_language, shown) = blocks[0], blocks[1]
    assert (language, shown_language) == ("python", "text")
    assert "get_execution_environment()" in code
    code = code.replace("get_execution_environment()", 'get_execution_environment(executor="local")')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = sorted(line.split("> ", 1)[1] for line in done.stdout.splitlines())
    assert printed == sorted(shown.splitlines())


# PyFlink's own example files (not chandy's ports), with only their imports changed, are
# checked against the same outputs by `python -m bench.pyflink_examples`: they come from the
# PyFlink the benchmarks install, which the test suite does not need.


@pytest.mark.slow
def test_large_state_rocksdb_example_alerts_exactly_once_and_checkpoints_incrementally(
    tmp_path: Path,
) -> None:
    """The example checks its own alerts against a replay of the payments; here also: after the
    first checkpoints, some checkpoint uploads less than half of the state (only the hot users'
    changes), and a job that ended leaves nothing in its checkpoint directory (its shared files
    were deleted with the checkpoints that referenced them)."""
    options = ["--executor", "local", "--users", "20000", "--hot-payments", "20000"]
    example = str(ROOT / "examples" / "large_state_rocksdb.py")
    command = [sys.executable, example, *options, "--checkpoint-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "alerts exactly as expected" in done.stdout
    shares = [int(m) for m in re.findall(r"uploaded +[\d.]+ MB \((\d+) %\)", done.stdout)]
    assert shares and min(shares) < 50, done.stdout
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


#: What a new Spark JVM says at start that a user cannot act on, and Spark's INFO log.
SPARK_START_NOISE = (
    "log4j profile",
    "setLogLevel",
    "Setting default log level",
    "NativeCodeLoader",
    " INFO ",
)


@pytest.mark.slow
def test_word_count_example_prints_pyflinks_output_and_nothing_of_sparks(tmp_path: Path) -> None:
    """`python examples/word_count.py | ...`: the job's lines, without Spark's stage bar glued
    to them (the bar draws only when stdout is piped or a terminal, never into a file)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "word_count.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[Stage" not in done.stdout + done.stderr
    for noise in SPARK_START_NOISE:  # Spark's start-up lines nobody can act on, and its INFO log
        assert noise not in done.stderr, done.stderr
    counts: dict[str, int] = {}
    for line in done.stdout.splitlines():
        match = re.fullmatch(r"\d+> \('(\w+)', (\d+)\)", line)
        assert match, f"not a line of the job's output: {line!r}"
        counts[match[1]] = max(int(match[2]), counts.get(match[1], 0))
    assert counts["to"] == 4 and counts["the"] == 3 and counts["be"] == 2


@pytest.mark.slow
def test_word_count_under_spark_submit_logs_spark_at_warn(tmp_path: Path) -> None:
    """Under spark-submit the JVM and its console are Spark's, but the session is chandy's to
    start: its log level is WARN (Spark's default there is INFO, about 95 lines for this job).
    The few INFO lines Spark logs before the session exists are left."""
    submit = Path(sys.executable).parent / "spark-submit"
    done = subprocess.run(
        [str(submit), "--master", "local[2]", str(ROOT / "examples" / "word_count.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_DRIVER_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [line for line in done.stderr.splitlines() if " INFO " in line]
    assert len(logged) <= 5, done.stderr
    assert len(done.stdout.splitlines()) == 39  # the job's own output is all there
