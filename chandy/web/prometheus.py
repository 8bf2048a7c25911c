"""``/metrics``: the jobs' metrics in Prometheus' text format, by Flink's names.

Flink's PrometheusReporter names a metric by its scope and name joined with
``_`` (``flink_jobmanager_job_lastCheckpointDuration``,
``flink_taskmanager_job_task_operator_numRecordsIn``) and puts the scope's
variables into labels (``job_id``, ``job_name``, ``task_name``,
``subtask_index``, ``operator_name``, ...), so dashboards and alerts written for
Flink read chandy's. User metrics (``get_metrics_group()``) are named as Flink's
reporter names them: by their groups (a key-value group's key only, its value a
label), a histogram as a summary. A custom collector reads the live values at each scrape
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
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from chandy.messages.metrics import UserMetric
from chandy.runtime.metrics_store import user_metric_values
from chandy.web import views
from chandy.web.dispatcher import DispatchedJob, Dispatcher

log = logging.getLogger(__name__)

_INVALID = re.compile(r"[^a-zA-Z0-9:_]")


OPERATOR_SCOPE = "taskmanager_job_task_operator"

#: The quantiles Flink's reporter gives a histogram (its summary's ``quantile`` label), and the
#: statistic of chandy's report that holds each.
HISTOGRAM_QUANTILES = (
    ("0.5", "median"),
    ("0.75", "p75"),
    ("0.95", "p95"),
    ("0.98", "p98"),
    ("0.99", "p99"),
    ("0.999", "p999"),
)


def metric_name(scope: str, name: str) -> str:
    """Flink's Prometheus name: ``flink_<scope>_<name>``, other characters replaced by ``_``."""
    return _INVALID.sub("_", f"flink_{scope}_{name}")


def label_name(name: str) -> str:
    """A user variable's label (the key of ``add_group(key, value)``), as Flink's reporter
    makes it: characters Prometheus does not allow replaced by ``_``, and ``_`` before a
    leading digit (which Flink's leaves, and Prometheus rejects with the whole scrape)."""
    label = _INVALID.sub("_", name).replace(":", "_")
    return f"_{label}" if label[0].isdigit() else label


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # Flink's reporter leaves out gauges that are not numbers (an external path)
    return float(value)


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
        scrape = _Scrape()
        gauge = scrape.gauge
        live = [
            job
            for job in self._dispatcher.jobs()
            if not job.job_master.execution_graph.state.is_globally_terminal
        ]
        gauge(metric_name("jobmanager", "numRunningJobs"), {}, len(live))
        for job in live:
            job_labels = {"job_id": job.job_id, "job_name": job.job_name}
            for name, value in (self._ask_job_metrics(job) or {}).items():
                gauge(metric_name("jobmanager_job", name), job_labels, value)
            vertex_ids = {v.id: views.vertex_rest_id(v) for v in job.job_master.job_graph.vertices}
            for subtask in job.job_master.metrics.subtask_metrics():
                task_labels = {
                    **job_labels,
                    "task_id": vertex_ids[subtask["vertex_id"]],
                    "task_name": subtask["vertex_name"],
                    "subtask_index": str(subtask["subtask_index"]),
                }
                for name, value in subtask["metrics"].items():
                    gauge(metric_name("taskmanager_job_task", name), task_labels, value)
                for operator in subtask["operators"]:
                    operator_labels = {
                        **task_labels,
                        "operator_id": operator["operator_id"],
                        "operator_name": operator["operator_name"],
                    }
                    user: list[UserMetric] = operator.get("user_metrics", [])
                    metrics = operator["metrics"]
                    users_ids = user_metric_values(tuple(user)).keys()
                    for name, value in metrics.items():
                        if name not in users_ids:
                            gauge(metric_name(OPERATOR_SCOPE, name), operator_labels, value)
                    for metric in user:
                        scrape.user_metric(metric, operator_labels)
        yield from scrape.families.values()


class _Scrape:
    """The families of one scrape, kept valid for Prometheus whatever names users choose.

    Flink's naming can map two user metrics onto one name (``add_group("a").counter("b_c")``
    and ``add_group("a_b").counter("c")``; a counter ``h_count`` beside a histogram ``h``,
    whose summary has a sample ``h_count``). Prometheus rejects a whole scrape that holds a
    sample twice, so a sample goes in only if no other family owns its name and no sample
    with its name and labels is in yet, and a family keeps one set of label names (Flink's
    reporter cannot register a second); what is left out is logged (debug)."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}
        self._labels: dict[str, tuple[str, ...]] = {}
        #: Sample name -> the family it belongs to.
        self._owner: dict[str, str] = {}
        self._samples: set[tuple[str, frozenset[tuple[str, str]]]] = set()

    def _add(self, family_name: str, kind: str, samples: list[tuple[str, dict[str, str], float]]) -> None:
        """``samples`` (name, labels, value) into the family, all or none."""
        family = self.families.get(family_name)
        label_names = tuple(samples[0][1])
        keys = [(name, frozenset(labels.items())) for name, labels, _ in samples]
        clash = (
            family is not None and (family.type != kind or self._labels[family_name] != label_names)
        ) or any(
            self._owner.get(name, family_name) != family_name or key in self._samples
            for (name, _, _), key in zip(samples, keys, strict=True)
        )
        if clash:
            log.debug("%s: its name is another metric's (or its sample is there); left out", family_name)
            return
        if family is None:
            family = self.families[family_name] = Metric(family_name, f"{family_name} (Flink's metric)", kind)
            self._labels[family_name] = label_names
        for (name, labels, value), key in zip(samples, keys, strict=True):
            family.add_sample(name, labels, value)
            self._owner[name] = family_name
            self._samples.add(key)

    def gauge(self, name: str, labels: dict[str, str], value: object) -> None:
        number = _number(value)
        if number is not None:
            self._add(name, "gauge", [(name, labels, number)])

    def user_metric(self, metric: UserMetric, operator_labels: dict[str, str]) -> None:
        """A user metric as Flink's PrometheusReporter shows it: named by its logical scope
        (its key-value groups' values are labels, named by their keys); a counter, a gauge and
        a meter (its rate) as gauges, a histogram as a summary (``quantile`` samples and
        ``_count``), a distribution as gauges ``_count``, ``_sum``, ``_min``, ``_max``,
        ``_mean`` (Flink's reporter leaves PyFlink's distributions out: not a number)."""
        labels = dict(operator_labels)
        for key, value in metric.variables:
            label = label_name(key)
            if label in labels:
                log.debug("user metric %s: label %r is the operator's own; left out", metric.name, label)
                continue
            labels[label] = value
        full = metric_name(OPERATOR_SCOPE, "_".join((*metric.logical_scope, metric.name)))
        if metric.kind == "histogram":
            statistics = dict(metric.statistics)
            self._add(
                full,
                "summary",
                [(f"{full}_count", labels, float(metric.value))]
                + [(full, {**labels, "quantile": q}, statistics[stat]) for q, stat in HISTOGRAM_QUANTILES],
            )
        elif metric.kind == "distribution":
            self.gauge(f"{full}_count", labels, metric.value)
            for statistic, number in metric.statistics:
                self.gauge(f"{full}_{statistic}", labels, number)
        else:
            self.gauge(full, labels, metric.value)


class PrometheusExporter:
    """Renders the dispatcher's live jobs for a Prometheus scrape."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, dispatcher: Dispatcher, call_timeout_s: float) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_JobsCollector(dispatcher, call_timeout_s))

    def render(self) -> bytes:
        return generate_latest(self.registry)
