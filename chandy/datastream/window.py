"""PyFlink's ``pyflink.datastream.window``: windows, window assigners and triggers.

They live in :mod:`chandy.core.windows`, imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chandy.common._lazy import exports_of, load_export

_EXPORTS = exports_of(
    "chandy.core.windows",
    "Window",
    "TimeWindow",
    "CountWindow",
    "GlobalWindow",
    "WindowAssigner",
    "MergingWindowAssigner",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "EventTimeSessionWindows",
    "ProcessingTimeSessionWindows",
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "SessionWindowTimeGapExtractor",
    "GlobalWindows",
    "CountTumblingWindowAssigner",
    "CountSlidingWindowAssigner",
    "TriggerResult",
    "Trigger",
    "EventTimeTrigger",
    "ProcessingTimeTrigger",
    "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger",
    "CountTrigger",
    "PurgingTrigger",
    "NeverTrigger",
)

__all__ = [
    "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger",
    "CountSlidingWindowAssigner",
    "CountTrigger",
    "CountTumblingWindowAssigner",
    "CountWindow",
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EventTimeSessionWindows",
    "EventTimeTrigger",
    "GlobalWindow",
    "GlobalWindows",
    "MergingWindowAssigner",
    "NeverTrigger",
    "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "SessionWindowTimeGapExtractor",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TimeWindow",
    "Trigger",
    "TriggerResult",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "Window",
    "WindowAssigner",
]


def __getattr__(name: str) -> Any:
    return load_export(__name__, _EXPORTS, name)


if TYPE_CHECKING:
    from chandy.core.windows import (
        ContinuousEventTimeTrigger,
        ContinuousProcessingTimeTrigger,
        CountSlidingWindowAssigner,
        CountTrigger,
        CountTumblingWindowAssigner,
        CountWindow,
        DynamicEventTimeSessionWindows,
        DynamicProcessingTimeSessionWindows,
        EventTimeSessionWindows,
        EventTimeTrigger,
        GlobalWindow,
        GlobalWindows,
        MergingWindowAssigner,
        NeverTrigger,
        ProcessingTimeSessionWindows,
        ProcessingTimeTrigger,
        PurgingTrigger,
        SessionWindowTimeGapExtractor,
        SlidingEventTimeWindows,
        SlidingProcessingTimeWindows,
        TimeWindow,
        Trigger,
        TriggerResult,
        TumblingEventTimeWindows,
        TumblingProcessingTimeWindows,
        Window,
        WindowAssigner,
    )
