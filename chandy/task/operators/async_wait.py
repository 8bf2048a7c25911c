"""The async I/O operator: ``AsyncDataStream.unordered_wait`` / ``ordered_wait`` (Flink's
``AsyncWaitOperator``).

Each record becomes a request: a call of the user's coroutine ``async_invoke(value)`` on an
asyncio event loop that the operator owns, on a thread of its own (started in ``open``,
stopped and joined in ``close``, which also runs when the task fails or is cancelled). The
task thread never waits for a request; it waits only when ``capacity`` requests (and
watermarks, which take a place in the queue as in Flink) are already queued.

Threads. The loop thread only runs coroutines and records their outcome (result,
exception, or expired timeout) on the entry, under a lock; it then puts one mail into the
task's mailbox (one at a time, however many requests completed meanwhile). Everything else
runs on the task thread, between batches, like a record: the user's ``timeout(value)``,
failing the task on an exception, and emitting. So outputs, watermarks and snapshots never
race. While the task thread waits for a free place it takes completions itself, from the
same lock, and runs no other mail: a checkpoint trigger waits until the record that was
being processed is queued, as it would wait for any long record.

Order. ``ordered_wait`` emits in input order: the queue's head leaves first. ``unordered_wait``
emits a result as soon as it is complete, but never across a watermark (Flink's
segments): results of records before a watermark leave before it, those after it follow
it, so event time stays correct.

Checkpoints. A snapshot stores every queued element (requests in flight, completed results
not yet emitted, queued watermarks) as operator list state (Flink's
``_async_wait_operator_state_``); a restore puts them back in the queue and sends their
requests again. The job's output therefore holds each record's result exactly once, and a
request that was in flight at the failure is made once more (at least once on the other
system's side, as in Flink). Before the barrier goes downstream the operator emits what
has completed, so only what is really in flight is repeated.

Timeouts and retries run on the loop: a request's timeout covers all its attempts and the
pauses between them (Flink's rule); when it expires the coroutine is cancelled and
``timeout(value)`` gives the outputs. ``finish`` (the end of a bounded input) waits for
every request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from chandy.core.async_retry import AsyncRetryStrategy
from chandy.core.functions import AsyncFunction
from chandy.core.state import ListStateDescriptor
from chandy.network.cancellation import TaskCancelledError
from chandy.state.operator_state import OperatorListState
from chandy.task.batches import TimestampedBatch
from chandy.task.operators.base import StateInitializationContext, StateSnapshotContext, UdfOperator

log = logging.getLogger(__name__)

#: The operator list state holding the queued elements (Flink's name).
STATE_NAME = "_async_wait_operator_state_"

#: How long ``close`` waits for the loop thread: its cancelled coroutines may run ``finally``
#: blocks (closing connections); a coroutine that blocks the loop keeps it past this.
LOOP_STOP_TIMEOUT_S = 10.0

#: How often a task thread waiting for a free place looks whether its task was cancelled
#: (a completion wakes it at once).
_CANCEL_CHECK_S = 0.1


@dataclass(frozen=True, slots=True)
class InFlightRecord:
    """A queued record in a checkpoint: its request is sent again on restore."""

    value: Any
    timestamp: int | None
    #: The record came in a timestamped batch (its output keeps ``timestamp``, even ``None``).
    timestamped: bool


@dataclass(frozen=True, slots=True)
class InFlightWatermark:
    """A queued watermark in a checkpoint: it is queued again, in its place, on restore."""

    timestamp: int


class _Entry:
    """One queued element. ``value``/``timestamp`` are the input (for a watermark entry,
    ``timestamp`` is the watermark); the loop thread sets ``result``, ``error`` and
    ``timed_out`` under the operator's lock; the task thread sets ``output``."""

    __slots__ = ("value", "timestamp", "watermark", "result", "error", "timed_out", "output", "segment")

    def __init__(self, value: Any, timestamp: int | None, watermark: bool = False) -> None:
        self.value = value
        self.timestamp = timestamp
        self.watermark = watermark
        self.result: Any = None
        self.error: BaseException | None = None
        self.timed_out = False
        #: The outputs, once the task thread resolved the outcome (a watermark: at once).
        self.output: list[Any] | None = [] if watermark else None
        self.segment: _Segment | None = None


