"""PyFlink's ``pyflink.datastream``, for chandy: replace ``pyflink`` by ``chandy`` in a job's imports.

``from chandy.datastream import StreamExecutionEnvironment, KeyedProcessFunction``
gives chandy's own classes under PyFlink's names; the submodules mirror PyFlink's
(``functions``, ``window``, ``state``, ``state_backend``, ``output_tag``, ``time_domain``,
``timerservice``, ``data_stream``, ``stream_execution_environment``,
``connectors``). Names load on first use, so importing a function class does
not import the job runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chandy.common._lazy import exports_of, load_export

_EXPORTS = {
    **exports_of("chandy.api.environment", "StreamExecutionEnvironment"),
    **exports_of("chandy.api.datastream", "DataStream", "KeyedStream", "DataStreamSink"),
    **exports_of("chandy.api.batch_stream", "BatchStream", "KeyedBatchStream", "WindowedBatchStream"),
    **exports_of("chandy.api.windowed_stream", "WindowedStream", "AllWindowedStream"),
    **exports_of("chandy.api.connected_streams", "ConnectedStreams"),
    **exports_of("chandy.api.broadcast_stream", "BroadcastStream", "BroadcastConnectedStream"),
    **exports_of("chandy.api.checkpoint_config", "CheckpointConfig"),
    **exports_of(
        "chandy.api.state_backend",
        "StateBackend",
        "HashMapStateBackend",
        "EmbeddedRocksDBStateBackend",
        "RocksDBStateBackend",
    ),
    **exports_of("chandy.api.async_data_stream", "AsyncDataStream"),
    **exports_of("chandy.core.async_retry", "AsyncRetryStrategy", "AsyncRetryPredicate"),
    **exports_of("chandy.config.options", "CheckpointingMode", "ExternalizedCheckpointRetention"),
    **exports_of(
        "chandy.core.functions",
        "MapFunction",
        "FlatMapFunction",
        "FilterFunction",
        "ReduceFunction",
        "KeySelector",
        "Partitioner",
        "ProcessFunction",
        "KeyedProcessFunction",
        "CoMapFunction",
        "CoFlatMapFunction",
        "CoProcessFunction",
        "KeyedCoProcessFunction",
        "BroadcastProcessFunction",
        "MapBatchesFunction",
        "BatchAggregateFunction",
        "KeyedBatchFunction",
        "KeyedBatchState",
        "KeyedBroadcastProcessFunction",
        "SinkFunction",
        "AggregateFunction",
        "AsyncFunction",
        "WindowFunction",
        "AllWindowFunction",
        "ProcessWindowFunction",
        "ProcessAllWindowFunction",
        "RuntimeContext",
        "TimerService",
    ),
    **exports_of("chandy.core.time", "TimeDomain"),
    **exports_of("chandy.core.output_tag", "OutputTag"),
    **exports_of(
        "chandy.core.windows",
        "Window",
        "TimeWindow",
        "CountWindow",
        "GlobalWindow",
        "WindowAssigner",
        "MergingWindowAssigner",
        "TriggerResult",
        "Trigger",
    ),
}

__all__ = [
    "AggregateFunction",
    "AllWindowFunction",
    "AllWindowedStream",
    "AsyncDataStream",
    "AsyncFunction",
    "AsyncRetryPredicate",
    "AsyncRetryStrategy",
    "BatchAggregateFunction",
    "BatchStream",
    "BroadcastConnectedStream",
    "BroadcastProcessFunction",
    "BroadcastStream",
    "CheckpointConfig",
    "CheckpointingMode",
    "CoFlatMapFunction",
    "CoMapFunction",
    "CoProcessFunction",
    "ConnectedStreams",
    "CountWindow",
    "DataStream",
    "DataStreamSink",
    "EmbeddedRocksDBStateBackend",
    "ExternalizedCheckpointRetention",
    "FilterFunction",
    "FlatMapFunction",
    "GlobalWindow",
    "HashMapStateBackend",
    "KeySelector",
    "KeyedBatchFunction",
    "KeyedBatchState",
    "KeyedBatchStream",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "KeyedStream",
    "MapBatchesFunction",
    "MapFunction",
    "MergingWindowAssigner",
    "OutputTag",
    "Partitioner",
    "ProcessAllWindowFunction",
    "ProcessFunction",
    "ProcessWindowFunction",
    "ReduceFunction",
    "RocksDBStateBackend",
    "RuntimeContext",
    "SinkFunction",
    "StateBackend",
    "StreamExecutionEnvironment",
    "TimeDomain",
    "TimeWindow",
    "TimerService",
    "Trigger",
    "TriggerResult",
    "Window",
    "WindowAssigner",
    "WindowFunction",
    "WindowedBatchStream",
    "WindowedStream",
]


def __getattr__(name: str) -> Any:
    return load_export(__name__, _EXPORTS, name)


if TYPE_CHECKING:
    from chandy.api.async_data_stream import AsyncDataStream
    from chandy.api.batch_stream import BatchStream, KeyedBatchStream, WindowedBatchStream
    from chandy.api.broadcast_stream import BroadcastConnectedStream, BroadcastStream
    from chandy.api.checkpoint_config import CheckpointConfig
    from chandy.api.connected_streams import ConnectedStreams
    from chandy.api.datastream import DataStream, DataStreamSink, KeyedStream
    from chandy.api.environment import StreamExecutionEnvironment
    from chandy.api.state_backend import (
        EmbeddedRocksDBStateBackend,
        HashMapStateBackend,
        RocksDBStateBackend,
        StateBackend,
    )
    from chandy.api.windowed_stream import AllWindowedStream, WindowedStream
    from chandy.config.options import CheckpointingMode, ExternalizedCheckpointRetention
    from chandy.core.async_retry import AsyncRetryPredicate, AsyncRetryStrategy
    from chandy.core.functions import (
        AggregateFunction,
        AllWindowFunction,
        AsyncFunction,
        BatchAggregateFunction,
        BroadcastProcessFunction,
        CoFlatMapFunction,
        CoMapFunction,
        CoProcessFunction,
        FilterFunction,
        FlatMapFunction,
        KeyedBatchFunction,
        KeyedBatchState,
        KeyedBroadcastProcessFunction,
        KeyedCoProcessFunction,
        KeyedProcessFunction,
        KeySelector,
        MapBatchesFunction,
        MapFunction,
        Partitioner,
        ProcessAllWindowFunction,
        ProcessFunction,
        ProcessWindowFunction,
        ReduceFunction,
        RuntimeContext,
        SinkFunction,
        TimerService,
        WindowFunction,
    )
    from chandy.core.output_tag import OutputTag
    from chandy.core.time import TimeDomain
    from chandy.core.windows import (
        CountWindow,
        GlobalWindow,
        MergingWindowAssigner,
        TimeWindow,
        Trigger,
        TriggerResult,
        Window,
        WindowAssigner,
    )
