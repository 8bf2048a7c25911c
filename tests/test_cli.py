"""The ``chandy`` command, run for real: the installed console script as a subprocess, jobs it
starts, their REST API, and checkpoints on disk. Click's CliRunner only for argument errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from chandy import StreamExecutionEnvironment
from chandy.api.environment import CONFIG_ENV_VAR
from chandy.cli.main import cli
from chandy.config.options import RecoveryClaimMode, StateRecoveryOptions
from chandy.errors import ConfigurationError
from tests.state_backends import on_rocksdb_too

#: The entry point installed beside the interpreter that runs the tests (.venv/bin/chandy),
#: not whichever ``chandy`` comes first on PATH (another environment's, or none).
CHANDY = os.path.join(os.path.dirname(sys.executable), "chandy")


@pytest.fixture(autouse=True)
def _chandy_installed() -> None:
    if not os.access(CHANDY, os.X_OK):
        pytest.fail("the chandy command is not installed: run ./setup.sh (or pip install -e .)")


#: A keyed count over 0..N-1 (uids on every stateful operator). ``first``: paced, cancels
#: itself once a checkpoint is retained; ``serve``: slowly paced, with its REST API (logged at
#: start), until it is stopped or cancelled from outside; ``second``: runs to the end and writes
#: what it saw. The program sets no parallelism and no restore path: those come from ``chandy run``.
COUNT_JOB = textwrap.dedent(
    """
    import glob, json, logging, sys, time

    from chandy import StreamExecutionEnvironment
    from chandy.core.functions import KeyedProcessFunction
    from chandy.core.state import ValueStateDescriptor

    N, KEYS = 30000, 30


    class Count(KeyedProcessFunction):
        def open(self, runtime_context):
            self.count = runtime_context.get_state(ValueStateDescriptor("count"))
            self.subtask = runtime_context.get_index_of_this_subtask()

        def process_element(self, value, ctx):
            count = (self.count.value() or 0) + 1
            self.count.update(count)
            yield ctx.get_current_key(), count, self.subtask


    mode, directory, out = sys.argv[1:4]
    PAUSE = {"first": 0.002, "serve": 0.01}.get(mode, 0)
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.enable_checkpointing(50)
    env.configure({
        "execution.checkpointing.dir": directory,
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "chandy.rest.enabled": mode == "serve",
        # paced: a barrier (and a cancel) waits behind one batch of 10 paced records, not 1024
        "chandy.network.batch-size": 10 if PAUSE else 1024,
    })
    if mode == "serve":
        logging.basicConfig(level=logging.INFO)  # the log names the REST API's address


    def pace(x):
        time.sleep(PAUSE)
        return x


    stream = (
        env.from_sequence(0, N - 1).uid("numbers").map(pace).uid("pace")
        .key_by(lambda x: x % KEYS).process(Count()).uid("count")
    )
    if mode == "serve":
        # execute() keeps the REST API up after the job ended until the outcome of a stop was fetched
        stream.filter(lambda r: False).print()
        env.execute()
        sys.exit(0)
    results = stream.execute_and_collect()
    if mode == "first":
        next(results)
        while not glob.glob(directory + "/*/chk-*/_metadata"):
            time.sleep(0.02)
        results.close()  # cancels the job; RETAIN_ON_CANCELLATION keeps its checkpoint
        sys.exit(0)
    records = list(results)
    final = {}
    for key, count, _ in records:
        final[key] = max(final.get(key, 0), count)
    with open(out, "w") as f:
        json.dump({"records": len(records), "final": final, "subtasks": sorted({r[2] for r in records})}, f)
    """
)


def chandy(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``chandy`` command."""
    return subprocess.run(
        [CHANDY, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------- CHANDY_CONFIG


def test_chandy_config_is_the_base_configuration_and_the_program_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        CONFIG_ENV_VAR, json.dumps({"parallelism.default": 4, "execution.state-recovery.path": "/cli/path"})
    )
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    assert env.get_parallelism() == 4
    assert env.get_configuration().get_string("execution.state-recovery.path") == "/cli/path"
    env.set_parallelism(2)
    env.configure({"execution.state-recovery.path": "/program/path"})
    assert env.get_parallelism() == 2
    assert env.get_configuration().get_string("execution.state-recovery.path") == "/program/path"
    # a configuration given to the constructor is the program's too
    assert StreamExecutionEnvironment({"parallelism.default": 3}).get_parallelism() == 3


def test_the_program_wins_over_chandy_config_under_any_spelling_of_a_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        CONFIG_ENV_VAR,
        json.dumps(
            {"execution.state-recovery.path": "/cli/new-name", "execution.savepoint-restore-mode": "CLAIM"}
        ),
    )
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.configure({"execution.savepoint.path": "/program/old-name"})  # the key's deprecated alias
    env.configure({"execution.state-recovery.claim-mode": "NO_CLAIM"})  # the new name of the CLI's alias
    config = env.get_configuration()
    assert config.get(StateRecoveryOptions.PATH) == "/program/old-name"
    assert config.get(StateRecoveryOptions.CLAIM_MODE) is RecoveryClaimMode.NO_CLAIM


