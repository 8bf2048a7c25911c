"""RestServer: uvicorn on a thread of the driver, with an explicit lifetime.

The environment starts it with its first job and stops it (see
``StreamExecutionEnvironment.execute`` and ``close``); :meth:`RestServer.stop`
returns once the port is closed. The socket is bound here, before uvicorn runs,
so the port rules are chandy's (Flink's): ``rest.bind-port`` (a port or a range)
is taken strictly; otherwise ``rest.port``, and when that is taken the next free
one of the following 100, unless ``rest.auth.token`` is set: clients would send
the token to whatever holds ``rest.port``, so that is an error instead; ``0`` lets
the system choose (tests use it). The URL
clients should use is :attr:`RestServer.url`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass

import uvicorn

from chandy.config import Configuration
from chandy.config.options import RestOptions
from chandy.errors import ConfigurationError
from chandy.web.app import create_app
from chandy.web.auth import check_exposure
from chandy.web.dispatcher import Dispatcher
from chandy.web.guard import HostAllowList

log = logging.getLogger(__name__)

#: Ports tried after ``rest.port`` when it is taken (Flink takes the next free one too).
PORT_FALLBACK_RANGE = 100

#: How long start() waits for uvicorn to serve, and stop() for it to close.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RestSettings:
    """The REST options of a configuration, read once."""

    bind_address: str
    port: int
    bind_port: str | None
    address: str | None
    token: str | None
    allowed_hosts: str | None = None
    max_content_length: int = RestOptions.MAX_CONTENT_LENGTH.default

    @staticmethod
    def of(config: Configuration) -> RestSettings:
        return RestSettings(
            bind_address=config.get(RestOptions.BIND_ADDRESS) or "127.0.0.1",
            port=config.get(RestOptions.PORT),
            bind_port=config.get(RestOptions.BIND_PORT),
            address=config.get(RestOptions.ADDRESS),
            token=config.get(RestOptions.AUTH_TOKEN) or None,
            allowed_hosts=config.get(RestOptions.ALLOWED_HOSTS),
            max_content_length=config.get(RestOptions.MAX_CONTENT_LENGTH),
        )


def _ports_to_try(settings: RestSettings) -> tuple[list[int], bool]:
    """The candidate ports, and whether they come from rest.bind-port (strict)."""
    if settings.bind_port:
        text = settings.bind_port.strip()
        try:
            if "-" in text:
                low, high = (int(part) for part in text.split("-", 1))
            else:
                low = high = int(text)
        except ValueError:
            raise ConfigurationError(
                f"invalid value for 'rest.bind-port': {settings.bind_port!r}. Allowed: a port "
                "('8081') or a range ('50100-50200')."
            ) from None
        if not 0 <= low <= high <= 65535:
            raise ConfigurationError(
                f"invalid value for 'rest.bind-port': {settings.bind_port!r}: ports are 0-65535, low to high."
            )
        return list(range(low, high + 1)), True
    if settings.port == 0:
        return [0], False
    return [p for p in range(settings.port, settings.port + PORT_FALLBACK_RANGE + 1) if p <= 65535], False


def bind_socket(settings: RestSettings) -> socket.socket:
    """A listening socket by the port rules (module docstring)."""
    family = socket.AF_INET6 if ":" in settings.bind_address else socket.AF_INET
    ports, strict = _ports_to_try(settings)
    if settings.token is not None and not strict:
        ports = ports[:1]  # no fallback with a token: clients send it to rest.port
    last_error: OSError | None = None
    for port in ports:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((settings.bind_address, port))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            last_error = exc
            continue
        if port != ports[0]:
            log.info(
                "REST port %d is taken; serving on %d instead (set rest.bind-port to insist on one).",
                ports[0],
                sock.getsockname()[1],
            )
        sock.setblocking(False)
        return sock
    if settings.token is not None and not strict:
        raise ConfigurationError(
            f"rest.port {ports[0]} is taken on {settings.bind_address} ({last_error}), and rest.auth.token "
            "is set: chandy does not move a REST API that needs a token to the next free port, because "
            f"clients pointed at {ports[0]} would send the token to whatever holds it. Free port "
            f"{ports[0]}, set rest.port to a free port (0 lets the system choose; the log names it), or "
            "set rest.bind-port to a port or a range you give clients."
        )
    what = (
        f"no port of rest.bind-port '{settings.bind_port}'"
        if strict
        else f"no port of {ports[0]}-{ports[-1]}"
    )
    raise ConfigurationError(
        f"cannot serve the REST API on {settings.bind_address}: {what} is free ({last_error}). "
        "Choose another rest.port (0 lets the system pick one) or free the port."
    )


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, stoppable at once from another thread.

    uvicorn looks at ``should_exit`` every 0.1 s and then sleeps another 0.1 s while
    connections close: 0.2 s for every ``env.execute()``. Here a stop wakes the loop,
    which closes the listening socket at once (:attr:`closed`); uvicorn's own shutdown
    then ends the open connections on the server's thread."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.closed = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):  # on_tick keeps the Date header current
            counter = (counter + 1) % 864_000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)
        for server in self.servers:
            server.close()
        self.closed.set()

    def request_stop(self) -> None:
        """Any thread."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(wake.set)


