"""What a job prints about its failovers: the user's traceback once, naming the job's own
script and line (not ``<dynamic-code>``), the attempt count and where to look; then one line
per repeat of the same error; a different error prints its traceback again."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chandy.errors import JobExecutionError
from chandy.runtime.failure_report import FailoverReport
from chandy.runtime.restart_strategy import FixedDelayRestartBackoffTimeStrategy
from chandy.task.services import TaskFailure

ROOT = Path(__file__).resolve().parent.parent

JOB = textwrap.dedent(
    """\
    import sys
    import traceback

    from chandy import StreamExecutionEnvironment
    from chandy.errors import JobExecutionError


    def divide(x):
        return 10 // (x - 3)  # line 9: x == 3 divides by zero


    env = StreamExecutionEnvironment.get_execution_environment(executor=sys.argv[1])
    env.set_parallelism(2)
    env.enable_checkpointing(60_000)
    env.configure(
        {
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 3,
            "restart-strategy.fixed-delay.delay": 0,
        }
    )
    env.from_collection(list(range(8))).map(divide).filter(lambda x: False).print()
    try:
        env.execute("divide")
    except JobExecutionError as exc:
        final = "".join(traceback.format_exception(exc))
        print("FINAL names the script:", __file__ in final, "dynamic:", "<dynamic-code>" in final)
        sys.exit(3)
    """
)


@pytest.mark.parametrize("executor", ["local", pytest.param("spark", marks=pytest.mark.slow)])
def test_a_failing_function_prints_its_traceback_once_then_one_line_per_attempt(
    tmp_path: Path, executor: str
) -> None:
    """On Spark the traceback is formatted in the slot, from the function the driver shipped."""
    script = tmp_path / "divide_job.py"
    script.write_text(JOB)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYSPARK_PYTHON", None)
    done = subprocess.run(
        [sys.executable, str(script), executor],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    # The user's error, with its traceback, exactly once: at the first failure.
    assert output.count("Traceback (most recent call last)") == 1, output
    assert output.splitlines().count("ZeroDivisionError: integer division or modulo by zero") == 1, output
    # ... naming the job's script and line, and showing the line's text.
    assert f'File "{script}", line 9, in divide' in output, output
    assert "return 10 // (x - 3)" in output, output
    assert "<dynamic-code>" not in output, output
    assert "FINAL names the script: True dynamic: False" in output, output
    first = next(line for line in output.splitlines() if "failed on attempt 1:" in line)
    assert "Job 'divide'" in first and "in operator 'Map'" in first, first
    assert "Restart 1 of 3 in 0 ms (restart-strategy.type: fixed-delay: 3 attempts, 0 ms apart)" in output
    assert "/exceptions and in the dashboard's Exceptions tab" in output, output
    for attempt in (2, 3):
        assert (
            f"Job 'divide' failed again on attempt {attempt} with the same error "
            "(ZeroDivisionError: integer division or modulo by zero in operator 'Map' of task"
        ) in output, output
        assert f"restart {attempt} of 3 in 0 ms." in output, output
    assert "Job 'divide' failed on attempt 4 with the same error" in output, output
    assert "no restarts left (fixed-delay: 3 attempts, 0 ms apart): the job fails." in output, output


def _raise(error: BaseException) -> TaskFailure:
    try:
        raise error
    except BaseException as exc:  # noqa: BLE001 - the failure a task reports
        return TaskFailure.of(exc, "Map")


def test_a_different_error_prints_its_traceback_again(caplog: pytest.LogCaptureFixture) -> None:
    report = FailoverReport("job", "0" * 32, "http://127.0.0.1:8081/")
    strategy = FixedDelayRestartBackoffTimeStrategy(10, 0)
    failures = [
        _raise(ZeroDivisionError("division by zero")),
        _raise(ZeroDivisionError("division by zero")),
        _raise(KeyError("price")),
        _raise(KeyError("price")),
        _raise(ZeroDivisionError("division by zero")),
    ]
    with caplog.at_level(logging.WARNING, logger="chandy.runtime.failover"):
        for attempt, failure in enumerate(failures, start=1):
            error = JobExecutionError(f"job 'job' failed: {failure.exception_type}: {failure.message}")
            report.restarting(attempt, error, failure, strategy, 0, attempt)
    messages = [r.getMessage() for r in caplog.records]
    assert [m.count("Traceback (most recent call last)") for m in messages] == [1, 0, 1, 0, 1]
    assert (
        "failed again on attempt 2 with the same error (ZeroDivisionError: division by zero)" in messages[1]
    )
    assert "KeyError: 'price'" in messages[2]
    assert "http://127.0.0.1:8081/jobs/00000000000000000000000000000000/exceptions" in messages[0]
