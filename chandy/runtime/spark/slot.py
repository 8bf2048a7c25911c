"""The slot: what runs inside one Spark barrier task for the whole life of a job.

``run_slot`` is the body of the barrier stage's ``mapPartitions``. It binds the
slot's data port and learns every other slot's address once, gathered by the
driver (:func:`_gather_addresses`); then it becomes the slot's supervisor (:class:`SlotSupervisor`)
and runs the slot itself in a forked child process, forking the next one
whenever a child dies. The child connects to the driver's control server and to
the other slots (all with the job's secret) and then serves: it deploys the
tasks the driver sends, forwards their state changes, checkpoint
acknowledgements, collected results and log records, and cancels them when
told. A task failure is handled by the driver deploying a new generation of
tasks into the same slots; a dead slot process by the driver deploying into
its successor; only a lost supervisor or executor makes the driver resubmit
the stage.

Every thread and socket a slot process starts is joined or closed before it
exits, and the supervisor waits for its child: with Python worker reuse on,
the next Spark task in the worker starts clean.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import io
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

from chandy.config import Configuration
from chandy.config.options import MetricOptions
from chandy.errors import UnrecoverableError
from chandy.graph.execution_graph import ChannelID
from chandy.messages.checkpoint import (
    AcknowledgeCheckpoint,
    CheckpointFailureReason,
    DeclineCheckpoint,
    EndOfInputReached,
)
from chandy.messages.ids import ExecutionAttemptID
from chandy.messages.status import ExecutionState
from chandy.network.auth import AuthenticationError, authenticate_client_side
from chandy.network.cancellation import TaskCancelledError
from chandy.network.channel import ChannelClosedError, InputChannel, LocalChannel, OutputChannel
from chandy.network.framing import FramedSocket
from chandy.network.tcp import ChannelKey, DataPlane, bind_data_listener
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
from chandy.storage.checkpoint_storage import CheckpointStorage
from chandy.task.deployment import deserialize_chain
from chandy.task.metrics import MetricsReporter
from chandy.task.services import TaskFailure, TaskServices
from chandy.task.stream_task import StreamTask

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 2.0


@dataclass(frozen=True)
class SlotBootstrap:
    """What every slot needs to start; shipped in the Spark task closure."""

    job_id: str
    num_slots: int
    driver_address: str
    secret: bytes
    checkpoint_storage: CheckpointStorage | None
    #: Host to bind data ports to; ``None``: the address Spark gave this executor.
    bind_host: str | None = None
    #: The slot pool (Spark job group) these slots belong to; the driver refuses others.
    pool_id: str = ""


#: A slot process's exit status when it could not start (the supervisor fails the Spark task).
EXIT_STARTUP_FAILED = 3
#: ... when it lost the driver's connection without being told to stop (a new one is forked).
EXIT_DRIVER_LOST = 4
_REGISTERED = b"r"
#: Slot processes in a row that may die before registering before the supervisor gives up.
MAX_DEATHS_BEFORE_REGISTERING = 5


class SlotStartupError(RuntimeError):
    """A slot process could not start: the Spark task fails, and with it the stage."""


def run_slot(bootstrap: SlotBootstrap) -> list[int]:
    """The barrier task's body: supervise slot ``partitionId`` until the driver says stop.

    The Spark-facing work happens here once: the data port is bound and the slots'
    addresses gathered. The slot itself (control connection, data plane, tasks) runs in
    a child process, which :class:`SlotSupervisor` forks again whenever it dies, so a
    killed slot process costs Spark nothing and the driver a redeployment into the same
    stage instead of a new one.
    """
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    index = context.partitionId()
    host = bootstrap.bind_host or _executor_host(context, index)
    listener, address = bind_data_listener(host)
    try:
        peers = _gather_addresses(bootstrap, index, address)
        SlotSupervisor(index, bootstrap, host, listener, address, peers).run()
    finally:
        listener.close()
    return [index]


def _gather_addresses(bootstrap: SlotBootstrap, index: int, address: str) -> dict[int, str]:
    """Every slot's data address, gathered by the driver over a control connection of the
    supervisor's own, closed before it forks. Not the barrier's ``allGather``, which does the
    same through the JVM: Spark looks for its result once a second (``Thread.sleep(1000)``
    in ``BarrierTaskContext.runBarrier``), so every slot but the last to ask waited up to a
    second more, and every stage start with it."""
    control = _connect_to_driver(bootstrap)
    try:
        control.send_message(GatherAddresses(bootstrap.pool_id, index, address))
        reply = control.recv_message()
    except (OSError, ConnectionError, EOFError) as exc:
        raise SlotStartupError(
            f"slot {index}: the driver did not give the slots' addresses ({exc or 'connection closed'}): "
            "the slot stage ended before all its slots started"
        ) from exc
    finally:
        control.close()
    if not isinstance(reply, AddressesGathered):
        raise SlotStartupError(f"slot {index}: the driver answered {type(reply).__name__}, not the addresses")
    return reply.addresses


class SlotSupervisor:
    """Runs one slot in a child process and forks a new one (the next *incarnation*)
    whenever it dies; ends when a child exits because the driver told it to stop.

    The supervisor starts no thread: ``os.fork`` copies only the calling thread, so a
    fork from a process without threads gives a child whose locks are all free. It
    freezes its objects before forking, so that the child's garbage collections do not
    write to (and copy) the pages it shares with the supervisor.
    """

    def __init__(
        self,
        index: int,
        bootstrap: SlotBootstrap,
        host: str,
        listener: socket.socket,
        address: str,
        peers: dict[int, str],
    ) -> None:
        self.index = index
        self.bootstrap = bootstrap
        self.host = host
        self.listener = listener
        self.address = address
        self.peers = peers
        self.pid = os.getpid()
        self.jvm_pid = _jvm_pid()

    def run(self) -> None:
        if threading.active_count() > 1:
            log.warning(
                "slot %d: the Spark worker runs %d threads; forking slot processes from it is unsafe",
                self.index,
                threading.active_count(),
            )
        incarnation = 0
        unregistered = 0  # children in a row that died before they registered
        try:
            while True:
                pid, status, registered, report = self._run_child(incarnation)
                if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                    return  # told to stop
                if os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_STARTUP_FAILED:
                    raise SlotStartupError(
                        f"slot {self.index} could not start: {report.decode(errors='replace')}"
                    )
                unregistered = 0 if registered else unregistered + 1
                if unregistered >= MAX_DEATHS_BEFORE_REGISTERING:
                    raise SlotStartupError(
                        f"slot {self.index}: {unregistered} processes in a row died before they "
                        f"registered with the driver (the last: {_describe(status)})"
                    )
                log.warning(
                    "slot %d: process %d (incarnation %d) ended by %s; starting incarnation %d",
                    self.index,
                    pid,
                    incarnation,
                    _describe(status),
                    incarnation + 1,
                )
                incarnation += 1
        finally:
            gc.unfreeze()  # a reused Python worker's next task collects them again

    def _run_child(self, incarnation: int) -> tuple[int, int, bool, bytes]:
        """Fork incarnation ``incarnation``, wait for it to end: its pid, its status, whether
        it registered, and why it could not start (if it could not)."""
        report_read, report_write = os.pipe()
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            os.close(report_read)
            _run_slot_process(self, incarnation, report_write)  # never returns
        os.close(report_write)
        try:
            _, status = _wait_for(pid)
            with os.fdopen(report_read, "rb") as report:
                text = report.read()
        except BaseException:
            _kill_quietly(pid)  # the Spark task is interrupted: the child goes with it
            raise
        registered = text.startswith(_REGISTERED)
        return pid, status, registered, text[1:] if registered else text


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"


def _wait_for(pid: int) -> tuple[int, int]:
    while True:
        try:
            return os.waitpid(pid, 0)
        except InterruptedError:
            continue


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass


def _die_with_parent(parent_pid: int) -> None:
    """Make the kernel SIGKILL this process when its supervisor dies (Linux), so a killed
    Spark task or executor never leaves a slot process behind; elsewhere, a thread
    watches for the supervisor to go."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        prctl = None
    if prctl is not None and prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
        if os.getppid() != parent_pid:  # it died before the call took effect
            os._exit(EXIT_DRIVER_LOST)
        return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.2)
        os._exit(EXIT_DRIVER_LOST)

    threading.Thread(target=watch, name="chandy supervisor watch", daemon=True).start()


