"""KafkaSource against a real broker (Tansu, see tests/kafka_broker.py): bounded reads at
any parallelism, every kind of starting offset, exactly-once through a failure, offsets
committed back to Kafka, restore at another parallelism, and clear errors."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from chandy import ConfigurationError, JobExecutionError, StreamExecutionEnvironment
from chandy.connectors import (
    JsonSchema,
    KafkaOffsetResetStrategy,
    KafkaOffsetsInitializer,
    KafkaRecord,
    KafkaRecordDeserializationSchema,
    KafkaSource,
    KafkaSourceBuilder,
    SimpleStringSchema,
)
from tests.jobs import FailOnceMap, KeyedCounter, Throttle
from tests.kafka_broker import KafkaBroker, free_port, unique_topic
from tests.probes import Probe
from tests.test_checkpointing_e2e import (
    checkpointing_env,
    drain,
    latest_checkpoint_dir,
)


def builder(broker: KafkaBroker, *topics: str) -> KafkaSourceBuilder:
    return (
        KafkaSource.builder()
        .set_bootstrap_servers(broker.bootstrap_servers)
        .set_topics(*topics)
        .set_value_only_deserializer(SimpleStringSchema())
    )


def plain_env(executor: str, parallelism: int = 2) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    return env


def wait_until(condition: Any, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_for_first_checkpoint(results: Any) -> None:
    """A completed checkpoint means every reader resolved its starting offsets."""
    wait_until(
        lambda: results.job_client.get_checkpoint_statistics()["counts"]["completed"] >= 1,
        "the first checkpoint",
    )


@pytest.fixture
def topic3(kafka_broker: KafkaBroker) -> str:
    return kafka_broker.create_topic(unique_topic(), partitions=3)


# ------------------------------------------------------------------------------ bounded reads


@pytest.mark.parametrize(
    ("on", "parallelism"),
    # Which reader gets which partition is decided alike on both executors; on Spark, 2 and 3
    # take the same path (the splits sent to several slot processes), 1 reads all three alone.
    [("local", 1), ("local", 2), ("local", 3), ("spark", 1), ("spark", 3)],
    ids=["local-1", "local-2", "local-3", "spark-1", "spark-3"],
)
def test_bounded_read_of_three_partitions_is_exact(
    kafka_broker: KafkaBroker, topic3: str, on: str, parallelism: int, request: pytest.FixtureRequest
) -> None:
    if on == "spark":
        request.getfixturevalue("spark_session")
    records = [f"r{i}" for i in range(9_000)]
    kafka_broker.produce(topic3, records)
    source = (
        builder(kafka_broker, topic3)
        .set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_bounded(KafkaOffsetsInitializer.latest())
        .build()
    )
    env = plain_env(on, parallelism)
    out = env.from_source(source, None, "kafka").execute_and_collect(limit=10**6)
    assert sorted(out) == sorted(records)


def test_records_with_metadata_and_an_empty_partition(
    kafka_broker: KafkaBroker, topic3: str, executor: str
) -> None:
    kafka_broker.produce(topic3, [(f"k{i}", f"v{i}") for i in range(10)], partition=0, timestamp=1_000)
    kafka_broker.produce(topic3, [(None, "x")], partition=2, timestamp=2_000)  # partition 1 stays empty
    source = (
        builder(kafka_broker, topic3)
        .set_deserializer(
            KafkaRecordDeserializationSchema.records(SimpleStringSchema(), SimpleStringSchema())
        )
        .set_bounded(KafkaOffsetsInitializer.latest())
        .build()
    )
    out = plain_env(executor, 3).from_source(source).execute_and_collect(limit=100)
    assert all(isinstance(r, KafkaRecord) for r in out)
    got = sorted((r.partition, r.offset, r.key, r.value, r.timestamp, r.topic) for r in out)
    assert got == (
        [(0, i, f"k{i}", f"v{i}", 1_000, topic3) for i in range(10)] + [(2, 0, None, "x", 2_000, topic3)]
    )


def test_topic_pattern_reads_every_matching_topic(kafka_broker: KafkaBroker, executor: str) -> None:
    prefix = unique_topic("orders")
    a = kafka_broker.create_topic(f"{prefix}-eu", partitions=2)
    b = kafka_broker.create_topic(f"{prefix}-us", partitions=1)
    other = kafka_broker.create_topic(f"x{prefix}-eu", partitions=1)
    kafka_broker.produce(a, [f"a{i}" for i in range(100)])
    kafka_broker.produce(b, [f"b{i}" for i in range(50)])
    kafka_broker.produce(other, ["not me"])
    source = (
        KafkaSource.builder()
        .set_bootstrap_servers(kafka_broker.bootstrap_servers)
        .set_topic_pattern(f"{prefix}-.*")
        .set_value_only_deserializer(SimpleStringSchema())
        .set_bounded(KafkaOffsetsInitializer.latest())
        .build()
    )
    out = plain_env(executor).from_source(source).execute_and_collect(limit=10**6)
    assert sorted(out) == sorted([f"a{i}" for i in range(100)] + [f"b{i}" for i in range(50)])


# ------------------------------------------------------------------------------ starting offsets


def test_latest_reads_only_records_produced_after_the_start(
    kafka_broker: KafkaBroker, topic3: str, executor: str
) -> None:
    kafka_broker.produce(topic3, [f"old{i}" for i in range(1_000)])
    source = builder(kafka_broker, topic3).set_starting_offsets(KafkaOffsetsInitializer.latest()).build()
    env = checkpointing_env(executor=executor, interval_ms=100)
    results = env.from_source(source).execute_and_collect()
    out, reader = drain(results)
    try:
        wait_for_first_checkpoint(results)
        new = [f"new{i}" for i in range(300)]
        kafka_broker.produce(topic3, new)
        wait_until(lambda: len(out) >= len(new), "the new records")
        time.sleep(0.3)  # nothing else comes
    finally:
        results.close()
        reader.join(30)
    assert sorted(out) == sorted(new)


def test_timestamp_starts_at_the_first_record_at_or_after_it(
    kafka_broker: KafkaBroker, topic3: str, executor: str
) -> None:
    start = int(time.time() * 1000)
    kafka_broker.produce(topic3, [f"early{i}" for i in range(600)], timestamp=start - 60_000)
    late = [f"late{i}" for i in range(600)]
    kafka_broker.produce(topic3, late, timestamp=start)
    source = (
        builder(kafka_broker, topic3)
        .set_starting_offsets(KafkaOffsetsInitializer.timestamp(start - 1_000))
        .set_bounded(KafkaOffsetsInitializer.latest())
        .build()
    )
    out = plain_env(executor).from_source(source).execute_and_collect(limit=10**6)
    assert sorted(out) == sorted(late)


def test_offsets_are_committed_to_kafka_when_checkpoints_complete(
    kafka_broker: KafkaBroker, topic3: str, executor: str
) -> None:
    group = unique_topic("group")
    kafka_broker.produce(topic3, [f"r{i}" for i in range(3_000)])
    ends = kafka_broker.end_offsets(topic3)
    source = builder(kafka_broker, topic3).set_group_id(group).build()  # unbounded
    env = checkpointing_env(executor=executor, interval_ms=100)
    results = env.from_source(source).execute_and_collect()
    out, reader = drain(results)
    try:
        wait_until(lambda: kafka_broker.committed_offsets(group, topic3) == ends, f"committed offsets {ends}")
    finally:
        results.close()
        reader.join(30)
    assert len(out) == 3_000


def test_committed_offsets_start_where_the_group_left_off(
    kafka_broker: KafkaBroker, topic3: str, executor: str
) -> None:
    group = unique_topic("group")
    first = [f"a{i}" for i in range(1_500)]
    kafka_broker.produce(topic3, first)
    # A bounded job commits its final offsets (the final checkpoint's) before it ends.
    source = (
        builder(kafka_broker, topic3)
        .set_group_id(group)
        .set_starting_offsets(KafkaOffsetsInitializer.committed_offsets(KafkaOffsetResetStrategy.EARLIEST))
        .set_bounded(KafkaOffsetsInitializer.latest())
        .build()
    )
    env = checkpointing_env(executor=executor, interval_ms=100)
    assert sorted(env.from_source(source).execute_and_collect(limit=10**6)) == sorted(first)
    wait_until(
        lambda: kafka_broker.committed_offsets(group, topic3) == kafka_broker.end_offsets(topic3),
        "the first job's offsets",
    )

    second = [f"b{i}" for i in range(900)]
    kafka_broker.produce(topic3, second)
    source = (
        builder(kafka_broker, topic3)
        .set_group_id(group)
        .set_starting_offsets(KafkaOffsetsInitializer.committed_offsets())
        .set_bounded(KafkaOffsetsInitializer.latest())
        .build()
    )
    out = plain_env(executor, 3).from_source(source).execute_and_collect(limit=10**6)
    assert sorted(out) == sorted(second)


# ------------------------------------------------------------------------------ exactly-once


def test_exactly_once_through_an_induced_failure(
    kafka_broker: KafkaBroker, topic3: str, executor: str
) -> None:
    n, keys, p = 51_000, 100, 2
    kafka_broker.produce(topic3, range(n))
    probe = Probe()
    env = checkpointing_env(parallelism=p, interval_ms=100, executor=executor)
    source = (
        KafkaSource.builder()
        .set_bootstrap_servers(kafka_broker.bootstrap_servers)
        .set_topics(topic3)
        .set_value_only_deserializer(JsonSchema())
        .set_bounded(KafkaOffsetsInitializer.latest())
        .build()
    )
    out = (
        env.from_source(source)
        .uid("kafka")
        .map(FailOnceMap("failing", probe, n // p, seed=7))
        .uid("failing")
        .key_by(lambda x: x % keys)
        .process(KeyedCounter(n // keys))
        .uid("counter")
        .execute_and_collect("kafka exactly once", limit=10**6)
    )
    assert probe.get("failures") >= 1  # the failure happened (and the restore replayed past it)
    assert sorted(out) == [(k, n // keys) for k in range(keys)]


def checkpoint_ids(base: Path) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1]) for p in base.glob("*/chk-*/_metadata"))


def test_restore_at_another_parallelism_continues_without_duplicates_or_gaps(
    kafka_broker: KafkaBroker, topic3: str, tmp_path: Path, executor: str
) -> None:
    before = [f"a{i}" for i in range(6_000)]
    kafka_broker.produce(topic3, before)
    retain = {
        "execution.checkpointing.dir": str(tmp_path),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    }
    env = checkpointing_env(parallelism=2, interval_ms=50, executor=executor, **retain)
    results = (
        env.from_source(builder(kafka_broker, topic3).build())
        .uid("kafka")
        .map(Throttle(0.0))
        .uid("throttle")
        .execute_and_collect("first run")
    )
    first, reader = drain(results)
    try:
        wait_until(lambda: len(first) >= len(before), "the first run's records")
        # Cancel once a checkpoint after the last record completed: the retained checkpoint
        # then holds the partitions' ends and no collected records not yet delivered.
        # (A retained checkpoint's undelivered collect results are published again by the
        # job that restores it, to a client that never saw them.)
        last_with_records = checkpoint_ids(tmp_path)[-1]
        wait_until(lambda: checkpoint_ids(tmp_path)[-1] > last_with_records, "a quiet checkpoint")
    finally:
        results.close()
        reader.join(30)
    retained = latest_checkpoint_dir(tmp_path)
    assert sorted(first) == sorted(before)

    after = [f"b{i}" for i in range(3_000)]
    kafka_broker.produce(topic3, after)
    env2 = checkpointing_env(
        parallelism=3,
        interval_ms=100,
        executor=executor,
        **{"execution.checkpointing.dir": str(tmp_path / "second")},
    )
    env2.set_restore_path(str(retained))
    source = builder(kafka_broker, topic3).set_bounded(KafkaOffsetsInitializer.latest()).build()
    second = (
        env2.from_source(source)
        .uid("kafka")
        .map(Throttle(0.0))
        .uid("throttle")
        .execute_and_collect("second run", limit=10**6)
    )
    assert sorted(second) == sorted(after)


# ------------------------------------------------------------------------------ errors


def test_a_topic_that_does_not_exist_fails_the_job_naming_it(
    kafka_broker: KafkaBroker, executor: str
) -> None:
    missing = unique_topic("missing")
    env = plain_env(executor)
    env.from_source(builder(kafka_broker, missing).build()).print()
    with pytest.raises(JobExecutionError) as info:
        env.execute()
    message = str(info.value)
    assert f"'{missing}' does not exist" in message and kafka_broker.bootstrap_servers in message
    assert kafka_broker.partitions(missing) == []  # and it was not auto-created


def test_a_missing_topic_fails_a_checkpointed_job_at_once_instead_of_restarting(
    kafka_broker: KafkaBroker,
) -> None:
    # checkpointing on means the default restart strategy retries without limit: a
    # missing topic must still end the job, since every restart would fail the same way
    env = plain_env("local")
    env.enable_checkpointing(100)
    env.from_source(builder(kafka_broker, unique_topic("missing")).build()).print()
    client = env.execute_async()
    with pytest.raises(JobExecutionError, match="does not exist"):
        client.get_job_execution_result(timeout=30)
    assert client.restarts == 0


@pytest.mark.slow
def test_an_unreachable_broker_fails_the_job_within_seconds(executor: str) -> None:
    servers = f"127.0.0.1:{free_port()}"
    source = (
        KafkaSource.builder()
        .set_bootstrap_servers(servers)
        .set_topics("orders")
        .set_value_only_deserializer(SimpleStringSchema())
        .set_property("request.timeout.ms", 2000)
        .build()
    )
    env = plain_env(executor)
    env.from_source(source).print()
    started = time.monotonic()
    with pytest.raises(JobExecutionError) as info:
        env.execute()
    assert time.monotonic() - started < 20
    assert servers in str(info.value) and "did not answer within 2 s" in str(info.value)


def test_committed_offsets_without_a_commit_and_no_reset_fail_naming_the_partition(
    kafka_broker: KafkaBroker, topic3: str, executor: str
) -> None:
    source = (
        builder(kafka_broker, topic3)
        .set_group_id(unique_topic("group"))
        .set_starting_offsets(KafkaOffsetsInitializer.committed_offsets())
        .set_bounded(KafkaOffsetsInitializer.latest())
        .build()
    )
    env = plain_env(executor, 1)
    env.from_source(source).print()
    with pytest.raises(JobExecutionError) as info:
        env.execute()
    assert f"{topic3}-0 has no committed offset" in str(info.value)
    assert "KafkaOffsetResetStrategy.EARLIEST" in str(info.value)


@pytest.mark.parametrize(
    ("configure", "expected"),
    [
        (lambda b: b.set_bootstrap_servers(""), "'bootstrap.servers' is not set"),
        (lambda b: b.set_topics(), "set_topics() takes one or more topic names"),
        (lambda b: b.set_topic_pattern("orders.*"), "set_topics and set_topic_pattern were both called"),
        (
            lambda b: b.set_starting_offsets("earliest"),
            "set_starting_offsets() takes a KafkaOffsetsInitializer",
        ),
        (
            lambda b: b.set_bounded(KafkaOffsetsInitializer("newest")),
            "unknown offsets initializer kind 'newest'",
        ),
        (
            lambda b: b.set_starting_offsets(KafkaOffsetsInitializer.committed_offsets()),
            "needs a consumer group; call set_group_id",
        ),
        (
            lambda b: b.set_starting_offsets(KafkaOffsetsInitializer.timestamp(-5)),
            "timestamp() takes milliseconds",
        ),
        (
            lambda b: b.set_property("no.such.property", "1"),
            'No such configuration property: "no.such.property"',
        ),
        (lambda b: b.set_property("enable.auto.commit", "true"), "'enable.auto.commit' cannot be true"),
        (lambda b: b.set_property("request.timeout.ms", "soon"), "'request.timeout.ms' takes milliseconds"),
        (lambda b: b.set_value_only_deserializer(str), "takes a schema with a deserialize() method"),
    ],
)
def test_bad_settings_are_refused_when_the_job_is_built(configure: Any, expected: str) -> None:
    base = (
        KafkaSource.builder()
        .set_bootstrap_servers("127.0.0.1:9")
        .set_topics("orders")
        .set_value_only_deserializer(SimpleStringSchema())
    )
    with pytest.raises(ConfigurationError) as info:
        configure(base).build()
    assert expected in str(info.value)


def test_missing_topics_and_deserializer_are_named() -> None:
    with pytest.raises(ConfigurationError, match="no topics to read; call set_topics"):
        KafkaSource.builder().set_bootstrap_servers("127.0.0.1:9").build()
    with pytest.raises(ConfigurationError, match="no deserializer; call set_value_only_deserializer"):
        KafkaSource.builder().set_bootstrap_servers("127.0.0.1:9").set_topics("orders").build()
    # from_source checks a source built without the builder just the same
    unchecked = KafkaSource(
        {"bootstrap.servers": "127.0.0.1:9"},
        ["orders"],
        None,
        None,
        KafkaOffsetsInitializer.earliest(),
        None,
        False,
        None,
    )
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    with pytest.raises(ConfigurationError, match="no deserializer"):
        env.from_source(unchecked)
