"""KafkaSink: NONE, AT_LEAST_ONCE or EXACTLY_ONCE delivery to a Kafka topic.

* NONE: produce, flush at end of input.
* AT_LEAST_ONCE: also flush at every checkpoint (every record acknowledged by
  Kafka is in a checkpoint's past), so a restore may only repeat records.
* EXACTLY_ONCE: Kafka transactions. Each subtask writes into a transaction that
  a checkpoint pre-commits (flushed, still open) and the checkpoint's completion
  commits. Transactional ids come from a small pool per subtask
  (``<prefix>-<subtask>-<slot>``); on start every id of the pool is initialized
  once, which aborts transactions a failed attempt left open.

  The one hard case: the job fails after a checkpoint completed but before its
  transaction was committed. Flink's Java client resumes that transaction;
  librdkafka cannot. So every transaction also commits, atomically with its
  records, a consumer-group offset whose value is the checkpoint id (the
  *marker*, under the group ``<prefix>-<job id>-<subtask>-<slot>``: per job,
  because checkpoint ids start again in a new job, and per transactional id, since
  a slot's transactions commit one after the other). After a restore the committer fences
  the transactional id, then reads the marker: a transaction whose marker is in
  was committed; otherwise its records, kept in the checkpoint, are written again
  in a new transaction with the same marker. Nothing is lost and nothing is
  written twice. The price: a checkpoint holds the records each subtask wrote
  since the previous one.

Isolation is Kafka's: readers with ``isolation.level=read_committed`` see only
committed transactions. (The Tansu broker used in chandy's tests does not filter
aborted records for such readers; a real Kafka does.)
"""

from __future__ import annotations

import enum
import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from chandy.connectors.kafka_common import (
    KafkaConnectorError,
    SerializationSchema,
    bootstrap_servers_of,
    check_client_properties,
    check_schema,
    client_logger,
    describe_error,
    import_confluent_kafka,
)
from chandy.core.connector import (
    Committer,
    PrecommittingSinkWriter,
    Sink,
    SinkWriter,
    SinkWriterContext,
    TwoPhaseCommittingSink,
)
from chandy.errors import ConfigurationError

log = logging.getLogger(__name__)

#: Transactional ids per subtask: more than the transactions one subtask can have open
#: (the current one and the pre-committed ones of in-flight checkpoints).
TRANSACTION_POOL_SIZE = 8
_TIMEOUT_S = 30.0


class DeliveryGuarantee(enum.Enum):
    """What a :class:`KafkaSink` promises: ``EXACTLY_ONCE`` (Kafka transactions committed with the
    checkpoints), ``AT_LEAST_ONCE`` (flushed at every checkpoint) or ``NONE``."""

    NONE = "NONE"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"
    EXACTLY_ONCE = "EXACTLY_ONCE"


@dataclass(frozen=True)
class KafkaRecordSerializationSchema:
    """Where a record goes and how its key and value are made (PyFlink's name)."""

    topic: str
    value_schema: SerializationSchema
    key_schema: SerializationSchema | None = None
    key_extractor: Callable[[Any], Any] | None = None
    value_extractor: Callable[[Any], Any] | None = None

    @staticmethod
    def builder() -> KafkaRecordSerializationSchemaBuilder:
        """Start describing how records become Kafka messages: topic, value schema, optional key schema."""
        return KafkaRecordSerializationSchemaBuilder()

    def serialize(self, element: Any) -> tuple[bytes | None, bytes]:
        """The message key (``None`` without a key schema) and value of one record."""
        value = self.value_extractor(element) if self.value_extractor else element
        key = None
        if self.key_schema is not None:
            raw = self.key_extractor(element) if self.key_extractor else element
            key = self.key_schema.serialize(raw)
        return key, self.value_schema.serialize(value)


