"""Flink's REST API served by a chandy driver: real server, real HTTP, real jobs.

Field names are asserted against Flink's REST model classes (``JobDetails``,
``JobDetailsInfo``, ``CheckpointingStatistics``, ``CheckpointConfigInfo``,
``TaskCheckpointStatisticsWithSubtaskDetails``, ``JobExceptionsInfoWithHistory``,
``ClusterOverviewWithVersion``), because Flink's CLI deserializes them strictly.
"""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from chandy import StreamExecutionEnvironment
from chandy.core.functions import MapFunction
from chandy.errors import JobCancelledError
from chandy.messages.status import JobStatus
from chandy.runtime.job_client import JobClient
from tests.jobs import Throttle

JOB_NAME = "rest api test job"

FLINK_EXECUTION_STATES = {
    "created",
    "scheduled",
    "deploying",
    "running",
    "finished",
    "canceling",
    "canceled",
    "failed",
    "reconciling",
    "initializing",
}


class FailOnce(MapFunction):
    """Raises at its 20th record in its first attempt, so the job fails over once."""

    def open(self, runtime_context: Any) -> None:
        self.attempt = runtime_context.get_attempt_number()
        self.count = 0

    def map(self, value: Any) -> Any:
        self.count += 1
        if self.attempt == 0 and self.count == 20:
            raise ValueError("induced failure for the exception history")
        return value


def running_job(env: StreamExecutionEnvironment, name: str = JOB_NAME, fail_once: bool = False) -> JobClient:
    # batches of 10 paced records: a savepoint's barrier or a cancel waits 20 ms behind one, not 2 s
    env.configure({"chandy.network.batch-size": 10})
    stream = env.from_sequence(0, 10_000_000).map(Throttle(0.002)).name("Throttle")
    if fail_once:
        stream = stream.map(FailOnce()).name("FailOnce")
    stream.key_by(lambda x: x % 4).reduce(lambda a, b: a + b).uid("sum").name("Sum").filter(
        lambda _: False
    ).print()
    return env.execute_async(name)


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass
class RunningJob:
    env: StreamExecutionEnvironment
    client: JobClient
    http: httpx.Client

    @property
    def job_id(self) -> str:
        return self.client.get_job_id()

    def get(self, path: str, status: int = 200) -> Any:
        response = self.http.get(path)
        assert response.status_code == status, (path, response.status_code, response.text)
        return response.json()


@pytest.fixture(scope="module")
def job() -> Iterator[RunningJob]:
    """One running job (checkpointing, a keyed sum, one failover) for the read-only routes."""
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.port": 0, "chandy.metrics.report-interval": 100}, executor="local"
    )
    env.set_parallelism(2)
    env.enable_checkpointing(100)
    # its one failover restarts at once (the default, exponential-delay, waits 1 s)
    env.configure({"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": 0})
    client = running_job(env, fail_once=True)
    assert env.rest_url is not None
    with httpx.Client(base_url=env.rest_url, timeout=30) as http:
        running = RunningJob(env, client, http)
        wait_for(
            lambda: (
                running.get(f"/jobs/{running.job_id}/checkpoints")["counts"]["completed"] >= 2
                and client.restarts == 1
            ),
            "two completed checkpoints after the failover",
        )
        yield running
    client.cancel()
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(timeout=60)
    env.close()


def test_the_server_is_up_with_the_first_job_and_logs_its_url(job: RunningJob) -> None:
    assert job.env.rest_url is not None and job.env.rest_url.startswith("http://127.0.0.1:")
    config = job.get("/config")
    assert {"refresh-interval", "timezone-name", "timezone-offset", "flink-version", "features"} <= set(
        config
    )


