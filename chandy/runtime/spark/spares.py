"""Spare executors kept ready: their Python daemon started before a slot needs it.

When an executor JVM is lost, its slot stage fails as a whole (a barrier stage), and the
next stage starts the job's slots on the executors that have free cores: the survivors
and the cluster's spares. On a survivor the slot forks from the Python daemon that runs
there already (with chandy imported, see daemon.py). On a spare that never ran a Python
task, Spark first starts that daemon: a new interpreter importing PySpark, chandy, PyArrow
and NumPy, seconds on the recovery's critical path. Flink keeps its spare TaskManagers'
slots registered for the same reason.

:class:`SpareExecutorWarmer` watches the cluster's executors and, whenever one appears
that has never run a task (Spark's own count of the executor's tasks, so an executor
is cold until a task really ran there), runs one trivial Python task per free core, which
starts the daemon on every executor with a free core (the spares). Each task holds its core
for a moment (:data:`HOLD_S`): tasks that ended at once would let one fast executor take
them all, and a spare would stay cold. While a cold executor remains, the warm-up is tried
again at the next look. It never waits for a core a slot holds: it asks for free cores
only, and a warm-up still queued after ``timeout_s`` (a core taken meanwhile) is cancelled.

Why Spark's task count and not the set of executors seen: an executor that joins while
every core is busy, or whose cores the scheduler has not counted yet, would be taken for
warm as soon as it was seen, and stay cold (a replacement for a killed worker did, on a
loaded machine, and the slot moved there later paid for the daemon's start).
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
        while not self._stop.wait(self.interval_s):
            try:
                cold, free = self._cold_executors_and_free_cores()
                if cold and free > 0:
                    log.debug("Warming executors %s that never ran a task (%d free cores).", cold, free)
                    self._warm_up(free)
                    if self.on_warmed is not None:
                        self.on_warmed(free)
            except Exception as exc:  # noqa: BLE001 - best effort: a cold spare is only slower
                if self._stop.is_set():
                    return
                log.debug("warming spare executors failed: %s", exc)

    def _cold_executors_and_free_cores(self) -> tuple[list[str], int]:
        """The executors that never ran a task (the driver's entry aside), and the cores no
        task uses."""
        jsc = self.session.sparkContext._jsc.sc()
        summaries = jsc.statusStore().executorList(True)
        executors = [summaries.apply(i) for i in range(summaries.size())]
        cold = sorted(e.id() for e in executors if e.id() != "driver" and int(e.totalTasks()) == 0)
        running = sum(int(e.activeTasks()) for e in executors)
        total = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
        return cold, total - running

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
