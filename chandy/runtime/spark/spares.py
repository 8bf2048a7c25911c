"""Spare executors kept ready: their Python daemon started before a slot needs it.

When an executor JVM is lost, its slot stage fails as a whole (a barrier stage), and the
next stage starts the job's slots on the executors that have free cores: the survivors
and the cluster's spares. On a survivor the slot forks from the Python daemon that runs
there already (with chandy imported, see daemon.py). On a spare that never ran a Python
task, Spark first starts that daemon: a new interpreter importing PySpark, chandy, PyArrow
and NumPy, seconds on the recovery's critical path. Flink keeps its spare TaskManagers'
slots registered for the same reason.

:class:`SpareExecutorWarmer` watches the cluster's executors and, whenever one appears
that it has not seen, runs one trivial Python task per free core, which starts the
daemon on every executor with a free core (the spares). Each task holds its core for a
moment (:data:`HOLD_S`): tasks that ended at once would let one fast executor take them
all, and a spare would stay cold. The tasks report the daemon they ran in; while fewer
daemons answered than there were idle executors, the warm-up is tried again (a few times).
It never waits for a core a slot holds: it asks for free cores only, and a warm-up still
queued after ``timeout_s`` (a core taken meanwhile) is cancelled.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: How often the executors are looked at.
CHECK_INTERVAL_S = 2.0
#: A warm-up job still running after this is cancelled (its tasks wait for busy cores).
WARM_UP_TIMEOUT_S = 30.0
#: How long a warm-up task keeps its core, so that the tasks spread over the free cores.
HOLD_S = 0.5
#: Warm-ups tried for one set of executors before it counts as warm anyway.
ATTEMPTS = 3


def _started(_: Any) -> tuple[str, int]:
    """The warm-up task: that it ran is the point (the daemon forked the worker running it).
    Returns which daemon that was: host and the daemon's process id."""
    time.sleep(HOLD_S)
    return socket.gethostname(), os.getppid()


class SpareExecutorWarmer:
    """Owns one thread; :meth:`close` stops and joins it."""

    def __init__(
        self,
        session: Any,
        interval_s: float = CHECK_INTERVAL_S,
        timeout_s: float = WARM_UP_TIMEOUT_S,
        on_warmed: Callable[[int], None] | None = None,
    ) -> None:
        self.session = session
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.on_warmed = on_warmed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chandy spare executor warmer", daemon=True)
        self._group = f"chandy-warm-up-{id(self):x}"

    def start(self) -> SpareExecutorWarmer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        try:
            self.session.sparkContext.cancelJobGroup(self._group)
        except Exception:  # noqa: BLE001 - the context may be stopped already
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.timeout_s + 5)

    def _run(self) -> None:
        warmed: frozenset[str] = frozenset()
        attempts = 0
        while not self._stop.wait(self.interval_s):
            try:
                executors, free, idle = self._executors_and_free_cores()
                if executors - warmed and free > 0:
                    daemons = self._warm_up(free)
                    attempts += 1
                    if len(daemons) < idle and attempts < ATTEMPTS:
                        log.debug("%d of %d idle executors answered the warm-up", len(daemons), idle)
                        continue  # some idle executor got none of the tasks: again
                    if self.on_warmed is not None:
                        self.on_warmed(free)
                warmed = executors
                attempts = 0
            except Exception as exc:  # noqa: BLE001 - best effort: a cold spare is only slower
                if self._stop.is_set():
                    return
                log.debug("warming spare executors failed: %s", exc)

    def _executors_and_free_cores(self) -> tuple[frozenset[str], int, int]:
        """The executors (host:port; the driver's entry among them), the cores no task uses
        and how many executors run no task (the driver's entry not counted)."""
        jsc = self.session.sparkContext._jsc.sc()
        infos = list(jsc.statusTracker().getExecutorInfos())
        executors = frozenset(f"{i.host()}:{i.port()}" for i in infos)
        running = sum(int(i.numRunningTasks()) for i in infos)
        idle = sum(1 for i in infos if int(i.numRunningTasks()) == 0) - 1
        total = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
        return executors, total - running, max(idle, 0)

    def _warm_up(self, tasks: int) -> set[tuple[str, int]]:
        """Run ``tasks`` warm-up tasks; the daemons (host, process id) they ran in."""
        sc = self.session.sparkContext
        sc.setJobGroup(self._group, "chandy: start the Python daemon on spare executors", True)
        timer = threading.Timer(self.timeout_s, sc.cancelJobGroup, (self._group,))
        timer.daemon = True
        timer.start()
        try:
            daemons = set(sc.parallelize(range(tasks), tasks).map(_started).collect())
            log.debug("Started the Python daemon on %d spare executors (%d cores).", len(daemons), tasks)
            return daemons
        finally:
            timer.cancel()