def test_overview_counts_the_running_job(job: RunningJob) -> None:
    overview = job.get("/overview")
    assert {
        "taskmanagers",
        "slots-total",
        "slots-available",
        "jobs-running",
        "jobs-finished",
        "jobs-cancelled",
        "jobs-failed",
        "flink-version",
        "flink-commit",
    } <= set(overview)
    assert overview["jobs-running"] == 1


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_jobs_and_jobs_overview_with_and_without_v1(job: RunningJob, prefix: str) -> None:
    assert job.get(f"{prefix}/jobs") == {"jobs": [{"id": job.job_id, "status": "RUNNING"}]}
    (details,) = job.get(f"{prefix}/jobs/overview")["jobs"]
    assert set(details) == {
        "jid",
        "name",
        "start-time",
        "end-time",
        "duration",
        "state",
        "last-modification",
        "tasks",
        "jobType",
        "schedulerType",
        "pending-operators",
    }  # Flink 2.3's JobDetails (its creator requires every one)
    assert details["jid"] == job.job_id and details["name"] == JOB_NAME and details["state"] == "RUNNING"
    assert details["end-time"] == -1 and details["duration"] > 0
    assert set(details["tasks"]) == FLINK_EXECUTION_STATES | {"total"}
    assert details["tasks"]["total"] == details["tasks"]["running"] == 4  # 2 vertices x parallelism 2


def test_job_details_has_vertices_with_stable_32_hex_ids_and_the_plan(job: RunningJob) -> None:
    info = job.get(f"/jobs/{job.job_id}")
    assert {
        "jid",
        "name",
        "isStoppable",
        "state",
        "job-type",
        "start-time",
        "end-time",
        "duration",
        "maxParallelism",
        "now",
        "timestamps",
        "vertices",
        "status-counts",
        "plan",
    } <= set(info)
    assert info["state"] == "RUNNING" and info["timestamps"]["RESTARTING"] > 0
    names = [v["name"] for v in info["vertices"]]
    assert names == ["Sequence Source -> Throttle -> FailOnce", "Sum -> Filter -> Print to Std. Out"], names
    for vertex in info["vertices"]:
        assert len(vertex["id"]) == 32 and int(vertex["id"], 16) >= 0
        assert {"id", "name", "parallelism", "maxParallelism", "status", "tasks", "metrics"} <= set(vertex)
        assert vertex["status"] == "RUNNING" and vertex["parallelism"] == 2
        assert vertex["tasks"]["RUNNING"] == 2 and set(vertex["tasks"]) == {
            s.upper() for s in FLINK_EXECUTION_STATES
        }
        assert {"read-records", "write-records", "accumulated-backpressured-time"} <= set(vertex["metrics"])
    source, keyed = info["vertices"]
    assert job.get(f"/jobs/{job.job_id}/plan") == {"plan": info["plan"]}
    nodes = {n["id"]: n for n in info["plan"]["nodes"]}
    assert nodes[keyed["id"]]["inputs"] == [
        {"num": 0, "id": source["id"], "ship_strategy": "HASH", "exchange": "pipelined_bounded"}
    ]


def test_unknown_job_is_404_with_flink_errors(job: RunningJob) -> None:
    body = job.get("/jobs/00000000000000000000000000000000", status=404)
    assert body["errors"] and "not found" in body["errors"][0]
    assert "errors" in job.get("/jobs/00000000000000000000000000000000/checkpoints", status=404)
    assert "errors" in job.get("/no/such/route", status=404)


def test_exceptions_list_the_failover(job: RunningJob) -> None:
    body = job.get(f"/jobs/{job.job_id}/exceptions")
    (entry,) = body["exceptionHistory"]["entries"]
    assert entry["exceptionName"] == "ValueError"
    assert "induced failure for the exception history" in entry["stacktrace"]
    assert entry["timestamp"] > 0 and body["exceptionHistory"]["truncated"] is False


