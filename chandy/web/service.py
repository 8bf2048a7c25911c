"""WebService: the REST server of one environment, and how long it lives.

The server starts with the environment's first job and stops once nothing needs
it any more. What needs it (a "hold"):

- each job while it runs, and after its end until every savepoint or stop a
  client asked for was fetched (Flink's CLI polls for the outcome of ``flink
  stop`` after the job finished), at most ``chandy.rest.await-results-timeout``;
- the environment itself once it started a job with ``execute_async`` or
  ``execute_and_collect``: the program may still look at those jobs (finished ones
  stay listed), so the server stays up until ``env.close()`` or until the
  environment is garbage-collected. Without that last rule every environment a
  program (or a test suite) forgets to close would keep a port open for the rest
  of the process, and ``rest.port``'s 100 fallback ports run out.

``close()`` stops the server at once, whatever holds it.
"""

from __future__ import annotations

import logging
import threading

from chandy.config import Configuration
from chandy.config.options import RestOptions
from chandy.web.dispatcher import Dispatcher
from chandy.web.server import RestServer

log = logging.getLogger(__name__)


class WebService:
    """The dispatcher of an environment's jobs and the server over it (thread-safe).

    A hold belongs to the server it was taken on: after :meth:`close` and a new start, a
    hold of the old server that ends late does not count against the new one."""

    def __init__(self) -> None:
        self.dispatcher = Dispatcher()
        self._lock = threading.Lock()
        self._server: RestServer | None = None
        self._holds = 0
        #: The server the environment holds (see the module docstring), if any.
        self._environment_hold: RestServer | None = None

    @property
    def url(self) -> str | None:
        server = self._server
        return server.url if server is not None else None

    def acquire(self, config: Configuration, *, for_environment: bool = False) -> ServerHold:
        """Hold the server for a job about to start (starting it if it is not running; a
        refused configuration raises here, before the job runs). ``for_environment``: the
        environment holds it too, until :meth:`release_environment` or :meth:`close`."""
        with self._lock:
            server = self._server
            if server is None:
                server = self._server = RestServer(config, self.dispatcher).start()
                self._holds = 0
            self._holds += 1
            if for_environment and self._environment_hold is not server:
                self._environment_hold = server
                self._holds += 1
            return ServerHold(self, server, config)

    def release_environment(self) -> None:
        """The environment is closed or gone: its own hold ends (jobs still running keep
        the server until they end)."""
        with self._lock:
            hold, self._environment_hold = self._environment_hold, None
        if hold is not None:
            self.release(hold)

    def release(self, hold: RestServer) -> None:
        with self._lock:
            if hold is not self._server:
                return  # taken on a server that was closed since
            self._holds -= 1
            if self._holds > 0:
                return
            self._server = None
        hold.stop()

    def close(self) -> None:
        """Stop the server now (running jobs go on; their clients still work)."""
        with self._lock:
            server, self._server = self._server, None
            self._holds = 0
            self._environment_hold = None
        if server is not None:
            server.stop()


class ServerHold:
    """One job's hold on the server (see the module docstring)."""

    def __init__(self, service: WebService, server: RestServer, config: Configuration) -> None:
        self._service = service
        self._server = server
        self._timeout_s = config.get(RestOptions.AWAIT_RESULTS_TIMEOUT) / 1000

    def release(self) -> None:
        """The job ended: once its clients fetched what they asked for (bounded), let go."""
        try:
            self._service.dispatcher.await_results(self._timeout_s)
        finally:  # a Ctrl-C while waiting still lets go of the port
            self._service.release(self._server)

    def release_in_background(self) -> None:
        """:meth:`release` without blocking the caller (a job's own thread).

        Not a daemon thread: a program that ends with its ``execute_async`` or
        ``execute_and_collect`` job (the usual shape) would otherwise take the server down
        at exit before the client that stopped the job fetched the savepoint's path; the
        interpreter waits for this thread, which waits at most
        ``chandy.rest.await-results-timeout`` and only while a result is unfetched."""
        threading.Thread(target=self.release, name="chandy-rest-release", daemon=False).start()
