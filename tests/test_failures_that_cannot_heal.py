"""Failures a restart cannot heal fail the job once (issue 26 §2), naming the cause and the fix.

Restored state that holds a class the job's code no longer has (a savepoint of v1 restored
with v2, where ``Acc`` was renamed): the v1 and v2 modules are written into a directory on
``sys.path`` (and, for Spark, on the slots' ``PYTHONPATH``: the session's environment, which
its Python workers inherit). Records that cannot be pickled on their way to another slot.
Every test asserts that the job failed without a restart loop, from the JobMaster's count.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import shutil
import sys
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chandy import JobExecutionError, StreamExecutionEnvironment
from chandy.core.functions import (
    CoProcessFunction,
    KeyedProcessFunction,
    MapFunction,
    ProcessFunction,
    RuntimeContext,
)
from chandy.core.state import MapStateDescriptor, ValueStateDescriptor
from chandy.errors import InvalidProgramError, NotKeyedError, UnrecoverableError, find_unrecoverable
from chandy.messages.checkpoint import CheckpointException, CheckpointFailureReason
from chandy.messages.status import JobStatus
from chandy.network.channel import LocalChannel
from chandy.network.input_gate import InputGate
from chandy.network.item_codec import (
    RecordClassNotFoundError,
    RecordNotPicklableError,
    decode_received,
    encode_item,
)
from chandy.network.wakeup import Wakeup
from chandy.state.handles import ByteStreamStateHandle, KeyGroupsStateHandle
from chandy.state.heap import HeapKeyedStateBackend
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.state.missing_classes import StateClassNotFoundError
from chandy.state.rocksdb.backend import RocksDBKeyedStateBackend
from chandy.state.rocksdb.resources import SlotMemory
from chandy.state.unpicklable import StateNotPicklableError
from chandy.state.unpickling import UnpicklingPolicy
from chandy.storage.checkpoint_storage import StateReader
from chandy.task.processing_time import ProcessingTimeService
from chandy.task.timers import InternalTimerService
from chandy.util.clock import ManualClock
from tests.jobs import Throttle
from tests.state_backends import on_rocksdb_too
from tests.test_checkpointing_e2e import checkpointing_env, latest_checkpoint_dir

#: Small batches: a barrier waits behind a few throttled records, not a thousand.
SMALL = {"chandy.network.batch-size": 20}

#: v1 of the user's module: a keyed count whose running total is an ``Acc`` in value state,
#: and a source-side counter that keeps an ``Acc`` in operator (list) state.
V1 = '''
import os

from chandy.core.functions import (
    CheckpointedFunction,
    KeyedProcessFunction,
    MapFunction,
)
from chandy.core.state import ListStateDescriptor, ValueStateDescriptor


class Acc:
    def __init__(self):
        self.n = 0


class Count(KeyedProcessFunction):
    """Counts per key into an Acc; creates the file ``marker`` once a key counted 2."""

    def __init__(self, marker):
        self.marker = marker

    def open(self, runtime_context):
        self.acc = runtime_context.get_state(ValueStateDescriptor("acc"))

    def process_element(self, value, ctx):
        acc = self.acc.value() or Acc()
        acc.n += 1
        self.acc.update(acc)
        if acc.n == 2:
            open(self.marker, "a").close()
        yield ctx.get_current_key(), acc.n


class Seen(MapFunction, CheckpointedFunction):
    """Counts its records in an Acc kept in operator state; creates ``marker`` at the second."""

    def __init__(self, marker):
        self.marker = marker

    def initialize_state(self, context):
        self.state = context.get_operator_state_store().get_list_state(ListStateDescriptor("seen"))
        restored = list(self.state.get())
        self.acc = restored[0] if restored else Acc()

    def snapshot_state(self, context):
        self.state.update([self.acc])

    def map(self, value):
        self.acc.n += 1
        if self.acc.n == 2:
            open(self.marker, "a").close()
        return value


class FailWhenTold(MapFunction):
    """Raises once, when the file ``path`` exists (a test's signal), to make a failover."""

    def __init__(self, path):
        self.path = path
        self.failed = False

    def map(self, value):
        if not self.failed and os.path.exists(self.path):
            self.failed = True
            os.rename(self.path, self.path + ".done")
            raise RuntimeError("told to fail")
        return value
'''

#: v2: ``Acc`` was renamed; nothing else changed.
V2 = re.sub(r"\bAcc\b", "Accumulator", V1)


class UserModules:
    """Writes a user module (one name, v1 then v2) into a directory the driver and, when the
    session's environment carries it, the Spark slots import from."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.name = f"accmod_{uuid.uuid4().hex[:8]}"

    def install(self, source: str) -> Any:
        """Write ``source`` as the module and import it afresh in this process."""
        (self.directory / f"{self.name}.py").write_text(source)
        shutil.rmtree(self.directory / "__pycache__", ignore_errors=True)
        sys.modules.pop(self.name, None)
        importlib.invalidate_caches()
        return importlib.import_module(self.name)


@pytest.fixture
def user_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> UserModules:
    directory = tmp_path / "modules"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    names = request.fixturenames
    if "spark_session" in names or ("executor" in names and request.getfixturevalue("executor") == "spark"):
        # Spark starts Python workers with the SparkContext's environment (a new worker
        # daemon for a new environment): the slots of the jobs this test starts import here.
        environment = request.getfixturevalue("spark_session").sparkContext.environment
        monkeypatch.setitem(environment, "PYTHONPATH", str(directory))
    return UserModules(directory)


def counting_job(env: StreamExecutionEnvironment, module: Any, base: Path, *, seen: bool = False) -> Any:
    """A throttled sequence counted per key into ``Acc``s (``seen``: into an ``Acc`` in
    operator state instead); the file ``base/counted`` appears once some state holds one,
    and the job fails over once when the file ``base/fail`` appears."""
    stream = env.from_sequence(0, 10**9).uid("source").map(Throttle(0.002)).uid("throttle")
    stream = stream.map(module.FailWhenTold(str(base / "fail"))).uid("fail")
    marker = str(base / "counted")
    if seen:
        stream = stream.map(module.Seen(marker)).uid("seen").name("Seen")
    else:
        stream = stream.key_by(lambda x: x % 4).process(module.Count(marker)).uid("counter").name("Counter")
    stream.add_sink(lambda value: None).name("Discard")
    return stream


@contextlib.contextmanager
def running(env: StreamExecutionEnvironment, name: str) -> Iterator[Any]:
    """The client of the job ``env`` holds, started; cancelled at the end if it still runs, and
    waited for (a test that failed half-way must not leave an endless job behind)."""
    client = env.execute_async(name)
    try:
        yield client
    finally:
        if not client.is_done():
            client.cancel()
            with contextlib.suppress(JobExecutionError):
                client.get_job_execution_result(timeout=60)


def savepoint_of_v1(env: StreamExecutionEnvironment, module: Any, base: Path, *, seen: bool = False) -> str:
    """Run the v1 job until its state holds ``Acc`` objects, then stop it with a savepoint."""
    counting_job(env, module, base, seen=seen)
    with running(env, "v1") as client:
        wait_for_file(base / "counted", client)
        savepoint: str = when_every_task_runs(
            lambda: client.stop_with_savepoint(savepoint_directory=str(base / "sp")).result(120)
        )
    return savepoint


def when_every_task_runs(action: Callable[[], Any], timeout_s: float = 120) -> Any:
    """``action`` (a checkpoint or savepoint), again while it fails because a task still
    initializes: one subtask counting says nothing of the other (on Spark, a RocksDB subtask
    may still be opening its database)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return action()
        except CheckpointException as error:
            not_yet = error.reason is CheckpointFailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING
            if not not_yet or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def wait_for_file(path: Path, client: Any, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert not client.is_done(), "the job ended before it counted"
        assert time.monotonic() < deadline, f"{path} did not appear in time"
        time.sleep(0.01)


def fails_once(env: StreamExecutionEnvironment, name: str, restarts: int = 0) -> JobExecutionError:
    """Run the job ``env`` holds; it must fail after ``restarts`` restarts, no more."""
    with running(env, name) as client, pytest.raises(JobExecutionError) as info:
        client.get_job_execution_result(timeout=120)
    assert client.restarts == restarts, f"a failure no restart heals was restarted: {info.value}"
    return info.value


def assert_names_everything(error: BaseException, module: str, state: str, *, uid: str = "counter") -> None:
    message = str(error)
    for part in (
        f"uid '{uid}'",
        state,
        f"{module}.Acc",  # the missing class, as module.qualname
        "Can't get attribute 'Acc'",  # the original error
        "Acc = <the new class>",  # fix 1: keep it importable under its old name
        "new uid()",  # fix 2: start the operator without its state
        "allow_non_restored_state",
    ):
        assert part in message, (part, message)


@pytest.mark.slow  # on Spark: two jobs, each deploying its slots
@on_rocksdb_too(executor=("local", "spark"))
def test_a_savepoint_whose_state_class_was_renamed_fails_the_restore_once(
    tmp_path: Path, executor: str, user_modules: UserModules
) -> None:
    v1 = user_modules.install(V1)
    savepoint = savepoint_of_v1(
        checkpointing_env(interval_ms=600_000, executor=executor, **SMALL), v1, tmp_path
    )

    v2 = user_modules.install(V2)
    env = checkpointing_env(interval_ms=600_000, executor=executor, **SMALL)
    env.set_restore_path(savepoint)
    counting_job(env, v2, tmp_path)
    error = fails_once(env, "v2")
    assert_names_everything(error, user_modules.name, "state 'acc'")
    if executor == "local":
        assert isinstance(error.__cause__, StateClassNotFoundError)


@on_rocksdb_too(executor="local")  # RocksDB: a native restore, whose values are read lazily
def test_a_retained_checkpoint_whose_state_class_was_renamed_fails_the_restore_once(
    tmp_path: Path, executor: str, user_modules: UserModules
) -> None:
    v1 = user_modules.install(V1)
    retain = {
        "execution.checkpointing.dir": str(tmp_path / "checkpoints"),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    }
    env = checkpointing_env(interval_ms=600_000, executor=executor, **SMALL, **retain)
    counting_job(env, v1, tmp_path)
    with running(env, "v1") as client:
        wait_for_file(tmp_path / "counted", client)
        when_every_task_runs(client.trigger_checkpoint)  # its state holds Acc objects

    v2 = user_modules.install(V2)
    env = checkpointing_env(interval_ms=600_000, executor=executor, **SMALL)
    env.set_restore_path(str(latest_checkpoint_dir(tmp_path / "checkpoints")))
    counting_job(env, v2, tmp_path)
    error = fails_once(env, "v2")
    assert_names_everything(error, user_modules.name, "state 'acc'")


@on_rocksdb_too()
def test_a_class_gone_when_the_job_restores_its_own_checkpoint_after_a_failover_fails_it_once(
    tmp_path: Path, user_modules: UserModules
) -> None:
    """The job fails over once (a failing function), as jobs do; while it waits to restart,
    the class its state holds goes (deleted from the module here; on a cluster, an executor
    replaced by one with another version of the module). The restart restores the job's own
    latest checkpoint, which fails the job instead of restarting it every second forever."""
    v1 = user_modules.install(V1)
    env = checkpointing_env(interval_ms=600_000, **SMALL, **{"restart-strategy.fixed-delay.delay": 1000})
    counting_job(env, v1, tmp_path)
    with running(env, "fails over") as client:
        wait_for_file(tmp_path / "counted", client)
        client.trigger_checkpoint()  # the latest completed checkpoint: its state holds Acc objects
        (tmp_path / "fail").touch()  # FailWhenTold fails the job over
        deadline = time.monotonic() + 60
        while client.get_job_status() is not JobStatus.RESTARTING:  # every task cancelled
            assert time.monotonic() < deadline and not client.is_done(), client.get_job_status()
            time.sleep(0.005)
        del v1.Acc
        with pytest.raises(JobExecutionError) as info:
            client.get_job_execution_result(timeout=120)
    assert client.restarts == 1, "the failover restarts once; the failed restore must not restart again"
    assert_names_everything(info.value, user_modules.name, "state 'acc'")
    assert isinstance(info.value.__cause__, StateClassNotFoundError)


def test_operator_state_whose_class_was_renamed_fails_the_restore_once_naming_it(
    tmp_path: Path, user_modules: UserModules
) -> None:
    v1 = user_modules.install(V1)
    savepoint = savepoint_of_v1(checkpointing_env(interval_ms=600_000, **SMALL), v1, tmp_path, seen=True)

    v2 = user_modules.install(V2)
    env = checkpointing_env(interval_ms=600_000, **SMALL)
    env.set_restore_path(savepoint)
    counting_job(env, v2, tmp_path, seen=True)
    error = fails_once(env, "v2")
    assert_names_everything(error, user_modules.name, "operator state 'seen'", uid="seen")


# ---------------------------------------------------------------------- the backends, one by one


@pytest.fixture
def doomed_class(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Any]]:
    """A class ``Doomed`` in a module of its own, and a function that deletes it (the code
    that restores no longer has it) and returns nothing."""
    module = types.ModuleType(f"doomed_{uuid.uuid4().hex[:8]}")
    doomed = type("Doomed", (), {"__module__": module.__name__})
    module.Doomed = doomed  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)

    def delete() -> None:
        del module.Doomed  # type: ignore[attr-defined]

    doomed.delete = staticmethod(delete)  # type: ignore[attr-defined]
    yield doomed


def job_code(doomed_class: Any) -> UnpicklingPolicy:
    """What a restore of a job whose code defines ``doomed_class`` may unpickle: the classes
    of its module (chandy.task.user_code finds them for a real job)."""
    return UnpicklingPolicy(user_modules=frozenset({doomed_class.__module__}))


def at(backend: Any, key: Any) -> None:
    backend.set_current_key(key, assign_to_key_group(key, 128))


def heap_snapshot(backend: HeapKeyedStateBackend) -> list[KeyGroupsStateHandle]:
    snapshot = backend.snapshot()
    serialized = snapshot.serialize()
    snapshot.release()
    return [
        KeyGroupsStateHandle(
            serialized.key_group_range, serialized.ranges, ByteStreamStateHandle("x", serialized.payload)
        )
    ]


def timer_service(backend: Any) -> InternalTimerService:
    class Ignore:
        def on_event_time(self, timer: Any) -> None: ...

        def on_processing_time(self, timer: Any) -> None: ...

    return InternalTimerService("t", backend, ProcessingTimeService(ManualClock()), Ignore())


def test_the_heap_names_the_state_that_holds_the_missing_class(doomed_class: Any) -> None:
    backend = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128, owner="operator 'Count' (uid 'count')")
    at(backend, "k")
    backend.get_partitioned_state(ValueStateDescriptor("plain")).update(1)
    backend.get_partitioned_state(ValueStateDescriptor("acc")).update(doomed_class())
    handles = heap_snapshot(backend)
    doomed_class.delete()
    fresh = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128, owner="operator 'Count' (uid 'count')")
    with pytest.raises(StateClassNotFoundError) as info:
        fresh.restore(handles, StateReader(), job_code(doomed_class))
    assert info.value.state == "acc" and info.value.owner == "operator 'Count' (uid 'count')"
    assert info.value.missing == f"{doomed_class.__module__}.Doomed"
    assert "cannot restore state 'acc'" in str(info.value)


def test_the_heap_names_timers_whose_namespace_is_the_missing_class(doomed_class: Any) -> None:
    backend = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128, owner="operator 'Window'")
    at(backend, "k")
    timer_service(backend).register_event_time_timer(doomed_class(), 100)  # a window, say
    handles = heap_snapshot(backend)
    doomed_class.delete()
    with pytest.raises(StateClassNotFoundError) as info:
        restored = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128, owner="o")
        restored.restore(handles, StateReader(), job_code(doomed_class))
    assert "cannot restore its timers (state '_timer_state/event_t')" in str(info.value)


def test_rocksdb_names_the_state_it_reads_lazily_and_its_timers(tmp_path: Path, doomed_class: Any) -> None:
    """A native restore reads no value; the first read of one names the state and the operator
    from the handle that reads it."""
    backend = RocksDBKeyedStateBackend(
        KeyGroupRange(0, 127),
        128,
        directory=str(tmp_path),
        memory=SlotMemory.of(64 << 20),
        owner="operator 'Count' (uid 'count')",
    )
    try:
        at(backend, "k")
        backend.get_partitioned_state(ValueStateDescriptor("acc")).update(doomed_class())
        backend.get_partitioned_state(MapStateDescriptor("map")).put("x", doomed_class())
        timer_service(backend).register_event_time_timer(doomed_class(), 100)
        backend.flush()
        backend.cache.drop()  # as after a restore: the next reads decode RocksDB's bytes
        doomed_class.delete()
        for read, state in (
            (lambda: backend.get_partitioned_state(ValueStateDescriptor("acc")).value(), "state 'acc'"),
            (lambda: backend.get_partitioned_state(MapStateDescriptor("map")).get("x"), "state 'map'"),
            (lambda: timer_service(backend), "its timers (state '_timer_state/event_t')"),
        ):
            with pytest.raises(StateClassNotFoundError) as info:
                read()
            assert f"operator 'Count' (uid 'count') cannot restore {state}" in str(info.value)
    finally:
        backend.dispose()


def test_in_flight_records_of_an_unaligned_checkpoint_whose_class_is_gone_fail_once(
    doomed_class: Any,
) -> None:
    """An unaligned checkpoint keeps records in flight, pickled: replaying them into a job
    without their class fails it once, as state does."""
    gate = InputGate([LocalChannel(4, name="live")], Wakeup())
    gate.add_recovered(0, [encode_item([doomed_class()])], job_code(doomed_class))
    doomed_class.delete()
    with pytest.raises(StateClassNotFoundError) as info:
        gate.poll_next()
    message = str(info.value)
    assert "cannot restore the in-flight records of its input channel 0" in message
    assert f"{doomed_class.__module__}.Doomed" in message


# ---------------------------------------------------------------------- records that cannot be pickled


class Locked:
    """A record with a lock inside: fine within a task, impossible to pickle."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.lock = threading.Lock()


def locked_job(env: StreamExecutionEnvironment) -> Any:
    return (
        env.from_sequence(0, 1999)
        .map(Throttle(0.0005))  # checkpoints while records are on their way
        .map(Locked)
        .uid("lock-it")
        .name("LockIt")
        .key_by(lambda record: record.value % 4)
        .map(lambda record: record.value)
        .name("Unlock")
    )


@pytest.mark.slow
def test_a_record_that_cannot_be_pickled_to_another_slot_fails_the_job_once(spark_session: Any) -> None:
    env = checkpointing_env(interval_ms=50, executor="spark", **SMALL)
    locked_job(env).add_sink(lambda value: None)
    error = fails_once(env, "locked records")
    message = str(error)
    for part in (
        "operator 'LockIt' (uid 'lock-it') emitted a record that cannot be pickled",
        "to send it to task 'Unlock",
        f"a {__name__}.Locked",  # the record's type
        "cannot pickle '_thread.lock' object",
        "Emit picklable values",
        "chain the operators",
    ):
        assert part in message, (part, message)


def test_on_the_local_executor_records_that_cannot_be_pickled_cross_keyed_edges_with_checkpoints() -> None:
    """The local executor hands records over in memory; measuring them for the alignment
    statistics (it pickles them to count their bytes) must not fail the job."""
    env = checkpointing_env(interval_ms=10, **SMALL)
    results = locked_job(env).execute_and_collect("locked, local")
    assert sorted(results) == list(range(2000))
    assert results.job_client.restarts == 0


def test_an_unpicklable_record_in_a_checkpoints_in_flight_data_is_unrecoverable_and_named() -> None:
    """Unaligned checkpoints pickle the records in flight on either executor: one that cannot
    be pickled fails the job once, by its type (the local channel only measures quietly)."""
    channel = LocalChannel(4, name="test")
    batch = [1, Locked(2)]
    assert channel.size_of(batch) == 0
    with pytest.raises(RecordNotPicklableError) as info:
        channel.serialized(batch)
    assert info.value.record_type == f"{__name__}.Locked"
    assert isinstance(info.value, UnrecoverableError)


def test_a_record_whose_class_the_receiving_slot_cannot_import_is_unrecoverable_and_named(
    doomed_class: Any,
) -> None:
    """A module shipped to some executors only: what the TCP channel received cannot be loaded."""
    payload = encode_item([doomed_class()])
    doomed_class.delete()
    with pytest.raises(RecordClassNotFoundError) as info:
        decode_received(payload)
    assert isinstance(info.value, UnrecoverableError)
    assert f"{doomed_class.__module__}.Doomed" in str(info.value)
    assert "spark.submit.pyFiles" in str(info.value)


# ---------------------------------------------------------------------- what counts as unrecoverable


class Wraps(MapFunction):
    """Catches an unrecoverable error and raises its own from it, as user code does."""

    def map(self, value: Any) -> Any:
        try:
            raise UnrecoverableError("topic 'orders' does not exist")
        except UnrecoverableError as exc:
            raise RuntimeError("could not read the orders") from exc


def test_an_unrecoverable_error_anywhere_in_the_chain_fails_the_job_once() -> None:
    env = checkpointing_env(interval_ms=50, **SMALL)  # unlimited restarts, 50 ms apart
    env.from_sequence(0, 9).map(Wraps()).add_sink(lambda value: None)
    error = fails_once(env, "wrapped")
    assert "could not read the orders" in str(error)
    assert find_unrecoverable(error) is not None


def test_find_unrecoverable_follows_causes_and_printed_contexts_only() -> None:
    unrecoverable = UnrecoverableError("bad")
    assert find_unrecoverable(unrecoverable) is unrecoverable
    try:
        try:
            raise unrecoverable
        except UnrecoverableError:
            raise ValueError("while handling it") from None  # context suppressed: not a cause
    except ValueError as suppressed:
        assert find_unrecoverable(suppressed) is None
    try:
        try:
            raise unrecoverable
        except UnrecoverableError:
            raise ValueError("while handling it")  # the implicit context is the point
    except ValueError as implicit:
        assert find_unrecoverable(implicit) is unrecoverable
    assert find_unrecoverable(RuntimeError("transient")) is None


def test_a_spark_session_stopped_under_a_running_job_fails_its_restart_once() -> None:
    """A job whose session was stopped cannot deploy again: each restart failed the same way,
    every second, forever (a test's job that outlived the session showed it)."""
    from chandy.config.configuration import Configuration
    from chandy.runtime.spark.executor import SparkExecutor

    executor = SparkExecutor(Configuration())
    executor.session = types.SimpleNamespace(sparkContext=types.SimpleNamespace(_jsc=None))  # stopped
    with pytest.raises(UnrecoverableError, match="Spark session this job runs on was stopped"):
        executor._ensure_session_and_server(2)


# ---------------------------------------------------------------------- state that cannot be pickled


class KeepALock(KeyedProcessFunction):
    """Keeps a lock in value state: fine until a checkpoint (heap) or the write (RocksDB)
    pickles it."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.held = runtime_context.get_state(ValueStateDescriptor("held-lock"))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        self.held.update(threading.Lock())
        yield value


@on_rocksdb_too()
def test_state_that_cannot_be_pickled_fails_the_job_once(state_backend: str) -> None:
    """Heap: every checkpoint would fail, the job fail over after the tolerated failures and
    build the same lock again, forever. RocksDB: every write of the value fails, after every
    restart. Either way the job fails once, naming the state, the value's type and the fix."""
    env = checkpointing_env(interval_ms=20, **SMALL)
    env.from_sequence(0, 1999).map(Throttle(0.0005)).key_by(lambda v: v % 4).process(KeepALock()).uid(
        "keeper"
    ).add_sink(lambda value: None)
    error = fails_once(env, "a lock in state")
    message = str(error)
    for part in ("state 'held-lock'" if state_backend == "hashmap" else "keyed state", "_thread.lock"):
        assert part in message, (part, message)
    assert "create locks, connections, files and clients in open()" in message
    assert isinstance(find_unrecoverable(error), StateNotPicklableError)


class StateWithoutKey(MapFunction):
    """Asks for keyed state in a map that follows no key_by."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen"))

    def map(self, value: Any) -> Any:
        return value


class TimerWithoutKey(ProcessFunction):
    """Sets a timer in a ProcessFunction (no on_timer: nothing to see when the job is built)."""

    def process_element(self, value: Any, ctx: ProcessFunction.Context) -> Any:
        ctx.timer_service().register_processing_time_timer(10**12)
        yield value


class KeyWithoutKey(ProcessFunction):
    """A PyFlink KeyedProcessFunction's habit in a ProcessFunction."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield ctx.get_current_key(), value


@pytest.mark.parametrize(
    ("function", "asked"),
    [
        (StateWithoutKey(), "keyed state 'seen' requested in operator 'Map'"),
        (TimerWithoutKey(), "Setting timers is only supported on a keyed stream"),
        (KeyWithoutKey(), "ctx.get_current_key() called in a function on a stream that is not keyed"),
    ],
)
def test_keyed_state_timers_and_the_key_on_a_stream_not_keyed_fail_the_job_once(
    function: Any, asked: str
) -> None:
    """They used to be restarted for ever (39 restarts in 40 s): the job's definition is wrong,
    and every attempt meets it again."""
    env = checkpointing_env(interval_ms=50, **SMALL)  # unlimited restarts, 50 ms apart
    stream = env.from_sequence(0, 9)
    stream = stream.map(function) if isinstance(function, MapFunction) else stream.process(function)
    stream.add_sink(lambda value: None)
    error = fails_once(env, "not keyed")
    assert asked in str(error)
    assert "key_by(...)" in str(error)
    assert isinstance(find_unrecoverable(error), NotKeyedError)


class TimerHandler(ProcessFunction):
    def process_element(self, value: Any, ctx: ProcessFunction.Context) -> Any:
        yield value

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield timestamp


def test_a_process_function_with_on_timer_on_a_stream_not_keyed_is_refused_when_built() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    stream = env.from_sequence(0, 9)
    with pytest.raises(InvalidProgramError) as info:
        stream.process(TimerHandler())
    message = str(info.value)
    assert "process(): TimerHandler defines on_timer, but this stream is not keyed" in message
    assert "call key_by(...) first and make TimerHandler a KeyedProcessFunction" in message
    with pytest.raises(
        InvalidProgramError, match="CountByKey is a KeyedProcessFunction, which needs a keyed"
    ):
        stream.process(CountByKey())
    with pytest.raises(InvalidProgramError, match="CoTimers defines on_timer"):
        stream.connect(env.from_sequence(0, 1)).process(CoTimers())


class CountByKey(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


class CoTimers(CoProcessFunction):
    def process_element1(self, value: Any, ctx: Any) -> Any:
        yield value

    def process_element2(self, value: Any, ctx: Any) -> Any:
        yield value

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield timestamp
