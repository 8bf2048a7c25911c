"""Async I/O (``AsyncDataStream``): the operator against a real asyncio TCP service on
127.0.0.1 (tests/async_server.py), then whole jobs on both executors.

The operator tests play the task thread themselves: they feed batches and run the
operator's mails from a real :class:`Mailbox`. The service holds chosen requests until the
test releases them, so completion orders are the test's choice, not the scheduler's.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.api.async_data_stream import AsyncDataStream
from chandy.connectors import DataGeneratorSource
from chandy.core.async_retry import (
    NO_RETRY_STRATEGY,
    AsyncRetryStrategy,
    ExponentialBackoffDelayRetryStrategy,
    empty_result_predicate,
    exception_type_predicate,
)
from chandy.core.functions import AsyncFunction, CheckpointListener, RuntimeContext
from chandy.core.time import Time
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.core.windows import TumblingEventTimeWindows
from chandy.errors import InvalidProgramError
from chandy.network.cancellation import TaskCancelledError
from chandy.network.wakeup import Wakeup
from chandy.task.batches import TimestampedBatch
from chandy.task.mailbox import Mailbox
from chandy.task.operators.async_wait import AsyncWaitOperator, InFlightRecord, InFlightWatermark
from tests.async_server import DoublingClient, RequestServer, ServiceError
from tests.operator_harness import OperatorHarness, Snapshot
from tests.probes import Probe
from tests.test_checkpointing_e2e import cancel_keeping_results, drain, latest_checkpoint_dir


class AsyncHarness:
    """One subtask of the async operator, with this thread as its task thread: ``events``
    logs outputs and watermarks in the order the operator emitted them."""

    def __init__(
        self,
        function: AsyncFunction[Any, Any],
        *,
        ordered: bool = True,
        capacity: int = 100,
        timeout_ms: int = 30_000,
        retry: AsyncRetryStrategy[Any] = NO_RETRY_STRATEGY,
        should_abort: Callable[[], bool] = lambda: False,
    ) -> None:
        self.operator = AsyncWaitOperator(function, timeout_ms, capacity, ordered, retry)
        self.events: list[tuple[Any, ...]] = []
        self.harness = OperatorHarness(self.operator, output=self._collect)
        self.wakeup = Wakeup()
        self.operator.mailbox = Mailbox(self.wakeup)
        self.operator.emit_watermark = lambda ts: self.events.append(("watermark", ts))
        self.operator.bind_task_services(None, should_abort)

    def _collect(self, batch: Any) -> None:
        if type(batch) is list:
            self.events += [("out", v) for v in batch]
        else:
            assert type(batch) is TimestampedBatch
            self.events += [("out", v, t) for v, t in batch]

    def open(self, restore_from: list[Snapshot] | None = None) -> AsyncHarness:
        self.harness.open(restore_from, 1 if restore_from is not None else None)
        return self

    def run_mails(self) -> None:
        mailbox = self.operator.mailbox
        assert mailbox is not None
        while (mail := mailbox.try_take()) is not None:
            mail.action()

    def run_mails_until(self, condition: Callable[[], bool], timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.run_mails()
            if condition():
                return
            assert time.monotonic() < deadline, f"condition not met; events: {self.events}"
            self.wakeup.wait(0.5)

    def outputs(self) -> list[Any]:
        return [e[1] for e in self.events if e[0] == "out"]


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("chandy-async-io")]


@pytest.fixture
def held() -> Any:
    """A service that answers a value only once the test released it."""
    with RequestServer(hold=True) as server:
        yield server


# ---------------------------------------------------------------------- order


def test_ordered_wait_emits_in_input_order_whatever_the_completion_order(held: RequestServer) -> None:
    h = AsyncHarness(DoublingClient(held.port), ordered=True).open()
    try:
        h.harness.process(*range(10))
        held.wait_for_requests(10)
        held.release(*range(9, 0, -1))  # everything but the head
        h.run_mails_until(lambda: len(_completed_entries(h)) == 9)
        assert h.outputs() == [], "a result left before the head of the queue completed"
        held.release(0)
        h.run_mails_until(lambda: len(h.outputs()) == 10)
        assert h.outputs() == [(v, 2 * v) for v in range(10)]
    finally:
        h.harness.close()


def _completed_entries(h: AsyncHarness) -> list[Any]:
    """The queued records whose outputs are known (not yet emitted)."""
    return [e for e in h.operator._queue.values() if e.output is not None and not e.watermark]


def test_unordered_wait_emits_on_completion_but_never_across_a_watermark(held: RequestServer) -> None:
    h = AsyncHarness(DoublingClient(held.port), ordered=False).open()
    try:
        h.harness.process(0, 1)
        h.operator.process_watermark(100)
        h.harness.process(2, 3)
        held.wait_for_requests(4)
        held.release(1)
        h.run_mails_until(lambda: len(h.events) == 1)
        assert h.events == [("out", (1, 2))]  # completed first, left first
        held.release(2, 3)  # after the watermark: they wait for it
        h.run_mails_until(lambda: len(_completed_entries(h)) == 2)
        assert h.events == [("out", (1, 2))]
        held.release(0)
        h.run_mails_until(lambda: len(h.events) == 5)
        assert h.events[:3] == [("out", (1, 2)), ("out", (0, 0)), ("watermark", 100)]
        assert sorted(h.events[3:]) == [("out", (2, 4)), ("out", (3, 6))]
        assert h.operator.current_watermark == 100
    finally:
        h.harness.close()


def test_a_watermark_with_nothing_queued_leaves_at_once_and_outputs_keep_their_timestamps() -> None:
    with RequestServer() as server:
        h = AsyncHarness(DoublingClient(server.port), ordered=False).open()
        try:
            h.operator.process_watermark(5)
            assert h.events == [("watermark", 5)]
            h.operator.process_batch(TimestampedBatch([1, 2], [10, None]))  # type: ignore[arg-type]
            h.run_mails_until(lambda: len(h.events) == 3)
            assert sorted(h.events[1:], key=repr) == [("out", (1, 2), 10), ("out", (2, 4), None)]
        finally:
            h.harness.close()


# ---------------------------------------------------------------------- capacity


def test_a_full_queue_blocks_the_task_thread_until_a_request_completes(held: RequestServer) -> None:
    h = AsyncHarness(DoublingClient(held.port), ordered=True, capacity=3).open()
    feeder = threading.Thread(target=h.harness.process, args=tuple(range(5)), name="task-thread")
    try:
        feeder.start()
        held.wait_for_requests(3)
        assert feeder.is_alive(), "process_batch returned with more records than places"
        held.release(0)  # the head completes: its place frees, the fourth record goes out
        held.wait_for_requests(4)
        assert sum(held.requests().values()) == 4 and feeder.is_alive()
        held.release(1, 2, 3, 4)
        feeder.join(30)
        assert not feeder.is_alive()
        h.run_mails_until(lambda: len(h.outputs()) == 5)
        assert h.outputs() == [(v, 2 * v) for v in range(5)]
        assert max(held.requests().values()) == 1
    finally:
        held.release(*range(5))
        feeder.join(30)
        h.harness.close()


def test_a_task_cancelled_while_it_waits_for_a_place_unwinds(held: RequestServer) -> None:
    cancelled = threading.Event()
    h = AsyncHarness(DoublingClient(held.port), capacity=2, should_abort=cancelled.is_set).open()
    caught: list[BaseException] = []

    def task() -> None:
        try:
            h.harness.process(0, 1, 2)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            caught.append(exc)

    feeder = threading.Thread(target=task)
    feeder.start()
    held.wait_for_requests(2)
    cancelled.set()
    feeder.join(10)
    assert not feeder.is_alive() and len(caught) == 1 and isinstance(caught[0], TaskCancelledError)
    h.harness.close()
    assert loop_threads() == []


# ---------------------------------------------------------------------- timeouts, errors, retries


class TimeoutAware(DoublingClient):
    def timeout(self, value: int) -> list[Any]:
        return [(value, "timed out")]


def test_a_request_that_times_out_gives_the_outputs_of_timeout(held: RequestServer) -> None:
    h = AsyncHarness(TimeoutAware(held.port), timeout_ms=50).open()
    try:
        held.release(1)
        h.harness.process(0, 1)
        h.run_mails_until(lambda: len(h.outputs()) == 2)
        assert h.outputs() == [(0, "timed out"), (1, 2)]
    finally:
        h.harness.close()


def test_by_default_a_timeout_fails_the_task_naming_the_input(held: RequestServer) -> None:
    h = AsyncHarness(DoublingClient(held.port), timeout_ms=50).open()
    try:
        h.harness.process(7)
        with pytest.raises(TimeoutError, match="timed out for input: 7"):
            h.run_mails_until(lambda: False, timeout_s=10)
    finally:
        h.harness.close()


def test_an_exception_in_async_invoke_fails_the_task_with_it_as_the_cause() -> None:
    with RequestServer(fail_first_attempts=1) as server:
        h = AsyncHarness(DoublingClient(server.port)).open()
        try:
            h.harness.process(3)
            with pytest.raises(RuntimeError, match=r"DoublingClient.async_invoke failed for input 3") as info:
                h.run_mails_until(lambda: False, timeout_s=10)
            assert isinstance(info.value.__cause__, ServiceError)
        finally:
            h.harness.close()


class NotAList(AsyncFunction[int, Any]):
    async def async_invoke(self, value: int) -> Any:
        return "abc"


def test_a_result_that_is_not_a_list_is_a_clear_error() -> None:
    h = AsyncHarness(NotAList()).open()
    try:
        h.harness.process(1)
        with pytest.raises(TypeError, match="must return a list of outputs"):
            h.run_mails_until(lambda: False, timeout_s=10)
    finally:
        h.harness.close()


def test_retries_on_an_exception_until_the_service_answers() -> None:
    with RequestServer(fail_first_attempts=2) as server:
        retry = AsyncRetryStrategy.fixed_delay(
            3, 1, None, functools.partial(exception_type_predicate, expected_error_type=ServiceError)
        )
        h = AsyncHarness(DoublingClient(server.port), ordered=False, retry=retry, timeout_ms=30_000).open()
        try:
            h.harness.process(*range(5))
            h.run_mails_until(lambda: len(h.outputs()) == 5)
            assert sorted(h.outputs()) == [(v, 2 * v) for v in range(5)]
            assert server.requests() == Counter(dict.fromkeys(range(5), 3))
        finally:
            h.harness.close()


def test_retries_on_an_empty_result_stop_after_max_attempts() -> None:
    with RequestServer(empty_first_attempts=10) as server:
        retry = AsyncRetryStrategy.fixed_delay(2, 1, empty_result_predicate, None)
        h = AsyncHarness(DoublingClient(server.port), retry=retry, timeout_ms=30_000).open()
        try:
            h.harness.process(4)
            h.run_mails_until(lambda: server.requests()[4] == 3 and h.operator._size == 0)
            assert h.outputs() == []  # attempts 1, 2 and 3 were empty; can_retry(3) is False
        finally:
            h.harness.close()


def test_the_timeout_covers_every_attempt_of_a_retried_request() -> None:
    """Flink's rule: a request still retrying when its timeout expires ends in timeout()."""
    with RequestServer(fail_first_attempts=10**6) as server:
        retry = AsyncRetryStrategy.fixed_delay(
            1000, 20, None, functools.partial(exception_type_predicate, expected_error_type=ServiceError)
        )
        h = AsyncHarness(TimeoutAware(server.port), retry=retry, timeout_ms=500).open()
        try:
            started = time.monotonic()
            h.harness.process(9)
            h.run_mails_until(lambda: len(h.outputs()) == 1)
            assert h.outputs() == [(9, "timed out")]
            assert time.monotonic() - started < 5
            assert 2 <= server.requests()[9] <= 26  # at most one attempt every 20 ms for 500 ms
        finally:
            h.harness.close()