@dataclass(frozen=True)
class KafkaRecordBatchSerializationSchema:
    """One Kafka record per row of each Arrow record batch (a batch sink: ``BatchStream.sink_to``).

    The value is the row as a JSON object of all its columns, or, with ``value_column``,
    that column's value as it is (``binary`` bytes; ``utf8`` encoded; other types as their
    string form). ``key_column`` makes the key the same way (no key without it). Use it in
    ``KafkaSink.builder().set_record_serializer(...)``; delivery guarantees (transactions for
    EXACTLY_ONCE) are the record sink's.
    """

    topic: str
    value_column: str | None = None
    key_column: str | None = None

    def serialize_batch(self, batch: Any) -> list[tuple[bytes | None, bytes | None]]:
        """The (key, value) of each row of ``batch``, in order."""
        n = batch.num_rows
        if self.value_column is None:
            dumps = json.dumps
            values: list[bytes | None] = [
                dumps(row, separators=(",", ":"), default=str).encode() for row in batch.to_pylist()
            ]
        else:
            values = self._column_bytes(batch, self.value_column)
        keys = self._column_bytes(batch, self.key_column) if self.key_column is not None else [None] * n
        return list(zip(keys, values, strict=True))

    def _column_bytes(self, batch: Any, name: str) -> list[bytes | None]:
        import pyarrow as pa

        index = batch.schema.get_field_index(name)
        if index < 0:
            raise KafkaConnectorError(
                f"KafkaSink: the batch has no column {name!r} to serialize (its columns: "
                f"{batch.schema.names}); fix value_column / key_column of the "
                "KafkaRecordBatchSerializationSchema"
            )
        column = batch.column(index)
        if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                column = column.cast(pa.string())
            column = column.cast(pa.binary())  # utf8 bytes as they are: no copy
        return column.to_pylist()  # type: ignore[no-any-return]


class KafkaRecordSerializationSchemaBuilder:
    """Builds a :class:`KafkaRecordSerializationSchema`: ``set_topic``, ``set_value_serialization_schema`` and
    optionally ``set_key_serialization_schema``, then ``build()``."""

    def __init__(self) -> None:
        self._topic: str | None = None
        self._value: SerializationSchema | None = None
        self._key: SerializationSchema | None = None
        self._key_extractor: Callable[[Any], Any] | None = None
        self._value_extractor: Callable[[Any], Any] | None = None

    def set_topic(self, topic: str) -> KafkaRecordSerializationSchemaBuilder:
        """The topic every record is written to."""
        self._topic = topic
        return self

    def set_value_serialization_schema(
        self, schema: SerializationSchema, extractor: Callable[[Any], Any] | None = None
    ) -> KafkaRecordSerializationSchemaBuilder:
        """``schema.serialize(extractor(record))`` is the value (the record itself by default)."""
        check_schema(schema, "set_value_serialization_schema", "serialize")
        self._value, self._value_extractor = schema, extractor
        return self

    def set_key_serialization_schema(
        self, schema: SerializationSchema, extractor: Callable[[Any], Any] | None = None
    ) -> KafkaRecordSerializationSchemaBuilder:
        """``schema.serialize(extractor(record))`` is the key (records without one have none)."""
        check_schema(schema, "set_key_serialization_schema", "serialize")
        self._key, self._key_extractor = schema, extractor
        return self

    def build(self) -> KafkaRecordSerializationSchema:
        """The schema; a missing topic or value schema is refused, naming the setter to call."""
        if not self._topic:
            raise ConfigurationError("KafkaRecordSerializationSchema needs set_topic(...)")
        if self._value is None:
            raise ConfigurationError(
                "KafkaRecordSerializationSchema needs set_value_serialization_schema(...)"
            )
        return KafkaRecordSerializationSchema(
            self._topic, self._value, self._key, self._key_extractor, self._value_extractor
        )


@dataclass(frozen=True)
class KafkaCommittable:
    """A pre-committed transaction, and what it takes to redo it if it must be."""

    transactional_id: str
    marker_group: str
    checkpoint_id: int
    topic: str
    records: tuple[tuple[bytes | None, bytes | None], ...]


@dataclass(frozen=True)
class KafkaWriterState:
    """Which pool of transactional ids a subtask used, and the job's parallelism then:
    after a restore, subtask ``i`` aborts the leftovers of every old pool ``s`` with
    ``s % parallelism == i``, the same rule that hands it the old pool's committables."""

    subtask: int
    parallelism: int