class _OrderedQueue:
    """``ordered_wait``: elements leave in the order they came."""

    def __init__(self) -> None:
        self._entries: deque[_Entry] = deque()

    def add(self, entry: _Entry) -> None:
        self._entries.append(entry)

    def completed(self, entry: _Entry) -> None:
        pass  # the head decides

    def pop_ready(self) -> list[_Entry]:
        entries = self._entries
        ready: list[_Entry] = []
        while entries and entries[0].output is not None:
            ready.append(entries.popleft())
        return ready

    def values(self) -> list[_Entry]:
        return list(self._entries)


class _Segment:
    """The records between two watermarks (or one watermark): ``entries`` not yet emitted,
    ``ready`` those of them whose outputs are known."""

    __slots__ = ("entries", "ready", "is_watermark")

    def __init__(self, is_watermark: bool) -> None:
        self.entries: dict[_Entry, None] = {}
        self.ready: list[_Entry] = []
        self.is_watermark = is_watermark


class _UnorderedQueue:
    """``unordered_wait``: a result leaves when it is complete, but only from the first
    segment, so no result crosses a watermark (Flink's ``UnorderedStreamElementQueue``)."""

    def __init__(self) -> None:
        self._segments: deque[_Segment] = deque()

    def add(self, entry: _Entry) -> None:
        segments = self._segments
        if entry.watermark or not segments or segments[-1].is_watermark:
            segments.append(_Segment(entry.watermark))
        segment = segments[-1]
        segment.entries[entry] = None
        entry.segment = segment
        if entry.watermark:
            segment.ready.append(entry)

    def completed(self, entry: _Entry) -> None:
        assert entry.segment is not None
        entry.segment.ready.append(entry)

    def pop_ready(self) -> list[_Entry]:
        segments = self._segments
        ready: list[_Entry] = []
        while segments:
            first = segments[0]
            if first.ready:
                for entry in first.ready:
                    del first.entries[entry]
                ready += first.ready
                first.ready = []
            if first.entries:
                break
            segments.popleft()
        return ready

    def values(self) -> list[_Entry]:
        return [entry for segment in self._segments for entry in segment.entries]


