"""The live status line ``env.execute()`` shows on a terminal.

When stderr is a terminal (and ``chandy.status-line.enabled``), ``execute()``
prints where the dashboard is once, then keeps one line up to date, rewritten
in place with ``\\r``::

    chandy RUNNING 0:42 | in 1.21M rec/s | out 1.21M rec/s | checkpoint 41 (17 ms) | backpressure OK

``in`` is what the sources emit, ``out`` what the last operators of the job
receive, both per second; the checkpoint is the latest completed one; the
backpressure is Flink's label (OK below 10 %, LOW below 50 %, else HIGH) of the
most backpressured vertex, named when it is not OK. The line is cleared when the
job ends. It is written to the terminal only, and only when both stdout and stderr
are one: never to a log, never to a pipe or a file, so captured output stays
exactly the job's own.

Other output never lands on the line: while it is shown, ``sys.stdout`` and
``sys.stderr`` (and the logging handlers writing to them) go through a
:class:`_Interleaved` stream that clears the line before the text and draws it again
after a complete line, so the job's ``print`` output, logs, warnings and Spark's lines
(:mod:`chandy.runtime.spark.session` forwards them through ``sys.stderr``) stay whole.

The values come from the JobMaster's metrics store; the job-level ones are
asked of the JobMaster thread with one request at a time, so a busy JobMaster
(deploying slots) delays the line rather than queueing requests.
"""

from __future__ import annotations

import logging
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
        #: Held while the line or other text is written: the two take turns on the terminal.
        self.lock = threading.RLock()
        #: The line's latest text ("" before the first), and whether it is on the terminal now.
        self._text = ""
        self._shown = False
        #: Whether other output ended with a newline (the line is drawn only at a line's start).
        self.at_line_start = True
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
        with self.lock:
            self._text = ""
            self._write(_CLEAR)

    def _run(self) -> None:
        while not self._stopped.wait(self.refresh_s):
            text = self.render()
            with self.lock:
                self._text = text
                if self.at_line_start and not self._stopped.is_set():
                    self._write(_CLEAR + text)
                    self._shown = True

    # -- other output (under ``lock``, from :class:`_Interleaved`) ---------------------

    def clear_locked(self) -> None:
        """Take the line off the terminal before other text is written."""
        if self._shown:
            self._write(_CLEAR)
            self._shown = False

    def redraw_locked(self) -> None:
        """Show the line again after other text ended a line."""
        if self._text and self.at_line_start and not self._stopped.is_set():
            self._write(self._text)
            self._shown = True

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


class _Interleaved:
    """A text stream (``sys.stdout`` or ``sys.stderr``) whose writes take the status line
    off the terminal first and draw it again after a complete line; everything else is the
    wrapped stream's."""

    def __init__(self, wrapped: TextIO, line: StatusLine) -> None:
        self._wrapped = wrapped
        self._line = line

    def write(self, text: str) -> int:
        line = self._line
        with line.lock:
            line.clear_locked()
            written = self._wrapped.write(text)
            self._wrapped.flush()
            if text:
                line.at_line_start = text.endswith("\n")
            line.redraw_locked()
        return written

    def writelines(self, lines: Any) -> None:
        for text in lines:
            self.write(text)

    def flush(self) -> None:
        self._wrapped.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def _stream_handlers() -> list[logging.StreamHandler[Any]]:
    loggers: list[Any] = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return [
        handler
        for logger in loggers
        if isinstance(logger, logging.Logger)
        for handler in logger.handlers
        if isinstance(handler, logging.StreamHandler)
    ]


@contextmanager
def _interleaved(line: StatusLine) -> Iterator[None]:
    """Route the process's stdout and stderr (and the log handlers writing to them) through
    :class:`_Interleaved` while the block runs."""
    real = {"stdout": sys.stdout, "stderr": sys.stderr}
    wrapped = {name: _Interleaved(stream, line) for name, stream in real.items()}
    by_stream = {id(real[name]): wrapped[name] for name in real}
    swapped = []
    for handler in _stream_handlers():
        proxy = by_stream.get(id(handler.stream))
        if proxy is not None:
            handler.setStream(proxy)
            swapped.append((handler, proxy))
    sys.stdout, sys.stderr = wrapped["stdout"], wrapped["stderr"]
    try:
        yield
    finally:
        if sys.stdout is wrapped["stdout"]:
            sys.stdout = real["stdout"]
        if sys.stderr is wrapped["stderr"]:
            sys.stderr = real["stderr"]
        for handler, proxy in swapped:
            if handler.stream is proxy:
                handler.setStream(proxy._wrapped)


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def show_status_line(
    job_master: JobMaster,
    config: Configuration,
    dashboard_url: str | None = None,
    stream: TextIO | None = None,
    stdout: TextIO | None = None,
) -> Iterator[StatusLine | None]:
    """Show the status line on ``stream`` (stderr by default) while the block runs, if it
    and ``stdout`` (the process's by default) are terminals and ``chandy.status-line.enabled``;
    otherwise do nothing. Shown on the process's own stderr, the process's output goes
    around it (:class:`_Interleaved`)."""
    own = stream is None
    stream = stream if stream is not None else sys.stderr
    stdout = stdout if stdout is not None else sys.stdout
    if not (_is_terminal(stream) and _is_terminal(stdout)) or not config.get(MetricOptions.STATUS_LINE):
        yield None
        return
    line = StatusLine(
        job_master, stream, dashboard_url, config.get(MetricOptions.REPORT_INTERVAL) / 1000
    ).start()
    try:
        if own:
            with _interleaved(line):
                yield line
        else:
            yield line
    finally:
        line.stop()
