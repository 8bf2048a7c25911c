"""Arrow batch sources and sinks: what they read and write, and exact positions through
snapshot / restore (also at another parallelism), with real files, Delta tables and Kafka."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from chandy import StreamExecutionEnvironment
from chandy.connectors.arrow_sources import ArrowDataGeneratorSource, ArrowNumberSequenceSource
from chandy.connectors.delta_sink import DeltaSink
from chandy.connectors.file_formats import (
    CsvBatchFormat,
    JsonBatchFormat,
    MalformedRecordError,
    ParquetBatchFormat,
)
from chandy.connectors.file_sink import FileSink, ParquetBulkWriters
from chandy.connectors.file_source import FileSource
from chandy.connectors.kafka_common import KafkaConnectorError
from chandy.connectors.kafka_sink import DeliveryGuarantee, KafkaRecordBatchSerializationSchema, KafkaSink
from chandy.connectors.kafka_source import KafkaOffsetsInitializer, KafkaRecordBatchDeserializer, KafkaSource
from chandy.core.connector import Source, SourceReader, SourceReaderContext
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.errors import InvalidProgramError
from chandy.task.operators.sink import SinkWriterOperator
from chandy.task.operators.source import InputStatus, SourceOperator
from tests.kafka_broker import KafkaBroker, unique_topic
from tests.operator_harness import OperatorHarness
from tests.probes import Probe
from tests.test_checkpointing_e2e import checkpointing_env

KAFKA_METADATA = ["kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key"]


def readers_of(source: Source, parallelism: int, splits: Sequence[Any] | None = None) -> list[SourceReader]:
    """One reader per subtask, dealt ``splits`` (a restore) or the source's fresh splits."""
    dealt = list(splits) if splits is not None else source.create_splits(parallelism)
    readers = []
    for i in range(parallelism):
        reader = source.create_reader(SourceReaderContext(i, parallelism, 0))
        reader.add_splits(dealt[i::parallelism])
        readers.append(reader)
    return readers


def drain_batches(reader: SourceReader, max_records: int, limit: int | None = None) -> list[pa.RecordBatch]:
    """Poll until the end (or ``limit`` polls); every non-empty poll is a RecordBatch."""
    out: list[pa.RecordBatch] = []
    polls = 0
    while limit is None or polls < limit:
        polls += 1
        batch = reader.poll_next(max_records)
        if batch is None:
            break
        if len(batch) == 0:
            continue
        assert isinstance(batch, pa.RecordBatch)
        assert batch.num_rows <= max_records
        out.append(batch)
    return out


def column_of(batches: list[pa.RecordBatch], name: str) -> list[Any]:
    return [v for b in batches for v in b.column(name).to_pylist()]


# ---------------------------------------------------------------------- number sequence


def test_number_sequence_reads_every_number_once_as_int64_batches() -> None:
    source = ArrowNumberSequenceSource(-5, 1000, column="n")
    assert source.columnar
    seen: list[int] = []
    for reader in readers_of(source, 3):
        batches = drain_batches(reader, 100)
        assert all(b.schema == pa.schema([("n", pa.int64())]) for b in batches)
        seen += column_of(batches, "n")
    assert sorted(seen) == list(range(-5, 1001))


def test_number_sequence_restores_at_another_parallelism_without_loss_or_duplicates() -> None:
    source = ArrowNumberSequenceSource(1, 10_000)
    first = readers_of(source, 2)
    emitted = [v for r in first for v in column_of(drain_batches(r, 333, limit=4), "value")]
    state = [s for r in first for s in r.snapshot_state(1)]
    for r in first:  # read after the checkpoint, lost with the failure
        drain_batches(r, 333, limit=2)
    after = [v for r in readers_of(source, 3, state) for v in column_of(drain_batches(r, 500), "value")]
    together = emitted + after
    assert len(together) == len(set(together))
    assert sorted(together) == list(range(1, 10_001))


