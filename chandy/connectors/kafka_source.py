"""``KafkaSource``: reads Kafka topics with exactly-once positions kept in chandy's checkpoints.

The shape is PyFlink's (FLIP-27) Kafka source::

    source = (KafkaSource.builder()
              .set_bootstrap_servers("broker:9092")
              .set_topics("orders")
              .set_group_id("orders-job")
              .set_starting_offsets(KafkaOffsetsInitializer.earliest())
              .set_value_only_deserializer(SimpleStringSchema())
              .build())
    env.from_source(source, None, "orders")

Why it is built the way it is:

* A split is one topic partition carrying its next offset (and its stopping offset in
  bounded mode). The splits are the source's checkpointed state, so a restore resumes
  each partition exactly where the checkpoint cut it, at any parallelism.
* Partitions are *assigned* (``Consumer.assign``), never subscribed: a consumer group
  would rebalance partitions between subtasks behind the checkpoint's back.
* Starting (and stopping) offsets are resolved once, when a split is first read, to
  concrete numbers the split then carries; a restore never asks Kafka again.
* Offsets are committed back to Kafka when a checkpoint completes, for monitoring
  (lag dashboards, ``committed_offsets()`` starts): correctness never depends on them.
"""

from __future__ import annotations

import enum
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from chandy.connectors.arrow_schema import SchemaLike, check_optional_schema
from chandy.connectors.kafka_common import (
    DeserializationSchema,
    KafkaConnectorError,
    KafkaRecord,
    KafkaSetupError,
    KafkaTopicPartition,
    bootstrap_servers_of,
    check_client_properties,
    check_schema,
    client_logger,
    describe_error,
    import_confluent_kafka,
)
from chandy.core.connector import Boundedness, Source, SourceReader, SourceReaderContext
from chandy.errors import ConfigurationError

log = logging.getLogger(__name__)

#: Properties the source itself reads (Flink's KafkaSourceOptions); they are not passed
#: to the Kafka client.
CLIENT_ID_PREFIX = "client.id.prefix"
COMMIT_OFFSETS_ON_CHECKPOINT = "commit.offsets.on.checkpoint"
REQUEST_TIMEOUT_MS = "request.timeout.ms"
SOURCE_OPTIONS = frozenset({CLIENT_ID_PREFIX, COMMIT_OFFSETS_ON_CHECKPOINT, REQUEST_TIMEOUT_MS})

DEFAULT_REQUEST_TIMEOUT_MS = 10_000

#: Client properties the source owns: offsets live in checkpoints, never in auto-commits.
_FORCED = {"enable.auto.commit": False, "enable.auto.offset.store": False, "enable.partition.eof": True}

#: Offsets of checkpoints not yet confirmed are kept for this many checkpoints at most
#: (an aborted checkpoint is never confirmed; a later one subsumes it).
_MAX_PENDING_COMMITS = 32

#: How long close() waits for asynchronous offset commits still in flight.
_CLOSE_COMMIT_WAIT_S = 2.0


# ---------------------------------------------------------------------------- offsets


class KafkaOffsetResetStrategy(enum.Enum):
    """Where to start when a committed (or specified) offset is missing."""

    LATEST = "LATEST"
    EARLIEST = "EARLIEST"
    NONE = "NONE"  # fail, naming the partition


class KafkaOffsetsInitializer:
    """Which offset a partition starts (or, in bounded mode, stops) at (PyFlink's name).

    Build one with :meth:`earliest`, :meth:`latest`, :meth:`committed_offsets`,
    :meth:`timestamp` or :meth:`offsets`. It is resolved once per partition, when the
    partition is first read; the split then carries the concrete offset.
    """

    def __init__(
        self,
        kind: str,
        *,
        timestamp_ms: int | None = None,
        offsets: Mapping[KafkaTopicPartition, int] | None = None,
        reset: KafkaOffsetResetStrategy = KafkaOffsetResetStrategy.NONE,
    ) -> None:
        self.kind = kind
        self.timestamp_ms = timestamp_ms
        self.partition_offsets = dict(offsets or {})
        self.reset = reset

    @staticmethod
    def earliest() -> KafkaOffsetsInitializer:
        """The first offset still in each partition."""
        return KafkaOffsetsInitializer("earliest")

    @staticmethod
    def latest() -> KafkaOffsetsInitializer:
        """The end of each partition when it is resolved (its high watermark, or last
        stable offset for ``read_committed``)."""
        return KafkaOffsetsInitializer("latest")

    @staticmethod
    def committed_offsets(
        offset_reset_strategy: KafkaOffsetResetStrategy = KafkaOffsetResetStrategy.NONE,
    ) -> KafkaOffsetsInitializer:
        """The offsets committed by the consumer group (``set_group_id``); partitions
        without one use ``offset_reset_strategy`` (``NONE``: fail, naming the partition)."""
        return KafkaOffsetsInitializer("committed", reset=offset_reset_strategy)

    @staticmethod
    def timestamp(timestamp_ms: int) -> KafkaOffsetsInitializer:
        """The first record whose timestamp is at or after ``timestamp_ms`` (ms since the
        epoch); the end of partitions that have none."""
        return KafkaOffsetsInitializer("timestamp", timestamp_ms=timestamp_ms)

    @staticmethod
    def offsets(
        offsets: Mapping[KafkaTopicPartition, int],
        offset_reset_strategy: KafkaOffsetResetStrategy = KafkaOffsetResetStrategy.EARLIEST,
    ) -> KafkaOffsetsInitializer:
        """These offsets; partitions missing from the map use ``offset_reset_strategy``."""
        return KafkaOffsetsInitializer("offsets", offsets=offsets, reset=offset_reset_strategy)

    def validate(self, setting: str) -> None:
        """Refuse an initializer that cannot work (unknown kind, bad reset strategy), naming ``setting``; the
        builder calls it."""
        if self.kind not in ("earliest", "latest", "committed", "timestamp", "offsets"):
            raise ConfigurationError(f"{setting}: unknown offsets initializer kind '{self.kind}'")
        if not isinstance(self.reset, KafkaOffsetResetStrategy):
            raise ConfigurationError(
                f"{setting}: the offset reset strategy must be a KafkaOffsetResetStrategy, got {self.reset!r}"
            )
        if self.kind == "timestamp" and (
            not isinstance(self.timestamp_ms, int)
            or isinstance(self.timestamp_ms, bool)
            or self.timestamp_ms < 0
        ):
            raise ConfigurationError(
                f"{setting}: KafkaOffsetsInitializer.timestamp() takes "
                f"milliseconds since the epoch (>= 0), got {self.timestamp_ms!r}"
            )
        for tp, offset in self.partition_offsets.items():
            if not isinstance(tp, KafkaTopicPartition):
                raise ConfigurationError(
                    f"{setting}: KafkaOffsetsInitializer.offsets() takes KafkaTopicPartition keys, got {tp!r}"
                )
            if not isinstance(offset, int) or offset < 0:
                raise ConfigurationError(f"{setting}: offset {offset!r} of {tp} must be an int >= 0")

    def __repr__(self) -> str:
        if self.kind == "timestamp":
            return f"KafkaOffsetsInitializer.timestamp({self.timestamp_ms})"
        if self.kind in ("committed", "offsets"):
            return f"KafkaOffsetsInitializer.{self.kind}(reset={self.reset.name})"
        return f"KafkaOffsetsInitializer.{self.kind}()"


