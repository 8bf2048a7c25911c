"""Shared fixtures. Everything runs for real: threads, channels, files, Spark."""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.api.environment import CONFIG_ENV_VAR
from tests.probes import PROBE_ROOT_ENV_VAR
from tests.state_backends import CLEANUP_TIMEOUT_S, CONFIGURATIONS

pytest_plugins = ["tests.kafka_broker", "tests.s3_server"]

#: Spark slots the shared session offers (local[4]): the most any test's parallelism needs.
SPARK_SLOTS = 4


def _runs_on_spark(item: pytest.Item) -> bool:
    """The test uses the shared Spark session, or a parameter of it is "spark" (the executor
    fixture's, or a test's own that requests the session inside)."""
    callspec = getattr(item, "callspec", None)
    on_spark = callspec is not None and "spark" in callspec.params.values()
    return on_spark or "spark_session" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_configure(config: pytest.Config) -> None:
    """Give SIGINT its default when the runner was started with it ignored.

    A shell without job control (a CI script, ``cmd &``) starts background commands with
    SIGINT ignored, and every process they start inherits that; Python then installs no
    KeyboardInterrupt handler. The tests that press Ctrl-C on a job (a pty, or SIGINT) would
    find it deaf, and it would run to its end. A shell gives a foreground job the default
    disposition; this does the same for the jobs the tests start (here and in each worker)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The quick subset, ``pytest -m "not slow"`` (README.md): every test on the Spark executor
    counts as slow (each Spark job takes seconds), except those marked ``quick``, which keep
    the checkpoint path on Spark in the subset."""
    for item in items:
        if _runs_on_spark(item) and item.get_closest_marker("quick") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _probe_directories(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every :class:`tests.probes.Probe` of the run is made under one directory of the
    session's, removed at its end: tests create probes freely (dozens per run) and never
    remove them, and they used to pile up in the system's temporary directory. Spark's
    Python workers get each probe's absolute path, not this variable."""
    root = tmp_path_factory.mktemp("probes")
    previous = os.environ.get(PROBE_ROOT_ENV_VAR)
    os.environ[PROBE_ROOT_ENV_VAR] = str(root)
    yield
    if previous is None:
        os.environ.pop(PROBE_ROOT_ENV_VAR, None)
    else:
        os.environ[PROBE_ROOT_ENV_VAR] = previous
    shutil.rmtree(root, ignore_errors=True)


#: The suite is one deployment: its tests restore checkpoints across storage roots (tmp
#: directories), module fixtures and subprocesses included, so they share one snapshot key,
#: set for the whole session. Tests of the key's defaults (the generated key file beside the
#: storage root) remove it with monkeypatch (tests/test_snapshot_security.py).
SUITE_SNAPSHOT_KEY = "chandy test suite snapshot key"
os.environ["CHANDY_SNAPSHOT_KEY"] = SUITE_SNAPSHOT_KEY
#: A test that removes it and names no storage directory gets the user's own key: made under
#: the system's temporary directory for the run, never in the real ~/.config.
os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME = tempfile.mkdtemp(prefix="chandy-test-config-")
atexit.register(shutil.rmtree, _CONFIG_HOME, ignore_errors=True)


@pytest.fixture(autouse=True)
def _chandy_logging(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chandy")


@pytest.fixture(autouse=True)
def _rest_servers_of_dropped_environments_stop() -> Iterator[None]:
    """An environment that ran ``execute_async``/``execute_and_collect`` keeps its REST server
    until ``close()`` or until it is garbage-collected (chandy.web.service). Most tests drop
    theirs unclosed, inside reference cycles only a full collection frees; once more than a few
    such servers are up, collect, so that a long run does not hold dozens of ports (rest.port
    falls back over 100). Not after every test: a full collection costs ~0.1 s with Spark loaded."""
    yield
    if sum(t.name.startswith("chandy-rest-") for t in threading.enumerate()) > 8:
        gc.collect()


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """One local Spark session for the whole test run (starting one costs 6-10 s)."""
    from chandy.runtime.spark.session import get_or_create_session

    logging.getLogger("py4j").setLevel(logging.WARNING)
    session = get_or_create_session(SPARK_SLOTS, {"spark.master": f"local[{SPARK_SLOTS}]"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    os.environ.pop("PYSPARK_PYTHON", None)


@pytest.fixture(params=["local", "spark"])
def executor(request: pytest.FixtureRequest) -> str:
    """Run the test on each executor: every subtask a thread here, or Spark slots."""
    if request.param == "spark":
        request.getfixturevalue("spark_session")
    return request.param


@pytest.fixture
def state_backend(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Every job the test starts keeps its keyed state in this backend (``hashmap`` unless the
    test is parametrized by :func:`tests.state_backends.on_rocksdb_too`): set in
    ``CHANDY_CONFIG``, the base configuration of each new environment and of subprocesses.
    After a RocksDB run its local directory must be empty again."""
    name: str = getattr(request, "param", "hashmap")
    settings = CONFIGURATIONS[name]
    if not settings:
        yield name
        return
    base = json.loads(os.environ.get(CONFIG_ENV_VAR) or "{}")
    local_dir = tmp_path_factory.mktemp(f"{name}-local")
    settings = {**settings, "state.backend.rocksdb.localdir": str(local_dir)}
    monkeypatch.setenv(CONFIG_ENV_VAR, json.dumps({**base, **settings}))
    yield name
    deadline = time.monotonic() + CLEANUP_TIMEOUT_S
    while (left := sorted(p.name for p in local_dir.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"RocksDB directories outlived their backends in {local_dir}: {left}"


@pytest.fixture
def local_env() -> StreamExecutionEnvironment:
    """An environment on the local executor with parallelism 2."""
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    return env
