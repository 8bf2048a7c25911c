"""JobMetricsStore: the metrics of one job, as the JobMaster knows them (``JobMaster.metrics``).

Tasks report cumulative counters (:mod:`chandy.messages.metrics`) every
``chandy.metrics.report-interval`` and once more when they end; this store keeps
the latest report of each subtask and derives Flink's per-second rates from two
consecutive reports of the same attempt. Everything it returns is a plain dict
keyed by Flink's metric names, so the REST API, Prometheus and the dashboard
show what Flink's would.

Read API
--------
``subtask_metrics() -> list[dict]``
    One entry per subtask that reported, in vertex then subtask order::

        {"vertex_id": int, "vertex_name": str, "subtask_index": int,
         "attempt_number": int, "finished": bool,
         "metrics": {<task metrics>},
         "operators": [{"operator_id": str, "operator_name": str,
                        "metrics": {<operator metrics>},
                        "user_metrics": [UserMetric, ...]}, ...]}   # head first

    Task metrics: ``numRecordsIn``, ``numRecordsOut`` (counts since the attempt
    started), ``numRecordsInPerSecond``, ``numRecordsOutPerSecond``,
    ``busyTimeMsPerSecond``, ``idleTimeMsPerSecond``,
    ``backPressuredTimeMsPerSecond`` (each 0..1000; they add up to 1000),
    ``accumulateBusyTimeMs``, ``accumulateIdleTimeMs``,
    ``accumulateBackPressuredTimeMs``, ``currentInputWatermark``,
    ``currentOutputWatermark`` (``MIN_TIMESTAMP`` until one passed). A task's
    ``numRecordsIn`` is what its head operator received (0 for a source), its
    ``numRecordsOut`` what it sent to other tasks (0 for a sink).
    Operator metrics: ``numRecordsIn``, ``numRecordsOut`` (side outputs
    included), ``numRecordsInPerSecond``, ``numRecordsOutPerSecond``,
    ``currentInputWatermark``, ``currentOutputWatermark``, and the metrics the
    operator's user functions registered, by Flink's ids below the operator
    (``<groups...>.<name>``, see :func:`user_metric_values`); ``user_metrics`` holds
    the same as reported (kind, groups, labels), for Prometheus.

``vertex_metrics(vertex_id) -> dict``
    The task metrics aggregated over the vertex's subtasks as Flink's web UI
    shows them: counts and rates summed; ``busyTimeMsPerSecond``,
    ``idleTimeMsPerSecond`` and ``backPressuredTimeMsPerSecond`` the maximum (the
    busiest, most backpressured subtask is what matters); watermarks the minimum
    (the vertex's watermark is its slowest subtask's). Empty before any report.

``vertex_metric_aggregates(vertex_id) -> dict[str, dict[str, float]]``
    Each task metric's ``min``, ``max``, ``avg`` and ``sum`` over the subtasks
    (Flink's ``/jobs/:jobid/vertices/:vertexid/subtasks/metrics?agg=`` shape).

``job_metrics() -> dict``
    ``uptime`` (ms RUNNING since the latest (re)start; 0 when not running, -1
    once ended, as Flink's gauge), ``numRestarts``, and the checkpoint gauges of
    the coordinator's statistics: ``lastCheckpointDuration``,
    ``lastCheckpointSize`` (bytes written by the last checkpoint),
    ``lastCheckpointFullSize``, ``lastCompletedCheckpointId``,
    ``numberOfCompletedCheckpoints``, ``numberOfFailedCheckpoints``,
    ``numberOfInProgressCheckpoints``, ``totalNumberOfCheckpoints``,
    ``lastCheckpointRestoreTimestamp``, ``lastCheckpointExternalPath`` (Flink's
    ``-1`` / ``"n/a"`` where there is none; a job without checkpointing reports
    zeros).

Threads: :meth:`report` is called from any thread (task threads, a Spark slot's
connection reader) and never blocks on more than this store's lock. The
subtask and vertex reads take the same lock and are safe anywhere;
:meth:`job_metrics` reads the execution graph and the checkpoint statistics,
which only the JobMaster thread changes, so call it on that thread
(``job_master.call(job_master.metrics.job_metrics)``) while the job runs.

Failover: a report of an attempt older than the one the store holds for that
subtask is dropped (a cancelled task's last words after its successor started);
a new attempt starts its rates afresh from its own start. Rates are clamped at
zero, so they never go negative.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chandy.checkpoint.stats import CheckpointStatsTracker
from chandy.core.time import MIN_TIMESTAMP
from chandy.graph.execution_graph import ExecutionGraph
from chandy.messages.metrics import MetricsReport, OperatorMetrics, SubtaskMetrics, UserMetric
from chandy.messages.status import JobStatus
from chandy.util.clock import Clock

#: Reports closer together than this keep the previous rates (a task's final report
#: right after a periodic one would divide by almost nothing).
MIN_RATE_WINDOW_NS = 100_000_000

_RATES = (
    "numRecordsInPerSecond",
    "numRecordsOutPerSecond",
    "busyTimeMsPerSecond",
    "idleTimeMsPerSecond",
    "backPressuredTimeMsPerSecond",
)
_SUMMED = ("numRecordsIn", "numRecordsOut", "numRecordsInPerSecond", "numRecordsOutPerSecond")
_MAXED = (
    "busyTimeMsPerSecond",
    "idleTimeMsPerSecond",
    "backPressuredTimeMsPerSecond",
    "accumulateBusyTimeMs",
    "accumulateIdleTimeMs",
    "accumulateBackPressuredTimeMs",
)
_MINNED = ("currentInputWatermark", "currentOutputWatermark")


def _zero_rates() -> dict[str, float]:
    return dict.fromkeys(_RATES, 0.0)


@dataclass
class _Subtask:
    """What the store keeps of one subtask: its latest report and the rates derived."""

    latest: SubtaskMetrics
    #: The report the current rates were computed from (the start of the window).
    base: SubtaskMetrics | None
    rates: dict[str, float] = field(default_factory=_zero_rates)
    operator_rates: dict[str, tuple[float, float]] = field(default_factory=dict)


def _per_second(delta: float, window_ns: int) -> float:
    return max(0.0, delta) * 1e9 / window_ns


class JobMetricsStore:
    """The latest metrics of every subtask of one job, with rates and aggregates."""

    def __init__(
        self,
        execution_graph: ExecutionGraph,
        clock: Clock,
        checkpoint_stats: Callable[[], CheckpointStatsTracker | None],
        restarts: Callable[[], int],
    ) -> None:
        self.execution_graph = execution_graph
        self.job_graph = execution_graph.job_graph
        self.clock = clock
        self._checkpoint_stats = checkpoint_stats
        self._restarts = restarts
        self._lock = threading.Lock()
        self._subtasks: dict[tuple[int, int], _Subtask] = {}
        self._names = {v.id: v.name for v in self.job_graph.vertices}

    # -- writing (any thread) ------------------------------------------------------

    def report(self, report: MetricsReport) -> None:
        """Take a report; snapshots of another job or of superseded attempts are dropped."""
        if report.job_id != self.job_graph.job_id:
            return
        with self._lock:
            for snapshot in report.subtasks:
                self._take(snapshot)

    def _take(self, snapshot: SubtaskMetrics) -> None:
        attempt = snapshot.attempt_id
        key = (attempt.vertex_id, attempt.subtask_index)
        if attempt.vertex_id not in self._names:
            return
        entry = self._subtasks.get(key)
        if entry is not None:
            held = entry.latest.attempt_id.attempt_number
            if attempt.attempt_number < held:
                return  # a superseded attempt's report
            if attempt.attempt_number == held and snapshot.timestamp_ns <= entry.latest.timestamp_ns:
                return  # older than what is held (reordered), or a duplicate
            if attempt.attempt_number > held:
                entry = None  # a new attempt: its counters started again from zero
        if entry is None:
            entry = self._subtasks[key] = _Subtask(snapshot, None)
            self._rates(entry, _start_of(snapshot), snapshot)
        else:
            entry.latest = snapshot
            base = entry.base
            if base is not None and snapshot.timestamp_ns - base.timestamp_ns >= MIN_RATE_WINDOW_NS:
                self._rates(entry, base, snapshot)
        if snapshot.final:  # the task ended: it processes nothing any more
            entry.rates = _zero_rates()
            entry.operator_rates = {}

    @staticmethod
    def _rates(entry: _Subtask, base: SubtaskMetrics, now: SubtaskMetrics) -> None:
        """Rates over the window ``base`` -> ``now`` (two reports of one attempt)."""
        window = now.timestamp_ns - base.timestamp_ns
        entry.base = now
        if window <= 0:
            return
        entry.rates = {
            "numRecordsInPerSecond": _per_second(now.records_in - base.records_in, window),
            "numRecordsOutPerSecond": _per_second(now.records_out - base.records_out, window),
            "busyTimeMsPerSecond": min(1000.0, _per_second(now.busy_ns - base.busy_ns, window) / 1e6),
            "idleTimeMsPerSecond": min(1000.0, _per_second(now.idle_ns - base.idle_ns, window) / 1e6),
            "backPressuredTimeMsPerSecond": min(
                1000.0, _per_second(now.backpressured_ns - base.backpressured_ns, window) / 1e6
            ),
        }
        before = {o.operator_id: o for o in base.operators}
        operator_rates = {}
        for operator in now.operators:
            old = before.get(operator.operator_id)
            records_in = old.records_in if old is not None else 0
            records_out = old.records_out if old is not None else 0
            operator_rates[operator.operator_id] = (
                _per_second(operator.records_in - records_in, window),
                _per_second(operator.records_out - records_out, window),
            )
        entry.operator_rates = operator_rates

    # -- reading -------------------------------------------------------------------

    def subtask_metrics(self) -> list[dict[str, Any]]:
        """Every subtask's metrics (see the module docstring for the shape)."""
        with self._lock:
            entries = sorted(self._subtasks.items())
            return [self._subtask_dict(key, entry) for key, entry in entries]

    def _subtask_dict(self, key: tuple[int, int], entry: _Subtask) -> dict[str, Any]:
        latest = entry.latest
        metrics: dict[str, Any] = {
            "numRecordsIn": latest.records_in,
            "numRecordsOut": latest.records_out,
            **entry.rates,
            "accumulateBusyTimeMs": latest.busy_ns // 1_000_000,
            "accumulateIdleTimeMs": latest.idle_ns // 1_000_000,
            "accumulateBackPressuredTimeMs": latest.backpressured_ns // 1_000_000,
            "currentInputWatermark": latest.input_watermark,
            "currentOutputWatermark": latest.output_watermark,
        }
        return {
            "vertex_id": key[0],
            "vertex_name": self._names[key[0]],
            "subtask_index": key[1],
            "attempt_number": latest.attempt_id.attempt_number,
            "finished": latest.final,
            "metrics": metrics,
            "operators": [self._operator_dict(o, entry) for o in latest.operators],
        }

    @staticmethod
    def _operator_dict(operator: OperatorMetrics, entry: _Subtask) -> dict[str, Any]:
        rate_in, rate_out = entry.operator_rates.get(operator.operator_id, (0.0, 0.0))
        return {
            "operator_id": operator.operator_id,
            "operator_name": operator.name,
            "metrics": {
                "numRecordsIn": operator.records_in,
                "numRecordsOut": operator.records_out,
                "numRecordsInPerSecond": rate_in,
                "numRecordsOutPerSecond": rate_out,
                "currentInputWatermark": operator.input_watermark,
                "currentOutputWatermark": operator.output_watermark,
                **user_metric_values(operator.user),
            },
            "user_metrics": list(operator.user),
        }

    def _vertex_values(self, vertex_id: int) -> list[dict[str, Any]]:
        with self._lock:
            return [
                self._subtask_dict(key, entry)["metrics"]
                for key, entry in sorted(self._subtasks.items())
                if key[0] == vertex_id
            ]

    def vertex_metrics(self, vertex_id: int) -> dict[str, Any]:
        """The vertex's task metrics over its subtasks: sums, maxima, minima (module docstring)."""
        values = self._vertex_values(vertex_id)
        if not values:
            return {}
        result: dict[str, Any] = {}
        for name in _SUMMED:
            result[name] = sum(v[name] for v in values)
        for name in _MAXED:
            result[name] = max(v[name] for v in values)
        for name in _MINNED:
            result[name] = min(v[name] for v in values)
        return result

    def vertex_metric_aggregates(self, vertex_id: int) -> dict[str, dict[str, float]]:
        """``{metric: {"min", "max", "avg", "sum"}}`` over the vertex's subtasks."""
        values = self._vertex_values(vertex_id)
        if not values:
            return {}
        return {
            name: {
                "min": min(v[name] for v in values),
                "max": max(v[name] for v in values),
                "avg": sum(v[name] for v in values) / len(values),
                "sum": sum(v[name] for v in values),
            }
            for name in values[0]
        }

    def job_metrics(self) -> dict[str, Any]:
        """Job-scope gauges (uptime, restarts, checkpoints); on the JobMaster thread."""
        eg = self.execution_graph
        if eg.state is JobStatus.RUNNING:
            uptime = max(0, self.clock.now_ms() - eg.state_timestamps[JobStatus.RUNNING])
        elif eg.state.is_globally_terminal:
            uptime = -1
        else:
            uptime = 0
        metrics: dict[str, Any] = {"uptime": uptime, "numRestarts": self._restarts()}
        stats = self._checkpoint_stats()
        counts = stats.counts if stats is not None else {}
        latest = None
        if stats is not None:
            candidates = [s for s in (stats.latest_completed, stats.latest_savepoint) if s is not None]
            latest = max(candidates, key=lambda s: s.checkpoint_id) if candidates else None
        restored = stats.latest_restored if stats is not None else None
        metrics.update(
            {
                "lastCheckpointDuration": latest.end_to_end_duration if latest else -1,
                "lastCheckpointSize": latest.checkpointed_size if latest else -1,
                "lastCheckpointFullSize": latest.state_size if latest else -1,
                "lastCompletedCheckpointId": latest.checkpoint_id if latest else -1,
                "lastCheckpointExternalPath": (latest.external_path if latest else None) or "n/a",
                "lastCheckpointRestoreTimestamp": restored["restore_timestamp"] if restored else -1,
                "numberOfCompletedCheckpoints": counts.get("completed", 0),
                "numberOfFailedCheckpoints": counts.get("failed", 0),
                "numberOfInProgressCheckpoints": counts.get("in_progress", 0),
                "totalNumberOfCheckpoints": counts.get("total", 0),
            }
        )
        return metrics