class KafkaSink(TwoPhaseCommittingSink):
    """Writes records to Kafka (PyFlink's ``KafkaSink``); see the module docs."""

    def __init__(
        self,
        properties: dict[str, Any],
        serializer: KafkaRecordSerializationSchema | KafkaRecordBatchSerializationSchema,
        guarantee: DeliveryGuarantee,
        transactional_id_prefix: str | None,
    ) -> None:
        self.properties = dict(properties)
        self.serializer = serializer
        #: A batch serializer makes this a batch sink (its writers get Arrow record batches).
        self.columnar = isinstance(serializer, KafkaRecordBatchSerializationSchema)
        self.guarantee = guarantee
        self.transactional_id_prefix = transactional_id_prefix
        # Per subtask copy (every subtask deserializes its own), shared by its writer and
        # committer: producers of pre-committed transactions awaiting their commit, and
        # producers whose transactional id is free for the next transaction.
        self._live: dict[str, Any] = {}
        self._idle: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_live"], state["_idle"], state["_lock"] = {}, {}, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @staticmethod
    def builder() -> KafkaSinkBuilder:
        """Start configuring a Kafka sink: bootstrap servers, record serializer, delivery guarantee (and a
        transactional id prefix for ``EXACTLY_ONCE``)."""
        return KafkaSinkBuilder()

    @property
    def topic(self) -> str:
        """The topic the sink writes to."""
        return self.serializer.topic

    def validate(self) -> None:
        """Settings, client properties, and that the topic exists (fails in seconds)."""
        servers = bootstrap_servers_of(self.properties)
        if not servers:
            raise ConfigurationError("KafkaSink needs set_bootstrap_servers(...)")
        if self.guarantee is DeliveryGuarantee.EXACTLY_ONCE and not self.transactional_id_prefix:
            raise ConfigurationError(
                "KafkaSink with DeliveryGuarantee.EXACTLY_ONCE needs "
                "set_transactional_id_prefix(...): a name no other application writing to this "
                "Kafka cluster uses"
            )
        check_client_properties(self.properties, "producer", "KafkaSink")
        ck = import_confluent_kafka()
        admin = ck.admin.AdminClient({**self.properties, "logger": client_logger()})
        timeout_s = float(self.properties.get("request.timeout.ms", 10_000)) / 1000
        try:
            # all topics: asking for one by name may create it where brokers auto-create
            metadata = admin.list_topics(timeout=timeout_s)
        except ck.KafkaException as exc:
            raise KafkaConnectorError(
                f"KafkaSink cannot reach the Kafka servers {servers} within {timeout_s:g} s "
                f"(request.timeout.ms): {describe_error(exc)}"
            ) from None
        found = metadata.topics.get(self.topic)
        if found is None or found.error is not None:
            raise KafkaConnectorError(
                f"KafkaSink: topic '{self.topic}' does not exist on {servers}; create it first "
                "(chandy does not create topics: partitions and retention are yours to choose)"
            )

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:  # type: ignore[override]
        if self.guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            return TransactionalKafkaWriter(self, context)
        return KafkaWriter(self, flush_at_checkpoints=self.guarantee is DeliveryGuarantee.AT_LEAST_ONCE)

    def create_committer(self) -> Committer:
        return KafkaCommitter(self)

    # -- used by the writer and the committer of one subtask ------------------------

    def producer(self, transactional_id: str | None = None) -> Any:
        """Used by the sink's writers and committer: a producer with the sink's properties (transactional when
        given an id). Jobs do not call it."""
        ck = import_confluent_kafka()
        config = {**self.properties, "logger": client_logger()}
        if transactional_id is not None:
            config["transactional.id"] = transactional_id
            config.setdefault("transaction.timeout.ms", 900_000)
        return ck.Producer(config)

    def transactional_id(self, subtask: int, slot: int) -> str:
        """The transactional id of a subtask's producer (prefix, subtask, slot), stable across restarts so a
        restored job can abort or commit what a failed one left open."""
        return f"{self.transactional_id_prefix}-{subtask}-{slot}"

    def marker_group(self, job_id: str, subtask: int, slot: int) -> str:
        """The consumer group whose offset marks the transactions of one transactional id
        in one job as committed."""
        return f"{self.transactional_id_prefix}-{job_id}-{subtask}-{slot}"

    def _marker_consumer(self, group: str) -> Any:
        ck = import_confluent_kafka()
        return ck.Consumer(
            {**self.properties, "group.id": group, "enable.auto.commit": False, "logger": client_logger()}
        )

    def committed_marker(self, group: str) -> int:
        """The checkpoint id of the last transaction committed under ``group`` (or -1)."""
        ck = import_confluent_kafka()
        consumer = self._marker_consumer(group)
        try:
            (committed,) = consumer.committed([ck.TopicPartition(self.topic, 0)], timeout=_TIMEOUT_S)
            return committed.offset if committed.offset >= 0 else -1
        finally:
            consumer.close()

    def group_metadata(self, group: str) -> Any:
        """Used by the sink's writers: the consumer group metadata a transaction records its markers under.
        Jobs do not call it."""
        consumer = self._marker_consumer(group)
        try:
            return consumer.consumer_group_metadata()
        finally:
            consumer.close()

    def commit_marker(self, producer: Any, group_metadata: Any, checkpoint_id: int) -> None:
        """Add the marker to ``producer``'s open transaction (committed only with it)."""
        ck = import_confluent_kafka()
        producer.send_offsets_to_transaction(
            [ck.TopicPartition(self.topic, 0, checkpoint_id)], group_metadata, _TIMEOUT_S
        )


