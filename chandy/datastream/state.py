"""PyFlink's ``pyflink.datastream.state``: state descriptors and state handles.

The aggregating state's classes are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chandy.common._lazy import exports_of, load_export
from chandy.core.functions import OperatorStateStore
from chandy.core.state import (
    BroadcastState,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReadOnlyBroadcastState,
    ReducingState,
    ReducingStateDescriptor,
    State,
    StateDescriptor,
    StateTtlConfig,
    ValueState,
    ValueStateDescriptor,
)

_EXPORTS = exports_of("chandy.core.state", "AggregatingState", "AggregatingStateDescriptor")

__all__ = [
    "AggregatingState",
    "AggregatingStateDescriptor",
    "BroadcastState",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "OperatorStateStore",
    "ReadOnlyBroadcastState",
    "ReducingState",
    "ReducingStateDescriptor",
    "State",
    "StateDescriptor",
    "StateTtlConfig",
    "ValueState",
    "ValueStateDescriptor",
]


def __getattr__(name: str) -> Any:
    return load_export(__name__, _EXPORTS, name)


if TYPE_CHECKING:
    from chandy.core.state import AggregatingState, AggregatingStateDescriptor
