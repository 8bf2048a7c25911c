"""Files chandy writes on the driver and in checkpoint storage are the job user's alone.

Real jobs (executor "local") write real checkpoints and savepoints; ``chandy run
--detached`` runs in-process through Click with the temporary directory pointed at the
test's, where a symbolic link is planted as another local user would.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from chandy import StreamExecutionEnvironment
from chandy.cli.main import cli
from chandy.errors import ConfigurationError
from tests.jobs import HoldingSequence, KeyedCounter

# ---------------------------------------------------------------------- the detached log


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The system's temporary directory, for this test: ``tmp_path/tmp``."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    yield tmp


def run_detached(tmp_path: Path, job_id: str) -> Any:
    job = tmp_path / "job.py"
    job.write_text("print('the job ran')\n")
    return CliRunner().invoke(
        cli, ["run", "--detached", "-D", f"$internal.pipeline.job-id={job_id}", str(job)]
    )


def test_a_planted_symlink_at_the_detached_log_is_not_followed(private_tmp: Path, tmp_path: Path) -> None:
    job_id = uuid.uuid4().hex
    directory = private_tmp / f"chandy-{os.getuid()}"
    directory.mkdir(mode=0o700)
    target = tmp_path / "victim"
    target.write_text("precious\n")
    (directory / f"job-{job_id}.log").symlink_to(target)
    result = run_detached(tmp_path, job_id)
    assert result.exit_code == 1
    assert "symbolic link" in result.output and "not followed" in result.output
    assert target.read_text() == "precious\n"


def test_a_log_directory_open_to_others_or_a_link_is_refused(private_tmp: Path, tmp_path: Path) -> None:
    directory = private_tmp / f"chandy-{os.getuid()}"
    directory.mkdir(mode=0o700)
    directory.chmod(0o777)
    result = run_detached(tmp_path, uuid.uuid4().hex)
    assert result.exit_code == 1 and "open to other users" in result.output
    directory.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    directory.symlink_to(elsewhere)
    result = run_detached(tmp_path, uuid.uuid4().hex)
    assert result.exit_code == 1 and "is a symbolic link" in result.output
    assert list(elsewhere.iterdir()) == []


def test_the_detached_log_is_0600_in_a_0700_directory_of_its_own(private_tmp: Path, tmp_path: Path) -> None:
    job_id = uuid.uuid4().hex
    result = run_detached(tmp_path, job_id)
    assert result.exit_code == 0, result.output
    directory = private_tmp / f"chandy-{os.getuid()}"
    log = directory / f"job-{job_id}.log"
    assert str(log) in result.output
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    deadline = time.monotonic() + 60
    while "the job ran" not in log.read_text():
        assert time.monotonic() < deadline, "the detached job wrote nothing to its log"
        time.sleep(0.05)


# ---------------------------------------------------------------------- checkpoint storage


def modes(root: Path) -> tuple[set[int], set[int]]:
    """The modes of every file and of every directory under ``root`` (itself included)."""
    files, dirs = set(), {stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        (dirs if path.is_dir() else files).add(stat.S_IMODE(path.lstat().st_mode))
    return files, dirs


def checkpoint_and_savepoint(tmp_path: Path, umask: int, **config: Any) -> tuple[Path, Path]:
    """A keyed job that checkpoints (every state in a file of its own) into
    ``tmp_path/checkpoints`` and takes a savepoint into ``tmp_path/savepoints``; cancelled
    then, its checkpoints retained."""
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    env.enable_checkpointing(50)
    env.configure(
        {
            "execution.checkpointing.dir": str(tmp_path / "checkpoints"),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
            "execution.checkpointing.data-inline-threshold": 0,
            **config,
        }
    )
    env.from_source(HoldingSequence(0, 999, hold_after=100), source_name="numbers").uid("numbers").key_by(
        lambda x: x % 10
    ).process(KeyedCounter(100)).uid("counter").print()
    previous = os.umask(umask)
    try:
        client = env.execute_async("permissions")
        try:
            deadline = time.monotonic() + 120
            while client.get_checkpoint_statistics()["counts"]["completed"] < 2:
                assert time.monotonic() < deadline, "no 2 checkpoints in 120 s"
                time.sleep(0.02)
            savepoint = Path(client.trigger_savepoint(str(tmp_path / "savepoints")).result(120))
        finally:
            client.cancel()
            try:
                client.get_job_execution_result(60)
            except Exception:  # noqa: BLE001 - cancelled, as asked
                pass
    finally:
        os.umask(previous)
    return tmp_path / "checkpoints", savepoint


def test_checkpoints_and_savepoints_are_private_by_default(tmp_path: Path) -> None:
    checkpoints, savepoint = checkpoint_and_savepoint(tmp_path, umask=0o022)
    assert any(p.name.startswith("chk-") for p in checkpoints.rglob("*"))
    files, dirs = modes(checkpoints)
    assert files == {0o600} and dirs == {0o700}
    files, dirs = modes(savepoint)
    assert (savepoint / "_metadata").is_file() and len(list(savepoint.iterdir())) > 1
    assert files == {0o600} and dirs == {0o700}
    assert stat.S_IMODE((tmp_path / "savepoints").stat().st_mode) == 0o700  # created by chandy


def test_shared_storage_gets_the_configured_modes_whatever_the_umask(tmp_path: Path) -> None:
    checkpoints, savepoint = checkpoint_and_savepoint(
        tmp_path,
        umask=0o077,  # narrows what os.open and mkdir create: the modes are set explicitly
        **{
            "execution.checkpointing.file-permissions": "640",
            "execution.checkpointing.dir-permissions": "0750",
        },
    )
    for root in (checkpoints, savepoint):
        files, dirs = modes(root)
        assert files == {0o640} and dirs == {0o750}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("execution.checkpointing.file-permissions", "0666", "lets every local user write"),
        ("execution.checkpointing.file-permissions", "400", "takes away the owner's access"),
        ("execution.checkpointing.file-permissions", "rw-r-----", "is not an octal mode"),
        ("execution.checkpointing.file-permissions", 640, "quoted octal mode"),
        ("execution.checkpointing.dir-permissions", "600", "takes away the owner's access"),
    ],
)
def test_a_bad_mode_is_refused_when_the_job_is_built(key: str, value: Any, message: str) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.configure({key: value})
    env.from_sequence(0, 3).map(lambda x: x)
    with pytest.raises(ConfigurationError, match=f"invalid value for '{key}'.*{message}"):
        env.execute("bad mode")