def _raise_on_delivery_error(errors: list[str]) -> None:
    if errors:
        raise KafkaConnectorError(
            f"KafkaSink: {len(errors)} records were not delivered; the first error: {errors[0]}"
        )


class KafkaWriter(PrecommittingSinkWriter):
    """NONE and AT_LEAST_ONCE: nothing to commit; AT_LEAST_ONCE flushes at checkpoints."""

    def __init__(self, sink: KafkaSink, flush_at_checkpoints: bool) -> None:
        self.sink = sink
        self.flush_at_checkpoints = flush_at_checkpoints
        self._producer = sink.producer()
        self._errors: list[str] = []

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self._errors.append(error.str())

    def write(self, element: Any) -> None:
        """Produce the record to the topic."""
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        _produce(self._producer, self.sink, elements, self._delivered)

    def prepare_commit(self, checkpoint_id: int | None) -> list[Any]:
        if checkpoint_id is None or self.flush_at_checkpoints:
            self.flush(end_of_input=True)
        return []

    def flush(self, end_of_input: bool) -> None:
        if end_of_input or self.flush_at_checkpoints:
            remaining = self._producer.flush(_TIMEOUT_S)
            if remaining:
                raise KafkaConnectorError(
                    f"KafkaSink: {remaining} records still undelivered after {_TIMEOUT_S:.0f} s"
                )
            _raise_on_delivery_error(self._errors)

    def close(self) -> None:
        """Hand what is queued to the producer's delivery without waiting for it."""
        self._producer.flush(0)


def _produce(
    producer: Any,
    sink: KafkaSink,
    elements: list[Any],
    on_delivery: Callable[[Any, Any], None],
    into: list[tuple[bytes | None, bytes | None]] | None = None,
) -> None:
    topic = sink.topic
    serializer = sink.serializer
    pairs: Iterable[tuple[bytes | None, bytes | None]] = (
        serializer.serialize_batch(elements)
        if isinstance(serializer, KafkaRecordBatchSerializationSchema)
        else map(serializer.serialize, elements)
    )
    for key, value in pairs:
        if into is not None:
            into.append((key, value))
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                break
            except BufferError:  # the client's queue is full: let it send
                producer.poll(0.1)
    producer.poll(0)


