"""JobMetricsStore on hand-made reports and a manual clock: rates from consecutive reports,
aggregates per vertex, job gauges from the checkpoint statistics, and failover (reports of
superseded attempts dropped, rates never negative)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chandy import StreamExecutionEnvironment
from chandy.checkpoint.properties import CheckpointProperties
from chandy.checkpoint.stats import CheckpointStatsTracker
from chandy.config.options import ExternalizedCheckpointRetention
from chandy.core.time import MIN_TIMESTAMP
from chandy.graph.execution_graph import ExecutionGraph
from chandy.messages.checkpoint import CheckpointMetrics
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.metrics import MetricsReport, OperatorMetrics, SubtaskMetrics
from chandy.messages.status import JobStatus
from chandy.runtime.metrics_store import JobMetricsStore
from chandy.util.clock import ManualClock

S = 1_000_000_000  # a second in nanoseconds


class Job:
    """A two-vertex job (source -> keyed sum, parallelism 2) and a store fed by hand."""

    def __init__(self) -> None:
        env = StreamExecutionEnvironment.get_execution_environment(executor="local")
        env.set_parallelism(2)
        env.from_collection([1, 2]).name("numbers").key_by(lambda x: x).reduce(lambda a, b: a + b).name(
            "sum"
        ).add_sink(lambda value: None)
        self.graph = env._build_job_graph("store")
        self.source, self.keyed = (v.id for v in self.graph.vertices)
        self.clock = ManualClock()
        self.execution_graph = ExecutionGraph(self.graph, self.clock)
        self.stats: CheckpointStatsTracker | None = CheckpointStatsTracker()
        self.restarts = 0
        self.store = JobMetricsStore(
            self.execution_graph, self.clock, lambda: self.stats, lambda: self.restarts
        )

    def report(self, *subtasks: SubtaskMetrics) -> None:
        self.store.report(MetricsReport(self.graph.job_id, subtasks))

    def of(self, vertex: int, subtask: int) -> dict[str, object]:
        (found,) = [
            s
            for s in self.store.subtask_metrics()
            if s["vertex_id"] == vertex and s["subtask_index"] == subtask
        ]
        return found


def snapshot(
    vertex: int,
    subtask: int = 0,
    attempt: int = 0,
    *,
    at: float,
    records_in: int = 0,
    records_out: int = 0,
    busy: float = 0.0,
    idle: float = 0.0,
    backpressured: float = 0.0,
    watermarks: tuple[int, int] = (MIN_TIMESTAMP, MIN_TIMESTAMP),
    operators: tuple[OperatorMetrics, ...] = (),
    final: bool = False,
) -> SubtaskMetrics:
    """A report taken ``at`` seconds (monotonic) with times in seconds."""
    return SubtaskMetrics(
        ExecutionAttemptID(vertex, subtask, attempt),
        int(at * S),
        records_in,
        records_out,
        int(busy * S),
        int(idle * S),
        int(backpressured * S),
        watermarks[0],
        watermarks[1],
        operators,
        final,
    )


def test_rates_come_from_two_consecutive_reports_of_an_attempt() -> None:
    job = Job()
    job.report(snapshot(job.keyed, at=10, records_in=1000, records_out=900, busy=5, idle=4, backpressured=1))
    job.report(
        snapshot(job.keyed, at=12, records_in=5000, records_out=2900, busy=6, idle=5.5, backpressured=1.5)
    )
    metrics = job.of(job.keyed, 0)["metrics"]
    assert metrics == {
        "numRecordsIn": 5000,
        "numRecordsOut": 2900,
        "numRecordsInPerSecond": 2000.0,
        "numRecordsOutPerSecond": 1000.0,
        "busyTimeMsPerSecond": 500.0,
        "idleTimeMsPerSecond": 750.0,
        "backPressuredTimeMsPerSecond": 250.0,
        "accumulateBusyTimeMs": 6000,
        "accumulateIdleTimeMs": 5500,
        "accumulateBackPressuredTimeMs": 1500,
        "currentInputWatermark": MIN_TIMESTAMP,
        "currentOutputWatermark": MIN_TIMESTAMP,
    }


def test_the_first_report_gives_the_averages_since_the_task_started() -> None:
    job = Job()
    # 10 s of life: 2 s busy, 8 s idle, 500 records
    job.report(snapshot(job.keyed, at=100, records_in=500, busy=2, idle=8))
    metrics = job.of(job.keyed, 0)["metrics"]
    assert metrics["numRecordsInPerSecond"] == 50.0
    assert metrics["busyTimeMsPerSecond"] == 200.0
    assert metrics["idleTimeMsPerSecond"] == 800.0
    assert metrics["backPressuredTimeMsPerSecond"] == 0.0


def test_reports_closer_than_the_rate_window_keep_the_rates_and_widen_the_window() -> None:
    job = Job()
    job.report(snapshot(job.keyed, at=10, records_in=0, busy=1, idle=9))
    job.report(snapshot(job.keyed, at=11, records_in=100, busy=1, idle=10))
    job.report(snapshot(job.keyed, at=11.05, records_in=1000, busy=1.05, idle=10))  # 50 ms later
    metrics = job.of(job.keyed, 0)["metrics"]
    assert metrics["numRecordsIn"] == 1000  # the counts are the latest
    assert metrics["numRecordsInPerSecond"] == 100.0  # the rates still those of 10 -> 11
    job.report(snapshot(job.keyed, at=12, records_in=1100, busy=1.05, idle=10.95))
    assert job.of(job.keyed, 0)["metrics"]["numRecordsInPerSecond"] == 1000.0  # over 11 -> 12


def test_operator_rates_and_watermarks() -> None:
    job = Job()

    def operators(records: int, watermark: int) -> tuple[OperatorMetrics, ...]:
        return (
            OperatorMetrics("a", "sum", records, records, watermark, watermark),
            OperatorMetrics("b", "discard", records, 0, watermark, watermark),
        )

    job.report(snapshot(job.keyed, at=1, busy=1, operators=operators(0, 5), watermarks=(5, 5)))
    job.report(snapshot(job.keyed, at=3, busy=3, operators=operators(600, 9), watermarks=(9, 8)))
    entry = job.of(job.keyed, 0)
    assert [(o["operator_name"], o["metrics"]) for o in entry["operators"]] == [
        (
            "sum",
            {
                "numRecordsIn": 600,
                "numRecordsOut": 600,
                "numRecordsInPerSecond": 300.0,
                "numRecordsOutPerSecond": 300.0,
                "currentInputWatermark": 9,
                "currentOutputWatermark": 9,
            },
        ),
        (
            "discard",
            {
                "numRecordsIn": 600,
                "numRecordsOut": 0,
                "numRecordsInPerSecond": 300.0,
                "numRecordsOutPerSecond": 0.0,
                "currentInputWatermark": 9,
                "currentOutputWatermark": 9,
            },
        ),
    ]
    assert (entry["metrics"]["currentInputWatermark"], entry["metrics"]["currentOutputWatermark"]) == (9, 8)


def test_vertex_metrics_sum_counts_and_rates_take_the_worst_times_and_the_lowest_watermark() -> None:
    job = Job()
    job.report(
        snapshot(job.keyed, 0, at=10, records_in=100, busy=9, backpressured=1, watermarks=(50, 40)),
        snapshot(job.keyed, 1, at=10, records_in=300, busy=2, idle=8, watermarks=(70, 60)),
    )
    vertex = job.store.vertex_metrics(job.keyed)
    assert vertex["numRecordsIn"] == 400
    assert vertex["numRecordsInPerSecond"] == 40.0  # 10 + 30 records/s
    assert vertex["busyTimeMsPerSecond"] == 900.0
    assert vertex["idleTimeMsPerSecond"] == 800.0
    assert vertex["backPressuredTimeMsPerSecond"] == 100.0
    assert (vertex["currentInputWatermark"], vertex["currentOutputWatermark"]) == (50, 40)
    aggregates = job.store.vertex_metric_aggregates(job.keyed)
    assert aggregates["numRecordsIn"] == {"min": 100, "max": 300, "avg": 200.0, "sum": 400}
    assert aggregates["busyTimeMsPerSecond"]["avg"] == 550.0
    assert job.store.vertex_metrics(job.source) == {}  # nothing reported yet
    assert job.store.vertex_metric_aggregates(job.source) == {}


def test_a_superseded_attempts_report_is_dropped_and_the_new_one_starts_afresh() -> None:
    job = Job()
    job.report(snapshot(job.keyed, attempt=0, at=10, records_in=10_000, busy=10))
    # failover: attempt 1 starts from a checkpoint, its counters from zero
    job.report(snapshot(job.keyed, attempt=1, at=20, records_in=100, busy=1))
    entry = job.of(job.keyed, 0)
    assert entry["attempt_number"] == 1
    assert entry["metrics"]["numRecordsIn"] == 100
    assert entry["metrics"]["numRecordsInPerSecond"] == 100.0  # not (100 - 10000) / 10 s
    # the cancelled attempt's last words arrive late: ignored
    job.report(snapshot(job.keyed, attempt=0, at=21, records_in=12_000, busy=11, final=True))
    entry = job.of(job.keyed, 0)
    assert (entry["attempt_number"], entry["metrics"]["numRecordsIn"], entry["finished"]) == (1, 100, False)
    job.report(snapshot(job.keyed, attempt=1, at=21, records_in=300, busy=2))
    assert job.of(job.keyed, 0)["metrics"]["numRecordsInPerSecond"] == 200.0


def test_rates_never_go_negative_and_stale_reports_are_ignored() -> None:
    job = Job()
    job.report(snapshot(job.keyed, at=10, records_in=1000, records_out=1000, busy=10))
    job.report(snapshot(job.keyed, at=9, records_in=5, busy=9))  # older than what is held: dropped
    assert job.of(job.keyed, 0)["metrics"]["numRecordsIn"] == 1000
    job.report(snapshot(job.keyed, at=11, records_in=900, records_out=2000, busy=10.5, idle=0.2))
    metrics = job.of(job.keyed, 0)["metrics"]
    assert metrics["numRecordsInPerSecond"] == 0.0  # a counter that went back yields 0, never < 0
    assert metrics["numRecordsOutPerSecond"] == 1000.0
    assert all(metrics[name] >= 0 for name in metrics if name.endswith("PerSecond"))


def test_a_final_report_zeroes_the_rates_and_marks_the_subtask_finished() -> None:
    job = Job()
    job.report(snapshot(job.keyed, at=10, records_in=1000, busy=10))
    job.report(snapshot(job.keyed, at=11, records_in=2000, busy=11, final=True))
    entry = job.of(job.keyed, 0)
    assert entry["finished"] and entry["metrics"]["numRecordsIn"] == 2000
    assert all(v == 0.0 for k, v in entry["metrics"].items() if k.endswith("PerSecond"))


def test_reports_of_another_job_or_an_unknown_vertex_are_dropped() -> None:
    job = Job()
    job.store.report(MetricsReport("another job", (snapshot(job.keyed, at=1, busy=1),)))
    job.report(snapshot(999, at=1, busy=1))
    assert job.store.subtask_metrics() == []


def test_job_metrics_uptime_restarts_and_checkpoint_gauges() -> None:
    job = Job()
    values = job.store.job_metrics()
    assert values == {
        "uptime": 0,
        "numRestarts": 0,
        "lastCheckpointDuration": -1,
        "lastCheckpointSize": -1,
        "lastCheckpointFullSize": -1,
        "lastCompletedCheckpointId": -1,
        "lastCheckpointExternalPath": "n/a",
        "lastCheckpointRestoreTimestamp": -1,
        "numberOfCompletedCheckpoints": 0,
        "numberOfFailedCheckpoints": 0,
        "numberOfInProgressCheckpoints": 0,
        "totalNumberOfCheckpoints": 0,
    }
    eg = job.execution_graph
    eg.transition_state(JobStatus.CREATED, JobStatus.RUNNING)
    job.clock.advance_ms(2500)
    stats = job.stats
    assert stats is not None
    props = CheckpointProperties.for_checkpoint(ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS)
    vertices = {job.keyed: ("sum", 1)}
    stats.report_restored(3, job.clock.now_ms() - 2000, False, "/restored/chk-3")
    stats.report_pending_checkpoint(4, job.clock.now_ms() - 40, props, vertices)
    stats.report_subtask(
        4, job.keyed, 0, job.clock.now_ms(), CheckpointMetrics(checkpointed_size=700, state_size=900)
    )
    stats.report_completed(4, job.clock.now_ms(), "/checkpoints/chk-4")
    stats.report_pending_checkpoint(5, job.clock.now_ms(), props, vertices)
    stats.report_failed(5, job.clock.now_ms(), "declined")
    stats.report_pending_checkpoint(6, job.clock.now_ms(), props, vertices)
    job.restarts = 2
    values = job.store.job_metrics()
    assert values["uptime"] == 2500
    assert values["numRestarts"] == 2
    assert values["lastCheckpointDuration"] == 40
    assert (values["lastCheckpointSize"], values["lastCheckpointFullSize"]) == (700, 900)
    assert values["lastCompletedCheckpointId"] == 4
    assert values["lastCheckpointExternalPath"] == "/checkpoints/chk-4"
    assert values["lastCheckpointRestoreTimestamp"] == job.clock.now_ms() - 2000
    assert [values[f"numberOf{k}Checkpoints"] for k in ("Completed", "Failed", "InProgress")] == [1, 1, 1]
    assert values["totalNumberOfCheckpoints"] == 3
    eg.transition_state(JobStatus.RUNNING, JobStatus.FINISHED)
    assert job.store.job_metrics()["uptime"] == -1  # Flink's gauge once the job ended


def test_a_job_without_checkpoint_statistics_reports_zeros() -> None:
    job = Job()
    job.stats = None
    values = job.store.job_metrics()
    assert values["numberOfCompletedCheckpoints"] == 0 and values["lastCheckpointDuration"] == -1


def test_snapshots_are_immutable_messages() -> None:
    report = snapshot(1, at=1)
    with pytest.raises(AttributeError):
        report.records_in = 5  # type: ignore[misc]
    assert replace(report, records_in=5).records_in == 5