_PR_SET_PDEATHSIG = 1


def _run_slot_process(supervisor: SlotSupervisor, incarnation: int, report_fd: int) -> NoReturn:
    """The body of a forked slot process. It never returns into the Spark worker's code:
    ``os._exit`` also keeps it from flushing the worker's buffers to the JVM socket."""
    code = EXIT_STARTUP_FAILED
    report = os.fdopen(report_fd, "wb", buffering=0)
    try:
        _die_with_parent(supervisor.pid)
        code = _serve_slot_process(supervisor, incarnation, report)
    except BaseException as exc:  # it could not start: tell the supervisor why, then exit
        try:
            report.write(f"{type(exc).__name__}: {exc}".encode())
        except OSError:
            pass
        log.exception("slot %d (incarnation %d) could not start", supervisor.index, incarnation)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve_slot_process(supervisor: SlotSupervisor, incarnation: int, report: Any) -> int:
    """Connect, register and serve; the exit status (0: the driver said stop)."""
    bootstrap = supervisor.bootstrap
    data = DataPlane(
        supervisor.index,
        bootstrap.secret,
        supervisor.listener,
        supervisor.address,
        supervisor.peers,
        incarnation,
    )
    runtime: SlotRuntime | None = None
    try:
        data.connect_to_peers()
        control = _connect_to_driver(bootstrap)
        runtime = SlotRuntime(supervisor.index, bootstrap, control, data)
        control.send_message(
            RegisterSlot(
                supervisor.index,
                supervisor.address,
                supervisor.host,
                os.getpid(),
                supervisor.jvm_pid,
                supervisor_pid=supervisor.pid,
                incarnation=incarnation,
                pool_id=bootstrap.pool_id,
            )
        )
        report.write(_REGISTERED)
    except BaseException:
        _close_quietly(runtime, data)
        raise
    # Registered: from here on a failure is one of this incarnation, not of the slot's start.
    assert runtime is not None
    try:
        told_to_stop = runtime.serve()
    except Exception:
        log.exception("slot %d (incarnation %d) failed", supervisor.index, incarnation)
        told_to_stop = False
    _close_quietly(runtime, data)
    return 0 if told_to_stop else EXIT_DRIVER_LOST


