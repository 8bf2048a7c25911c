"""DeltaSink: commits at checkpoint completion, idempotent replays, whole jobs read back."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from chandy import InvalidProgramError, StreamExecutionEnvironment
from chandy.connectors.delta_sink import DeltaSink
from chandy.task.operators.sink import SinkWriterOperator
from tests.jobs import FailOnceMap, KeyedCounter, Throttle
from tests.operator_harness import OperatorHarness
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too

SCHEMA = pa.schema([("key", pa.int64()), ("count", pa.int64())])


def rows(path: Path) -> list[tuple[int, int]]:
    table = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(zip(table["key"].to_pylist(), table["count"].to_pylist(), strict=True))


def sink(path: Path) -> DeltaSink:
    delta = DeltaSink(str(path), SCHEMA, app_id="test")
    delta.validate()
    return delta


def test_rows_appear_when_their_checkpoint_completes(tmp_path: Path) -> None:
    h = OperatorHarness(SinkWriterOperator(sink(tmp_path))).open()
    h.process({"key": 1, "count": 1})
    h.snapshot(1)
    h.process({"key": 2, "count": 1})
    h.snapshot(2)
    assert rows(tmp_path) == []
    h.notify_complete(1)
    assert rows(tmp_path) == [(1, 1)]
    h.notify_complete(2)
    assert rows(tmp_path) == [(1, 1), (2, 1)]
    assert DeltaTable(str(tmp_path)).transaction_version("test-job-sink-under-test-0") == 2


def test_a_replayed_commit_after_a_restore_adds_nothing_twice(tmp_path: Path) -> None:
    h = OperatorHarness(SinkWriterOperator(sink(tmp_path))).open()
    h.process({"key": 7, "count": 3})
    state = h.snapshot(4)
    h.notify_complete(4)  # committed, then the task fails before the next checkpoint
    h.process({"key": 8, "count": 1})  # in flight: lost
    OperatorHarness(SinkWriterOperator(sink(tmp_path)), attempt=1).open(
        [state], restored_checkpoint_id=4
    )  # the restore replays checkpoint 4's commit
    assert rows(tmp_path) == [(7, 3)]
    assert len(DeltaTable(str(tmp_path)).history()) == 2  # create + one append


def test_a_restore_commits_a_checkpoint_whose_notification_was_lost(tmp_path: Path) -> None:
    h = OperatorHarness(SinkWriterOperator(sink(tmp_path))).open()
    h.process({"key": 5, "count": 1})
    state = h.snapshot(9)  # completes, but the task fails before hearing it
    assert rows(tmp_path) == []
    OperatorHarness(SinkWriterOperator(sink(tmp_path)), attempt=1).open([state], restored_checkpoint_id=9)
    assert rows(tmp_path) == [(5, 1)]


def test_a_missing_table_without_schema_is_refused_at_build_time(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    with pytest.raises(InvalidProgramError, match="no Delta table.*schema"):
        env.from_collection([{"key": 1}]).sink_to(DeltaSink(str(tmp_path / "nothing")))


def test_a_second_run_of_the_same_job_appends_its_rows_too(tmp_path: Path) -> None:
    # checkpoint ids start again in every job: its versions must not look committed
    for run in range(2):
        env = StreamExecutionEnvironment.get_execution_environment(executor="local")
        env.enable_checkpointing(50)
        (
            env.from_collection([{"key": run, "count": i} for i in range(3)])
            .sink_to(DeltaSink(str(tmp_path / "table"), SCHEMA))
            .uid("delta")
        )
        env.execute(f"run {run}")
    assert rows(tmp_path / "table") == [(run, i) for run in range(2) for i in range(3)]


@pytest.mark.slow
@on_rocksdb_too(executor="local")
def test_exactly_once_keyed_counts_into_delta_through_a_failure(tmp_path: Path, executor: str) -> None:
    n, keys = 20_000, 20
    probe = Probe()
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    env.configure({"restart-strategy.fixed-delay.delay": 0})
    (
        env.from_sequence(0, n - 1)
        .uid("source")
        .map(Throttle(0.00002))
        .uid("throttle")
        .map(FailOnceMap("failing", probe, n // 2, seed=5))
        .uid("failing")
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .uid("counter")
        .map(lambda kv: {"key": kv[0], "count": kv[1]})
        .uid("to-dict")
        .sink_to(DeltaSink(str(tmp_path / "table"), SCHEMA))
        .uid("delta")
    )
    env.execute("delta")
    assert probe.get("failures") >= 1
    assert rows(tmp_path / "table") == [(k, n // keys) for k in range(keys)]
