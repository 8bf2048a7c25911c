"""PyFlink's ``pyflink.datastream.data_stream``: the stream classes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chandy.common._lazy import exports_of, load_export

_EXPORTS = {
    **exports_of("chandy.api.datastream", "DataStream", "KeyedStream", "DataStreamSink"),
    **exports_of("chandy.api.batch_stream", "BatchStream", "KeyedBatchStream"),
    **exports_of("chandy.api.windowed_stream", "WindowedStream", "AllWindowedStream"),
    **exports_of("chandy.api.connected_streams", "ConnectedStreams"),
    **exports_of("chandy.api.broadcast_stream", "BroadcastStream", "BroadcastConnectedStream"),
}

__all__ = [
    "AllWindowedStream",
    "BatchStream",
    "BroadcastConnectedStream",
    "BroadcastStream",
    "ConnectedStreams",
    "DataStream",
    "DataStreamSink",
    "KeyedBatchStream",
    "KeyedStream",
    "WindowedStream",
]


def __getattr__(name: str) -> Any:
    return load_export(__name__, _EXPORTS, name)


if TYPE_CHECKING:
    from chandy.api.batch_stream import BatchStream, KeyedBatchStream
    from chandy.api.broadcast_stream import BroadcastConnectedStream, BroadcastStream
    from chandy.api.connected_streams import ConnectedStreams
    from chandy.api.datastream import DataStream, DataStreamSink, KeyedStream
    from chandy.api.windowed_stream import AllWindowedStream, WindowedStream