class TransactionalKafkaWriter(PrecommittingSinkWriter):
    """EXACTLY_ONCE: one Kafka transaction per checkpoint interval."""

    def __init__(self, sink: KafkaSink, context: SinkWriterContext) -> None:
        self.sink = sink
        self.subtask = context.subtask_index
        self.parallelism = context.parallelism
        self._producer: Any = None
        self._transactional_id: str | None = None
        self._records: list[tuple[bytes | None, bytes | None]] = []
        self._errors: list[str] = []
        self._job_id = context.job_id
        self._slot: int | None = None
        self._group_metadata: dict[int, Any] = {}  # per slot
        for subtask in self._pools_to_fence(context.restored_state):
            for slot in range(TRANSACTION_POOL_SIZE):
                self._fence(sink.transactional_id(subtask, slot))

    def _pools_to_fence(self, restored_state: tuple[Any, ...]) -> list[int]:
        """This subtask's pool, and the old pools it inherits after a change of parallelism."""
        old_parallelism = max(
            (s.parallelism for s in restored_state if isinstance(s, KafkaWriterState)),
            default=self.parallelism,
        )
        return [
            s for s in range(max(old_parallelism, self.parallelism)) if s % self.parallelism == self.subtask
        ]

    def _fence(self, transactional_id: str) -> None:
        """Initialize the id: Kafka aborts the transaction an earlier attempt left open."""
        with self.sink._lock:
            if transactional_id in self.sink._live or transactional_id in self.sink._idle:
                return  # the committer is committing it, or it was fenced already
        producer = self.sink.producer(transactional_id)
        producer.init_transactions(_TIMEOUT_S)
        log.debug("KafkaSink fenced %s", transactional_id)
        with self.sink._lock:
            if len(self.sink._idle) < 2:  # keep a couple for the next transactions
                self.sink._idle[transactional_id] = producer

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self._errors.append(error.str())

    def _begin(self) -> None:
        """Open a transaction on a transactional id of the pool that no pending one holds."""
        sink = self.sink
        with sink._lock:
            free = [
                (slot, sink.transactional_id(self.subtask, slot))
                for slot in range(TRANSACTION_POOL_SIZE)
                if sink.transactional_id(self.subtask, slot) not in sink._live
            ]
            if not free:
                raise KafkaConnectorError(
                    f"KafkaSink: all {TRANSACTION_POOL_SIZE} transactional ids of subtask "
                    f"{self.subtask} hold transactions awaiting a checkpoint's completion; "
                    "checkpoints keep failing (see the checkpoint statistics for why)"
                )
            slot = next((slot for slot, t in free if t in sink._idle), None)
            producer = sink._idle.pop(sink.transactional_id(self.subtask, slot)) if slot is not None else None
        if slot is None:
            slot = free[0][0]
        transactional_id = sink.transactional_id(self.subtask, slot)
        if producer is None:
            producer = sink.producer(transactional_id)
            producer.init_transactions(_TIMEOUT_S)
        producer.begin_transaction()
        log.debug("KafkaSink subtask %d begins a transaction on %s", self.subtask, transactional_id)
        self._producer, self._transactional_id, self._slot = producer, transactional_id, slot

    def write(self, element: Any) -> None:
        """Produce the record inside the open transaction."""
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        if self._producer is None:
            self._begin()
        _produce(self._producer, self.sink, elements, self._delivered, self._records)

    def prepare_commit(self, checkpoint_id: int | None) -> list[Any]:
        """Flush the open transaction, add its marker, and hand it to the committer."""
        if self._producer is None:
            return []
        remaining = self._producer.flush(_TIMEOUT_S)
        if remaining:
            raise KafkaConnectorError(
                f"KafkaSink: {remaining} records still undelivered after {_TIMEOUT_S:.0f} s"
            )
        _raise_on_delivery_error(self._errors)
        marker = checkpoint_id if checkpoint_id is not None else END_OF_INPUT_MARKER
        assert self._transactional_id is not None and self._slot is not None
        group = self.sink.marker_group(self._job_id, self.subtask, self._slot)
        if self._slot not in self._group_metadata:
            self._group_metadata[self._slot] = self.sink.group_metadata(group)
        self.sink.commit_marker(self._producer, self._group_metadata[self._slot], marker)
        committable = KafkaCommittable(
            self._transactional_id, group, marker, self.sink.topic, tuple(self._records)
        )
        with self.sink._lock:
            self.sink._live[self._transactional_id] = self._producer
        log.debug(
            "KafkaSink subtask %d pre-commits %s for checkpoint %s (%d records)",
            self.subtask,
            self._transactional_id,
            checkpoint_id,
            len(self._records),
        )
        self._producer, self._transactional_id, self._records = None, None, []
        return [committable]

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [KafkaWriterState(self.subtask, self.parallelism)]

    def close(self) -> None:
        """Abort the transaction that was never pre-committed (a restore writes its records again)."""
        if self._producer is not None:  # never pre-committed: abort it
            log.debug(
                "KafkaSink subtask %d aborts its open transaction %s", self.subtask, self._transactional_id
            )
            _abort_quietly(self._producer, self._transactional_id)
            self._producer = None


#: The marker of the transaction a bounded job commits at end of input (after its last
#: checkpoint; nothing of that job follows it).
END_OF_INPUT_MARKER = 2**62


