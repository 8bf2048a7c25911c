"""FileSource: every format, exact positions through restores, bounded directories, hidden
files, malformed input, and continuous monitoring that reads each new file exactly once,
also across a failover and a restore at another parallelism. Real files, real jobs."""

from __future__ import annotations

import functools
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chandy import JobExecutionError, StreamExecutionEnvironment
from chandy.connectors import (
    CsvFormat,
    FileSource,
    JsonLinesFormat,
    MalformedRecordError,
    ParquetFormat,
    StreamFormat,
)
from chandy.core.connector import SourceReaderContext
from chandy.core.functions import MapFunction, RuntimeContext
from chandy.state.key_groups import stable_hash
from tests.jobs import FailOnceMap, KeyedCounter, Throttle
from tests.probes import Probe
from tests.test_checkpointing_e2e import (
    checkpointing_env,
    drain,
    latest_checkpoint_dir,
    wait_for_checkpoints,
)

# --------------------------------------------------------------------------- helpers


def env_for(executor: str, parallelism: int = 2) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    return env


def write_atomically(directory: Path, name: str, data: str | bytes) -> Path:
    """Write under a hidden name, then rename into place: the source sees all or nothing."""
    temp = directory / f".{name}.inprogress"
    if isinstance(data, str):
        temp.write_text(data, encoding="utf-8")
    else:
        temp.write_bytes(data)
    target = directory / name
    os.rename(temp, target)
    return target


def numbered_lines(name: str, n: int) -> str:
    return "".join(f"{name}:{i}\n" for i in range(n))


