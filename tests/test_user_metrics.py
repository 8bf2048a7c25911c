"""User metrics: ``runtime_context.get_metrics_group()`` with PyFlink's ``MetricGroup`` API.

Units test the metric group itself (names, groups, every kind's values, with a manual
clock for the meter); the jobs run a function that registers one metric of every kind
and read them back where a user looks: the REST API's vertex metrics (on both
executors, counts exact once the job ended) and the Prometheus scrape of a running job
(names and labels as Flink's PrometheusReporter gives them).
"""

from __future__ import annotations

import logging
import pickle
import statistics
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from chandy import StreamExecutionEnvironment
from chandy.core.functions import MapFunction, RuntimeContext
from chandy.core.metrics import HistogramStatistics
from chandy.errors import JobCancelledError
from chandy.messages.metrics import UserMetric
from chandy.runtime.metrics_store import user_metric_values
from chandy.task.metrics import OperatorCounters
from chandy.task.runtime_context import StreamingRuntimeContext
from chandy.task.user_metrics import OperatorMetricGroup
from chandy.util.clock import ManualClock
from chandy.web.prometheus import _Scrape
from tests.jobs import Throttle
from tests.test_rest_api import wait_for


def by_id(group: OperatorMetricGroup) -> dict[str, UserMetric]:
    return {".".join((*m.scope, m.name)): m for m in group.snapshot()}


# ---------------------------------------------------------------------------- the group


def test_a_counter_counts_and_is_the_same_counter_when_asked_again() -> None:
    group = OperatorMetricGroup("Map")
    counter = group.counter("seen")
    counter.inc()
    counter.inc(41)
    counter.dec(2)
    assert counter.get_count() == 40
    assert group.counter("seen") is counter  # PyFlink's: one cell per name
    (metric,) = group.snapshot()
    assert metric == UserMetric((), "seen", "counter", 40, (), (), ())
    counter.inc()
    assert group.snapshot()[0].value == 41  # read live at each report


def test_groups_nest_and_a_key_value_group_is_a_label_not_a_name() -> None:
    group = OperatorMetricGroup("Map")
    nested = group.add_group("io").add_group("reads")
    assert group.add_group("io").add_group("reads") is nested
    nested.counter("bytes").inc(7)
    group.add_group("region", "eu").counter("orders").inc(2)
    group.add_group("region", "us").counter("orders").inc(3)
    group.add_group("region").counter("orders").inc(5)  # a plain group "region": another metric
    metrics = by_id(group)
    assert set(metrics) == {"io.reads.bytes", "region.eu.orders", "region.us.orders", "region.orders"}
    eu = metrics["region.eu.orders"]
    assert (eu.value, eu.logical_scope, eu.variables) == (2, ("region",), (("region", "eu"),))
    assert metrics["region.us.orders"].variables == (("region", "us"),)
    plain = metrics["region.orders"]
    assert (plain.value, plain.logical_scope, plain.variables) == (5, ("region",), ())
    assert metrics["io.reads.bytes"].logical_scope == ("io", "reads")


def test_a_gauge_is_called_at_each_report_and_a_failing_one_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    group = OperatorMetricGroup("Map")
    state = {"size": 3, "fail": False}

    def size() -> int:
        if state["fail"]:
            raise RuntimeError("gauge broke")
        return int(state["size"])

    group.gauge("size", size)
    group.gauge("name", lambda: "orders")
    group.gauge("ready", lambda: True)
    group.gauge("nothing", lambda: None)
    assert {k: m.value for k, m in by_id(group).items()} == {"size": 3, "name": "orders", "ready": 1}
    state["size"] = 9
    assert by_id(group)["size"].value == 9
    state["fail"] = True
    with caplog.at_level(logging.WARNING, "chandy.task.user_metrics"):
        assert "size" not in by_id(group)
        assert "size" not in by_id(group)
    assert [r.getMessage() for r in caplog.records if "gauge broke" in r.getMessage()] == [
        "Operator 'Map': gauge 'size' raised RuntimeError('gauge broke'); it is left out of the metrics "
        "until it works."
    ]  # once, not at every report
    state["fail"] = False
    group.gauge("size", lambda: 100)  # registered again: the new function replaces the old
    assert by_id(group)["size"].value == 100
    with pytest.raises(TypeError, match="gauge 'x' needs a function"):
        group.gauge("x", 5)  # type: ignore[arg-type]


