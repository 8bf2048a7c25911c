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
from typing import Literal, Protocol

from chandy.messages.ids import ExecutionAttemptID

#: What a user metric is; it decides how the driver shows it (``UserMetric.value``).
UserMetricKind = Literal["counter", "gauge", "meter", "histogram", "distribution"]


@dataclass(frozen=True, slots=True)
class UserMetric:
    """A metric a user function registered (``runtime_context.get_metrics_group()``), as of
    one report. The description travels with every value: a handful of metrics per
    operator, and the driver then needs no registration protocol (a new attempt's
    metrics simply appear in its reports)."""

    #: The groups from the operator down to the metric, as Flink's metric identifier spells
    #: them (``add_group(key, value)`` contributes both its key and its value).
    scope: tuple[str, ...]
    name: str
    kind: UserMetricKind
    #: A counter's count, a gauge's value (a number, or its ``str`` when it is not one), a
    #: meter's events per second, a histogram's or a distribution's count of values.
    value: int | float | str
    #: A histogram's statistics (``min``, ``max``, ``mean``, ``median``, ``stddev``, ``p75``
    #: ... ``p999``) or a distribution's (``sum``, ``min``, ``max``, ``mean``).
    statistics: tuple[tuple[str, float], ...] = ()
    #: The scope's key-value groups, as (key, value): Prometheus labels (Flink's variables).
    variables: tuple[tuple[str, str], ...] = ()
    #: The scope without the values of its key-value groups (Flink's logical scope): what
    #: Prometheus names the metric by, the values being labels.
    logical_scope: tuple[str, ...] = ()


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
    #: The metrics its user functions registered, in the order they were registered.
    user: tuple[UserMetric, ...] = ()


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
