"""The Python daemon of chandy's Spark executors: PySpark's own, with the slot runtime
imported before it forks its first worker.

Spark starts one Python daemon per executor and forks a worker from it for every Python
task. With PySpark's daemon each new slot (a job's first, or the next stage after an
executor was lost) first imports chandy, PyArrow and NumPy in its fresh worker: 2-3 s on
a busy machine, paid by every slot of every recovery. Forked from this daemon, a worker
has them already (copy-on-write), so a slot starts in milliseconds. (PySpark imports
them after the fork so that the daemon starts no thread; NumPy's and PyArrow's threads
are made for fork, and the slot supervisor forks slot processes from the same imports.) chandy sets
``spark.python.daemon.module`` to this module for the sessions it starts (unless the
deployment set its own); the workers need chandy installed, which they need anyway.
"""

from __future__ import annotations

import pyspark.worker  # noqa: F401 - PySpark imports it after the fork otherwise

import chandy.runtime.spark.slot
import chandy.state.heap
import chandy.task.stream_task  # noqa: F401

if __name__ == "__main__":
    from pyspark import daemon

    daemon.manager()