@pytest.mark.parametrize(
    ("value", "complaint"),
    [("{bad json", "not valid JSON"), ("[1, 2]", "got a JSON list"), ('"p=4"', "got a JSON str")],
)
def test_a_malformed_chandy_config_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, value: str, complaint: str
) -> None:
    monkeypatch.setenv(CONFIG_ENV_VAR, value)
    with pytest.raises(ConfigurationError, match="CHANDY_CONFIG") as info:
        StreamExecutionEnvironment.get_execution_environment(executor="local")
    assert complaint in str(info.value)


# ---------------------------------------------------------------------- chandy run


def test_run_passes_settings_arguments_and_exit_code(tmp_path: Path) -> None:
    job = tmp_path / "show.py"
    job.write_text(
        textwrap.dedent(
            """
            import json, sys
            from chandy import StreamExecutionEnvironment
            env = StreamExecutionEnvironment.get_execution_environment(executor="local")
            print(json.dumps({"args": sys.argv[1:], "config": env.get_configuration().to_dict()}))
            sys.exit(int(sys.argv[1]))
            """
        )
    )
    result = chandy(
        "run", str(job), "3", "--input", "x", "-p", "4", "-s", "/some/chk-7", "--allow-non-restored-state",
        "--claim-mode", "claim", "-D", "pipeline.name=from cli", "-D", "execution.checkpointing.dir=/c=d",
        "--", "-p", "9",
        env={CONFIG_ENV_VAR: json.dumps(
            {"parallelism.default": 7, "execution.checkpointing.savepoint-dir": "/kept"}
        )},
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    assert shown["args"] == [
        "3",
        "--input",
        "x",
        "-p",
        "9",
    ]  # unknown options and what follows -- are the job's
    assert shown["config"] == {
        "parallelism.default": 4,
        "execution.state-recovery.path": "/some/chk-7",
        "execution.state-recovery.ignore-unclaimed-state": True,
        "execution.state-recovery.claim-mode": "CLAIM",
        "pipeline.name": "from cli",
        "execution.checkpointing.dir": "/c=d",
        # CHANDY_CONFIG from the shell is the base, the options override it
        "execution.checkpointing.savepoint-dir": "/kept",
        "execution.target": "local",
    }
    assert "JobID" not in result.stdout  # not fixed, so not known before the job starts


@pytest.mark.slow
def test_run_restores_from_a_retained_checkpoint_at_another_parallelism(tmp_path: Path) -> None:
    job = tmp_path / "count.py"
    job.write_text(COUNT_JOB)
    first = chandy("run", "-p", "2", str(job), "first", str(tmp_path / "ck"), str(tmp_path / "unused.json"))
    assert first.returncode == 0, first.stderr
    retained = [p.parent for p in (tmp_path / "ck").glob("*/chk-*/_metadata")]
    assert len(retained) == 1

    out = tmp_path / "second.json"
    second = chandy(
        "run", str(job), "second", str(tmp_path / "ck2"), str(out), "-p", "3", "-s", str(retained[0])
    )
    assert second.returncode == 0, second.stderr
    result = json.loads(out.read_text())
    # -p 3 reached the job: three subtasks of the counter emitted
    assert result["subtasks"] == [0, 1, 2]
    # -s reached it: the source resumed (fewer than N records this time) and every count
    # continued from the checkpoint to exactly N / KEYS
    assert 0 < result["records"] < 30000
    assert result["final"] == {str(k): 1000 for k in range(30)}


def test_a_sigterm_to_chandy_run_reaches_the_job(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    job = tmp_path / "sleeper.py"
    job.write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    runner = subprocess.Popen([CHANDY, "run", str(job)])
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert runner.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    job_pid = int(pid_file.read_text())
    try:
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=60) == 128 + signal.SIGTERM  # the job's exit status, as a shell reports it
        assert not alive(job_pid)
    finally:
        if alive(job_pid):
            os.kill(job_pid, signal.SIGKILL)


def _shipped_module(tmp_path: Path) -> Path:
    """A module the job's functions import, in a zip of its own (not on the job's path)."""
    shipped = tmp_path / "deps.zip"
    with zipfile.ZipFile(shipped, "w") as archive:
        archive.writestr("shipped_double.py", "def double(x):\n    return x * 2\n")
    return shipped


@pytest.mark.slow
def test_run_with_master_submits_through_spark_submit(tmp_path: Path) -> None:
    job = tmp_path / "on_spark.py"
    job.write_text(
        textwrap.dedent(
            """
            import json, sys
            from pyspark.sql import SparkSession
            from chandy import StreamExecutionEnvironment
            from shipped_double import double  # from --py-files: travels by name to the slots
            env = StreamExecutionEnvironment.get_execution_environment()  # spark-submit's session
            env.configure({"chandy.rest.enabled": False})
            doubled = sorted(env.from_sequence(1, 100).map(double).execute_and_collect())
            context = SparkSession.builder.getOrCreate().sparkContext
            with open(sys.argv[1], "w") as f:
                json.dump(
                    {"master": context.master, "app": context.appName, "sum": sum(doubled),
                     "parallelism": env.get_parallelism()},
                    f,
                )
            """
        )
    )
    out = tmp_path / "out.json"
    shipped = _shipped_module(tmp_path)
    # with a bare PATH: spark-submit is the one beside chandy's interpreter, and the driver runs on
    # that interpreter (not on a `python3` from PATH, which may lack chandy and PySpark).
    # local[3], not the local[2] a job of parallelism 2 would start by itself: spark-submit's
    # master stands, and so does the application's name spark-submit gives (the file's)
    result = chandy(
        "run",
        "--master",
        "local[3]",
        "--py-files",
        str(shipped),
        str(job),
        str(out),
        "-p",
        "2",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(out.read_text()) == {
        "master": "local[3]",
        "app": "on_spark.py",
        "sum": 10100,
        "parallelism": 2,
    }


def test_run_puts_py_files_on_the_jobs_path_without_a_master(tmp_path: Path) -> None:
    job = tmp_path / "local_job.py"
    job.write_text(
        textwrap.dedent(
            """
            import sys
            from chandy import StreamExecutionEnvironment
            from shipped_double import double
            env = StreamExecutionEnvironment.get_execution_environment(executor="local")
            env.configure({"chandy.rest.enabled": False})
            total = sum(env.from_sequence(1, 10).map(double).execute_and_collect())
            open(sys.argv[1], "w").write(str(total))
            """
        )
    )
    out = tmp_path / "out.txt"
    result = chandy("run", "-pyfs", str(_shipped_module(tmp_path)), str(job), str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert out.read_text() == "110"
    missing = CliRunner().invoke(cli, ["run", "--py-files", str(tmp_path / "nope.zip"), str(job)])
    assert missing.exit_code == 1 and "--py-files: " in missing.output and "does not exist" in missing.output


def test_run_usage_errors_are_one_line(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text("")
    runner = CliRunner()
    bad_pair = runner.invoke(cli, ["run", str(job), "-D", "no-equals-sign"])
    assert bad_pair.exit_code == 1 and "-D takes key=value" in bad_pair.output
    missing = runner.invoke(cli, ["run", str(tmp_path / "nope.py")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    bad_p = runner.invoke(cli, ["run", str(job), "-p", "0"])
    assert bad_p.exit_code == 2 and "0 is not in the range x>=1" in bad_p.output
    bad_shell = runner.invoke(cli, ["run", str(job)], env={CONFIG_ENV_VAR: "{oops"})
    assert bad_shell.exit_code == 1 and "CHANDY_CONFIG is not valid JSON" in bad_shell.output
    bad_id = runner.invoke(cli, ["run", str(job), "-D", "$internal.pipeline.job-id=42"])
    assert bad_id.exit_code == 1 and "'42' is not a job id" in bad_id.output
    log_without_detached = runner.invoke(cli, ["run", str(job), "--log-file", str(tmp_path / "x.log")])
    assert (
        log_without_detached.exit_code == 1
        and "--log-file is for --detached runs" in log_without_detached.output
    )


def test_run_checks_every_setting_at_submission_even_one_the_job_overrides(tmp_path: Path) -> None:
    """The job sets its own parallelism, so a bad -D parallelism.default used to be ignored
    and the run exit 0; every -D (and CHANDY_CONFIG) is checked before the job starts."""
    job = tmp_path / "job.py"
    job.write_text("raise SystemExit('the job must not start')\n")
    runner = CliRunner()
    bad_value = runner.invoke(cli, ["run", "-D", "parallelism.default=four", str(job)])
    assert bad_value.exit_code == 1, bad_value.output
    assert (
        "-D parallelism.default=...: invalid value for 'parallelism.default': 'four' is not an integer"
        in bad_value.output
    )
    assert "the job must not start" not in bad_value.output
    unknown = runner.invoke(cli, ["run", "-D", "paralelism.default=4", str(job)])
    assert unknown.exit_code == 1
    assert "unknown configuration key 'paralelism.default'; did you mean 'parallelism.default'?" in (
        unknown.output
    )
    shell = runner.invoke(cli, ["run", str(job)], env={CONFIG_ENV_VAR: '{"rest.port": "eighty"}'})
    assert shell.exit_code == 1 and "CHANDY_CONFIG: invalid value for 'rest.port'" in shell.output


# ---------------------------------------------------------------------- REST commands: errors


@pytest.mark.slow
def test_rest_commands_without_a_server_name_the_address(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    for args in (["list"], ["cancel", "a" * 32], ["savepoint", "b" * 32, str(tmp_path)], ["stop", "c" * 32]):
        result = chandy(*args, "-m", address, timeout=60)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith(f"Error: no chandy REST API at {address}") and "-m/--jobmanager" in error


def test_an_address_that_is_not_a_rest_api_is_named_as_such() -> None:
    """Some other HTTP server at -m (here a static file server): its 404 page is no job list."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        result = chandy("list", "-m", address, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"Error: GET /jobs/overview at {address} failed (404) without a JSON error: is this the REST API "
        "of a chandy job (its rest.port)?"
    )


def test_job_ids_and_addresses_are_checked_before_any_request() -> None:
    runner = CliRunner()
    bad_id = runner.invoke(cli, ["cancel", "not-a-job-id"])
    assert bad_id.exit_code == 1 and "'not-a-job-id' is not a job id" in bad_id.output
    bad_address = runner.invoke(cli, ["list", "-m", "localhost"])
    assert bad_address.exit_code == 1 and "-m/--jobmanager takes HOST:PORT" in bad_address.output


# ---------------------------------------------------------------------- REST commands against a running job


@dataclass(frozen=True)
class DetachedJob:
    job_id: str
    pid: int
    log: Path
    address: str


def run_detached(tmp_path: Path, *args: str) -> DetachedJob:
    """``chandy run --detached`` of ``COUNT_JOB serve`` with ``rest.port: 0``; its REST address
    is read from the job's log."""
    job = tmp_path / "count.py"
    job.write_text(COUNT_JOB)
    log = tmp_path / "job.log"
    result = chandy(
        "run", "--detached", "--log-file", str(log), "-D", "rest.port=0", "-D", "pipeline.name=cli test",
        "-p", "2", *args, str(job), "serve", str(tmp_path / "ck"), str(tmp_path / "unused.json"),
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    submitted = re.search(r"^Job has been submitted with JobID ([0-9a-f]{32})$", result.stdout, re.M)
    process = re.search(
        rf"^Its output goes to {re.escape(str(log))} \(process (\d+)\)\.$", result.stdout, re.M
    )
    assert submitted and process, result.stdout
    pid = int(process.group(1))
    deadline = time.monotonic() + 180
    while True:
        served = re.search(r"REST API at http://(127\.0\.0\.1:\d+)/", log.read_text())
        if served:
            return DetachedJob(submitted.group(1), pid, log, served.group(1))
        assert alive(pid), f"the job ended before serving its REST API:\n{log.read_text()}"
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def wait_for_exit(job: DetachedJob, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while alive(job.pid):
        assert time.monotonic() < deadline, job.log.read_text()
        time.sleep(0.1)


def wait_until_running(job: DetachedJob, *extra: str, env: dict[str, str] | None = None) -> str:
    """``chandy list``'s line of the job once it shows RUNNING."""
    deadline = time.monotonic() + 120
    while True:
        listed = chandy("list", "-m", job.address, *extra, env=env, timeout=60)
        assert listed.returncode == 0, listed.stderr
        line = next((ln for ln in listed.stdout.splitlines() if job.job_id in ln), "")
        if line.endswith("(RUNNING)"):
            return line
        assert time.monotonic() < deadline, listed.stdout
        time.sleep(0.2)


#: rest.auth.token takes 16 characters or more.
CLI_TOKEN = "s3cret-token-of-the-cli-tests"


@pytest.mark.slow
def test_a_detached_job_is_listed_savepointed_and_cancelled_with_a_token(tmp_path: Path) -> None:
    savepoints = tmp_path / "savepoints"
    job = run_detached(
        tmp_path,
        "-D",
        f"rest.auth.token={CLI_TOKEN}",
        "-D",
        f"execution.checkpointing.savepoint-dir={savepoints}",
    )
    try:
        no_token = chandy("list", "-m", job.address, timeout=60)
        assert no_token.returncode == 1
        assert f"Error: the REST API at {job.address} requires a token (401 Unauthorized): pass --token" in (
            no_token.stderr
        )
        wrong = chandy("cancel", "-m", job.address, "--token", "a-guess-of-16-chars", job.job_id, timeout=60)
        assert wrong.returncode == 1 and "does not hold the token you passed" in wrong.stderr
        assert "the token was not sent" in wrong.stderr

        token = {"CHANDY_REST_TOKEN": CLI_TOKEN}
        line = wait_until_running(job, env=token)  # the token from the environment
        assert re.fullmatch(
            rf"\d\d\.\d\d\.\d{{4}} \d\d:\d\d:\d\d : {job.job_id} : cli test \(RUNNING\)", line
        )

        taken = chandy("savepoint", "-m", job.address, "--token", CLI_TOKEN, job.job_id, timeout=300)
        assert taken.returncode == 0, taken.stderr
        path = re.search(r"^Savepoint completed\. Path: (.+)$", taken.stdout, re.M)
        assert path and Path(path.group(1)).parent == savepoints, taken.stdout
        inspected = chandy("checkpoint", "inspect", path.group(1), "--json", timeout=60)
        assert inspected.returncode == 0, inspected.stderr
        report = json.loads(inspected.stdout)
        assert (report["checkpoint_type"], report["job_id"], report["valid"]) == (
            "SAVEPOINT",
            job.job_id,
            True,
        )

        unknown = chandy("cancel", "-m", job.address, "--token", CLI_TOKEN, "f" * 32, timeout=60)
        assert unknown.returncode == 1 and f"Error: no job {'f' * 32} at {job.address}" in unknown.stderr

        cancelled = chandy("cancel", "-m", job.address, "--token", CLI_TOKEN, job.job_id, timeout=60)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.splitlines() == [
            f"Cancelling job {job.job_id}.",
            f"Cancelled job {job.job_id}.",
        ]
        wait_for_exit(job)
        assert "was cancelled" in job.log.read_text()
    finally:
        if alive(job.pid):
            os.kill(job.pid, signal.SIGKILL)
    gone = chandy("list", "-m", job.address, timeout=60)
    assert gone.returncode == 1 and f"Error: no chandy REST API at {job.address}" in gone.stderr


TWO_JOBS = textwrap.dedent(
    """
    import logging, time
    from chandy import StreamExecutionEnvironment

    logging.basicConfig(level=logging.INFO)  # the log names the REST API's address
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.configure({"chandy.network.batch-size": 10})  # a cancel waits behind 10 paced records, not 1024
    env.from_sequence(0, 9).filter(lambda x: False).print()
    env.execute_async("short").get_job_execution_result()


    def pace(x):
        time.sleep(0.01)
        return x


    env.from_sequence(0, 10**6).map(pace).filter(lambda x: False).print()
    env.execute_async("endless").get_job_execution_result()  # raises once it is cancelled
    """
)


@pytest.mark.slow
def test_list_shows_running_and_terminated_jobs_and_run_passes_the_exit_code(tmp_path: Path) -> None:
    job = tmp_path / "two_jobs.py"
    job.write_text(TWO_JOBS)
    log = tmp_path / "out.log"
    with open(log, "wb") as out:  # an attached run: its output is this command's
        runner = subprocess.Popen([CHANDY, "run", str(job), "-D", "rest.port=0"], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 180
        while not (served := re.search(r"REST API at http://(127\.0\.0\.1:\d+)/", log.read_text())):
            assert runner.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        address = served.group(1)
        while True:
            listed = chandy("list", "-m", address, timeout=60)
            assert listed.returncode == 0, listed.stderr
            if "endless (RUNNING)" in listed.stdout:
                break
            assert time.monotonic() < deadline, listed.stdout
            time.sleep(0.2)
        lines = listed.stdout.splitlines()
        assert lines[:2] == ["Waiting for response...", "-" * 18 + " Running/Restarting Jobs " + "-" * 19]
        assert lines[2].endswith(" : endless (RUNNING)") and lines[3] == "-" * 62
        assert lines[4] == "No scheduled jobs."
        assert lines[5] == "-" * 22 + " Terminated Jobs " + "-" * 23
        assert lines[6].endswith(" : short (FINISHED)") and lines[7] == "-" * 62
        endless_id = lines[2].split(" : ")[1]

        running_only = chandy("list", "-m", address, "--running", timeout=60)
        assert "endless (RUNNING)" in running_only.stdout and "short" not in running_only.stdout

        assert chandy("cancel", "-m", address, endless_id, timeout=60).returncode == 0
        assert runner.wait(timeout=120) == 1  # the program's exit code: its job was cancelled
    finally:
        if runner.poll() is None:
            runner.terminate()  # chandy run passes it on to the job
            runner.wait(timeout=60)


@pytest.mark.slow
@on_rocksdb_too()
def test_stop_with_a_savepoint_then_run_from_it_at_another_parallelism(tmp_path: Path) -> None:
    job = run_detached(tmp_path)
    try:
        wait_until_running(job)
        # no directory given and none configured: the API's reason, in one line
        refused = chandy("savepoint", "-m", job.address, job.job_id, timeout=60)
        assert refused.returncode == 1 and "execution.checkpointing.savepoint-dir" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        # a savepoint that fails once triggered (its directory cannot be created): the job's reason
        (tmp_path / "a-file").write_text("")
        unwritable = str(tmp_path / "a-file" / "savepoints")
        failed = chandy("savepoint", "-m", job.address, job.job_id, unwritable)
        assert failed.returncode == 1
        assert failed.stderr.startswith(f"Error: the savepoint of job {job.job_id} failed: ")
        assert "Not a directory" in failed.stderr and len(failed.stderr.strip().splitlines()) == 1
        failed_stop = chandy("stop", "-m", job.address, "--savepoint-path", unwritable, job.job_id)
        assert failed_stop.returncode == 1
        assert (
            f"could not stop job {job.job_id}, it keeps running: the savepoint failed: " in failed_stop.stderr
        )
        assert "Not a directory" in failed_stop.stderr
        wait_until_running(job)  # it does

        # a relative directory is relative to this command's working directory, not to the job's
        stopped = chandy("stop", "-m", job.address, "--savepoint-path", "sp", job.job_id, cwd=tmp_path)
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith(f'Suspending job "{job.job_id}" with a CANONICAL savepoint.')
        path = re.search(r"^Savepoint completed\. Path: (.+)$", stopped.stdout, re.M)
        assert path and Path(path.group(1)).parent == tmp_path / "sp", stopped.stdout
        wait_for_exit(job)
    finally:
        if alive(job.pid):
            os.kill(job.pid, signal.SIGKILL)
    inspected = chandy("checkpoint", "inspect", path.group(1), timeout=60)
    assert inspected.returncode == 0, inspected.stderr
    assert "type:            SYNC_SAVEPOINT, CANONICAL format" in inspected.stdout
    listed = chandy("checkpoint", "list", str(tmp_path / "sp"), "--json", timeout=60)  # a savepoint directory
    assert [(e["path"], e["checkpoint_type"], e["valid"]) for e in json.loads(listed.stdout)] == [
        (path.group(1), "SYNC_SAVEPOINT", True)
    ]

    out = tmp_path / "second.json"
    second = chandy(
        "run",
        "-p",
        "3",
        "-s",
        path.group(1),
        str(tmp_path / "count.py"),
        "second",
        str(tmp_path / "ck2"),
        str(out),
    )
    assert second.returncode == 0, second.stderr
    result = json.loads(out.read_text())
    assert result["subtasks"] == [0, 1, 2] and 0 < result["records"] < 30000
    assert result["final"] == {str(k): 1000 for k in range(30)}


@pytest.mark.slow
def test_stop_of_a_program_that_exits_at_once_finds_the_savepoint_on_disk(tmp_path: Path) -> None:
    """A program that collects its job's results ends (and its REST API with it) as soon as the
    stop finished, before the outcome was fetched: the completed savepoint is found on disk."""
    job = tmp_path / "collecting.py"
    job.write_text(
        textwrap.dedent(
            """
            import logging, time
            from chandy import StreamExecutionEnvironment
            logging.basicConfig(level=logging.INFO)  # the log names the REST API's address
            env = StreamExecutionEnvironment.get_execution_environment(executor="local")
            env.configure({"chandy.network.batch-size": 10})  # the stop waits behind 10 paced records
            def pace(x):
                time.sleep(0.01)
                return x
            for _ in env.from_sequence(0, 10**6).map(pace).execute_and_collect():
                pass
            """
        )
    )
    log = tmp_path / "job.log"
    started = chandy("run", "-d", "--log-file", str(log), "-D", "rest.port=0", str(job), timeout=60)
    assert started.returncode == 0, started.stderr
    submitted = re.search(r"JobID ([0-9a-f]{32})", started.stdout)
    process = re.search(r"\(process (\d+)\)", started.stdout)
    assert submitted and process
    detached = DetachedJob(submitted.group(1), int(process.group(1)), log, "")
    try:
        deadline = time.monotonic() + 180
        while not (served := re.search(r"REST API at http://(127\.0\.0\.1:\d+)/", log.read_text())):
            assert alive(detached.pid) and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        detached = DetachedJob(detached.job_id, detached.pid, log, served.group(1))
        wait_until_running(detached)
        stopped = chandy("stop", "-m", detached.address, "-p", str(tmp_path / "sp"), detached.job_id)
        assert stopped.returncode == 0, stopped.stderr
        path = re.search(r"^Savepoint completed\. Path: (.+)$", stopped.stdout, re.M)
        assert path and Path(path.group(1)).parent == tmp_path / "sp", stopped.stdout
        if "went away" in stopped.stderr:  # the usual case; the API may also have been quick enough
            assert "the savepoint below was found complete on disk" in stopped.stderr
        wait_for_exit(detached)
    finally:
        if alive(detached.pid):
            os.kill(detached.pid, signal.SIGKILL)
    assert chandy("checkpoint", "inspect", path.group(1), timeout=60).returncode == 0


# ---------------------------------------------------------------------- chandy checkpoint


@pytest.fixture(scope="module")
def retained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A retained checkpoint of a keyed job (uids "src" and "counter", state in files)."""
    from tests.test_checkpointing_e2e import retained_checkpoint_of_cancelled_job

    return retained_checkpoint_of_cancelled_job(
        tmp_path_factory.mktemp("retained"),
        **{"execution.checkpointing.data-inline-threshold": 0, "chandy.rest.enabled": False},
    )


def copy_checkpoint(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


@pytest.mark.slow
def test_inspect_shows_operators_uids_state_kinds_key_groups_and_files(retained: Path) -> None:
    result = chandy("checkpoint", "inspect", str(retained), "--json", timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["checkpoint_id"] == int(retained.name.removeprefix("chk-"))
    assert report["job_id"] == retained.parent.name and report["checkpoint_type"] == "CHECKPOINT"
    assert report["format_version"] == 4 and report["checksum"].startswith("ok") and report["valid"]
    assert report["authentication"] == "valid" and "CHANDY_SNAPSHOT_KEY" in report["signature"]
    operators = {op["uid"]: op for op in report["operators"]}
    counter = operators["counter"]
    assert counter["name"] and (counter["parallelism"], counter["max_parallelism"]) == (2, 128)
    assert counter["keyed_states"] == {"count": "value"}
    # the subtasks' key-group ranges partition all 128 key groups
    covered = sorted(g for sub in counter["subtasks"] for a, b in sub["key_groups"] for g in range(a, b + 1))
    assert covered == list(range(128))
    assert counter["state_size"] == sum(sub["state_size"] for sub in counter["subtasks"]) > 0
    source_states = operators["src"]["subtasks"][0]["operator_states"]
    assert source_states["SourceReaderState"] == {"mode": "SPLIT_DISTRIBUTE", "elements": 1}
    assert report["state_files"] and all(f["status"] == "present" for f in report["state_files"])

    text = chandy("checkpoint", "inspect", str(retained / "_metadata"), "--verify", timeout=60)
    assert text.returncode == 0, text.stderr
    assert f"Checkpoint {report['checkpoint_id']} of job {report['job_id']}" in text.stdout
    assert "uid 'counter'" in text.stdout and "    'count': value" in text.stdout
    assert "checksum:        ok" in text.stdout and "(all present)" in text.stdout


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_inspect_refuses_a_corrupt_metadata_naming_the_file(
    retained: Path, tmp_path: Path, damage: str
) -> None:
    broken = copy_checkpoint(retained, tmp_path / retained.name)
    metadata = broken / "_metadata"
    data = bytearray(metadata.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        del data[len(data) - 40 :]
    metadata.write_bytes(bytes(data))
    result = chandy("checkpoint", "inspect", str(broken), timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == result.stderr.strip().splitlines()[0]  # one line
    assert result.stderr.startswith(f"Error: {metadata} is corrupt")


def test_inspect_reports_missing_state_files_and_exits_1(retained: Path, tmp_path: Path) -> None:
    broken = copy_checkpoint(retained, tmp_path / retained.name)
    victim = next(p for p in sorted(broken.iterdir()) if p.name != "_metadata")
    victim.unlink()
    result = chandy("checkpoint", "inspect", str(broken), timeout=60)
    assert result.returncode == 1
    assert "MISSING" in result.stdout and victim.name in result.stdout
    assert "state files of" in result.stderr and "a restore from it would be refused" in result.stderr


@pytest.mark.slow
def test_checkpoint_list_shows_valid_and_broken_checkpoints(retained: Path, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    job_dir = root / retained.parent.name
    good = copy_checkpoint(retained, job_dir / "chk-5")
    corrupt = copy_checkpoint(retained, job_dir / "chk-6")
    (corrupt / "_metadata").write_bytes((corrupt / "_metadata").read_bytes()[:-1] + b"\0")
    incomplete = job_dir / "chk-7"
    incomplete.mkdir()
    (incomplete / "some-state-file").write_bytes(b"x")
    partial = copy_checkpoint(retained, job_dir / "chk-12")
    next(p for p in partial.iterdir() if p.name != "_metadata").unlink()
    (job_dir / "shared").mkdir()

    for directory in (root, job_dir):  # a checkpoint root, or one job's directory
        result = chandy("checkpoint", "list", str(directory), "--json", timeout=60)
        assert result.returncode == 0, result.stderr
        entries = {Path(e["path"]).name: e for e in json.loads(result.stdout)}
        assert list(entries) == ["chk-5", "chk-6", "chk-7", "chk-12"]  # by id, not by name
        assert entries["chk-5"]["valid"] and entries["chk-5"]["checkpoint_type"] == "CHECKPOINT"
        assert entries["chk-5"]["state_size"] > 0 and entries["chk-5"]["timestamp"] > 0
        # the last byte is the signature's: the checksum before it still matches
        assert entries["chk-6"]["problem"] == "_metadata's signature does not verify (corrupt or forged)"
        assert entries["chk-7"]["problem"] == "_metadata does not exist"
        assert entries["chk-12"]["problem"].startswith("1 of ") and "missing" in entries["chk-12"]["problem"]
        assert not any(entries[name]["valid"] for name in ("chk-6", "chk-7", "chk-12"))

    text = chandy("checkpoint", "list", str(root), timeout=60)
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["PATH", "ID", "TYPE", "TIME", "SIZE", "STATUS"]
    assert lines[1].startswith(f"{good.parent.name}/chk-5 ") and lines[1].endswith("valid")
    assert "INVALID: _metadata's signature does not verify (corrupt or forged)" in lines[2]


@pytest.mark.slow
def test_inspect_and_list_check_the_shared_files_of_incremental_checkpoints(tmp_path: Path) -> None:
    from chandy.storage.checkpoint_storage import CheckpointStorage
    from tests.test_completed_checkpoint_store import JOB_ID, finalized_incremental_checkpoint

    storage = CheckpointStorage(str(tmp_path / "checkpoints"), JOB_ID)
    storage.initialize()
    completed = finalized_incremental_checkpoint(storage, tmp_path)
    chk = str(completed.external_pointer)
    shared_dir = Path(storage.job_dir) / "shared"

    result = chandy("checkpoint", "inspect", chk, "--json", timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["format_version"] == 4 and report["valid"]
    shared = sorted(f["path"] for f in report["state_files"] if f["shared"])
    assert shared == sorted(str(p) for p in shared_dir.iterdir()) and len(shared) == 4
    assert len([f for f in report["state_files"] if not f["shared"]]) == 2  # the MANIFESTs
    (operator,) = report["operators"]
    assert [(s["shared_files"], s["private_files"]) for s in operator["subtasks"]] == [(2, 2), (2, 2)]

    text = chandy("checkpoint", "inspect", chk, "--verify", timeout=60)
    assert text.returncode == 0, text.stderr
    assert "6 state files (4 shared with other checkpoints) (all present)" in text.stdout
    assert "incremental (2 shared + 2 private files)" in text.stdout
    assert (
        sum(1 for line in text.stdout.splitlines() if "../shared/" in line and line.endswith("(shared)")) == 4
    )

    damaged, gone = sorted(shared_dir.iterdir())[:2]
    damaged.write_bytes(bytes(b ^ 1 for b in damaged.read_bytes()))  # same size, other bytes
    verified = chandy("checkpoint", "inspect", chk, "--verify", "--json", timeout=60)
    assert verified.returncode == 1
    assert {f["path"]: f["status"] for f in json.loads(verified.stdout)["state_files"]}[str(damaged)] == (
        "checksum mismatch"
    )
    gone.unlink()
    broken = chandy("checkpoint", "inspect", chk, timeout=60)
    assert broken.returncode == 1
    assert "MISSING" in broken.stdout and f"../shared/{gone.name}  (shared)" in broken.stdout
    assert f"(shared state file {gone} (in the job directory's shared/" in broken.stderr
    assert "a restore from it would be refused" in broken.stderr

    listed = chandy("checkpoint", "list", storage.job_dir, "--json", timeout=60)
    (entry,) = json.loads(listed.stdout)
    assert (
        entry["problem"]
        == "1 of 6 state files missing (1 of them shared files in the job directory's shared/)"
    )