# ---------------------------------------------------------------------------- deserializers


class KafkaRecordDeserializationSchema:
    """Turns a consumed Kafka record into the record the stream carries.

    Use :meth:`value_only` (the value through a :class:`DeserializationSchema`) or
    :meth:`records` (:class:`KafkaRecord` with topic, partition, offset, timestamp,
    key, value and headers), or subclass and override :meth:`deserialize`.
    """

    @staticmethod
    def value_only(value_schema: DeserializationSchema) -> KafkaRecordDeserializationSchema:
        """A schema that reads only the message value with ``value_schema`` (what
        ``set_value_only_deserializer`` sets)."""
        return _ValueOnly(value_schema)

    @staticmethod
    def records(
        value_schema: DeserializationSchema | None = None, key_schema: DeserializationSchema | None = None
    ) -> KafkaRecordDeserializationSchema:
        """:class:`KafkaRecord` s; key and value stay ``bytes`` without a schema."""
        return KafkaRecordDeserializationSchema(value_schema, key_schema)

    def __init__(
        self,
        value_schema: DeserializationSchema | None = None,
        key_schema: DeserializationSchema | None = None,
    ) -> None:
        self.value_schema = value_schema
        self.key_schema = key_schema

    def validate(self, setting: str) -> None:
        """Refuse a schema without a usable ``deserialize``, naming ``setting``; the builder calls it."""
        for schema in (self.value_schema, self.key_schema):
            if schema is not None:
                check_schema(schema, setting, "deserialize")

    def deserialize(self, record: KafkaRecord) -> Any:
        """The stream record for ``record``; by default ``record`` itself."""
        return record

    def deserialize_message(self, message: Any) -> Any:
        """Called by the reader with a ``confluent_kafka.Message``; builds the
        :class:`KafkaRecord` and hands it to :meth:`deserialize`."""
        key, value = message.key(), message.value()
        if key is not None and self.key_schema is not None:
            key = self.key_schema.deserialize(key)
        if value is not None and self.value_schema is not None:
            value = self.value_schema.deserialize(value)
        ts_type, ts = message.timestamp()
        headers = message.headers()
        return self.deserialize(
            KafkaRecord(
                message.topic(),
                message.partition(),
                message.offset(),
                ts if ts_type else None,
                key,
                value,
                tuple(headers) if headers else (),
            )
        )


def _no_deserialize(message: bytes) -> Any:
    raise TypeError("the value schema of a KafkaSource has no deserialize(bytes) method")


class _ValueOnly(KafkaRecordDeserializationSchema):
    """The value only: no KafkaRecord is built per record (the common, fast path)."""

    def __init__(self, value_schema: DeserializationSchema) -> None:
        super().__init__(value_schema, None)
        # A schema without deserialize() is refused by validate() before any record is read.
        self._deserialize: Callable[[bytes], Any] = getattr(value_schema, "deserialize", _no_deserialize)

    def deserialize_message(self, message: Any) -> Any:
        value = message.value()
        return None if value is None else self._deserialize(value)

    def validate(self, setting: str) -> None:
        check_schema(self.value_schema, setting, "deserialize")

    def __getstate__(self) -> dict[str, Any]:
        return {"value_schema": self.value_schema, "key_schema": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["value_schema"])  # type: ignore[misc]


