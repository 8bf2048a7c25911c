"""The REST API against requests a web page can make (issue 27 §2): real jobs, real servers, real HTTP.

On loopback without a token, the REST API's only protection is that nobody else can reach
it, and a web page in the operator's browser can: by DNS rebinding (a name of the page's
own that resolves to 127.0.0.1, so the browser treats the API as the page's own origin) or
by a cross-site request a browser sends without asking the server (a POST with a
``text/plain`` body). These tests send exactly those requests, and the malformed bodies,
and check that the job runs on. ``tests/test_rest_browser.py`` sends them from Chromium.
"""

from __future__ import annotations

import hmac
import http.server
import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chandy import StreamExecutionEnvironment
from chandy.cli.errors import CliError
from chandy.cli.rest import RestClient
from chandy.config import Configuration
from chandy.errors import ConfigurationError, JobCancelledError
from chandy.messages.status import JobStatus
from chandy.runtime.job_client import JobClient
from chandy.web.dispatcher import Dispatcher
from chandy.web.server import RestServer
from tests.test_rest_api import poll_trigger, running_job, wait_for
from tests.test_rest_server import taken_port  # noqa: F401 - a fixture

TOKEN = "a-token-of-32-characters-or-so!!"
JSON = {"Content-Type": "application/json"}


class Job:
    """A running job and its REST server (module-wide: the tests must leave it running)."""

    def __init__(self, env: StreamExecutionEnvironment, client: JobClient, savepoints: Path) -> None:
        self.env = env
        self.client = client
        self.savepoints = savepoints
        assert env.rest_url is not None
        self.url: str = env.rest_url
        self.port = int(self.url.rsplit(":", 1)[1])

    @property
    def job_id(self) -> str:
        return self.client.get_job_id()

    def assert_running(self) -> None:
        assert self.client.get_job_status() is JobStatus.RUNNING
        assert httpx.get(f"{self.url}/jobs/{self.job_id}").json()["state"] == "RUNNING"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    savepoints = tmp_path_factory.mktemp("savepoints")
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.port": 0, "execution.checkpointing.savepoint-dir": str(savepoints)}, executor="local"
    )
    client = running_job(env, name="a job web pages should not reach")
    wait_for(lambda: client.get_job_status() is JobStatus.RUNNING, "the job running")
    yield Job(env, client, savepoints)
    if not client.get_job_status().is_globally_terminal:
        client.cancel()
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(timeout=60)
    env.close()


def serve(settings: dict[str, Any]) -> RestServer:
    return RestServer(Configuration({"rest.port": 0, **settings}), Dispatcher()).start()


# ---------------------------------------------------------------------------- the Host header


@pytest.mark.parametrize("host", ["rebound.attacker.example", "localhost.attacker.example", "chandy"])
def test_a_host_that_is_not_this_servers_is_refused_and_the_job_runs_on(job: Job, host: str) -> None:
    """DNS rebinding: the browser sends the attacker's name in Host. Listing, cancelling and
    savepoints all get 403 with Flink's error body, naming the key that allows a name."""
    headers = {"Host": f"{host}:{job.port}", **JSON}
    listed = httpx.get(f"{job.url}/jobs/overview", headers=headers)
    assert listed.status_code == 403, listed.text
    assert "rest.allowed-hosts" in listed.json()["errors"][0] and host in listed.json()["errors"][0]
    cancel = httpx.patch(f"{job.url}/jobs/{job.job_id}?mode=cancel", headers=headers, content=b"{}")
    assert cancel.status_code == 403
    savepoint = httpx.post(
        f"{job.url}/jobs/{job.job_id}/savepoints", headers=headers, content=b'{"cancel-job": true}'
    )
    assert savepoint.status_code == 403
    assert httpx.get(f"{job.url}/", headers={"Host": host}).status_code == 403  # the dashboard too
    job.assert_running()


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:1234", "127.0.0.1", "[::1]:8081", "10.1.2.3:80", "[fe80::1]"]
)
def test_loopback_names_and_ip_addresses_are_served(job: Job, host: str) -> None:
    """An IP address in Host cannot come from a rebinding page (its origin would be the address
    itself), and a port forwarded elsewhere (ssh -L) changes the port: any port is fine."""
    response = httpx.get(f"{job.url}/jobs", headers={"Host": host})
    assert response.status_code == 200, response.text


