"""``/metrics``: a running job's metrics in Prometheus' text format, by Flink's names.

The scrape is parsed with prometheus-client's own parser, so what passes here is
what a Prometheus server ingests; names and labels are those of Flink's
PrometheusReporter, so dashboards and alerts written for Flink work unchanged.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chandy import StreamExecutionEnvironment
from chandy.errors import JobCancelledError
from tests.test_rest_api import running_job, wait_for

JOB = "prometheus job"


def scrape(url: str) -> dict[str, list[Any]]:
    response = httpx.get(f"{url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {family.name: family.samples for family in text_string_to_metric_families(response.text)}


def test_flink_metric_names_with_their_labels_while_the_job_runs() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.port": 0, "chandy.metrics.report-interval": 100}, executor="local"
    )
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    client = running_job(env, name=JOB)
    url = env.rest_url
    assert url is not None
    job_id = client.get_job_id()

    def ready() -> dict[str, list[Any]] | None:
        families = scrape(url)
        completed = families.get("flink_jobmanager_job_numberOfCompletedCheckpoints", [])
        records = families.get("flink_taskmanager_job_task_operator_numRecordsIn", [])
        into_sum = sum(s.value for s in records if s.labels["operator_name"] == "Sum")
        # every operator of every subtask reported (2 x 5), and records reached the keyed vertex
        if completed and completed[0].value >= 1 and len(records) == 10 and into_sum > 0:
            return families
        return None

    families = wait_for(ready, "a completed checkpoint and every subtask's records in a scrape")

    (running,) = families["flink_jobmanager_numRunningJobs"]
    assert running.value == 1
    for name in (
        "lastCheckpointDuration",
        "lastCheckpointSize",
        "numberOfCompletedCheckpoints",
        "numberOfFailedCheckpoints",
        "numberOfInProgressCheckpoints",
        "totalNumberOfCheckpoints",
        "numRestarts",
        "uptime",
    ):
        (sample,) = families[f"flink_jobmanager_job_{name}"]
        assert sample.labels == {"job_id": job_id, "job_name": JOB}, name
    assert families["flink_jobmanager_job_lastCheckpointDuration"][0].value >= 0
    assert "flink_jobmanager_job_lastCheckpointExternalPath" not in families  # a string: left out

    task_labels = {"job_id", "job_name", "task_id", "task_name", "subtask_index"}
    for name in (
        "numRecordsIn",
        "numRecordsOut",
        "numRecordsInPerSecond",
        "numRecordsOutPerSecond",
        "busyTimeMsPerSecond",
        "idleTimeMsPerSecond",
        "backPressuredTimeMsPerSecond",
        "currentInputWatermark",
        "currentOutputWatermark",
    ):
        samples = families[f"flink_taskmanager_job_task_{name}"]
        assert {(s.labels["task_name"], s.labels["subtask_index"]) for s in samples} == {
            ("Sequence Source -> Throttle", "0"),
            ("Sequence Source -> Throttle", "1"),
            ("Sum -> Filter -> Print to Std. Out", "0"),
            ("Sum -> Filter -> Print to Std. Out", "1"),
        }, name
        assert all(set(s.labels) == task_labels and len(s.labels["task_id"]) == 32 for s in samples)

    operators = families["flink_taskmanager_job_task_operator_numRecordsIn"]
    assert {s.labels["operator_name"] for s in operators} == {
        "Sequence Source",
        "Throttle",
        "Sum",
        "Filter",
        "Print to Std. Out",
    }
    assert all(set(s.labels) == task_labels | {"operator_id", "operator_name"} for s in operators)
    summed = {s.labels["operator_name"]: 0.0 for s in operators}
    for sample in operators:
        summed[sample.labels["operator_name"]] += sample.value
    assert summed["Throttle"] > 0 and summed["Sum"] > 0
    assert "flink_taskmanager_job_task_operator_numRecordsOutPerSecond" in families

    client.cancel()
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(timeout=60)
    after = scrape(url)  # as Flink, an ended job's metrics go away
    assert after["flink_jobmanager_numRunningJobs"][0].value == 0
    assert not any(name.startswith(("flink_jobmanager_job_", "flink_taskmanager_")) for name in after)
    env.close()
