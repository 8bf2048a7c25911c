"""A cancelled job's checkpoint directory holds its retained checkpoints and nothing else,
even when a task's checkpoint write is still under way as the job is cancelled (a slow
object store): the job's end waits for that write before it tidies."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from tests.test_checkpointing_e2e import (
    cancel_keeping_results,
    checkpointing_env,
    drain,
    wait_for_checkpoints,
)
from tests.test_restore import FILES, N, counter_job

#: How long the slow store takes to create a directory once the gate opens: long enough that
#: the job's end, if it did not wait for the write, would tidy before the write made ``chk-N``.
SLOW_STORE_S = 0.5


class GatedFileSystem(LocalFileSystem):
    """Local files behind ``gated://``: a task's first write of a checkpoint after the
    first one waits at its directory until the test opens the gate, then is slow."""

    protocol = "gated"
    reached = threading.Event()
    gate = threading.Event()
    held: str | None = None

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        return str(super()._strip_protocol(text.removeprefix("gated://")))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        name = Path(self._strip_protocol(path)).name
        cls = type(self)
        in_task = threading.current_thread().name.startswith("chandy-checkpoint-async")
        if in_task and name.startswith("chk-") and name != "chk-1" and cls.held in (None, name):
            cls.held = name
            cls.reached.set()
            assert cls.gate.wait(60), "the gate never opened"
            time.sleep(SLOW_STORE_S)
        super().makedirs(path, exist_ok=exist_ok)


class _OpensTheGateWhenCancelled(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if "to CANCELED" in record.getMessage():
            GatedFileSystem.gate.set()


@pytest.fixture
def gated_store() -> Any:
    fsspec.register_implementation("gated", GatedFileSystem, clobber=True)
    GatedFileSystem.reached.clear()
    GatedFileSystem.gate.clear()
    GatedFileSystem.held = None
    handler = _OpensTheGateWhenCancelled()
    logger = logging.getLogger("chandy.graph.execution_graph")
    logger.addHandler(handler)
    yield
    logger.removeHandler(handler)
    GatedFileSystem.gate.set()


def test_a_checkpoint_write_under_way_at_cancel_leaves_nothing_behind(
    tmp_path: Path, gated_store: Any
) -> None:
    env = checkpointing_env(
        interval_ms=30,
        **{
            "execution.checkpointing.dir": f"gated://{tmp_path}",
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
            **FILES,
        },
    )
    results = counter_job(env, N // 4).execute_and_collect("cancelled while a task writes")
    _, reader = drain(results)
    wait_for_checkpoints(tmp_path, 1)
    assert GatedFileSystem.reached.wait(60), "no task wrote a second checkpoint"
    cancel_keeping_results(results, reader)
    with pytest.raises(Exception, match="cancel"):
        results.job_client.get_job_execution_result(60)

    [job_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
    checkpoints = sorted(p.name for p in job_dir.glob("chk-*"))
    assert checkpoints == ["chk-1"], checkpoints  # the one retained; the one being written: gone
    assert (job_dir / "chk-1" / "_metadata").exists()