def test_checkpoint_statistics_config_and_details(job: RunningJob) -> None:
    stats = job.get(f"/jobs/{job.job_id}/checkpoints")
    assert set(stats) == {"counts", "summary", "latest", "history"}
    completed = stats["latest"]["completed"]
    assert completed["status"] == "COMPLETED" and completed["is_savepoint"] is False
    config = job.get(f"/jobs/{job.job_id}/checkpoints/config")
    assert {
        "mode",
        "interval",
        "timeout",
        "min_pause",
        "max_concurrent",
        "externalization",
        "state_backend",
        "checkpoint_storage",
        "unaligned_checkpoints",
        "tolerable_failed_checkpoints",
        "aligned_checkpoint_timeout",
        "checkpoints_after_tasks_finish",
    } <= set(config)
    assert config["mode"] == "exactly_once" and config["interval"] == 100
    assert config["unaligned_checkpoints"] is False and config["aligned_checkpoint_timeout"] == 0
    details = job.get(f"/jobs/{job.job_id}/checkpoints/details/{completed['id']}")
    vertex_ids = [v["id"] for v in job.get(f"/jobs/{job.job_id}")["vertices"]]
    assert sorted(details["tasks"]) == sorted(vertex_ids)
    task = job.get(f"/jobs/{job.job_id}/checkpoints/details/{completed['id']}/subtasks/{vertex_ids[1]}")
    assert task["num_acknowledged_subtasks"] == 2 and len(task["subtasks"]) == 2
    for subtask in task["subtasks"]:
        assert subtask["status"] == "completed"
        assert {"sync", "async"} == set(subtask["checkpoint"])
        assert {"buffered", "processed", "persisted", "duration"} == set(subtask["alignment"])
    job.get(f"/jobs/{job.job_id}/checkpoints/details/999999", status=404)
    job.get(f"/jobs/{job.job_id}/checkpoints/details/{completed['id']}/subtasks/{'0' * 32}", status=404)


def test_checkpoint_config_reports_unaligned_checkpoints_and_the_aligned_timeout() -> None:
    """``unaligned_checkpoints`` and ``aligned_checkpoint_timeout`` (ms) come from the job's
    configuration (no periodic checkpoints here: only the settings are read)."""
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor="local")
    env.get_checkpoint_config().enable_unaligned_checkpoints().set_aligned_checkpoint_timeout(1_500)
    client = running_job(env, name="unaligned config")
    assert env.rest_url is not None
    try:
        with httpx.Client(base_url=env.rest_url, timeout=30) as http:
            wait_for(lambda: client.get_job_status() is JobStatus.RUNNING, "the job running")
            config = http.get(f"/jobs/{client.get_job_id()}/checkpoints/config").json()
            assert config["unaligned_checkpoints"] is True
            assert config["aligned_checkpoint_timeout"] == 1_500
    finally:
        client.cancel()
        with pytest.raises(JobCancelledError):
            client.get_job_execution_result(timeout=60)
        env.close()


def test_job_metrics_list_and_get(job: RunningJob) -> None:
    ids = {m["id"] for m in job.get(f"/jobs/{job.job_id}/metrics")}
    assert {
        "lastCheckpointDuration",
        "lastCheckpointSize",
        "numberOfCompletedCheckpoints",
        "numberOfFailedCheckpoints",
        "numberOfInProgressCheckpoints",
        "totalNumberOfCheckpoints",
        "numRestarts",
        "uptime",
    } <= ids
    values = job.get(f"/jobs/{job.job_id}/metrics?get=numRestarts,numberOfCompletedCheckpoints,nope")
    assert [v["id"] for v in values] == ["numRestarts", "numberOfCompletedCheckpoints"]
    assert values[0]["value"] == "1" and int(values[1]["value"]) >= 2


def test_dashboard_is_served_at_the_root(job: RunningJob) -> None:
    response = job.http.get("/")
    assert response.status_code == 200 and "<html" in response.text.lower()


