"""CheckpointStatsTracker: what the checkpoint dashboard and REST API show.

Counts, a bounded history (``web.checkpoints.history``), per-subtask details
and min/avg/max/percentile summaries over completed checkpoints. ``to_json``
gives Flink's ``CheckpointingStatistics`` shape, field for field, so tools that
read Flink's REST API read chandy's.

Unaligned checkpoints: a subtask reports whether its checkpoint went unaligned
(from the start, or after its alignment timed out) and the bytes of in-flight
data it persisted (``alignment.persisted``); a checkpoint is unaligned when any
subtask says so, and then its ``checkpoint_type`` is Flink's
``UNALIGNED_CHECKPOINT`` (chandy adds ``is_unaligned`` beside it).
``persisted_data`` sums the subtasks' persisted bytes, per checkpoint, per vertex
and in the summary. ``alignment_buffered`` (Flink's pre-1.11 buffering) is 0.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from chandy.checkpoint.properties import CheckpointProperties
from chandy.messages.checkpoint import CheckpointMetrics, CheckpointType

log = logging.getLogger(__name__)

_SUMMARY_WINDOW = 10_000


@dataclass
class SubtaskStateStats:
    subtask_index: int
    ack_timestamp: int
    metrics: CheckpointMetrics


@dataclass
class CheckpointStats:
    checkpoint_id: int
    trigger_timestamp: int
    props: CheckpointProperties
    #: vertex id -> (name, parallelism)
    vertices: dict[int, tuple[str, int]]
    status: str = "IN_PROGRESS"
    subtasks: dict[int, dict[int, SubtaskStateStats]] = field(default_factory=dict)
    latest_ack_timestamp: int = -1
    completion_timestamp: int = -1
    external_path: str | None = None
    discarded: bool = False
    failure_timestamp: int = -1
    failure_message: str | None = None

    @property
    def num_subtasks(self) -> int:
        return sum(p for _, p in self.vertices.values())

    @property
    def num_acknowledged_subtasks(self) -> int:
        return sum(len(s) for s in self.subtasks.values())

    def _sum(self, attribute: str) -> int:
        return sum(
            getattr(s.metrics, attribute) for by_index in self.subtasks.values() for s in by_index.values()
        )

    @property
    def state_size(self) -> int:
        return self._sum("state_size")

    @property
    def checkpointed_size(self) -> int:
        return self._sum("checkpointed_size")

    @property
    def processed_data(self) -> int:
        return self._sum("bytes_processed_during_alignment")

    @property
    def persisted_data(self) -> int:
        """In-flight bytes written with the checkpoint (channel state), over every subtask."""
        return self._sum("bytes_persisted_during_alignment")

    @property
    def is_unaligned(self) -> bool:
        """Some subtask took this checkpoint unaligned (from the start or after a timeout)."""
        return any(s.metrics.unaligned for by_index in self.subtasks.values() for s in by_index.values())

    @property
    def rest_checkpoint_type(self) -> str:
        """Flink's ``RestAPICheckpointType``: CHECKPOINT, UNALIGNED_CHECKPOINT, SAVEPOINT or
        SYNC_SAVEPOINT."""
        kind = self.props.checkpoint_type
        return (
            "UNALIGNED_CHECKPOINT" if kind is CheckpointType.CHECKPOINT and self.is_unaligned else kind.value
        )

    @property
    def end_to_end_duration(self) -> int:
        end = (
            self.completion_timestamp
            if self.completion_timestamp >= 0
            else (self.failure_timestamp if self.failure_timestamp >= 0 else self.latest_ack_timestamp)
        )
        return max(0, end - self.trigger_timestamp) if end >= 0 else 0

    def to_json(self, *, with_tasks: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "className": {"IN_PROGRESS": "in_progress", "COMPLETED": "completed", "FAILED": "failed"}[
                self.status
            ],
            "id": self.checkpoint_id,
            "status": self.status,
            "is_savepoint": self.props.is_savepoint,
            "savepointFormat": self.props.savepoint_format.value if self.props.savepoint_format else None,
            "checkpoint_type": self.rest_checkpoint_type,
            "is_unaligned": self.is_unaligned,
            "trigger_timestamp": self.trigger_timestamp,
            "latest_ack_timestamp": self.latest_ack_timestamp,
            "checkpointed_size": self.checkpointed_size,
            "state_size": self.state_size,
            "end_to_end_duration": self.end_to_end_duration,
            "alignment_buffered": 0,
            "processed_data": self.processed_data,
            "persisted_data": self.persisted_data,
            "num_subtasks": self.num_subtasks,
            "num_acknowledged_subtasks": self.num_acknowledged_subtasks,
        }
        if self.status == "COMPLETED":
            data["external_path"] = self.external_path
            data["discarded"] = self.discarded
        if self.status == "FAILED":
            data["failure_timestamp"] = self.failure_timestamp
            data["failure_message"] = self.failure_message
        if with_tasks:
            data["tasks"] = {str(vid): self.task_json(vid) for vid in self.vertices}
        return data

    def task_json(self, vertex_id: int) -> dict[str, Any]:
        """Flink's ``TaskCheckpointStatisticsWithSubtaskDetails`` for one vertex."""
        name, parallelism = self.vertices[vertex_id]
        acked = self.subtasks.get(vertex_id, {})
        subtasks = []
        for index in range(parallelism):
            stats = acked.get(index)
            if stats is None:
                subtasks.append({"index": index, "status": "pending_or_failed"})
                continue
            m = stats.metrics
            subtasks.append(
                {
                    "index": index,
                    "status": "completed",
                    "ack_timestamp": stats.ack_timestamp,
                    "end_to_end_duration": max(0, stats.ack_timestamp - self.trigger_timestamp),
                    "checkpointed_size": m.checkpointed_size,
                    "state_size": m.state_size,
                    "checkpoint": {"sync": m.sync_duration_ms, "async": m.async_duration_ms},
                    "alignment": {
                        "buffered": 0,
                        "processed": m.bytes_processed_during_alignment,
                        "persisted": m.bytes_persisted_during_alignment,
                        "duration": m.alignment_duration_ns // 1_000_000,
                    },
                    "start_delay": m.checkpoint_start_delay_ns // 1_000_000,
                    "unaligned_checkpoint": m.unaligned,
                    "aborted": False,
                }
            )
        latest = max((s.ack_timestamp for s in acked.values()), default=-1)
        return {
            "id": self.checkpoint_id,
            "name": name,
            "status": self.status,
            "latest_ack_timestamp": latest,
            "checkpointed_size": sum(s.metrics.checkpointed_size for s in acked.values()),
            "state_size": sum(s.metrics.state_size for s in acked.values()),
            "end_to_end_duration": max(0, latest - self.trigger_timestamp) if latest >= 0 else 0,
            "alignment_buffered": 0,
            "processed_data": sum(s.metrics.bytes_processed_during_alignment for s in acked.values()),
            "persisted_data": sum(s.metrics.bytes_persisted_during_alignment for s in acked.values()),
            "num_subtasks": parallelism,
            "num_acknowledged_subtasks": len(acked),
            "subtasks": subtasks,
        }


