"""The dashboard in a real browser: Debian's chromium, driven by playwright, against a running job.

The job is the kind the dashboard is for: an unbounded source of orders, a keyed
event-time window and an exactly-once file sink, checkpointing every 150 ms, on the
local executor, with the REST server on a port the system picks. The browser loads
the page, follows the job, reads the checkpoint tab and stops the job with a
savepoint through the page's buttons, as an operator would. Every wait is
playwright's (``expect`` with a timeout), never a sleep. Screenshots go to the
test's ``tmp_path`` (an artifact of the run, never in git).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from chandy import StreamExecutionEnvironment
from chandy.connectors import DataGeneratorSource, Encoder, FileSink
from chandy.core.functions import MapFunction, RuntimeContext
from chandy.core.time import Time
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.core.windows import TumblingEventTimeWindows
from chandy.messages.status import JobStatus
from chandy.runtime.job_client import JobClient
from tests.probes import Probe

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
#: Event time of order 0 (2026-11-24 00:00 UTC): watermarks read as times on the page.
EPOCH_MS = 1_795_478_400_000
PRODUCTS = ("apples", "pears", "plums", "figs", "dates", "limes", "kiwis")
#: The token of the token test (rest.auth.token takes 16 characters or more).
DASHBOARD_TOKEN = "s3cret-token-of-the-dashboard"
#: Generous: the machine is shared and Spark tests may run beside this one.
WAIT_MS = 90_000


def order(index: int) -> tuple[str, int, int]:
    """Order ``index``: (product, amount in cents, event time); 500 orders per event-time second."""
    return PRODUCTS[index % len(PRODUCTS)], 100 + index % 900, EPOCH_MS + index * 2


def event_time(value: tuple[str, int, int], record_timestamp: int) -> int:
    return value[2]


def product(value: tuple[str, int, int]) -> str:
    return value[0]


def add(a: tuple[str, int, int], b: tuple[str, int, int]) -> tuple[str, int, int]:
    return a[0], a[1] + b[1], max(a[2], b[2])


class RejectOrderOnce(MapFunction):
    """Raises on order ``at`` of subtask 0, once across restarts (the probe counts it)."""

    def __init__(self, probe: Probe, at: int) -> None:
        self.probe = probe
        self.at = at
        self.seen = 0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.subtask = runtime_context.get_index_of_this_subtask()

    def map(self, value: Any) -> Any:
        self.seen += 1
        if self.subtask == 0 and self.seen == self.at and self.probe.add("failures") == 1:
            raise ValueError(f"order {value!r} has no customer")
        return value


def start_orders_job(
    directory: Path,
    config: dict[str, Any] | None = None,
    records_per_second: float = 2000,
    savepoint_dir: bool = True,
    reject_order_at: int | None = None,
    executor: str = "local",
) -> tuple[StreamExecutionEnvironment, JobClient]:
    """Orders → revenue per product in 1 s tumbling event-time windows → FileSink, running
    until stopped; the REST server on a free port. Also used to take the README's screenshot."""
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    env.enable_checkpointing(150)
    settings: dict[str, Any] = {
        "rest.port": 0,
        "execution.checkpointing.dir": str(directory / "checkpoints"),
        # A history long enough that a clicked row still has its details a few polls later.
        "web.checkpoints.history": 40,
    }
    if savepoint_dir:
        settings["execution.checkpointing.savepoint-dir"] = str(directory / "savepoints")
    env.configure({**settings, **(config or {})})
    orders = env.from_source(
        DataGeneratorSource(order, None, records_per_second=records_per_second),
        WatermarkStrategy.for_bounded_out_of_orderness(200).with_timestamp_assigner(event_time),
        "orders",
    )
    if reject_order_at is not None:
        orders = orders.map(RejectOrderOnce(Probe(str(directory / "probe")), reject_order_at))
    (
        orders.key_by(product)
        .window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .reduce(add)
        .name("revenue per product (1 s windows)")
        .sink_to(FileSink.for_row_format(str(directory / "out"), Encoder.simple_string_encoder()).build())
    )
    client = env.execute_async("orders: revenue per product")
    return env, client


