"""The live status line ``env.execute()`` shows on a terminal.

When stderr is a terminal (and ``chandy.status-line.enabled``), ``execute()``
prints where the dashboard is once, then keeps one line up to date, rewritten
in place with ``\\r``::

    chandy RUNNING 0:42 | in 1.21M rec/s | out 1.21M rec/s | checkpoint 41 (17 ms) | backpressure OK

``in`` is what the sources emit, ``out`` what the last operators of the job
receive, both per second; the checkpoint is the latest completed one; the
backpressure is Flink's label (OK below 10 %, LOW below 50 %, else HIGH) of the
most backpressured vertex, named when it is not OK. The line is cleared when the
job ends. It is written to the terminal only: never to a log, never to a pipe
or a file, so captured output stays exactly the job's own.

The values come from the JobMaster's metrics store; the job-level ones are
asked of the JobMaster thread with one request at a time, so a busy JobMaster
(deploying slots) delays the line rather than queueing requests.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TextIO

from chandy.config import Configuration
from chandy.config.options import MetricOptions
from chandy.messages.status import JobStatus
from chandy.runtime.job_master import JobMaster

#: The fastest the line is redrawn (its values change once per report interval anyway).
MIN_REFRESH_S = 0.1

_CLEAR = "\r\x1b[K"


def dashboard_link(dashboard_url: str, job_id: str) -> str:
    """The dashboard page of one job."""
    return f"{dashboard_url.rstrip('/')}/#/jobs/{job_id}"


def _rate(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def _duration(ms: int) -> str:
    seconds = max(0, ms) // 1000
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def backpressure_label(ms_per_second: float) -> str:
    """Flink's web UI levels of ``backPressuredTimeMsPerSecond``."""
    if ms_per_second < 100:
        return "OK"
    return "LOW" if ms_per_second < 500 else "HIGH"


class StatusLine:
    """A thread that redraws one line on ``stream`` until :meth:`stop`; its owner (the
    ``execute()`` call, through :func:`show_status_line`) starts and stops it."""

    def __init__(
        self,
        job_master: JobMaster,
        stream: TextIO,
        dashboard_url: str | None = None,
        refresh_s: float = 1.0,
    ) -> None:
        self.job_master = job_master
        self.stream = stream
        self.dashboard_url = dashboard_url
        self.refresh_s = max(MIN_REFRESH_S, refresh_s)
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"chandy status line {job_master.job_id}", daemon=True
        )
        self._asked: Future[tuple[JobStatus, dict[str, Any]]] | None = None
        #: The JobMaster thread's latest answer (status unknown until the first one).
        self._job: tuple[JobStatus | None, dict[str, Any]] = (None, {})
        graph = job_master.job_graph
        self._sources = {v.id for v in graph.vertices if v.is_source}
        self._sinks = {v.id for v in graph.vertices if not v.outputs}
        self._names = {v.id: v.name for v in graph.vertices}

    def start(self) -> StatusLine:
        graph = self.job_master.job_graph
        header = f"chandy: job '{graph.job_name}' ({graph.job_id})"
        if self.dashboard_url:
            header += f", dashboard: {dashboard_link(self.dashboard_url, graph.job_id)}"
        self._write(header + "\n")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop redrawing, join the thread, clear the line."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()
        self._write(_CLEAR)

    def _run(self) -> None:
        while not self._stopped.wait(self.refresh_s):
            self._write(_CLEAR + self.render())

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: nothing to show it on
            self._stopped.set()

    def _job_values(self) -> tuple[JobStatus | None, dict[str, Any]]:
        """The latest answer of the JobMaster thread; asks again once it answered."""
        asked = self._asked
        if asked is not None and asked.done():
            if asked.exception() is None:
                self._job = asked.result()
            asked = None
        if asked is None:
            job_master = self.job_master
            self._asked = job_master.call(
                lambda: (job_master.execution_graph.state, job_master.metrics.job_metrics())
            )
        return self._job

    def render(self) -> str:
        """The line's text now, cut to the terminal's width."""
        status, job = self._job_values()
        store = self.job_master.metrics
        records_in = records_out = 0.0
        for subtask in store.subtask_metrics():
            operators = subtask["operators"]
            if not operators or subtask["finished"]:
                continue
            if subtask["vertex_id"] in self._sources:
                records_in += operators[0]["metrics"]["numRecordsOutPerSecond"]
            if subtask["vertex_id"] in self._sinks:
                records_out += operators[-1]["metrics"]["numRecordsInPerSecond"]
        parts = [f"chandy {status.value}" if status is not None else "chandy"]
        if job.get("uptime", 0) > 0:
            parts[0] += f" {_duration(job['uptime'])}"
        parts.append(f"in {_rate(records_in)} rec/s")
        parts.append(f"out {_rate(records_out)} rec/s")
        if job.get("lastCompletedCheckpointId", -1) >= 0:
            parts.append(
                f"checkpoint {job['lastCompletedCheckpointId']} ({job['lastCheckpointDuration']} ms)"
            )
        worst, worst_vertex = 0.0, None
        for vertex_id in self._names:
            value = store.vertex_metrics(vertex_id).get("backPressuredTimeMsPerSecond", 0.0)
            if value > worst:
                worst, worst_vertex = value, vertex_id
        label = backpressure_label(worst)
        if label != "OK" and worst_vertex is not None:
            parts.append(f"backpressure {label} {worst / 10:.0f}% at {self._names[worst_vertex]}")
        else:
            parts.append("backpressure OK")
        return " | ".join(parts)[: self._width() - 1]

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            columns = 0
        return columns if columns > 0 else 80  # a terminal that does not know its size


@contextmanager
def show_status_line(
    job_master: JobMaster,
    config: Configuration,
    dashboard_url: str | None = None,
    stream: TextIO | None = None,
) -> Iterator[StatusLine | None]:
    """Show the status line while the block runs, if ``stream`` (stderr by default) is a
    terminal and ``chandy.status-line.enabled``; otherwise do nothing."""
    stream = stream if stream is not None else sys.stderr
    try:
        on_terminal = stream.isatty()
    except (AttributeError, ValueError):
        on_terminal = False
    if not on_terminal or not config.get(MetricOptions.STATUS_LINE):
        yield None
        return
    line = StatusLine(
        job_master, stream, dashboard_url, config.get(MetricOptions.REPORT_INTERVAL) / 1000
    ).start()
    try:
        yield line
    finally:
        line.stop()