class KafkaRecordBatchDeserializer:
    """Turns the records of one poll into one Arrow record batch: the ``KafkaSource`` is then
    a batch source (``Source.columnar``; ``env.from_source`` gives a ``BatchStream``), built
    with ``KafkaSourceBuilder.set_batch_deserializer(...)``.

    - :meth:`json`: each value is a JSON object, its fields the columns, parsed by
      ``pyarrow.json`` for the whole poll at once. Give ``schema`` for stable types (without
      it every poll infers its own, which may differ, e.g. int and double); fields outside
      it are ignored. A ``None`` value (a tombstone) is a row of nulls.
    - :meth:`string` / :meth:`bytes`: one column ``value`` (``utf8`` / ``binary``).

    With ``metadata=True`` the batch also has the columns ``kafka_topic``,
    ``kafka_partition``, ``kafka_offset``, ``kafka_timestamp`` (ms, null when the record has
    none) and ``kafka_key`` (binary). Subclass and override :meth:`deserialize_batch` for
    another encoding. Offsets are checkpointed exactly as for record deserializers.
    """

    FORMATS = ("json", "string", "bytes")

    def __init__(
        self, value_format: str = "json", schema: SchemaLike | None = None, metadata: bool = False
    ) -> None:
        self.value_format = value_format
        self.schema = check_optional_schema(schema, "KafkaRecordBatchDeserializer(schema)")
        self.metadata = metadata

    @staticmethod
    def json(schema: SchemaLike | None = None, metadata: bool = False) -> KafkaRecordBatchDeserializer:
        """Values are JSON objects, their fields the batch's columns. ``schema`` (a
        ``pyarrow.Schema`` or a dict of column name to Arrow type) fixes the columns and
        their types (other fields are dropped, missing ones are null); without it pyarrow
        infers them from each poll's records, so give one when a field may be absent or
        null in a whole poll. ``metadata=True`` adds the ``kafka_*`` columns."""
        return KafkaRecordBatchDeserializer("json", schema, metadata)

    @staticmethod
    def string(metadata: bool = False) -> KafkaRecordBatchDeserializer:
        """Values as UTF-8 text, in one column ``value`` (``utf8``); ``metadata=True`` adds
        the ``kafka_*`` columns."""
        return KafkaRecordBatchDeserializer("string", None, metadata)

    @staticmethod
    def bytes(metadata: bool = False) -> KafkaRecordBatchDeserializer:
        """Values as they are, in one column ``value`` (``binary``), for a format you decode
        in ``map_batches``; ``metadata=True`` adds the ``kafka_*`` columns."""
        return KafkaRecordBatchDeserializer("bytes", None, metadata)

    def validate(self, setting: str) -> None:
        """Refuse a value format the deserializer cannot read, naming ``setting``; the builder calls it."""
        if self.value_format not in self.FORMATS:
            raise ConfigurationError(
                f"{setting}: value_format must be one of {', '.join(self.FORMATS)}, got {self.value_format!r}"
            )
        if self.schema is not None and self.value_format != "json":
            raise ConfigurationError(f"{setting}: a schema is for JSON values; {self.value_format} has none")

    def deserialize_batch(self, messages: list[Any]) -> Any:
        """One ``pyarrow.RecordBatch`` with a row per ``confluent_kafka.Message``, in order."""
        import pyarrow as pa

        values = [m.value() for m in messages]
        if self.value_format == "json":
            batch = self._parse_json(values, messages)
        else:
            column = pa.array(values, type=pa.binary())
            batch = pa.RecordBatch.from_arrays(
                [column.cast(pa.string()) if self.value_format == "string" else column], names=["value"]
            )
        if not self.metadata:
            return batch
        timestamps = [m.timestamp() for m in messages]
        extra = {
            "kafka_topic": pa.array([m.topic() for m in messages], type=pa.string()),
            "kafka_partition": pa.array([m.partition() for m in messages], type=pa.int32()),
            "kafka_offset": pa.array([m.offset() for m in messages], type=pa.int64()),
            "kafka_timestamp": pa.array([ts if kind else None for kind, ts in timestamps], type=pa.int64()),
            "kafka_key": pa.array([m.key() for m in messages], type=pa.binary()),
        }
        return pa.RecordBatch.from_arrays(
            [*batch.columns, *extra.values()], names=[*batch.schema.names, *extra]
        )

    def _parse_json(self, values: list[Any], messages: list[Any]) -> Any:
        import io

        import pyarrow as pa
        import pyarrow.json as pjson

        lines = [b"{}" if v is None else v for v in values]
        data = b"\n".join(lines)
        parse = pjson.ParseOptions(
            explicit_schema=self.schema,
            unexpected_field_behavior="ignore" if self.schema is not None else "infer",
            newlines_in_values=any(b"\n" in line for line in lines),
        )
        try:
            table = pjson.read_json(io.BytesIO(data), parse_options=parse)
        except pa.ArrowInvalid as exc:
            first, last = messages[0], messages[-1]
            raise KafkaConnectorError(
                f"KafkaSource: the values of {first.topic()}-{first.partition()} offsets "
                f"{first.offset()}..{last.offset()} are not all JSON objects of the schema: {exc}"
            ) from None
        if table.num_rows != len(values):
            raise KafkaConnectorError(
                f"KafkaSource: {len(values)} JSON values parsed into {table.num_rows} rows; "
                "each record's value must be exactly one JSON object"
            )
        return table.combine_chunks().to_batches()[0]


# ---------------------------------------------------------------------------- splits