class RestServer:
    """Flink's REST API, the dashboard and ``/metrics`` for one environment's jobs."""

    def __init__(self, config: Configuration, dispatcher: Dispatcher) -> None:
        """Check the settings (a non-loopback address without a token is refused here,
        before anything is bound); :meth:`start` serves."""
        self.settings = RestSettings.of(config)
        check_exposure(self.settings.bind_address, self.settings.token)
        self.dispatcher = dispatcher
        self._server: _Uvicorn | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """Where clients (and a browser) reach the server."""
        host = self.settings.address or self.settings.bind_address
        if host in ("0.0.0.0", "::"):
            host = socket.getfqdn()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self._port}"

    @property
    def requires_token(self) -> bool:
        return self.settings.token is not None

    def start(self) -> RestServer:
        """Bind, serve on a thread, return once uvicorn accepts connections."""
        sock = bind_socket(self.settings)
        self._port = sock.getsockname()[1]
        settings = self.settings
        app = create_app(
            self.dispatcher,
            token=settings.token,
            allowed_hosts=HostAllowList.of(settings.bind_address, settings.address, settings.allowed_hosts),
            max_content_length=settings.max_content_length,
        )
        # log_config=None leaves the program's logging alone; uvicorn's own INFO lines ("Started
        # server process", "Shutting down") would repeat ours at every job, so warnings only.
        config = uvicorn.Config(
            app,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        server = _Uvicorn(config)
        self._server = server
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                server.run(sockets=[sock])
            except BaseException as exc:  # reported by start() or logged
                failure.append(exc)
                log.exception("The REST server at %s stopped with an error.", self.url)
            finally:
                sock.close()

        self._thread = threading.Thread(target=serve, name=f"chandy-rest-{self._port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)  # uvicorn has no start event to wait on
        if not server.started:
            server.should_exit = True
            raise RuntimeError(f"the REST server on port {self._port} did not start") from (
                failure[0] if failure else None
            )
        auth = (
            "requires 'Authorization: Bearer <token>' (rest.auth.token)"
            if self.requires_token
            else "has no authentication (loopback only)"
        )
        log.info("Dashboard and REST API at %s/ (the API %s).", self.url, auth)
        return self

    def stop(self) -> None:
        """Close the port (returns once it is closed); the server's thread then ends the
        open connections (at most ``timeout_graceful_shutdown``) and ends."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.request_stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while not server.closed.wait(0.01) and thread.is_alive() and time.monotonic() < deadline:
            pass
        if server.closed.is_set() or not thread.is_alive():
            log.info("The REST server at %s stopped.", self.url)
        else:
            log.warning("The REST server at %s did not stop within %.0f s.", self.url, STOP_TIMEOUT_S)
        self._server = self._thread = None
