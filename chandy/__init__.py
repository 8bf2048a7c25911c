"""chandy: stateful stream processing for Python with Flink's checkpointing, on Spark.

The names users need are importable from here; they load on first use so that
importing any part of chandy never drags in the whole of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "StreamExecutionEnvironment": "chandy.api.environment",
    "DataStream": "chandy.api.datastream",
    "KeyedStream": "chandy.api.datastream",
    # The batch path (Arrow record batches; docs/batches.md)
    "BatchStream": "chandy.api.batch_stream",
    "KeyedBatchStream": "chandy.api.batch_stream",
    "MapBatchesFunction": "chandy.core.functions",
    "KeyedBatchFunction": "chandy.core.functions",
    "BatchAggregateFunction": "chandy.core.functions",
    "KeyedBatchState": "chandy.core.functions",
    "Configuration": "chandy.config",
    "JobExecutionResult": "chandy.runtime.job_result",
    "JobExecutionError": "chandy.errors",
    "ConfigurationError": "chandy.errors",
    "InvalidProgramError": "chandy.errors",
    "InvalidCheckpointError": "chandy.errors",
    "StorageError": "chandy.errors",
    "CheckpointingMode": "chandy.config.options",
    "ExternalizedCheckpointRetention": "chandy.config.options",
    "ExternalizedCheckpointCleanup": "chandy.config.options",
    "CheckpointConfig": "chandy.api.checkpoint_config",
    "JobClient": "chandy.runtime.job_client",
    # Event time and PyFlink's types
    "WatermarkStrategy": "chandy.core.watermark_strategy",
    "TimestampAssigner": "chandy.core.watermark_strategy",
    "Duration": "chandy.core.time",
    "Time": "chandy.core.time",
    "TimeDomain": "chandy.core.time",
    "OutputTag": "chandy.core.output_tag",
    "Types": "chandy.core.types",
    "TypeInformation": "chandy.core.types",
    "Row": "chandy.core.types",
    "RowKind": "chandy.core.types",
}

__all__ = [
    "BatchAggregateFunction",
    "BatchStream",
    "CheckpointConfig",
    "CheckpointingMode",
    "Configuration",
    "ConfigurationError",
    "DataStream",
    "Duration",
    "ExternalizedCheckpointCleanup",
    "ExternalizedCheckpointRetention",
    "InvalidCheckpointError",
    "InvalidProgramError",
    "JobClient",
    "JobExecutionError",
    "JobExecutionResult",
    "KeyedBatchFunction",
    "KeyedBatchState",
    "KeyedBatchStream",
    "KeyedStream",
    "MapBatchesFunction",
    "OutputTag",
    "Row",
    "RowKind",
    "StorageError",
    "StreamExecutionEnvironment",
    "Time",
    "TimeDomain",
    "TimestampAssigner",
    "TypeInformation",
    "Types",
    "WatermarkStrategy",
]

if TYPE_CHECKING:
    from chandy.api.batch_stream import BatchStream, KeyedBatchStream
    from chandy.api.checkpoint_config import CheckpointConfig
    from chandy.api.datastream import DataStream, KeyedStream
    from chandy.api.environment import StreamExecutionEnvironment
    from chandy.config import Configuration
    from chandy.config.options import (
        CheckpointingMode,
        ExternalizedCheckpointCleanup,
        ExternalizedCheckpointRetention,
    )
    from chandy.core.functions import (
        BatchAggregateFunction,
        KeyedBatchFunction,
        KeyedBatchState,
        MapBatchesFunction,
    )
    from chandy.core.output_tag import OutputTag
    from chandy.core.time import Duration, Time, TimeDomain
    from chandy.core.types import Row, RowKind, TypeInformation, Types
    from chandy.core.watermark_strategy import TimestampAssigner, WatermarkStrategy
    from chandy.errors import (
        ConfigurationError,
        InvalidCheckpointError,
        InvalidProgramError,
        JobExecutionError,
        StorageError,
    )
    from chandy.runtime.job_client import JobClient
    from chandy.runtime.job_result import JobExecutionResult


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chandy' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
