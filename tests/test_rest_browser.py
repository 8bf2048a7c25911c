"""Web pages in a real browser (Debian's chromium, driven by playwright) against a running job.

The job's REST API listens on loopback without a token, chandy's default. Two pages
try to cancel it, as issue 27 found they could:

- a page of another origin (a second HTTP server on another port, under another host
  name) posts ``{"cancel-job": true}`` to ``/jobs/<id>/savepoints`` with ``fetch`` in
  ``no-cors`` mode and with a ``text/plain`` form (whose body is valid JSON), the
  requests a browser sends to any origin without asking it; and tries a ``PATCH``
  cancel, which the browser sends only if a CORS preflight allows it;
- a page reached under a name of its own that resolves to 127.0.0.1 (DNS rebinding,
  simulated with chromium's ``--host-resolver-rules``): to the browser the API is then
  the page's own origin, so it reads answers and sends any request.

Each must be refused (415, no preflight granted, 403), the job must keep running,
and the dashboard itself, under the new headers, must still work. Every wait is for an
event (the server's log line of a refusal, a page's promise), never a sleep.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect, sync_playwright

from chandy import StreamExecutionEnvironment
from chandy.errors import JobCancelledError
from chandy.messages.status import JobStatus
from tests.test_dashboard import WAIT_MS, job_row, launch_chromium
from tests.test_rest_api import running_job, wait_for
from tests.test_rest_security import Job

#: The name the rebinding page uses: chromium resolves it to 127.0.0.1.
REBOUND = "rebound.attacker.example"

ATTACK_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>cheap flights</title></head>
<body>
<iframe name="sink"></iframe>
<form id="form" method="POST" enctype="text/plain" target="sink" action="API/jobs/JOB/savepoints">
  <input type="hidden" name='{"cancel-job": true, "target-directory": "DIR", "x": "' value='"}'>
</form>
<script>
  async function attack() {
    const outcome = {};
    try {
      await fetch("API/jobs/JOB/savepoints",
                  {method: "POST", mode: "no-cors", body: '{"cancel-job": true, "target-directory": "DIR"}'});
      outcome.fetch = "sent";
    } catch (error) {
      outcome.fetch = "failed: " + error;
    }
    try {
      await fetch("API/jobs/JOB?mode=cancel",
                  {method: "PATCH", headers: {"Content-Type": "application/json"}, body: "{}"});
      outcome.patch = "sent";
    } catch (error) {
      outcome.patch = "blocked: " + error;
    }
    document.getElementById("form").submit();
    return outcome;
  }
</script>
</body></html>
"""


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    env = StreamExecutionEnvironment.get_execution_environment({"rest.port": 0}, executor="local")
    client = running_job(env, name="a job a web page tries to cancel")
    wait_for(lambda: client.get_job_status() is JobStatus.RUNNING, "the job running")
    yield Job(env, client, tmp_path / "savepoints")
    if not client.get_job_status().is_globally_terminal:
        client.cancel()
    with pytest.raises(JobCancelledError):
        client.get_job_execution_result(timeout=60)
    env.close()


@pytest.fixture
def attacker(job: Job) -> Iterator[str]:
    """A second HTTP server (another port, another host name: another origin) serving the attack."""
    page = (
        ATTACK_PAGE.replace("API", job.url).replace("JOB", job.job_id).replace("DIR", str(job.savepoints))
    ).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{server.server_address[1]}/"  # localhost, not 127.0.0.1: another site too
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright, extra_args=(f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",))
        try:
            yield browser
        finally:
            browser.close()


def refusals(caplog: pytest.LogCaptureFixture, status: int, path: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "chandy.web.guard" and f"refused ({status})" in r.getMessage() and path in r.getMessage()
    ]


def test_a_cross_origin_page_cannot_cancel_the_job(
    browser: Browser, job: Job, attacker: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="chandy.web")
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(attacker)
        outcome = page.evaluate("attack()")
        # no-cors: the browser sent the POST and hides the answer; the PATCH needed a
        # preflight, which the server did not grant, so the browser never sent it
        assert outcome["fetch"] == "sent", outcome
        assert outcome["patch"].startswith("blocked: TypeError"), outcome
        savepoints = f"/jobs/{job.job_id}/savepoints"
        wait_for(
            lambda: (
                len(refusals(caplog, 415, savepoints)) >= 2
                or job.client.get_job_status().is_globally_terminal
            ),
            "both POSTs refused (or the job ended)",
        )
    finally:
        context.close()
    assert job.client.get_job_status() is JobStatus.RUNNING
    refused = refusals(caplog, 415, savepoints)
    assert len(refused) == 2 and all("text/plain" in line for line in refused), refused
    assert not any("PATCH" in r.getMessage() for r in caplog.records if r.name == "chandy.web.guard")
    assert not job.savepoints.exists()


def test_a_rebinding_page_cannot_read_or_cancel_the_job(
    browser: Browser, job: Job, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="chandy.web")
    context = browser.new_context()
    try:
        page = context.new_page()
        response = page.goto(f"http://{REBOUND}:{job.port}/")
        assert response is not None and response.status == 403
        # the page now runs as the API's own origin: same-origin requests, no CORS to stop them
        outcome = page.evaluate(
            """async (jobId) => {
                const listed = await fetch("/jobs/overview");
                const cancelled = await fetch("/jobs/" + jobId + "?mode=cancel",
                    {method: "PATCH", headers: {"Content-Type": "application/json"}, body: "{}"});
                return {listed: listed.status, body: await listed.text(), cancelled: cancelled.status};
            }""",
            job.job_id,
        )
    finally:
        context.close()
    assert outcome["listed"] == 403 and outcome["cancelled"] == 403, outcome
    assert (
        job.job_id not in outcome["body"] and "rest.allowed-hosts" in json.loads(outcome["body"])["errors"][0]
    )
    assert refusals(caplog, 403, f"/jobs/{job.job_id}")
    assert job.client.get_job_status() is JobStatus.RUNNING


def test_the_dashboard_still_works_under_its_headers(browser: Browser, job: Job) -> None:
    """X-Frame-Options and the Content-Security-Policy must not break the page itself."""
    context = browser.new_context()
    problems: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
        response = page.goto(f"{job.url}/")
        assert response is not None and response.headers["x-frame-options"] == "DENY"
        expect(job_row(page, job.job_id).get_by_test_id("job-row-status")).to_have_text(
            "RUNNING", timeout=WAIT_MS
        )
    finally:
        context.close()
    assert not problems, problems
