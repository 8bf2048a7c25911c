"""PyFlink's ``pyflink.datastream.async_data_stream``: ``AsyncDataStream``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chandy.common._lazy import exports_of, load_export

_EXPORTS = exports_of("chandy.api.async_data_stream", "AsyncDataStream")

__all__ = ["AsyncDataStream"]


def __getattr__(name: str) -> Any:
    return load_export(__name__, _EXPORTS, name)


if TYPE_CHECKING:
    from chandy.api.async_data_stream import AsyncDataStream
