"""KafkaSink against a real broker (Tansu, see tests/kafka_broker.py).

Tansu's transactions do not isolate (a ``read_committed`` reader also sees aborted
records), so the EXACTLY_ONCE tests check what chandy does with the transactions:
the marker each transaction commits atomically with its records (visible only once
the transaction commits), that nothing is committed before its checkpoint completes,
that a restore commits a lost transaction exactly once, and that it fences the
transactions a failed attempt left open. Scenarios where no transaction is ever
aborted check the records themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from chandy import ConfigurationError, JobExecutionError, StreamExecutionEnvironment
from chandy.connectors import (
    DeliveryGuarantee,
    JsonSchema,
    KafkaConnectorError,
    KafkaRecordSerializationSchema,
    KafkaSink,
    SimpleStringSchema,
)
from chandy.connectors.kafka_sink import (
    END_OF_INPUT_MARKER,
    TRANSACTION_POOL_SIZE,
    TransactionalKafkaWriter,
)
from chandy.task.operators.sink import SinkWriterOperator
from tests.jobs import FailOnceMap, Throttle
from tests.kafka_broker import KafkaBroker, free_port, unique_topic
from tests.operator_harness import OperatorHarness
from tests.probes import Probe

#: What committing a fenced transaction ends in.
FENCED = "(?i)fenced|Timed out"


def sink(
    broker: KafkaBroker,
    topic: str,
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
    prefix: str | None = None,
) -> KafkaSink:
    builder = (
        KafkaSink.builder()
        .set_bootstrap_servers(broker.bootstrap_servers)
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder()
            .set_topic(topic)
            .set_value_serialization_schema(SimpleStringSchema())
            .build()
        )
        .set_delivery_guarantee(guarantee)
    )
    if guarantee is DeliveryGuarantee.EXACTLY_ONCE:
        builder.set_transactional_id_prefix(prefix or unique_topic("txn"))
    built = builder.build()
    assert isinstance(built, KafkaSink)
    return built


def harness(kafka_sink: KafkaSink, **kwargs: Any) -> OperatorHarness:
    return OperatorHarness(SinkWriterOperator(kafka_sink), **kwargs)


def values(broker: KafkaBroker, topic: str) -> list[str]:
    """Every record in the log, aborted ones included (Tansu does not filter them)."""
    return [r.value.decode() for r in broker.consume_all(topic)]


def marker(broker: KafkaBroker, kafka_sink: KafkaSink, subtask: int = 0, job: str = "job") -> int:
    """The checkpoint id of the last transaction committed by ``subtask`` of ``job``."""
    return max(
        broker.committed_offsets(kafka_sink.marker_group(job, subtask, slot), kafka_sink.topic, [0]).get(
            0, -1
        )
        for slot in range(TRANSACTION_POOL_SIZE)
    )


@pytest.fixture
def topic(kafka_broker: KafkaBroker) -> str:
    return kafka_broker.create_topic(unique_topic(), partitions=2)


# ------------------------------------------------------------- EXACTLY_ONCE, driven by hand
#
# Tansu shows a committed transaction's marker reliably only when no other transaction
# was open at its commit; the scenarios below assert markers only where that holds.


def test_a_transaction_commits_only_when_its_checkpoint_completes(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    s = sink(kafka_broker, topic)
    h = harness(s).open()
    h.process("42")
    h.snapshot(0)
    h.process("43")
    h.snapshot(1)
    h.process("44")
    h.snapshot(2)
    assert marker(kafka_broker, s) == -1  # pre-committed, nothing committed
    h.notify_complete(1)
    # checkpoints 0 and 1 committed, 2 not (Tansu may not yet show the markers of
    # transactions committed while another one is open, so only "not 2" is certain)
    assert marker(kafka_broker, s) < 2
    h.notify_complete(2)
    h.notify_complete(1)  # late: a no-op
    assert marker(kafka_broker, s) == 2
    assert sorted(values(kafka_broker, topic)) == ["42", "43", "44"]  # none was aborted
    h.close()


@pytest.mark.slow
def test_a_restore_commits_the_transaction_whose_commit_the_failure_prevented(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    s = sink(kafka_broker, topic)
    failed = harness(s).open()
    failed.process("42", "43")
    checkpoint = failed.snapshot(1)  # checkpoint 1 completes, its notification never arrives
    # the attempt dies here (no close: a killed process); the restore redoes checkpoint 1
    restored = harness(sink(kafka_broker, topic, prefix=s.transactional_id_prefix), attempt=1).open(
        [checkpoint], restored_checkpoint_id=1
    )
    assert marker(kafka_broker, s) == 1
    restored.process("44")
    restored.snapshot(2)
    restored.notify_complete(2)
    assert marker(kafka_broker, s) == 2
    restored.close()


def test_a_restore_does_not_redo_a_transaction_that_was_committed(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    s = sink(kafka_broker, topic)
    first = harness(s).open()
    first.process("42", "43")
    checkpoint = first.snapshot(1)
    first.notify_complete(1)
    # failure after the commit: the restored checkpoint still lists the transaction
    restored = harness(sink(kafka_broker, topic, prefix=s.transactional_id_prefix), attempt=1).open(
        [checkpoint], restored_checkpoint_id=1
    )
    restored.end_input()
    restored.close()
    assert sorted(values(kafka_broker, topic)) == ["42", "43"]  # written once, never aborted
    assert marker(kafka_broker, s) == 1


@pytest.mark.slow
def test_a_restore_fences_the_transactions_a_failed_attempt_left_open(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    s = sink(kafka_broker, topic)
    failed = harness(s).open()
    failed.process("42")
    checkpoint = failed.snapshot(1)
    failed.notify_complete(1)
    failed.process("43")
    failed.snapshot(2)  # pre-committed; checkpoint 2 never completes
    failed.process("44")  # in an open transaction
    writer = failed.operator.writer
    assert isinstance(writer, TransactionalKafkaWriter)
    zombie_open = writer._producer
    zombie_precommitted = next(iter(s._live.values()))

    restored = harness(sink(kafka_broker, topic, prefix=s.transactional_id_prefix), attempt=1).open(
        [checkpoint], restored_checkpoint_id=1
    )
    # the failed attempt, had it lived on, could commit neither of its transactions (a real
    # Kafka answers PRODUCER_FENCED; Tansu leaves a fenced commit unanswered)
    for zombie in (zombie_precommitted, zombie_open):
        with pytest.raises(Exception, match=FENCED):
            zombie.commit_transaction(2)
    assert marker(kafka_broker, s) == 1  # checkpoint 2's transaction was not committed
    restored.close()


@pytest.mark.slow
def test_a_restore_at_lower_parallelism_commits_every_old_subtasks_transactions(
    kafka_broker: KafkaBroker, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="chandy.connectors.kafka_sink")
    s = sink(kafka_broker, topic)
    copies = [s, sink(kafka_broker, topic, prefix=s.transactional_id_prefix)]  # one per subtask
    old = [harness(copies[i], subtask=i, parallelism=2).open() for i in range(2)]
    snapshots = []
    for i, h in enumerate(old):
        h.process(f"r{i}")
        snapshots.append(h.snapshot(3))  # checkpoint 3 completes; nobody is notified
    merged = harness(
        sink(kafka_broker, topic, prefix=s.transactional_id_prefix), parallelism=1, attempt=1
    ).open(snapshots, restored_checkpoint_id=3)
    # Both old subtasks' transactions were redone (each redo is logged, and each record is in
    # the log). Tansu also keeps the fenced originals' aborted records, but not reliably: when
    # subtask 0's redo commits while subtask 1's original transaction is still open, it
    # sometimes loses that original's record (about 1 run in 20, before and after issue 16),
    # as it may lose that redo's marker (see the note above these tests). So a record may
    # appear once or twice, and only the marker of the last redo (old subtask 1's) is asserted.
    redone = sorted(
        r.getMessage().split()[3] for r in caplog.records if "redoes transaction" in r.getMessage()
    )
    assert [t.rsplit("-", 2)[1:] for t in redone] == [["0", "0"], ["1", "0"]], redone
    deadline = time.monotonic() + 60
    found: list[str] = []
    held_back: AssertionError | None = None
    while {"r0", "r1"} - set(found) and time.monotonic() < deadline:
        try:
            found = values(kafka_broker, topic)
        except AssertionError as error:  # a fenced original not settled yet holds records back
            held_back = error
            time.sleep(0.05)
    assert set(found) == {"r0", "r1"} and all(1 <= found.count(v) <= 2 for v in found), (found, held_back)
    assert marker(kafka_broker, s, 1) == 3
    # and the old subtask 1's open transactions were fenced by the new subtask 0
    with pytest.raises(Exception, match=FENCED):
        next(iter(copies[1]._live.values())).commit_transaction(2)
    merged.close()


def test_end_of_input_without_checkpointing_commits_everything(kafka_broker: KafkaBroker, topic: str) -> None:
    s = sink(kafka_broker, topic)
    h = harness(s, config={"execution.checkpointing.interval": None}).open()
    h.process("a", "b")
    h.end_input()
    h.close()
    assert sorted(values(kafka_broker, topic)) == ["a", "b"]
    assert marker(kafka_broker, s) == END_OF_INPUT_MARKER


def test_at_least_once_flushes_at_every_checkpoint(kafka_broker: KafkaBroker, topic: str) -> None:
    h = harness(sink(kafka_broker, topic, DeliveryGuarantee.AT_LEAST_ONCE)).open()
    h.process("a", "b")
    h.snapshot(1)  # no notification needed: the records are in Kafka when the snapshot returns
    assert sorted(values(kafka_broker, topic)) == ["a", "b"]
    h.close()


# ------------------------------------------------------- no transaction is left open
#
# Each order of events after which a transaction could stay open (begun, then neither
# committed nor aborted, and its id never initialized again): Kafka (and Tansu) then serves
# read_committed readers nothing past its first record. values() reads the topic to its end
# and fails, naming the offsets held back, if anything still is.


def send_open_transaction(h: OperatorHarness) -> None:
    """Deliver what the writer's open transaction holds to the broker (an abort drops what is
    still queued in the client, a killed process loses it)."""
    writer = h.operator.writer
    assert isinstance(writer, TransactionalKafkaWriter) and writer._producer is not None
    assert writer._producer.flush(10) == 0


@pytest.mark.slow
def test_a_failover_aborts_the_open_and_the_pre_committed_transactions(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    h = harness(sink(kafka_broker, topic)).open()
    h.process("a")
    h.snapshot(1)  # pre-committed; its checkpoint never completes here
    h.process("b")  # open
    send_open_transaction(h)
    h.close()  # the task is cancelled
    assert sorted(values(kafka_broker, topic)) == ["a", "b"]  # both aborted (Tansu shows them)


def test_a_failover_while_a_transaction_is_empty_leaves_none_open(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    s = sink(kafka_broker, topic)
    h = harness(s).open()
    h.process()  # an empty batch begins a transaction with nothing in it
    h.snapshot(1)  # pre-committed with its marker only
    h.process()
    h.close()
    after = harness(sink(kafka_broker, topic, prefix=s.transactional_id_prefix), attempt=1).open()
    after.process("c")
    after.snapshot(2)
    after.notify_complete(2)
    after.close()
    assert values(kafka_broker, topic) == ["c"]


@pytest.mark.slow
def test_a_restore_aborts_what_a_killed_attempt_left_open(kafka_broker: KafkaBroker, topic: str) -> None:
    s = sink(kafka_broker, topic)
    killed = harness(s).open()
    killed.process("a")
    checkpoint = killed.snapshot(1)
    killed.notify_complete(1)
    killed.process("b")
    killed.snapshot(2)  # pre-committed; checkpoint 2 never completes
    killed.process("c")  # open
    send_open_transaction(killed)  # at the broker when the process dies (no close)
    with pytest.raises(AssertionError, match="holds back records"):
        kafka_broker.consume_all(topic)
    restored = harness(sink(kafka_broker, topic, prefix=s.transactional_id_prefix), attempt=1).open(
        [checkpoint], restored_checkpoint_id=1
    )  # its fencing aborts both
    restored.process("d")
    restored.snapshot(3)
    restored.notify_complete(3)
    restored.close()
    assert sorted(values(kafka_broker, topic)) == ["a", "b", "c", "d"]  # b, c aborted
    assert marker(kafka_broker, s) == 3


def test_a_finished_subtask_commits_its_last_transaction_and_leaves_none_open(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    s = sink(kafka_broker, topic)
    h = harness(s).open()
    h.process("a")
    h.snapshot(1)
    h.process("b")
    h.operator.final_checkpoint_follows = True
    h.end_input()  # finish: the final checkpoint commits what is left
    h.snapshot(2)
    h.notify_complete(2)
    h.close()
    assert sorted(values(kafka_broker, topic)) == ["a", "b"]
    assert marker(kafka_broker, s) == 2


def test_a_record_failing_mid_batch_leaves_no_transaction_open(kafka_broker: KafkaBroker, topic: str) -> None:
    s = KafkaSink(
        {"bootstrap.servers": kafka_broker.bootstrap_servers},
        KafkaRecordSerializationSchema.builder()
        .set_topic(topic)
        .set_value_serialization_schema(JsonSchema())
        .build(),
        DeliveryGuarantee.EXACTLY_ONCE,
        unique_topic("txn"),
    )
    h = harness(s).open()
    with pytest.raises(TypeError, match="not JSON serializable"):
        h.process("a", object())  # "a" is in the transaction when the second record fails
    send_open_transaction(h)
    h.close()  # the task fails
    assert values(kafka_broker, topic) == ['"a"']  # aborted (Tansu shows it)


# ---------------------------------------------------------------------------- whole jobs


@pytest.mark.slow
def test_exactly_once_job_writes_every_record_once(
    kafka_broker: KafkaBroker, topic: str, executor: str
) -> None:
    n = 5_000
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    (
        env.from_sequence(0, n - 1)
        .map(Throttle(0.0001))
        .map(str)
        .sink_to(sink(kafka_broker, topic))
        .uid("kafka")
    )
    env.execute("to kafka")
    assert sorted(values(kafka_broker, topic), key=int) == [str(i) for i in range(n)]


@pytest.mark.slow
def test_exactly_once_job_through_a_failure_commits_each_checkpoint_once(
    kafka_broker: KafkaBroker, topic: str, executor: str
) -> None:
    n = 10_000
    probe = Probe()
    s = sink(kafka_broker, topic)
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    env.configure({"restart-strategy.fixed-delay.delay": 0})
    (
        env.from_sequence(0, n - 1)
        .uid("source")
        .map(Throttle(0.0001))
        .uid("throttle")
        .map(FailOnceMap("failing", probe, n // 2, seed=3))
        .uid("failing")
        .map(str)
        .uid("str")
        .sink_to(s)
        .uid("kafka")
    )
    client = env.execute_async("to kafka through a failure")
    client.get_job_execution_result(timeout=300)
    assert probe.get("failures") >= 1 and client.restarts == 1
    written = values(kafka_broker, topic)
    # every record is in the log; a real Kafka's read_committed readers would also skip the
    # aborted attempt's records, which Tansu shows (they are the only repeats)
    assert set(written) == {str(i) for i in range(n)}


def test_at_least_once_and_none_deliver_every_record(kafka_broker: KafkaBroker, executor: str) -> None:
    for guarantee in (DeliveryGuarantee.NONE, DeliveryGuarantee.AT_LEAST_ONCE):
        topic = kafka_broker.create_topic(unique_topic(), partitions=2)
        env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
        env.set_parallelism(2)
        env.enable_checkpointing(100)
        (
            env.from_collection([{"id": i} for i in range(300)]).sink_to(
                KafkaSink.builder()
                .set_bootstrap_servers(kafka_broker.bootstrap_servers)
                .set_record_serializer(
                    KafkaRecordSerializationSchema.builder()
                    .set_topic(topic)
                    .set_value_serialization_schema(JsonSchema())
                    .set_key_serialization_schema(SimpleStringSchema(), lambda r: r["id"])
                    .build()
                )
                .set_delivery_guarantee(guarantee)
                .build()
            )
        )
        env.execute(f"kafka {guarantee.name}")
        records = kafka_broker.consume_all(topic)
        assert sorted(int(r.key) for r in records) == list(range(300)), guarantee
        assert all(r.value == f'{{"id":{int(r.key)}}}'.encode() for r in records)


# ------------------------------------------------------------------------------- mistakes


def test_a_missing_topic_is_refused_when_the_job_is_built(kafka_broker: KafkaBroker) -> None:
    missing = unique_topic("missing")
    env = StreamExecutionEnvironment.get_execution_environment()
    with pytest.raises(KafkaConnectorError, match=f"topic '{missing}' does not exist"):
        env.from_collection(["a"]).sink_to(sink(kafka_broker, missing))
    assert kafka_broker.partitions(missing) == []


@pytest.mark.slow
def test_an_unreachable_broker_is_refused_when_the_job_is_built() -> None:
    servers = f"127.0.0.1:{free_port()}"
    built = (
        KafkaSink.builder()
        .set_bootstrap_servers(servers)
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder()
            .set_topic("t")
            .set_value_serialization_schema(SimpleStringSchema())
            .build()
        )
        .set_property("request.timeout.ms", 2000)
        .build()
    )
    env = StreamExecutionEnvironment.get_execution_environment()
    started = time.monotonic()
    with pytest.raises(KafkaConnectorError, match=f"cannot reach the Kafka servers {servers}"):
        env.from_collection(["a"]).sink_to(built)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("configure", "expected"),
    [
        (lambda b: b.set_delivery_guarantee("EXACTLY_ONCE"), "takes a DeliveryGuarantee"),
        (
            lambda b: b.set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE),
            "needs set_transactional_id_prefix",
        ),
        (lambda b: b.set_property("no.such.property", 1), "no.such.property"),
        (lambda b: b.set_bootstrap_servers(""), "needs set_bootstrap_servers"),
    ],
)
def test_bad_settings_are_refused_when_the_job_is_built(
    kafka_broker: KafkaBroker, topic: str, configure: Any, expected: str
) -> None:
    builder = (
        KafkaSink.builder()
        .set_bootstrap_servers(kafka_broker.bootstrap_servers)
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder()
            .set_topic(topic)
            .set_value_serialization_schema(SimpleStringSchema())
            .build()
        )
    )
    env = StreamExecutionEnvironment.get_execution_environment()
    with pytest.raises(ConfigurationError, match=expected):
        env.from_collection(["a"]).sink_to(configure(builder).build())


def test_a_serializer_without_topic_or_schema_is_named() -> None:
    with pytest.raises(ConfigurationError, match="needs set_topic"):
        KafkaRecordSerializationSchema.builder().build()
    with pytest.raises(ConfigurationError, match="set_value_serialization_schema"):
        KafkaRecordSerializationSchema.builder().set_topic("t").build()
    with pytest.raises(ConfigurationError, match="needs set_record_serializer"):
        KafkaSink.builder().set_bootstrap_servers("x:1").build()


def test_a_record_that_cannot_be_serialized_fails_the_job_naming_the_sink(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    built = (
        KafkaSink.builder()
        .set_bootstrap_servers(kafka_broker.bootstrap_servers)
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder()
            .set_topic(topic)
            .set_value_serialization_schema(JsonSchema())
            .build()
        )
        .build()
    )
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.from_collection([object()]).sink_to(built)
    with pytest.raises(JobExecutionError, match="not JSON serializable in operator .Sink: KafkaSink."):
        env.execute()


# ------------------------------------------------------------------------- the test broker


def test_consume_all_fails_on_records_held_back_by_an_open_transaction(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    """Tansu serves nothing past the first record of a transaction still open, not even
    later transactions that committed, so a test reading the topic used to get a silently
    short log: records that were written looked lost (as in test_arrow_connectors'
    kafka-to-kafka job, once in CI). consume_all now says a transaction holds them back."""
    from confluent_kafka import Producer

    def producer(transactional_id: str) -> Any:
        p = Producer(
            {
                "bootstrap.servers": kafka_broker.bootstrap_servers,
                "transactional.id": transactional_id,
                "logger": logging.getLogger("tests.kafka_broker"),
            }
        )
        p.init_transactions(10)
        p.begin_transaction()
        return p

    prefix = unique_topic("held")
    first = producer(f"{prefix}-first")
    first.produce(topic, value=b"a", partition=0)
    first.flush(10)
    first.commit_transaction(10)
    open_one = producer(f"{prefix}-open")
    open_one.produce(topic, value=b"b", partition=0)
    open_one.flush(10)
    later = producer(f"{prefix}-later")
    later.produce(topic, value=b"c", partition=0)
    later.flush(10)
    later.commit_transaction(10)
    with pytest.raises(AssertionError, match="a transaction still open holds back records"):
        kafka_broker.consume_all(topic)
    open_one.commit_transaction(10)
    assert sorted(r.value for r in kafka_broker.consume_all(topic)) == [b"a", b"b", b"c"]


def test_two_transactions_ending_at_once_leave_nothing_held_back(kafka_broker: KafkaBroker) -> None:
    """Two sink subtasks commit at the same checkpoint's completion (or abort together at a
    failover) into the same partitions. In Tansu a transaction whose end another one's end
    settled while it still wrote its markers was lost for good: from then on no transaction
    on those partitions was settled, and everything after them stayed unreadable (the
    kafka-to-kafka job's output came up short about once in 140 runs, its records written and
    committed). T writes to every partition and U to partition 0; U's commit goes out once
    T's reached the broker, while T still writes its markers. Without the test broker's
    proxy, which lets one transaction end at a time reach Tansu, V was held back in 5 of 6
    runs (a race in Tansu: not in every run)."""
    from confluent_kafka import Producer

    from tests.kafka_broker import END_TXN

    partitions = 256
    topic = kafka_broker.create_topic(unique_topic("ends"), partitions=partitions)
    prefix = unique_topic("ends")

    def producer(name: str) -> Any:
        p = Producer(
            {
                "bootstrap.servers": kafka_broker.bootstrap_servers,
                "transactional.id": f"{prefix}-{name}",
                "logger": logging.getLogger("tests.kafka_broker"),
            }
        )
        p.init_transactions(10)
        p.begin_transaction()
        return p

    t, u = producer("t"), producer("u")
    for partition in range(partitions):
        t.produce(topic, value=b"t", partition=partition)
    u.produce(topic, value=b"u", partition=0)
    assert t.flush(10) == 0 and u.flush(10) == 0
    sent = kafka_broker.proxy.forwarded(END_TXN)
    committing_t = threading.Thread(target=t.commit_transaction, args=(10,))
    committing_t.start()
    kafka_broker.proxy.wait_forwarded(END_TXN, sent + 1)  # T's commit is at the broker
    u.commit_transaction(10)
    committing_t.join()
    v = producer("v")  # written after both: held back if Tansu lost T
    for partition in range(partitions):
        v.produce(topic, value=b"v", partition=partition)
    assert v.flush(10) == 0
    v.commit_transaction(10)
    got = [r.value for r in kafka_broker.consume_all(topic)]
    assert sorted(got) == [b"t"] * partitions + [b"u"] + [b"v"] * partitions
