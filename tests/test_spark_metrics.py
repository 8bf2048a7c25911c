"""Metrics and the Spark job description on the Spark executor: slots report their tasks'
metrics to the driver over the control connection, and the slot stage's Spark job
description names the chandy job and its dashboard (read back from Spark's own status
store, what the Spark UI shows)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.config import Configuration
from chandy.core.functions import KeyedProcessFunction
from chandy.runtime.job_master import JobMaster
from chandy.runtime.spark.executor import SparkExecutor, job_description
from tests.jobs import HoldingSequence, release
from tests.test_task_metrics import operator_totals


class Forward(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


def spark_jobs(session: Any) -> list[tuple[str, str]]:
    """(job group, description) of every Spark job this application ran, from the status
    store behind the Spark UI."""
    jobs = session.sparkContext._jsc.sc().statusStore().jobsList(None)  # a Scala Seq of JobData
    found = []
    for index in range(jobs.length()):
        job = jobs.apply(index)
        group = job.jobGroup()
        description = job.description()
        found.append(
            (
                group.get() if group.isDefined() else "",
                description.get() if description.isDefined() else "",
            )
        )
    return found


def test_slots_report_metrics_to_the_driver_and_the_stage_names_the_job(
    spark_session: Any, tmp_path: Path
) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="spark")
    env.set_parallelism(2)
    env.configure(
        {
            "chandy.metrics.report-interval": "50 ms",
            "chandy.network.batch-size": 8,
            "taskmanager.network.memory.buffers-per-channel": 1,
        }
    )
    gate = str(tmp_path / "seen")  # the source holds half-way until the test saw live metrics
    (
        env.from_source(HoldingSequence(0, 599, hold_after=300, until=gate), source_name="numbers")
        .set_parallelism(1)
        .name("numbers")
        .map(lambda x: x)
        .name("paced")
        .key_by(lambda x: x % 5)
        .process(Forward())
        .name("forward")
        .add_sink(lambda value: None)
        .name("discard")
    )
    job_graph = env._build_job_graph("spark metrics")
    executor = SparkExecutor(Configuration(job_graph.config), dashboard_url="http://127.0.0.1:8081")
    job_master = JobMaster(job_graph, executor)
    live: list[dict[str, Any]] = []

    def watch() -> None:  # what the driver holds while the slots run
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline and not live:
                running = [s for s in job_master.metrics.subtask_metrics() if not s["finished"]]
                if any(s["metrics"]["numRecordsOut"] > 0 for s in running):
                    live.extend(running)
                time.sleep(0.02)
        finally:
            release(gate)  # the job goes on to its end, seen or not

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        job_master.run()
    finally:
        executor.close()
        watcher.join()
    assert live, "no live metrics reached the driver while the job ran"
    subtasks = job_master.metrics.subtask_metrics()
    # the collection source (parallelism 1), then "paced" and "forward" with 2 subtasks each
    assert len(subtasks) == 5 and all(s["finished"] for s in subtasks)
    totals = operator_totals(job_master)
    assert totals == {
        "numbers": (0, 600),
        "paced": (600, 600),
        "forward": (600, 600),
        "discard": (600, 0),
    }
    description = job_description("spark metrics", job_graph.job_id, "http://127.0.0.1:8081")
    assert description == (
        f"chandy job 'spark metrics' ({job_graph.job_id}), "
        f"dashboard http://127.0.0.1:8081/#/jobs/{job_graph.job_id}"
    )
    assert any(
        group.startswith(f"chandy-{job_graph.job_id}-") and text == description
        for group, text in spark_jobs(spark_session)
    ), spark_jobs(spark_session)


def test_execute_names_the_rest_servers_dashboard_in_the_spark_job(spark_session: Any) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="spark")
    env.configure({"rest.port": 0})
    env.set_parallelism(1)
    env.from_collection([1, 2, 3]).add_sink(lambda value: None)
    with env:
        client = env.execute_async("described")
        client.get_job_execution_result(timeout=120)
        url = env.rest_url
        assert url is not None
        expected = job_description("described", client.get_job_id(), url)
        assert url in expected
        assert any(text == expected for _, text in spark_jobs(spark_session)), spark_jobs(spark_session)


@pytest.mark.slow
def test_a_slot_closes_while_its_metrics_report_is_stuck_on_a_driver_that_reads_nothing() -> None:
    """A driver that is hung (alive, not reading) must not keep a slot process from ending:
    the report stuck in ``sendall`` is left to the connection's close."""
    import socket

    from chandy.messages.ids import ExecutionAttemptID
    from chandy.network.auth import new_secret
    from chandy.network.framing import FramedSocket
    from chandy.network.tcp import DataPlane, bind_data_listener
    from chandy.runtime.spark.slot import SlotBootstrap, SlotRuntime
    from chandy.task.metrics import OperatorCounters, TaskMetrics

    with socket.create_server(("127.0.0.1", 0)) as server:
        slot_end = socket.create_connection(server.getsockname())
        driver_end, _ = server.accept()
    secret = new_secret()
    listener, address = bind_data_listener("127.0.0.1")
    data = DataPlane(0, secret, listener, address, {})
    runtime = SlotRuntime(
        0, SlotBootstrap("job-1", 1, "127.0.0.1:1", secret, None), FramedSocket(slot_end), data
    )
    closer = threading.Thread(target=runtime.close)
    try:
        # a report of some megabytes fills the socket's buffers at once: its send blocks
        metrics = TaskMetrics(ExecutionAttemptID(1, 0, 0), [])
        metrics.bind_chain([OperatorCounters(f"op-{i}", "x" * 40) for i in range(100_000)], [])
        runtime._metrics_reporter("job-1", {"chandy.metrics.report-interval": "10 ms"}).register(metrics)
        time.sleep(0.5)  # a few reports: the first is stuck
        started = time.monotonic()
        closer.start()
        closer.join(30)
        assert not closer.is_alive(), "close() hangs behind the stuck metrics report"
        assert time.monotonic() - started < 20
    finally:
        driver_end.close()  # unsticks the send if close() hung
        if closer.ident is not None:
            closer.join(30)
        data.close()
        listener.close()
