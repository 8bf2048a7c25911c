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

import contextlib
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from chandy.errors import ConfigurationError
from chandy.runtime.console import SetupError

log = logging.getLogger(__name__)

#: Spark's log level in a session chandy starts, unless the user chose one (``spark.log.level``,
#: or a log4j configuration of their own): its INFO lines are for Spark's developers.
DEFAULT_LOG_LEVEL = "WARN"

#: log4j configuration files in Spark's configuration directory that mean "the user configured
#: Spark's logging".
_LOG4J_FILES = ("log4j2.properties", "log4j2.xml", "log4j2.yaml", "log4j2.json", "log4j.properties")

#: What a new local Spark JVM says at start that a user cannot act on: which log4j profile it
#: took, how to change the log level (chandy set it), that Hadoop's native library is missing
#: (Spark uses its Java code instead), the JDK's incubator modules.
JVM_NOISE = re.compile(
    r"Using Spark's default log4j profile"
    r"|Setting (?:default|Spark) log level to"
    r"|To adjust logging level use sc\.setLogLevel"
    r"|NativeCodeLoader: Unable to load native-hadoop library"
    r"|^WARNING: Using incubator modules"
)

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
    if not user_sets_log_level(spark_conf, submitted):
        settings["spark.log.level"] = DEFAULT_LOG_LEVEL
    builder = SparkSession.builder.master(master).appName(name)
    options = {"spark.master": master, "spark.app.name": name}
    for key, value in settings.items():
        if key not in submitted or key in spark_conf:  # spark-submit's own settings stand
            builder = builder.config(key, value)
            options[key] = value
    log.info("Starting a Spark session (%s, application '%s').", master, name)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit: chandy starts the JVM
        launch_jvm(options)
    with _keep_sigint_handler():
        return builder.getOrCreate()


@contextlib.contextmanager
def _keep_sigint_handler() -> Iterator[None]:
    """A new SparkContext installs a SIGINT handler (in the main thread) that cancels every
    Spark job at once: on Ctrl-C that kills chandy's slots under the job, before the job is
    cancelled in order, and Spark logs the lost tasks. The handler in place before (Python's
    KeyboardInterrupt) is put back: ``execute()`` cancels the job and ends its slots itself."""
    try:
        previous = signal.getsignal(signal.SIGINT)
    except ValueError:  # pragma: no cover - not the main interpreter
        previous = None
    try:
        yield
    finally:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous)


def user_sets_log_level(spark_conf: dict[str, str], submitted: dict[str, str]) -> bool:
    """Whether the user chose Spark's log level (``spark.log.level``) or its logging
    altogether (a log4j configuration of their own): then chandy leaves it alone."""
    if "spark.log.level" in spark_conf or "spark.log.level" in submitted:
        return True
    options = " ".join(
        [
            spark_conf.get("spark.driver.extraJavaOptions", ""),
            submitted.get("spark.driver.extraJavaOptions", ""),
            os.environ.get("SPARK_SUBMIT_OPTS", ""),
            os.environ.get("JAVA_TOOL_OPTIONS", ""),
        ]
    )
    if "log4j" in options:
        return True
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if "SPARK_HOME" in os.environ else None
    )
    return conf_dir is not None and any(os.path.exists(os.path.join(conf_dir, name)) for name in _LOG4J_FILES)


def java_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Why Spark's launcher cannot find Java (it runs ``$JAVA_HOME/bin/java``, else ``java``
    on ``PATH``), or ``None`` when it can."""
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    if home:
        if not os.access(os.path.join(home, "bin", "java"), os.X_OK):
            return f"JAVA_HOME is {home}, which has no bin/java"
        return None
    if shutil.which("java", path=env.get("PATH", os.defpath)) is None:
        return "JAVA_HOME is not set and there is no `java` on PATH"
    return None


def _no_java(problem: str) -> SetupError:
    return SetupError(
        f"Spark cannot start: it needs Java 17 or later, and {problem}. Install it (e.g. "
        "`apt install openjdk-17-jre-headless`) or set JAVA_HOME to a Java 17 installation; "
        "or run the job without Spark on the local executor, which needs no Java: "
        'StreamExecutionEnvironment.get_execution_environment(executor="local"), or '
        "-D execution.target=local"
    )


def launch_jvm(options: dict[str, str]) -> None:
    """Start Spark's JVM (PySpark's gateway) for a new local session, its stderr read by
    this process: Spark's start-up lines a user cannot act on are dropped and the rest is
    written to ``sys.stderr`` (where the status line keeps it apart from itself), and once
    this process exits nothing Spark's JVM or its workers say about the exit reaches the
    console. A JVM that cannot start is one clear error, not PySpark's traceback."""
    from pyspark import SparkConf, SparkContext, java_gateway

    launch_gateway: Callable[..., Any] = java_gateway.launch_gateway  # untyped in PySpark
    if SparkContext._gateway is not None:
        return
    problem = java_problem()
    if problem is not None:
        raise _no_java(problem)
    conf = SparkConf()
    for key, value in options.items():
        conf.set(key, value)
    read_end, write_end = os.pipe()
    forwarder = JvmOutput(read_end)
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": write_end})
    except Exception:  # noqa: BLE001 - PySpark's JAVA_GATEWAY_EXITED and kin
        os.close(write_end)
        said = " (what it said is above)" if forwarder.said_something() else ""
        raise SetupError(
            f"Spark's JVM exited at start{said}. "
            "Spark needs Java 17 or later: install it (e.g. `apt install openjdk-17-jre-headless`) "
            "or set JAVA_HOME to a Java 17 installation; or run the job on the local executor, "
            'which needs no Java: get_execution_environment(executor="local"), or '
            "-D execution.target=local"
        ) from None
    os.close(write_end)  # the JVM holds its own copy: the reader sees EOF once it exits
    SparkContext._ensure_initialized(gateway=gateway, conf=conf)


class JvmOutput:
    """Reads what Spark's JVM (and the Python workers it starts) write to stderr, on a
    daemon thread, until the JVM exits: drops :data:`JVM_NOISE` and writes the rest to
    ``sys.stderr``. The thread lives as long as the JVM, like PySpark's gateway threads,
    and is named like them, not like a job's threads (which end with their job)."""

    def __init__(self, fd: int) -> None:
        self._file = os.fdopen(fd, "rb")
        #: Whether a line was passed on (what a JVM that exits at once said).
        self._said = False
        self._thread = threading.Thread(target=self._run, name="pyspark gateway stderr", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._file:
            for raw in iter(self._file.readline, b""):
                line = raw.decode(errors="replace")
                if JVM_NOISE.search(line):
                    continue
                self._said = self._said or bool(line.strip())
                try:
                    sys.stderr.write(line)
                    sys.stderr.flush()
                except (OSError, ValueError):  # stderr is gone: keep draining the pipe
                    pass

    def said_something(self, timeout_s: float = 5.0) -> bool:
        """Whether the JVM said anything, once it exited and its output was passed on."""
        self._thread.join(timeout_s)
        return self._said


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