def write_parquet(path: Path, rows: int, start: int = 0, row_group_size: int = 128) -> list[dict]:
    table = pa.table(
        {
            "id": list(range(start, start + rows)),
            "name": [f"n{i}" for i in range(start, start + rows)],
            "score": [i * 0.5 for i in range(start, start + rows)],
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)
    return table.to_pylist()


def collect_until(into: list[Any], done: Callable[[list[Any]], bool], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not done(list(into)):
        assert time.monotonic() < deadline, f"timed out with {len(into)} records"
        time.sleep(0.05)


def spread_names(directory: Path, prefix: str, count: int) -> list[str]:
    """File names (without ".txt"), in sorted order, whose owners in continuous mode are
    spread evenly: name ``k`` belongs to subtask ``(k + 1) % 2`` at parallelism 2 and
    ``(k + 1) % 3`` at 3. Ownership hashes the absolute path, so plain names could by chance
    all land on one subtask; and owners differ from a round-robin deal of the sorted names,
    so a source that also dealt out the files present at start would read them twice."""
    names: list[str] = []
    candidate = 0
    while len(names) < count:
        name = f"{prefix}{len(names):02d}-{candidate}"
        h = stable_hash(str(directory / f"{name}.txt"))
        if h % 2 == (len(names) + 1) % 2 and h % 3 == (len(names) + 1) % 3:
            names.append(name)
        candidate += 1
    return names


class FailOnRecord(MapFunction):
    """Raises the first time (across attempts and processes) it sees ``record``."""

    def __init__(self, probe: Probe, record: Any) -> None:
        self.probe = probe
        self.record = record

    def map(self, value: Any) -> Any:
        if value == self.record and self.probe.add("failures") == 1:
            raise RuntimeError(f"induced failure at {value!r}")
        return value


class TagSubtask(MapFunction):
    """(subtask index, record): shows which subtask read what."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.subtask = runtime_context.get_index_of_this_subtask()

    def map(self, value: Any) -> Any:
        return self.subtask, value


# --------------------------------------------------------------------------- formats


def _text_case(d: Path) -> tuple[FileSource, list[Any]]:
    (d / "a.txt").write_bytes("first \u00e9t\u00e9 \u2603\r\n\nthird\nlast without newline".encode())
    (d / "b.txt").write_text(numbered_lines("b", 500))
    source = FileSource.for_record_stream_format(StreamFormat.text_line_format(), d).build()
    return source, [
        "first \u00e9t\u00e9 \u2603",
        "",
        "third",
        "last without newline",
        *[f"b:{i}" for i in range(500)],
    ]


def _csv_header_case(d: Path) -> tuple[FileSource, list[Any]]:
    (d / "people.csv").write_text(
        'id;name;note\n1;ann;"says ""hi""; twice"\n\n2;bob;"two\nlines"\n'
        + "".join(f"{i};p{i};\n" for i in range(3, 400))
    )
    source = FileSource.for_record_stream_format(CsvFormat(delimiter=";"), d / "people.csv").build()
    return source, [
        {"id": "1", "name": "ann", "note": 'says "hi"; twice'},
        {"id": "2", "name": "bob", "note": "two\nlines"},
        *[{"id": str(i), "name": f"p{i}", "note": ""} for i in range(3, 400)],
    ]


def _csv_no_header_case(d: Path) -> tuple[FileSource, list[Any]]:
    (d / "rows.csv").write_text("1,x\n2,y,extra\r\n" + "".join(f"{i},r{i}\n" for i in range(3, 300)))
    source = FileSource.for_record_stream_format(CsvFormat(has_header=False), d).build()
    return source, [["1", "x"], ["2", "y", "extra"], *[[str(i), f"r{i}"] for i in range(3, 300)]]


def _csv_column_names_case(d: Path) -> tuple[FileSource, list[Any]]:
    (d / "named.csv").write_text("ignored,header\n" + "".join(f"{i},v{i}\n" for i in range(300)))
    fmt = CsvFormat(column_names=["k", "v"])  # the file's header line is skipped
    source = FileSource.for_record_stream_format(fmt, d).build()
    return source, [{"k": str(i), "v": f"v{i}"} for i in range(300)]


def _json_case(d: Path) -> tuple[FileSource, list[Any]]:
    docs = [{"id": i, "tags": ["a", "b"][: i % 3], "nested": {"x": i / 2}} for i in range(300)]
    docs += [[1, 2], "plain", 7, None, True]
    (d / "events.jsonl").write_text(
        "\n".join(json.dumps(doc) for doc in docs[:150])
        + "\n\n  \n"
        + "\n".join(json.dumps(doc) for doc in docs[150:])
    )
    source = FileSource.for_record_stream_format(JsonLinesFormat(), d).build()
    return source, docs


def _parquet_case(d: Path) -> tuple[FileSource, list[Any]]:
    rows = write_parquet(d / "part-0.parquet", 1000, 0) + write_parquet(d / "part-1.parquet", 555, 1000)
    (d / "_SUCCESS").write_text("")
    fmt = ParquetFormat(columns=["id", "name"], batch_size=100)
    source = FileSource.for_bulk_file_format(fmt, d).build()
    return source, [{"id": r["id"], "name": r["name"]} for r in rows]


FORMAT_CASES = {
    "text": _text_case,
    "csv-header": _csv_header_case,
    "csv-no-header": _csv_no_header_case,
    "csv-column-names": _csv_column_names_case,
    "json-lines": _json_case,
    "parquet": _parquet_case,
}


def _key(record: Any) -> str:
    return json.dumps(record, sort_keys=True)


def _tagged(case: str, record: Any) -> tuple[str, Any]:
    return case, record


def test_every_format_is_read_exactly(tmp_path: Path, executor: str) -> None:
    """One job reads every format (a union of six sources: one Spark job, not six)."""
    env = env_for(executor)
    streams, expected = [], []
    for case, make in FORMAT_CASES.items():
        directory = tmp_path / case
        directory.mkdir()
        source, records = make(directory)
        streams.append(env.from_source(source, source_name=case).map(functools.partial(_tagged, case)))
        expected += [(case, _key(r)) for r in records]
    out = streams[0].union(*streams[1:]).execute_and_collect(limit=10**6)
    assert sorted((case, _key(r)) for case, r in out) == sorted(expected)


@pytest.mark.parametrize("case", list(FORMAT_CASES))
def test_a_restore_after_any_batch_continues_at_the_exact_record(tmp_path: Path, case: str) -> None:
    """Read in batches of 7, and after every batch hand the snapshot to a fresh reader
    (a restore): the records are exactly those of one uninterrupted read."""
    source, expected = FORMAT_CASES[case](tmp_path)
    source.validate()
    splits = source.create_splits(1)
    out: list[Any] = []
    restores = 0
    while True:
        reader = source.create_reader(SourceReaderContext(0, 1, restores))
        reader.add_splits(splits)
        batch = reader.poll_next(7)
        splits = reader.snapshot_state(restores)
        reader.close()
        if batch is None:
            break
        assert 1 <= len(batch) <= 7
        out.extend(batch)
        restores += 1
        assert restores <= len(expected), "the reader does not advance across restores"
    assert sorted(out, key=_key) == sorted(expected, key=_key)
    assert restores >= len(expected) // 7


def test_text_in_another_ascii_compatible_encoding(tmp_path: Path) -> None:
    (tmp_path / "latin.txt").write_bytes("caf\u00e9\r\nna\u00efve\n".encode("latin-1"))
    source = FileSource.for_record_stream_format(StreamFormat.text_line_format("latin-1"), tmp_path).build()
    source.validate()
    reader = source.create_reader(SourceReaderContext(0, 1, 0))
    reader.add_splits(source.create_splits(1))
    assert reader.poll_next(10) == ["caf\u00e9", "na\u00efve"]
    assert reader.poll_next(10) is None


def test_parquet_is_read_in_row_group_steps(tmp_path: Path) -> None:
    write_parquet(tmp_path / "big.parquet", 1000, row_group_size=300)
    source = FileSource.for_bulk_file_format(ParquetFormat(batch_size=64), tmp_path).build()
    source.validate()
    reader = source.create_reader(SourceReaderContext(0, 1, 0))
    reader.add_splits(source.create_splits(1))
    sizes, positions = [], []
    while (batch := reader.poll_next(1000)) is not None:
        sizes.append(len(batch))
        (split,) = reader.snapshot_state(0) or [None]
        positions.append((split.offset, split.records_after_offset) if split else None)
    assert sum(sizes) == 1000 and max(sizes) <= 64  # never more than one record batch at a time
    assert positions[0] == (0, 64) and (1, 64) in positions and (3, 64) in positions


# --------------------------------------------------------------------------- bounded mode


@pytest.mark.slow
def test_exactly_once_through_a_failure_mid_file(tmp_path: Path, executor: str) -> None:
    files, rows = 3, 4000
    for f in range(files):
        (tmp_path / f"data-{f}.csv").write_text("file,row\n" + "".join(f"{f},{r}\n" for r in range(rows)))
    probe = Probe()
    env = checkpointing_env(executor=executor, parallelism=2, interval_ms=100)
    source = FileSource.for_record_stream_format(CsvFormat(), tmp_path).build()
    # subtask 0 reads data-0 and data-2 (8000 rows): it fails at 40-70 % of 6000, inside data-0
    results = (
        env.from_source(source)
        .uid("files")
        .map(Throttle(0.0002))
        .uid("throttle")
        .map(FailOnceMap("failing", probe, expected_per_subtask=6000, seed=7))
        .uid("failing")
        .map(lambda row: (int(row["file"]), int(row["row"])))
        .execute_and_collect()
    )
    with results:
        out = list(results)
    assert probe.get("failures") >= 1
    assert results.job_client.restarts >= 1
    assert results.job_client.get_checkpoint_statistics()["counts"]["restored"] >= 1
    counts = Counter(out)
    assert [r for r, c in counts.items() if c > 1] == []
    assert set(counts) == {(f, r) for f in range(files) for r in range(rows)}


def test_a_bounded_directory_is_split_across_subtasks_skipping_hidden_files(
    tmp_path: Path, executor: str
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for f in range(7):
        (inbox / f"f{f}.txt").write_text(numbered_lines(f"f{f}", 50))
    (inbox / ".f7.txt.inprogress").write_text("hidden\n")
    (inbox / "_SUCCESS").write_text("marker\n")
    (inbox / "_temporary").mkdir()
    (inbox / "sub").mkdir()
    (inbox / "sub" / "nested.txt").write_text("not recursive\n")
    named = tmp_path / "_named_explicitly.txt"  # a path given by name is read, hidden or not
    named.write_text("explicit\n")
    source = FileSource.for_record_stream_format(StreamFormat.text_line_format(), inbox, named).build()
    out = (
        env_for(executor, parallelism=3)
        .from_source(source)
        .map(TagSubtask())
        .execute_and_collect(limit=10**6)
    )
    expected = [f"f{f}:{i}" for f in range(7) for i in range(50)] + ["explicit"]
    assert sorted(line for _, line in out) == sorted(expected)
    # one split per file, dealt out in path order: file k of the sorted list to subtask k % 3
    ordered = sorted([str(inbox / f"f{f}.txt") for f in range(7)] + [str(named)])
    owner = {Path(p).name: k % 3 for k, p in enumerate(ordered)}
    for subtask, line in out:
        name = "_named_explicitly.txt" if line == "explicit" else line.split(":")[0] + ".txt"
        assert subtask == owner[name], (line, subtask)
    assert len({subtask for subtask, _ in out}) == 3


def test_an_empty_directory_is_an_empty_bounded_stream(
    tmp_path: Path, executor: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "_SUCCESS").write_text("")
    source = FileSource.for_record_stream_format(StreamFormat.text_line_format(), tmp_path).build()
    assert env_for(executor).from_source(source).execute_and_collect(limit=10) == []
    assert "no files to read" in caplog.text


MALFORMED = {
    "bad.jsonl": ('{"a": 1}\n\n{"a": 2,}\n{"a": 3}\n', JsonLinesFormat(), 3, "malformed JSON"),
    "bad.csv": ("a,b\n1,2\n3,4\n5,6,7\n", CsvFormat(), 4, "3 fields but there are 2 columns"),
    "quote.csv": ('a,b\n1,"x"y\n', CsvFormat(), 2, "malformed CSV row"),
    "latin.txt": (b"ok\ncaf\xe9\n", StreamFormat.text_line_format(), 2, "not valid utf-8"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_input_fails_the_job_naming_file_and_line(tmp_path: Path, name: str) -> None:
    assert_malformed_input_fails_the_job(tmp_path, "local", name)


def test_malformed_input_fails_a_spark_job_naming_file_and_line(tmp_path: Path, spark_session: Any) -> None:
    # One format is enough on Spark: what Spark adds (the error crossing from a slot process
    # to the driver, no restart) is the same for every format; the formats' own errors are
    # the local cases above.
    assert_malformed_input_fails_the_job(tmp_path, "spark", "bad.csv")


def assert_malformed_input_fails_the_job(tmp_path: Path, executor: str, name: str) -> None:
    content, fmt, line, what = MALFORMED[name]
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    source = FileSource.for_record_stream_format(fmt, path).build()
    # with checkpointing, so restarts are allowed: a restart would fail the same way, so none happens
    env = checkpointing_env(executor=executor, parallelism=1, interval_ms=100)
    env.from_source(source).print()
    client = env.execute_async("malformed")
    with pytest.raises(JobExecutionError) as info:
        client.get_job_execution_result(timeout=60)
    assert f"{path}, line {line}: " in str(info.value)
    assert what in str(info.value)
    assert client.restarts == 0


def test_error_line_numbers_stay_right_after_a_restore(tmp_path: Path) -> None:
    path = tmp_path / "late-error.jsonl"
    path.write_text("".join(f'{{"i": {i}}}\n' for i in range(60)) + "{oops\n")
    source = FileSource.for_record_stream_format(JsonLinesFormat(), path).build()
    source.validate()
    reader = source.create_reader(SourceReaderContext(0, 1, 0))
    reader.add_splits(source.create_splits(1))
    assert len(reader.poll_next(40)) == 40
    restored = source.create_reader(SourceReaderContext(0, 1, 1))
    restored.add_splits(reader.snapshot_state(1))
    assert len(restored.poll_next(20)) == 20
    with pytest.raises(MalformedRecordError, match=r"late-error.jsonl, line 61: malformed JSON"):
        restored.poll_next(20)


def test_bad_configuration_is_rejected_when_the_job_is_built(tmp_path: Path) -> None:
    env = env_for("local")
    text = StreamFormat.text_line_format()
    with pytest.raises(FileNotFoundError, match=r"nope does not exist"):
        env.from_source(FileSource.for_record_stream_format(text, tmp_path / "nope").build())
    with pytest.raises(FileNotFoundError, match=r"gone does not exist"):
        env.from_source(
            FileSource.for_record_stream_format(text, tmp_path / "gone").monitor_continuously(0.5).build()
        )
    with pytest.raises(ValueError, match="at least one path"):
        FileSource.for_record_stream_format(text)
    with pytest.raises(TypeError, match="takes a StreamFormat"):
        FileSource.for_record_stream_format(ParquetFormat(), tmp_path)
    with pytest.raises(TypeError, match="takes a BulkFormat"):
        FileSource.for_bulk_file_format(CsvFormat(), tmp_path)
    with pytest.raises(ValueError, match="only local paths"):
        FileSource.for_record_stream_format(text, "s3://bucket/key")
    with pytest.raises(ValueError, match="discovery interval must be > 0"):
        FileSource.for_record_stream_format(text, tmp_path).monitor_continuously(0)
    with pytest.raises(TypeError, match="discovery interval is a number of seconds"):
        FileSource.for_record_stream_format(text, tmp_path).monitor_continuously("1s")
    with pytest.raises(ValueError, match="not ASCII-compatible"):
        StreamFormat.text_line_format("utf-16")
    with pytest.raises(ValueError, match="unknown encoding"):
        JsonLinesFormat(encoding="klingon")
    with pytest.raises(ValueError, match="delimiter must be a single character"):
        CsvFormat(delimiter=", ")
    with pytest.raises(TypeError, match="column_names must be a list of str"):
        CsvFormat(column_names="abc")
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        ParquetFormat(batch_size=0)
    # file:// URIs and relative paths become absolute paths (Spark workers may run elsewhere)
    built = FileSource.for_record_stream_format(text, f"file://{tmp_path}").build()
    assert built.paths == [str(tmp_path)]


# --------------------------------------------------------------------------- continuous mode


@pytest.mark.slow
def test_continuous_file_source_reads_files_appearing_while_running_once_also_across_a_failover(
    tmp_path: Path, executor: str
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    lines, files = 300, 10
    names = spread_names(inbox, "f", files)
    for name in names[:2]:
        write_atomically(inbox, name + ".txt", numbered_lines(name, lines))
    probe = Probe()
    env = checkpointing_env(executor=executor, parallelism=2, interval_ms=100)
    source = (
        FileSource.for_record_stream_format(StreamFormat.text_line_format(), inbox)
        .monitor_continuously(0.1)
        .build()
    )
    results = (
        env.from_source(source)
        .uid("files")
        .map(FailOnRecord(probe, f"{names[3]}:{lines // 2}"))
        .uid("fail")  # mid-file, 4th file
        .execute_and_collect("continuous")
    )
    out, reader = drain(results)
    try:
        for k, name in enumerate(names[2:], start=2):
            if k == 5:  # the rest appear after the failure: during the restart and after it
                deadline = time.monotonic() + 60
                while probe.get("failures") < 1:
                    assert time.monotonic() < deadline, "the failure was never injected"
                    time.sleep(0.02)
            write_atomically(inbox, name + ".txt", numbered_lines(name, lines))
            time.sleep(0.2)
        collect_until(out, lambda got: len(got) >= files * lines)
        time.sleep(1.0)  # a few more discoveries and checkpoints: duplicates would show now
    finally:
        results.close()
        reader.join(30)
    # seen twice: it failed the job, then was read once more after the restore
    assert probe.get("failures") == 2
    assert results.job_client.restarts >= 1
    counts = Counter(out)
    assert {line: c for line, c in counts.items() if c > 1} == {}
    assert set(counts) == {f"{name}:{i}" for name in names for i in range(lines)}


@pytest.mark.slow
def test_continuous_file_source_restores_at_another_parallelism(tmp_path: Path, executor: str) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    lines, files = 400, 10
    names = spread_names(inbox, "g", files)
    for name in names[:5]:
        write_atomically(inbox, name + ".txt", numbered_lines(name, lines))

    def pipeline(env: StreamExecutionEnvironment, delay_s: float) -> Any:
        source = (
            FileSource.for_record_stream_format(StreamFormat.text_line_format(), inbox)
            .monitor_continuously(0.05)
            .build()
        )
        return (
            env.from_source(source)
            .uid("files")
            .map(Throttle(delay_s))
            .uid("throttle")
            .key_by(lambda line: line.split(":")[0])
            .process(KeyedCounter(lines))
            .uid("counter")
        )

    env = checkpointing_env(
        executor=executor,
        parallelism=2,
        interval_ms=50,
        **{
            "execution.checkpointing.dir": str(tmp_path / "first"),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        },
    )
    results = pipeline(env, 0.001).execute_and_collect("first run")  # ~1000 lines/s per subtask
    first, reader = drain(results)
    wait_for_checkpoints(tmp_path / "first", 1)
    time.sleep(0.2)
    write_atomically(inbox, names[5] + ".txt", numbered_lines(names[5], lines))
    time.sleep(0.3)
    results.close()  # cancelled with files half read and files not read at all
    reader.join(30)
    retained = latest_checkpoint_dir(tmp_path / "first")
    for name in names[6:8]:  # appear while no job runs
        write_atomically(inbox, name + ".txt", numbered_lines(name, lines))

    env2 = checkpointing_env(
        executor=executor,
        parallelism=3,
        interval_ms=50,
        **{"execution.checkpointing.dir": str(tmp_path / "second")},
    )
    env2.set_restore_path(str(retained))
    results2 = pipeline(env2, 0.0).execute_and_collect("second run")
    second, reader2 = drain(results2)
    try:
        for name in names[8:]:  # appear while the restored job runs
            time.sleep(0.2)
            write_atomically(inbox, name + ".txt", numbered_lines(name, lines))
        expected = {(name, lines) for name in names}
        collect_until(second, lambda got: {tuple(o) for o in got + first} >= expected)
        time.sleep(1.0)  # duplicates would overflow a counter by now
    finally:
        results2.close()
        reader2.join(30)
    out = first + second
    assert [o for o in out if o[0] == "overflow"] == []  # no line of any file read twice
    assert set(out) == expected  # and every file completed
