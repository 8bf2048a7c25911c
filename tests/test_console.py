"""chandy owns the console of the job it runs: Ctrl-C and SIGTERM end a job in one line
that says how to resume it (and the resume works), a cancel is not a traceback, a detached
job says where its REST API is, and Spark without Java is one clear error.

Every job here is a real process: on a real pseudo-terminal (Ctrl-C typed into it, so the
terminal sends SIGINT to the foreground process group as a shell's would) or on pipes, with
real signals, and Spark where Spark matters.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHANDY = os.path.join(os.path.dirname(sys.executable), "chandy")
JOB = str(ROOT / "tests" / "scripts" / "console_job.py")
N, KEYS = 3000, 10  # console_job.py's

#: What must never reach the console of a job that was interrupted or terminated.
NOISE = ("Traceback", "KeyboardInterrupt", "ConnectionRefusedError", "ERROR", "is lost", "Exception")


def job_env(mark: str, **config: object) -> dict[str, str]:
    """The environment of a job process: chandy from this checkout, ``config`` as its
    base configuration, and ``mark`` in the environment of every process it starts (Spark's
    JVM, its Python workers and chandy's slot processes inherit it), to find them later."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CHANDY_TEST_MARK": mark}
    env.pop("PYSPARK_PYTHON", None)
    env.pop("CHANDY_CONFIG", None)
    if config:
        env["CHANDY_CONFIG"] = json.dumps(config)
    return env


def marked_processes(mark: str) -> list[int]:
    """The live processes whose environment holds ``mark``."""
    found = []
    needle = f"CHANDY_TEST_MARK={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                if "zombie" not in (entry / "status").read_text():
                    found.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return found


def wait_for(condition: Callable[[], object], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def checkpoint_written(directory: Path) -> Callable[[], bool]:
    return lambda: any(directory.glob("*/chk-*/_metadata"))


def _take_terminal() -> None:
    """In the child, after setsid(): make its stdin (the pseudo-terminal) its controlling
    terminal, so that ^C typed into it sends SIGINT to its foreground process group."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class OnTerminal:
    """A process whose stdin, stdout and stderr are a new pseudo-terminal (its controlling
    terminal): what it shows there is read as it comes; :meth:`type_ctrl_c` is the user's
    Ctrl-C."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout: int | None = None) -> None:
        self.controller, terminal = pty.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
        self.process = subprocess.Popen(
            argv,
            stdin=terminal,
            stdout=terminal if stdout is None else stdout,
            stderr=terminal,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=_take_terminal,
        )
        os.close(terminal)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.controller, 65536)
            except OSError:  # EIO: every process holding the terminal closed it
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    @property
    def shown(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def type_ctrl_c(self) -> None:
        os.write(self.controller, b"\x03")

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        """Wait for the process and for everything anything wrote to the terminal."""
        try:
            code = self.process.wait(timeout)
            self._reader.join(timeout)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            os.close(self.controller)
        return code, self.shown


def lines_of(text: str) -> list[str]:
    return [line for line in text.replace("\r\n", "\n").split("\n") if line.strip()]


def the_one_line(text: str, how: str) -> str:
    ended = [line for line in lines_of(text) if f"cancelled ({how})" in line]
    assert len(ended) == 1, text[-4000:]
    return ended[0]


def assert_quiet(text: str) -> None:
    for noise in NOISE:
        assert noise not in text, f"{noise!r} reached the console:\n{text[-4000:]}"


def resume_command_path(line: str) -> str:
    match = re.search(r"`chandy run -s (\S+) \S+`", line)
    assert match, line
    return match[1]


@pytest.mark.slow
def test_ctrl_c_under_chandy_run_on_spark_ends_in_one_line_and_its_checkpoint_resumes(
    tmp_path: Path,
) -> None:
    mark = uuid.uuid4().hex
    checkpoints = tmp_path / "ck"
    job = OnTerminal([CHANDY, "run", JOB, str(checkpoints), "paced"], job_env(mark, **{"rest.port": 0}))
    try:
        wait_for(checkpoint_written(checkpoints), "a completed checkpoint")
        job.type_ctrl_c()
    finally:
        code, shown = job.finish()
    assert code == 130, shown[-4000:]  # chandy run's status: the job died of SIGINT, as a shell reports it
    line = the_one_line(shown, "Ctrl-C")
    assert_quiet(shown)
    path = resume_command_path(line)
    assert (Path(path) / "_metadata").is_file()
    assert "execution.state-recovery.path" in line
    # everything the job started ended with it: Spark's JVM, its workers, the slot processes
    wait_for(lambda: not marked_processes(mark), "the job's processes to end", 60)

    # the command the line gives resumes the job (on the local executor: no second Spark start)
    resumed = subprocess.run(
        [CHANDY, "run", "-s", path, "-D", "execution.target=local", JOB, str(tmp_path / "ck2"), "finish"],
        capture_output=True,
        text=True,
        timeout=300,
        env=job_env(uuid.uuid4().hex, **{"rest.port": 0}),
        cwd=ROOT,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    counts: dict[int, list[int]] = {}
    for printed in resumed.stdout.splitlines():
        key, count = printed.split("> ", 1)[1].split()
        counts.setdefault(int(key), []).append(int(count))
    assert sorted(counts) == list(range(KEYS))
    # exactly once: each key's count continues from the checkpoint to N / KEYS, and what the
    # checkpoint had counted plus what this run counted is every record once
    assert all(seen == list(range(seen[0], N // KEYS + 1)) for seen in counts.values()), counts
    restored = sum(seen[0] - 1 for seen in counts.values())
    assert restored > 0 and restored + sum(len(seen) for seen in counts.values()) == N


@pytest.mark.slow
@pytest.mark.parametrize("how", ["Ctrl-C", "SIGTERM"])
def test_chandy_run_with_a_master_passes_ctrl_c_and_sigterm_to_the_job_which_ends_in_one_line(
    tmp_path: Path, how: str
) -> None:
    """``chandy run --master ...`` is spark-submit, whose JVM is the Spark driver and the
    job's Python its child: the job cancels in order (no slot reported lost, no Spark error)
    and says how to resume, and everything it started ends."""
    mark = uuid.uuid4().hex
    checkpoints = tmp_path / "ck"
    job = OnTerminal(
        [CHANDY, "run", "--master", "local[2]", JOB, str(checkpoints), "paced"],
        job_env(mark, **{"rest.port": 0}),
    )
    try:
        wait_for(checkpoint_written(checkpoints), "a completed checkpoint")
        if how == "Ctrl-C":
            job.type_ctrl_c()
        else:
            job.process.send_signal(signal.SIGTERM)  # to chandy run alone, as a supervisor does
    finally:
        code, shown = job.finish()
    assert code == (130 if how == "Ctrl-C" else 143), shown[-4000:]
    line = the_one_line(shown, how)
    assert_quiet(shown)
    assert (Path(resume_command_path(line)) / "_metadata").is_file()
    wait_for(lambda: not marked_processes(mark), "the job's processes to end", 60)


@pytest.mark.slow
def test_sigterm_on_spark_ends_in_one_line_with_status_143_and_nothing_after(tmp_path: Path) -> None:
    """``timeout 30 python job.py``: the pipes are read until every process holding them
    (Spark's JVM and workers inherit them) closed them, so what they would print after the
    driver is gone is caught too."""
    mark = uuid.uuid4().hex
    checkpoints = tmp_path / "ck"
    process = subprocess.Popen(
        [sys.executable, JOB, str(checkpoints), "paced"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=job_env(mark, **{"rest.port": 0}),
        cwd=ROOT,
    )
    try:
        wait_for(checkpoint_written(checkpoints), "a completed checkpoint")
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    shown = out.decode(errors="replace") + err.decode(errors="replace")
    assert process.returncode == 128 + signal.SIGTERM, shown[-4000:]
    line = the_one_line(shown, "SIGTERM")
    assert_quiet(shown)
    assert (Path(resume_command_path(line)) / "_metadata").is_file()
    wait_for(lambda: not marked_processes(mark), "the job's processes to end", 60)


@pytest.mark.slow
def test_ctrl_c_of_python_job_py_dies_of_sigint_without_a_traceback(tmp_path: Path) -> None:
    """``python job.py`` (local executor): one line, and the process dies of SIGINT, which a
    shell reports as 130."""
    checkpoints = tmp_path / "ck"
    env = job_env(uuid.uuid4().hex, **{"execution.target": "local", "rest.port": 0})
    job = OnTerminal([sys.executable, JOB, str(checkpoints), "paced"], env)
    try:
        wait_for(checkpoint_written(checkpoints), "a completed checkpoint")
        job.type_ctrl_c()
    finally:
        code, shown = job.finish()
    assert code == -signal.SIGINT, shown[-4000:]
    line = the_one_line(shown, "Ctrl-C")
    assert_quiet(shown)
    assert (Path(resume_command_path(line)) / "_metadata").is_file()


def test_the_line_says_how_to_keep_checkpoints_when_the_retention_deletes_them(tmp_path: Path) -> None:
    """Flink's default retention deletes a cancelled job's checkpoints: no path is given
    (it would be gone), the setting that keeps them is."""
    from chandy import StreamExecutionEnvironment
    from chandy.runtime import console
    from chandy.runtime.job_master import JobMaster
    from chandy.runtime.local_executor import LocalExecutor

    def ended(settings: dict[str, object]) -> str:
        env = StreamExecutionEnvironment.get_execution_environment(settings, executor="local")
        env.from_collection([1, 2, 3]).add_sink(lambda value: None)
        job_master = JobMaster(env._build_job_graph("tiny"), LocalExecutor())
        job_master.run()
        return console.interrupted_line(job_master, "Ctrl-C")

    deleted = ended({"execution.checkpointing.interval": "1 s", "execution.checkpointing.dir": str(tmp_path)})
    assert "checkpoints were deleted" in deleted and "chandy run -s" not in deleted
    assert "execution.checkpointing.externalized-checkpoint-retention=RETAIN_ON_CANCELLATION" in deleted
    assert "checkpointing is off" in ended({})


@pytest.mark.slow
@pytest.mark.parametrize("submit", [[], ["--master", "local[2]"]], ids=["python", "spark-submit"])
def test_a_detached_job_whose_rest_port_is_taken_says_where_it_serves_and_a_cancel_is_one_line(
    tmp_path: Path, submit: list[str]
) -> None:
    """With ``--master`` too: spark-submit's JVM passes on no file descriptors, only the
    environment, and the address still reaches ``chandy run``."""
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    log = tmp_path / "job.log"
    try:
        started = subprocess.run(
            [
                CHANDY,
                "run",
                *submit,
                "--detached",
                "--log-file",
                str(log),
                "-D",
                f"rest.port={port}",
                "-D",
                "execution.target=local",
                JOB,
                str(tmp_path / "ck"),
                "paced",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=job_env(uuid.uuid4().hex),
            cwd=ROOT,
        )
        assert started.returncode == 0, started.stderr
        job_id = re.search(r"JobID (\w+)", started.stdout)[1]  # type: ignore[index]
        served = re.search(r"REST API at (http://127\.0\.0\.1:(\d+)), dashboard (\S+)", started.stdout)
        assert served, started.stdout
        assert int(served[2]) != port
        assert served[3] == f"{served[1]}/#/jobs/{job_id}"
        wait_for(lambda: f"REST API at {served[1]}" in log.read_text(), "the address in the log")
        pid = int(re.search(r"process (\d+)", started.stdout)[1])  # type: ignore[index]

        cancelled = subprocess.run(
            [CHANDY, "cancel", "-m", f"127.0.0.1:{served[2]}", job_id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cancelled.returncode == 0, cancelled.stderr
        wait_for(lambda: not alive(pid), "the job to end")
    finally:
        taken.close()
    logged = log.read_text()
    assert "Traceback" not in logged and "JobCancelledError" not in logged, logged
    assert len([line for line in lines_of(logged) if "was cancelled" in line]) == 1, logged


def _fake_java(tmp_path: Path) -> Path:
    home = tmp_path / "java-home"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'Error: Could not create the Java Virtual Machine.' >&2\nexit 1\n")
    java.chmod(0o755)
    return home


def run_job_on_spark(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python job.py`` on Spark, in ``env``, that fails at start (exit code 1)."""
    done = subprocess.run(
        [sys.executable, JOB, str(tmp_path / "ck"), "finish"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    return done


@pytest.mark.slow
def test_spark_without_java_is_one_clear_error(tmp_path: Path) -> None:
    """No ``java`` on PATH and no JAVA_HOME: one line that says what to install, how to
    point at it, and how to run without Spark."""
    env = job_env(uuid.uuid4().hex, **{"rest.port": 0})
    env.pop("JAVA_HOME", None)
    env["PATH"] = str(tmp_path)  # nothing there, java least of all
    done = run_job_on_spark(tmp_path, env)
    assert lines_of(done.stderr) == [lines_of(done.stderr)[0]], done.stderr
    error = done.stderr.strip()
    assert error.startswith("Error: Spark cannot start: it needs Java 17"), error
    assert "JAVA_HOME is not set and there is no `java` on PATH" in error
    assert "apt install openjdk-17-jre-headless" in error and 'executor="local"' in error
    assert "execution.target=local" in error


@pytest.mark.slow
def test_a_java_that_cannot_start_spark_is_one_clear_error_after_what_it_said(tmp_path: Path) -> None:
    env = job_env(uuid.uuid4().hex, **{"rest.port": 0})
    env["JAVA_HOME"] = str(_fake_java(tmp_path))
    done = run_job_on_spark(tmp_path, env)
    assert "Traceback" not in done.stderr and "JAVA_GATEWAY_EXITED" not in done.stderr, done.stderr
    *said, last = lines_of(done.stderr)
    assert "Error: Could not create the Java Virtual Machine." in said  # what the JVM said, then
    assert last.startswith("Error: Spark's JVM exited at start (what it said is above)"), done.stderr
    assert "Java 17" in last and "apt install openjdk-17-jre-headless" in last and "local" in last


def test_spark_logs_at_warn_unless_the_user_chose_its_logging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chandy.runtime.spark.session import user_sets_log_level

    for variable in ("SPARK_CONF_DIR", "SPARK_HOME", "SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS"):
        monkeypatch.delenv(variable, raising=False)
    assert not user_sets_log_level({}, {})
    assert user_sets_log_level({"spark.log.level": "INFO"}, {})
    assert user_sets_log_level({}, {"spark.log.level": "DEBUG"})  # spark-submit --conf
    options = "-Dlog4j2.configurationFile=/etc/my-log4j2.properties"
    assert user_sets_log_level({"spark.driver.extraJavaOptions": options}, {})
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert not user_sets_log_level({}, {})
    (tmp_path / "log4j2.properties").write_text("rootLogger.level = info\n")
    assert user_sets_log_level({}, {})


def test_a_program_with_its_own_sigterm_handler_keeps_it() -> None:
    """chandy takes SIGTERM only where it is the default; an error of the job's own passes
    through the block unchanged either way."""
    from chandy.runtime import console

    def own(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with pytest.raises(ValueError, match="the job's own"), console.terminate_on_sigterm():
            assert signal.getsignal(signal.SIGTERM) is own
            raise ValueError("the job's own")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with pytest.raises(ValueError, match="the job's own"), console.terminate_on_sigterm():
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            raise ValueError("the job's own")
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back
    finally:
        signal.signal(signal.SIGTERM, previous)