def test_a_meter_reports_its_rate_over_its_time_span() -> None:
    clock = ManualClock()
    group = OperatorMetricGroup("Map", clock)
    meter = group.meter("events", time_span_in_seconds=10)
    assert group.meter("events", 10) is meter
    meter.mark_event(50)
    clock.advance_ms(5_000)
    assert by_id(group)["events"].value == pytest.approx(10.0)  # 50 in 5 s: not diluted by the span
    meter.mark_event()
    meter.mark_event(149)
    clock.advance_ms(5_000)
    assert meter.get_rate() == pytest.approx(20.0)  # 200 in 10 s
    clock.advance_ms(5_000)
    assert meter.get_rate() == pytest.approx(15.0)  # the first 5 s left the span: 150 in 10 s
    clock.advance_ms(10_000)
    assert meter.get_rate() == 0.0
    assert meter.get_count() == 200
    with pytest.raises(ValueError, match="time span"):
        group.meter("bad", 0)


def test_a_distribution_reports_count_sum_min_max_mean() -> None:
    group = OperatorMetricGroup("Map")
    distribution = group.distribution("latency")
    assert by_id(group)["latency"].statistics == (("sum", 0.0), ("min", 0.0), ("max", 0.0), ("mean", 0.0))
    for value in (4, -2, 10, 0.5):
        distribution.update(value)
    metric = by_id(group)["latency"]
    assert metric.value == 4
    assert dict(metric.statistics) == {"sum": 12.5, "min": -2.0, "max": 10.0, "mean": 3.125}


def test_a_histogram_keeps_the_statistics_of_its_window() -> None:
    group = OperatorMetricGroup("Map")
    histogram = group.histogram("size", window_size=10)
    for value in range(100, 0, -1):  # 100 .. 1: the window keeps the last ten, 10 .. 1
        histogram.update(value)
    assert histogram.get_count() == 100
    stats = histogram.get_statistics()
    assert sorted(stats.get_values()) == list(range(1, 11)) and stats.size() == 10
    metric = by_id(group)["size"]
    assert metric.value == 100
    # Commons Math's Percentile (Flink's DescriptiveStatisticsHistogram): position q * (n + 1)
    assert dict(metric.statistics) == pytest.approx(
        {
            "min": 1.0,
            "max": 10.0,
            "mean": 5.5,
            "median": 5.5,
            "stddev": statistics.stdev(range(1, 11)),
            "p75": 8.25,
            "p90": 9.9,
            "p95": 10.0,
            "p98": 10.0,
            "p99": 10.0,
            "p999": 10.0,
        }
    )
    assert HistogramStatistics([]).get_quantile(0.5) == 0.0
    assert HistogramStatistics([3]).get_std_dev() == 0.0
    assert HistogramStatistics([1, 2, 3, 4]).get_quantile(0.1) == 1.0
    with pytest.raises(ValueError, match="between 0 and 1"):
        stats.get_quantile(1.5)
    with pytest.raises(ValueError, match="at least one value"):
        group.histogram("empty", 0)


def test_a_name_collision_warns_and_the_new_metric_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    group = OperatorMetricGroup("Enrich")
    counter = group.counter("hits")
    with caplog.at_level(logging.WARNING, "chandy.task.user_metrics"):
        meter = group.meter("hits")
        own = group.counter("numRecordsIn")
        nested = group.add_group("cache").counter("numRecordsIn")  # only the operator's group is taken
    meter.mark_event()
    own.inc()
    nested.inc(4)
    assert {k: m.value for k, m in by_id(group).items()} == {"hits": 0, "cache.numRecordsIn": 4}
    assert counter.get_count() == 0 and own.get_count() == 1
    assert [r.getMessage() for r in caplog.records] == [
        "Operator 'Enrich': the operator's group already has a counter named 'hits'; the new meter works "
        "but is not reported (Flink's name collision). Give it another name.",
        "Operator 'Enrich': the operator's group already has a metric of the operator itself named "
        "'numRecordsIn'; the new counter works but is not reported (Flink's name collision). Give it "
        "another name.",
    ]
    with pytest.raises(ValueError, match="a metric name is a non-empty string"):
        group.counter("")
    with pytest.raises(ValueError, match="a group value name is a non-empty string"):
        group.add_group("region", "")


def test_the_rest_values_are_flinks_metric_ids() -> None:
    group = OperatorMetricGroup("Map")
    group.add_group("parity", "even").counter("values").inc(3)
    group.histogram("size").update(4)
    group.distribution("spread").update(2)
    values = user_metric_values(group.snapshot())
    assert values["parity.even.values"] == 3
    assert {k for k in values if k.startswith("size")} == {
        f"size_{s}"
        for s in ("min", "max", "mean", "median", "stddev", "p75", "p90", "p95", "p98", "p99", "p999")
    }  # Flink's REST API gives a histogram no count
    assert {k: v for k, v in values.items() if k.startswith("spread")} == {
        "spread_count": 1,
        "spread_sum": 2.0,
        "spread_min": 2.0,
        "spread_max": 2.0,
        "spread_mean": 2.0,
    }