def test_cancel_through_patch_then_the_finished_job_stays_listed(job: RunningJob) -> None:
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor="local")
    env.set_parallelism(2)
    client = running_job(env, name="to cancel")
    assert env.rest_url is not None and env.rest_url != job.env.rest_url  # one server per environment
    with httpx.Client(base_url=env.rest_url, timeout=30) as http:
        wait_for(lambda: client.get_job_status() is JobStatus.RUNNING, "the job running")
        # vertex ids are stable: the keyed vertex's comes from its uid, the same in both jobs
        keyed_ids = {
            v["id"] for v in job.get(f"/jobs/{job.job_id}")["vertices"] if v["name"].startswith("Sum")
        }
        assert keyed_ids == {
            v["id"]
            for v in http.get(f"/jobs/{client.get_job_id()}").json()["vertices"]
            if v["name"].startswith("Sum")
        }
        response = http.patch(f"/v1/jobs/{client.get_job_id()}", params={"mode": "cancel"}, json={})
        assert response.status_code == 202 and response.json() == {}
        with pytest.raises(JobCancelledError):
            client.get_job_execution_result(timeout=60)
        (details,) = http.get("/jobs/overview").json()["jobs"]
        assert details["state"] == "CANCELED" and details["end-time"] >= details["start-time"]
        assert http.patch(f"/jobs/{client.get_job_id()}", json={}).status_code == 202  # again: still CANCELED
        overview = http.get("/overview").json()
        assert overview["jobs-cancelled"] == 1 and overview["jobs-running"] == 0
    url = env.rest_url
    env.close()
    assert env.rest_url is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/jobs")


def test_cancelling_a_finished_job_is_a_conflict() -> None:
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor="local")
    env.from_collection([1, 2, 3]).print()
    client = env.execute_async("short")
    client.get_job_execution_result(timeout=60)
    assert env.rest_url is not None
    response = httpx.patch(f"{env.rest_url}/jobs/{client.get_job_id()}?mode=cancel", json={})
    assert response.status_code == 409 and "FINISHED" in response.json()["errors"][0]
    env.close()


def test_execute_serves_while_the_job_runs_and_stops_the_server_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor="local")
    env.from_collection([1, 2, 3]).print()
    env.execute("short")
    (started,) = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("Dashboard and REST API at")
    ]
    url = started.split()[5].rstrip("/")
    assert url.startswith("http://127.0.0.1:")
    assert any(r.getMessage() == f"The REST server at {url} stopped." for r in caplog.records)
    assert env.rest_url is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/jobs")