def test_exponential_backoff_is_pyflinks_arithmetic() -> None:
    strategy = ExponentialBackoffDelayRetryStrategy(5, 10, 45, 2.0, None, None)
    assert [strategy.get_backoff_time_millis(n) for n in range(1, 6)] == [10, 20, 40, 45, 45]
    assert strategy.can_retry(5) and not strategy.can_retry(6)
    # one strategy serves every request in flight: interleaved requests each get their own
    # sequence (a delay kept on the strategy made B's second wait 40, A's third 80 -> 45)
    interleaved = [strategy.get_backoff_time_millis(n) for n in (1, 1, 2, 2, 3)]
    assert interleaved == [10, 10, 20, 20, 40]
    with pytest.raises(ValueError, match="multiplier"):
        ExponentialBackoffDelayRetryStrategy(5, 10, 45, 0, None, None)


# ---------------------------------------------------------------------- checkpoints


def test_a_snapshot_holds_every_queued_element_and_a_restore_requests_them_again(held: RequestServer) -> None:
    first = AsyncHarness(DoublingClient(held.port), ordered=True).open()
    try:
        first.harness.process(0, 1, 2)
        first.operator.process_watermark(50)
        first.harness.process(3)
        held.wait_for_requests(4)
        held.release(2)  # completed, but behind 0 and 1: not emitted
        first.run_mails_until(lambda: len(_completed_entries(first)) == 1)
        held.release(0)
        _wait_for_mail(first)
        assert first.outputs() == []
        first.operator.prepare_snapshot_pre_barrier(1)  # 0 completed: it leaves ahead of the barrier
        assert first.outputs() == [(0, 0)]
        snapshot = first.harness.snapshot(1)
    finally:
        first.harness.close()  # the task fails: requests 1 and 3 are cancelled
    assert loop_threads() == []
    assert first.operator._state is not None
    assert list(first.operator._state.get()) == [
        InFlightRecord(1, None, False),
        InFlightRecord(2, None, False),
        InFlightWatermark(50),
        InFlightRecord(3, None, False),
    ]

    second = AsyncHarness(DoublingClient(held.port), ordered=True).open([snapshot])
    try:
        held.release(1, 3)
        second.run_mails_until(lambda: len(second.events) == 4)
        assert second.events == [("out", (1, 2)), ("out", (2, 4)), ("watermark", 50), ("out", (3, 6))]
        assert held.requests() == Counter({0: 1, 1: 2, 2: 2, 3: 2})
    finally:
        second.harness.close()


