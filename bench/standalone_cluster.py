"""A real Spark standalone cluster on loopback, started with the ``spark-class`` that the
PySpark wheel ships: one master and as many workers as a test asks for (1 core each).

The cluster owns every process it starts (the master's and the workers' JVMs; the
executor JVMs are the workers' children, which end with them) and ends them by PID.
Ports are the ones the JVMs chose, read from their logs: nothing fixed, so that two
runs on one machine do not collide.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark

from bench.procs import process_stats

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
START_TIMEOUT_S = 120
#: A master's or worker's addresses: loopback, on ports the JVM chooses (read from its log).
LOOPBACK_PORTS = ("--host", "127.0.0.1", "--port", "0", "--webui-port", "0")


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path
    web_url: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def state(self) -> dict[str, Any]:
        """The worker's JSON (its running and finished executors)."""
        return _get_json(self.web_url + "/json/")

    def executor_pids(self) -> list[int]:
        """The executor JVMs this worker started that still run (its child processes)."""
        return [pid for pid in _children(self.pid) if "CoarseGrainedExecutorBackend" in _cmdline(pid)]

    def python_daemons(self) -> list[str]:
        """The command lines of the Python daemons its executors started."""
        return [
            _cmdline(pid)
            for executor in self.executor_pids()
            for pid in _children(executor)
            if " -m " in _cmdline(pid) and "daemon" in _cmdline(pid)
        ]


class StandaloneCluster:
    """``with StandaloneCluster(tmp) as cluster: cluster.add_workers(2); cluster.url``."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._processes: list[subprocess.Popen[bytes]] = []
        self.workers: list[Worker] = []
        self.url = ""
        self.web_url = ""
        self._next_worker = 0

    def __enter__(self) -> StandaloneCluster:
        try:
            self._start_master()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- processes --------------------------------------------------------------

    def _spawn(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.work_dir / f"{name}.log"
        conf = self.work_dir / "spark-defaults.conf"
        conf.write_text("spark.master.rest.enabled false\nspark.ui.showConsoleProgress false\n")
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_CONF_DIR": str(self.work_dir),
        }
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [str(SPARK_CLASS), *args, "--properties-file", str(conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own group: the JVM and what spark-class forks
            )
        self._processes.append(process)
        return process, log

    def _start_master(self) -> None:
        process, log = self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            *LOOPBACK_PORTS,
        )
        self.url = _wait_for_log(process, log, r"Starting Spark master at (spark://\S+)")
        port = _wait_for_log(process, log, r"MasterWebUI: .*started at http://[^:]+:(\d+)")
        self.web_url = f"http://127.0.0.1:{port}"

    def add_workers(self, count: int) -> list[Worker]:
        """Start ``count`` workers with 1 core each (at once) and wait until each has
        registered with the master."""
        started = []
        for _ in range(count):
            index = self._next_worker
            self._next_worker += 1
            work = self.work_dir / f"worker-{index}"
            work.mkdir(exist_ok=True)
            started.append(
                self._spawn(
                    f"worker-{index}",
                    "org.apache.spark.deploy.worker.Worker",
                    *LOOPBACK_PORTS,
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(work),
                    self.url,
                )
            )
        workers = []
        for process, log in started:
            port = _wait_for_log(process, log, r"WorkerWebUI: .*started at http://[^:]+:(\d+)")
            _wait_for_log(process, log, r"Successfully registered with master")
            workers.append(Worker(process, log, f"http://127.0.0.1:{port}"))
        self.workers.extend(workers)
        return workers

    def kill_worker(self, worker: Worker) -> None:
        """SIGKILL a worker's JVM and the executor JVMs it started (a machine lost)."""
        executors = worker.executor_pids()
        _kill_group(worker.process)
        for pid in executors:
            _kill(pid)
        self.workers.remove(worker)

    def worker_of_executor(self, executor_pid: int) -> Worker:
        """The worker whose child the executor JVM ``executor_pid`` is."""
        for worker in self.workers:
            if executor_pid in _children(worker.pid):
                return worker
        raise LookupError(f"no worker of this cluster started process {executor_pid}")

    def state(self) -> dict[str, Any]:
        """The master's JSON: workers, active and completed applications."""
        return _get_json(self.web_url + "/json/")

    def close(self) -> None:
        """End every process this cluster started (executor JVMs with their workers)."""
        executors = [pid for worker in self.workers for pid in _safe_executor_pids(worker)]
        for process in reversed(self._processes):
            _kill_group(process)
        for pid in executors:
            _kill(pid)
        self._processes.clear()
        self.workers.clear()


def _wait_for_log(process: subprocess.Popen[bytes], log: Path, pattern: str) -> str:
    """The first group of ``pattern``'s first match in ``log``, once the JVM wrote it."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        match = regex.search(log.read_text(errors="replace"))
        if match:
            return match.group(1) if regex.groups else match.group(0)
        if process.poll() is not None:
            raise RuntimeError(f"{log.stem} exited ({process.returncode}): {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{log.stem} did not log /{pattern}/: {log.read_text()[-3000:]}")
        time.sleep(0.1)


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        result: dict[str, Any] = json.load(response)
    return result


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    return [child for child, fields in process_stats() if int(fields[1]) == pid]


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _safe_executor_pids(worker: Worker) -> list[int]:
    try:
        return worker.executor_pids()
    except OSError:
        return []


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(30)
