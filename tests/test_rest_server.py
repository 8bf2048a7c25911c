"""The REST server's port rules and lifetime: real sockets, a real uvicorn."""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from chandy import StreamExecutionEnvironment
from chandy.config import Configuration
from chandy.errors import ConfigurationError, JobCancelledError, JobExecutionError
from chandy.web.dispatcher import Dispatcher
from chandy.web.server import RestServer
from tests.jobs import Throttle
from tests.test_rest_api import wait_for


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other process listens on, with the next one free (most likely)."""
    for _ in range(50):
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        port: int = holder.getsockname()[1]
        probe = socket.socket()
        try:
            probe.bind(("127.0.0.1", port + 1))
        except OSError:
            holder.close()
            continue
        finally:
            probe.close()
        holder.listen()
        yield port
        holder.close()
        return
    pytest.fail("no pair of free ports found")


def serve(settings: dict[str, object]) -> RestServer:
    return RestServer(Configuration(settings), Dispatcher()).start()


def test_a_taken_rest_port_moves_to_the_next_free_one_and_says_so(
    taken_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    server = serve({"rest.port": taken_port})
    try:
        assert server.port == taken_port + 1
        assert server.url == f"http://127.0.0.1:{taken_port + 1}"
        assert httpx.get(server.url + "/jobs").json() == {"jobs": []}
        assert any(f"REST port {taken_port} is taken" in r.getMessage() for r in caplog.records)
    finally:
        server.stop()


def test_rest_bind_port_is_strict(taken_port: int) -> None:
    with pytest.raises(ConfigurationError, match=f"no port of rest.bind-port '{taken_port}' is free"):
        serve({"rest.bind-port": str(taken_port)})
    server = serve({"rest.bind-port": f"{taken_port}-{taken_port + 1}"})  # a range: the free one
    try:
        assert server.port == taken_port + 1
    finally:
        server.stop()
    with pytest.raises(ConfigurationError, match="rest.bind-port"):
        serve({"rest.bind-port": "eighty"})


def test_rest_address_names_the_server_for_clients() -> None:
    server = serve({"rest.port": 0, "rest.address": "driver.example.org"})
    try:
        assert server.url == f"http://driver.example.org:{server.port}"
    finally:
        server.stop()


def test_stop_closes_the_port_at_once_and_the_thread_ends() -> None:
    """uvicorn alone takes 0.2 s to stop (a 0.1 s poll, a 0.1 s grace sleep): every
    env.execute() paid it. Ten servers must stop in far less than ten times that."""
    stopping = 0.0
    threads = set()
    for _ in range(10):
        server = serve({"rest.port": 0})
        threads.add(f"chandy-rest-{server.port}")
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/jobs").status_code == 200  # an open keep-alive connection
            started = time.perf_counter()
            server.stop()
            stopping += time.perf_counter() - started
            with pytest.raises(httpx.ConnectError):
                httpx.get(server.url + "/jobs")
    assert stopping < 1.0, f"10 stops took {stopping:.2f} s"
    deadline = time.monotonic() + 10
    while any(t.name in threads for t in threading.enumerate()):  # (other tests' may still run)
        assert time.monotonic() < deadline, [t.name for t in threading.enumerate()]
        time.sleep(0.01)


def port_closed(url: str) -> bool:
    try:
        httpx.get(url + "/jobs")
    except httpx.ConnectError:
        return True
    return False


def test_a_forgotten_environment_stops_its_server_once_its_jobs_ended() -> None:
    """A program (or a test suite) that never closes its environments must not keep one
    open port per environment for the rest of the process: rest.port's 100 fallback
    ports would run out and every later job fail to start."""
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.port": 0, "chandy.network.batch-size": 10},
        executor="local",  # a cancel waits 20 ms, not 2 s
    )
    env.from_sequence(0, 10_000_000).map(Throttle(0.002)).filter(lambda _: False).print()
    client = env.execute_async("outlives its environment")
    url = env.rest_url
    assert url is not None
    del env
    gc.collect()
    time.sleep(0.2)
    assert httpx.get(url + "/jobs").json()["jobs"][0]["status"] == "RUNNING"  # its job still runs
    client.cancel()
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(timeout=60)
    wait_for(lambda: port_closed(url), "the port closed", timeout_s=15)


def _fail(value: int) -> int:
    raise ValueError(f"bad record {value}")


def _collect_from_a_failing_job_and_forget_its_environment() -> str:
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.port": 0, "restart-strategy.type": "none"}, executor="local"
    )
    results = env.from_collection([1, 2, 3]).map(_fail).execute_and_collect("fails")
    url = env.rest_url
    assert url is not None
    with pytest.raises(JobExecutionError, match="bad record"):
        list(results)
    return url


def test_asking_a_failed_job_for_its_result_does_not_keep_the_environment_alive() -> None:
    """The job's error, kept for the readers of its results, used to be raised as it was: the
    raise added the caller's frames to its traceback, a finished frame keeps its caller's,
    and so the environment in the caller's locals lived as long as the job, which its own
    REST server kept listed. The server never stopped; a full test run held 90 of rest.port's 101 ports
    and later jobs could not start. Now a copy is raised."""
    url = _collect_from_a_failing_job_and_forget_its_environment()
    gc.collect()
    wait_for(lambda: port_closed(url), "the port closed", timeout_s=15)


def test_an_environment_in_use_keeps_its_ended_jobs_listed_until_closed() -> None:
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor="local")
    env.from_collection([1, 2, 3]).filter(lambda _: False).print()
    env.execute_async("short").get_job_execution_result(timeout=60)
    url = env.rest_url
    assert url is not None
    time.sleep(0.3)  # the job's own hold is gone by now; the environment's remains
    assert httpx.get(url + "/jobs").json()["jobs"][0]["status"] == "FINISHED"
    with env:
        pass  # leaving the block closes it
    assert env.rest_url is None and port_closed(url)