def test_number_sequence_produces_tens_of_millions_of_rows_per_second() -> None:
    source = ArrowNumberSequenceSource(0, 50_000_000)
    (reader,) = readers_of(source, 1)
    start = time.perf_counter()
    rows = sum(b.num_rows for b in drain_batches(reader, 65_536))
    elapsed = time.perf_counter() - start
    assert rows == 50_000_001
    assert rows / elapsed > 30e6, f"{rows / elapsed / 1e6:.1f} M rows/s"


# ---------------------------------------------------------------------- data generator


def squares(indices: np.ndarray) -> dict[str, np.ndarray]:
    return {"i": indices, "square": indices * indices}


def test_data_generator_gets_index_arrays_and_accepts_batches_tables_and_dicts() -> None:
    def as_table(indices: np.ndarray) -> pa.Table:
        return pa.table({"i": indices})

    def as_batch(indices: np.ndarray) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"i": indices})

    for generator in (squares, as_table, as_batch):
        source = ArrowDataGeneratorSource(generator, count=1000)
        got = sorted(v for r in readers_of(source, 3) for v in column_of(drain_batches(r, 64), "i"))
        assert got == list(range(1000)), generator.__name__


def test_data_generator_restores_exactly_bounded_and_unbounded() -> None:
    for count in (5000, None):
        source = ArrowDataGeneratorSource(squares, count=count)
        first = readers_of(source, 2)
        emitted = [v for r in first for v in column_of(drain_batches(r, 100, limit=7), "i")]
        state = [s for r in first for s in r.snapshot_state(3)]
        for r in first:  # rows after the checkpoint are lost with the failure and made again
            drain_batches(r, 100, limit=3)
        restored = readers_of(source, 3, state)
        limit = None if count is not None else 10
        again = [v for r in restored for v in column_of(drain_batches(r, 100, limit=limit), "i")]
        together = emitted + again
        assert len(together) == len(set(together)), "an index was generated twice"
        if count is not None:
            assert sorted(together) == list(range(count))
        else:  # unbounded: the restored readers continue right after the checkpointed positions
            assert sorted(together) == list(range(len(together)))


def test_data_generator_rate_limit_emits_small_batches_promptly() -> None:
    source = ArrowDataGeneratorSource(squares, rate_per_second=1000)
    (reader,) = readers_of(source, 1)
    assert reader.idle_wait_s <= 0.001 + 1e-9
    first = reader.poll_next(65_536)
    assert isinstance(first, pa.RecordBatch) and first.num_rows == 1  # the first row goes out at once
    rows, sizes = 1, []
    start = time.monotonic()
    while time.monotonic() - start < 0.5:
        batch = reader.poll_next(65_536)
        if isinstance(batch, pa.RecordBatch) and batch.num_rows:
            sizes.append(batch.num_rows)
            rows += batch.num_rows
        time.sleep(reader.idle_wait_s)
    assert rows <= 1000 * 0.5 + 60, rows  # the rate (and a burst of at most 50 ms)
    assert rows >= 300, rows
    assert max(sizes) <= 60  # small batches: a row waits milliseconds, not for a full batch


