"""Sources and sinks. Sources keep their read positions in checkpointed state."""

from chandy.connectors.collection import CollectionSource
from chandy.connectors.delta_sink import DeltaSink
from chandy.connectors.file_sink import (
    BulkWriterFactory,
    CsvEncoder,
    Encoder,
    FileSink,
    JsonLinesEncoder,
    OutputFileConfig,
    ParquetBulkWriters,
    RollingPolicy,
)
from chandy.connectors.kafka_common import (
    ByteArraySchema,
    DeserializationSchema,
    JsonSchema,
    KafkaConnectorError,
    KafkaRecord,
    KafkaSetupError,
    KafkaTopicPartition,
    SerializationSchema,
    SimpleStringSchema,
)
from chandy.connectors.kafka_sink import (
    DeliveryGuarantee,
    KafkaRecordSerializationSchema,
    KafkaSink,
)
from chandy.connectors.kafka_source import (
    KafkaOffsetResetStrategy,
    KafkaOffsetsInitializer,
    KafkaPartitionSplit,
    KafkaRecordDeserializationSchema,
    KafkaSource,
    KafkaSourceBuilder,
)
from chandy.connectors.number_sequence import NumberSequenceSource
from chandy.connectors.sinks import DiscardingSink, PrintSink

__all__ = [
    "BulkWriterFactory",
    "ByteArraySchema",
    "CollectionSource",
    "CsvEncoder",
    "DeliveryGuarantee",
    "DeltaSink",
    "DeserializationSchema",
    "DiscardingSink",
    "Encoder",
    "FileSink",
    "JsonLinesEncoder",
    "JsonSchema",
    "KafkaConnectorError",
    "KafkaOffsetResetStrategy",
    "KafkaOffsetsInitializer",
    "KafkaPartitionSplit",
    "KafkaRecord",
    "KafkaRecordDeserializationSchema",
    "KafkaRecordSerializationSchema",
    "KafkaSetupError",
    "KafkaSink",
    "KafkaSource",
    "KafkaSourceBuilder",
    "KafkaTopicPartition",
    "NumberSequenceSource",
    "OutputFileConfig",
    "ParquetBulkWriters",
    "PrintSink",
    "RollingPolicy",
    "SerializationSchema",
    "SimpleStringSchema",
]