def _close_quietly(runtime: SlotRuntime | None, data: DataPlane) -> None:
    try:
        if runtime is not None:
            runtime.close()
    except Exception:
        log.exception("slot %d did not close cleanly", data.slot_index)
    finally:
        data.close()


def _executor_host(context: Any, index: int) -> str:
    if os.environ.get("SPARK_LOCAL_IP"):
        return os.environ["SPARK_LOCAL_IP"]
    try:
        address = context.getTaskInfos()[index].address
        return address.rsplit(":", 1)[0] or "127.0.0.1"
    except Exception:  # noqa: BLE001 - fall back to loopback (local mode)
        return "127.0.0.1"


def _jvm_pid() -> int | None:
    """The nearest ancestor process that is a JVM (the Spark executor running us)."""
    pid = os.getppid()
    for _ in range(6):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "java":
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None


def _connect_to_driver(bootstrap: SlotBootstrap) -> FramedSocket:
    host, port = bootstrap.driver_address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.settimeout(None)
    try:
        authenticate_client_side(sock, bootstrap.secret)
    except AuthenticationError:
        sock.close()
        raise
    return FramedSocket(sock)


class _LogForwarder(logging.Handler):
    """Sends this slot's log records to the driver, which logs them with the slot's index."""

    def __init__(self, runtime: SlotRuntime) -> None:
        super().__init__(logging.INFO)
        self._runtime = runtime
        self._local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._local, "busy", False):
            return  # never forward what forwarding itself logs
        self._local.busy = True
        try:
            exc_text = (
                self.formatter.formatException(record.exc_info)
                if (record.exc_info and self.formatter)
                else (logging.Formatter().formatException(record.exc_info) if record.exc_info else None)
            )
            self._runtime.send(
                ForwardedLogRecord(
                    self._runtime.index,
                    self._runtime.generation,
                    record.name,
                    record.levelno,
                    record.getMessage(),
                    record.created,
                    exc_text,
                )
            )
        except Exception:  # noqa: BLE001 - logging must never break the slot
            pass
        finally:
            self._local.busy = False