def _wait_for_mail(h: AsyncHarness, timeout_s: float = 30) -> None:
    """Wait until the operator put a mail (a request completed), without running it."""
    mailbox = h.operator.mailbox
    assert mailbox is not None
    deadline = time.monotonic() + timeout_s
    while not mailbox.has_mail():
        assert time.monotonic() < deadline, "no request completed"
        h.wakeup.wait(0.5)


def test_finish_waits_for_every_request(held: RequestServer) -> None:
    h = AsyncHarness(DoublingClient(held.port), ordered=False).open()
    try:
        h.harness.process(*range(20))
        held.wait_for_requests(20)
        releaser = threading.Timer(0.05, held.release, args=tuple(range(20)))
        releaser.start()
        h.harness.end_input()  # blocks until the releases came and every result left
        assert sorted(h.outputs()) == [(v, 2 * v) for v in range(20)]
    finally:
        h.harness.close()


class Lingering(AsyncFunction[int, Any]):
    """A request that never ends by itself; records whether it was cancelled."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()

    async def async_invoke(self, value: int) -> list[Any]:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return []


def test_close_cancels_the_requests_in_flight_and_joins_the_loop_thread() -> None:
    function = Lingering()
    h = AsyncHarness(function).open()
    assert len(loop_threads()) == 1
    h.harness.process(1)
    assert function.started.wait(30)  # a request cancelled before it started runs no code
    h.harness.close()
    assert function.cancelled.is_set()
    assert loop_threads() == []


def test_a_harness_without_a_mailbox_is_told_what_is_missing() -> None:
    operator = AsyncWaitOperator(Lingering(), 0, 10, True, NO_RETRY_STRATEGY)
    harness = OperatorHarness(operator)
    with pytest.raises(RuntimeError, match="has no mailbox"):
        harness.open()
    harness.close()
    assert loop_threads() == []


# ---------------------------------------------------------------------- the API


class Blocking(AsyncFunction[int, int]):
    def async_invoke(self, value: int) -> list[int]:  # type: ignore[override]
        return [value]


def test_the_api_checks_what_pyflink_checks() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    ds = env.from_collection([1, 2, 3])
    with pytest.raises(InvalidProgramError, match="should be declared as 'async def'"):
        AsyncDataStream.unordered_wait(ds, Blocking(), Time.seconds(1))
    retry = AsyncRetryStrategy.fixed_delay(2, 10, empty_result_predicate, None)
    with pytest.raises(InvalidProgramError, match="Timeout should be configured"):
        AsyncDataStream.ordered_wait_with_retry(ds, DoublingClient(0), Time.milliseconds(0), retry)
    with pytest.raises(InvalidProgramError, match="capacity"):
        AsyncDataStream.ordered_wait(ds, DoublingClient(0), Time.seconds(1), capacity=0)
    with pytest.raises(InvalidProgramError, match="timeout must be"):
        AsyncDataStream.ordered_wait(ds, DoublingClient(0), "1s")  # type: ignore[arg-type]


class Subtasked(DoublingClient):
    def open(self, runtime_context: RuntimeContext) -> None:
        super().open(runtime_context)

    async def async_invoke(self, value: int) -> list[Any]:
        return [(self.subtask, *pair) for pair in await super().async_invoke(value)]


def test_a_local_job_gets_every_result_once() -> None:
    with RequestServer(max_latency_ms=2, seed=3) as server:
        env = StreamExecutionEnvironment.get_execution_environment(executor="local")
        env.set_parallelism(2)
        ds = env.from_sequence(0, 499)
        out = AsyncDataStream.ordered_wait(ds, Subtasked(server.port), Time.seconds(30), capacity=10)
        results = list(out.execute_and_collect("async local"))
    assert sorted(v for _, v, _ in results) == list(range(500))
    assert all(a == 2 * v for _, v, a in results)
    assert loop_threads() == [], "a finished task left its event loop thread running"


# ---------------------------------------------------------------------- acceptance: whole jobs

N = 10_000
FAILURE_PROBE = "failures"


class FailOnceClient(DoublingClient, CheckpointListener):
    """The service's client, tagged with its mode and subtask; in the first attempt, once a
    checkpoint completed and half of this subtask's requests were sent, subtask 0 of the
    ordered operator fails the job (once: the probe counts across processes)."""

    def __init__(self, port: int, mode: str, probe: Probe | None, per_subtask: int) -> None:
        super().__init__(port)
        self.mode = mode
        self.probe = probe
        self.per_subtask = per_subtask

    def open(self, runtime_context: RuntimeContext) -> None:
        super().open(runtime_context)
        self.armed = (
            self.probe is not None and self.subtask == 0 and runtime_context.get_attempt_number() == 0
        )
        self.checkpoints = 0
        self.sent = 0

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.checkpoints += 1

    async def async_invoke(self, value: int) -> list[Any]:
        self.sent += 1
        if self.armed and self.checkpoints >= 1 and self.sent >= self.per_subtask // 2:
            self.armed = False
            assert self.probe is not None
            if self.probe.add(FAILURE_PROBE) == 1:
                raise RuntimeError(f"induced failure at request {self.sent} ({value})")
        return [(self.mode, self.subtask, v, a) for v, a in await super().async_invoke(value)]


def check_results(results: list[Any], mode: str) -> None:
    mine = [r for r in results if r[0] == mode]
    counts = Counter(v for _, _, v, _ in mine)
    assert {v: c for v, c in counts.items() if c != 1} == {}, f"{mode}: results emitted more than once"
    assert sorted(counts) == list(range(N)), f"{mode}: {N - len(counts)} results missing"
    assert all(a == 2 * v for _, _, v, a in mine)
    if mode == "ordered":
        for subtask in {s for _, s, _, _ in mine}:
            values = [v for _, s, v, _ in mine if s == subtask]
            assert values == sorted(values), f"ordered_wait reordered subtask {subtask}'s results"


@pytest.mark.slow
def test_ten_thousand_requests_ordered_and_unordered_exactly_once_across_a_failure(executor: str) -> None:
    """Acceptance (issue 14): 10,000 requests with random latency, capacity 100, through
    ordered_wait and unordered_wait side by side; the ordered operator fails the job once
    mid-way. Every result arrives exactly once (collect is exactly-once), in input order per
    subtask for ordered_wait."""
    probe = Probe()
    with RequestServer(max_latency_ms=10, seed=14) as server:
        env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
        env.set_parallelism(2)
        env.enable_checkpointing(100)
        # Batches of 100 records: a barrier waits behind at most one batch of requests, so
        # checkpoints complete well before the middle of the run. A checkpoint triggered while
        # the unordered operator still waits for its last requests after its input ended is
        # taken by it once they are done (the default timeout and no tolerated failure: a
        # checkpoint left waiting for it would fail the test).
        env.configure({"restart-strategy.fixed-delay.delay": 0, "chandy.network.batch-size": 100})
        numbers = env.from_sequence(0, N - 1).uid("numbers")
        ordered = AsyncDataStream.ordered_wait(
            numbers, FailOnceClient(server.port, "ordered", probe, N // 2), Time.seconds(60), capacity=100
        ).uid("ordered")
        # In a task of its own: chained beside the ordered operator, its requests would all
        # complete while the ordered one blocks the shared thread, and leave before each barrier.
        unordered = (
            AsyncDataStream.unordered_wait(
                numbers,
                FailOnceClient(server.port, "unordered", None, N // 2),
                Time.seconds(60),
                capacity=100,
            )
            .uid("unordered")
            .disable_chaining()
        )
        results = list(ordered.union(unordered).execute_and_collect("async I/O exactly once", limit=10**6))
        requests = server.requests()
    assert probe.get(FAILURE_PROBE) == 1, "the job did not fail (it ended before a checkpoint completed?)"
    assert loop_threads() == [], "a failed or finished task left its event loop thread running"
    check_results(results, "ordered")
    check_results(results, "unordered")
    assert sum(requests.values()) > 2 * N, "no request was sent again after the failure"


class CancelledInside(AsyncFunction[int, Any]):
    """A request whose own future was cancelled (not the operator's doing)."""

    async def async_invoke(self, value: int) -> list[Any]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        await future
        return []


def test_a_request_cancelled_by_the_function_itself_fails_the_task_instead_of_hanging() -> None:
    h = AsyncHarness(CancelledInside()).open()
    try:
        h.harness.process(1)
        with pytest.raises(RuntimeError, match="async_invoke failed for input 1") as info:
            h.run_mails_until(lambda: False, timeout_s=10)
        assert isinstance(info.value.__cause__, asyncio.CancelledError)
    finally:
        h.harness.close()


@pytest.mark.slow
def test_the_remote_inference_example_gives_each_comment_one_result() -> None:
    """examples/async_inference.py (PyFlink's remote_model_inference.py), as a user runs it:
    a third of the first attempts time out and are retried a second later; every row's
    result is printed once."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [
            sys.executable,
            str(root / "examples" / "async_inference.py"),
            "--executor",
            "local",
            "--records",
            "30",
            "--rows-per-second",
            "1000",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "Printing result to stdout. Use --output to specify output path."
    results = [json.loads(re.sub(r"^\d+> ", "", line)) for line in lines[1:]]  # "2> ": print's subtask
    assert sorted(r["user_id"] for r in results) == list(range(30))
    assert {r["analysis_result"] for r in results} == {"positive"}


class Keyed(DoublingClient):
    """The service's client on keyed input: emits ``(key, value)``."""

    async def async_invoke(self, value: int) -> list[Any]:
        return [(v % 4, v) for v, _ in await super().async_invoke(value)]


def test_event_time_windows_after_unordered_wait_on_a_keyed_stream_lose_no_result() -> None:
    """Results complete out of order, but none may fall behind a watermark that overtook
    it: a late result would be dropped by the windows downstream (their counts would be
    short). Timestamps survive the operator (the windows need them)."""
    n = 2_000
    with RequestServer(max_latency_ms=5, seed=7) as server:
        env = StreamExecutionEnvironment.get_execution_environment(executor="local")
        env.set_parallelism(2)
        env.configure({"pipeline.auto-watermark-interval": 5, "chandy.network.batch-size": 20})
        timed = env.from_sequence(0, n - 1).assign_timestamps_and_watermarks(
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda v, _: v)
        )
        keyed = timed.key_by(lambda v: v % 4)
        results = AsyncDataStream.unordered_wait(keyed, Keyed(server.port), Time.seconds(30), capacity=50)
        counts = (
            results.map(lambda kv: (kv[0], 1))
            .key_by(lambda kv: kv[0])
            .window(TumblingEventTimeWindows.of(Time.milliseconds(100)))
            .reduce(lambda a, b: (a[0], a[1] + b[1]))
        )
        out = list(counts.execute_and_collect("windows after async I/O"))
    assert sorted(out) == sorted((k, 25) for k in range(4) for _ in range(n // 100))


class CountingCheckpoints(DoublingClient, CheckpointListener):
    """The service's client; counts the checkpoints its subtask saw complete, in the probe."""

    def __init__(self, port: int, probe: Probe) -> None:
        super().__init__(port)
        self.probe = probe

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.probe.add(f"completed-{self.subtask}")


def test_requests_in_flight_in_a_retained_checkpoint_are_sent_again_at_a_higher_parallelism(
    tmp_path: Path,
) -> None:
    """A job whose requests of every fifth value hang is cancelled once a checkpoint holds
    all 100 records that did not leave (ordered_wait: the answered ones wait behind the
    first hanging one of their subtask). Restored at parallelism 3 from 2, the queued
    records are split between the new subtasks, their requests are sent again, and each
    result arrives once over both runs.

    The source never ends (numbers past 100 are filtered out): a subtask whose input ended
    waits in finish() for its requests and takes no checkpoint meanwhile."""
    n = 100
    probe = Probe()
    with RequestServer(hold=True) as server:
        server.release(*(v for v in range(n) if v % 5))

        def job(parallelism: int, directory: Path) -> Any:
            env = StreamExecutionEnvironment.get_execution_environment(executor="local")
            env.set_parallelism(parallelism)
            env.enable_checkpointing(50)
            env.configure(
                {
                    "execution.checkpointing.dir": str(directory),
                    "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
                }
            )
            numbers = env.from_source(DataGeneratorSource(int, None, 5_000), source_name="numbers").uid(
                "numbers"
            )
            return AsyncDataStream.ordered_wait(
                numbers.filter(lambda v: v < n).uid("first"),
                CountingCheckpoints(server.port, probe),
                Time.seconds(60),
                capacity=n,
            ).uid("lookups")

        def completed() -> int:
            return min(probe.get("completed-0"), probe.get("completed-1"))

        first_results = job(2, tmp_path / "first").execute_and_collect("async I/O before rescaling")
        first, reader = drain(first_results)
        try:
            server.wait_for_requests(n)
            # Every record is queued now; a checkpoint triggered after the next completion holds them all.
            baseline = completed()
            deadline = time.monotonic() + 60
            while completed() < baseline + 2:
                assert time.monotonic() < deadline, "no checkpoint completed"
                time.sleep(0.01)
        finally:  # cancel: the retained checkpoint holds the queued records
            cancel_keeping_results(first_results, reader)
        # each subtask emitted its results up to its first hanging request (1 and 3 on subtask 1)
        assert 0 < len(first) < n // 2

        server.release_all()
        second_job = job(3, tmp_path / "second")
        second_job.get_execution_environment().set_restore_path(
            str(latest_checkpoint_dir(tmp_path / "first"))
        )
        second: list[Any] = []
        with second_job.execute_and_collect("async I/O after rescaling") as results:
            give_up = threading.Timer(60, results.close)  # a lost result fails the test, not hangs it
            give_up.start()
            for result in results:
                second.append(result)
                if len(first) + len(second) == n:
                    break
            give_up.cancel()
        requests = server.requests()
    assert sorted(first + second) == [(v, 2 * v) for v in range(n)]
    emitted_before = {v for v, _ in first}
    assert requests == Counter({v: 1 if v in emitted_before else 2 for v in range(n)})
