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
    # chandy owns the console of the job it runs (its status line, the job's print output):
    # Spark's stage bar would be glued to both, and a streaming stage never completes anyway.
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "false",
    # Workers fork from a daemon that has the slot runtime imported (see daemon.py).
    "spark.python.daemon.module": "chandy.runtime.spark.daemon",
    "spark.python.task.killTimeout": "2s",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.sql.shuffle.partitions": "4",
}

#: ... for a session it starts on a cluster: the driver binds where Spark decides (other
#: hosts must reach it) and Spark's web UI is on, as the cluster's users expect; the rest
#: as for a local session.
CLUSTER_SESSION_CONF = {
    key: value
    for key, value in LOCAL_SESSION_CONF.items()
    if not key.startswith("spark.driver.") and key != "spark.ui.enabled"
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


def get_or_create_session(slots_needed: int, spark_conf: dict[str, str], app_name: str = "chandy") -> Any:
    """The active session, or a new one.

    Where the master and the application's name come from, first found wins, as in Spark
    (settings made in code override ``spark-submit``'s): ``spark.master`` /
    ``spark.app.name`` in the job's configuration; what ``spark-submit`` was given (its
    ``--master`` and ``--name`` flags, ``--conf`` and ``spark-defaults.conf``); else
    ``local[N]`` with N = ``slots_needed`` (at least 2), named ``app_name``.

    Only a local master is bound to loopback and told to run this interpreter in its
    workers: on a cluster the driver must be reachable from other hosts, and the workers'
    Python is the deployment's (``PYSPARK_PYTHON``, ``--archives``; docs/deployment.md).
    """
    session = active_session()
    if session is not None:
        return session
    from pyspark.sql import SparkSession

    submitted = submitted_conf()
    cores = max(slots_needed, 2)
    master = spark_conf.get("spark.master") or submitted.get("spark.master") or f"local[{cores}]"
    name = spark_conf.get("spark.app.name") or submitted.get("spark.app.name") or app_name or "chandy"
    settings = dict(spark_conf)
    if is_single_host(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Slots must run this interpreter (where chandy and the job's modules are installed);
        # Spark reads it from the environment when the context starts.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        settings = {
            **LOCAL_SESSION_CONF,
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            **spark_conf,
        }
    else:
        settings = {**CLUSTER_SESSION_CONF, **spark_conf}
    builder = SparkSession.builder.master(master).appName(name)
    for key, value in settings.items():
        if key not in submitted or key in spark_conf:  # spark-submit's own settings stand
            builder = builder.config(key, value)
    log.info("Starting a Spark session (%s, application '%s').", master, name)
    return builder.getOrCreate()


def submitted_conf() -> dict[str, str]:
    """The Spark settings ``spark-submit`` gave this process (empty when it was not started
    by ``spark-submit``): they live in the JVM that started it, which is reached here
    through the gateway whose port ``spark-submit`` put in the environment."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return {}
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM, starts nothing
    return {key: value for key, value in SparkConf().getAll()}


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
