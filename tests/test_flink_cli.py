"""Flink's own command-line client (from the apache-flink package) drives a running chandy job.

``flink list``, ``flink savepoint``, ``flink stop --savepointPath`` and ``flink cancel``
with ``-m 127.0.0.1:PORT`` talk to the driver's REST API exactly as they talk to a
Flink JobManager; their Jackson mappers reject a body that lacks a field they expect,
so this is the test of the JSON shapes that matters. ``./setup.sh`` installs the CLI
into ``.cache/flink-cli`` (outside chandy's environment: its pins clash with PySpark's).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chandy import StreamExecutionEnvironment
from chandy.errors import JobCancelledError
from chandy.messages.status import JobStatus
from chandy.runtime.job_client import JobClient
from tests.test_rest_api import running_job, wait_for

ROOT = Path(__file__).resolve().parent.parent
FLINK_HOME = ROOT / ".cache" / "flink-cli" / "pyflink"
FLINK = FLINK_HOME / "bin" / "flink"


@pytest.fixture(scope="module")
def flink() -> Path:
    if not FLINK.is_file() or shutil.which("java") is None:
        pytest.fail(f"Flink's CLI ({FLINK}) or java is missing: run ./setup.sh")
    return FLINK


def run_flink(flink: Path, *args: str) -> str:
    """Run the Flink CLI; its output (it exits 0, or the test fails with what it printed)."""
    env = {**os.environ, "FLINK_HOME": str(FLINK_HOME)}
    done = subprocess.run(
        [str(flink), *args], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"flink {' '.join(args)} exited {done.returncode}:\n{output}"
    return output


def start(executor: str, name: str) -> tuple[StreamExecutionEnvironment, JobClient, str]:
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor=executor)
    env.set_parallelism(2)
    env.enable_checkpointing(500)
    client = running_job(env, name=name)
    wait_for(lambda: client.get_job_status() is JobStatus.RUNNING, "the job running", timeout_s=180)
    assert env.rest_url is not None
    return env, client, env.rest_url.removeprefix("http://")


@pytest.fixture
def cleanup() -> Iterator[list[StreamExecutionEnvironment]]:
    envs: list[StreamExecutionEnvironment] = []
    yield envs
    for env in envs:
        env.close()


def savepoint_path(output: str) -> Path:
    match = re.search(r"Savepoint completed\. Path: (\S+)", output)
    assert match, output
    return Path(match.group(1).removeprefix("file:"))


@pytest.mark.slow
def test_flink_list_savepoint_and_stop(
    flink: Path, executor: str, tmp_path: Path, cleanup: list[StreamExecutionEnvironment]
) -> None:
    env, client, address = start(executor, "chandy job for flink's cli")
    cleanup.append(env)
    job_id = client.get_job_id()

    listed = run_flink(flink, "list", "-m", address)
    assert f"{job_id} : chandy job for flink's cli (RUNNING)" in listed, listed

    saved = run_flink(flink, "savepoint", job_id, str(tmp_path / "savepoints"), "-m", address)
    savepoint = savepoint_path(saved)
    assert savepoint.parent == tmp_path / "savepoints" and (savepoint / "_metadata").is_file()
    assert client.get_job_status() is JobStatus.RUNNING

    stopped = run_flink(flink, "stop", "--savepointPath", str(tmp_path / "final"), job_id, "-m", address)
    final = savepoint_path(stopped)
    assert final.parent == tmp_path / "final" and (final / "_metadata").is_file()
    result = client.get_job_execution_result(timeout=120)  # FINISHED: no error raised
    assert result.get_job_id() == job_id
    assert client.get_job_status() is JobStatus.FINISHED

    listed = run_flink(flink, "list", "--all", "-m", address)
    assert f"{job_id} : chandy job for flink's cli (FINISHED)" in listed, listed


@pytest.mark.slow
def test_flink_cancel(flink: Path, cleanup: list[StreamExecutionEnvironment]) -> None:
    env, client, address = start("local", "to be cancelled")
    cleanup.append(env)
    output = run_flink(flink, "cancel", client.get_job_id(), "-m", address)
    assert f"Cancelled job {client.get_job_id()}." in output, output
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(timeout=60)
    assert client.get_job_status() is JobStatus.CANCELED


@pytest.mark.slow
def test_flink_savepoint_failure_shows_chandys_reason(
    flink: Path, tmp_path: Path, cleanup: list[StreamExecutionEnvironment]
) -> None:
    env, client, address = start("local", "savepoint fails")
    cleanup.append(env)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env_vars = {**os.environ, "FLINK_HOME": str(FLINK_HOME)}
    done = subprocess.run(
        [str(flink), "savepoint", client.get_job_id(), str(blocker / "sp"), "-m", address],
        env=env_vars,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Failed to trigger a savepoint" in output and str(blocker / "sp") in output, output
    assert client.get_job_status() is JobStatus.RUNNING
    client.cancel()
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(timeout=60)