def test_the_runtime_context_hands_out_the_operators_group_which_its_task_reports() -> None:
    counters = OperatorCounters("op-1", "Map")
    context = StreamingRuntimeContext(
        job_id="job",
        job_name="job",
        task_name="Map",
        operator_name="Map",
        subtask_index=0,
        parallelism=1,
        max_parallelism=128,
        attempt_number=0,
        job_parameters={},
        metric_group=counters.user_metrics,
    )
    assert isinstance(context, RuntimeContext)
    context.get_metrics_group().counter("seen").inc(5)
    snapshot = counters.snapshot()
    assert [(m.name, m.value) for m in snapshot.user] == [("seen", 5)]
    assert pickle.loads(pickle.dumps(snapshot)) == snapshot  # what a Spark slot sends the driver


def test_a_counter_inc_is_one_attribute_addition() -> None:
    """The per-record path: no lock, no call into the runtime, nothing but ``count += n``."""
    counter = OperatorMetricGroup("Map").counter("seen")
    code = type(counter).inc.__code__
    assert code.co_names == ("count",)
    assert not hasattr(counter, "__dict__")  # slots: the attribute is a fixed offset


# ---------------------------------------------------------------------------- jobs

N = 1000


class Metered(MapFunction):
    """One metric of every kind, and a key-value group."""

    def open(self, runtime_context: RuntimeContext) -> None:
        group = runtime_context.get_metrics_group()
        self.seen = group.add_group("records").counter("seen")
        self.even = group.add_group("parity", "even").counter("values")
        self.odd = group.add_group("parity", "odd").counter("values")
        self.rate = group.meter("rate", 10)
        self.values = group.histogram("value", window_size=N)
        self.spread = group.distribution("spread")
        subtask = runtime_context.get_index_of_this_subtask()
        group.gauge("subtask", lambda: subtask)

    def map(self, value: Any) -> Any:
        self.seen.inc()
        (self.odd if value % 2 else self.even).inc()
        self.rate.mark_event()
        self.values.update(value)
        self.spread.update(value)
        return value


def vertex_of(http: httpx.Client, job_id: str, name: str) -> str:
    vertices = http.get(f"/jobs/{job_id}").json()["vertices"]
    (vertex,) = [v["id"] for v in vertices if name in v["name"]]
    return str(vertex)


def test_a_functions_metrics_are_exact_in_the_rest_api_once_the_job_ended(executor: str) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.port": 0, "chandy.metrics.report-interval": 100}, executor=executor
    )
    env.from_collection(list(range(N))).rebalance().map(Metered()).name("Metered").set_parallelism(
        2
    ).add_sink(lambda value: None)
    client = env.execute_async("user metrics")
    client.get_job_execution_result(timeout=120)
    assert env.rest_url is not None
    with httpx.Client(base_url=env.rest_url, timeout=30) as http:
        vertex = vertex_of(http, client.get_job_id(), "Metered")
        path = f"/jobs/{client.get_job_id()}/vertices/{vertex}/metrics"
        ids = {entry["id"] for entry in http.get(path).json()}
        names = [
            "records.seen",
            "parity.even.values",
            "parity.odd.values",
            "rate",
            "subtask",
            "value_min",
            "value_max",
            "value_p99",
            "spread_count",
            "spread_sum",
            "spread_min",
            "spread_max",
            "numRecordsIn",
        ]
        wanted = [f"{s}.Metered.{n}" for s in (0, 1) for n in names]
        assert set(wanted) <= ids, sorted(set(wanted) - ids)
        answer = http.get(path, params={"get": ",".join(wanted)}).json()
    env.close()
    values = {entry["id"]: float(entry["value"]) for entry in answer}

    def both(name: str) -> list[float]:
        return [values[f"{s}.Metered.{name}"] for s in (0, 1)]

    assert both("records.seen") == both("numRecordsIn") and sum(both("records.seen")) == N
    assert sum(both("parity.even.values")) == sum(both("parity.odd.values")) == N // 2
    assert both("subtask") == [0, 1]
    assert sum(both("spread_count")) == N and sum(both("spread_sum")) == sum(range(N))
    assert min(both("spread_min")) == min(both("value_min")) == 0
    assert max(both("spread_max")) == max(both("value_max")) == N - 1
    assert all(rate >= 0 for rate in both("rate"))


