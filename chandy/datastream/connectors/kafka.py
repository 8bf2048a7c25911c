"""PyFlink's ``pyflink.datastream.connectors.kafka``: ``KafkaSource`` and ``KafkaSink``."""

from chandy.connectors import (
    KafkaOffsetResetStrategy,
    KafkaOffsetsInitializer,
    KafkaRecordSerializationSchema,
    KafkaSink,
    KafkaSource,
    KafkaSourceBuilder,
    KafkaTopicPartition,
)
from chandy.connectors.kafka_sink import KafkaRecordSerializationSchemaBuilder

__all__ = [
    "KafkaOffsetResetStrategy",
    "KafkaOffsetsInitializer",
    "KafkaRecordSerializationSchema",
    "KafkaRecordSerializationSchemaBuilder",
    "KafkaSink",
    "KafkaSource",
    "KafkaSourceBuilder",
    "KafkaTopicPartition",
]