@dataclass
class KafkaPartitionSplit:
    """One topic partition and how far it was read.

    ``offset`` is the next offset to read (``None``: not resolved yet, the source's
    starting offsets decide); ``stopping_offset`` is where a bounded read ends
    (exclusive; ``None``: never). ``skip_before_timestamp`` drops records older than a
    ``timestamp()`` start until the first one at or after it (brokers whose timestamp
    lookup is approximate, like Tansu's, give an earlier offset; on Kafka it skips nothing).
    """

    topic: str
    partition: int
    offset: int | None = None
    stopping_offset: int | None = None
    skip_before_timestamp: int | None = None

    @property
    def split_id(self) -> str:
        """``topic-partition``: a split is one partition."""
        return f"{self.topic}-{self.partition}"

    def is_finished(self) -> bool:
        """Whether a bounded split has reached its stopping offset."""
        return (
            self.offset is not None
            and self.stopping_offset is not None
            and self.offset >= self.stopping_offset
        )


# ---------------------------------------------------------------------------- source


class KafkaSource(Source):
    """Reads Kafka topics; build it with :meth:`builder` (see the module docstring)."""

    def __init__(
        self,
        properties: Mapping[str, Any],
        topics: Sequence[str] | None,
        topic_pattern: str | None,
        partitions: Sequence[KafkaTopicPartition] | None,
        starting_offsets: KafkaOffsetsInitializer,
        stopping_offsets: KafkaOffsetsInitializer | None,
        bounded: bool,
        deserializer: KafkaRecordDeserializationSchema | KafkaRecordBatchDeserializer | None,
    ) -> None:
        self.properties = dict(properties)
        self.topics = list(topics) if topics is not None else None
        self.topic_pattern = topic_pattern
        self.partitions = sorted(partitions) if partitions is not None else None
        self.starting_offsets = starting_offsets
        self.stopping_offsets = stopping_offsets
        self.bounded = bounded
        self.deserializer = deserializer
        #: A batch deserializer makes this a batch source.
        self.columnar = isinstance(deserializer, KafkaRecordBatchDeserializer)

    @staticmethod
    def builder() -> KafkaSourceBuilder:
        """Start configuring a Kafka source: bootstrap servers, topics or partitions, starting (and for a
        bounded read, stopping) offsets, and a deserializer."""
        return KafkaSourceBuilder()

    # -- settings ----------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """The brokers the source connects to (``bootstrap.servers``)."""
        return bootstrap_servers_of(self.properties)

    @property
    def group_id(self) -> str | None:
        """The consumer group offsets are committed to, or ``None``."""
        group = self.properties.get("group.id")
        return str(group) if group else None

    @property
    def request_timeout_s(self) -> float:
        """How long a request to the brokers may take before it counts as failed (``request.timeout.ms``), in
        seconds."""
        return int(self.properties.get(REQUEST_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS)) / 1000

    @property
    def commit_offsets_on_checkpoint(self) -> bool:
        """Whether offsets are committed to the consumer group when a checkpoint completes, for monitoring
        (the source's own positions are in the checkpoint)."""
        return _parse_bool(self.properties.get(COMMIT_OFFSETS_ON_CHECKPOINT, True)) is True

    def client_properties(self) -> dict[str, Any]:
        """What the Kafka client gets: the user's properties less the source's own."""
        return {k: v for k, v in self.properties.items() if k not in SOURCE_OPTIONS}

    def _subscription(self) -> str:
        if self.topics is not None:
            return f"topics {self.topics}"
        if self.topic_pattern is not None:
            return f"topic pattern '{self.topic_pattern}'"
        return f"partitions {[str(p) for p in self.partitions or []]}"

    # -- the Source contract -------------------------------------------------------------

    def get_boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED if self.bounded else Boundedness.CONTINUOUS_UNBOUNDED

    def validate(self) -> None:
        """Every setting checked when the job is built; each error names its setting."""
        where = "KafkaSource"
        servers = self.properties.get("bootstrap.servers")
        if not servers or not isinstance(servers, str) or not servers.strip():
            raise ConfigurationError(
                f"{where}: 'bootstrap.servers' is not set; call set_bootstrap_servers('host:9092,...')"
            )
        chosen = [
            n
            for n, v in (
                ("set_topics", self.topics),
                ("set_topic_pattern", self.topic_pattern),
                ("set_partitions", self.partitions),
            )
            if v is not None
        ]
        if not chosen:
            raise ConfigurationError(
                f"{where}: no topics to read; call set_topics(...), "
                "set_topic_pattern(...) or set_partitions(...)"
            )
        if len(chosen) > 1:
            raise ConfigurationError(
                f"{where}: {' and '.join(chosen)} were both called; choose one way to name the topics"
            )
        if self.topics is not None:
            if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
                raise ConfigurationError(
                    f"{where}: set_topics() takes one or more topic names, got {self.topics!r}"
                )
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except (re.error, TypeError) as exc:
                raise ConfigurationError(
                    f"{where}: set_topic_pattern({self.topic_pattern!r}) is not a regular expression: {exc}"
                ) from exc
        if self.partitions is not None:
            if not self.partitions or not all(isinstance(p, KafkaTopicPartition) for p in self.partitions):
                raise ConfigurationError(
                    f"{where}: set_partitions() takes KafkaTopicPartition objects, got {self.partitions!r}"
                )
        if self.deserializer is None:
            raise ConfigurationError(
                f"{where}: no deserializer; call set_value_only_deserializer("
                "SimpleStringSchema()) or set_deserializer(...)"
            )
        if not isinstance(self.deserializer, KafkaRecordBatchDeserializer) and not callable(
            getattr(self.deserializer, "deserialize_message", None)
        ):
            raise ConfigurationError(
                f"{where}: set_deserializer() takes a "
                "KafkaRecordDeserializationSchema, got "
                f"{type(self.deserializer).__name__}"
            )
        self.deserializer.validate(f"{where} deserializer")
        for setting, initializer in (
            ("set_starting_offsets", self.starting_offsets),
            ("set_bounded/set_unbounded", self.stopping_offsets),
        ):
            if initializer is None and setting != "set_starting_offsets":
                continue
            if not isinstance(initializer, KafkaOffsetsInitializer):
                raise ConfigurationError(
                    f"{where}: {setting}() takes a KafkaOffsetsInitializer "
                    "(earliest(), latest(), committed_offsets(), timestamp(ms), "
                    f"offsets({{...}})), got {initializer!r}"
                )
            initializer.validate(f"{where} {setting}()")
            if initializer.kind == "committed" and not self.group_id:
                raise ConfigurationError(
                    f"{where}: {setting}(KafkaOffsetsInitializer."
                    "committed_offsets()) needs a consumer group; call "
                    "set_group_id(...)"
                )
        if _parse_bool(self.properties.get("enable.auto.commit", False)) is not False:
            raise ConfigurationError(
                f"{where}: 'enable.auto.commit' cannot be true: read positions "
                "live in chandy's checkpoints and are committed to Kafka when "
                "a checkpoint completes"
            )
        if _parse_bool(self.properties.get(COMMIT_OFFSETS_ON_CHECKPOINT, True)) is None:
            raise ConfigurationError(
                f"{where}: '{COMMIT_OFFSETS_ON_CHECKPOINT}' takes true or "
                f"false, got {self.properties[COMMIT_OFFSETS_ON_CHECKPOINT]!r}"
            )
        timeout = self.properties.get(REQUEST_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS)
        try:
            valid_timeout = int(timeout) > 0
        except (TypeError, ValueError):
            valid_timeout = False
        if not valid_timeout:
            raise ConfigurationError(
                f"{where}: '{REQUEST_TIMEOUT_MS}' takes milliseconds > 0, got {timeout!r}"
            )
        check_client_properties({**self.client_properties(), **_FORCED}, "consumer", where)

    def create_splits(self, parallelism: int) -> list[KafkaPartitionSplit]:
        """One split per partition, sorted by topic and partition (every subtask computes
        the same list and takes its share). Fails within ``request.timeout.ms`` when the
        servers cannot be reached, and names a topic that does not exist."""
        partitions = self._discover_partitions()
        log.info(
            "KafkaSource: %d partitions of %s at %s.",
            len(partitions),
            self._subscription(),
            self.bootstrap_servers,
        )
        return [KafkaPartitionSplit(tp.topic, tp.partition) for tp in partitions]

    def _discover_partitions(self) -> list[KafkaTopicPartition]:
        ck = import_confluent_kafka()
        servers = self.bootstrap_servers
        consumer = ck.Consumer(
            {
                **self.client_properties(),
                **_FORCED,
                "group.id": self.group_id or "chandy-metadata",
                "allow.auto.create.topics": False,
                "logger": client_logger(),
            }
        )
        try:
            metadata = consumer.list_topics(timeout=self.request_timeout_s)
        except ck.KafkaException as exc:
            raise KafkaConnectorError(
                f"KafkaSource: cannot list the partitions of {self._subscription()}: the Kafka "
                f"cluster at {servers} did not answer within {self.request_timeout_s:g} s "
                f"({REQUEST_TIMEOUT_MS}): {describe_error(exc)}"
            ) from None
        finally:
            consumer.close()
        found: dict[str, list[int]] = {}
        for name, topic in metadata.topics.items():
            if topic.error is None:
                found[name] = sorted(topic.partitions)
        if self.topic_pattern is not None:
            pattern = re.compile(self.topic_pattern)
            topics = sorted(t for t in found if pattern.fullmatch(t))
            if not topics:
                log.warning("KafkaSource: no topic at %s matches '%s'.", servers, self.topic_pattern)
            return [KafkaTopicPartition(t, p) for t in topics for p in found[t]]
        wanted = sorted(set(self.topics or [p.topic for p in self.partitions or []]))
        missing = [t for t in wanted if t not in found]
        if missing:
            raise KafkaSetupError(
                f"KafkaSource: topic{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(t) for t in missing)} "
                f"{'do' if len(missing) > 1 else 'does'} not exist on the Kafka cluster at {servers} "
                f"({len(found)} topics there)"
            )
        if self.topics is not None:
            return [KafkaTopicPartition(t, p) for t in wanted for p in found[t]]
        absent = [str(p) for p in self.partitions or [] if p.partition not in found[p.topic]]
        if absent:
            raise KafkaSetupError(
                f"KafkaSource: partitions {absent} do not exist on the Kafka cluster at {servers}"
            )
        return list(self.partitions or [])

    def create_reader(self, context: SourceReaderContext) -> KafkaSourceReader:
        return KafkaSourceReader(self, context)


