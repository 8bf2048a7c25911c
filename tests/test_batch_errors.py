"""Mistakes in a batch job's definition that show only at run time fail the job once.

A column that does not exist, a function that returns the wrong thing: a restart runs the
same definition over the same data and fails the same way, so under checkpointing (whose
default restart strategy restarts without limit) such a job would restart forever. The
batch operators raise these as :class:`chandy.errors.UnrecoverableError` (and as the
built-in type a caller may catch), and the job fails at the first one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from chandy import StreamExecutionEnvironment
from chandy.api.batch_stream import BatchStream
from chandy.connectors.arrow_sources import ArrowNumberSequenceSource
from chandy.errors import JobExecutionError, UnrecoverableError

#: Long enough for a loaded machine to start and fail a local job once, far shorter than a
#: job restarting without limit would take to end (it never does).
DEADLINE_S = 30.0


def _fails_once(build: Callable[[BatchStream], BatchStream], cause: type[BaseException]) -> BaseException:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.enable_checkpointing(100)
    env.configure({"restart-strategy.fixed-delay.delay": 10})  # restarts allowed, without limit
    out = build(env.from_source(ArrowNumberSequenceSource(1, 1_000), source_name="numbers"))
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = out.execute_and_collect(limit=5)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name="batch-error-job", daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), f"the job did not fail within {DEADLINE_S}s: it restarts forever"
    error = outcome.get("error")
    assert isinstance(error, JobExecutionError), outcome
    root: BaseException | None = error
    while root is not None and not isinstance(root, UnrecoverableError):
        root = root.__cause__
    assert isinstance(root, UnrecoverableError) and isinstance(root, cause), repr(error)
    assert "restarts" not in str(error) or "after 0 restarts" in str(error), str(error)
    return root


def test_key_by_a_missing_column_fails_the_job_once() -> None:
    root = _fails_once(lambda s: s.key_by("nope").sum("value"), KeyError)
    assert "nope" in str(root) and "value" in str(root)


def test_map_batches_returning_an_int_fails_the_job_once() -> None:
    root = _fails_once(lambda s: s.map_batches(lambda b: 1), TypeError)
    assert "returned an int" in str(root)
