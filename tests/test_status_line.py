"""The live status line of ``env.execute()``: on a terminal (a real pseudo-terminal, the job in
a subprocess) it shows the dashboard's address and a line rewritten in place, cleared at the
end; through a pipe, and in the log, there is nothing of it."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from chandy.config import Configuration
from chandy.runtime.job_master import JobMaster
from chandy.runtime.local_executor import LocalExecutor
from chandy.runtime.status_line import StatusLine, backpressure_label, show_status_line

JOB = [sys.executable, "-m", "tests.scripts.status_line_job"]
ROOT = Path(__file__).resolve().parent.parent


def run_on_terminal(
    log: Path, *settings: str, argv: list[str] | None = None, stdout: int | None = None
) -> str:
    """Run the job (``argv``, else the status line job) with stdout (unless ``stdout`` says
    where else) and stderr on a new pseudo-terminal; all it wrote there."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    process = subprocess.Popen(
        argv or [*JOB, str(log), *settings],
        stdin=subprocess.DEVNULL,
        stdout=terminal if stdout is None else stdout,
        stderr=terminal,
        cwd=ROOT,
    )
    os.close(terminal)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(controller)
        assert process.wait(120) == 0
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_on_a_terminal_the_line_shows_and_is_cleared_but_never_logged(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    shown = run_on_terminal(log)
    assert "chandy: job 'status line' (" in shown
    assert "dashboard: http://127.0.0.1:" in shown and "/#/jobs/" in shown
    updates = [part for part in shown.split("\r\x1b[K") if part.startswith("chandy RUNNING")]
    assert len(updates) >= 3, shown  # rewritten in place while the job ran (about 2 s)
    assert any(" rec/s | " in u and "in 0 rec/s" not in u for u in updates), updates
    assert any("| checkpoint " in u for u in updates), updates
    # cleared at the end: what follows the last update is the clearing, then the job's own output
    assert shown.rstrip().endswith("\r\x1b[Kdone"), repr(shown[-300:])
    logged = log.read_text()
    assert "Job status line" in logged or "status line" in logged  # the log is written...
    assert "rec/s" not in logged and "\r" not in logged  # ...and holds nothing of the line


@pytest.mark.slow
def test_through_a_pipe_there_is_no_status_line(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    finished = subprocess.run(
        [*JOB, str(log)], stdin=subprocess.DEVNULL, capture_output=True, cwd=ROOT, timeout=120, check=True
    )
    output = finished.stdout.decode() + finished.stderr.decode()
    assert finished.stdout.decode() == "done\n"
    assert "rec/s" not in output and "\r" not in output and "dashboard:" not in output
    assert "rec/s" not in log.read_text()


@pytest.mark.slow
def test_other_output_is_never_glued_to_the_line() -> None:
    """The job prints, logs and warns while the line is up: each time the line is cleared
    first and drawn again after, so every line of theirs is whole and the status line never
    runs into one (it used to: ``backpressure OKprocessing 50``)."""
    shown = run_on_terminal(Path(os.devnull), argv=[sys.executable, "-m", "tests.scripts.chatty_job"])
    drawn = re.findall(r"chandy RUNNING[^\r]*", shown)
    assert len(drawn) >= 3, shown
    for line in drawn:  # each drawing of the line ends where it is cleared, never in other text
        assert "\n" not in line, repr(line)
    assert re.findall(r"(?:^|\n|\x1b\[K)(processing \d+)\r?\n", shown) == [
        f"processing {n}" for n in range(50, 1001, 50)
    ], shown
    assert len(re.findall(r"(?:^|\n|\x1b\[K)WARNING a log record at \d+\r?\n", shown)) == 5, shown
    assert len(re.findall(r"(?:^|\n|\x1b\[K)\S+:\d+: UserWarning: a warning", shown)) == 5, shown
    assert shown.rstrip().endswith("\r\x1b[Kdone"), repr(shown[-300:])


@pytest.mark.slow
def test_with_stdout_not_a_terminal_there_is_no_line_even_on_a_terminal_stderr(tmp_path: Path) -> None:
    """``python job.py > out.txt`` on a terminal: the line would be drawn between lines of
    the job's that are not there, so there is none."""
    out = tmp_path / "out.txt"
    with out.open("wb") as file:
        shown = run_on_terminal(tmp_path / "job.log", stdout=file.fileno())
    assert "rec/s" not in shown and "dashboard:" not in shown, shown
    assert out.read_text() == "done\n"


@pytest.mark.slow
def test_the_setting_turns_it_off_on_a_terminal(tmp_path: Path) -> None:
    shown = run_on_terminal(tmp_path / "job.log", "chandy.status-line.enabled=false")
    assert "rec/s" not in shown and "dashboard:" not in shown
    assert shown.replace("\r\n", "\n") == "done\n"


class Terminal(io.StringIO):
    """What the status line writes, as if it were a terminal."""

    def isatty(self) -> bool:
        return True


def test_the_line_after_a_job_names_its_state_and_is_cleared() -> None:
    from chandy import StreamExecutionEnvironment

    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.from_collection([1, 2, 3]).add_sink(lambda value: None)
    job_master = JobMaster(env._build_job_graph("tiny"), LocalExecutor())
    job_master.run()
    line = StatusLine(job_master, Terminal(), None)
    line._job_values()  # the first answer, given at once now the job ended
    assert line.render().startswith("chandy FINISHED | in 0 rec/s | out 0 rec/s")
    stream = Terminal()
    with show_status_line(
        job_master, Configuration({"chandy.metrics.report-interval": "10 s"}), None, stream, Terminal()
    ):
        pass
    assert stream.getvalue() == f"chandy: job 'tiny' ({job_master.job_id})\n\r\x1b[K"


def test_backpressure_levels_are_flinks() -> None:
    assert [backpressure_label(v) for v in (0, 99.9, 100, 499, 500, 1000)] == [
        "OK",
        "OK",
        "LOW",
        "LOW",
        "HIGH",
        "HIGH",
    ]


@pytest.mark.slow
def test_a_slow_map_shows_its_real_rate_while_its_batch_flows() -> None:
    """Source, slow map and sink in one chain (no network output): the source's first batch
    of 1,024 records takes the map about 5 s. The counts move while it works through it (in
    chunks of half the report interval), so the line shows the records' rate long before the
    batch is done, not ``out 0 rec/s`` until then."""
    from chandy import StreamExecutionEnvironment
    from tests.jobs import Throttle

    env = StreamExecutionEnvironment.get_execution_environment(
        {"chandy.metrics.report-interval": "100 ms", "rest.port": 0}, executor="local"
    )
    env.set_parallelism(1)
    env.from_sequence(1, 10**6).map(Throttle(0.005)).add_sink(lambda value: None)
    client = env.execute_async("slow map")
    job_master = client._job_master
    line = StatusLine(job_master, Terminal(), None)

    def sink_count() -> int:
        for subtask in job_master.metrics.subtask_metrics():
            return int(subtask["operators"][-1]["metrics"]["numRecordsIn"])
        return 0

    try:
        while True:
            rendered = line.render()
            rate = re.search(r"\| out (\S+) rec/s", rendered)
            assert rate, rendered
            counted = sink_count()
            if rate[1] != "0":
                break
            assert counted < 1024, f"the whole first batch went through before any rate: {rendered}"
            time.sleep(0.02)
        assert counted < 1024, rendered  # shown while the first batch was still flowing
        assert re.search(r"\| in [1-9]\S* rec/s", rendered), rendered
    finally:
        client.cancel()
        env.close()