def _parse_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


# ---------------------------------------------------------------------------- reader


def _keep_message(message: Any) -> Any:
    return message


class KafkaSourceReader(SourceReader):
    """Reads the partitions of one subtask with one assigned (never subscribed) consumer.

    ``poll_next`` takes what the client already fetched in the background and never
    waits for the network, so checkpoint barriers and cancellation are not held up.
    """

    idle_wait_s = 0.01

    def __init__(self, source: KafkaSource, context: SourceReaderContext) -> None:
        self._source = source
        self._context = context
        deserializer = source.deserializer
        #: A batch source keeps the messages of a poll and turns them into one batch at its end.
        self._batch_deserializer = (
            deserializer if isinstance(deserializer, KafkaRecordBatchDeserializer) else None
        )
        self._deserialize: Callable[[Any], Any] = (
            _keep_message if self._batch_deserializer is not None else deserializer.deserialize_message  # type: ignore[union-attr]
        )
        self._splits: dict[tuple[str, int], KafkaPartitionSplit] = {}
        #: splits being read (assigned to the consumer), a subset of _splits
        self._active: dict[tuple[str, int], KafkaPartitionSplit] = {}
        self._consumer: Any = None
        self._ck: Any = None
        self._fatal: Any = None
        self._commit = bool(source.group_id) and source.commit_offsets_on_checkpoint
        self._pending_commits: dict[int, list[tuple[str, int, int]]] = {}
        self._commits_in_flight = 0
        #: True once the source has stopping offsets: the reader ends when all splits did
        self._can_end = source.stopping_offsets is not None

    # -- the consumer --------------------------------------------------------------------

    def _client(self) -> Any:
        if self._consumer is None:
            ck = self._ck = import_confluent_kafka()
            source = self._source
            prefix = source.properties.get(CLIENT_ID_PREFIX) or source.group_id or "chandy-kafka-source"
            config = {
                **source.client_properties(),
                **_FORCED,
                "group.id": source.group_id or f"chandy-kafka-source-{uuid.uuid4().hex}",
                "client.id": f"{prefix}-{self._context.subtask_index}",
                "logger": client_logger(),
                "error_cb": self._on_error,
                "on_commit": self._on_commit,
            }
            config.setdefault("auto.offset.reset", "earliest")
            self._consumer = ck.Consumer(config)
        return self._consumer

    def _on_error(self, error: Any) -> None:
        if error.fatal():
            self._fatal = error
        else:
            log.warning(
                "Kafka consumer (subtask %d, %s): %s",
                self._context.subtask_index,
                self._source.bootstrap_servers,
                error.str(),
            )

    def _on_commit(self, error: Any, partitions: list[Any]) -> None:
        self._commits_in_flight = max(0, self._commits_in_flight - 1)
        if error is not None:
            log.warning(
                "Committing offsets to Kafka (group '%s') failed: %s (offsets stay in the "
                "checkpoints; this only affects monitoring)",
                self._source.group_id,
                error.str(),
            )

    def _fail(self, what: str, error: Any) -> KafkaConnectorError:
        text = error.str() if hasattr(error, "str") else describe_error(error)
        return KafkaConnectorError(f"KafkaSource: {what} at {self._source.bootstrap_servers}: {text}")

    # -- splits --------------------------------------------------------------------------

    def add_splits(self, splits: Sequence[KafkaPartitionSplit]) -> None:
        splits = [replace(s) for s in splits]
        if not splits:
            return
        consumer = self._client()
        self._resolve(splits)
        ck = self._ck
        to_read = []
        for split in splits:
            key = (split.topic, split.partition)
            self._splits[key] = split
            if not split.is_finished():
                self._active[key] = split
                to_read.append(ck.TopicPartition(split.topic, split.partition, split.offset))
        if to_read:
            consumer.incremental_assign(to_read)
        log.info(
            "KafkaSource subtask %d reads %s.",
            self._context.subtask_index,
            ", ".join(
                f"{s.split_id}@{s.offset}"
                + (f"..{s.stopping_offset}" if s.stopping_offset is not None else "")
                for s in splits
            ),
        )

    def _resolve(self, splits: list[KafkaPartitionSplit]) -> None:
        """Turn the source's offsets initializers into concrete offsets, once per split."""
        source = self._source
        unstarted = [s for s in splits if s.offset is None]
        if unstarted:
            offsets = self._lookup(source.starting_offsets, unstarted, "starting")
            for split, offset in zip(unstarted, offsets, strict=True):
                split.offset = offset
                if source.starting_offsets.kind == "timestamp":
                    split.skip_before_timestamp = source.starting_offsets.timestamp_ms
        if source.stopping_offsets is not None:
            unstopped = [s for s in splits if s.stopping_offset is None]
            if unstopped:
                offsets = self._lookup(source.stopping_offsets, unstopped, "stopping")
                for split, offset in zip(unstopped, offsets, strict=True):
                    split.stopping_offset = offset

    def _lookup(
        self, initializer: KafkaOffsetsInitializer, splits: list[KafkaPartitionSplit], which: str
    ) -> list[int]:
        consumer, ck = self._consumer, self._ck
        timeout = self._source.request_timeout_s
        watermarks: dict[tuple[str, int], tuple[int, int]] = {}

        def watermark(split: KafkaPartitionSplit, end: bool) -> int:
            key = (split.topic, split.partition)
            if key not in watermarks:
                try:
                    low_high = consumer.get_watermark_offsets(
                        ck.TopicPartition(split.topic, split.partition), timeout=timeout, cached=False
                    )
                except ck.KafkaException as exc:
                    raise self._fail(
                        f"cannot look up the offsets of {split.split_id} within {timeout:g} s", exc.args[0]
                    ) from None
                if low_high is None:
                    raise KafkaConnectorError(
                        f"KafkaSource: no offsets for {split.split_id} at "
                        f"{self._source.bootstrap_servers} within {timeout:g} s"
                    )
                watermarks[key] = low_high
            return watermarks[key][1 if end else 0]

        def reset(split: KafkaPartitionSplit, why: str) -> int:
            if initializer.reset is KafkaOffsetResetStrategy.EARLIEST:
                return watermark(split, end=False)
            if initializer.reset is KafkaOffsetResetStrategy.LATEST:
                return watermark(split, end=True)
            raise KafkaSetupError(
                f"KafkaSource: {split.split_id} has {why} and the {which} offsets' reset strategy "
                "is NONE; pass KafkaOffsetResetStrategy.EARLIEST or LATEST"
            )

        kind = initializer.kind
        if kind == "earliest":
            return [watermark(s, end=False) for s in splits]
        if kind == "latest":
            return [watermark(s, end=True) for s in splits]
        if kind == "offsets":
            out = []
            for s in splits:
                offset = initializer.partition_offsets.get(KafkaTopicPartition(s.topic, s.partition))
                out.append(offset if offset is not None else reset(s, "no offset in offsets({...})"))
            return out
        tps = [ck.TopicPartition(s.topic, s.partition, initializer.timestamp_ms or 0) for s in splits]
        try:
            if kind == "timestamp":
                found = consumer.offsets_for_times(tps, timeout=timeout)
            else:
                found = consumer.committed(tps, timeout=timeout)
        except ck.KafkaException as exc:
            raise self._fail(
                f"cannot look up the {which} offsets ({initializer!r}) within {timeout:g} s", exc.args[0]
            ) from None
        out = []
        for split, tp in zip(splits, found, strict=True):
            if tp.error is not None:
                raise self._fail(f"cannot look up the {which} offset of {split.split_id}", tp.error)
            if tp.offset >= 0:
                out.append(tp.offset)
            elif kind == "timestamp":
                out.append(watermark(split, end=True))  # no record that late: the end
            else:
                out.append(reset(split, f"no committed offset for group '{self._source.group_id}'"))
        return out

    def _finish(self, key: tuple[str, int]) -> None:
        split = self._active.pop(key)
        log.info(
            "KafkaSource subtask %d finished %s at offset %s.",
            self._context.subtask_index,
            split.split_id,
            split.offset,
        )
        try:
            self._consumer.incremental_unassign([self._ck.TopicPartition(split.topic, split.partition)])
        except self._ck.KafkaException as exc:
            log.debug("unassigning %s: %s", split.split_id, describe_error(exc))

    # -- reading -------------------------------------------------------------------------

    def poll_next(self, max_records: int) -> list[Any] | None:
        if self._fatal is not None:
            raise self._fail("fatal consumer error", self._fatal)
        active = self._active
        if not active:
            return None if self._can_end else []
        messages = self._consumer.consume(max_records, 0)
        if not messages:
            return []
        out: list[Any] = []
        append = out.append
        deserialize = self._deserialize
        finished: list[tuple[str, int]] = []
        for message in messages:
            if message.error() is not None:
                self._on_message_error(message, finished)
                continue
            key = (message.topic(), message.partition())
            split = active.get(key)
            if split is None:
                continue  # finished; the client still had records of it
            offset = message.offset()
            stop = split.stopping_offset
            if stop is not None and offset >= stop:
                split.offset = stop
                finished.append(key)
                continue
            if split.skip_before_timestamp is not None:
                ts_type, ts = message.timestamp()
                if ts_type and ts < split.skip_before_timestamp:
                    split.offset = offset + 1
                    continue
                split.skip_before_timestamp = None
            append(deserialize(message))
            split.offset = offset + 1
            if stop is not None and offset + 1 >= stop:
                finished.append(key)
        for key in finished:
            if key in active:
                self._finish(key)
        if self._batch_deserializer is not None and out:
            return self._batch_deserializer.deserialize_batch(out)  # type: ignore[no-any-return]
        return out

    def _on_message_error(self, message: Any, finished: list[tuple[str, int]]) -> None:
        error = message.error()
        key = (message.topic(), message.partition())
        if error.code() == self._ck.KafkaError._PARTITION_EOF:
            # The end of what the broker has: the position is past any transaction markers,
            # which never arrive as records; a bounded split may end here.
            split = self._active.get(key)
            if split is not None and split.offset is not None:
                position = message.offset()
                if position > split.offset:
                    split.offset = (
                        position if split.stopping_offset is None else min(position, split.stopping_offset)
                    )
                if split.is_finished():
                    finished.append(key)
            return
        if error.fatal() or not error.retriable():
            where = f"{key[0]}-{key[1]}" if key[0] else "a partition"
            raise self._fail(f"reading {where} failed", error)
        log.warning("KafkaSource subtask %d: %s", self._context.subtask_index, error.str())

    # -- checkpoints ---------------------------------------------------------------------

    def snapshot_state(self, checkpoint_id: int) -> list[KafkaPartitionSplit]:
        state = [replace(s) for s in self._splits.values()]
        if self._commit:
            self._pending_commits[checkpoint_id] = [
                (s.topic, s.partition, s.offset) for s in state if s.offset is not None
            ]
            while len(self._pending_commits) > _MAX_PENDING_COMMITS:
                del self._pending_commits[min(self._pending_commits)]
        return state

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the offsets this checkpoint stored, for monitoring only (asynchronously:
        the task thread never waits for Kafka here)."""
        offsets = self._pending_commits.pop(checkpoint_id, None)
        for older in [c for c in self._pending_commits if c < checkpoint_id]:
            del self._pending_commits[older]
        if not offsets or self._consumer is None:
            return
        ck = self._ck
        try:
            self._consumer.commit(
                offsets=[ck.TopicPartition(t, p, o) for t, p, o in offsets], asynchronous=True
            )
            self._commits_in_flight += 1
        except ck.KafkaException as exc:
            log.warning(
                "Committing offsets of checkpoint %d to Kafka failed: %s", checkpoint_id, describe_error(exc)
            )

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            consumer.unassign()
            deadline = time.monotonic() + _CLOSE_COMMIT_WAIT_S
            while self._commits_in_flight and time.monotonic() < deadline:
                consumer.poll(0.05)  # serves the commit callbacks
            consumer.close()
        except (self._ck.KafkaException, RuntimeError) as exc:
            log.warning("Closing the Kafka consumer: %s", describe_error(exc))


# ---------------------------------------------------------------------------- builder


class KafkaSourceBuilder:
    """PyFlink's ``KafkaSourceBuilder``: every ``set_*`` returns the builder."""

    def __init__(self) -> None:
        self._properties: dict[str, Any] = {}
        self._topics: list[str] | None = None
        self._topic_pattern: str | None = None
        self._partitions: list[KafkaTopicPartition] | None = None
        self._starting = KafkaOffsetsInitializer.earliest()
        self._stopping: KafkaOffsetsInitializer | None = None
        self._bounded = False
        self._deserializer: KafkaRecordDeserializationSchema | KafkaRecordBatchDeserializer | None = None

    def set_bootstrap_servers(self, bootstrap_servers: str) -> KafkaSourceBuilder:
        """The brokers to connect to, ``host:port[,host:port...]``."""
        return self.set_property("bootstrap.servers", bootstrap_servers)

    def set_group_id(self, group_id: str) -> KafkaSourceBuilder:
        """The consumer group offsets are committed to on checkpoints (and read from by
        ``committed_offsets()``); partitions are never assigned by the group."""
        return self.set_property("group.id", group_id)

    def set_client_id_prefix(self, prefix: str) -> KafkaSourceBuilder:
        """The prefix of the client ids of the source's consumers, to tell them apart in the brokers' logs and
        metrics."""
        return self.set_property(CLIENT_ID_PREFIX, prefix)

    def set_topics(self, *topics: str | Iterable[str]) -> KafkaSourceBuilder:
        """Read every partition of these topics (names, or iterables of names)."""
        names: list[Any] = []
        for topic in topics:
            names.extend([topic] if isinstance(topic, str) else list(topic))
        self._topics = names
        return self

    def set_topic_pattern(self, topic_pattern: str) -> KafkaSourceBuilder:
        """Every topic whose whole name matches the regular expression (found at start)."""
        self._topic_pattern = topic_pattern
        return self

    def set_partitions(self, partitions: Iterable[KafkaTopicPartition]) -> KafkaSourceBuilder:
        """Read exactly these partitions (instead of topics or a topic pattern)."""
        self._partitions = list(partitions)
        return self

    def set_starting_offsets(self, initializer: KafkaOffsetsInitializer) -> KafkaSourceBuilder:
        """Where partitions start on a fresh start (default: earliest); a restore resumes
        from the checkpoint's offsets instead."""
        self._starting = initializer
        return self

    def set_bounded(self, stopping_offsets: KafkaOffsetsInitializer) -> KafkaSourceBuilder:
        """Read up to these offsets (``latest()``: what each partition had when it was
        first read), then end: a bounded job."""
        self._stopping, self._bounded = stopping_offsets, True
        return self

    def set_unbounded(self, stopping_offsets: KafkaOffsetsInitializer) -> KafkaSourceBuilder:
        """Stop at these offsets too, but run as a streaming (unbounded) source."""
        self._stopping, self._bounded = stopping_offsets, False
        return self

    def set_value_only_deserializer(self, schema: DeserializationSchema) -> KafkaSourceBuilder:
        """Records are the values, through ``schema`` (e.g. ``SimpleStringSchema()``)."""
        self._deserializer = KafkaRecordDeserializationSchema.value_only(schema)
        return self

    def set_deserializer(self, deserializer: KafkaRecordDeserializationSchema) -> KafkaSourceBuilder:
        """Records built from the whole Kafka record, e.g.
        ``KafkaRecordDeserializationSchema.records(SimpleStringSchema())``."""
        self._deserializer = deserializer
        return self

    def set_batch_deserializer(self, deserializer: KafkaRecordBatchDeserializer) -> KafkaSourceBuilder:
        """Arrow record batches, one per poll, e.g. ``KafkaRecordBatchDeserializer.json(schema)``:
        the source is a batch source and ``env.from_source`` gives a ``BatchStream``."""
        if not isinstance(deserializer, KafkaRecordBatchDeserializer):
            raise ConfigurationError(
                "set_batch_deserializer() takes a KafkaRecordBatchDeserializer (json(), string(), "
                f"bytes()), got {type(deserializer).__name__}"
            )
        self._deserializer = deserializer
        return self

    def set_property(self, key: str, value: Any) -> KafkaSourceBuilder:
        """A librdkafka consumer property, or one of the source's own:
        ``request.timeout.ms`` (metadata and offset lookups, default 10 s),
        ``commit.offsets.on.checkpoint`` (default true), ``client.id.prefix``."""
        self._properties[key] = value
        return self

    def set_properties(self, properties: Mapping[str, Any]) -> KafkaSourceBuilder:
        """Set several consumer properties at once (any librdkafka consumer property)."""
        for key, value in properties.items():
            self.set_property(key, value)
        return self

    def build(self) -> KafkaSource:
        """The source, with every setting checked (``ConfigurationError`` names the bad one)."""
        source = KafkaSource(
            self._properties,
            self._topics,
            self._topic_pattern,
            self._partitions,
            self._starting,
            self._stopping,
            self._bounded,
            self._deserializer,
        )
        source.validate()
        return source