def test_data_generator_raising_generator_moves_nothing() -> None:
    calls = []

    def flaky(indices: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(int(indices[0]))
        if len(calls) == 2:
            raise RuntimeError("boom")
        return {"i": indices}

    (reader,) = readers_of(ArrowDataGeneratorSource(flaky, count=100), 1)
    reader.poll_next(10)
    with pytest.raises(RuntimeError):
        reader.poll_next(10)
    batch = reader.poll_next(10)
    assert isinstance(batch, pa.RecordBatch)
    assert batch.column("i").to_pylist() == list(range(10, 20))


def test_data_generator_rejects_bad_arguments_and_results() -> None:
    with pytest.raises(TypeError, match="ArrowDataGeneratorSource: generator must be callable"):
        ArrowDataGeneratorSource("nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rate_per_second must be a finite number > 0"):
        ArrowDataGeneratorSource(squares, rate_per_second=0)
    (reader,) = readers_of(ArrowDataGeneratorSource(lambda i: list(i), count=10), 1)
    with pytest.raises(TypeError, match="must return a pyarrow.RecordBatch"):
        reader.poll_next(10)


def test_batch_source_refuses_an_event_time_strategy() -> None:
    strategy = WatermarkStrategy.for_monotonous_timestamps()
    with pytest.raises(InvalidProgramError, match="no_watermarks"):
        SourceOperator(ArrowNumberSequenceSource(0, 10), strategy)
    SourceOperator(ArrowNumberSequenceSource(0, 10), WatermarkStrategy.no_watermarks())


# ---------------------------------------------------------------------- files


def write_inputs(directory: Path, files: int, rows: int) -> pa.Table:
    """``files`` Parquet, CSV and JSON-lines files of ``rows`` rows each (three copies of one
    table), and the table of every row."""
    tables = []
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows, dtype=np.int64)
        table = pa.table({"id": ids, "name": [f"n{i}" for i in ids], "score": ids * 0.5})
        pq.write_table(table, directory / "parquet" / f"f{f}.parquet", row_group_size=rows // 3 + 1)
        pcsv.write_csv(table, directory / "csv" / f"f{f}.csv")
        with open(directory / "json" / f"f{f}.jsonl", "w") as out:
            for row in table.to_pylist():
                out.write(json.dumps(row) + "\n\n")  # blank lines are skipped
        tables.append(table)
    return pa.concat_tables(tables)


BATCH_FORMATS = {
    "parquet": lambda: ParquetBatchFormat(batch_size=70),
    "csv": lambda: CsvBatchFormat(block_size=2048),
    "json": lambda: JsonBatchFormat(block_size=2048),
}


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, pa.Table]:
    for kind in BATCH_FORMATS:
        (tmp_path / kind).mkdir()
    return tmp_path, write_inputs(tmp_path, files=3, rows=500)


def sorted_rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return sorted(pa.Table.from_batches(batches).to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize("kind", list(BATCH_FORMATS))
def test_file_batch_formats_read_every_row_as_typed_batches(kind: str, inputs: tuple[Path, pa.Table]) -> None:
    directory, table = inputs
    source = FileSource.for_batch_format(BATCH_FORMATS[kind](), directory / kind).build()
    source.validate()
    assert source.columnar
    batches = [b for r in readers_of(source, 2) for b in drain_batches(r, 64)]
    assert {b.schema for b in batches} == {table.schema}
    assert sorted_rows(batches) == table.to_pylist()


@pytest.mark.parametrize("kind", list(BATCH_FORMATS))
def test_file_batch_formats_restore_mid_file_at_another_parallelism(
    kind: str, inputs: tuple[Path, pa.Table]
) -> None:
    directory, table = inputs
    source = FileSource.for_batch_format(BATCH_FORMATS[kind](), directory / kind).build()
    source.validate()
    first = readers_of(source, 2)
    emitted = [b for r in first for b in drain_batches(r, 47, limit=9)]
    state = [s for r in first for s in r.snapshot_state(1)]
    assert any(s.records_after_offset or s.offset for s in state), "the snapshot is mid-file"
    for r in first:  # read after the checkpoint, lost with the failure
        drain_batches(r, 47, limit=3)
        r.close()
    restored = [b for r in readers_of(source, 3, state) for b in drain_batches(r, 64)]
    assert {b.schema for b in restored} == {table.schema}  # the types of the first read
    ids = [i for b in emitted + restored for i in b.column("id").to_pylist()]
    assert len(ids) == len(set(ids)), "a row was read twice"
    assert sorted_rows(emitted + restored) == table.to_pylist()


def test_file_batch_source_monitors_a_directory_continuously(tmp_path: Path) -> None:
    source = FileSource.for_batch_format(ParquetBatchFormat(), tmp_path).monitor_continuously(0.01).build()
    source.validate()
    (reader,) = readers_of(source, 1)
    assert reader.poll_next(100) == []
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / ".a.parquet")  # hidden until renamed
    os.rename(tmp_path / ".a.parquet", tmp_path / "a.parquet")
    got: list[int] = []
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        batch = reader.poll_next(100)
        if isinstance(batch, pa.RecordBatch):
            got += batch.column("id").to_pylist()
        time.sleep(0.01)
    assert got == [1, 2, 3]
    seen = reader.snapshot_shared_state(1)
    (again,) = readers_of(source, 1, [])
    again.restore_shared_state(seen)
    time.sleep(0.02)
    assert again.poll_next(100) == []  # the restored reader does not read a seen file again


