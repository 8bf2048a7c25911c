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
}

__all__ = [
    "CheckpointConfig",
    "CheckpointingMode",
    "Configuration",
    "ConfigurationError",
    "DataStream",
    "ExternalizedCheckpointCleanup",
    "ExternalizedCheckpointRetention",
    "InvalidCheckpointError",
    "InvalidProgramError",
    "JobClient",
    "JobExecutionError",
    "JobExecutionResult",
    "KeyedStream",
    "StorageError",
    "StreamExecutionEnvironment",
]

if TYPE_CHECKING:
    from chandy.api.checkpoint_config import CheckpointConfig
    from chandy.api.datastream import DataStream, KeyedStream
    from chandy.api.environment import StreamExecutionEnvironment
    from chandy.config import Configuration
    from chandy.config.options import (
        CheckpointingMode,
        ExternalizedCheckpointCleanup,
        ExternalizedCheckpointRetention,
    )
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