def test_rest_allowed_hosts_adds_names_and_a_star_allows_any() -> None:
    server = serve({"rest.allowed-hosts": "driver.example.org, Other.Example.org"})
    try:
        for host in ("driver.example.org", "driver.example.org:8081", "other.example.org."):
            assert httpx.get(server.url + "/jobs", headers={"Host": host}).status_code == 200, host
        assert httpx.get(server.url + "/jobs", headers={"Host": "evil.example.org"}).status_code == 403
    finally:
        server.stop()
    server = serve({"rest.allowed-hosts": "*"})
    try:
        assert httpx.get(server.url + "/jobs", headers={"Host": "evil.example.org"}).status_code == 200
    finally:
        server.stop()


def test_rest_address_and_the_machine_name_of_a_wildcard_bind_are_allowed() -> None:
    server = serve({"rest.bind-address": "0.0.0.0", "rest.auth.token": TOKEN, "rest.address": "driver.lan"})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        for host in ("driver.lan", socket.getfqdn(), socket.gethostname()):
            response = httpx.get(f"http://127.0.0.1:{server.port}/jobs", headers={"Host": host, **auth})
            assert response.status_code == 200, (host, response.text)
        elsewhere = httpx.get(f"http://127.0.0.1:{server.port}/jobs", headers={"Host": "evil.lan", **auth})
        assert elsewhere.status_code == 403
    finally:
        server.stop()


# ---------------------------------------------------------------------------- content types


