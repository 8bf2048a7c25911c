"""The ``chandy`` command, run for real: the installed console script as a subprocess, jobs it
starts, their REST API, and checkpoints on disk. Click's CliRunner only for argument errors."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from chandy import StreamExecutionEnvironment
from chandy.api.environment import CONFIG_ENV_VAR
from chandy.cli.main import cli
from chandy.errors import ConfigurationError

CHANDY = shutil.which("chandy") or os.path.join(os.path.dirname(sys.executable), "chandy")

#: A keyed count over 0..N-1 (uids on every stateful operator). ``first``: paced, cancels
#: itself once a checkpoint is retained; ``second``: runs to the end and writes what it saw.
#: The program sets no parallelism and no restore path: those come from ``chandy run``.
COUNT_JOB = textwrap.dedent(
    """
    import glob, json, sys, time

    from chandy import StreamExecutionEnvironment
    from chandy.core.functions import KeyedProcessFunction
    from chandy.core.state import ValueStateDescriptor

    N, KEYS = 3000, 30


    class Count(KeyedProcessFunction):
        def open(self, runtime_context):
            self.count = runtime_context.get_state(ValueStateDescriptor("count"))
            self.subtask = runtime_context.get_index_of_this_subtask()

        def process_element(self, value, ctx):
            count = (self.count.value() or 0) + 1
            self.count.update(count)
            yield ctx.get_current_key(), count, self.subtask


    mode, directory, out = sys.argv[1:4]
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.enable_checkpointing(50)
    env.configure({
        "execution.checkpointing.dir": directory,
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "chandy.rest.enabled": False,
    })


    def pace(x):
        if mode == "first":
            time.sleep(0.005)
        return x


    stream = (
        env.from_sequence(0, N - 1).uid("numbers").map(pace).uid("pace")
        .key_by(lambda x: x % KEYS).process(Count()).uid("count")
    )
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
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``chandy`` command."""
    return subprocess.run(
        [CHANDY, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
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
        "--claim-mode", "claim", "-D", "pipeline.name=from cli", "-D", "a.b=c=d", "--", "-p", "9",
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
        "a.b": "c=d",
        "execution.target": "local",
    }
    assert "JobID" not in result.stdout  # not fixed, so not known before the job starts


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
    assert 0 < result["records"] < 3000
    assert result["final"] == {str(k): 100 for k in range(30)}


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


# ---------------------------------------------------------------------- REST commands: errors


def test_rest_commands_without_a_server_name_the_address(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    for args in (["list"], ["cancel", "a" * 32], ["savepoint", "b" * 32, str(tmp_path)], ["stop", "c" * 32]):
        result = chandy(*args, "-m", address, timeout=60)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith(f"Error: no chandy REST API at {address}") and "-m/--jobmanager" in error


def test_job_ids_and_addresses_are_checked_before_any_request() -> None:
    runner = CliRunner()
    bad_id = runner.invoke(cli, ["cancel", "not-a-job-id"])
    assert bad_id.exit_code == 1 and "'not-a-job-id' is not a job id" in bad_id.output
    bad_address = runner.invoke(cli, ["list", "-m", "localhost"])
    assert bad_address.exit_code == 1 and "-m/--jobmanager takes HOST:PORT" in bad_address.output
