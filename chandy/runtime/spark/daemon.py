"""The Python daemon of a Spark session chandy starts (``spark.python.daemon.module``):
PySpark's own, with the slot's modules imported once, before it forks a worker for each
task. A slot task's worker otherwise imported them itself (chandy, NumPy, PyArrow: about
half a second, a second or more on a loaded machine) before its slot could start, at
every stage start.

Importing NumPy and PyArrow starts native threads (OpenBLAS's, jemalloc's background
thread), which PySpark's daemon avoids before it forks; both libraries make fork safe with
``pthread_atfork`` handlers, and a worker's slot supervisor forked its slot processes with
the same threads running before this module existed (it imported them in the worker).
"""

from __future__ import annotations

import chandy.runtime.spark.slot  # noqa: F401 - imported here once, not in every forked worker

if __name__ == "__main__":
    from pyspark.daemon import manager

    manager()
