"""SparkExecutor: the driver side of running a job's tasks in a Spark barrier stage.

The executor owns three things, each closed by :meth:`SparkExecutor.close`:

* the control server, where slots connect (after the secret handshake) and
  report task states, checkpoint acknowledgements, results and log records;
* the slot pool: one barrier stage of ``n`` long-running tasks, submitted from
  a thread of its own that waits in ``collect()``. Each task supervises a slot
  process it forked (see :mod:`chandy.runtime.spark.slot`); when that process
  dies, the supervisor forks the next *incarnation*, which registers again, and
  the pool is whole again without Spark noticing. Spark never retries a failed
  barrier ResultStage, so when a supervisor or an executor dies ``collect()``
  raises and the pool is dead; the executor cancels the stage's job group
  (which kills the remaining Python workers) and the next deployment submits a
  new stage;
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
from chandy.errors import ConfigurationError, JobExecutionError, UnrecoverableError
from chandy.graph.execution_graph import ExecutionGraph
from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    CheckpointOptions,
    DeclineCheckpoint,
    EndOfInputReached,
)
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.metrics import MetricsReport
from chandy.messages.status import ExecutionState
from chandy.network.auth import new_secret
from chandy.network.framing import AuthenticatingAcceptor, FramedSocket, close_listener
from chandy.runtime.executor import Deployment, Executor
from chandy.runtime.spark import session as spark_session
from chandy.runtime.spark.messages import (
    AddressesGathered,
    CancelTasks,
    DeployTasks,
    ForwardedLogRecord,
    GatherAddresses,
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
from chandy.runtime.spark.spares import SpareExecutorWarmer
from chandy.task.deployment import TaskDeploymentDescriptor, serialize_chain
from chandy.task.services import TaskFailure, TaskServices, TaskStateListener

log = logging.getLogger(__name__)

_pool_ids = itertools.count(1)

#: Control messages a slot may have queued before the driver declares it lost (it stopped reading).
SEND_QUEUE_CAPACITY = 10_000
_STOP_SENDING = object()


class SlotLostError(RuntimeError):
    """A slot process (or its executor) went away; its tasks died with it."""


class SlotConnection:
    """The driver's end of one slot process's control connection.

    Sending never blocks the caller (the JobMaster thread above all): messages go into a
    bounded queue that a sender thread of this connection writes to the socket, in
    order. A slot that stops reading fills its socket buffer and then the queue; the
    next send then declares it lost (``on_lost``), as does a send that has been stuck
    longer than the heartbeat timeout (see :meth:`stalled_for`).
    """

    def __init__(
        self,
        info: RegisterSlot,
        connection: FramedSocket,
        on_lost: Callable[[SlotConnection, str], None],
        queue_capacity: int = SEND_QUEUE_CAPACITY,
    ) -> None:
        self.info = info
        self.connection = connection
        self.last_seen = time.monotonic()
        #: False once the driver declared this slot process lost (changed under its pool's lock).
        self.alive = True
        self.collect_queue: queue.Queue[PublishResults | None] = queue.Queue()
        self._on_lost = on_lost
        self._outbox: queue.Queue[Any] = queue.Queue(queue_capacity)
        self._capacity = queue_capacity
        self._sending_since: float | None = None
        self._closed = False
        self._lost_lock = threading.Lock()
        self._lost_reason: str | None = None
        self._sender = threading.Thread(
            target=self._send_loop, daemon=True, name=f"chandy sender slot {info.slot_index}"
        )
        self._sender.start()

    def send(self, message: Any) -> bool:
        """Queue ``message`` for the slot; False if the slot is gone (never blocks)."""
        if self._closed or self.connection.closed:
            return False
        try:
            self._outbox.put_nowait(message)
        except queue.Full:
            self._lost(f"{self._capacity} control messages are waiting: the slot stopped reading")
            return False
        return True

    def stalled_for(self, now: float) -> float:
        """How long the message being sent has been stuck in the socket (0 when idle)."""
        since = self._sending_since
        return 0.0 if since is None else now - since

    def _send_loop(self) -> None:
        while True:
            message = self._outbox.get()
            if message is _STOP_SENDING:
                return
            self._sending_since = time.monotonic()
            try:
                self.connection.send_message(message)
            except OSError as exc:
                if not self._closed:
                    self._lost(f"sending failed ({exc})")
                return
            finally:
                self._sending_since = None

    def _lost(self, reason: str) -> None:
        """Declare the slot lost, once, for the first reason. Closing the connection makes a
        send blocked on it fail: that failure is a consequence, not a second loss (it used to
        race the first reason to ``on_lost`` and could win)."""
        with self._lost_lock:
            if self._lost_reason is not None:
                return
            self._lost_reason = reason
        self.connection.close()  # the slot process sees its driver go, and is replaced
        self._on_lost(self, reason)

    def close(self) -> None:
        """Close the connection and join the sender (any thread but the sender's own)."""
        self._closed = True
        self.connection.close()  # unblocks a sendall to a slot that stopped reading
        try:
            self._outbox.put_nowait(_STOP_SENDING)
        except queue.Full:
            pass  # the sender fails on the closed socket and returns
        if threading.current_thread() is not self._sender:
            self._sender.join(5)
        self.collect_queue.put(None)

    def flush_and_close(self, timeout_s: float) -> None:
        """Let the sender write what is queued (a Shutdown), then close."""
        try:
            self._outbox.put(_STOP_SENDING, timeout=timeout_s)
            self._sender.join(timeout_s)
        except queue.Full:
            pass
        self.close()


class SlotPool:
    """One barrier stage of ``size`` Spark tasks, each supervising one slot process.

    The pool outlives its slot processes: when one dies, its supervisor forks the next
    incarnation, which registers here again, and the pool is whole once more. The pool
    dies with the stage (a supervisor or an executor was lost, or the stage was
    cancelled). Its state changes under ``_lock``, whichever thread makes them.
    """

    def __init__(
        self, executor: SparkExecutor, session: Any, size: int, bootstrap: SlotBootstrap, job_name: str
    ) -> None:
        self.executor = executor
        self.session = session
        self.size = size
        self.group = bootstrap.pool_id
        self.slots: dict[int, SlotConnection] = {}
        self.alive = True
        self._stopping = False
        self.failure: str | None = None
        self._lock = threading.Condition()
        self._bootstrap = bootstrap
        #: The data address each slot's supervisor sent (:meth:`gather`), by slot index.
        self._addresses: dict[int, str] = {}
        self._thread = threading.Thread(
            target=self._run_stage, args=(job_name,), daemon=True, name=f"chandy spark stage {self.group}"
        )

    def start(self) -> SlotPool:
        """Submit the stage (from a thread of its own, which waits in ``collect()``)."""
        self._thread.start()
        return self

    def _run_stage(self, job_name: str) -> None:
        sc = self.session.sparkContext
        bootstrap = self._bootstrap
        # The Spark UI lists the stage under this description: a Spark user finds the job there.
        description = job_description(job_name, bootstrap.job_id, self.executor.dashboard_url)
        sc.setJobGroup(self.group, description, interruptOnCancel=True)
        try:
            sc.parallelize(range(self.size), self.size).barrier().mapPartitions(
                lambda _: run_slot(bootstrap)
            ).collect()
            reason = "the slot stage ended"
        except Exception as exc:  # noqa: BLE001 - any stage failure means lost slots
            reason = _first_line(exc)
        self.fail(reason)

    def fail(self, reason: str) -> None:
        """The pool cannot be used any more: every live slot in it is lost."""
        with self._lock:
            if not self.alive:
                return
            self.alive = False
            self.failure = reason
            self._lock.notify_all()
            slots = list(self.slots.values())
        if self._stopping:
            return  # an orderly end: nothing was lost
        for slot in slots:
            # keep the connection: kill() tells the process to stop, which frees its task slot
            self.executor._slot_lost(self, slot, reason, disconnect=False)

    def gather(self, message: GatherAddresses) -> dict[int, str] | None:
        """Record a supervisor's data address and wait until every slot's is known: all of
        them, by slot index, or ``None`` if the pool ends first (or the message is not for
        it). Spark starts a barrier stage's tasks together, and fails the stage (and so the
        pool) if one of them cannot start."""
        with self._lock:
            if message.pool_id != self.group or not 0 <= message.slot_index < self.size:
                return None
            self._addresses[message.slot_index] = message.data_address
            self._lock.notify_all()
            self._lock.wait_for(lambda: len(self._addresses) == self.size or not self.alive or self._stopping)
            if not self.alive or self._stopping:
                return None
            return dict(self._addresses)

    def register(self, slot: SlotConnection) -> tuple[bool, SlotConnection | None]:
        """Make ``slot`` the current process of its index: whether it was accepted, and
        the process it replaces (which must be dead: its successor is here)."""
        info = slot.info
        with self._lock:
            old = self.slots.get(info.slot_index)
            if (
                not self.alive
                or self._stopping
                or info.pool_id != self.group
                or not 0 <= info.slot_index < self.size
                or (old is not None and old.info.incarnation >= info.incarnation)
            ):
                return False, None
            self.slots[info.slot_index] = slot
            self._lock.notify_all()
        return True, old

    def mark_lost(self, slot: SlotConnection) -> bool:
        """Record that ``slot`` died; False if that was known already."""
        with self._lock:
            if not slot.alive:
                return False
            slot.alive = False
            self._lock.notify_all()
            return True

    def current(self) -> dict[int, SlotConnection]:
        """The current process of every registered slot index (a copy)."""
        with self._lock:
            return dict(self.slots)

    def wait_registered(self, timeout_s: float) -> dict[int, SlotConnection]:
        """Wait until every slot index has a live process; those processes.

        Raises :class:`JobExecutionError` if the stage failed or the slots did not come
        in time."""

        def whole() -> bool:
            return len(self.slots) >= self.size and all(s.alive for s in self.slots.values())

        with self._lock:
            done = self._lock.wait_for(lambda: whole() or not self.alive, timeout_s)
            if not self.alive:
                raise JobExecutionError(
                    f"the Spark stage for the job's {self.size} slots failed: {self.failure}"
                )
            if not done:
                live = sum(s.alive for s in self.slots.values())
                raise JobExecutionError(f"only {live} of {self.size} slots were up within {timeout_s:.0f} s")
            return dict(self.slots)

    def stop(self, timeout_s: float = 15.0) -> None:
        """Tell live slots to stop; kill the stage if they do not end in time."""
        with self._lock:
            self._stopping = True
            slots = list(self.slots.values())
        for slot in slots:
            slot.send(Shutdown("the job ended"))
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.session.sparkContext.cancelJobGroup(self.group)
            self._thread.join(timeout_s)
        self.fail("stopped")
        for slot in slots:
            slot.close()

    def kill(self) -> None:
        """Cancel the stage at once (Spark kills the supervisors, their children die with them).

        The slot processes still alive are told to stop first: their supervisors then
        return and free their task slots for the next stage at once, where Spark would
        wait ``spark.python.task.killTimeout`` before killing them."""
        with self._lock:
            self._stopping = True
            slots = list(self.slots.values())
        self.fail("cancelled")
        for slot in slots:
            slot.send(Shutdown("the stage is being replaced"))
        for slot in slots:
            slot.flush_and_close(0.5)
        self.session.sparkContext.cancelJobGroup(self.group)
        self._thread.join(60)
        for slot in slots:
            slot.close()


class SparkDeployment(Deployment):
    """One generation of tasks in the slot processes of a pool."""

    def __init__(
        self,
        executor: SparkExecutor,
        pool: SlotPool,
        generation: int,
        attempts: dict[ExecutionAttemptID, int],
        connections: dict[int, SlotConnection],
    ) -> None:
        self.executor = executor
        self.pool = pool
        self.generation = generation
        self.attempts = attempts  # attempt -> slot
        #: The slot processes this generation was deployed to: its tasks live and die with them.
        self.connections = connections
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

    def _send(self, index: int, message: Any) -> bool:
        slot = self.connections.get(index)
        return slot is not None and slot.alive and slot.send(message)

    def cancel(self) -> None:
        for index in set(self.attempts.values()):
            self._send(index, CancelTasks(self.generation))

    def wait_stopped(self, timeout_s: float) -> bool:
        with self._stopped:
            return self._stopped.wait_for(lambda: self._terminal >= set(self.attempts), timeout_s)

    def trigger_checkpoint(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int, options: CheckpointOptions
    ) -> bool:
        slot = self.attempts.get(attempt_id)
        return slot is not None and self._send(
            slot, TriggerCheckpoint(attempt_id, checkpoint_id, timestamp, options)
        )

    def notify_checkpoint_complete(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        slot = self.attempts.get(attempt_id)
        if slot is not None:
            self._send(slot, NotifyCheckpoint(attempt_id, checkpoint_id, True))

    def notify_checkpoint_aborted(
        self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp: int
    ) -> None:
        slot = self.attempts.get(attempt_id)
        if slot is not None:
            self._send(slot, NotifyCheckpoint(attempt_id, checkpoint_id, False))


class SparkExecutor(Executor):
    """Runs a job's tasks in long-running Spark barrier tasks (one per slot).

    Threads: the control server's acceptor (an :class:`AuthenticatingAcceptor`, with its
    handshake threads) and the heartbeat watcher belong to the executor (joined by
    :meth:`close`); each slot process's connection has a reader
    (``_serve_slot``, also the executor's), which owns that connection's sender and
    results threads and joins them when the connection ends. Finished threads are
    joined and dropped whenever a new one starts, so the list stays as long as the
    live slots make it, however many times they are replaced.
    """

    def __init__(self, config: Configuration, dashboard_url: str | None = None) -> None:
        """``dashboard_url``: where the driver serves the dashboard (``None``: it does not);
        the slot stage's Spark job description names it."""
        self.config = config
        self.dashboard_url = dashboard_url
        self.secret = new_secret()
        self.session: Any = None
        self._pool: SlotPool | None = None
        self._deployment: SparkDeployment | None = None
        self._listener: TaskStateListener | None = None
        self._services: TaskServices | None = None
        self._generation = 0
        self._closed = False
        #: Set with ``_closed``: wakes the heartbeat watch, so that close() does not wait out its pause.
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self._acceptor: AuthenticatingAcceptor | None = None
        self._threads: list[threading.Thread] = []
        #: On a cluster: keeps the Python daemon of spare executors started (spares.py).
        self._warmer: SpareExecutorWarmer | None = None

    # -- setup ------------------------------------------------------------------

    def _ensure_session_and_server(self, slots: int, job_name: str = "chandy") -> None:
        if self.session is None:
            spark_conf = {k: str(v) for k, v in self.config.to_dict().items() if k.startswith("spark.")}
            self.session = spark_session.get_or_create_session(slots, spark_conf, job_name)
        elif getattr(self.session.sparkContext, "_jsc", True) is None:
            # Stopped under the running job: each restart would fail to deploy the same way.
            raise UnrecoverableError(
                "the Spark session this job runs on was stopped (SparkSession.stop(), or its "
                "SparkContext ended) while the job was running, so its tasks cannot be deployed "
                "again; stop the session only after the job ended, and submit the job again"
            )
        if self._server is None:
            host = self.session.sparkContext.getConf().get("spark.driver.host", "127.0.0.1")
            self._server = socket.create_server((host, 0))
            self.driver_address = f"{host}:{self._server.getsockname()[1]}"
            self._acceptor = AuthenticatingAcceptor(
                self._server, self.secret, "control", self._accepted
            ).start()
            self._start(self._watch_heartbeats, "chandy heartbeat watch")
            if not spark_session.is_single_host(self.session.sparkContext.master):
                self._warmer = SpareExecutorWarmer(self.session).start()

    def _start(self, target: Callable[..., None], name: str, *args: Any) -> None:
        """Start a thread the executor owns; finished ones are joined and dropped."""
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            # Started under the lock: slots' connections are handed on from several
            # handshake threads at once, and a thread not yet started is not alive, so
            # another call would take it for finished and join it before it started.
            finished = [t for t in self._threads if not t.is_alive()]
            self._threads = [t for t in self._threads if t.is_alive()]
            thread.start()
            self._threads.append(thread)
        for old in finished:
            old.join()

    def prepare(self, slots: int, checkpoint_dir: str | None, job_name: str = "") -> None:
        """Refuse, in seconds and with a clear message, a job this cluster cannot run."""
        self._ensure_session_and_server(slots, job_name or "chandy")
        wait = self.config.get(SparkOptions.SLOT_WAIT)
        available = spark_session.wait_for_slots(self.session, slots, wait / 1000)
        if available < slots:
            master = self.session.sparkContext.master
            if spark_session.is_single_host(master):
                how = (
                    f"A local session's slots are its cores, fixed when the first job of this process "
                    f"started it: start it with more (spark.master 'local[{slots}]' in the job's "
                    f"configuration, or spark-submit --master 'local[{slots}]'), run this job in a new "
                    "process, or lower the parallelism."
                )
            else:
                how = "Lower the parallelism, or give Spark more executors or cores."
            raise ConfigurationError(
                f"the job needs {slots} slots (its highest parallelism) but the Spark cluster "
                f"({master}) has {available} task slots. {how}"
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
        pool, connections = self._whole_pool(graph.job_id, graph.job_name, slots, services)
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
        deployment = SparkDeployment(self, pool, self._generation, attempts, connections)
        self._deployment = deployment
        for index, tasks in by_slot.items():
            slot = connections[index]
            if not slot.send(DeployTasks(self._generation, tuple(tasks), capacity)):
                self._slot_lost(pool, slot, "the slot was gone when tasks were deployed")
        for slot in connections.values():
            if not slot.alive:  # lost before the deployment was published: its tasks too
                self._fail_tasks_of(deployment, slot, "lost while the tasks were deployed")
        return deployment

    def _whole_pool(
        self, job_id: str, job_name: str, slots: int, services: TaskServices
    ) -> tuple[SlotPool, dict[int, SlotConnection]]:
        """A pool with a live process in every slot: the current one, once its replaced
        processes registered again, or else a new stage."""
        pool = self._pool
        if pool is not None and pool.alive and pool.size == slots:
            timeout = self.config.get(SparkOptions.HEARTBEAT_TIMEOUT) / 1000
            try:
                return pool, pool.wait_registered(timeout)
            except JobExecutionError as exc:  # the stage failed meanwhile, or a slot did not return
                log.warning("The slots of job %s are not whole again (%s); starting new ones.", job_id, exc)
        if pool is not None:
            pool.kill()
        started = time.monotonic()
        # A barrier stage submitted with too few task slots fails at once: after a lost
        # executor, wait (chandy.spark.slot-wait) for the cluster to replace it.
        wait = self.config.get(SparkOptions.SLOT_WAIT) / 1000
        available = spark_session.wait_for_slots(self.session, slots, wait)
        if available < slots:
            raise JobExecutionError(
                f"the Spark cluster has {available} task slots, not the {slots} the job needs, "
                f"{wait:.0f} s after its slots were lost (chandy.spark.slot-wait)"
            )
        bootstrap = SlotBootstrap(
            job_id,
            slots,
            self.driver_address,
            self.secret,
            services.checkpoint_storage,
            pool_id=f"chandy-{job_id}-{next(_pool_ids)}",
        )
        # the stage is submitted once the pool is the executor's: its supervisors ask for it at once
        pool = self._pool = SlotPool(self, self.session, slots, bootstrap, job_name)
        pool.start()
        connections = pool.wait_registered(self.config.get(SparkOptions.SLOT_WAIT) / 1000 + 120)
        log.info("%d slots of job %s are up (%.1f s).", slots, job_id, time.monotonic() - started)
        return pool, connections

    # -- control connections ------------------------------------------------------

    def _accepted(self, connection: FramedSocket, peer: Any) -> None:
        """A connection passed the handshake (on the acceptor's handshake thread)."""
        self._start(self._serve_slot, f"chandy control {peer[0]}:{peer[1]}", connection)

    def _serve_slot(self, connection: FramedSocket) -> None:
        """Read one slot process's messages until its connection ends; then close it and
        join the threads that served it."""
        try:
            info = connection.recv_message()
        except (OSError, ConnectionError, EOFError):
            connection.close()
            return
        pool = self._pool
        if isinstance(info, GatherAddresses):  # a supervisor, before it forks its slot process
            addresses = pool.gather(info) if pool is not None else None
            try:
                if addresses is not None:
                    connection.send_message(AddressesGathered(addresses))
            except OSError:
                pass  # the supervisor is gone: its task, and so the stage, failed
            finally:
                connection.close()
            return
        if not isinstance(info, RegisterSlot):
            connection.close()
            return

        def lost(connection: SlotConnection, reason: str) -> None:
            if pool is not None:
                self._slot_lost(pool, connection, reason)

        slot = SlotConnection(info, connection, lost)
        accepted, replaced = pool.register(slot) if pool is not None else (False, None)
        if not accepted or pool is None:  # told to stop: its supervisor must not fork another
            log.info(
                "Refused slot %d (pid %d, incarnation %d): not a slot of the current stage.",
                info.slot_index,
                info.pid,
                info.incarnation,
            )
            slot.send(Shutdown("not a slot of the job's current stage"))
            slot.flush_and_close(5)
            return
        if replaced is not None:  # its successor is here, so it is dead whatever we heard
            self._slot_lost(pool, replaced, f"replaced by incarnation {info.incarnation}")
        if info.incarnation:
            log.info(
                "Slot %d is back: pid %d (incarnation %d) on %s.",
                info.slot_index,
                info.pid,
                info.incarnation,
                info.host,
            )
        publisher = threading.Thread(
            target=self._publish_results,
            args=(pool, slot),
            daemon=True,
            name=f"chandy results slot {info.slot_index}",
        )
        publisher.start()
        try:
            while True:
                self._dispatch(pool, slot, connection.recv_message())
        except (OSError, ConnectionError, EOFError) as exc:
            if not self._closed:
                self._slot_lost(pool, slot, f"connection lost ({exc or 'closed'})")
        finally:
            slot.close()
            publisher.join(30)
            if publisher.is_alive():
                log.warning("the results of slot %d are still being handed over", info.slot_index)

    def _dispatch(self, pool: SlotPool, slot: SlotConnection, message: Any) -> None:
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
        elif isinstance(message, MetricsReport):
            metrics = self._services.metrics if self._services else None
            if metrics is not None:
                metrics.report_metrics(message)
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

    def _publish_results(self, pool: SlotPool, slot: SlotConnection) -> None:
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
                        lambda: not slot.alive or not pool.alive or self._closed,
                    )
                    accepted = True
                except Exception:  # noqa: BLE001 - the client went away or the job is ending
                    accepted = False
            slot.send(ResultsAccepted(message.sequence, accepted))

    def _watch_heartbeats(self) -> None:
        """A slot process that is silent, or does not take what is sent to it, for the
        heartbeat timeout is hung: only cancelling its stage ends it."""
        timeout = self.config.get(SparkOptions.HEARTBEAT_TIMEOUT) / 1000
        while not self._closing.wait(1.0):
            pool = self._pool
            if pool is None or not pool.alive:
                continue
            now = time.monotonic()
            for index, slot in pool.current().items():
                if not slot.alive:
                    continue
                if now - slot.last_seen > timeout:
                    pool.fail(f"slot {index} (pid {slot.info.pid}) sent no heartbeat for {timeout:.0f} s")
                elif slot.stalled_for(now) > timeout:
                    pool.fail(
                        f"slot {index} (pid {slot.info.pid}) took nothing sent to it for {timeout:.0f} s"
                    )

    def _slot_lost(self, pool: SlotPool, slot: SlotConnection, reason: str, disconnect: bool = True) -> None:
        """A slot process is gone: the tasks it ran failed (any thread). Unless it is dead
        already, closing its connection makes it end, and its supervisor fork a new one."""
        if not pool.mark_lost(slot):
            return
        info = slot.info
        log.warning(
            "Slot %d (pid %d on %s, incarnation %d) is lost: %s",
            info.slot_index,
            info.pid,
            info.host,
            info.incarnation,
            reason,
        )
        if disconnect:
            slot.connection.close()
        deployment = self._deployment
        if deployment is not None and deployment.pool is pool:
            self._fail_tasks_of(deployment, slot, reason)

    def _fail_tasks_of(self, deployment: SparkDeployment, slot: SlotConnection, reason: str) -> None:
        index = slot.info.slot_index
        listener = self._listener
        if listener is None or deployment.connections.get(index) is not slot:
            return
        error = SlotLostError(f"slot {index} (pid {slot.info.pid} on {slot.info.host}) was lost: {reason}")
        failure = TaskFailure(error, type(error).__name__, str(error), str(error), None)
        for attempt_id, attempt_slot in deployment.attempts.items():
            if attempt_slot == index and deployment.mark_terminal(attempt_id):
                listener.notify_task_state(attempt_id, ExecutionState.FAILED, failure)

    # -- introspection and shutdown ------------------------------------------------

    def slots(self) -> list[dict[str, Any]]:
        """The current slot processes: index, host, the pid that runs the tasks, the
        supervising Spark task's pid, the executor JVM's pid, incarnation, data address."""
        pool = self._pool
        if pool is None:
            return []
        return [
            {
                "index": i,
                "host": s.info.host,
                "pid": s.info.pid,
                "supervisor_pid": s.info.supervisor_pid,
                "jvm_pid": s.info.jvm_pid,
                "incarnation": s.info.incarnation,
                "data_address": s.info.data_address,
                "alive": s.alive,
            }
            for i, s in sorted(pool.current().items())
        ]

    def end_process(self) -> None:
        """Stop the Spark session: the process exits next, and a SparkContext left running
        would have its JVM and Python workers report, after the driver is gone, connections
        refused and tasks lost that this exit caused."""
        session = self.session
        if session is not None:
            try:
                session.stop()
            except Exception:  # the process ends anyway
                log.debug("Stopping the Spark session at exit failed.", exc_info=True)

    def close(self) -> None:
        """Stop the slots (Spark kills what does not stop), the server and its threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._closing.set()
        if self._warmer is not None:
            self._warmer.close()
        if self._pool is not None:
            self._pool.stop()
        if self._acceptor is not None:
            self._acceptor.close()  # joined: no connection is handed on after this
        if self._server is not None:
            close_listener(self._server)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
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


def job_description(job_name: str, job_id: str, dashboard_url: str | None) -> str:
    """The slot stage's Spark job description: the chandy job, and where its dashboard is."""
    text = f"chandy job '{job_name}' ({job_id})"
    if dashboard_url:
        text += f", dashboard {dashboard_url.rstrip('/')}/#/jobs/{job_id}"
    return text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