def test_malformed_csv_fails_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("a,b\n1,2\n3\n")
    source = FileSource.for_batch_format(CsvBatchFormat(), path).build()
    source.validate()
    (reader,) = readers_of(source, 1)
    with pytest.raises(MalformedRecordError, match="bad.csv"):
        drain_batches(reader, 10)


def test_csv_batch_format_takes_an_explicit_schema_and_column_names(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("1;a\n2;b\n")
    schema = pa.schema([("k", pa.int32()), ("v", pa.string())])
    fmt = CsvBatchFormat(schema=schema, has_header=False, column_names=["k", "v"], delimiter=";")
    (reader,) = readers_of(FileSource.for_batch_format(fmt, path).build(), 1)
    (batch,) = drain_batches(reader, 10)
    assert batch.schema == schema and batch.to_pylist() == [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]


# ---------------------------------------------------------------------- sinks


def batch_of(ids: range) -> pa.RecordBatch:
    values = np.arange(ids.start, ids.stop, dtype=np.int64)
    return pa.RecordBatch.from_pydict({"key": values, "count": values * 10})


def write(harness: OperatorHarness, batch: pa.RecordBatch) -> None:
    harness.operator.process_batch(batch)  # type: ignore[arg-type]


def committed_parquet(directory: Path) -> list[int]:
    files = sorted(p for p in directory.iterdir() if not p.name.startswith((".", "_")))
    return sorted(k for f in files for k in pq.read_table(f).column("key").to_pylist())


def test_parquet_file_sink_commits_batches_when_the_checkpoint_completes(tmp_path: Path) -> None:
    sink = FileSink.for_bulk_format(str(tmp_path), ParquetBulkWriters.for_record_batches()).build()
    assert sink.columnar
    h = OperatorHarness(SinkWriterOperator(sink)).open()
    write(h, batch_of(range(0, 100)))
    write(h, batch_of(range(100, 150)))
    state = h.snapshot(1)
    write(h, batch_of(range(150, 200)))  # after the checkpoint: lost with the failure below
    assert committed_parquet(tmp_path) == []  # pre-committed only
    h.notify_complete(1)
    assert committed_parquet(tmp_path) == list(range(150))
    (part,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert pq.read_schema(part) == batch_of(range(1)).schema  # the batches' types, not rows'
    h.close()  # the task fails
    # the restore commits again (nothing twice) and writes the lost rows anew
    again = OperatorHarness(SinkWriterOperator(sink), attempt=1).open([state], restored_checkpoint_id=1)
    write(again, batch_of(range(150, 200)))
    again.snapshot(2)
    again.notify_complete(2)
    assert committed_parquet(tmp_path) == list(range(200))
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftovers


def test_parquet_file_sink_casts_to_a_given_schema_and_refuses_buckets(tmp_path: Path) -> None:
    schema = pa.schema([("key", pa.int32()), ("count", pa.float64())])
    sink = FileSink.for_bulk_format(str(tmp_path), ParquetBulkWriters.for_record_batches(schema)).build()
    h = OperatorHarness(SinkWriterOperator(sink)).open()
    write(h, batch_of(range(3)))
    h.end_input()
    (part,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert pq.read_table(part).schema == schema
    with pytest.raises(InvalidProgramError, match="bucket assigner"):
        FileSink.for_bulk_format(str(tmp_path), ParquetBulkWriters.for_record_batches()).with_bucket_assigner(
            lambda r: "x"
        ).build()


DELTA_SCHEMA = pa.schema([("key", pa.int64()), ("count", pa.int64())])


def delta_keys(path: Path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().column("key").to_pylist())


def test_delta_sink_appends_batches_exactly_once(tmp_path: Path) -> None:
    sink = DeltaSink.for_record_batches(str(tmp_path), DELTA_SCHEMA, app_id="arrow")
    sink.validate()
    assert sink.columnar
    h = OperatorHarness(SinkWriterOperator(sink)).open()
    # columns in another order, and an extra one: picked by the table's names
    write(h, pa.RecordBatch.from_pydict({"count": [10, 20], "extra": ["a", "b"], "key": [1, 2]}))
    state = h.snapshot(1)
    assert delta_keys(tmp_path) == []
    h.notify_complete(1)
    assert delta_keys(tmp_path) == [1, 2]
    write(h, batch_of(range(3, 5)))  # lost with the failure
    h.close()
    again = OperatorHarness(SinkWriterOperator(sink), attempt=1).open([state], restored_checkpoint_id=1)
    write(again, batch_of(range(3, 6)))
    again.snapshot(2)
    again.notify_complete(2)
    assert delta_keys(tmp_path) == [1, 2, 3, 4, 5]
    table = DeltaTable(str(tmp_path)).to_pyarrow_table()
    assert table.schema.field("count").type == pa.int64()
    with pytest.raises(ValueError, match="no column 'count'"):
        write(again, pa.RecordBatch.from_pydict({"key": [9]}))


# ---------------------------------------------------------------------- Kafka


def kafka_batch_source(
    broker: KafkaBroker, topic: str, deserializer: KafkaRecordBatchDeserializer, bounded: bool = True
) -> KafkaSource:
    builder = (
        KafkaSource.builder()
        .set_bootstrap_servers(broker.bootstrap_servers)
        .set_topics(topic)
        .set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_batch_deserializer(deserializer)
    )
    if bounded:
        builder.set_bounded(KafkaOffsetsInitializer.latest())
    return builder.build()


def poll_batches(
    readers: list[SourceReader], polls: int | None = None, timeout_s: float = 30
) -> list[pa.RecordBatch]:
    """Poll every reader until each ended (or ``polls`` non-empty batches in all)."""
    out: list[pa.RecordBatch] = []
    live = list(readers)
    deadline = time.monotonic() + timeout_s
    while live and (polls is None or len(out) < polls):
        assert time.monotonic() < deadline, "the Kafka readers did not end"
        for reader in list(live):
            batch = reader.poll_next(7)
            if batch is None:
                live.remove(reader)
            elif len(batch):
                assert isinstance(batch, pa.RecordBatch) and batch.num_rows <= 7
                out.append(batch)
            else:
                time.sleep(0.005)
    return out


def test_kafka_batch_source_reads_json_values_as_columns_and_restores_exactly(
    kafka_broker: KafkaBroker,
) -> None:
    topic = kafka_broker.create_topic(unique_topic("arrow"), partitions=3)
    kafka_broker.produce(topic, [json.dumps({"id": i, "name": f"n{i}"}) for i in range(300)])
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    source = kafka_batch_source(kafka_broker, topic, KafkaRecordBatchDeserializer.json(schema, metadata=True))
    assert source.columnar
    first = readers_of(source, 2)
    emitted = poll_batches(first, polls=12)
    state = [s for r in first for s in r.snapshot_state(1)]
    poll_batches(first, polls=5)  # read after the checkpoint: lost with the failure
    for r in first:
        r.close()
    restored = readers_of(source, 3, state)
    rest = poll_batches(restored)
    for r in restored:
        r.close()
    batches = emitted + rest
    assert {b.schema.names == [*schema.names, *KAFKA_METADATA] for b in batches} == {True}
    ids = [i for b in batches for i in b.column("id").to_pylist()]
    assert len(ids) == len(set(ids)), "a record was read twice"
    assert sorted(ids) == list(range(300))
    table = pa.Table.from_batches(batches)
    assert table.column("name").to_pylist() == [f"n{i}" for i in table.column("id").to_pylist()]
    assert set(table.column("kafka_partition").to_pylist()) == {0, 1, 2}


def test_kafka_batch_source_strings_bytes_and_tombstones(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(unique_topic("arrow"), partitions=1)
    kafka_broker.produce(topic, ["héllo", b"\xff\x00", '{\n "a": 1\n}'])
    (reader,) = readers_of(kafka_batch_source(kafka_broker, topic, KafkaRecordBatchDeserializer.bytes()), 1)
    values = [v for b in poll_batches([reader]) for v in b.column("value").to_pylist()]
    assert values == ["héllo".encode(), b"\xff\x00", b'{\n "a": 1\n}']
    reader.close()
    topic2 = kafka_broker.create_topic(unique_topic("arrow"), partitions=1)
    kafka_broker.produce(topic2, ['{"a": 1}', '{\n "a": 2\n}', '{"a": 3, "b": "x"}'])
    schema = pa.schema([("a", pa.int64())])
    (reader,) = readers_of(
        kafka_batch_source(kafka_broker, topic2, KafkaRecordBatchDeserializer.json(schema)), 1
    )
    rows = [r for b in poll_batches([reader]) for r in b.to_pylist()]
    assert rows == [{"a": 1}, {"a": 2}, {"a": 3}]  # pretty-printed values parse; "b" is not in the schema
    reader.close()


def kafka_batch_sink(broker: KafkaBroker, topic: str, prefix: str | None = None) -> KafkaSink:
    sink = (
        KafkaSink.builder()
        .set_bootstrap_servers(broker.bootstrap_servers)
        .set_record_serializer(KafkaRecordBatchSerializationSchema(topic, key_column="key"))
        .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .set_transactional_id_prefix(prefix or unique_topic("txn"))
        .build()
    )
    assert isinstance(sink, KafkaSink)
    return sink


def test_kafka_batch_sink_writes_a_message_per_row_in_transactions(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(unique_topic("arrow"), partitions=1)
    sink = kafka_batch_sink(kafka_broker, topic)
    assert sink.columnar
    h = OperatorHarness(SinkWriterOperator(sink)).open()
    write(h, batch_of(range(0, 3)))
    write(h, batch_of(range(3, 5)))
    checkpoint = h.snapshot(1)  # completes, but the notification never arrives: the task dies
    restored = OperatorHarness(
        SinkWriterOperator(kafka_batch_sink(kafka_broker, topic, sink.transactional_id_prefix)), attempt=1
    ).open([checkpoint], restored_checkpoint_id=1)  # redoes checkpoint 1's transaction
    write(restored, batch_of(range(5, 6)))
    restored.snapshot(2)
    restored.notify_complete(2)
    restored.close()
    records = kafka_broker.consume_all(topic)
    # Tansu keeps the aborted original of the redone transaction too: count distinct rows
    got = {(r.key, r.value) for r in records}
    assert got == {
        (str(k).encode(), json.dumps({"key": k, "count": k * 10}).replace(" ", "").encode()) for k in range(6)
    }


def test_kafka_batch_serializer_value_column_and_errors() -> None:
    batch = pa.RecordBatch.from_pydict({"k": [1, None], "v": ["a", "b"], "raw": [b"\x00", None]})
    assert KafkaRecordBatchSerializationSchema("t", value_column="v", key_column="k").serialize_batch(
        batch
    ) == [
        (b"1", b"a"),
        (None, b"b"),
    ]
    assert KafkaRecordBatchSerializationSchema("t", value_column="raw").serialize_batch(batch) == [
        (None, b"\x00"),
        (None, None),
    ]
    with pytest.raises(KafkaConnectorError, match="no column 'nope'"):
        KafkaRecordBatchSerializationSchema("t", value_column="nope").serialize_batch(batch)


def test_a_batch_sink_fed_records_names_the_conversion(tmp_path: Path) -> None:
    sink = FileSink.for_bulk_format(str(tmp_path), ParquetBulkWriters.for_record_batches()).build()
    h = OperatorHarness(SinkWriterOperator(sink)).open()
    with pytest.raises(InvalidProgramError, match="to_batches"):
        h.process({"key": 1})


# ---------------------------------------------------------------------- whole jobs


class FailOnceAt:
    """A batch function that raises once (in the whole job, across restarts) when a batch
    holds ``column == at`` (``at=None``: the first batch once the test armed the probe); the
    rows pass through unchanged, each batch after ``delay_s``."""

    def __init__(self, probe: Probe, column: str, at: int | None, delay_s: float = 0.0) -> None:
        self.probe, self.column, self.at, self.delay_s = probe, column, at, delay_s

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(self.delay_s)
        due = (
            self.probe.get("armed") > 0
            if self.at is None
            else self.at in batch.column(self.column).to_pylist()
        )
        if due and self.probe.add("failures") == 1:
            raise RuntimeError(f"induced failure at {self.column} {batch.column(self.column)[0]}")
        return batch


def execute_failing_after_a_checkpoint(env: StreamExecutionEnvironment, probe: Probe, name: str) -> None:
    """Run the job; once a checkpoint completed, arm the ``FailOnceAt(at=None)`` in it, so
    that the job fails and restores from a checkpoint; wait for its end."""
    client = env.execute_async(name)
    deadline = time.monotonic() + 60
    while client.get_checkpoint_statistics()["counts"]["completed"] < 1:
        assert time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.01)
    probe.add("armed")
    client.get_job_execution_result(timeout=120)
    assert probe.get("failures") >= 1


def test_job_generator_to_parquet_files_exactly_once_through_a_failure(tmp_path: Path, executor: str) -> None:
    n = 20_000
    probe = Probe()
    env = checkpointing_env(parallelism=2, interval_ms=100, executor=executor)
    stream = env.from_source(ArrowDataGeneratorSource(squares, count=n, rate_per_second=20_000), None, "gen")
    assert type(stream).__name__ == "BatchStream"
    (
        stream.uid("gen")
        .map_batches(FailOnceAt(probe, "i", 3 * n // 4))
        .uid("fail")
        .sink_to(FileSink.for_bulk_format(str(tmp_path), ParquetBulkWriters.for_record_batches()).build())
        .uid("parquet")
    )
    env.execute("generator to parquet")
    assert probe.get("failures") >= 1
    files = [p for p in tmp_path.iterdir() if not p.name.startswith((".", "_"))]
    table = pa.concat_tables(pq.read_table(f) for f in files)
    assert sorted(table.column("i").to_pylist()) == list(range(n))  # each once
    assert table.schema == pa.schema([("i", pa.int64()), ("square", pa.int64())])


def test_job_csv_files_to_delta_exactly_once_through_a_failure(tmp_path: Path) -> None:
    n = 20_000
    (tmp_path / "in").mkdir()
    ids = np.arange(n, dtype=np.int64)
    for f in range(3):
        part = ids[f::3]
        pcsv.write_csv(pa.table({"key": part, "count": part * 10}), tmp_path / "in" / f"{f}.csv")
    probe = Probe()
    env = checkpointing_env(parallelism=2, interval_ms=50, **{"chandy.network.arrow-batch-size": 1000})
    (
        env.from_source(FileSource.for_batch_format(CsvBatchFormat(block_size=8192), tmp_path / "in").build())
        .uid("csv")
        .map_batches(FailOnceAt(probe, "key", None, delay_s=0.05))
        .uid("fail")
        .sink_to(DeltaSink.for_record_batches(str(tmp_path / "table"), DELTA_SCHEMA))
        .uid("delta")
    )
    execute_failing_after_a_checkpoint(env, probe, "csv to delta")
    assert delta_keys(tmp_path / "table") == list(range(n))


@pytest.mark.slow
def test_job_kafka_to_kafka_on_the_batch_path(kafka_broker: KafkaBroker) -> None:
    n = 20_000
    source_topic = kafka_broker.create_topic(unique_topic("arrow-in"), partitions=2)
    sink_topic = kafka_broker.create_topic(unique_topic("arrow-out"), partitions=1)
    kafka_broker.produce(source_topic, [json.dumps({"key": i, "count": i * 10}) for i in range(n)])
    probe = Probe()
    env = checkpointing_env(parallelism=2, interval_ms=50, **{"chandy.network.arrow-batch-size": 500})
    (
        env.from_source(
            kafka_batch_source(kafka_broker, source_topic, KafkaRecordBatchDeserializer.json(DELTA_SCHEMA))
        )
        .uid("kafka-in")
        .map_batches(FailOnceAt(probe, "key", None, delay_s=0.05))
        .uid("fail")
        .sink_to(kafka_batch_sink(kafka_broker, sink_topic))
        .uid("kafka-out")
    )
    execute_failing_after_a_checkpoint(env, probe, "kafka to kafka")
    # Tansu keeps aborted records (a real Kafka's read_committed readers skip them): distinct rows
    got = {json.loads(r.value)["key"] for r in kafka_broker.consume_all(sink_topic)}
    assert got == set(range(n))


def test_job_number_sequence_collects_rows() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    rows = env.from_source(ArrowNumberSequenceSource(1, 5000)).execute_and_collect(limit=10**6)
    assert sorted(r["value"] if isinstance(r, dict) else r.value for r in rows) == list(range(1, 5001))


def test_source_operator_emits_batches_and_restores_from_its_split_state() -> None:
    emitted: list[Any] = []
    op = SourceOperator(ArrowNumberSequenceSource(0, 99), WatermarkStrategy.no_watermarks())
    h = OperatorHarness(op, output=emitted.append).open()
    assert op.emit_next(30) is InputStatus.MORE_AVAILABLE
    snapshot = h.snapshot(1)
    assert op.emit_next(30) is InputStatus.MORE_AVAILABLE  # lost with the failure
    restored: list[Any] = []
    op2 = SourceOperator(ArrowNumberSequenceSource(0, 99))
    OperatorHarness(op2, output=restored.append, attempt=1).open([snapshot], restored_checkpoint_id=1)
    while op2.emit_next(30) is not InputStatus.END_OF_INPUT:
        pass
    batches = [b for b in emitted[:1] + restored if isinstance(b, pa.RecordBatch)]
    assert [v for b in batches for v in b.column("value").to_pylist()] == list(range(100))


def delta_sink_committed_checkpoint_1(path: Path) -> tuple[DeltaSink, OperatorHarness, Any]:
    """A batch DeltaSink subtask that wrote keys 0..2 and committed them with checkpoint 1."""
    sink = DeltaSink.for_record_batches(str(path), DELTA_SCHEMA, app_id="arrow")
    sink.validate()
    h = OperatorHarness(SinkWriterOperator(sink)).open()
    write(h, batch_of(range(0, 3)))
    state = h.snapshot(1)
    h.notify_complete(1)
    return sink, h, state


def test_delta_sink_commits_the_end_of_input_of_an_attempt_restored_after_a_commit(tmp_path: Path) -> None:
    """A restored attempt that reaches the end of its input before its first checkpoint
    commits what it wrote: the end-of-input commit was numbered one past the attempt's last
    checkpoint (0 in a new attempt), which the restored checkpoint's commit (1) had already
    passed, so the committer skipped it as done and the rows were lost."""
    sink, h, state = delta_sink_committed_checkpoint_1(tmp_path)
    write(h, batch_of(range(3, 5)))  # lost with the failure
    h.close()
    again = OperatorHarness(SinkWriterOperator(sink), attempt=1).open([state], restored_checkpoint_id=1)
    write(again, batch_of(range(3, 6)))
    again.end_input()
    assert delta_keys(tmp_path) == [0, 1, 2, 3, 4, 5]


def test_delta_sink_redo_after_an_end_of_input_commit_adds_nothing_twice(tmp_path: Path) -> None:
    """A subtask committed its end of input, then the job failed (another subtask) and
    restored from checkpoint 1: the replayed rows, committed again under later checkpoints,
    are already in the table (the end-of-input commit was numbered 2, so checkpoint 3's redo
    went in a second time)."""
    sink, h, state = delta_sink_committed_checkpoint_1(tmp_path)
    write(h, batch_of(range(3, 6)))
    h.end_input()  # committed: 0..5
    again = OperatorHarness(SinkWriterOperator(sink), attempt=1).open([state], restored_checkpoint_id=1)
    write(again, batch_of(range(3, 4)))
    again.snapshot(2)
    again.notify_complete(2)
    write(again, batch_of(range(4, 6)))
    again.snapshot(3)
    again.notify_complete(3)
    again.end_input()
    assert delta_keys(tmp_path) == [0, 1, 2, 3, 4, 5]
