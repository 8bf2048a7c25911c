"""Running the exactly-once end-to-end tests on each keyed state backend.

A test decorated with :func:`on_rocksdb_too` runs as it always did (the hashmap backend) and
once more with every job it starts on RocksDB with incremental checkpoints. The
``state_backend`` fixture (``tests/conftest.py``) does it through ``CHANDY_CONFIG``, the base
configuration of every environment a test creates and of every ``chandy run`` or script it
starts as a subprocess; what a test sets itself still wins. So the tests stay as they are,
asserting the same exact results, and a test that checks files on disk sees RocksDB's
(``shared/`` SST files, private files next to ``_metadata``).

A test that already runs on both executors runs on RocksDB on one of them only, to keep the
suite's time in bounds (issue 15 allows about 3 minutes more on 2 cores); each decorated
test's ``executor=`` says which, and why where it matters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

#: What a job on RocksDB adds to its configuration (the fixture adds a local directory of the
#: test's own, so that the databases of a slot process a test kills stay in pytest's tmp dir).
ROCKSDB: dict[str, Any] = {"state.backend.type": "rocksdb", "execution.checkpointing.incremental": True}

#: RocksDB with full (canonical) checkpoints: each one self-contained in its ``chk-N``.
ROCKSDB_FULL: dict[str, Any] = {**ROCKSDB, "execution.checkpointing.incremental": False}

#: The backends by the name a test id shows.
CONFIGURATIONS: dict[str, dict[str, Any]] = {"hashmap": {}, "rocksdb": ROCKSDB, "rocksdb-full": ROCKSDB_FULL}

F = TypeVar("F", bound=Callable[..., Any])

#: How long a RocksDB run's backends may take to delete their directories after the test (a
#: cancelled job's tasks may still be closing; an upload in flight delays a deletion).
CLEANUP_TIMEOUT_S = 30.0


def on_rocksdb_too(
    *,
    executor: str | tuple[str, ...] | None = None,
    incremental: bool = True,
) -> Callable[[F], F]:
    """Run the test on the hashmap backend as before and on RocksDB.

    A test without the ``executor`` fixture gets the ids ``[hashmap]`` and ``[rocksdb]``. A test
    that has it (``[local]`` and ``[spark]``) keeps those ids for the hashmap backend and gets
    one more, ``[<executor>-rocksdb]``, on each executor given here.

    ``incremental=False`` (ids ``...-rocksdb-full``) is for a test that copies or moves a
    retained checkpoint's ``chk-N`` directory alone: an incremental checkpoint also needs the
    files in its job's ``shared/`` (see docs/state-backends.md), a full one is self-contained.

    After a RocksDB run the fixture checks that the run's local directory is empty again: every
    backend deletes its database when its subtask ends, fails or is cancelled, and what a
    SIGKILLed process left is deleted by the next process that builds backends on the host
    (the restarted slot or driver).
    """
    rocksdb = "rocksdb" if incremental else "rocksdb-full"

    def mark(test: F) -> F:
        if executor is None:
            parametrized = pytest.mark.parametrize("state_backend", ["hashmap", rocksdb], indirect=True)
        else:
            on_rocksdb = (executor,) if isinstance(executor, str) else executor
            parametrized = pytest.mark.parametrize(
                ("executor", "state_backend"),
                [("local", "hashmap"), ("spark", "hashmap"), *((e, rocksdb) for e in on_rocksdb)],
                ids=["local", "spark", *(f"{e}-{rocksdb}" for e in on_rocksdb)],
                indirect=True,
            )
        return pytest.mark.usefixtures("state_backend")(parametrized(test))  # type: ignore[no-any-return]

    return mark