def poll_trigger(http: httpx.Client, job_id: str, trigger_id: str) -> dict[str, Any]:
    """What Flink's CLI does: poll the trigger until its operation completed."""

    def completed() -> dict[str, Any] | None:
        response = http.get(f"/v1/jobs/{job_id}/savepoints/{trigger_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert set(body) == {"status", "operation"}
        if body["status"]["id"] == "IN_PROGRESS":
            assert body["operation"] is None
            return None
        assert body["status"] == {"id": "COMPLETED"}
        return body["operation"]

    operation: dict[str, Any] = wait_for(completed, f"trigger {trigger_id}")
    return operation


def test_savepoint_trigger_then_status_until_completed(job: RunningJob, tmp_path: Path) -> None:
    response = job.http.post(
        f"/v1/jobs/{job.job_id}/savepoints",
        json={"target-directory": str(tmp_path), "cancel-job": False, "formatType": "CANONICAL"},
    )
    assert response.status_code == 202, response.text
    (trigger_id,) = response.json().values()
    assert set(response.json()) == {"request-id"} and len(trigger_id) == 32
    operation = poll_trigger(job.http, job.job_id, trigger_id)
    assert operation["failure-cause"] is None
    location = Path(operation["location"])
    assert location.parent == tmp_path and location.name.startswith(f"savepoint-{job.job_id[:6]}-")
    assert (location / "_metadata").is_file()
    latest = job.get(f"/jobs/{job.job_id}/checkpoints")["latest"]["savepoint"]
    assert latest["is_savepoint"] and latest["external_path"] == str(location)
    # a client may choose the trigger id (Flink's triggerId): asking again is the same operation
    again = job.http.post(
        f"/jobs/{job.job_id}/savepoints", json={"target-directory": str(tmp_path), "triggerId": trigger_id}
    )
    assert again.status_code == 202 and again.json() == {"request-id": trigger_id}
    assert len(list(tmp_path.iterdir())) == 1


def test_a_failed_savepoint_reports_its_cause_as_flink_does(job: RunningJob, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    response = job.http.post(f"/jobs/{job.job_id}/savepoints", json={"target-directory": str(blocker / "sp")})
    assert response.status_code == 202
    operation = poll_trigger(job.http, job.job_id, response.json()["request-id"])
    cause = operation["failure-cause"]
    assert operation["location"] is None
    assert {"class", "stack-trace", "serialized-throwable"} <= set(cause)
    assert "a-file" in cause["stack-trace"] and cause["class"].endswith("CheckpointException")
    assert base64.b64decode(cause["serialized-throwable"])[:4] == bytes.fromhex("aced0005")  # Java's
    assert job.client.get_job_status() is JobStatus.RUNNING  # a failed savepoint changes nothing


def test_savepoint_requests_that_cannot_start_are_refused(job: RunningJob) -> None:
    no_directory = job.http.post(f"/jobs/{job.job_id}/savepoints", json={"cancel-job": False})
    assert no_directory.status_code == 400
    assert "execution.checkpointing.savepoint-dir" in no_directory.json()["errors"][0]
    bad_format = job.http.post(
        f"/jobs/{job.job_id}/savepoints", json={"target-directory": "/tmp", "formatType": "ZIP"}
    )
    assert bad_format.status_code == 400 and "CANONICAL" in bad_format.json()["errors"][0]
    not_json = job.http.post(
        f"/jobs/{job.job_id}/savepoints", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert not_json.status_code == 400
    job.get(f"/jobs/{job.job_id}/savepoints/{'0' * 32}", status=404)


def test_vertex_metrics_by_flink_ids_and_backpressure(job: RunningJob) -> None:
    source, keyed = job.get(f"/jobs/{job.job_id}")["vertices"]
    base = f"/jobs/{job.job_id}/vertices/{keyed['id']}"
    required = {
        f"{subtask}.{name}"
        for subtask in (0, 1)
        for name in (
            "numRecordsIn",
            "numRecordsOut",
            "numRecordsInPerSecond",
            "busyTimeMsPerSecond",
            "backPressuredTimeMsPerSecond",
            "currentInputWatermark",
            "Sum.numRecordsIn",
        )
    }
    wait_for(lambda: required <= {m["id"] for m in job.get(f"{base}/metrics")}, "both subtasks' metrics")
    values = job.get(f"{base}/metrics?get=0.numRecordsIn,1.numRecordsIn")
    assert [v["id"] for v in values] == ["0.numRecordsIn", "1.numRecordsIn"]
    assert all(isinstance(v["value"], str) and float(v["value"]) >= 0 for v in values)
    wait_for(
        lambda: (
            sum(float(v["value"]) for v in job.get(f"{base}/metrics?get=0.numRecordsIn,1.numRecordsIn")) > 0
        ),
        "records counted into the keyed vertex",
    )
    # the attempts since the failover have reported (a cancelled attempt's last report is dropped then)
    pressure = wait_for(
        lambda: (
            (p := job.get(f"{base}/backpressure"))
            and [s["attempt-number"] for s in p.get("subtasks", [])] == [1, 1]
            and p
        ),
        "the current attempts' backpressure",
    )
    assert pressure["status"] == "ok" and pressure["backpressure-level"] in ("ok", "low", "high")
    assert [s["subtask"] for s in pressure["subtasks"]] == [0, 1]
    for subtask in pressure["subtasks"]:
        assert set(subtask) == {
            "subtask",
            "attempt-number",
            "backpressure-level",
            "backpressureLevel",
            "ratio",
            "idleRatio",
            "busyRatio",
        }
        assert subtask["backpressure-level"] == subtask["backpressureLevel"]
        assert 0 <= subtask["ratio"] <= 1
    detail = job.get(f"/jobs/{job.job_id}")["vertices"][1]["metrics"]
    assert detail["read-records"] > 0 and detail["read-records-complete"] is True
    job.get(f"/jobs/{job.job_id}/vertices/{'f' * 32}/backpressure", status=404)
    assert source["id"] != keyed["id"]


def test_stop_with_savepoint_finishes_the_job(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor="local")
    env.set_parallelism(2)
    client = running_job(env, name="to stop")
    assert env.rest_url is not None
    with httpx.Client(base_url=env.rest_url, timeout=30) as http:
        wait_for(lambda: client.get_job_status() is JobStatus.RUNNING, "the job running")
        response = http.post(
            f"/v1/jobs/{client.get_job_id()}/stop",
            json={"targetDirectory": str(tmp_path), "drain": False, "formatType": "CANONICAL"},
        )
        assert response.status_code == 202, response.text
        operation = poll_trigger(http, client.get_job_id(), response.json()["request-id"])
        assert (Path(operation["location"]) / "_metadata").is_file()
        client.get_job_execution_result(timeout=60)  # FINISHED, no error
        assert http.get("/jobs").json()["jobs"][0]["status"] == "FINISHED"
        late = http.post(f"/jobs/{client.get_job_id()}/stop", json={"targetDirectory": str(tmp_path)})
        assert late.status_code == 409
    env.close()


def test_execute_keeps_serving_until_the_stop_result_was_fetched(tmp_path: Path) -> None:
    """Flink's CLI polls for a stop's outcome after the job finished: execute() must not take
    the server down before it got it (at most chandy.rest.await-results-timeout)."""
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.port": 0, "chandy.rest.await-results-timeout": "60 s", "chandy.network.batch-size": 10},
        executor="local",
    )
    env.set_parallelism(2)
    env.from_sequence(0, 10_000_000).map(Throttle(0.002)).print()
    outcome: list[Any] = []
    runner = threading.Thread(target=lambda: outcome.append(env.execute("stopped by a client")))
    runner.start()
    url = wait_for(lambda: env.rest_url, "the server")
    with httpx.Client(base_url=url, timeout=30) as http:
        job_id = wait_for(
            lambda: [j["id"] for j in http.get("/jobs").json()["jobs"] if j["status"] == "RUNNING"], "job"
        )[0]
        response = http.post(f"/jobs/{job_id}/stop", json={"targetDirectory": str(tmp_path)})
        trigger_id = response.json()["request-id"]
        wait_for(lambda: http.get("/jobs").json()["jobs"][0]["status"] == "FINISHED", "the job finished")
        runner.join(0.5)
        assert runner.is_alive() and not outcome  # the result is still unfetched: still serving
        operation = poll_trigger(http, job_id, trigger_id)
        assert (Path(operation["location"]) / "_metadata").is_file()
    runner.join(30)
    assert not runner.is_alive() and outcome[0].get_job_id() == job_id
    assert env.rest_url is None


def test_execute_stops_waiting_for_unfetched_results_after_the_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.port": 0, "chandy.rest.await-results-timeout": "200 ms", "chandy.network.batch-size": 10},
        executor="local",
    )
    env.from_sequence(0, 10_000_000).map(Throttle(0.002)).print()
    runner = threading.Thread(target=lambda: env.execute("nobody fetches"))
    runner.start()
    url = wait_for(lambda: env.rest_url, "the server")
    job_id = wait_for(
        lambda: [j["id"] for j in httpx.get(f"{url}/jobs").json()["jobs"] if j["status"] == "RUNNING"], "job"
    )[0]
    trigger_id = httpx.post(f"{url}/jobs/{job_id}/stop", json={"targetDirectory": str(tmp_path)}).json()[
        "request-id"
    ]
    runner.join(60)
    assert not runner.is_alive() and env.rest_url is None
    assert any(
        trigger_id in r.getMessage() and "await-results-timeout" in r.getMessage() for r in caplog.records
    )


@contextmanager
def driver_program(module: str) -> Iterator[tuple[subprocess.Popen[str], httpx.Client, str]]:
    """A driver program of tests/scripts run as a process (killed at the end), a client of
    its REST server (the program prints ``URL <url>`` first) and its running job's id."""
    process = subprocess.Popen(
        [sys.executable, "-m", module], cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split()[1]
        with httpx.Client(base_url=url, timeout=30) as http:
            job_id = wait_for(
                lambda: [j["id"] for j in http.get("/jobs").json()["jobs"] if j["status"] == "RUNNING"], "job"
            )[0]
            yield process, http, job_id
    finally:
        process.kill()
        process.wait()


def test_a_second_ctrl_c_while_execute_awaits_results_still_stops_the_server(tmp_path: Path) -> None:
    """Ctrl-C cancels the job; execute() then waits for a savepoint's outcome nobody fetched;
    a second Ctrl-C ends that wait, and must still close the port (a notebook or a
    supervising loop that catches KeyboardInterrupt goes on running)."""
    with driver_program("tests.scripts.rest_interrupted_job") as (process, http, job_id):
        trigger = http.post(f"/jobs/{job_id}/savepoints", json={"target-directory": str(tmp_path)})
        wait_for(lambda: any(tmp_path.glob("savepoint-*/_metadata")), "the savepoint")
        process.send_signal(signal.SIGINT)  # cancels the job; its savepoint is still unfetched
        wait_for(lambda: http.get("/jobs").json()["jobs"][0]["status"] == "CANCELED", "the job cancelled")
        assert process.poll() is None  # waiting for the result to be fetched
        assert trigger.status_code == 202
        process.send_signal(signal.SIGINT)
        assert process.stdout is not None
        assert process.stdout.readline().split() == ["AFTER", "None"]
        assert process.wait(60) == 0


def test_a_program_that_exits_after_its_async_job_ended_waits_for_the_stop_result(tmp_path: Path) -> None:
    """A program using execute_async() (or execute_and_collect()) ends when its job ends; the
    interpreter must not take the REST server down before the client that stopped the job
    fetched the savepoint's path (Flink's CLI polls for it after the job finished)."""
    with driver_program("tests.scripts.rest_async_job") as (process, http, job_id):
        trigger_id = http.post(f"/jobs/{job_id}/stop", json={"targetDirectory": str(tmp_path)}).json()[
            "request-id"
        ]
        assert process.stdout is not None
        assert process.stdout.readline().split() == ["ENDED", "FINISHED"]
        time.sleep(0.5)  # the program's main() has returned: the interpreter is exiting
        assert process.poll() is None  # ...but waits for the stop's outcome to be fetched
        operation = poll_trigger(http, job_id, trigger_id)
        assert (Path(operation["location"]) / "_metadata").is_file()
        assert process.wait(60) == 0


def test_savepoint_with_cancel_job_cancels_once_the_savepoint_completed(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor="local")
    client = running_job(env, name="cancel with savepoint")
    assert env.rest_url is not None
    with httpx.Client(base_url=env.rest_url, timeout=30) as http:
        wait_for(lambda: client.get_job_status() is JobStatus.RUNNING, "the job running")
        response = http.post(
            f"/jobs/{client.get_job_id()}/savepoints",
            json={"target-directory": str(tmp_path), "cancel-job": True},
        )
        operation = poll_trigger(http, client.get_job_id(), response.json()["request-id"])
        assert (Path(operation["location"]) / "_metadata").is_file()
        with pytest.raises(JobCancelledError, match="cancelled with savepoint"):
            client.get_job_execution_result(timeout=60)
    env.close()
