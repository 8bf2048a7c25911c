"""FileSink: Flink's TwoPhaseCommitSinkFunctionTest scenarios on real files, rolling, formats,
and whole jobs read back by Spark."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chandy import InvalidProgramError, StreamExecutionEnvironment
from chandy.connectors.file_sink import (
    CsvEncoder,
    Encoder,
    FileSink,
    JsonLinesEncoder,
    OutputFileConfig,
    ParquetBulkWriters,
    RollingPolicy,
)
from chandy.connectors.sinks import PrintSink
from chandy.task.operators.sink import SinkWriterOperator
from tests.jobs import FailOnceMap, KeyedCounter, Throttle
from tests.operator_harness import OperatorHarness
from tests.probes import Probe


def committed_lines(directory: Path) -> list[str]:
    """Every line of every committed (visible) part, as a reader of the directory sees it."""
    lines = []
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.name.startswith((".", "_")):
            lines += path.read_text().splitlines()
    return lines


def hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(".*") if p.is_file())


def string_sink(directory: Path) -> FileSink:
    return FileSink.for_row_format(str(directory), Encoder.simple_string_encoder()).build()


def harness(directory: Path, **kwargs: Any) -> OperatorHarness:
    return OperatorHarness(SinkWriterOperator(string_sink(directory)), **kwargs)


def test_commit_only_what_the_completed_checkpoint_covers(tmp_path: Path) -> None:
    h = harness(tmp_path).open()
    h.process("42")
    h.snapshot(0)
    h.process("43")
    h.snapshot(1)
    h.process("44")
    h.snapshot(2)
    assert committed_lines(tmp_path) == []  # nothing visible before a completion
    h.notify_complete(1)
    assert sorted(committed_lines(tmp_path)) == ["42", "43"]


def test_a_later_completion_commits_everything_before_it_and_a_late_one_is_a_no_op(tmp_path: Path) -> None:
    h = harness(tmp_path).open()
    for checkpoint_id, record in enumerate(["42", "43", "44"]):
        h.process(record)
        h.snapshot(checkpoint_id)
    h.notify_complete(2)
    assert sorted(committed_lines(tmp_path)) == ["42", "43", "44"]
    before = sorted(os.listdir(tmp_path))
    h.notify_complete(1)  # late, and already covered
    assert sorted(os.listdir(tmp_path)) == before
    assert sorted(committed_lines(tmp_path)) == ["42", "43", "44"]


def test_fail_after_checkpoint_and_restore_commits_it_and_cleans_the_in_flight_part(tmp_path: Path) -> None:
    h = harness(tmp_path).open()
    h.process("42")
    h.snapshot(0)
    h.process("43")
    state = h.snapshot(1)  # checkpoint 1 completes, but the notification never arrives
    h.process("44")  # in flight: written after checkpoint 1, lost with the failure
    h.snapshot(2)  # checkpoint 2 never completes
    h.process("45")
    assert committed_lines(tmp_path) == []
    # the task dies here: no close(), its files stay behind
    restored = harness(tmp_path, attempt=1).open([state], restored_checkpoint_id=1)
    assert sorted(committed_lines(tmp_path)) == ["42", "43"]
    assert hidden(tmp_path) == []  # the aborted checkpoint's pending part and the in-progress one
    restored.process("44")
    restored.snapshot(2)
    restored.notify_complete(2)
    assert sorted(committed_lines(tmp_path)) == ["42", "43", "44"]


def test_a_restore_commits_idempotently(tmp_path: Path) -> None:
    h = harness(tmp_path).open()
    h.process("42")
    state = h.snapshot(0)
    h.notify_complete(0)  # committed before the failure ...
    harness(tmp_path, attempt=1).open([state], restored_checkpoint_id=0)  # ... and replayed
    assert committed_lines(tmp_path) == ["42"]


def test_restore_at_a_lower_parallelism_commits_every_subtask_pending_part(tmp_path: Path) -> None:
    states = []
    for subtask in range(3):
        h = harness(tmp_path, subtask=subtask, parallelism=3).open()
        h.process(f"from {subtask}")
        states.append(h.snapshot(5))
    # rescaled to one subtask: the union state brings every subtask's committables
    harness(tmp_path, attempt=1).open(states, restored_checkpoint_id=5)
    assert sorted(committed_lines(tmp_path)) == ["from 0", "from 1", "from 2"]
    assert hidden(tmp_path) == []


def test_without_checkpointing_everything_is_committed_at_end_of_input(tmp_path: Path) -> None:
    h = OperatorHarness(
        SinkWriterOperator(string_sink(tmp_path)), config={"execution.checkpointing.interval": None}
    ).open()
    h.process("a", "b")
    h.end_input()
    h.close()
    assert committed_lines(tmp_path) == ["a", "b"]
    assert hidden(tmp_path) == []


def test_parts_roll_by_size_and_a_cancelled_writer_leaves_nothing(tmp_path: Path) -> None:
    sink = (
        FileSink.for_row_format(str(tmp_path), Encoder.simple_string_encoder())
        .with_rolling_policy(RollingPolicy.default_rolling_policy(part_size=10))
        .with_output_file_config(OutputFileConfig("data", ".txt"))
        .build()
    )
    h = OperatorHarness(SinkWriterOperator(sink)).open()
    for i in range(5):
        h.process(f"record-{i}")  # 9 bytes each: every second record rolls the part
    h.snapshot(1)
    h.notify_complete(1)
    names = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert len(names) >= 3 and all(n.startswith("data-0-") and n.endswith(".txt") for n in names)
    assert sorted(committed_lines(tmp_path)) == [f"record-{i}" for i in range(5)]
    h.process("never committed")
    h.close()  # cancelled: the open part is deleted
    assert hidden(tmp_path) == []


@pytest.mark.parametrize(
    "policy",
    [
        RollingPolicy(part_size=None, rollover_interval_ms=0, inactivity_interval_ms=None),
        RollingPolicy(part_size=None, rollover_interval_ms=None, inactivity_interval_ms=0),
    ],
)
def test_parts_roll_by_time(tmp_path: Path, policy: RollingPolicy) -> None:
    # an interval of 0 ms has passed at every write: each batch closes its part
    sink = (
        FileSink.for_row_format(str(tmp_path), Encoder.simple_string_encoder())
        .with_rolling_policy(policy)
        .build()
    )
    h = OperatorHarness(SinkWriterOperator(sink)).open()
    for i in range(3):
        h.process(f"batch-{i}")
    h.snapshot(1)
    h.notify_complete(1)
    parts = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert sorted(p.read_text() for p in parts) == [f"batch-{i}\n" for i in range(3)]


def test_row_formats_and_buckets(tmp_path: Path) -> None:
    sink = (
        FileSink.for_row_format(str(tmp_path / "json"), JsonLinesEncoder())
        .with_bucket_assigner(lambda r: f"kind={r['kind']}")
        .build()
    )
    h = OperatorHarness(SinkWriterOperator(sink)).open()
    h.process({"kind": "a", "n": 1}, {"kind": "b", "n": 2}, {"kind": "a", "n": 3})
    h.snapshot(1)
    h.notify_complete(1)
    assert [json.loads(x) for x in committed_lines(tmp_path / "json" / "kind=a")] == [
        {"kind": "a", "n": 1},
        {"kind": "a", "n": 3},
    ]
    csv_sink = FileSink.for_row_format(str(tmp_path / "csv"), CsvEncoder(["n", "kind"])).build()
    h = OperatorHarness(SinkWriterOperator(csv_sink)).open()
    h.process({"kind": "x,y", "n": 1})
    h.snapshot(1)
    h.notify_complete(1)
    assert committed_lines(tmp_path / "csv") == ['1,"x,y"']


def test_a_sink_that_cannot_write_its_directory_is_refused_when_the_job_is_built(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    with pytest.raises(InvalidProgramError, match="FileSink cannot write to"):
        env.from_collection([1]).sink_to(string_sink(blocker / "out"))
    with pytest.raises(InvalidProgramError, match="local .* and S3"):  # s3://: test_object_storage.py
        env.from_collection([1]).sink_to(
            FileSink.for_row_format("hdfs://namenode/out", Encoder.simple_string_encoder()).build()
        )


#: (what the user wrote, the error, what its message must say): each must fail where the job
#: is written. Before, most of them built a sink that failed inside every running task.
BAD_ARGUMENTS: list[tuple[str, Callable[[str], Any], type[Exception], str]] = [
    (
        # the case: it failed inside the task, with a TypeError from str.encode
        "a format name for an encoder",
        lambda d: FileSink.for_row_format(d, "json"),
        TypeError,
        r"FileSink.for_row_format: encoder must be an Encoder, got 'json' \(str\); use JsonLinesEncoder\(\), "
        r"CsvEncoder\(fields=\[...\]\), Encoder.simple_string_encoder\(\)",
    ),
    (
        "an encoder class, not an instance",
        lambda d: FileSink.for_row_format(d, JsonLinesEncoder),
        TypeError,
        r"encoder must be an instance, got the class JsonLinesEncoder: use JsonLinesEncoder\(\)",
    ),
    (
        "a bulk writer factory for a row format",
        lambda d: FileSink.for_row_format(d, ParquetBulkWriters.for_records()),
        TypeError,
        r"ParquetBulkWriters writes whole files, not rows: use FileSink.for_bulk_format",
    ),
    (
        "an encoder for a bulk format",
        lambda d: FileSink.for_bulk_format(d, JsonLinesEncoder()),
        TypeError,
        r"JsonLinesEncoder encodes rows: use FileSink.for_row_format",
    ),
    (
        "a format name for a bulk writer factory",
        lambda d: FileSink.for_bulk_format(d, "parquet"),
        TypeError,
        r"writer_factory must be a BulkWriterFactory, got 'parquet' \(str\); "
        r"use ParquetBulkWriters.for_records",
    ),
    (
        "no base path",
        lambda d: FileSink.for_row_format("", JsonLinesEncoder()),
        TypeError,
        r"base_path must be a directory path \(a non-empty str or os.PathLike\), got ''",
    ),
    (
        "a base path of another filesystem",
        lambda d: FileSink.for_row_format("gs://bucket/out", JsonLinesEncoder()),
        InvalidProgramError,
        r"'gs://bucket/out' is neither. Use a path, a file:// URI or an s3:// URI",
    ),
    (
        "an s3 URI without a bucket",
        lambda d: FileSink.for_row_format("s3:///out", JsonLinesEncoder()),
        InvalidProgramError,
        r"'s3:///out' names no bucket",
    ),
    (
        "an unknown charset",
        lambda d: Encoder.simple_string_encoder("utf-9"),
        ValueError,
        r"Encoder.simple_string_encoder: unknown charset 'utf-9'; use a Python codec name",
    ),
    (
        "a charset that is not a name",
        lambda d: Encoder.simple_string_encoder(8),
        TypeError,
        r"charset must be an encoding name \(str\), e.g. 'utf-8', got 8",
    ),
    (
        "CSV fields as one string",
        lambda d: CsvEncoder("id,name"),
        TypeError,
        r"CsvEncoder: fields must be a list of column names \(str\), e.g. \['id', 'name'\], got 'id,name'",
    ),
    (
        "a CSV delimiter of two characters",
        lambda d: CsvEncoder(["id"], delimiter=";;"),
        ValueError,
        r"CsvEncoder: delimiter must be a single character, e.g. ',' or '\\t', got ';;'",
    ),
    (
        "an unknown Parquet compression",
        lambda d: ParquetBulkWriters.for_records(compression="zip"),
        ValueError,
        r"compression must be one of snappy, gzip, brotli, lz4, zstd, none; got 'zip'",
    ),
    (
        "a Parquet schema that is not a pyarrow schema",
        lambda d: ParquetBulkWriters.for_records([("id", "int64")]),
        InvalidProgramError,
        r"ParquetBulkWriters\(schema\) takes a pyarrow.Schema or a dict of column name to Arrow type",
    ),
    (
        "a negative part size",
        lambda d: RollingPolicy.default_rolling_policy(part_size=-1),
        ValueError,
        r"default_rolling_policy: part_size must be a whole number of bytes >= 1 "
        r"\(or None for no limit\), got -1",
    ),
    (
        "an interval in seconds as a float",
        lambda d: RollingPolicy.default_rolling_policy(rollover_interval=0.5),
        ValueError,
        r"rollover_interval must be a whole number of milliseconds >= 0 \(or None for no limit\), got 0.5",
    ),
    (
        "a negative inactivity interval",
        lambda d: RollingPolicy(inactivity_interval_ms=-5),
        ValueError,
        r"RollingPolicy: inactivity_interval_ms must be a whole number of milliseconds >= 0",
    ),
    (
        "a rolling policy that is not one",
        lambda d: FileSink.for_row_format(d, JsonLinesEncoder()).with_rolling_policy(60_000),
        TypeError,
        r"with_rolling_policy: policy must be a RollingPolicy, got 60000 \(int\); use "
        r"RollingPolicy.default_rolling_policy",
    ),
    (
        "a part prefix as an output file config",
        lambda d: FileSink.for_row_format(d, JsonLinesEncoder()).with_output_file_config("data"),
        TypeError,
        r"with_output_file_config: config must be an OutputFileConfig, got 'data' \(str\); use "
        r"OutputFileConfig\(part_prefix, part_suffix\)",
    ),
    (
        "a part prefix that readers skip",
        lambda d: OutputFileConfig(part_prefix="_data"),
        ValueError,
        r"part_prefix '_data' starts with '_': readers \(Spark, pandas, Flink\) skip such files",
    ),
    (
        "a part prefix with a directory in it",
        lambda d: OutputFileConfig.builder().with_part_prefix("out/part"),
        ValueError,
        r"part_prefix 'out/part' must be part of a file name: no '/'",
    ),
    (
        "an empty part prefix",
        lambda d: OutputFileConfig.builder().with_part_prefix(""),
        ValueError,
        r"OutputFileConfig: part_prefix must not be empty",
    ),
    (
        "a part suffix that is not a str",
        lambda d: OutputFileConfig.builder().with_part_suffix(1),
        TypeError,
        r"OutputFileConfig: part_suffix must be a str, got 1 \(int\)",
    ),
    (
        "a bucket assigner that is a name",
        lambda d: FileSink.for_row_format(d, JsonLinesEncoder()).with_bucket_assigner("day"),
        TypeError,
        r"with_bucket_assigner: assigner must be a function of a record that returns its bucket",
    ),
    (
        "a print sink told 'yes' for stderr",
        lambda d: PrintSink("orders", stderr="yes"),
        TypeError,
        r"PrintSink: stderr must be True \(print to stderr\) or False \(stdout\), got 'yes'",
    ),
    (
        "a print sink identifier that is not a str",
        lambda d: PrintSink(2),
        TypeError,
        r"PrintSink: sink_identifier must be a str put in front of every line, or None, got 2 \(int\)",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "message"), [row[1:] for row in BAD_ARGUMENTS], ids=[row[0] for row in BAD_ARGUMENTS]
)
def test_bad_sink_arguments_are_refused_when_the_sink_is_built(
    tmp_path: Path, call: Callable[[str], Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call(str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # refused before anything was created


def test_good_sink_arguments_still_build(tmp_path: Path) -> None:
    config = OutputFileConfig.builder().with_part_prefix("data").with_part_suffix(".jsonl").build()
    assert config == OutputFileConfig("data", ".jsonl")
    sink = (
        FileSink.for_row_format(tmp_path, Encoder.simple_string_encoder("latin-1"))  # a Path is fine too
        .with_rolling_policy(RollingPolicy.default_rolling_policy(part_size=1024, rollover_interval=0))
        .with_output_file_config(config)
        .with_bucket_assigner(lambda record: record[:1])
        .build()
    )
    assert sink.base_path == str(tmp_path)
    assert FileSink.for_bulk_format(str(tmp_path), ParquetBulkWriters.for_records(compression="ZSTD")).build()
    assert CsvEncoder(("id", "name"), delimiter="\t").fields == ["id", "name"]
    assert PrintSink("orders", stderr=True).sink_identifier == "orders"


def test_an_unbounded_job_without_checkpointing_is_warned_that_its_output_never_commits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from chandy.connectors import DataGeneratorSource

    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.from_source(DataGeneratorSource(str, None), source_name="events").sink_to(
        string_sink(tmp_path / "out")
    )
    with caplog.at_level("WARNING", logger="chandy.api.environment"):
        env.get_execution_plan()
    assert any(
        "checkpointing is off" in r.message and "events" in r.message and "FileSink" in r.message
        for r in caplog.records
    )

    caplog.clear()  # bounded, or with checkpointing: nothing to warn about
    bounded = StreamExecutionEnvironment.get_execution_environment(executor="local")
    bounded.from_collection([1]).sink_to(string_sink(tmp_path / "bounded"))
    env.enable_checkpointing(1000)
    with caplog.at_level("WARNING", logger="chandy.api.environment"):
        bounded.get_execution_plan()
        env.get_execution_plan()
    assert not [r for r in caplog.records if "checkpointing is off" in r.message]


@pytest.mark.slow
def test_exactly_once_parquet_and_json_output_through_a_failure_read_back_by_spark(
    tmp_path: Path, executor: str, spark_session: Any
) -> None:
    n, keys = 30_000, 30
    probe = Probe()
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    env.configure({"restart-strategy.fixed-delay.delay": 0})
    counted = (
        env.from_sequence(0, n - 1)
        .uid("source")
        .map(Throttle(0.00002))
        .uid("throttle")
        .map(FailOnceMap("failing", probe, n // 2, seed=3))
        .uid("failing")
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .uid("counter")
        .map(lambda kv: {"key": kv[0], "count": kv[1]})
        .uid("to-dict")
    )
    counted.sink_to(
        FileSink.for_bulk_format(str(tmp_path / "parquet"), ParquetBulkWriters.for_records()).build()
    ).uid("pq")
    env.from_sequence(0, n - 1).uid("raw-source").map(lambda x: {"value": x}).sink_to(
        FileSink.for_row_format(str(tmp_path / "json"), JsonLinesEncoder()).build()
    ).uid("json")
    env.execute("file sinks")
    assert probe.get("failures") >= 1
    rows = spark_session.read.parquet(str(tmp_path / "parquet")).collect()
    assert sorted((r["key"], r["count"]) for r in rows) == [(k, n // keys) for k in range(keys)]
    values = [r["value"] for r in spark_session.read.json(str(tmp_path / "json")).collect()]
    assert sorted(values) == list(range(n))  # every record once: the final checkpoint committed all
    assert hidden(tmp_path) == []


def test_a_fresh_start_into_a_directory_with_committed_parts_is_warned_of_a_restore_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = harness(tmp_path).open()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # an empty directory
    first.process("42")
    state = first.snapshot(1)
    first.notify_complete(1)
    first.close()
    parts = [p for p in os.listdir(tmp_path) if not p.startswith(".")]
    assert len(parts) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="chandy.connectors"):
        harness(tmp_path, parallelism=2).open()  # subtask 0 of a new run says it, once
        harness(tmp_path, subtask=1, parallelism=2).open()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"FileSink: {tmp_path} already holds committed parts of an earlier run ({parts[0]})" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="chandy.connectors"):
        harness(tmp_path).open([state], restored_checkpoint_id=1)  # the same job, restored
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