def user_metric_values(metrics: tuple[UserMetric, ...]) -> dict[str, Any]:
    """User metrics by Flink's ids below the operator (``<groups...>.<name>``), valued as
    Flink's REST API values them: a counter its count, a gauge its value, a meter its rate,
    a histogram ``<name>_min`` ... ``<name>_p999`` (no count, as Flink's), a distribution
    ``<name>_count``, ``_sum``, ``_min``, ``_max``, ``_mean``."""
    values: dict[str, Any] = {}
    for metric in metrics:
        identifier = ".".join((*metric.scope, metric.name))
        if metric.kind == "histogram":
            for statistic, value in metric.statistics:
                values[f"{identifier}_{statistic}"] = value
        elif metric.kind == "distribution":
            values[f"{identifier}_count"] = metric.value
            for statistic, value in metric.statistics:
                values[f"{identifier}_{statistic}"] = value
        else:
            values[identifier] = metric.value
    return values


def _start_of(snapshot: SubtaskMetrics) -> SubtaskMetrics:
    """The attempt's start as a report of zeros: the first report's rates are its averages
    since the task started (busy, idle and backpressured time add up to the time since)."""
    elapsed = snapshot.busy_ns + snapshot.idle_ns + snapshot.backpressured_ns
    return SubtaskMetrics(
        snapshot.attempt_id,
        snapshot.timestamp_ns - elapsed,
        0,
        0,
        0,
        0,
        0,
        MIN_TIMESTAMP,
        MIN_TIMESTAMP,
        (),
        False,
    )