def launch_chromium(
    playwright: Any, executable: Path = CHROMIUM, extra_args: tuple[str, ...] = ()
) -> Browser:
    """Debian's chromium; a missing one fails the test (setup.sh installs it), never skips it."""
    if not executable.exists():
        pytest.fail(f"Debian's chromium is not installed ({executable} is missing): run ./setup.sh")
    browser: Browser = playwright.chromium.launch(
        executable_path=str(executable), args=[*CHROMIUM_ARGS, *extra_args]
    )
    return browser


def test_without_chromium_the_dashboard_tests_fail_naming_setup_sh(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"no-chromium is missing\): run \./setup\.sh"):
        launch_chromium(None, tmp_path / "no-chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page
    finally:
        context.close()
    assert not errors, f"the page raised JavaScript errors: {errors}"


def end(env: StreamExecutionEnvironment, client: JobClient) -> None:
    """Cancel the job if it still runs, wait for its end, stop the REST server."""
    if not client.get_job_status().is_globally_terminal:
        client.cancel()
    try:
        client.get_job_execution_result(timeout=60)
    except Exception:  # noqa: BLE001 - a cancelled job ends with an error; the tests assert the rest
        pass
    env.close()


@pytest.fixture
def orders_job(tmp_path: Path, executor: str) -> Iterator[tuple[StreamExecutionEnvironment, JobClient]]:
    """The orders job on each executor: threads, or Spark slots (whose metrics reach the
    driver over their control connections)."""
    env, client = start_orders_job(tmp_path, executor=executor)
    try:
        yield env, client
    finally:
        end(env, client)


def job_row(page: Page, job_id: str) -> Any:
    return page.locator(f'[data-testid="job-row"][data-job-id="{job_id}"]')


def checkpoint_number(text: str) -> int:
    """The checkpoint id in a text such as "#12 · 2026-11-24 ..."."""
    found = re.search(r"#(\d+)", text)
    assert found is not None, f"no checkpoint id in {text!r}"
    return int(found.group(1))


def local_path(location: str) -> Path:
    """A savepoint location as the API reports it (``file:`` URI or plain path)."""
    return Path(re.sub(r"^file:(//)?", "", location))


@pytest.mark.slow
def test_the_dashboard_follows_a_running_job_and_stops_it_with_a_savepoint(
    page: Page, orders_job: tuple[StreamExecutionEnvironment, JobClient], tmp_path: Path
) -> None:
    env, client = orders_job
    url = env.rest_url
    assert url is not None, "execute_async() started no REST server"
    job_id = client.get_job_id()
    job = httpx.get(f"{url}/jobs/{job_id}", timeout=30).json()
    vertex_names = [v["name"] for v in job["vertices"]]
    edges = sum(len(node["inputs"]) for node in job["plan"]["nodes"])

    # The jobs list shows the job RUNNING, with its uptime.
    page.goto(f"{url}/")
    row = job_row(page, job_id)
    expect(row.get_by_test_id("job-row-status")).to_have_text("RUNNING", timeout=WAIT_MS)
    expect(row).to_contain_text("orders: revenue per product")

    # The job's page: its graph, one box per vertex, the edges between them.
    row.get_by_test_id("job-link").click()
    expect(page.get_by_test_id("job-status")).to_have_text("RUNNING", timeout=WAIT_MS)
    expect(page.get_by_test_id("job-id")).to_have_text(job_id)
    expect(page.get_by_test_id("vertex")).to_have_count(len(vertex_names), timeout=WAIT_MS)
    expect(page.get_by_test_id("graph-edge")).to_have_count(edges)
    for name in vertex_names:
        expect(page.locator(f'[data-testid="vertex"][data-vertex-name="{name}"]')).to_be_visible()
    # Each box fills in from the metrics: the source's rate, every vertex's backpressure level,
    # and the event-time watermark (order 0 is at 00:00:00.000 of 2026-11-24).
    sources = {node["id"] for node in job["plan"]["nodes"] if not node["inputs"]}
    for vertex in job["vertices"]:
        box = page.locator(f'[data-testid="vertex"][data-vertex-id="{vertex["id"]}"]')
        if vertex["id"] in sources:
            expect(box.get_by_test_id("vertex-rates")).to_contain_text(
                re.compile(r"out [1-9]"), timeout=WAIT_MS
            )
        expect(box.get_by_test_id("vertex-backpressure")).to_have_text(re.compile(r"^(OK|LOW|HIGH) \d+%$"))
        expect(box.get_by_test_id("vertex-watermark")).to_have_text(
            re.compile(r"^watermark (\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d\.\d{3}$"), timeout=WAIT_MS
        )
    # A click on a box lists its subtasks, each with its own rate (skew shows here).
    source = next(v for v in job["vertices"] if v["id"] in sources)
    page.locator(f'[data-testid="vertex"][data-vertex-id="{source["id"]}"]').click()
    expect(page.get_by_test_id("vertex-detail-title")).to_contain_text(source["name"])
    subtask_rows = page.get_by_test_id("vertex-subtask-row")
    expect(subtask_rows).to_have_count(source["parallelism"])
    for index in range(source["parallelism"]):
        expect(subtask_rows.nth(index).locator("td").nth(2)).to_have_text(
            re.compile(r"^[1-9]"), timeout=WAIT_MS
        )
    page.screenshot(path=str(tmp_path / "1-graph.png"), full_page=True)

    # The checkpoint tab fills in: counts and a history of completed checkpoints.
    page.get_by_test_id("tab-checkpoints").click()
    completed = page.locator('[data-testid="ckpt-row"][data-status="COMPLETED"]')
    expect(completed.nth(2)).to_be_visible(timeout=WAIT_MS)
    expect(page.get_by_test_id("ckpt-count-completed")).to_have_text(re.compile(r"^[1-9][0-9]*$"))
    expect(page.get_by_test_id("ckpt-latest-completed")).to_contain_text("#")
    expect(page.get_by_test_id("ckpt-chart-svg")).to_be_visible()
    total_subtasks = sum(v["parallelism"] for v in job["vertices"])
    expect(completed.first.get_by_test_id("ckpt-acks")).to_have_text(f"{total_subtasks}/{total_subtasks}")

    # A row's per-subtask acknowledgement detail: every subtask completed, with its timings.
    checkpoint_id = completed.first.get_attribute("data-checkpoint-id")
    page.locator(f'[data-testid="ckpt-row"][data-checkpoint-id="{checkpoint_id}"]').click()
    expect(page.get_by_test_id("ckpt-detail-title")).to_contain_text(f"#{checkpoint_id}")
    subtasks = page.locator('[data-testid="subtask-row"][data-status="completed"]')
    expect(subtasks).to_have_count(total_subtasks, timeout=WAIT_MS)
    expect(page.get_by_test_id("ckpt-detail-vertex")).to_have_count(len(vertex_names))
    for cell in ("subtask-sync", "subtask-async", "subtask-alignment", "subtask-start-delay"):
        expect(subtasks.first.get_by_test_id(cell)).to_have_text(re.compile(r"^\d+(\.\d+)? m?s$"))
    page.screenshot(path=str(tmp_path / "2-checkpoints.png"), full_page=True)

    # A savepoint from the page: its path shown, the history marks it, the job runs on.
    page.get_by_test_id("btn-savepoint").click()
    savepoint_path = page.get_by_test_id("savepoint-path")
    expect(savepoint_path).to_be_visible(timeout=WAIT_MS)
    savepoint = local_path(savepoint_path.inner_text())
    assert savepoint.parent == tmp_path / "savepoints"
    assert (savepoint / "_metadata").is_file()
    expect(page.get_by_test_id("ckpt-latest-savepoint")).to_contain_text(savepoint.name, timeout=WAIT_MS)
    expect(page.get_by_test_id("savepoint-mark").first).to_be_visible()
    expect(page.get_by_test_id("job-status")).to_have_text("RUNNING")

    # Stop with a savepoint into the directory typed in: the job ends FINISHED.
    stop_directory = tmp_path / "stopped"
    page.get_by_test_id("savepoint-dir").fill(str(stop_directory))
    page.get_by_test_id("btn-stop").click()
    expect(page.get_by_test_id("action-result")).to_contain_text("Job stopped", timeout=WAIT_MS)
    final = local_path(savepoint_path.inner_text())
    expect(page.get_by_test_id("job-status")).to_have_text("FINISHED", timeout=WAIT_MS)
    expect(page.get_by_test_id("btn-stop")).to_be_disabled()
    page.screenshot(path=str(tmp_path / "3-stopped.png"), full_page=True)
    assert final.parent == stop_directory
    assert (final / "_metadata").is_file()
    client.get_job_execution_result(timeout=60)
    assert client.get_job_status() is JobStatus.FINISHED

    # Back on the jobs list, the job is listed FINISHED.
    page.get_by_test_id("back-to-jobs").click()
    expect(job_row(page, job_id).get_by_test_id("job-row-status")).to_have_text("FINISHED")


@pytest.mark.slow
def test_with_a_token_the_page_asks_for_it_once_and_keeps_it_for_the_tab(page: Page, tmp_path: Path) -> None:
    env, client = start_orders_job(tmp_path, {"rest.auth.token": DASHBOARD_TOKEN}, records_per_second=200)
    try:
        url = env.rest_url
        assert url is not None
        job_id = client.get_job_id()
        assert httpx.get(f"{url}/jobs/overview", timeout=30).status_code == 401

        page.goto(f"{url}/")
        overlay = page.get_by_test_id("token-overlay")
        expect(overlay).to_be_visible(timeout=WAIT_MS)
        # A wrong token is rejected, and the page asks again, saying so.
        page.get_by_test_id("token-input").fill("wrong")
        page.get_by_test_id("token-submit").click()
        expect(page.get_by_test_id("token-error")).to_be_visible(timeout=WAIT_MS)
        page.get_by_test_id("token-input").fill(DASHBOARD_TOKEN)
        page.get_by_test_id("token-submit").click()
        expect(overlay).to_be_hidden()
        expect(job_row(page, job_id).get_by_test_id("job-row-status")).to_have_text(
            "RUNNING", timeout=WAIT_MS
        )
        page.screenshot(path=str(tmp_path / "token.png"), full_page=True)

        # The tab keeps it: a reload asks no more.
        page.reload()
        expect(job_row(page, job_id).get_by_test_id("job-row-status")).to_have_text(
            "RUNNING", timeout=WAIT_MS
        )
        expect(overlay).to_be_hidden()

        # Cancel from the page (two clicks: the first arms the button).
        job_row(page, job_id).get_by_test_id("job-link").click()
        cancel = page.get_by_test_id("btn-cancel")
        expect(cancel).to_be_enabled(timeout=WAIT_MS)
        cancel.click()
        expect(cancel).to_have_text("Confirm cancel")
        cancel.click()
        expect(page.get_by_test_id("job-status")).to_have_text("CANCELED", timeout=WAIT_MS)
    finally:
        end(env, client)
    assert client.get_job_status() is JobStatus.CANCELED


@pytest.mark.slow
def test_a_failed_savepoint_or_stop_shows_the_reason_and_the_job_runs_on(page: Page, tmp_path: Path) -> None:
    env, client = start_orders_job(tmp_path, records_per_second=200, savepoint_dir=False)
    try:
        url = env.rest_url
        assert url is not None
        job_id = client.get_job_id()
        # A job id this driver does not know (an old link) says so, with its buttons off.
        page.goto(f"{url}/#/jobs/{'0' * 32}")
        expect(page.get_by_test_id("job-name")).to_have_text("Job not found on this driver", timeout=WAIT_MS)
        expect(page.get_by_test_id("btn-stop")).to_be_disabled()
        page.goto(f"{url}/#/jobs/{job_id}")
        expect(page.get_by_test_id("job-status")).to_have_text("RUNNING", timeout=WAIT_MS)

        # No directory typed in and none configured: the error names the setting.
        page.get_by_test_id("btn-savepoint").click()
        expect(page.get_by_test_id("action-error")).to_contain_text(
            "execution.checkpointing.savepoint-dir", timeout=WAIT_MS
        )
        expect(page.get_by_test_id("action-result")).to_have_attribute("data-state", "error")

        # A stop whose savepoint cannot be written (its directory would be under a file):
        # the reason is shown, the job keeps running, and it can still be stopped.
        blocker = tmp_path / "a-file"
        blocker.write_text("not a directory\n")
        page.get_by_test_id("savepoint-dir").fill(str(blocker / "savepoints"))
        page.get_by_test_id("btn-stop").click()
        expect(page.get_by_test_id("action-error")).to_be_visible(timeout=WAIT_MS)
        expect(page.get_by_test_id("action-result")).to_contain_text("the job keeps running")
        page.screenshot(path=str(tmp_path / "failed-stop.png"), full_page=True)
        expect(page.get_by_test_id("job-status")).to_have_text("RUNNING", timeout=WAIT_MS)
        expect(page.get_by_test_id("btn-stop")).to_be_enabled(timeout=WAIT_MS)
        assert client.get_job_status() is JobStatus.RUNNING

        # Stopped for good, draining: the page sends Flink's stop request with drain on.
        page.get_by_test_id("savepoint-dir").fill(str(tmp_path / "savepoints"))
        page.get_by_test_id("stop-drain").check()
        with page.expect_request(lambda request: request.method == "POST" and "/stop" in request.url) as sent:
            page.get_by_test_id("btn-stop").click()
        assert sent.value.post_data_json == {"targetDirectory": str(tmp_path / "savepoints"), "drain": True}
        expect(page.get_by_test_id("savepoint-path")).to_be_visible(timeout=WAIT_MS)
        expect(page.get_by_test_id("job-status")).to_have_text("FINISHED", timeout=WAIT_MS)
        assert (local_path(page.get_by_test_id("savepoint-path").inner_text()) / "_metadata").is_file()
    finally:
        end(env, client)


@pytest.mark.slow
def test_a_failover_shows_in_the_exceptions_tab_and_as_the_latest_restore(page: Page, tmp_path: Path) -> None:
    env, client = start_orders_job(
        tmp_path,
        {"restart-strategy.fixed-delay.delay": 100},
        records_per_second=400,
        reject_order_at=400,  # about 2 s in: a few checkpoints completed before
    )
    try:
        url = env.rest_url
        assert url is not None
        page.goto(f"{url}/#/jobs/{client.get_job_id()}/exceptions")
        exception = page.get_by_test_id("exception")
        expect(exception).to_have_count(1, timeout=WAIT_MS)
        expect(exception).to_contain_text("ValueError")
        expect(exception.get_by_test_id("exception-message")).to_contain_text("has no customer")
        expect(page.get_by_test_id("tab-exceptions")).to_contain_text("(1)")
        # The job restarted from its latest checkpoint and runs on.
        expect(page.get_by_test_id("job-status")).to_have_text("RUNNING", timeout=WAIT_MS)
        expect(page.get_by_test_id("job-restarts")).to_have_text("1")
        page.screenshot(path=str(tmp_path / "exceptions.png"), full_page=True)
        page.get_by_test_id("tab-checkpoints").click()
        expect(page.get_by_test_id("ckpt-count-restored")).to_have_text("1", timeout=WAIT_MS)
        expect(page.get_by_test_id("ckpt-latest-restored")).to_contain_text("from checkpoint")
        expect(page.get_by_test_id("ckpt-latest-restored")).to_contain_text("chk-")
        # "details" on the latest completed checkpoint opens its subtask detail (a later
        # checkpoint may have become the latest between reading and clicking).
        latest = page.get_by_test_id("ckpt-latest-completed")
        before = checkpoint_number(latest.inner_text())
        latest.get_by_test_id("latest-details").click()
        expect(page.get_by_test_id("subtask-row").first).to_be_visible(timeout=WAIT_MS)
        assert checkpoint_number(page.get_by_test_id("ckpt-detail-title").inner_text()) >= before
    finally:
        end(env, client)
