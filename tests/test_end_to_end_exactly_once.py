"""Flink's end-to-end exactly-once test, in chandy: a Kafka topic with 3 partitions and
500 k records -> keyed running count -> FileSink (Parquet) and DeltaSink, with a task
killed mid-run; the committed output, read back with Spark and with deltalake, holds
every record exactly once.

On Spark the kill is a SIGKILL of a slot's process (the Python worker, with the
tasks deployed in it); on the local executor, where subtasks are threads, a task fails by an
exception. Each record ``i`` goes to key ``i % KEYS`` and comes out as the row
``(key, id, count)``, where ``count`` is the running count of its key: so the output is
exactly-once if and only if every id appears once and each key's counts are exactly
``1..n/KEYS`` (a replayed record would repeat a count, a lost one leave a gap).
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from chandy import StreamExecutionEnvironment
from chandy.connectors import (
    DeltaSink,
    FileSink,
    KafkaOffsetsInitializer,
    KafkaSource,
    ParquetBulkWriters,
    SimpleStringSchema,
)
from chandy.core.functions import KeyedProcessFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor
from tests.jobs import FailOnceMap, kill_a_slot_after_checkpoints
from tests.kafka_broker import KafkaBroker, unique_topic
from tests.probes import Probe
from tests.state_backends import on_rocksdb_too

N = 500_000
KEYS = 100
SCHEMA = pa.schema([("key", pa.int64()), ("id", pa.int64()), ("count", pa.int64())])


class RunningCount(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count"))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        yield {"key": ctx.get_current_key(), "id": value, "count": count}


@pytest.fixture(scope="module")
def orders(kafka_broker: KafkaBroker) -> str:
    topic = kafka_broker.create_topic(unique_topic("orders"), partitions=3)
    kafka_broker.produce(topic, (str(i) for i in range(N)))
    return topic


def assert_exactly_once(ids: list[int], keys: list[int], counts: list[int], where: str) -> None:
    assert len(ids) == N, f"{where}: {len(ids)} rows for {N} records"
    assert len(set(ids)) == N, f"{where}: {N - len(set(ids))} records repeated"
    assert all(key == i % KEYS for key, i in zip(keys, ids, strict=True)), where
    per_key = Counter(zip(keys, counts, strict=True))
    assert len(per_key) == N, f"{where}: a running count repeats (a record counted twice)"
    assert sorted(per_key) == [(k, c) for k in range(KEYS) for c in range(1, N // KEYS + 1)], where


@pytest.mark.slow
@on_rocksdb_too(executor="spark")
def test_kafka_to_parquet_and_delta_exactly_once_with_a_task_killed(
    kafka_broker: KafkaBroker, orders: str, tmp_path: Path, executor: str, spark_session: Any
) -> None:
    probe = Probe()
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(3)
    env.enable_checkpointing(200)
    env.configure({"restart-strategy.fixed-delay.delay": 0})
    source = (
        KafkaSource.builder()
        .set_bootstrap_servers(kafka_broker.bootstrap_servers)
        .set_topics(orders)
        .set_value_only_deserializer(SimpleStringSchema())
        .set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_bounded(KafkaOffsetsInitializer.latest())
        .build()
    )
    records = env.from_source(source, source_name="orders").uid("kafka").map(int).uid("parse")
    if executor == "local":
        records = records.map(FailOnceMap("fail", probe, N // 3, seed=11)).uid("fail")
    counted = records.key_by(lambda i: i % KEYS).process(RunningCount()).uid("count")
    counted.sink_to(
        FileSink.for_bulk_format(str(tmp_path / "parquet"), ParquetBulkWriters.for_records(SCHEMA)).build()
    ).uid("parquet")
    counted.sink_to(DeltaSink(str(tmp_path / "delta"), SCHEMA)).uid("delta")

    client = env.execute_async("kafka to parquet and delta")
    if executor == "spark":
        killer = threading.Thread(target=kill_a_slot_after_checkpoints, args=(client, 2), daemon=True)
        killer.start()
    client.get_job_execution_result(timeout=900)
    assert client.restarts >= 1

    parquet = spark_session.read.parquet(str(tmp_path / "parquet")).collect()
    assert_exactly_once(
        [r["id"] for r in parquet],
        [r["key"] for r in parquet],
        [r["count"] for r in parquet],
        "Parquet read by Spark",
    )

    from deltalake import DeltaTable

    delta = DeltaTable(str(tmp_path / "delta")).to_pyarrow_table()
    assert_exactly_once(
        delta["id"].to_pylist(),
        delta["key"].to_pylist(),
        delta["count"].to_pylist(),
        "Delta table read by deltalake",
    )
