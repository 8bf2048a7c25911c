"""The bench's anchors (Flink SQL, Pathway): their pure-Python parts. Their runners need
the systems' own environments (a JVM, Pathway's engine), which the tests do not install;
``python -m bench run --systems flink_sql,pathway`` runs them for real."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bench import envs, report
from bench.suite import FULL, QUICK, parse_systems, plan
from bench.systems.steady import (
    Timed,
    steady_figures,
    steady_rate,
    w1_check,
    w1_check_error,
    w1_expected_sums,
)
from bench.systems.w5_events import W5Events, sql_strided, sql_timestamp_ms
from tests.test_bench_harness import _row as bench_row

ROOT = Path(__file__).resolve().parent.parent


def test_the_steady_state_is_the_records_two_warm_jobs_differ_by_over_their_time_difference() -> None:
    # a fixed 3 s of start-up in every job hides a rate of 2 M records/s behind 1.25 M
    small, big = Timed(10_000_000, 3.0 + 5.0), Timed(20_000_000, 3.0 + 10.0)

    assert small.rate == pytest.approx(1.25e6)
    assert steady_rate(small, big) == pytest.approx(2.0e6)
    figures = steady_figures(Timed(10_000_000, 9.0), small, big)
    assert figures["records_per_s"] == pytest.approx(10e6 / 9)  # the cold first job, as reported alone
    assert figures["steady_records_per_s"] == pytest.approx(2.0e6)
    assert [job["warm"] for job in figures["steady_jobs"]] == [False, True, True]


def test_a_steady_state_the_noise_swallowed_is_reported_missing_with_why_not_a_rate() -> None:
    with pytest.raises(ValueError, match="bigger second job"):
        steady_rate(Timed(10, 1.0), Timed(10, 2.0))

    figures = steady_figures(Timed(1000, 1.0), Timed(1000, 1.0), Timed(2000, 0.9))

    assert figures["steady_records_per_s"] is None
    assert "not measurable" in figures["steady_error"] and "give more records" in figures["steady_error"]
    assert figures["records_per_s"] == 1000.0


def test_w1_check_takes_each_keys_last_sum_and_catches_a_wrong_or_missing_one() -> None:
    assert w1_expected_sums(7, 3) == {0: 0 + 3 + 6, 1: 1 + 4, 2: 2 + 5}
    running = [(i % 3, sum(range(i % 3, i + 1, 3))) for i in range(7)]

    good = w1_check(7, 3, running)
    assert good["exact"] and good["check_updates_emitted"] == 7 and w1_check_error(good) is None

    bad = w1_check(7, 3, [*running[:-1], (0, 0)])  # key 0's last update lost, its first repeated
    assert not bad["exact"] and bad["check_wrong_keys"] == 1 and bad["check_updates_shrunk"] == 1
    assert "1 keys with a wrong or missing final sum" in (w1_check_error(bad) or "")
    assert not w1_check(7, 3, running[:-2])["exact"]  # key 2 never reached its total


def test_w5_in_sql_reads_the_same_records_and_timestamps_as_w5_events() -> None:
    # The Flink SQL runner computes W5's events in SQL from a number source of p contiguous
    # splits; SQLite evaluates the same expressions here (its MOD is a float, exact below 2**53).
    events = W5Events(records=40_000, keys=100, per_event_second=10_000, parallelism=2)
    database = sqlite3.connect(":memory:")
    database.execute("CREATE TABLE numbers (n INTEGER)")
    database.executemany("INSERT INTO numbers VALUES (?)", [(n,) for n in range(events.records)])

    i = sql_strided("n", events)
    rows = database.execute(
        f"SELECT n, {i}, {sql_timestamp_ms(i, events)} FROM numbers ORDER BY n"
    ).fetchall()

    assert [int(r) for _, r, _ in rows] == [events.strided(n) for n in range(events.records)]
    assert [int(ts) for _, r, ts in rows] == [events.timestamp(int(r)) for _, r, _ in rows]


def test_flink_sql_shares_pyflinks_environment_and_pathway_has_its_own() -> None:
    assert envs.python_of("flink_sql") == envs.python_of("pyflink")
    assert envs.requirements("flink_sql") == envs.requirements("pyflink") == ["apache-flink==2.3.0"]
    assert envs.requirements("pathway") == ["pathway==0.33.0"]
    assert envs.python_of("pathway") != envs.python_of("pyflink")
    with pytest.raises(ValueError, match="flink_sql, bytewax, spark_ss or pathway"):
        envs.requirements("flink")


def test_the_anchors_run_w1_and_w5_in_their_variants_with_sizes_for_seconds_of_work() -> None:
    assert parse_systems("flink_sql,pathway", quick=False) == [
        ("flink_sql", "per_record"),
        ("flink_sql", "minibatch"),
        ("pathway", "subject"),
        ("pathway", "csv"),
    ]
    assert parse_systems("flink_sql,pathway", quick=True) == [
        ("flink_sql", "per_record"),
        ("pathway", "subject"),
    ]
    assert FULL.arguments("flink_sql", "minibatch", "w1") == ["--records", "10000000"]
    assert FULL.arguments("pathway", "csv", "w1") == ["--records", "1000000"]
    assert FULL.arguments("flink_sql", "per_record", "w5")[:2] == ["--records", "10000000"]
    assert QUICK.arguments("pathway", "subject", "w5")[:2] == ["--records", "200000"]
    cases = plan(
        [("chandy", "spark"), ("flink_sql", "per_record")], ["w1v"], with_no_checkpoint_baseline=True
    )
    assert {c.system for c in cases} == {"chandy"}  # W1v is chandy's; the anchors' side is their W1


def _row(system: str, variant: str, workload: str, **figures: object) -> dict[str, object]:
    return bench_row(system, variant, workload, records=1000, **figures)


def test_chandys_ratios_to_an_anchor_use_its_steady_state_for_w1_w1v_and_w5() -> None:
    rows = [
        _row("chandy", "spark", "w1", records_per_s=3.0e6),
        _row("chandy", "spark", "w1v", records_per_s=50.0e6),
        _row("chandy", "spark", "w5", records_per_s=2.0e6),
        _row("flink_sql", "per_record", "w1", records_per_s=1.0e6, steady_records_per_s=4.0e6),
        _row("flink_sql", "per_record", "w5", records_per_s=1.0e6, steady_records_per_s=5.0e6),
        # a run whose steady state the noise swallowed: its ratio falls back to its own rate
        _row("pathway", "subject", "w1", records_per_s=0.5e6, steady_records_per_s=None),
        _row("spark_ss", "groupby", "w1", records_per_s=12.0e6),
    ]

    summary = report.summarize(rows)
    ratios = report.ratios(summary)["chandy/spark"]

    assert summary["flink_sql/per_record"]["w1_steady_records_per_s"]["median"] == 4.0e6
    assert ratios["flink_sql/per_record"]["records_per_s"] == pytest.approx(3 / 4)
    assert ratios["flink_sql/per_record"]["w1v_records_per_s"] == pytest.approx(50 / 4)
    assert ratios["flink_sql/per_record"]["w5_records_per_s"] == pytest.approx(2 / 5)
    assert ratios["pathway/subject"]["records_per_s"] == pytest.approx(6.0)
    assert ratios["spark_ss/groupby"]["records_per_s"] == pytest.approx(3 / 12)  # no steady state: as before
    assert "w1_steady_records_per_s" not in ratios["flink_sql/per_record"]  # a figure, not a score
    lines = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in report.ratios_table(summary).splitlines()[2:]
    ]
    table = {(reference, figure): ratio for _, reference, figure, ratio in lines}
    steady_w1, steady_w5 = (
        "the reference's W1 steady-state throughput",
        "the reference's W5 steady-state throughput",
    )
    assert table["flink_sql/per_record", f"W1 throughput vs {steady_w1}"] == "0.75x"
    assert table["flink_sql/per_record", f"W1v throughput (batch path) vs {steady_w1}"] == "12.50x"
    assert table["flink_sql/per_record", f"W5 throughput vs {steady_w5}"] == "0.40x"
    assert table["spark_ss/groupby", "W1 throughput"] == "0.25x"  # no steady state: named as before
    assert "W1 steady-state throughput" in report.figures_table(summary)


def test_the_w5v_target_against_flink_sql_is_held_to_its_steady_state() -> None:
    """The goal is W5v >= 3x Flink SQL's window in its steady state: a target, like a ratio,
    takes the reference's steady figure where it has one, and says so."""
    rows = [
        _row("chandy", "spark", "w5v", records_per_s=12.0e6, exact=True),
        _row("flink_sql", "per_record", "w5", records_per_s=1.0e6, steady_records_per_s=5.0e6),
        _row("flink_sql", "minibatch", "w5", records_per_s=2.0e6, steady_records_per_s=3.0e6),
        _row("spark_ss", "groupby", "w5", records_per_s=2.0e6),
    ]
    checks = {c["target"]: (c["measured"], c["met"]) for c in report.targets(report.summarize(rows))}
    steady = "W5v >= 3x flink_sql's W5 (best variant: flink_sql/per_record, steady state)"
    assert checks[steady] == ("2.40x", False)  # 12 / 5, not 12 / 2 (the faster cold run)
    assert checks["W5v >= 3x spark_ss's W5 (best variant: spark_ss/groupby)"] == ("6.00x", True)


