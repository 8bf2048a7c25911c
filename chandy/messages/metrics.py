"""What a running subtask tells the JobMaster about itself: counters, times, watermarks.

Tasks count as they go (see :mod:`chandy.task.metrics`); every
``chandy.metrics.report-interval`` the process that hosts them (the local
executor, a Spark slot) sends one :class:`MetricsReport` with a
:class:`SubtaskMetrics` per task, and once more when a task ends, so the last
counts of a finished job are exact. The JobMaster's
:class:`~chandy.runtime.metrics_store.JobMetricsStore` turns consecutive reports
into Flink's per-second rates.

Values are cumulative since the attempt started (never reset between reports):
a lost report costs nothing but resolution, and the receiver derives rates from
any two reports of the same attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from chandy.messages.ids import ExecutionAttemptID


@dataclass(frozen=True, slots=True)
class OperatorMetrics:
    """One operator of a subtask's chain (Flink's operator scope)."""

    operator_id: str
    name: str
    #: Records the operator received (Flink's ``numRecordsIn``); 0 for a source.
    records_in: int
    #: Records it emitted, side outputs included (Flink's ``numRecordsOut``).
    records_out: int
    #: The last watermark it received (``currentInputWatermark``; MIN_TIMESTAMP before any).
    input_watermark: int
    #: The last watermark it emitted (``currentOutputWatermark``).
    output_watermark: int


@dataclass(frozen=True, slots=True)
class SubtaskMetrics:
    """One subtask attempt's counters at ``timestamp_ns`` (Flink's task scope)."""

    attempt_id: ExecutionAttemptID
    #: Monotonic nanoseconds of the reporting process: rates divide by differences of it,
    #: which is sound because every report of an attempt comes from the same process.
    timestamp_ns: int
    #: Records into the task's head operator (``numRecordsIn``; 0 for a source task).
    records_in: int
    #: Records the task sent to its network outputs (``numRecordsOut``; 0 for a sink task).
    records_out: int
    #: Nanoseconds since the task started that it was neither idle nor backpressured.
    busy_ns: int
    #: Nanoseconds it waited for input (or, a source, for its reader to have data).
    idle_ns: int
    #: Nanoseconds it waited for output credit: a consumer downstream was slower.
    backpressured_ns: int
    #: The last watermark the head operator processed.
    input_watermark: int
    #: The lowest of the last watermarks the chain's tail operators emitted.
    output_watermark: int
    operators: tuple[OperatorMetrics, ...]
    #: The task has ended: this is its last report.
    final: bool = False


@dataclass(frozen=True, slots=True)
class MetricsReport:
    """The snapshots one process sends at one time."""

    job_id: str
    subtasks: tuple[SubtaskMetrics, ...]


class MetricsListener(Protocol):
    """Receives metrics reports (the JobMaster; on Spark, the slot's control connection).

    Called from any thread; must return quickly and never block the caller on the
    receiver's own work."""

    def report_metrics(self, report: MetricsReport) -> None: ...
