"""``/metrics``: the jobs' metrics in Prometheus' text format, by Flink's names.

Flink's PrometheusReporter names a metric by its scope and name joined with
``_`` (``flink_jobmanager_job_lastCheckpointDuration``,
``flink_taskmanager_job_task_operator_numRecordsIn``) and puts the scope's
variables into labels (``job_id``, ``job_name``, ``task_name``,
``subtask_index``, ``operator_name``, ...), so dashboards and alerts written for
Flink read chandy's. A custom collector reads the live values at each scrape
(no registry of gauges to keep in step with jobs that come and go); the
registry is the server's own, not prometheus-client's global one.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chandy.web import views
from chandy.web.dispatcher import DispatchedJob, Dispatcher

log = logging.getLogger(__name__)

_INVALID = re.compile(r"[^a-zA-Z0-9:_]")

JOB_LABELS = ("job_id", "job_name")
TASK_LABELS = (*JOB_LABELS, "task_id", "task_name", "subtask_index")
OPERATOR_LABELS = (*TASK_LABELS, "operator_id", "operator_name")


def metric_name(scope: str, name: str) -> str:
    """Flink's Prometheus name: ``flink_<scope>_<name>``, other characters replaced by ``_``."""
    return _INVALID.sub("_", f"flink_{scope}_{name}")


class _JobsCollector(Collector):
    def __init__(self, dispatcher: Dispatcher, call_timeout_s: float) -> None:
        self._dispatcher = dispatcher
        self._call_timeout_s = call_timeout_s

    def _ask_job_metrics(self, job: DispatchedJob) -> dict[str, Any] | None:
        """The job's gauges, read on its JobMaster thread (``None`` if it is busy too long)."""
        try:
            values: dict[str, Any] = job.job_master.call(job.job_master.metrics.job_metrics).result(
                self._call_timeout_s
            )
        except FutureTimeoutError:
            log.warning(
                "Job %s: its JobMaster did not answer a metrics scrape in time; left out.", job.job_id
            )
            return None
        return values

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}

        def gauge(
            scope: str, name: str, labels: tuple[str, ...], values: tuple[str, ...], value: Any
        ) -> None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return  # Flink's reporter leaves out gauges that are not numbers (an external path)
            full = metric_name(scope, name)
            family = families.get(full)
            if family is None:
                family = families[full] = GaugeMetricFamily(
                    full, f"{name} (Flink's {scope} scope)", labels=labels
                )
            family.add_metric(values, value)

        live = [
            job
            for job in self._dispatcher.jobs()
            if not job.job_master.execution_graph.state.is_globally_terminal
        ]
        gauge("jobmanager", "numRunningJobs", (), (), len(live))
        for job in live:
            job_labels = (job.job_id, job.job_name)
            for name, value in (self._ask_job_metrics(job) or {}).items():
                gauge("jobmanager_job", name, JOB_LABELS, job_labels, value)
            vertex_ids = {v.id: views.vertex_rest_id(v) for v in job.job_master.job_graph.vertices}
            for subtask in job.job_master.metrics.subtask_metrics():
                task_labels = (
                    *job_labels,
                    vertex_ids[subtask["vertex_id"]],
                    subtask["vertex_name"],
                    str(subtask["subtask_index"]),
                )
                for name, value in subtask["metrics"].items():
                    gauge("taskmanager_job_task", name, TASK_LABELS, task_labels, value)
                for operator in subtask["operators"]:
                    operator_labels = (*task_labels, operator["operator_id"], operator["operator_name"])
                    for name, value in operator["metrics"].items():
                        gauge("taskmanager_job_task_operator", name, OPERATOR_LABELS, operator_labels, value)
        yield from families.values()


class PrometheusExporter:
    """Renders the dispatcher's live jobs for a Prometheus scrape."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, dispatcher: Dispatcher, call_timeout_s: float) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_JobsCollector(dispatcher, call_timeout_s))

    def render(self) -> bytes:
        return generate_latest(self.registry)