def test_pathways_runner_answers_a_workload_it_does_not_run_with_one_clear_error(tmp_path: Path) -> None:
    # the runner imports Pathway only to run a job, so its protocol answers without it
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "systems" / "pathway_runner.py"),
            "w2",
            "--work-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )

    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] is False and result["system"] == "pathway" and result["workload"] == "w2"
    assert result["error"] == (
        "NotImplementedError: w2 is not implemented for pathway (it runs w1, w5, the throughput anchors)"
    )


def test_the_chart_shows_an_anchors_steady_state_beside_chandy_and_labels_it() -> None:
    from bench.chart import panels, svg

    rows = [
        _row("chandy", "spark", "w1", records_per_s=3.0e6),
        _row("flink_sql", "per_record", "w1", records_per_s=1.0e6, steady_records_per_s=4.0e6),
        _row("flink_sql", "minibatch", "w1", records_per_s=1.5e6, steady_records_per_s=6.0e6),
        _row("pyflink", "thread", "w1", records_per_s=3.0e4),
    ]
    summary = report.summarize(rows)

    [(metric, bars)] = panels(summary)

    assert metric.key == "records_per_s"
    assert [(bar.label, bar.value) for bar in bars] == [
        ("chandy/spark", 3.0e6),
        ("pyflink/thread", 3.0e4),
        ("flink_sql/minibatch (steady)", 6.0e6),  # the anchor's best variant, its steady state
    ]
    assert "flink_sql/minibatch (steady)" in svg(summary, "W1")