@pytest.mark.parametrize(
    "content_type", ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", None]
)
def test_a_state_changing_request_that_is_not_json_is_refused_with_415(
    job: Job, content_type: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """What a cross-site page can send without a CORS preflight: a POST of text/plain, a form
    or no type at all. Before, `{"cancel-job": true}` as text/plain got 202 and cancelled."""
    caplog.set_level(logging.WARNING, logger="chandy.web")
    headers = {"Content-Type": content_type} if content_type else {}
    body = json.dumps({"cancel-job": True, "target-directory": str(job.savepoints)}).encode()
    response = httpx.post(f"{job.url}/jobs/{job.job_id}/savepoints", headers=headers, content=body)
    assert response.status_code == 415, response.text
    assert "application/json" in response.json()["errors"][0]
    stop = httpx.post(f"{job.url}/jobs/{job.job_id}/stop", headers=headers, content=b'{"drain": true}')
    assert stop.status_code == 415
    cancel = httpx.patch(f"{job.url}/jobs/{job.job_id}?mode=cancel", headers=headers)
    assert cancel.status_code == 415
    assert any("415" in r.getMessage() and "/savepoints" in r.getMessage() for r in caplog.records)
    job.assert_running()
    assert not list(job.savepoints.iterdir())


def test_json_with_a_charset_is_accepted(job: Job) -> None:
    response = httpx.post(
        f"{job.url}/jobs/{job.job_id}/savepoints",
        headers={"Content-Type": "Application/JSON; charset=UTF-8"},
        content=json.dumps({"target-directory": str(job.savepoints / "charset")}).encode(),
    )
    assert response.status_code == 202, response.text
    assert poll_trigger(httpx.Client(base_url=job.url), job.job_id, response.json()["request-id"])["location"]


def test_no_cors_headers_are_granted(job: Job) -> None:
    """A cross-origin page must not read answers or send preflighted requests (PATCH, JSON)."""
    origin = {"Origin": "http://attacker.example"}
    assert "access-control-allow-origin" not in httpx.get(f"{job.url}/jobs", headers=origin).headers
    preflight = httpx.options(
        f"{job.url}/jobs/{job.job_id}",
        headers={**origin, "Access-Control-Request-Method": "PATCH"},
    )
    assert preflight.status_code >= 400
    assert not any(name.startswith("access-control-") for name in preflight.headers)


# ---------------------------------------------------------------------------- bodies


def raw_request(port: int, head: bytes, timeout_s: float = 30.0) -> bytes:
    """Send ``head`` (a request line, headers and maybe a start of a body) and return the
    answer (its headers and a JSON body), without sending anything more."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(head)
        while not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


def test_a_body_larger_than_the_limit_is_refused_before_it_is_read(job: Job) -> None:
    """The request announces 500 MB and sends none of it: the 413 must come at once (before,
    the driver read all of a 500 MB body into memory)."""
    head = (
        f"POST /jobs/{job.job_id}/savepoints HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: 500000000\r\n\r\n{"
    ).encode()
    answer = raw_request(job.port, head)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"rest.server.max-content-length" in answer
    job.assert_running()


def test_a_chunked_body_is_counted_while_it_streams(job: Job) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"target-directory": "'
        for _ in range(2048):
            yield b"x" * 1024

    response = httpx.post(f"{job.url}/jobs/{job.job_id}/savepoints", headers=JSON, content=chunks())
    assert response.status_code == 413, response.text
    job.assert_running()


def test_the_body_limit_is_configurable() -> None:
    server = serve({"rest.server.max-content-length": "1 kb"})
    try:
        url = f"{server.url}/jobs/{'0' * 32}/savepoints"
        assert httpx.post(url, headers=JSON, content=b" " * 2000).status_code == 413
        assert httpx.post(url, headers=JSON, content=b" " * 1000).status_code == 404  # read: no such job
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        (b'{"target-directory": "/tmp/\xff\xfe"}', "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested"),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "nested"),
        (b'{"triggerId": [1]}', "triggerId"),
        (b'{"triggerId": 7}', "triggerId"),
        (b'{"target-directory": 5}', "target-directory"),
        (b'{"target-directory": ["/tmp"]}', "target-directory"),
        (b'{"formatType": 5}', "formatType"),
        (b'{"cancel-job": "maybe"}', "cancel-job"),
        (b'{"cancel-job": 1}', "cancel-job"),
        (b'{"cancel-job": {}}', "cancel-job"),
        (b'"a string"', "JSON object"),
        (b"{not json", "format"),
    ],
    ids=[
        "invalid-utf-8",
        "deep-array",
        "deep-object",
        "trigger-id-list",
        "trigger-id-number",
        "directory-number",
        "directory-list",
        "format-number",
        "cancel-job-maybe",
        "cancel-job-number",
        "cancel-job-object",
        "not-an-object",
        "not-json",
    ],
)
def test_malformed_savepoint_bodies_are_400_never_500(job: Job, body: bytes, complaint: str) -> None:
    response = httpx.post(f"{job.url}/jobs/{job.job_id}/savepoints", headers=JSON, content=body)
    assert response.status_code == 400, response.text
    assert complaint in response.json()["errors"][0]
    job.assert_running()


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        (b'{"drain": "yes"}', "drain"),
        (b'{"drain": 0}', "drain"),
        (b'{"targetDirectory": 5}', "targetDirectory"),
        (b'{"targetDirectory": "relative/dir"}', "absolute"),
    ],
)
def test_malformed_stop_bodies_are_400(job: Job, body: bytes, complaint: str) -> None:
    response = httpx.post(f"{job.url}/jobs/{job.job_id}/stop", headers=JSON, content=body)
    assert response.status_code == 400, response.text
    assert complaint in response.json()["errors"][0]
    job.assert_running()


def test_cancel_job_false_as_a_string_is_false_as_in_flink(job: Job) -> None:
    """Flink's Jackson reads "false" for a boolean field as false; before, any non-empty string
    was true and `"cancel-job": "false"` cancelled the job."""
    with httpx.Client(base_url=job.url, headers=JSON) as http:
        response = http.post(
            f"/jobs/{job.job_id}/savepoints",
            json={"target-directory": str(job.savepoints / "string-false"), "cancel-job": "false"},
        )
        assert response.status_code == 202, response.text
        operation = poll_trigger(http, job.job_id, response.json()["request-id"])
    assert (Path(operation["location"]) / "_metadata").is_file()
    job.assert_running()


@pytest.mark.parametrize(
    ("drain", "logged"), [("false", False), ("FALSE", False), ("true", True), (None, False)]
)
def test_drain_as_a_string_is_read_as_flink_reads_it(
    drain: str | None, logged: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor="local")
    client = running_job(env, name="to stop")
    assert env.rest_url is not None
    try:
        wait_for(lambda: client.get_job_status() is JobStatus.RUNNING, "the job running")
        with httpx.Client(base_url=env.rest_url, headers=JSON, timeout=30) as http:
            response = http.post(
                f"/jobs/{client.get_job_id()}/stop", json={"targetDirectory": str(tmp_path), "drain": drain}
            )
            assert response.status_code == 202, response.text
            poll_trigger(http, client.get_job_id(), response.json()["request-id"])
        client.get_job_execution_result(timeout=60)
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Stop-with-savepoint")]
        assert ("with drain" in line) is logged, line
    finally:
        env.close()


# ---------------------------------------------------------------------------- target directories


@pytest.mark.parametrize("directory", ["relative", "./here", "../escaped", "savepoints/../.."])
def test_a_relative_target_directory_is_refused_naming_the_fix(job: Job, directory: str) -> None:
    """A relative path would be resolved against the driver's working directory, which the
    client does not know: refused (Flink's CLI and chandy's make a local path absolute)."""
    response = httpx.post(
        f"{job.url}/jobs/{job.job_id}/savepoints", headers=JSON, json={"target-directory": directory}
    )
    assert response.status_code == 400, response.text
    message = response.json()["errors"][0]
    assert "absolute" in message and directory in message
    job.assert_running()


# ---------------------------------------------------------------------------- the dashboard


@pytest.mark.parametrize("path", ["/", "/index.html", "/app.js", "/jobs", "/no-such-file"])
def test_no_page_of_the_server_may_be_framed(job: Job, path: str) -> None:
    """The dashboard's buttons cancel and stop jobs: a page that framed it could make the
    operator click them (clickjacking)."""
    response = httpx.get(job.url + path)
    assert response.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"


# ---------------------------------------------------------------------------- tokens


@pytest.mark.parametrize("token", ["x", "fifteen-chars!!", " " * 20, "\t" * 16, f" {TOKEN}"])
def test_a_weak_or_unmatchable_token_is_refused(token: str) -> None:
    with pytest.raises(ConfigurationError, match="rest.auth.token") as error:
        RestServer(
            Configuration({"rest.bind-address": "0.0.0.0", "rest.port": 0, "rest.auth.token": token}),
            Dispatcher(),
        )
    assert token not in str(error.value)  # never in a log


def test_a_token_of_sixteen_characters_is_enough() -> None:
    serve({"rest.auth.token": "0123456789abcdef"}).stop()


# ---------------------------------------------------------------------------- the port fallback


def test_with_a_token_a_taken_rest_port_is_an_error_not_a_move(taken_port: int) -> None:  # noqa: F811
    """Clients send the token to rest.port: if the job moved on, whatever holds that port got it."""
    with pytest.raises(ConfigurationError) as error:
        serve({"rest.port": taken_port, "rest.auth.token": TOKEN})
    message = str(error.value)
    assert f"rest.port {taken_port} is taken" in message
    assert "rest.bind-port" in message and "rest.port" in message


# ---------------------------------------------------------------------------- the CLI and the token


class _Impostor(http.server.BaseHTTPRequestHandler):
    """Whatever holds the port the CLI was pointed at: answers everything, records headers."""

    seen: list[dict[str, str]]

    def _answer(self) -> None:
        self.seen.append(dict(self.headers))
        body = json.dumps(
            {"jobs": [], "service": "chandy", "token-required": True, "proof": "0" * 64}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def impostor() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Handler", (_Impostor,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("command", ["list", "cancel"])
def test_the_cli_never_sends_the_token_to_a_server_that_cannot_prove_it_holds_it(
    impostor: tuple[str, list[dict[str, str]]], command: str
) -> None:
    address, seen = impostor
    with RestClient(address, TOKEN) as client, pytest.raises(CliError) as error:
        if command == "list":
            client.jobs_overview()
        else:
            client.cancel("0" * 32)
    assert "not sent" in str(error.value) and address in str(error.value)
    assert seen, "the CLI asked the impostor something"
    assert not any(TOKEN in value for headers in seen for value in headers.values()), seen


def test_the_cli_does_not_send_a_token_to_a_chandy_job_holding_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another job on the port (with a token of its own): the CLI learns it holds another
    token without sending this one (the server would log a wrong token)."""
    server = serve({"rest.auth.token": "another-token-of-this-length"})
    address = f"127.0.0.1:{server.port}"
    try:
        with RestClient(address, TOKEN) as client, pytest.raises(CliError, match="not sent"):
            client.jobs_overview()
        with RestClient(address, "another-token-of-this-length") as client:
            assert client.jobs_overview() == []
    finally:
        server.stop()
    assert not any("wrong token" in r.getMessage() for r in caplog.records)


def test_the_identity_proof_is_an_hmac_of_the_nonce_only_the_token_holder_can_make() -> None:
    server = serve({"rest.auth.token": TOKEN})
    try:
        nonce = "ab" * 16
        answer = httpx.get(f"{server.url}/v1/chandy/identity", params={"nonce": nonce})
        assert answer.status_code == 200  # no token needed to ask
        body = answer.json()
        assert body["service"] == "chandy" and body["token-required"] is True
        assert TOKEN not in answer.text and body["proof"] != nonce
        assert len(body["proof"]) == 64 and all(c in "0123456789abcdef" for c in body["proof"])
        assert not hmac.compare_digest(
            body["proof"],
            httpx.get(f"{server.url}/v1/chandy/identity", params={"nonce": "cd" * 16}).json()["proof"],
        )
        assert httpx.get(f"{server.url}/v1/chandy/identity", params={"nonce": "short"}).status_code == 400
    finally:
        server.stop()
    open_server = serve({})
    try:
        body = httpx.get(f"{open_server.url}/chandy/identity", params={"nonce": "ab" * 16}).json()
        assert body["token-required"] is False and body["proof"] is None
        with RestClient(f"127.0.0.1:{open_server.port}", TOKEN) as client:
            assert client.jobs_overview() == []  # no token needed: none sent
    finally:
        open_server.stop()
