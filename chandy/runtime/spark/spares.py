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
daemon on every executor with a free core (the spares) and ends at once. It never waits
for a core a slot holds: it asks for free cores only, and a warm-up still queued after
``timeout_s`` (a core taken meanwhile) is cancelled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: How often the executors are looked at.
CHECK_INTERVAL_S = 2.0
#: A warm-up job still running after this is cancelled (its tasks wait for busy cores).
WARM_UP_TIMEOUT_S = 30.0


def _started(_: Any) -> int:
    """The warm-up task: that it ran is the point (the daemon forked a worker)."""
    return 0


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
        while not self._stop.wait(self.interval_s):
            try:
                executors, free = self._executors_and_free_cores()
                if executors - warmed and free > 0:
                    self._warm_up(free)
                    if self.on_warmed is not None:
                        self.on_warmed(free)
                warmed = executors
            except Exception as exc:  # noqa: BLE001 - best effort: a cold spare is only slower
                if self._stop.is_set():
                    return
                log.debug("warming spare executors failed: %s", exc)

    def _executors_and_free_cores(self) -> tuple[frozenset[str], int]:
        """The executors (host:port; the driver's entry among them) and the cores no task uses."""
        jsc = self.session.sparkContext._jsc.sc()
        infos = list(jsc.statusTracker().getExecutorInfos())
        executors = frozenset(f"{i.host()}:{i.port()}" for i in infos)
        running = sum(int(i.numRunningTasks()) for i in infos)
        total = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
        return executors, total - running

    def _warm_up(self, tasks: int) -> None:
        sc = self.session.sparkContext
        sc.setJobGroup(self._group, "chandy: start the Python daemon on spare executors", True)
        timer = threading.Timer(self.timeout_s, sc.cancelJobGroup, (self._group,))
        timer.daemon = True
        timer.start()
        try:
            sc.parallelize(range(tasks), tasks).map(_started).collect()
            log.debug("Started the Python daemon on up to %d spare executor cores.", tasks)
        finally:
            timer.cancel()
