"""Bearer-token authentication of the REST API: real server, real HTTP."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from chandy import StreamExecutionEnvironment
from chandy.config import Configuration
from chandy.errors import ConfigurationError
from chandy.web.auth import is_loopback
from chandy.web.dispatcher import Dispatcher
from chandy.web.server import RestServer

TOKEN = "s3cret-token-of-the-rest-auth-tests"


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[RestServer]:
    settings = {"rest.port": 0, "rest.auth.token": TOKEN, **getattr(request, "param", {})}
    server = RestServer(Configuration(settings), Dispatcher()).start()
    yield server
    server.stop()


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.0.2.10"])
def test_a_non_loopback_address_without_a_token_is_refused_naming_both_keys(address: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        RestServer(Configuration({"rest.bind-address": address, "rest.port": 0}), Dispatcher())
    message = str(error.value)
    assert "rest.bind-address" in message and "rest.auth.token" in message and address in message


def test_execute_refuses_before_the_job_runs() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.bind-address": "0.0.0.0", "rest.port": 0}, executor="local"
    )
    env.from_collection([1, 2]).map(lambda x: 1 / 0).print()  # would fail if it ran
    with pytest.raises(ConfigurationError, match="rest.auth.token"):
        env.execute("exposed")
    assert env.rest_url is None


def test_loopback_needs_no_token_and_disabling_the_server_needs_nothing() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.bind-address": "0.0.0.0", "chandy.rest.enabled": False}, executor="local"
    )
    env.from_collection([1, 2]).print()
    env.execute("no server")
    assert env.rest_url is None


def test_with_a_token_every_api_request_needs_it(
    server: RestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="chandy.web")
    for path in ("/jobs", "/v1/jobs/overview", "/overview", "/metrics", "/jobs/0123/checkpoints"):
        response = httpx.get(server.url + path)
        assert response.status_code == 401, path
        assert response.json()["errors"][0].startswith("Unauthorized")
        assert response.headers["www-authenticate"].startswith("Bearer")
    wrong = httpx.get(server.url + "/jobs", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.patch(server.url + "/jobs/0123?mode=cancel", json={}).status_code == 401
    refused = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("127.0.0.1:" in m and "GET /metrics" in m and "no bearer token" in m for m in refused), refused
    assert any("GET /jobs" in m and "a wrong token" in m for m in refused), refused
    assert any("PATCH /jobs/0123" in m for m in refused), refused

    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(server.url + "/jobs", headers=auth).json() == {"jobs": []}
    assert httpx.get(server.url + "/metrics", headers=auth).status_code == 200
    assert httpx.get(server.url + "/jobs/0123", headers=auth).status_code == 404


def test_the_dashboard_page_loads_without_the_token(server: RestServer) -> None:
    """A browser cannot send a header with its first page load: the page's own files hold no
    job data and are served; the page then sends the token with its API calls."""
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert httpx.get(server.url + "/index.html").status_code == 200
    assert httpx.get(server.url + "/../../etc/passwd").status_code in (401, 404)
    assert httpx.post(server.url + "/", json={}).status_code == 401


def test_the_start_up_log_says_the_api_requires_a_token(caplog: pytest.LogCaptureFixture) -> None:
    server = RestServer(Configuration({"rest.port": 0, "rest.auth.token": TOKEN}), Dispatcher()).start()
    server.stop()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Dashboard and REST API")]
    assert "requires 'Authorization: Bearer <token>'" in line and TOKEN not in line


@pytest.mark.parametrize("server", [{"rest.bind-address": "0.0.0.0"}], indirect=True)
def test_bound_to_every_interface_with_a_token(server: RestServer) -> None:
    url = f"http://127.0.0.1:{server.port}"
    assert httpx.get(url + "/jobs").status_code == 401
    assert httpx.get(url + "/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