def test_a_running_jobs_user_metrics_in_prometheus_with_flinks_names_and_labels() -> None:
    # batches of 10 paced records: Metered counts within 20 ms, and the cancel waits as long (not 2 s)
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.port": 0, "chandy.metrics.report-interval": 100, "chandy.network.batch-size": 10},
        executor="local",
    )
    env.set_parallelism(2)
    env.from_sequence(0, 10_000_000).map(Throttle(0.002)).name("Throttle").map(Metered()).name(
        "Metered"
    ).filter(lambda _: False).print()
    client = env.execute_async("user metrics in prometheus")
    url = env.rest_url
    assert url is not None
    prefix = "flink_taskmanager_job_task_operator_"

    def scraped() -> dict[str, list[Any]] | None:
        text = httpx.get(f"{url}/metrics").text
        families = {family.name: family.samples for family in text_string_to_metric_families(text)}
        seen = families.get(f"{prefix}records_seen", [])
        return families if len(seen) == 2 and all(s.value > 0 for s in seen) else None

    try:
        families = wait_for(scraped, "both subtasks' user metrics in a scrape")
    finally:
        client.cancel()
        with pytest.raises(JobCancelledError):
            client.get_job_execution_result(timeout=60)
        env.close()
    operator_labels = {
        "job_id",
        "job_name",
        "task_id",
        "task_name",
        "subtask_index",
        "operator_id",
        "operator_name",
    }
    for sample in families[f"{prefix}records_seen"]:
        assert set(sample.labels) == operator_labels and sample.labels["operator_name"] == "Metered"
    parity = families[f"{prefix}parity_values"]  # the key's value is a label, not part of the name
    assert {s.labels["parity"] for s in parity} == {"even", "odd"} and len(parity) == 4
    assert all(set(s.labels) == operator_labels | {"parity"} for s in parity)
    assert sorted(s.value for s in families[f"{prefix}subtask"]) == [0, 1]
    assert {s.name for s in families[f"{prefix}rate"]} == {f"{prefix}rate"}
    summary = families[f"{prefix}value"]  # a histogram: Flink's summary
    quantiles = {s.labels["quantile"] for s in summary if s.name == f"{prefix}value"}
    assert quantiles == {"0.5", "0.75", "0.95", "0.98", "0.99", "0.999"}
    assert [s.value > 0 for s in summary if s.name == f"{prefix}value_count"] == [True, True]
    for statistic in ("count", "sum", "min", "max", "mean"):
        assert len(families[f"{prefix}spread_{statistic}"]) == 2
    # the operator's own metrics are still there once per operator, and user ids are not among them
    assert len(families[f"{prefix}numRecordsIn"]) == 2 * 5  # source, Throttle, Metered, Filter, Print
    assert not any(name.startswith(f"{prefix}records.") for name in families)


def test_user_metrics_whose_prometheus_names_coincide_never_give_a_sample_twice() -> None:
    """Prometheus rejects a whole scrape that holds one sample twice (same name and labels):
    user metrics that Flink's naming maps onto one name must not break every job's metrics."""
    group = OperatorMetricGroup("Map")
    group.add_group("a").counter("b_c").inc(1)
    group.add_group("a_b").counter("c").inc(2)  # also ..._a_b_c
    group.histogram("h").update(1)
    group.counter("h_count").inc(3)  # the histogram's summary has a sample h_count
    group.add_group("region").counter("orders").inc(4)
    group.add_group("region", "eu").counter("orders").inc(5)  # the same name, one more label
    group.add_group("2nd region", "us").counter("orders").inc(6)  # a label may not start with a digit
    registry = CollectorRegistry(auto_describe=False)
    scrape = _Scrape()
    labels = {"operator_name": "Map", "subtask_index": "0"}
    for metric in group.snapshot():
        scrape.user_metric(metric, labels)

    class Families(Collector):
        def collect(self) -> Iterator[Metric]:
            yield from scrape.families.values()

    registry.register(Families())
    text = generate_latest(registry).decode()
    samples = [
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    assert len(samples) == len(set(samples)), text
    prefix = "flink_taskmanager_job_task_operator_"
    families = {family.name: family for family in text_string_to_metric_families(text)}
    # the first registered keeps the name; the later ones are left out, not the scrape
    assert [s.value for s in families[f"{prefix}a_b_c"].samples] == [1.0]
    assert families[f"{prefix}h"].type == "summary" and f"{prefix}h_count" not in families
    assert [(s.labels, s.value) for s in families[f"{prefix}region_orders"].samples] == [(labels, 4.0)]
    assert [(s.labels, s.value) for s in families[f"{prefix}2nd_region_orders"].samples] == [
        ({**labels, "_2nd_region": "us"}, 6.0)
    ]