def summary(values: list[float]) -> dict[str, float]:
    """min/max/avg and Flink's percentiles (nearest rank) of ``values``."""
    if not values:
        return {k: 0 for k in ("min", "max", "avg", "p50", "p90", "p95", "p99", "p999")}
    ordered = sorted(values)

    def percentile(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return {
        "min": ordered[0],
        "max": ordered[-1],
        "avg": sum(ordered) / len(ordered),
        "p50": percentile(0.5),
        "p90": percentile(0.9),
        "p95": percentile(0.95),
        "p99": percentile(0.99),
        "p999": percentile(0.999),
    }


class CheckpointStatsTracker:
    """Statistics of every checkpoint of a job (in memory; reset when the JobMaster goes)."""

    def __init__(self, history_size: int = 10) -> None:
        self.history_size = history_size
        self._in_progress: dict[int, CheckpointStats] = {}
        self._history: deque[CheckpointStats] = deque(maxlen=history_size)
        self.counts = {"restored": 0, "total": 0, "in_progress": 0, "completed": 0, "failed": 0}
        self.latest_completed: CheckpointStats | None = None
        self.latest_savepoint: CheckpointStats | None = None
        self.latest_failed: CheckpointStats | None = None
        self.latest_restored: dict[str, Any] | None = None
        self._window: dict[str, deque[float]] = {
            k: deque(maxlen=_SUMMARY_WINDOW)
            for k in (
                "end_to_end_duration",
                "state_size",
                "checkpointed_size",
                "processed_data",
                "persisted_data",
            )
        }

    def report_pending_checkpoint(
        self,
        checkpoint_id: int,
        trigger_timestamp: int,
        props: CheckpointProperties,
        vertices: dict[int, tuple[str, int]],
    ) -> CheckpointStats:
        stats = CheckpointStats(checkpoint_id, trigger_timestamp, props, vertices)
        self._in_progress[checkpoint_id] = stats
        self._history.appendleft(stats)
        self.counts["total"] += 1
        self.counts["in_progress"] += 1
        return stats

    def report_subtask(
        self,
        checkpoint_id: int,
        vertex_id: int,
        subtask_index: int,
        ack_timestamp: int,
        metrics: CheckpointMetrics,
    ) -> None:
        stats = self._in_progress.get(checkpoint_id)
        if stats is None:
            return
        stats.subtasks.setdefault(vertex_id, {})[subtask_index] = SubtaskStateStats(
            subtask_index, ack_timestamp, metrics
        )
        stats.latest_ack_timestamp = max(stats.latest_ack_timestamp, ack_timestamp)

    def report_completed(
        self, checkpoint_id: int, completion_timestamp: int, external_path: str | None
    ) -> CheckpointStats | None:
        stats = self._in_progress.pop(checkpoint_id, None)
        if stats is None:
            return None
        stats.status = "COMPLETED"
        stats.completion_timestamp = completion_timestamp
        stats.latest_ack_timestamp = max(stats.latest_ack_timestamp, completion_timestamp)
        stats.external_path = external_path
        self.counts["in_progress"] -= 1
        self.counts["completed"] += 1
        if stats.props.is_savepoint:
            self.latest_savepoint = stats
        else:
            self.latest_completed = stats
        for key in self._window:
            self._window[key].append(getattr(stats, key))
        return stats

    def report_failed(self, checkpoint_id: int, failure_timestamp: int, message: str) -> None:
        stats = self._in_progress.pop(checkpoint_id, None)
        if stats is None:
            return
        stats.status = "FAILED"
        stats.failure_timestamp = failure_timestamp
        stats.failure_message = message
        self.counts["in_progress"] -= 1
        self.counts["failed"] += 1
        self.latest_failed = stats

    def report_restored(
        self, checkpoint_id: int, restore_timestamp: int, is_savepoint: bool, external_path: str | None
    ) -> None:
        self.counts["restored"] += 1
        self.latest_restored = {
            "id": checkpoint_id,
            "restore_timestamp": restore_timestamp,
            "is_savepoint": is_savepoint,
            "external_path": external_path,
        }

    def end_to_end_durations(self) -> list[float]:
        """Durations (ms) of the completed checkpoints in the summary window."""
        return list(self._window["end_to_end_duration"])

    def get_checkpoint(self, checkpoint_id: int) -> CheckpointStats | None:
        for stats in self._history:
            if stats.checkpoint_id == checkpoint_id:
                return stats
        return None

    def to_json(self) -> dict[str, Any]:
        """Flink's ``GET /jobs/:jobid/checkpoints`` body."""
        return {
            "counts": dict(self.counts),
            "summary": {
                "checkpointed_size": summary(list(self._window["checkpointed_size"])),
                "state_size": summary(list(self._window["state_size"])),
                "end_to_end_duration": summary(list(self._window["end_to_end_duration"])),
                "alignment_buffered": summary([]),
                "processed_data": summary(list(self._window["processed_data"])),
                "persisted_data": summary(list(self._window["persisted_data"])),
            },
            "latest": {
                "completed": self.latest_completed.to_json(with_tasks=False)
                if self.latest_completed
                else None,
                "savepoint": self.latest_savepoint.to_json(with_tasks=False)
                if self.latest_savepoint
                else None,
                "failed": self.latest_failed.to_json(with_tasks=False) if self.latest_failed else None,
                "restored": self.latest_restored,
            },
            "history": [s.to_json(with_tasks=False) for s in self._history],
        }
