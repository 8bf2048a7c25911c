"""PyFlink's ``pyflink.common``, for chandy: replace ``pyflink`` by ``chandy`` in a job's imports.

``from chandy.common import Types, WatermarkStrategy, Duration, Time, Row`` gives
chandy's own classes under PyFlink's names. The submodules mirror PyFlink's
(``chandy.common.typeinfo``, ``.types``, ``.time``, ``.watermark_strategy``,
``.serialization``, ``.configuration``). Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chandy.common._lazy import exports_of, load_export

_EXPORTS = {
    **exports_of("chandy.core.types", "Types", "TypeInformation", "Row", "RowKind", "Instant"),
    **exports_of("chandy.core.time", "Duration", "Time"),
    **exports_of("chandy.core.watermark_strategy", "WatermarkStrategy", "TimestampAssigner"),
    **exports_of("chandy.config", "Configuration", "ConfigOption"),
    **exports_of(
        "chandy.connectors",
        "SerializationSchema",
        "DeserializationSchema",
        "SimpleStringSchema",
        "ByteArraySchema",
        "Encoder",
    ),
    **exports_of("chandy.api.execution_config", "ExecutionConfig"),
    **exports_of("chandy.runtime.job_client", "JobClient"),
    **exports_of("chandy.runtime.job_result", "JobExecutionResult"),
    **exports_of("chandy.messages.status", "JobStatus"),
}

__all__ = [
    "ByteArraySchema",
    "ConfigOption",
    "Configuration",
    "DeserializationSchema",
    "Duration",
    "Encoder",
    "ExecutionConfig",
    "Instant",
    "JobClient",
    "JobExecutionResult",
    "JobStatus",
    "Row",
    "RowKind",
    "SerializationSchema",
    "SimpleStringSchema",
    "Time",
    "TimestampAssigner",
    "TypeInformation",
    "Types",
    "WatermarkStrategy",
]


def __getattr__(name: str) -> Any:
    return load_export(__name__, _EXPORTS, name)


if TYPE_CHECKING:
    from chandy.api.execution_config import ExecutionConfig
    from chandy.config import ConfigOption, Configuration
    from chandy.connectors import (
        ByteArraySchema,
        DeserializationSchema,
        Encoder,
        SerializationSchema,
        SimpleStringSchema,
    )
    from chandy.core.time import Duration, Time
    from chandy.core.types import Instant, Row, RowKind, TypeInformation, Types
    from chandy.core.watermark_strategy import TimestampAssigner, WatermarkStrategy
    from chandy.messages.status import JobStatus
    from chandy.runtime.job_client import JobClient
    from chandy.runtime.job_result import JobExecutionResult
