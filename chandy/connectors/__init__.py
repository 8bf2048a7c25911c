"""Sources and sinks. Sources keep their read positions in checkpointed state."""

from chandy.connectors.arrow_sources import ArrowDataGeneratorSource, ArrowNumberSequenceSource
from chandy.connectors.collection import CollectionSource
from chandy.connectors.data_generator import DataGeneratorSource
from chandy.connectors.delta_sink import DeltaSink
from chandy.connectors.file_formats import (
    BatchFormat,
    BulkFormat,
    CsvBatchFormat,
    CsvFormat,
    JsonBatchFormat,
    JsonLinesFormat,
    MalformedRecordError,
    ParquetBatchFormat,
    ParquetFormat,
    StreamFormat,
)
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
from chandy.connectors.file_source import FileSource
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
    KafkaRecordBatchSerializationSchema,
    KafkaRecordSerializationSchema,
    KafkaSink,
)
from chandy.connectors.kafka_source import (
    KafkaOffsetResetStrategy,
    KafkaOffsetsInitializer,
    KafkaPartitionSplit,
    KafkaRecordBatchDeserializer,
    KafkaRecordDeserializationSchema,
    KafkaSource,
    KafkaSourceBuilder,
)
from chandy.connectors.number_sequence import NumberSequenceSource
from chandy.connectors.sinks import DiscardingSink, PrintSink

__all__ = [
    "ArrowDataGeneratorSource",
    "ArrowNumberSequenceSource",
    "BatchFormat",
    "BulkFormat",
    "BulkWriterFactory",
    "ByteArraySchema",
    "CollectionSource",
    "CsvBatchFormat",
    "CsvEncoder",
    "CsvFormat",
    "DataGeneratorSource",
    "DeliveryGuarantee",
    "DeltaSink",
    "DeserializationSchema",
    "DiscardingSink",
    "Encoder",
    "FileSink",
    "FileSource",
    "JsonBatchFormat",
    "JsonLinesEncoder",
    "JsonLinesFormat",
    "JsonSchema",
    "KafkaConnectorError",
    "KafkaOffsetResetStrategy",
    "KafkaOffsetsInitializer",
    "KafkaPartitionSplit",
    "KafkaRecord",
    "KafkaRecordBatchDeserializer",
    "KafkaRecordBatchSerializationSchema",
    "KafkaRecordDeserializationSchema",
    "KafkaRecordSerializationSchema",
    "KafkaSetupError",
    "KafkaSink",
    "KafkaSource",
    "KafkaSourceBuilder",
    "KafkaTopicPartition",
    "MalformedRecordError",
    "NumberSequenceSource",
    "OutputFileConfig",
    "ParquetBatchFormat",
    "ParquetBulkWriters",
    "ParquetFormat",
    "PrintSink",
    "RollingPolicy",
    "SerializationSchema",
    "SimpleStringSchema",
    "StreamFormat",
]
