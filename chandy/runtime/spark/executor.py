"""SparkExecutor: the driver side of running a job's tasks in a Spark barrier stage.

The executor owns three things, each closed by :meth:`SparkExecutor.close`:

* the control server, where slots connect (after the secret handshake) and
  report task states, checkpoint acknowledgements, results and log records;
* the slot pool: one barrier stage of ``n`` long-running tasks, submitted from
  a thread of its own that waits in ``collect()``. Spark never retries a failed
  barrier ResultStage, so when a slot process dies ``collect()`` raises and the
  pool is dead; the executor cancels the stage's job group (which kills the
  remaining Python workers) and the next deployment submits a new stage;
* deployments: one generation of tasks spread over the slots. A failed task
  does not kill its slot, so after a task failure the JobMaster's next
  deployment goes into the same, live slots in well under a second.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from chandy.config import Configuration
from chandy.config.options import NetworkOptions, SparkOptions
from chandy.errors import ConfigurationError, JobExecutionError
from chandy.graph.execution_graph import ExecutionGraph
from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    CheckpointOptions,
    DeclineCheckpoint,
    EndOfInputReached,
)
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.status import ExecutionState
from chandy.network.auth import new_secret
from chandy.network.framing import FramedSocket, accept_authenticated, close_listener
from chandy.runtime.executor import Deployment, Executor
from chandy.runtime.spark import session as spark_session
from chandy.runtime.spark.messages import (
    CancelTasks,
    DeployTasks,
    ForwardedLogRecord,
    Heartbeat,
    NotifyCheckpoint,
    PrintedOutput,
    PublishResults,
    RegisterSlot,
    ResultsAccepted,
    Shutdown,
    TaskStateChanged,
    TaskToDeploy,
    TriggerCheckpoint,
)
from chandy.runtime.spark.slot import SlotBootstrap, run_slot
from chandy.task.deployment import TaskDeploymentDescriptor, serialize_chain
from chandy.task.services import TaskFailure, TaskServices, TaskStateListener

log = logging.getLogger(__name__)

_pool_ids = itertools.count(1)


class SlotLostError(RuntimeError):
    """A slot process (or its executor) went away; its tasks died with it."""


class _SlotConnection:
    def __init__(self, info: RegisterSlot, connection: FramedSocket) -> None:
        self.info = info
        self.connection = connection
        self.last_seen = time.monotonic()
        self.alive = True
        self.collect_queue: queue.Queue[PublishResults | None] = queue.Queue()


class SlotPool:
    """One barrier stage: ``size`` slots, each connected to the control server."""

    def __init__(
        self, executor: SparkExecutor, session: Any, size: int, bootstrap: SlotBootstrap, job_name: str
    ) -> None:
        self.executor = executor
        self.session = session
        self.size = size
        self.group = f"chandy-{bootstrap.job_id}-{next(_pool_ids)}"
        self.slots: dict[int, _SlotConnection] = {}
        self.alive = True
        self._stopping = False
        self.failure: str | None = None
        self._registered = threading.Condition()
        self._bootstrap = bootstrap
        self._thread = threading.Thread(
            target=self._run_stage, args=(job_name,), daemon=True, name=f"chandy spark stage {self.group}"
        )
        self._thread.start()

    def _run_stage(self, job_name: str) -> None:
        sc = self.session.sparkContext
        bootstrap = self._bootstrap
        sc.setJobGroup(self.group, f"chandy: {job_name}", interruptOnCancel=True)
        try:
            sc.parallelize(range(self.size), self.size).barrier().mapPartitions(
                lambda _: run_slot(bootstrap)
            ).collect()
            reason = "the slot stage ended"
        except Exception as exc:  # noqa: BLE001 - any stage failure means lost slots
            reason = _first_line(exc)
        self._die(reason)

    def _die(self, reason: str) -> None:
        with self._registered:
            if not self.alive:
                return
            self.alive = False
            self.failure = reason
            self._registered.notify_all()
        if self._stopping:
            return  # an orderly end: nothing was lost
        for index, slot in list(self.slots.items()):
            if slot.alive:
                slot.alive = False
                self.executor._slot_lost(self, index, reason)

    def register(self, info: RegisterSlot, connection: FramedSocket) -> _SlotConnection:
        slot = _SlotConnection(info, connection)
        with self._registered:
            self.slots[info.slot_index] = slot
            self._registered.notify_all()
        return slot

    def wait_registered(self, timeout_s: float) -> None:
        with self._registered:
            done = self._registered.wait_for(
                lambda: len(self.slots) >= self.size or not self.alive, timeout_s
            )
        if not self.alive:
            raise JobExecutionError(f"the Spark stage for the job's {self.size} slots failed: {self.failure}")
        if not done:
            raise JobExecutionError(
                f"only {len(self.slots)} of {self.size} slots started within {timeout_s:.0f} s"
            )

    def send(self, index: int, message: Any) -> bool:
        slot = self.slots.get(index)
        if slot is None or not slot.alive:
            return False
        try:
            slot.connection.send_message(message)
            return True
        except OSError:
            return False

    def stop(self, timeout_s: float = 15.0) -> None:
        """Tell live slots to stop; kill the stage if they do not end in time."""
        self._stopping = True
        for index in list(self.slots):
            self.send(index, Shutdown("the job ended"))
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.session.sparkContext.cancelJobGroup(self.group)
            self._thread.join(timeout_s)
        self._die("stopped")
        for slot in self.slots.values():
            slot.collect_queue.put(None)
            slot.connection.close()

    def kill(self) -> None:
        """Cancel the stage at once (Spark kills the Python workers)."""
        self._stopping = True
        self._die("cancelled")
        self.session.sparkContext.cancelJobGroup(self.group)
        self._thread.join(60)
        for slot in self.slots.values():
            slot.collect_queue.put(None)
            slot.connection.close()


class SparkDeployment(Deployment):
    """One generation of tasks in the slots of a pool."""

    def __init__(
        self,
        executor: SparkExecutor,
        pool: SlotPool,
        generation: int,
        attempts: dict[ExecutionAttemptID, int],
    ) -> None:
        self.executor = executor
        self.pool = pool
        self.generation = generation
        self.attempts = attempts  # attempt -> slot
        self._terminal: set[ExecutionAttemptID] = set()
        self._stopped = threading.Condition()

    def mark_terminal(self, attempt_id: ExecutionAttemptID) -> bool:
        """Record that a task ended; False if it had ended before."""
        with self._stopped:
            if attempt_id in self._terminal:
                return False
            self._terminal.add(attempt_id)
            self._stopped.notify_all()
            return True

    def cancel(self) -> None:
        for index in set(self.attempts.values()):
            self.pool.send(index, CancelTasks(self.generation))

    def wait_stopped(self, timeout_s: float) -> bool:
        with self._stopped:
            return self._stopped.wait_for(lambda: self._terminal >= set(self.attempts), timeout_s)

    def trigger_checkpoint(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int, options: CheckpointOptions
    ) -> bool:
        slot = self.attempts.get(attempt_id)
        return slot is not None and self.pool.send(
            slot, TriggerCheckpoint(attempt_id, checkpoint_id, timestamp, options)
        )

    def notify_checkpoint_complete(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        slot = self.attempts.get(attempt_id)
        if slot is not None:
            self.pool.send(slot, NotifyCheckpoint(attempt_id, checkpoint_id, True))

    def notify_checkpoint_aborted(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        slot = self.attempts.get(attempt_id)
        if slot is not None:
            self.pool.send(slot, NotifyCheckpoint(attempt_id, checkpoint_id, False))


class SparkExecutor(Executor):
    """Runs a job's tasks in long-running Spark barrier tasks (one per slot)."""

    def __init__(self, config: Configuration) -> None:
        self.config = config
        self.secret = new_secret()
        self.session: Any = None
        self._pool: SlotPool | None = None
        self._deployment: SparkDeployment | None = None
        self._listener: TaskStateListener | None = None
        self._services: TaskServices | None = None
        self._generation = 0
        self._closed = False
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    # -- setup ------------------------------------------------------------------

    def _ensure_session_and_server(self, slots: int) -> None:
        if self.session is None:
            spark_conf = {k: str(v) for k, v in self.config.to_dict().items() if k.startswith("spark.")}
            self.session = spark_session.get_or_create_session(slots, spark_conf)
        if self._server is None:
            host = self.session.sparkContext.getConf().get("spark.driver.host", "127.0.0.1")
            self._server = socket.create_server((host, 0))
            self.driver_address = f"{host}:{self._server.getsockname()[1]}"
            self._start(self._accept_loop, "chandy control accept")
            self._start(self._watch_heartbeats, "chandy heartbeat watch")

    def _start(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def prepare(self, slots: int, checkpoint_dir: str | None) -> None:
        """Refuse, in seconds and with a clear message, a job this cluster cannot run."""
        self._ensure_session_and_server(slots)
        wait = self.config.get(SparkOptions.SLOT_WAIT)
        available = spark_session.wait_for_slots(self.session, slots, wait / 1000)
        if available < slots:
            raise ConfigurationError(
                f"the job needs {slots} slots (its highest parallelism) but the Spark cluster "
                f"({self.session.sparkContext.master}) has {available} task slots. Lower the "
                "parallelism, or give Spark more executors or cores."
            )
        check_storage_reachable(self.session.sparkContext.master, checkpoint_dir)

    # -- deployment -------------------------------------------------------------

    def deploy(
        self,
        execution_graph: ExecutionGraph,
        descriptors: list[TaskDeploymentDescriptor],
        listener: TaskStateListener,
        services: TaskServices,
    ) -> SparkDeployment:
        graph = execution_graph.job_graph
        slots = graph.max_parallelism_of_any_vertex
        self._listener = listener
        self._services = services
        self._ensure_session_and_server(slots)
        pool = self._pool
        if pool is None or not pool.alive or pool.size != slots:
            if pool is not None:
                pool.kill()
            started = time.monotonic()
            bootstrap = SlotBootstrap(
                graph.job_id, slots, self.driver_address, self.secret, services.checkpoint_storage
            )
            pool = self._pool = SlotPool(self, self.session, slots, bootstrap, graph.job_name)
            pool.wait_registered(self.config.get(SparkOptions.SLOT_WAIT) / 1000 + 120)
            log.info("%d slots of job %s are up (%.1f s).", slots, graph.job_id, time.monotonic() - started)
        self._generation += 1
        capacity = Configuration(graph.config).get(NetworkOptions.BUFFERS_PER_CHANNEL)
        by_slot: dict[int, list[TaskToDeploy]] = {}
        attempts: dict[ExecutionAttemptID, int] = {}
        chains = {v.id: serialize_chain(v.name, tuple(v.operators)) for v in graph.vertices}
        for tdd in descriptors:
            vertex = graph.vertex(tdd.vertex_id)
            by_slot.setdefault(tdd.subtask_index, []).append(
                TaskToDeploy(
                    dataclasses.replace(tdd, operators=()),
                    chains[tdd.vertex_id],
                    tuple(execution_graph.input_channel_ids(vertex, tdd.subtask_index)),
                    tuple(tuple(e) for e in execution_graph.output_channel_ids(vertex, tdd.subtask_index)),
                )
            )
            attempts[tdd.attempt_id] = tdd.subtask_index
        deployment = SparkDeployment(self, pool, self._generation, attempts)
        self._deployment = deployment
        for index, tasks in by_slot.items():
            if not pool.send(index, DeployTasks(self._generation, tuple(tasks), capacity)):
                self._slot_lost(pool, index, "the slot was gone when tasks were deployed")
        return deployment

    # -- control connections ------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._server is not None
        for connection, peer in accept_authenticated(
            self._server, self.secret, "control", lambda: self._closed
        ):
            self._start(self._serve_slot, f"chandy control {peer[0]}:{peer[1]}", connection)

    def _serve_slot(self, connection: FramedSocket) -> None:
        pool = self._pool
        try:
            info = connection.recv_message()
        except (OSError, ConnectionError, EOFError):
            connection.close()
            return
        if pool is None or not isinstance(info, RegisterSlot):
            connection.close()
            return
        slot = pool.register(info, connection)
        self._start(self._publish_results, f"chandy results slot {info.slot_index}", pool, slot)
        try:
            while True:
                self._dispatch(pool, slot, connection.recv_message())
        except (OSError, ConnectionError, EOFError) as exc:
            if pool.alive and slot.alive and not self._closed:
                self._slot_lost(pool, info.slot_index, f"connection lost ({exc or 'closed'})")

    def _dispatch(self, pool: SlotPool, slot: _SlotConnection, message: Any) -> None:
        slot.last_seen = time.monotonic()
        if isinstance(message, TaskStateChanged):
            deployment = self._deployment
            if deployment is not None and message.state.is_terminal:
                deployment.mark_terminal(message.attempt_id)
            if self._listener is not None:
                self._listener.notify_task_state(message.attempt_id, message.state, message.failure)
        elif isinstance(message, (AcknowledgeCheckpoint, DeclineCheckpoint, EndOfInputReached)):
            responder = self._services.checkpoint_responder if self._services else None
            if responder is not None:
                if isinstance(message, AcknowledgeCheckpoint):
                    responder.acknowledge_checkpoint(message)
                elif isinstance(message, DeclineCheckpoint):
                    responder.decline_checkpoint(message)
                else:
                    responder.report_end_of_input(message)
        elif isinstance(message, PublishResults):
            slot.collect_queue.put(message)
        elif isinstance(message, PrintedOutput):
            stream = sys.stdout if message.stream == "stdout" else sys.stderr
            stream.write(message.text)
            stream.flush()
        elif isinstance(message, ForwardedLogRecord):
            logging.getLogger(message.name).log(
                message.level,
                "[slot %d, attempt %d] %s%s",
                message.slot_index,
                message.attempt,
                message.message,
                f"\n{message.exc_text}" if message.exc_text else "",
            )
        elif not isinstance(message, Heartbeat):
            log.warning("unexpected message from slot %d: %r", slot.info.slot_index, message)

    def _publish_results(self, pool: SlotPool, slot: _SlotConnection) -> None:
        """Hands collected batches to the client, one at a time (a slow client slows the sink)."""
        while True:
            message = slot.collect_queue.get()
            if message is None:
                return
            results = self._services.results if self._services else None
            accepted = False
            if results is not None:
                try:
                    results.publish(
                        message.collect_id,
                        message.subtask_index,
                        message.batch,
                        message.token,
                        lambda: not pool.alive or self._closed,
                    )
                    accepted = True
                except Exception:  # noqa: BLE001 - the client went away or the job is ending
                    accepted = False
            pool.send(slot.info.slot_index, ResultsAccepted(message.sequence, accepted))

    def _watch_heartbeats(self) -> None:
        timeout = self.config.get(SparkOptions.HEARTBEAT_TIMEOUT) / 1000
        while not self._closed:
            time.sleep(1.0)
            pool = self._pool
            if pool is None or not pool.alive:
                continue
            now = time.monotonic()
            for index, slot in list(pool.slots.items()):
                if slot.alive and now - slot.last_seen > timeout:
                    self._slot_lost(pool, index, f"no heartbeat for {timeout:.0f} s")

    def _slot_lost(self, pool: SlotPool, index: int, reason: str) -> None:
        """A slot is gone: its tasks failed, and the pool must be replaced."""
        slot = pool.slots.get(index)
        if slot is not None:
            slot.alive = False
        info = f" (pid {slot.info.pid} on {slot.info.host})" if slot is not None else ""
        log.warning("Slot %d%s of job is lost: %s", index, info, reason)
        pool.alive = False
        deployment = self._deployment
        if deployment is None or deployment.pool is not pool or self._listener is None:
            return
        error = SlotLostError(f"slot {index}{info} was lost: {reason}")
        failure = TaskFailure(error, type(error).__name__, str(error), str(error), None)
        for attempt_id, attempt_slot in deployment.attempts.items():
            if attempt_slot == index and deployment.mark_terminal(attempt_id):
                self._listener.notify_task_state(attempt_id, ExecutionState.FAILED, failure)

    # -- introspection and shutdown ------------------------------------------------

    def slots(self) -> list[dict[str, Any]]:
        """The live slots: index, host, Python worker pid, executor JVM pid, data address."""
        pool = self._pool
        if pool is None:
            return []
        return [
            {
                "index": i,
                "host": s.info.host,
                "pid": s.info.pid,
                "jvm_pid": s.info.jvm_pid,
                "data_address": s.info.data_address,
                "alive": s.alive,
            }
            for i, s in sorted(pool.slots.items())
        ]

    def close(self) -> None:
        """Stop the slots (Spark kills what does not stop), the server and its threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._pool is not None:
            self._pool.stop()
        if self._server is not None:
            close_listener(self._server)
        for thread in self._threads:
            thread.join(5)


def check_storage_reachable(master: str, checkpoint_dir: str | None) -> None:
    """Refuse a local checkpoint path on a cluster whose executors live on other hosts."""
    if checkpoint_dir is None or spark_session.is_single_host(master):
        return
    if not urlparse(checkpoint_dir).scheme:  # a bare path: this host's disk
        raise ConfigurationError(
            f"execution.checkpointing.dir '{checkpoint_dir}' is a local path, but the job runs "
            f"on a multi-host cluster ({master}) where each executor sees its own disk. Use a "
            "URI every executor can reach: hdfs://, s3://, gs://, or file:///... for a "
            "directory that really is shared (NFS) on every host."
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