class _ForwardingStream(io.TextIOBase):
    """Replaces ``sys.stdout``/``sys.stderr`` in a slot: whole lines go to the driver's console.

    A Spark Python worker's own output goes to executor logs nobody reads while
    developing; ``print()`` in a function (and ``ds.print()``) should show where the
    job was started, as on the local executor.
    """

    def __init__(self, runtime: SlotRuntime, name: str) -> None:
        self._runtime = runtime
        self._name = name
        self._pending: list[str] = []
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._pending.append(text)
            if "\n" not in text:
                return len(text)
            joined = "".join(self._pending)
            head, _, tail = joined.rpartition("\n")
            self._pending = [tail] if tail else []
        self._send(head + "\n")
        return len(text)

    def flush(self) -> None:
        with self._lock:
            joined, self._pending = "".join(self._pending), []
        if joined:
            self._send(joined)

    def _send(self, text: str) -> None:
        try:
            self._runtime.send(PrintedOutput(self._runtime.index, self._name, text))
        except OSError:
            pass


class SlotRuntime:
    """Hosts the tasks of successive deployments in one slot process."""

    def __init__(self, index: int, bootstrap: SlotBootstrap, control: FramedSocket, data: DataPlane) -> None:
        self.index = index
        self.bootstrap = bootstrap
        self.control = control
        self.data = data
        self._tasks: dict[ExecutionAttemptID, tuple[StreamTask, threading.Thread, int]] = {}
        self._local_channels: dict[tuple[int, ChannelID], LocalChannel] = {}
        self._results: dict[int, tuple[threading.Event, list[bool]]] = {}
        self._sequence = 0
        self.generation = 0  # of the latest deployment
        self._lock = threading.Lock()
        self._reapers: list[threading.Thread] = []
        self._closed = threading.Event()
        self._async = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"chandy-slot{index}-async")
        self.services = TaskServices(
            results=self,
            checkpoint_responder=self,
            checkpoint_storage=bootstrap.checkpoint_storage,
            async_executor=self._async,
        )
        self._heartbeat = threading.Thread(
            target=self._send_heartbeats, name=f"chandy slot {index} heartbeat", daemon=True
        )
        self._heartbeat.start()
        #: Sends the tasks' metrics to the driver (started with the first deployment, which
        #: carries the job's report interval).
        self._metrics: MetricsReporter | None = None
        self._log_handler = _LogForwarder(self)
        chandy_logger = logging.getLogger("chandy")
        if chandy_logger.getEffectiveLevel() > logging.INFO:
            chandy_logger.setLevel(logging.INFO)
        logging.getLogger().addHandler(self._log_handler)
        self.data.on_peer_lost = self._peer_lost
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = _ForwardingStream(self, "stdout")
        sys.stderr = _ForwardingStream(self, "stderr")

    # -- the control loop -----------------------------------------------------

    def send(self, message: Any) -> None:
        self.control.send_message(message)

    def serve(self) -> bool:
        """Handle the driver's messages until it says stop (True) or goes away (False)."""
        while not self._closed.is_set():
            try:
                message = self.control.recv_message()
            except (OSError, ConnectionError, EOFError, pickle.UnpicklingError):
                log.warning("slot %d lost its connection to the driver; stopping", self.index)
                return False
            if isinstance(message, Shutdown):
                return True
            self._handle(message)
        return True

    def _handle(self, message: Any) -> None:
        if isinstance(message, DeployTasks):
            self._deploy(message)
        elif isinstance(message, CancelTasks):
            self._cancel_generation(message.generation)
        elif isinstance(message, TriggerCheckpoint):
            entry = self._tasks.get(message.attempt_id)
            if entry is None:
                self._decline_unknown_trigger(message)
            else:
                entry[0].trigger_checkpoint_async(message.checkpoint_id, message.timestamp, message.options)
        elif isinstance(message, NotifyCheckpoint):
            entry = self._tasks.get(message.attempt_id)
            if entry is not None:
                if message.completed:
                    entry[0].notify_checkpoint_complete_async(message.checkpoint_id)
                else:
                    entry[0].notify_checkpoint_aborted_async(message.checkpoint_id)
        elif isinstance(message, ResultsAccepted):
            with self._lock:
                waiting = self._results.pop(message.sequence, None)
            if waiting is not None:
                waiting[1].append(message.accepted)
                waiting[0].set()
        else:
            log.warning("slot %d ignored an unknown message %r", self.index, message)

    def _decline_unknown_trigger(self, message: TriggerCheckpoint) -> None:
        """A trigger for a task this slot process does not run: decline it at once.

        It happens when the trigger crossed a redeployment, or a slot process was replaced
        after the driver sent it. Dropping it would leave the checkpoint pending until its
        timeout (10 minutes by default), blocking every checkpoint behind it; Flink answers
        such a trigger with a task checkpoint failure, and so does the slot.
        """
        log.info(
            "slot %d runs no task %s; declining checkpoint %d",
            self.index,
            message.attempt_id,
            message.checkpoint_id,
        )
        self.decline_checkpoint(
            DeclineCheckpoint(
                self.bootstrap.job_id,
                message.attempt_id,
                message.checkpoint_id,
                CheckpointFailureReason.TASK_CHECKPOINT_FAILURE,
                f"slot {self.index} runs no task {message.attempt_id} (not deployed there, or its "
                "slot process was replaced)",
            )
        )

    # -- deployment -----------------------------------------------------------

    def _channel(self, generation: int, cid: ChannelID, capacity: int) -> LocalChannel:
        key = (generation, cid)
        channel = self._local_channels.get(key)
        if channel is None:
            channel = self._local_channels[key] = LocalChannel(capacity, name=str(cid))
        return channel

    def _deploy(self, message: DeployTasks) -> None:
        generation, capacity = message.generation, message.channel_capacity
        self.generation = generation
        starting: list[threading.Thread] = []
        for task in message.tasks:
            try:
                operators = deserialize_chain(task.chain, task.tdd.task_name)
            except UnrecoverableError as exc:
                log.error("slot %d cannot start %s: %s", self.index, task.tdd.name_with_subtask, exc)
                self.notify_task_state(task.tdd.attempt_id, ExecutionState.FAILED, TaskFailure.of(exc, None))
                continue
            try:
                inputs, outputs = self._channels_of(task, generation, capacity)
            except ChannelClosedError as exc:  # a peer's process is being replaced: fail over again
                log.warning("slot %d cannot start %s: %s", self.index, task.tdd.name_with_subtask, exc)
                self.notify_task_state(task.tdd.attempt_id, ExecutionState.FAILED, TaskFailure.of(exc, None))
                continue
            tdd = dataclasses.replace(task.tdd, operators=operators)
            stream_task = StreamTask(tdd, inputs, outputs, self.services, self)
            self._metrics_reporter(tdd.job_id, tdd.config).register(stream_task.metrics)
            thread = threading.Thread(
                target=stream_task.invoke, daemon=True, name=f"chandy {task.tdd.name_with_subtask}"
            )
            self._tasks[task.tdd.attempt_id] = (stream_task, thread, generation)
            starting.append(thread)
        # What the slot holds now (PySpark, chandy, the job's modules and functions) lives
        # as long as it does. A full collection walks every tracked object and stops every
        # task meanwhile: 5-18 ms for a slot's ~38,000 objects, a latency spike a record
        # can wait behind. Frozen objects are left out of collections (refcounting still
        # frees them), so a full collection walks only what the tasks make from here on.
        gc.freeze()
        for thread in starting:
            thread.start()

    def _metrics_reporter(self, job_id: str, config: Any) -> MetricsReporter:
        """The slot's metrics reporter, started on first use (the slot's own thread: ``close``
        stops and joins it); its reports travel on the control connection."""
        if self._metrics is None:
            interval = Configuration(config).get(MetricOptions.REPORT_INTERVAL) / 1000
            self._metrics = MetricsReporter(job_id, interval, self.send, f"chandy slot {self.index} metrics")
            self._metrics.start()
        return self._metrics

    def _channels_of(
        self, task: TaskToDeploy, generation: int, capacity: int
    ) -> tuple[list[InputChannel], list[list[OutputChannel]]]:
        """The task's input and output channels: in memory within the slot, TCP to others."""
        inputs: list[InputChannel] = []
        for cid in task.inputs:
            if cid.producer_subtask == self.index:
                inputs.append(self._channel(generation, cid, capacity))
            else:
                key = ChannelKey(generation, cid.edge_index, cid.producer_subtask, cid.consumer_subtask)
                inputs.append(self.data.input_channel(key, cid.producer_subtask, capacity))
        outputs: list[list[OutputChannel]] = []
        for edge in task.outputs:
            channels: list[OutputChannel] = []
            for cid in edge:
                if cid.consumer_subtask == self.index:
                    channels.append(self._channel(generation, cid, capacity))
                else:
                    key = ChannelKey(generation, cid.edge_index, cid.producer_subtask, cid.consumer_subtask)
                    channels.append(self.data.output_channel(key, cid.consumer_subtask))
            outputs.append(channels)
        return inputs, outputs

    def _cancel_generation(self, generation: int) -> None:
        for task, _, task_generation in list(self._tasks.values()):
            if task_generation == generation:
                task.cancel()
        for (channel_generation, _), channel in list(self._local_channels.items()):
            if channel_generation == generation:
                channel.close()
        self.data.release_generation(generation)
        reaper = threading.Thread(
            target=self._forget, args=(generation,), daemon=True, name=f"chandy slot {self.index} reaper"
        )
        with self._lock:  # the slot owns its reapers: finished ones are dropped, the rest joined at close
            self._reapers = [r for r in self._reapers if r.is_alive()]
            self._reapers.append(reaper)
        reaper.start()

    def _forget(self, generation: int) -> None:
        """Drop the cancelled generation's tasks and channels once its threads ended."""
        for attempt_id, (_, thread, task_generation) in list(self._tasks.items()):
            if task_generation == generation:
                thread.join(30)
                self._tasks.pop(attempt_id, None)
        for key in [k for k in self._local_channels if k[0] == generation]:
            self._local_channels.pop(key, None)

    # -- TaskStateListener, CheckpointResponder, ResultPublisher ---------------

    def notify_task_state(
        self, attempt_id: ExecutionAttemptID, state: ExecutionState, failure: TaskFailure | None = None
    ) -> None:
        if failure is not None and failure.exception is not None:
            failure = _portable(failure)
        if state.is_terminal and self._metrics is not None:
            self._metrics.task_ended(attempt_id)  # its last counts reach the driver before its end
        try:
            self.send(TaskStateChanged(attempt_id, state, failure))
        except OSError:
            pass  # the driver is gone; the slot is stopping

    def acknowledge_checkpoint(self, message: AcknowledgeCheckpoint) -> None:
        self.send(message)

    def decline_checkpoint(self, message: DeclineCheckpoint) -> None:
        self.send(message)

    def report_end_of_input(self, message: EndOfInputReached) -> None:
        self.send(message)

    def publish(
        self, collect_id: str, subtask_index: int, batch: list[Any], token: int | None, should_abort: Any
    ) -> None:
        done = threading.Event()
        outcome: list[bool] = []
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
            self._results[sequence] = (done, outcome)
        self.send(PublishResults(sequence, collect_id, subtask_index, batch, token))
        while not done.wait(0.1):
            if should_abort() or self._closed.is_set():
                raise TaskCancelledError()
        if not outcome[0]:
            raise TaskCancelledError()

    # -- liveness and shutdown -------------------------------------------------

    def _send_heartbeats(self) -> None:
        while not self._closed.wait(HEARTBEAT_INTERVAL_S):
            try:
                self.send(Heartbeat(self.index))
            except OSError:
                return

    def _peer_lost(self, slot: int, reason: str) -> None:
        # The driver hears about the lost process itself; our tasks will fail on the
        # broken channels and be redeployed once the stage is replaced.
        log.info("slot %d: connection to slot %d lost (%s)", self.index, slot, reason)

    def close(self) -> None:
        self._closed.set()
        if self._metrics is not None:
            self._metrics.stop(5)  # a send stuck on a dead driver ends when the connection closes
        gc.unfreeze()  # a reused Python worker's next task collects them again
        logging.getLogger().removeHandler(self._log_handler)
        for task, _, _ in self._tasks.values():
            task.cancel()
        for task, thread, _ in self._tasks.values():
            thread.join(10)
            if thread.is_alive():
                log.warning("%s did not stop", task.tdd.name_with_subtask)
        for channel in self._local_channels.values():
            channel.close()
        self._async.shutdown(wait=True)
        self._heartbeat.join(5)
        with self._lock:
            reapers = list(self._reapers)
        for reaper in reapers:
            reaper.join(30)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = self._streams
        self.control.close()


def _portable(failure: TaskFailure) -> TaskFailure:
    """The failure with its exception only if that survives a round trip through pickle."""
    import cloudpickle

    try:
        pickle.loads(cloudpickle.dumps(failure.exception))
        return failure
    except Exception:  # noqa: BLE001 - keep the text, drop the object
        return dataclasses.replace(failure, exception=None)