class _EventLoopThread:
    """An asyncio event loop running on a thread of its own until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                if tasks:
                    loop.run_until_complete(asyncio.wait(tasks, timeout=LOOP_STOP_TIMEOUT_S))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def stop(self) -> None:
        """Cancel every coroutine, stop the loop and join its thread."""
        if not self._thread.is_alive():
            if self._thread.ident is None:  # never started
                self.loop.close()
            return
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # the loop closed meanwhile
            pass
        self._thread.join(LOOP_STOP_TIMEOUT_S + 5)
        if self._thread.is_alive():
            log.warning(
                "the event loop thread %s did not stop within %.0f s: a coroutine of the async "
                "function blocks the loop (a blocking call inside async_invoke?); it is left "
                "running as a daemon thread",
                self._thread.name,
                LOOP_STOP_TIMEOUT_S + 5,
            )


def _no_abort() -> bool:
    return False


class AsyncWaitOperator(UdfOperator):
    """Runs an :class:`~chandy.core.functions.AsyncFunction` with at most ``capacity``
    queued elements, in input order (``ordered``) or completion order."""

    def __init__(
        self,
        user_function: AsyncFunction[Any, Any],
        timeout_ms: int,
        capacity: int,
        ordered: bool,
        retry_strategy: AsyncRetryStrategy[Any],
    ) -> None:
        super().__init__(user_function)
        self.timeout_ms = timeout_ms
        self.capacity = capacity
        self.ordered = ordered
        self.retry_strategy = retry_strategy
        self._runner: _EventLoopThread | None = None
        self._state: OperatorListState | None = None
        self._recovered: list[Any] = []
        self._should_abort = _no_abort
        self._lock = threading.Lock()
        self._completion = threading.Condition(self._lock)
        #: Entries the loop thread completed, not yet taken by the task thread (under the lock).
        self._completed: list[_Entry] = []
        #: A mail to take ``_completed`` is queued (under the lock).
        self._mail_pending = False
        self._queue: _OrderedQueue | _UnorderedQueue = _OrderedQueue() if ordered else _UnorderedQueue()
        #: Queued elements (records and watermarks) not yet emitted: at most ``capacity``.
        self._size = 0
        #: Entries queued on the task thread whose requests are not yet handed to the loop.
        self._to_start: list[_Entry] = []
        #: The input carries timestamps: outputs go out as TimestampedBatch.
        self._timestamped = False
        #: The requests' asyncio tasks (loop thread only).
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle --------------------------------------------------------------

    def bind_task_services(self, services: Any, should_abort: Any) -> None:
        self._should_abort = should_abort

    def initialize_state(self, context: StateInitializationContext) -> None:
        super().initialize_state(context)
        self._state = context.get_list_state(ListStateDescriptor(STATE_NAME))
        if context.is_restored():
            self._recovered = list(self._state.get())

    def open(self) -> None:
        if self.mailbox is None:
            raise RuntimeError(
                f"operator '{self.name}' has no mailbox: the operator chain sets it before open "
                "(a test harness must set operator.mailbox too)"
            )
        super().open()
        function = self.user_function
        self._invoke = function.async_invoke
        self._timeout_function = function.timeout
        self._timeout_s = self.timeout_ms / 1000 if self.timeout_ms > 0 else None
        predicate = self.retry_strategy.get_retry_predicate()
        self._retry_on_result = predicate.result_predicate()
        self._retry_on_exception = predicate.exception_predicate()
        context = self.runtime_context
        subtask = f" ({context.get_index_of_this_subtask() + 1})" if context is not None else ""
        self._runner = _EventLoopThread(f"chandy-async-io {self.name}{subtask}")
        self._runner.start()
        try:
            recovered, self._recovered = self._recovered, []
            if recovered:
                log.info("%s%s: sending %d restored requests again", self.name, subtask, len(recovered))
            for element in recovered:
                if isinstance(element, InFlightWatermark):
                    self.process_watermark(element.timestamp)
                else:
                    self._timestamped = self._timestamped or element.timestamped
                    self._enqueue(element.value, element.timestamp)
            self._start_requests()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.stop()
        super().close()

    def finish(self) -> None:
        """The input ended: wait for every queued request and emit its outputs."""
        self._wait_until_fewer_than(1)

    # -- input ------------------------------------------------------------------

    def process_batch(self, records: list[Any]) -> None:
        if type(records) is list:
            for value in records:
                self._enqueue(value, None)
        else:
            timed: TimestampedBatch = records  # type: ignore[assignment]
            self._timestamped = True
            for value, timestamp in zip(timed.values, timed.timestamps, strict=True):
                self._enqueue(value, timestamp)
        self._start_requests()

    def process_watermark(self, timestamp: int) -> None:
        """Queue the watermark behind the records before it (it is emitted when they are)."""
        if self._size >= self.capacity:
            self._wait_until_fewer_than(self.capacity)
        self._queue.add(_Entry(None, timestamp, watermark=True))
        self._size += 1
        self._emit_completed()

    def _enqueue(self, value: Any, timestamp: int | None) -> None:
        if self._size >= self.capacity:
            self._wait_until_fewer_than(self.capacity)
        entry = _Entry(value, timestamp)
        self._queue.add(entry)
        self._size += 1
        self._to_start.append(entry)

    def _start_requests(self) -> None:
        """Hand the queued entries to the loop: one thread switch per batch, not per record."""
        if not self._to_start:
            return
        entries, self._to_start = self._to_start, []
        assert self._runner is not None
        self._runner.loop.call_soon_threadsafe(self._create_tasks, entries)

    def _wait_until_fewer_than(self, limit: int) -> None:
        """Block the task thread until fewer than ``limit`` elements are queued, emitting
        completed ones as they come (no other mail runs meanwhile)."""
        self._start_requests()
        while True:
            self._emit_completed()
            if self._size < limit:
                return
            with self._lock:
                if not self._completed:
                    self._completion.wait(_CANCEL_CHECK_S)
            if self._should_abort():
                raise TaskCancelledError()

    # -- the loop thread --------------------------------------------------------

    def _create_tasks(self, entries: list[_Entry]) -> None:
        loop = asyncio.get_running_loop()
        tasks = self._tasks
        for entry in entries:
            task = loop.create_task(self._request(entry))
            tasks.add(task)  # the loop holds its tasks weakly: one not referenced may vanish
            task.add_done_callback(tasks.discard)

    async def _request(self, entry: _Entry) -> None:
        """One record's request, with its retries, under its timeout."""
        try:
            async with asyncio.timeout(self._timeout_s):
                result, error = await self._attempts(entry.value)
        except TimeoutError:  # _attempts catches the function's own exceptions: this is the timeout
            self._complete(entry, None, None, timed_out=True)
            return
        except asyncio.CancelledError as cancelled:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the operator closes: the request ends with its loop
            # A future of the function's own was cancelled: an error of this request, not
            # the end of it without an outcome (finish() would wait for it forever).
            self._complete(entry, None, cancelled, timed_out=False)
            return
        except Exception as exc:  # noqa: BLE001 - a retry predicate raised: the task fails with it
            self._complete(entry, None, exc, timed_out=False)
            return
        self._complete(entry, result, error, timed_out=False)

    async def _attempts(self, value: Any) -> tuple[Any, BaseException | None]:
        strategy = self.retry_strategy
        on_result, on_exception = self._retry_on_result, self._retry_on_exception
        attempts = 1
        while True:
            result: Any = None
            error: Exception | None = None
            try:
                result = await self._invoke(value)
            except Exception as exc:  # noqa: BLE001 - the outcome of the attempt, decided below
                error = exc
            retry = (
                on_exception is not None and on_exception(error)
                if error is not None
                else on_result is not None and on_result(result)
            )
            if not (retry and strategy.can_retry(attempts)):
                return result, error
            await asyncio.sleep(strategy.get_backoff_time_millis(attempts) / 1000)
            attempts += 1

    def _complete(self, entry: _Entry, result: Any, error: BaseException | None, timed_out: bool) -> None:
        """Record an outcome (loop thread) and make sure the task thread will take it."""
        with self._lock:
            entry.result = result
            entry.error = error
            entry.timed_out = timed_out
            self._completed.append(entry)
            self._completion.notify()
            if self._mail_pending:
                return
            self._mail_pending = True
        assert self.mailbox is not None
        self.mailbox.put(self._emit_completed, f"async I/O results of {self.name}")

    # -- the task thread: outcomes to outputs -----------------------------------

    def _emit_completed(self) -> None:
        """Resolve the outcomes the loop recorded, then emit what may leave the queue."""
        with self._lock:
            completed, self._completed = self._completed, []
            self._mail_pending = False
        queue = self._queue
        for entry in completed:
            entry.output = self._outputs_of(entry)
            queue.completed(entry)
        ready = queue.pop_ready()
        if not ready:
            return
        self._size -= len(ready)
        timestamped = self._timestamped
        out: list[Any] = []
        out_ts: list[int | None] = []
        for entry in ready:
            if entry.watermark:
                self._flush(out, out_ts)
                out, out_ts = [], []
                assert entry.timestamp is not None
                self.current_watermark = entry.timestamp
                self.emit_watermark(entry.timestamp)
                continue
            produced = entry.output
            assert produced is not None
            out += produced
            if timestamped:
                out_ts += [entry.timestamp] * len(produced)
        self._flush(out, out_ts)

    def _flush(self, out: list[Any], out_ts: list[int | None]) -> None:
        if out:
            self.output(TimestampedBatch(out, out_ts) if self._timestamped else out)

    def _outputs_of(self, entry: _Entry) -> list[Any]:
        """A completed request's outputs: its result, or ``timeout(value)``'s; an exception
        fails the task (and the job restarts from its latest checkpoint)."""
        function_name = type(self.user_function).__name__
        if entry.error is not None:
            raise RuntimeError(
                f"{function_name}.async_invoke failed for input {entry.value!r}: {entry.error!r}"
            ) from entry.error
        result = self._timeout_function(entry.value) if entry.timed_out else entry.result
        method = "timeout" if entry.timed_out else "async_invoke"
        if result is None:
            raise TypeError(
                f"{function_name}.{method} returned None for input {entry.value!r}: it must "
                "return a list of outputs ([] for none)"
            )
        if isinstance(result, (str, bytes, dict)) or not isinstance(result, Iterable):
            raise TypeError(
                f"{function_name}.{method} returned {type(result).__name__} for input {entry.value!r}: "
                "it must return a list of outputs (wrap a single output as [output])"
            )
        return list(result)

    # -- checkpoints ------------------------------------------------------------

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        """Emit what has completed ahead of the barrier: only requests really in flight are
        stored, and repeated after a restore."""
        self._emit_completed()

    def snapshot_state(self, context: StateSnapshotContext) -> None:
        super().snapshot_state(context)
        assert self._state is not None
        self._start_requests()
        timestamped = self._timestamped
        self._state.update(
            [
                InFlightWatermark(e.timestamp)  # type: ignore[arg-type]
                if e.watermark
                else InFlightRecord(e.value, e.timestamp, timestamped)
                for e in self._queue.values()
            ]
        )
