"""What the Kafka source and sink share: (de)serialization schemas, topic partitions, the
client configuration checks, and errors that name the setting or the servers at fault.

``confluent_kafka`` is imported inside functions only: ``import chandy.connectors`` must
work on a machine without it, and only a job that uses Kafka needs it installed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chandy.errors import ChandyError, ConfigurationError, UnrecoverableError

log = logging.getLogger(__name__)

#: Where librdkafka's own log lines go (instead of stderr), one logger per client kind.
CLIENT_LOGGER_NAME = "chandy.connectors.kafka.client"


class KafkaConnectorError(ChandyError):
    """Kafka could not be used as configured: unreachable servers, a missing topic, an
    offset that cannot be resolved. The message names the servers, topic or partition."""


class KafkaSetupError(KafkaConnectorError, UnrecoverableError):
    """The Kafka cluster does not match the job: a topic or partition that does not
    exist, no committed offset where the reset strategy is NONE. A restart would fail
    the same way, so the job fails at once instead of restarting (an unreachable
    cluster, by contrast, is retried under the restart strategy)."""


# ---------------------------------------------------------------------------- schemas


class DeserializationSchema:
    """Turns the bytes of a Kafka key or value into a record (PyFlink's name).

    ``None`` (a null key, a tombstone value) stays ``None``: a schema never sees it.
    """

    def deserialize(self, message: bytes) -> Any:
        """The record a message's bytes stand for; override it to parse your format."""
        raise NotImplementedError


class SerializationSchema:
    """Turns a record into the bytes of a Kafka key or value (PyFlink's name)."""

    def serialize(self, element: Any) -> bytes:
        """The bytes a record is written as; override it for your format."""
        raise NotImplementedError


class SimpleStringSchema(SerializationSchema, DeserializationSchema):
    """Text in ``charset`` (UTF-8 by default) <-> ``str``."""

    def __init__(self, charset: str = "utf-8") -> None:
        "".encode(charset)  # an unknown charset fails here, where the job is built
        self.charset = charset

    def deserialize(self, message: bytes) -> str:
        """The message decoded as text in the schema's charset."""
        return message.decode(self.charset)

    def serialize(self, element: Any) -> bytes:
        """``str(record)`` encoded in the schema's charset."""
        return str(element).encode(self.charset)

    def __repr__(self) -> str:
        return f"SimpleStringSchema({self.charset!r})"


class JsonSchema(SerializationSchema, DeserializationSchema):
    """JSON text (UTF-8) <-> Python values (dicts, lists, numbers, strings)."""

    def deserialize(self, message: bytes) -> Any:
        """The JSON value the message holds."""
        return json.loads(message)

    def serialize(self, element: Any) -> bytes:
        """The record as compact JSON."""
        return json.dumps(element, separators=(",", ":")).encode()

    def __repr__(self) -> str:
        return "JsonSchema()"


class ByteArraySchema(SerializationSchema, DeserializationSchema):
    """The raw bytes, untouched (``bytes`` in, ``bytes`` out)."""

    def deserialize(self, message: bytes) -> bytes:
        """The message's bytes, unchanged."""
        return message

    def serialize(self, element: Any) -> bytes:
        """The record, which must be bytes-like, as bytes (anything else is refused with its type)."""
        if not isinstance(element, (bytes, bytearray, memoryview)):
            raise TypeError(f"ByteArraySchema serializes bytes, got {type(element).__name__}")
        return bytes(element)

    def __repr__(self) -> str:
        return "ByteArraySchema()"


def check_schema(schema: Any, setting: str, method: str) -> None:
    """Refuse a schema without the method the connector will call, naming the setting."""
    if not callable(getattr(schema, method, None)):
        raise ConfigurationError(
            f"{setting} takes a schema with a {method}() method (SimpleStringSchema(), "
            f"JsonSchema(), ByteArraySchema() or your own), got {type(schema).__name__}"
        )


# ---------------------------------------------------------------------------- partitions


@dataclass(frozen=True, order=True)
class KafkaTopicPartition:
    """One partition of one topic (PyFlink's ``KafkaTopicPartition``)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True)
class KafkaRecord:
    """A Kafka record with its coordinates, as the record deserializer of
    ``KafkaRecordDeserializationSchema.records()`` emits it.

    ``timestamp`` is milliseconds since the epoch (``None`` if the record has none);
    ``key`` and ``value`` are deserialized (raw ``bytes`` without a schema);
    ``headers`` is a tuple of ``(name, bytes)`` pairs.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: Any
    value: Any
    headers: tuple[tuple[str, bytes | None], ...] = field(default=())


# ---------------------------------------------------------------------------- clients


def import_confluent_kafka() -> Any:
    """The ``confluent_kafka`` module, or a clear error saying how to install it."""
    try:
        import confluent_kafka
    except ImportError as exc:
        raise ConfigurationError(
            "the Kafka connectors need the confluent-kafka package: pip install 'confluent-kafka>=2.3'"
        ) from exc
    return confluent_kafka


def client_logger() -> logging.Logger:
    """librdkafka's log lines go to Python logging, not to the worker's stderr."""
    return logging.getLogger(CLIENT_LOGGER_NAME)


def bootstrap_servers_of(properties: Mapping[str, Any]) -> str:
    """The ``bootstrap.servers`` of a set of client properties (empty when not set)."""
    return str(properties.get("bootstrap.servers", ""))


def check_client_properties(properties: Mapping[str, Any], kind: str, where: str) -> None:
    """Let librdkafka check every property name and value now, when the job is built.

    Creating a client parses its configuration and nothing else blocks: the broker
    connections it starts in the background are dropped by the immediate close.
    ``kind`` is ``"consumer"`` or ``"producer"``; ``where`` names the connector.
    """
    ck = import_confluent_kafka()
    for key, value in properties.items():
        if not isinstance(key, str) or not key:
            raise ConfigurationError(f"{where}: Kafka property names are strings, got {key!r}")
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigurationError(
                f"{where}: Kafka property '{key}' takes a string, number or bool, got {type(value).__name__}"
            )
    config = {**properties, "logger": client_logger()}
    try:
        if kind == "consumer":
            config.setdefault("group.id", "chandy-config-check")
            client = ck.Consumer(config)
        else:
            client = ck.Producer(config)
    except (ck.KafkaException, ValueError, TypeError) as exc:
        raise ConfigurationError(f"{where}: invalid Kafka client property: {describe_error(exc)}") from exc
    if kind == "consumer":
        client.close()
    else:
        client.flush(0)


def describe_error(exc: BaseException) -> str:
    """The text of a KafkaError inside a KafkaException (its ``str`` is a struct dump)."""
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "str") and callable(args[0].str):
        return str(args[0].str())
    return str(exc)
