"""Finding (or starting) the Spark session a job runs on, and how many slots it offers.

With an active ``SparkSession`` (``spark-submit job.py`` on any cluster) chandy
uses it as it is. Otherwise it starts a local one, ``local[N]``, bound to
loopback and set up for long-running barrier tasks: Python workers are not
reused (a reused worker would keep a finished slot's threads and ports), their
daemon has chandy imported before it forks them (:mod:`chandy.runtime.spark.daemon`), and a
barrier stage that cannot get enough slots fails at once instead of retrying
for ten minutes.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from typing import Any

from chandy.errors import ConfigurationError

log = logging.getLogger(__name__)

#: Spark settings chandy needs for a session it starts itself.
LOCAL_SESSION_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.python.worker.reuse": "false",
    # the workers it forks for the slots' tasks have chandy imported already (daemon.py)
    "spark.python.daemon.module": "chandy.runtime.spark.daemon",
    "spark.python.task.killTimeout": "2s",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.sql.shuffle.partitions": "4",
}


def active_session() -> Any | None:
    """The session of this process, if one runs (``getActiveSession`` alone is per thread)."""
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - pyspark is a dependency
        raise ConfigurationError("the Spark executor needs pyspark: pip install pyspark") from exc
    session = SparkSession.getActiveSession()
    if session is None and SparkContext._active_spark_context is not None:
        session = SparkSession.builder.getOrCreate()  # the running context's session
    return session


def get_or_create_session(slots_needed: int, spark_conf: dict[str, str]) -> Any:
    """The active session, or a new ``local[N]`` one with N = ``slots_needed`` (at least 2)."""
    session = active_session()
    if session is not None:
        return session
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Slots must run this interpreter (where chandy and the job's modules are installed);
    # Spark reads it from the environment when the context starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = max(slots_needed, 2)
    builder = SparkSession.builder.master(spark_conf.get("spark.master", f"local[{cores}]"))
    builder = builder.appName(spark_conf.get("spark.app.name", "chandy"))
    for key, value in {
        **LOCAL_SESSION_CONF,
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        **spark_conf,
    }.items():
        builder = builder.config(key, value)
    log.info("Starting a local Spark session (%s).", spark_conf.get("spark.master", f"local[{cores}]"))
    return builder.getOrCreate()


def is_single_host(master: str) -> bool:
    """True when every executor runs on this machine (local paths work everywhere)."""
    return master.startswith("local")


def total_slots(session: Any) -> int:
    """How many barrier tasks the cluster can run at once right now."""
    sc = session.sparkContext
    master = sc.master
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master)
    if match:
        return (os.cpu_count() or 1) if match.group(1) == "*" else int(match.group(1))
    if master == "local":
        return 1
    try:
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - older Spark or another cluster manager
        return int(sc.defaultParallelism)


def wait_for_slots(session: Any, needed: int, timeout_s: float) -> int:
    """Wait (for executors to register) until ``needed`` slots exist; the count found.
    A local master has all its slots from the start: no waiting there."""
    deadline = time.monotonic() + (
        0 if re.fullmatch(r"local(\[.*\])?", session.sparkContext.master) else timeout_s
    )
    available = total_slots(session)
    while available < needed and time.monotonic() < deadline:
        time.sleep(0.5)
        available = total_slots(session)
    return available
