"""A real asyncio TCP service on 127.0.0.1 for the async I/O tests, and a client for it.

The service answers one request per line: ``<int>\\n`` gets ``ok <2*int>\\n`` after a
latency, or ``err <reason>\\n``. It counts the requests per value (in this process, so
on Spark too: slots connect over loopback), can hold chosen values until the test
releases them (to complete requests in an order the test picks, without sleeps), and can
fail the first attempts of every value (to exercise retries).

:class:`DoublingClient` is the ``AsyncFunction`` the tests apply: it keeps a pool of
connections on the operator's event loop, as a real client would.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from typing import Any

from chandy.core.functions import AsyncFunction, RuntimeContext


class ServiceError(ConnectionError):
    """The service answered ``err``."""


class RequestServer:
    """The service; ``start()`` runs it on a thread of its own, ``stop()`` ends it."""

    def __init__(
        self,
        *,
        max_latency_ms: float = 0.0,
        seed: int = 0,
        hold: bool = False,
        fail_first_attempts: int = 0,
        empty_first_attempts: int = 0,
    ) -> None:
        self.max_latency_ms = max_latency_ms
        self.seed = seed
        self.hold = hold
        self.fail_first_attempts = fail_first_attempts
        self.empty_first_attempts = empty_first_attempts
        self._requests: Counter[int] = Counter()
        self._answered: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._released: set[int] = set()
        self._gates: dict[int, asyncio.Event] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="test-request-server", daemon=True
        )
        self.port = 0

    def start(self) -> RequestServer:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            # backlog: hundreds of clients connect at once (capacity 100 per subtask)
            asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024),
            self._loop,
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            self._server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> RequestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the test sees and steers ------------------------------------------

    def requests(self) -> Counter[int]:
        """How many times each value was requested (every attempt counts)."""
        with self._lock:
            return Counter(self._requests)

    def wait_for_requests(self, total: int, timeout_s: float = 30) -> None:
        """Block until at least ``total`` requests arrived."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while sum(self._requests.values()) < total:
                left = deadline - time.monotonic()
                assert left > 0, f"{sum(self._requests.values())} requests arrived, expected {total}"
                self._changed.wait(left)

    def release(self, *values: int) -> None:
        """Let the held requests of ``values`` (and later ones) be answered."""
        self._loop.call_soon_threadsafe(self._release, values)

    def release_all(self) -> None:
        """Answer every request from now on, the held ones too."""
        self._loop.call_soon_threadsafe(self._release_all)

    def _release_all(self) -> None:
        self.hold = False
        for gate in self._gates.values():
            gate.set()

    def _release(self, values: tuple[int, ...]) -> None:
        for value in values:
            self._released.add(value)
            gate = self._gates.get(value)
            if gate is not None:
                gate.set()

    # -- the service ------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                value = int(line)
                with self._lock:
                    self._requests[value] += 1
                    attempt = self._requests[value]
                    self._changed.notify_all()
                if self.hold and value not in self._released:
                    await self._gates.setdefault(value, asyncio.Event()).wait()
                if self.max_latency_ms:
                    rng = random.Random(self.seed * 1_000_003 + value * 31 + attempt)
                    await asyncio.sleep(rng.uniform(0, self.max_latency_ms) / 1000)
                if attempt <= self.fail_first_attempts:
                    writer.write(f"err attempt {attempt} of {value} refused\n".encode())
                elif attempt <= self.empty_first_attempts:
                    writer.write(b"empty\n")
                else:
                    writer.write(f"ok {2 * value}\n".encode())
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


class DoublingClient(AsyncFunction[int, Any]):
    """Asks the service for ``2 * value``; emits ``(value, answer)``. Connections are pooled
    per subtask on the operator's loop; a cancelled request (timeout, close) drops its own.
    The pool is closed on the loop: a keeper task waits until the operator cancels it at
    close and closes the idle connections then (``close()`` runs after the loop stopped)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def open(self, runtime_context: RuntimeContext) -> None:
        self.subtask = runtime_context.get_index_of_this_subtask()
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._keeper: asyncio.Task[None] | None = None

    async def _keep(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            for _, writer in self._idle:
                writer.close()
            self._idle = []

    async def request(self, value: int) -> str:
        if self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep())
        connection = self._idle.pop() if self._idle else await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = connection
        try:
            writer.write(f"{value}\n".encode())
            await writer.drain()
            line = (await reader.readline()).decode().strip()
        except BaseException:
            writer.close()
            raise
        self._idle.append(connection)
        if line.startswith("err"):
            raise ServiceError(line)
        return line

    async def async_invoke(self, value: int) -> list[Any]:
        line = await self.request(value)
        if line == "empty":
            return []
        return [(value, int(line.split()[1]))]
