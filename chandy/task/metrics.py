"""What a subtask counts about itself, and the thread that reports it.

The hot path pays per batch, never per record: a chained operator's input and
output are wrapped in a closure that adds ``len(batch)`` to a counter (one call
and one addition for a batch of about a thousand records), and the task's own
input is counted where it hands a batch to the head operator. Times are
measured around the waits only, never around work: the task thread sleeps in
one place (:class:`~chandy.network.wakeup.Wakeup`), for one of two reasons, so

* *idle* is the time it slept with nothing to read (a source: its reader had
  nothing), and the time it waited for mails once its input ended;
* *backpressured* is the time it slept because an output channel had no credit,
  or a send blocked for it: a consumer downstream is slower than this task;
* *busy* is the rest of the wall-clock time: records, timers, checkpoints.

This is Flink's ``idleTimeMsPerSecond`` / ``backPressuredTimeMsPerSecond`` /
``busyTimeMsPerSecond`` split. A wait still in progress counts up to the moment
of the snapshot, so a task asleep for a whole report interval shows as idle in
that interval, not in the next.

Every counter is written by the task's thread only and read by the reporter
thread: in CPython an int attribute is read whole, and the reporter reads the
accumulated time before the start of the wait in progress, so the cumulative
times it reports never go backwards.

:class:`MetricsReporter` is the thread that sends snapshots every
``chandy.metrics.report-interval``; the executor part that hosts tasks owns it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from chandy.core.time import MIN_TIMESTAMP
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.metrics import MetricsReport, OperatorMetrics, SubtaskMetrics
from chandy.network.wakeup import Wakeup
from chandy.task.user_metrics import OperatorMetricGroup

if TYPE_CHECKING:
    from chandy.task.record_writer import RecordWriter

log = logging.getLogger(__name__)


class OperatorCounters:
    """The live counters of one operator of a chain (written by the task thread), and the
    metrics its user functions register (:mod:`chandy.task.user_metrics`)."""

    __slots__ = (
        "operator_id",
        "name",
        "records_in",
        "records_out",
        "input_watermark",
        "output_watermark",
        "user_metrics",
    )

    def __init__(self, operator_id: str, name: str) -> None:
        self.operator_id = operator_id
        self.name = name
        self.records_in = 0
        self.records_out = 0
        self.input_watermark = MIN_TIMESTAMP
        self.output_watermark = MIN_TIMESTAMP
        #: What ``runtime_context.get_metrics_group()`` returns to the operator's functions.
        self.user_metrics = OperatorMetricGroup(name)

    def snapshot(self) -> OperatorMetrics:
        return OperatorMetrics(
            self.operator_id,
            self.name,
            self.records_in,
            self.records_out,
            self.input_watermark,
            self.output_watermark,
            self.user_metrics.snapshot(),
        )


def counting_input(target: Callable[[Any], None], counters: OperatorCounters) -> Callable[[Any], None]:
    """``target`` (an operator's ``process_batch``), counting the records of every batch."""

    def process(batch: Any) -> None:
        counters.records_in += len(batch)
        target(batch)

    return process


def counting_output(target: Callable[[Any], None], counters: OperatorCounters) -> Callable[[Any], None]:
    """``target`` (where an operator emits to), counting the records of every batch."""

    def emit(batch: Any) -> None:
        counters.records_out += len(batch)
        target(batch)

    return emit


def watermark_input(target: Callable[[int], None], counters: OperatorCounters) -> Callable[[int], None]:
    """``target`` (an operator's ``process_watermark``), remembering the watermark."""

    def process(timestamp: int) -> None:
        counters.input_watermark = timestamp
        target(timestamp)

    return process


def watermark_output(target: Callable[[int], None], counters: OperatorCounters) -> Callable[[int], None]:
    """``target`` (where an operator's watermarks go), remembering the watermark."""

    def emit(timestamp: int) -> None:
        counters.output_watermark = timestamp
        target(timestamp)

    return emit


class WaitTimer:
    """The time spent in one kind of wait: accumulated, plus the wait in progress.

    Written by the waiting thread only; :meth:`read` from any thread (see the module
    docstring for why the total it returns never goes backwards)."""

    __slots__ = ("total_ns", "since_ns")

    def __init__(self) -> None:
        self.total_ns = 0
        #: Start of the wait in progress; 0 when none is.
        self.since_ns = 0

    def timed(self, wait: Callable[[Any], object], argument: Any) -> None:
        """``wait(argument)``, its duration added to the total."""
        self.since_ns = start = time.monotonic_ns()
        try:
            wait(argument)
        finally:
            self.total_ns += time.monotonic_ns() - start
            self.since_ns = 0

    def read(self, now_ns: int) -> int:
        total = self.total_ns
        since = self.since_ns
        return total + max(0, now_ns - since) if since else total


class TaskMetrics:
    """The counters of one subtask attempt; :meth:`snapshot` reads them from any thread."""

    __slots__ = ("attempt_id", "started_ns", "idle", "backpressure", "head", "operators", "tails", "writers")

    def __init__(self, attempt_id: ExecutionAttemptID, writers: Sequence[RecordWriter]) -> None:
        self.attempt_id = attempt_id
        self.started_ns = time.monotonic_ns()
        self.idle = WaitTimer()
        self.backpressure = WaitTimer()
        #: The head operator's counters: the task's input is the head's.
        self.head = OperatorCounters("", "")
        self.operators: list[OperatorCounters] = []
        #: Operators whose output leaves the chain (or goes nowhere): the task's output watermark.
        self.tails: list[OperatorCounters] = []
        self.writers = list(writers)

    def bind_chain(self, operators: Sequence[OperatorCounters], tails: Sequence[OperatorCounters]) -> None:
        """The chain's operators, head first (called once, when the chain is built)."""
        self.operators = list(operators)
        self.tails = list(tails)
        if operators:
            self.head = operators[0]

    # -- the task thread's waits ------------------------------------------------

    def wait_idle(self, wakeup: Wakeup, timeout_s: float) -> None:
        """Sleep on ``wakeup`` because there is nothing to do; the time counts as idle."""
        self.idle.timed(wakeup.wait, timeout_s)

    def wait_backpressured(self, wakeup: Wakeup, timeout_s: float) -> None:
        """Sleep on ``wakeup`` for output credit; the time counts as backpressured."""
        self.backpressure.timed(wakeup.wait, timeout_s)

    # -- any thread ---------------------------------------------------------------

    def snapshot(self, final: bool = False) -> SubtaskMetrics:
        """The counters now, waits in progress included up to now."""
        now = time.monotonic_ns()
        idle = self.idle.read(now)
        backpressured = self.backpressure.read(now)
        records_out = 0
        for writer in self.writers:
            records_out += writer.records_out
            backpressured += writer.blocked.read(now)
        busy = max(0, now - self.started_ns - idle - backpressured)
        head = self.head
        tails = self.tails
        return SubtaskMetrics(
            self.attempt_id,
            now,
            head.records_in,
            records_out,
            busy,
            idle,
            backpressured,
            head.input_watermark,
            min(t.output_watermark for t in tails) if tails else MIN_TIMESTAMP,
            tuple(o.snapshot() for o in self.operators),
            final,
        )


class MetricsReporter:
    """Sends the snapshots of this process's running tasks every ``interval_s``.

    Its owner (the local deployment, a Spark slot) registers each task when it starts,
    calls :meth:`task_ended` when it ends (which sends that task's final snapshot at
    once, on the caller's thread, before the caller reports the task's end), and
    :meth:`stop` when it goes, which joins the thread. A failing ``send`` (the driver
    went away) is logged and the reporting goes on: metrics never fail a job.
    """

    def __init__(
        self,
        job_id: str,
        interval_s: float,
        send: Callable[[MetricsReport], None],
        name: str,
        *,
        stop_when_empty: bool = False,
    ) -> None:
        """``stop_when_empty``: the thread ends by itself once every registered task ended
        (for an owner that registers all its tasks before :meth:`start`)."""
        self.job_id = job_id
        self.interval_s = interval_s
        self._send = send
        self._stop_when_empty = stop_when_empty
        self._tasks: dict[ExecutionAttemptID, TaskMetrics] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def register(self, metrics: TaskMetrics) -> None:
        with self._lock:
            self._tasks[metrics.attempt_id] = metrics

    def task_ended(self, attempt_id: ExecutionAttemptID) -> None:
        """Send the task's last snapshot now, and stop reporting it."""
        with self._lock:
            metrics = self._tasks.pop(attempt_id, None)
        if metrics is not None:
            self._deliver(MetricsReport(self.job_id, (metrics.snapshot(final=True),)))

    def report_now(self) -> bool:
        """Send a snapshot of every registered task; False when there is none."""
        with self._lock:
            tasks = list(self._tasks.values())
        if tasks:
            self._deliver(MetricsReport(self.job_id, tuple(t.snapshot() for t in tasks)))
        return bool(tasks)

    def _deliver(self, report: MetricsReport) -> None:
        try:
            self._send(report)
        except Exception as exc:  # noqa: BLE001 - metrics never fail a task or a slot
            log.debug("metrics report of job %s not delivered: %r", self.job_id, exc)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            if not self.report_now() and self._stop_when_empty:
                return

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop reporting and join the thread (any thread but its own); False if it is still
        in a ``send`` after ``timeout_s`` (a connection that takes nothing: its owner closes
        it, which ends the send)."""
        self._stopped.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        return not self._thread.is_alive()