def _abort_quietly(producer: Any, transactional_id: str | None) -> None:
    try:
        producer.abort_transaction(_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - the next attempt fences it anyway
        # Loud: until its id is initialized again (the next attempt fences it) or the broker
        # times it out (transaction.timeout.ms), an open transaction holds back every later
        # record of its partitions from read_committed readers.
        log.warning("KafkaSink could not abort transaction %s (it stays open): %s", transactional_id, exc)


class KafkaCommitter(Committer):
    """Commits pre-committed transactions; redoes, once, one that a failure lost."""

    def __init__(self, sink: KafkaSink) -> None:
        self.sink = sink

    def commit(self, committables: list[Any]) -> None:
        """Commit a checkpoint's transactions; one already committed (its marker offset says so) is not
        committed again."""
        sink = self.sink
        for committable in sorted(
            (c for c in committables if isinstance(c, KafkaCommittable)), key=lambda c: c.checkpoint_id
        ):
            with sink._lock:
                producer = sink._live.pop(committable.transactional_id, None)
            if producer is None:
                self._redo(committable)
                continue
            producer.commit_transaction(_TIMEOUT_S)
            log.debug(
                "KafkaSink commits %s of checkpoint %d",
                committable.transactional_id,
                committable.checkpoint_id,
            )
            with sink._lock:
                if len(sink._idle) < 2:
                    sink._idle[committable.transactional_id] = producer

    def _redo(self, committable: KafkaCommittable) -> None:
        """After a restore: commit the transaction's records unless its marker says they are."""
        producer = self.sink.producer(committable.transactional_id)
        # Fence first: a zombie attempt still holding this transaction cannot commit it
        # after the marker was read.
        producer.init_transactions(_TIMEOUT_S)
        if self.sink.committed_marker(committable.marker_group) >= committable.checkpoint_id:
            log.debug(
                "KafkaSink transaction %s of checkpoint %d was committed before the restore",
                committable.transactional_id,
                committable.checkpoint_id,
            )
            return
        log.info(
            "KafkaSink redoes transaction %s of checkpoint %d (%d records) after a restore",
            committable.transactional_id,
            committable.checkpoint_id,
            len(committable.records),
        )
        producer.begin_transaction()
        for key, value in committable.records:
            while True:
                try:
                    producer.produce(committable.topic, value=value, key=key)
                    break
                except BufferError:
                    producer.poll(0.1)
        remaining = producer.flush(_TIMEOUT_S)
        if remaining:
            raise KafkaConnectorError(
                f"KafkaSink: {remaining} records still undelivered after {_TIMEOUT_S:.0f} s"
            )
        self.sink.commit_marker(
            producer, self.sink.group_metadata(committable.marker_group), committable.checkpoint_id
        )
        producer.commit_transaction(_TIMEOUT_S)

    def close(self) -> None:
        """Abort what is still pre-committed: its checkpoint did not complete here (a
        restore redoes it if that checkpoint completed after all)."""
        with self.sink._lock:
            live, self.sink._live = self.sink._live, {}
            self.sink._idle = {}
        for transactional_id, producer in live.items():
            log.debug("KafkaSink aborts the pre-committed transaction %s at close", transactional_id)
            _abort_quietly(producer, transactional_id)


class KafkaSinkBuilder:
    """``KafkaSink.builder().set_bootstrap_servers(...).set_record_serializer(...).build()``."""

    def __init__(self) -> None:
        self._properties: dict[str, Any] = {}
        self._serializer: KafkaRecordSerializationSchema | KafkaRecordBatchSerializationSchema | None = None
        self._guarantee = DeliveryGuarantee.NONE
        self._prefix: str | None = None

    def set_bootstrap_servers(self, servers: str) -> KafkaSinkBuilder:
        """The brokers to write to, ``host:port[,host:port...]``."""
        self._properties["bootstrap.servers"] = servers
        return self

    def set_record_serializer(
        self, serializer: KafkaRecordSerializationSchema | KafkaRecordBatchSerializationSchema
    ) -> KafkaSinkBuilder:
        """How records become Kafka records; a ``KafkaRecordBatchSerializationSchema`` makes a
        sink of Arrow record batches (``BatchStream.sink_to``)."""
        self._serializer = serializer
        return self

    def set_delivery_guarantee(self, guarantee: DeliveryGuarantee) -> KafkaSinkBuilder:
        """``EXACTLY_ONCE`` (transactions committed with checkpoints), ``AT_LEAST_ONCE`` or ``NONE``."""
        if not isinstance(guarantee, DeliveryGuarantee):
            raise ConfigurationError(
                "set_delivery_guarantee takes a DeliveryGuarantee: NONE, AT_LEAST_ONCE or EXACTLY_ONCE"
            )
        self._guarantee = guarantee
        return self

    def set_transactional_id_prefix(self, prefix: str) -> KafkaSinkBuilder:
        """The prefix of the producers' transactional ids (required for ``EXACTLY_ONCE``): unique per job
        writing to the cluster."""
        self._prefix = prefix
        return self

    def set_property(self, key: str, value: Any) -> KafkaSinkBuilder:
        """Set a librdkafka producer property (checked when the sink is built)."""
        self._properties[key] = value
        return self

    def build(self) -> Sink:
        """The configured :class:`KafkaSink`; a missing setting is refused, naming the setter to call."""
        if self._serializer is None:
            raise ConfigurationError("KafkaSink needs set_record_serializer(...)")
        return KafkaSink(self._properties, self._serializer, self._guarantee, self._prefix)
