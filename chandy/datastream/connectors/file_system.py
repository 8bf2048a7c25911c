"""PyFlink's ``pyflink.datastream.connectors.file_system``: ``FileSource`` and ``FileSink``."""

from chandy.connectors import (
    BulkFormat,
    BulkWriterFactory,
    FileSink,
    FileSource,
    OutputFileConfig,
    RollingPolicy,
    StreamFormat,
)
from chandy.connectors.file_source import FileSourceBuilder

__all__ = [
    "BulkFormat",
    "BulkWriterFactory",
    "FileSink",
    "FileSource",
    "FileSourceBuilder",
    "OutputFileConfig",
    "RollingPolicy",
    "StreamFormat",
]
