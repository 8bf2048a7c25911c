"""PyFlink's ``pyflink.common.serialization``: schemas and the file sink's row ``Encoder``."""

from chandy.connectors import (
    BulkWriterFactory,
    ByteArraySchema,
    DeserializationSchema,
    Encoder,
    SerializationSchema,
    SimpleStringSchema,
)

__all__ = [
    "BulkWriterFactory",
    "ByteArraySchema",
    "DeserializationSchema",
    "Encoder",
    "SerializationSchema",
    "SimpleStringSchema",
]
