"""Writes the savepoints of ``tests/data/before-typed-state`` (tests/test_typed_state.py).

They are what chandy wrote before typed state (commit 22b6db5): every keyed state pickled,
key groups in the old one-pickle format, RocksDB values in the old codec. Run it with that
chandy first on the path and this tree after it (for ``tests.typed_jobs``), under the test
suite's snapshot key, which signs them::

    CHANDY_SNAPSHOT_KEY="chandy test suite snapshot key" \\
    PYTHONPATH=<chandy at 22b6db5>:<this tree> python tests/scripts/make_savepoints_before_typed_state.py DIR

``DIR/canonical`` is a CANONICAL savepoint of the heap backend, ``DIR/native`` a NATIVE
savepoint of the RocksDB backend; the job (``tests.typed_jobs.summary_job``) is stopped a
quarter of the way (each of its two source readers held after ``N // 8`` numbers).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chandy import StreamExecutionEnvironment
from chandy.config.options import SavepointFormatType
from tests.typed_jobs import N, summary_job


def write(target: Path, config: dict[str, Any], format_type: SavepointFormatType) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    env.enable_checkpointing(50)
    env.configure(config)
    results = summary_job(env, N // 8).execute_and_collect("before typed state")
    client = results.job_client
    while client.get_checkpoint_statistics()["counts"]["completed"] < 1:
        time.sleep(0.05)
    with tempfile.TemporaryDirectory() as scratch:
        future = client.stop_with_savepoint(savepoint_directory=scratch, format_type=format_type)
        location = Path(future.result(60))
        assert list(results) == [], "no key may be complete before the savepoint"
        shutil.copytree(location, target)


def main() -> None:
    out = Path(sys.argv[1])
    write(out / "canonical", {}, SavepointFormatType.CANONICAL)
    with tempfile.TemporaryDirectory() as local:
        rocksdb = {"state.backend.type": "rocksdb", "state.backend.rocksdb.localdir": local}
        write(out / "native", rocksdb, SavepointFormatType.NATIVE)


if __name__ == "__main__":
    main()
