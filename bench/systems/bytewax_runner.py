"""Bytewax's runner: ``python bytewax_runner.py <w1|w2|w3|w4> --work-dir DIR [options]``.

Follows the runner protocol of :mod:`bench.systems` (this file is standalone: standard
library and Bytewax only). The dataflows are written as a Bytewax user writes them: a
``FixedPartitionedSource`` with one partition per worker whose snapshot is its read
position (so a resume re-reads exactly what the last snapshot did not cover),
``op.key_on(str(i % keys))``, ``op.stateful_map`` keeping the key's sum, and a
``DynamicSink`` that notes when records arrive and discards them.

How it runs
-----------
The runner never runs a dataflow in its own process: it starts the dataflow as child
processes (this same file, ``_dataflow`` sub-command, which calls ``bytewax.run.cli_main``
exactly as ``python -m bytewax.run`` does) and owns them: they are killed when the
runner leaves, normally, on an error, on Ctrl-C or SIGTERM, and they kill themselves if
the runner dies (``PR_SET_PDEATHSIG``). That is also how a Bytewax user recovers from a
failure: Bytewax does not restart a failed dataflow, the user (or Kubernetes) starts the
processes again on the same recovery directory and they resume from the last snapshot.

``cli_main`` is called directly, not through ``python -m bytewax.run``, only because the
latter's ``-s`` takes whole seconds and the protocol's interval is in milliseconds.

``--mode`` chooses how ``--parallelism`` P is reached:

* ``processes`` (the default): P processes of one worker each, a Timely cluster on
  127.0.0.1 (``process_id`` / ``addresses``). Each worker has a core and an interpreter
  lock of its own; records that change workers at the keyed exchange are pickled
  through TCP.
* ``workers``: one process with P worker threads (``-w P``). The workers share one
  interpreter lock, so the Python code of the dataflow (source, key function, mapper,
  sink) runs on one core at a time.

Recovery and "checkpoints"
--------------------------
With ``--checkpoint-interval-ms`` > 0 the recovery partitions are made with
``python -m bytewax.recovery DIR P`` and the dataflow runs with ``RecoveryConfig(DIR)``
and an epoch (snapshot) interval of that many milliseconds; with 0, recovery is off (and
the epoch interval is Bytewax's default, 10 s). Bytewax keeps no checkpoint statistics.
The runner derives them from what Bytewax writes: a thread polls the recovery
partitions (SQLite, every 10 ms) for the durable progress (the minimum over workers of
the ``fronts`` table, which is what a resume starts from), and the source partitions note
when Bytewax asks them for their snapshot, which it does when an epoch closes at the
input. So:

* ``checkpoints_completed`` = epochs of this execution whose snapshots are durable
  (the last one is closed by the end of input, not by the interval);
* ``checkpoint_p50_ms`` / ``checkpoint_max_ms`` = per epoch, from the source's snapshot
  call (the epoch closes at the input) to the first poll that sees the epoch durable
  (every worker's progress past it); resolution 10 ms. Like Flink's end-to-end duration
  it includes the time the epoch's records in flight take to drain through the keyed
  step.

What Bytewax 0.21 does that shapes the figures (read in its source, seen in the runs):

* An epoch's snapshot holds only the keys the stateful step touched in that epoch
  (pickled, one SQLite row per key), written synchronously by the workers; at the end
  of input every key's ``on_eof`` is called, so the final epoch snapshots every key.
* Each epoch's commit garbage-collects the snapshot table with a query that scans the
  whole table (every key's rows): it costs in proportion to the number of keys, every
  epoch, which makes W4 (a million keys) slow, far more than linearly.
* The stateful step applies items of the current epoch eagerly, so latency is not tied
  to the epoch interval.
* Process ``i`` of a cluster connects to processes ``0..i-1`` and, if one is not
  listening yet, retries after a whole second. The dataflow processes here wait for the
  lower processes' ports (``/proc/net/tcp``) before ``cli_main`` so that this second does
  not land in start-up and recovery times at random.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import bytewax.operators.windowing as win
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.recovery import RecoveryConfig
from bytewax.run import cli_main
from w5_events import BASE_MS, OUT_OF_ORDERNESS_MS, WINDOW_MS, ResultCheck, W5Events, WatermarkPasses
from w5_events import figures as w5_figures

log = logging.getLogger("bench.bytewax")

FLOW_ID = "bench"
RAISED = "raised.json"  # w2's marker: the injected failure happened (when, at which record)


# ================================================================== the dataflow (child side)


@dataclass
class FlowSpec:
    """Everything a dataflow process needs, written by the runner as JSON for the children."""

    workload: str
    work_dir: str
    records: int
    keys: int
    parallelism: int
    mode: str
    epoch_ms: int  # 0: recovery off
    attempt: int = 0
    rate: float = 1000.0
    duration_s: float = 20.0
    value_bytes: int = 100
    per_event_second: int = 100_000
    batch_size: int = 1000
    fail_at: int = -1
    addresses: list[str] = field(default_factory=list)

    @property
    def recovery_dir(self) -> Path:
        return Path(self.work_dir) / "recovery"

    @property
    def events(self) -> W5Events:
        return W5Events(self.records, self.keys, self.per_event_second, self.parallelism)


class SourceLog:
    """When Bytewax asked a source partition for snapshots, and when it reached its end.

    Bytewax calls ``snapshot()`` when an epoch closes at the input, so these times are
    the start of each epoch's snapshot; the runner pairs them with the times it sees the
    epochs durable. Written at ``close()``, which Bytewax calls only on a clean end.
    """

    def __init__(self, spec: FlowSpec, part: int) -> None:
        self.path = Path(spec.work_dir) / f"source-{spec.attempt}-{part}.json"
        self.snapshots: list[float] = []
        self.eof: float | None = None

    def snapshot(self) -> None:
        self.snapshots.append(time.time())

    def end(self) -> None:
        if self.eof is None:
            self.eof = time.time()

    def close(self) -> None:
        self.path.write_text(json.dumps({"snapshots": self.snapshots, "eof": self.eof}))


class _StridedPartition(StatefulSourcePartition[Any, int]):
    """Partition ``part`` of ``parts``: the indexes ``part, part + parts, ...`` below ``end``,
    ``batch`` per ``next_batch``; its snapshot is the next index to read, so a resumed
    partition re-reads exactly what the last durable snapshot did not cover."""

    def __init__(
        self, spec: FlowSpec, part: int, end: int, resume: int | None, make: Callable[[range], list[Any]]
    ) -> None:
        self.step = spec.parallelism
        self.pos = part if resume is None else resume
        self.end = end
        self.batch = spec.batch_size
        self.make = make
        self.log = SourceLog(spec, part)

    def next_batch(self) -> list[Any]:
        if self.pos >= self.end:
            self.log.end()
            raise StopIteration
        indexes = range(self.pos, min(self.end, self.pos + self.step * self.batch), self.step)
        self.pos += len(indexes) * self.step
        return self.make(indexes)

    def snapshot(self) -> int:
        self.log.snapshot()
        return self.pos

    def close(self) -> None:
        self.log.close()


class _PartitionedSource(FixedPartitionedSource[Any, int]):
    """P partitions, one per worker: every worker lists all of them and Bytewax assigns
    each to one worker, so every worker reads one."""

    def __init__(self, spec: FlowSpec) -> None:
        self.spec = spec

    def list_parts(self) -> list[str]:
        return [str(p) for p in range(self.spec.parallelism)]


class IntSource(_PartitionedSource):
    """The ints ``0..N-1``."""

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _StridedPartition:
        return _StridedPartition(self.spec, int(for_part), self.spec.records, resume_state, list)


class KeyValueSource(_PartitionedSource):
    """W4's records ``(i, value)``: ``value_bytes`` bytes, distinct per key (mirrors chandy's
    ``KeyValue``)."""

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _StridedPartition:
        filler = b"v" * max(0, self.spec.value_bytes - 8)

        def make(indexes: range) -> list[tuple[int, bytes]]:
            return [(i, i.to_bytes(8, "big") + filler) for i in indexes]

        return _StridedPartition(self.spec, int(for_part), self.spec.records, resume_state, make)


class _PacedPartition(StatefulSourcePartition[tuple[int, float], int]):
    """W3: partition ``part`` emits index ``j`` (every P-th) at ``t0 + j / rate``, stamped with
    ``time.time()`` when emitted; ``next_awake`` is the next record's due time, so the worker
    is not busy-waiting between records (Bytewax's way to pace a source)."""

    def __init__(self, spec: FlowSpec, part: int, resume: int | None) -> None:
        self.step = spec.parallelism
        self.rate = spec.rate
        self.end = int(spec.rate * spec.duration_s)
        self.pos = part if resume is None else resume
        self.t0 = time.time() - self.pos / self.rate
        self.log = SourceLog(spec, part)

    def next_batch(self) -> list[tuple[int, float]]:
        if self.pos >= self.end:
            self.log.end()
            raise StopIteration
        now = time.time()
        due = min(self.end, int((now - self.t0) * self.rate) + 1)  # indexes due by now
        batch = [(j, now) for j in range(self.pos, due, self.step)]
        self.pos += len(batch) * self.step
        return batch

    def next_awake(self) -> datetime | None:
        return datetime.fromtimestamp(self.t0 + self.pos / self.rate, UTC)

    def snapshot(self) -> int:
        self.log.snapshot()
        return self.pos

    def close(self) -> None:
        self.log.close()


class PacedSource(_PartitionedSource):
    """W3's stamped records at ``rate`` per second for ``duration_s``."""

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _PacedPartition:
        return _PacedPartition(self.spec, int(for_part), resume_state)


class _ArrivalPartition(StatelessSinkPartition[Any]):
    """Discards records, noting when the first and the last arrived at this worker, and
    (by subclasses) whatever else a workload verifies. Written at ``close()``, which Bytewax
    does not promise on an abort (a worker that outlives a failed peer may still close), so
    the files are per attempt and the runner reads only those of the attempt it measures."""

    def __init__(self, spec: FlowSpec, worker: int) -> None:
        self.path = Path(spec.work_dir) / f"timing-{spec.attempt}-{worker}.json"
        self.first = 0.0
        self.last = 0.0
        self.count = 0

    def write_batch(self, items: list[Any]) -> None:
        now = time.time()
        if not self.count:
            self.first = now
        self.last = now
        self.count += len(items)

    def close(self) -> None:
        self.path.write_text(json.dumps({"first": self.first, "last": self.last, "count": self.count}))


class _LastSumPartition(_ArrivalPartition):
    """W2: keeps each key's latest ``(count, sum)`` as well (a key's updates all pass through
    the one worker that owns the key, in order)."""

    def __init__(self, spec: FlowSpec, worker: int) -> None:
        super().__init__(spec, worker)
        self.sums_path = Path(spec.work_dir) / f"sums-{spec.attempt}-{worker}.json"
        self.sums: dict[str, tuple[int, int]] = {}

    def write_batch(self, items: list[tuple[str, tuple[int, int]]]) -> None:
        super().write_batch(items)
        self.sums.update(items)

    def close(self) -> None:
        super().close()
        self.sums_path.write_text(json.dumps(self.sums))


class _LatencyPartition(_ArrivalPartition):
    """W3: ``(stamp, time.time() - stamp)`` per record."""

    def __init__(self, spec: FlowSpec, worker: int) -> None:
        super().__init__(spec, worker)
        self.latency_path = Path(spec.work_dir) / f"latency-{spec.attempt}-{worker}.json"
        self.latencies: list[tuple[float, float]] = []

    def write_batch(self, items: list[tuple[str, float]]) -> None:
        now = time.time()
        super().write_batch(items)
        self.latencies.extend((stamp, now - stamp) for _, stamp in items)

    def close(self) -> None:
        super().close()
        self.latency_path.write_text(json.dumps(self.latencies))


class _W5Partition(_StridedPartition):
    """W5: the events ``(key, value, timestamp)`` of the partition's records, noting when
    the first was read and when the largest timestamp read passed each window's fire
    threshold (``WatermarkPasses``, per batch, by its last record: see
    ``W5Events.timestamp_floor``)."""

    def __init__(self, spec: FlowSpec, part: int, resume: int | None) -> None:
        events = spec.events
        super().__init__(spec, part, events.records, resume, events.records_of)
        self.events = events
        self.passes = WatermarkPasses(events)
        self.passes_path = Path(spec.work_dir) / f"passes-{spec.attempt}-{part}.json"

    def next_batch(self) -> list[Any]:
        batch = super().next_batch()
        if batch:
            self.passes.observe_batch(self.events.timestamp_floor(batch[-1][1]), time.time())
        return batch

    def close(self) -> None:
        super().close()
        self.passes_path.write_text(json.dumps(self.passes.to_json()))


class EventSource(_PartitionedSource):
    """W5's events, partition ``p`` reading records ``p, p + P, ...``."""

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _W5Partition:
        return _W5Partition(self.spec, int(for_part), resume_state)


class _W5ResultPartition(_ArrivalPartition):
    """W5: checks every window result (``ResultCheck``); the results are
    ``(key, (window_id, (key, sum, timestamp)))``."""

    def __init__(self, spec: FlowSpec, worker: int) -> None:
        super().__init__(spec, worker)
        self.results_path = Path(spec.work_dir) / f"results-{spec.attempt}-{worker}.json"
        self.check = ResultCheck(spec.events)

    def write_batch(self, items: list[tuple[str, tuple[int, tuple[int, int, int]]]]) -> None:
        super().write_batch(items)
        now_ms = int(time.time() * 1000)
        add = self.check.add
        for _, (_, (key, total, timestamp)) in items:
            add(key, total, timestamp, now_ms)

    def close(self) -> None:
        super().close()
        self.results_path.write_text(json.dumps(self.check.to_json()))


class BenchSink(DynamicSink[Any]):
    """One partition per worker, of the workload's kind."""

    def __init__(self, spec: FlowSpec, kind: type[_ArrivalPartition]) -> None:
        self.spec = spec
        self.kind = kind

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _ArrivalPartition:
        return self.kind(self.spec, worker_index)


def running_sum(total: int | None, value: int) -> tuple[int, int]:
    """W1's ``stateful_map`` mapper: the key's sum, emitted on every record."""
    total = (total or 0) + value
    return total, total


def stamped_sum(total: int | None, record: tuple[int, float]) -> tuple[int, float]:
    """W3's mapper: the same sum; emits the record's stamp for the sink's latency."""
    return (total or 0) + record[0], record[1]


class StoreValue:
    """W4's ``stateful_flat_map`` mapper: the key's state is its value; emits nothing.

    Notes when it processed its last record (written when the process exits cleanly), so
    that the last epoch's snapshot time can be measured from there, not from the end of
    the source, which may run ahead of the keyed step.
    """

    def __init__(self, spec: FlowSpec) -> None:
        self.path = Path(spec.work_dir) / f"last-stored-{spec.attempt}-{os.getpid()}.json"
        self.last = 0.0
        atexit.register(self.write)

    def __call__(self, _: bytes | None, record: tuple[int, bytes]) -> tuple[bytes, list[Any]]:
        self.last = time.time()
        return record[1], []

    def write(self) -> None:
        if self.last:
            self.path.write_text(json.dumps(self.last))


class FailingSum:
    """W2's mapper: ``(count, sum)`` per key; on the first attempt it raises once.

    The failure is armed when record ``fail_at`` (N // 2) reaches it and fires at the first
    record from then on when at least one epoch of this execution is durable in the
    recovery partitions (checked at most every 20 ms). It cannot wait for the snapshot
    inside the mapper: that would stall the worker, and with it the epoch's snapshot. On
    a resumed attempt it notes when it processed its first record (the end of recovery).
    """

    def __init__(self, spec: FlowSpec) -> None:
        self.spec = spec
        self.work_dir = Path(spec.work_dir)
        self.armed = spec.attempt == 0 and not (self.work_dir / RAISED).exists()
        self.pending = False
        self.checked = 0.0
        self.seen_first = False
        self.store: RecoveryStore | None = None

    def __call__(self, state: tuple[int, int] | None, value: int) -> tuple[tuple[int, int], tuple[int, int]]:
        if not self.seen_first:
            self.seen_first = True
            if self.spec.attempt > 0:
                name = f"first-after-restore-{os.getpid()}-{threading.get_ident()}"
                (self.work_dir / name).write_text(repr(time.time()))
        if self.armed:
            self.maybe_raise(value)
        count, total = state or (0, 0)
        state = (count + 1, total + value)
        return state, state

    def maybe_raise(self, value: int) -> None:
        if value == self.spec.fail_at:
            self.pending = True
        if not self.pending or time.monotonic() - self.checked < 0.020:
            return
        self.checked = time.monotonic()
        if self.store is None:
            self.store = RecoveryStore(self.spec.recovery_dir)
        progress = self.store.progress()
        if progress is None or progress.durable_epochs < 1:
            return
        self.armed = False
        self.store.close()
        (self.work_dir / RAISED).write_text(json.dumps({"time": time.time(), "record": value}))
        raise RuntimeError(f"W2: the injected failure, at record {value}")


def event_time(record: tuple[int, int, int]) -> datetime:
    """W5's ``ts_getter``: the record's timestamp (ms since the epoch) as an aware datetime."""
    return datetime.fromtimestamp(record[2] / 1000, UTC)


def sum_values(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    """W5's reducer: the values' sum; key and a timestamp of the window kept."""
    return a[0], a[1] + b[1], a[2]


#: W5's event clock reads this constant instead of the system time: Bytewax's watermark
#: is then the largest timestamp seen minus the 200 ms wait, as Flink's bounded
#: out-of-orderness watermark is. (With the system clock it also advances with the wall
#: time since the key's latest event, and a stall of more than 100 ms, a snapshot say,
#: would make the next events late and drop them.)
_FROZEN_NOW = datetime(2000, 1, 1, tzinfo=UTC)


def _frozen_now() -> datetime:
    return _FROZEN_NOW


def _never_wake(close_time: datetime) -> None:
    """The events are historical: no system time to wake up at; windows close on events
    (and the end of input), as in Flink."""
    return None


def build_flow(spec: FlowSpec) -> Dataflow:
    """The workload's dataflow, as a Bytewax user would write it."""
    flow = Dataflow(FLOW_ID)
    keys = spec.keys
    if spec.workload in ("w1", "w2"):
        ints = op.input("ints", flow, IntSource(spec))
        keyed = op.key_on("key", ints, lambda i: str(i % keys))
        if spec.workload == "w1":
            sums = op.stateful_map("running_sum", keyed, running_sum)
            op.output("timing", sums, BenchSink(spec, _ArrivalPartition))
        else:
            sums = op.stateful_map("running_sum", keyed, FailingSum(spec))
            op.output("last_sums", sums, BenchSink(spec, _LastSumPartition))
    elif spec.workload == "w3":
        stamped = op.input("stamped", flow, PacedSource(spec))
        keyed = op.key_on("key", stamped, lambda r: str(r[0] % keys))
        sums = op.stateful_map("running_sum", keyed, stamped_sum)
        op.output("latency", sums, BenchSink(spec, _LatencyPartition))
    elif spec.workload == "w4":
        values = op.input("key_values", flow, KeyValueSource(spec))
        keyed = op.key_on("key", values, lambda r: str(r[0]))
        stored = op.stateful_flat_map("store", keyed, StoreValue(spec))
        op.output("timing", stored, BenchSink(spec, _ArrivalPartition))
    elif spec.workload == "w5":
        events = op.input("events", flow, EventSource(spec))
        keyed = op.key_on("key", events, lambda r: str(r[0]))
        clock = win.EventClock(
            event_time,
            wait_for_system_duration=timedelta(milliseconds=OUT_OF_ORDERNESS_MS),
            now_getter=_frozen_now,
            to_system_utc=_never_wake,
        )
        windower = win.TumblingWindower(
            length=timedelta(milliseconds=WINDOW_MS), align_to=datetime.fromtimestamp(BASE_MS / 1000, UTC)
        )
        sums = win.reduce_window("window_sum", keyed, clock, windower, sum_values)
        op.output("check", sums.down, BenchSink(spec, _W5ResultPartition))
    else:
        raise ValueError(f"unknown workload {spec.workload!r}")
    return flow


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when the runner dies (Linux), so that no dataflow
    outlives the runner even if the runner is SIGKILLed."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        sys.exit("the runner is gone")


def _listening(port: int) -> bool:
    """Whether something listens on TCP ``port`` (read from ``/proc/net/tcp``, which, unlike
    a probe connection, does not disturb Timely's listener)."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return True  # cannot tell: let Timely retry
    for line in lines:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            return True
    return False


def _await_lower_processes(spec: FlowSpec, process_id: int) -> None:
    """Process ``i`` of a Timely cluster connects to processes ``0..i-1``; if one is not
    listening yet, Timely sleeps a whole second before retrying. Waiting here (after
    the imports, which both processes do in parallel) until they listen keeps that
    arbitrary second out of start-up and recovery times."""
    deadline = time.monotonic() + 30
    for address in spec.addresses[:process_id]:
        port = int(address.rsplit(":", 1)[1])
        while not _listening(port) and time.monotonic() < deadline:
            time.sleep(0.002)


def dataflow_main(spec_path: str, process_id: int, parent: int) -> None:
    """A dataflow process (``_dataflow`` sub-command): run the flow to its end."""
    _die_with_parent(parent)
    spec = FlowSpec(**json.loads(Path(spec_path).read_text()))
    flow = build_flow(spec)
    recovery = RecoveryConfig(str(spec.recovery_dir)) if spec.epoch_ms > 0 else None
    epoch = timedelta(milliseconds=spec.epoch_ms) if spec.epoch_ms > 0 else None
    if spec.mode == "processes":
        _await_lower_processes(spec, process_id)
        cli_main(
            flow,
            workers_per_process=1,
            process_id=process_id,
            addresses=spec.addresses,
            epoch_interval=epoch,
            recovery_config=recovery,
        )
    else:
        cli_main(flow, workers_per_process=spec.parallelism, epoch_interval=epoch, recovery_config=recovery)


# ================================================================== the recovery store


@dataclass
class Progress:
    """The latest execution's durable progress in the recovery partitions."""

    execution: int
    resume_epoch: int  # where this execution started
    frontier: int  # min over workers: every epoch below it is durable

    @property
    def durable_epochs(self) -> int:
        return self.frontier - self.resume_epoch


def _parts(db_dir: Path) -> list[Path]:
    return sorted(db_dir.glob("part-*.sqlite3"))


def _query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path, timeout=1.0)) as db:
        return db.execute(sql).fetchall()


class RecoveryStore:
    """Read-only queries on the recovery partitions (SQLite in WAL mode, so reading never
    blocks Bytewax's writes). Connections are kept open: opening one costs ~1 ms, a query
    on an open one ~20 us, and the watcher polls every 10 ms on a 2-core machine."""

    def __init__(self, db_dir: Path) -> None:
        self.db_dir = db_dir
        self.dbs: list[sqlite3.Connection] = []

    def close(self) -> None:
        for db in self.dbs:
            db.close()
        self.dbs = []

    def progress(self) -> Progress | None:
        """Bytewax's own resume computation: the latest execution, the min frontier over
        its workers, a worker without a row counting as at the resume epoch. ``None`` if no
        execution has started yet or the store is busy."""
        if not self.dbs:
            self.dbs = [
                sqlite3.connect(part, timeout=1.0, check_same_thread=False) for part in _parts(self.db_dir)
            ]
        try:
            exs = [
                row
                for db in self.dbs
                for row in db.execute("SELECT ex_num, worker_count, resume_epoch FROM exs")
            ]
            if not exs:
                return None
            execution, workers, resume = max(exs)
            fronts: dict[int, int] = {}
            for db in self.dbs:
                for worker, frontier in db.execute(
                    "SELECT worker_index, worker_frontier FROM fronts WHERE ex_num = ?", (execution,)
                ):
                    fronts[worker] = max(frontier, fronts.get(worker, frontier))
        except sqlite3.Error:
            return None
        lowest = min(fronts.get(w, resume) for w in range(workers))
        return Progress(execution, resume, max(lowest, resume))


def read_progress(db_dir: Path) -> Progress | None:
    """The durable progress, read once."""
    store = RecoveryStore(db_dir)
    try:
        return store.progress()
    finally:
        store.close()


class ProgressWatcher:
    """Polls the recovery partitions every ``period`` s while a dataflow runs and notes when
    each durable frontier was first seen: the end of each epoch's snapshot."""

    def __init__(self, db_dir: Path, period: float = 0.010) -> None:
        self.store = RecoveryStore(db_dir)
        self.period = period
        self.seen: dict[int, float] = {}  # frontier -> first seen (time.time())
        self.last: Progress | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress-watcher", daemon=True)

    def __enter__(self) -> ProgressWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()  # the final state, after the processes ended
        self.store.close()

    def _poll(self) -> None:
        progress = self.store.progress()
        if progress is None:
            return
        now = time.time()
        if self.last is None or progress.execution != self.last.execution:
            self.seen = {}
        self.seen.setdefault(progress.frontier, now)
        self.last = progress

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._poll()

    def durable_at(self, epoch: int) -> float | None:
        """When epoch ``epoch`` was first seen durable (a frontier past it)."""
        times = [t for frontier, t in self.seen.items() if frontier > epoch]
        return min(times) if times else None


def store_size(db_dir: Path) -> int:
    """Bytes of the recovery partitions' files (database, WAL and shared memory)."""
    return sum(p.stat().st_size for p in db_dir.glob("part-*.sqlite3*"))


# ================================================================== the runner (parent side)


def _free_ports(count: int) -> list[int]:
    """Ports for the Timely cluster on 127.0.0.1 (free now; a race is unlikely here)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


class Children:
    """The dataflow processes this runner started; all of them are killed and reaped on
    ``close()`` (the runner's ``finally``), whatever state they are in."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, spec: FlowSpec, spec_path: Path) -> list[subprocess.Popen[bytes]]:
        """Start one attempt's processes; each one's stdout and stderr go to a log file in
        the work dir (the runner's stdout must end with the JSON line)."""
        count = spec.parallelism if spec.mode == "processes" else 1
        started = []
        for process_id in range(count):
            log_path = Path(spec.work_dir) / f"dataflow-{spec.attempt}-{process_id}.log"
            with log_path.open("wb") as out:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "_dataflow",
                        str(spec_path),
                        str(process_id),
                        str(os.getpid()),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            self.procs.append(proc)
            started.append(proc)
            log.info(
                "attempt %d: process %d is pid %d (log %s)", spec.attempt, process_id, proc.pid, log_path
            )
        return started

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.procs = []


@dataclass
class Attempt:
    """One attempt's outcome."""

    ok: bool
    wall_s: float
    ended: float  # time.time() when the runner saw it end
    detail: str = ""


def run_attempt(children: Children, spec: FlowSpec, timeout_s: float) -> Attempt:
    """Run one attempt to its end. If any process fails, the others are killed: a Bytewax
    cluster is restarted as a whole."""
    spec_path = Path(spec.work_dir) / f"spec-{spec.attempt}.json"
    if spec.mode == "processes":
        spec.addresses = [f"127.0.0.1:{p}" for p in _free_ports(spec.parallelism)]
    spec_path.write_text(json.dumps(asdict(spec)))
    started = time.perf_counter()
    procs = children.start(spec, spec_path)
    while True:
        codes = [p.poll() for p in procs]
        failed = [(p, c) for p, c in zip(procs, codes, strict=True) if c not in (None, 0)]
        if failed or all(c == 0 for c in codes):
            break
        if time.perf_counter() - started > timeout_s:
            failed = [(p, -1) for p in procs]
            break
        time.sleep(0.002)
    ended, wall = time.time(), time.perf_counter() - started
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not failed:
        return Attempt(True, wall, ended)
    proc, code = failed[0]
    index = procs.index(proc)
    tail = _last_line(Path(spec.work_dir) / f"dataflow-{spec.attempt}-{index}.log")
    detail = "timed out" if code == -1 else f"process {index} exited with {code}: {tail}"
    return Attempt(False, wall, ended, detail)


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "(no output)"


def init_recovery(spec: FlowSpec) -> None:
    """Make the recovery partitions the way the Bytewax docs say: ``python -m bytewax.recovery``."""
    spec.recovery_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "bytewax.recovery", str(spec.recovery_dir), str(spec.parallelism)],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def read_json_files(work_dir: Path, pattern: str) -> list[Any]:
    return [json.loads(p.read_text()) for p in sorted(work_dir.glob(pattern))]


def arrival_span(work_dir: Path, attempt: int) -> tuple[float, float, int]:
    """First arrival, last arrival and record count over the attempt's workers."""
    parts = read_json_files(work_dir, f"timing-{attempt}-*.json")
    active = [p for p in parts if p["count"]]
    if not active:
        raise RuntimeError("no records reached the sink")
    return (min(p["first"] for p in active), max(p["last"] for p in active), sum(p["count"] for p in parts))


def epoch_durations(spec: FlowSpec, watcher: ProgressWatcher) -> list[float]:
    """Per durable epoch of the attempt, ms from its close at the input to its being seen
    durable. A partition's k-th snapshot call closes epoch ``resume_epoch + k - 1`` (its last
    one is at its end of input, after which it takes part in no epoch); the epoch closes
    at the later of the partitions that took part in it."""
    progress = watcher.last
    logs = read_json_files(Path(spec.work_dir), f"source-{spec.attempt}-*.json")
    if progress is None or not logs:
        return []
    durations = []
    for k in range(progress.durable_epochs):
        calls = [entry["snapshots"][k] for entry in logs if len(entry["snapshots"]) > k]
        durable = watcher.durable_at(progress.resume_epoch + k)
        if calls and durable is not None:
            durations.append(max(0.0, durable - max(calls)) * 1000)
    return durations


def checkpoint_figures(spec: FlowSpec, watcher: ProgressWatcher | None) -> dict[str, Any]:
    if watcher is None or watcher.last is None:
        return {"checkpoints_completed": None, "checkpoint_p50_ms": None, "checkpoint_max_ms": None}
    durations = sorted(epoch_durations(spec, watcher))
    return {
        "checkpoints_completed": watcher.last.durable_epochs,
        "checkpoint_p50_ms": percentile(durations, 50) if durations else None,
        "checkpoint_max_ms": durations[-1] if durations else None,
    }


def percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        raise RuntimeError("no records measured")
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


@contextlib.contextmanager
def watching(spec: FlowSpec, poll_ms: float) -> Iterator[ProgressWatcher | None]:
    """A progress watcher on the recovery partitions while the block runs (none without
    recovery)."""
    if spec.epoch_ms <= 0:
        yield None
        return
    with ProgressWatcher(spec.recovery_dir, poll_ms / 1000) as watcher:
        yield watcher


def make_spec(args: argparse.Namespace) -> FlowSpec:
    spec = FlowSpec(
        workload=args.workload,
        work_dir=str(args.work_dir.resolve()),
        records=args.records,
        keys=args.keys,
        parallelism=args.parallelism,
        mode=args.mode,
        epoch_ms=args.checkpoint_interval_ms,
        rate=args.rate,
        duration_s=args.duration_s,
        value_bytes=args.value_bytes,
        per_event_second=args.per_event_second,
        batch_size=args.batch_size,
        fail_at=args.records // 2,
    )
    if spec.epoch_ms > 0:
        init_recovery(spec)
    return spec


def w1(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    spec = make_spec(args)
    with watching(spec, args.poll_ms) as watcher:
        attempt = run_attempt(children, spec, args.timeout_s)
    if not attempt.ok:
        raise RuntimeError(f"the dataflow failed: {attempt.detail}")
    first, last, count = arrival_span(Path(spec.work_dir), 0)
    if count != args.records:
        raise RuntimeError(f"{count} of {args.records} records reached the sink")
    span = last - first
    return {
        "records": args.records,
        "records_per_s": args.records / span,
        "first_to_last_s": span,
        "wall_s": attempt.wall_s,
        **checkpoint_figures(spec, watcher),
    }


def w2(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    if args.checkpoint_interval_ms <= 0:
        raise ValueError("w2 needs snapshots: give --checkpoint-interval-ms > 0")
    spec = make_spec(args)
    work_dir = Path(spec.work_dir)
    first = run_attempt(children, spec, args.timeout_s)
    if first.ok or not (work_dir / RAISED).exists():
        raise RuntimeError(
            "the first attempt did not fail as injected "
            f"({first.detail or 'it ended before a snapshot was durable'}); "
            "give more --records or a shorter --checkpoint-interval-ms"
        )
    log.info("attempt 0 failed as injected (%s); resuming from %s", first.detail, spec.recovery_dir)
    resumed_from = read_progress(spec.recovery_dir)
    spec.attempt = 1
    second = run_attempt(children, spec, args.timeout_s)
    if not second.ok:
        raise RuntimeError(f"the resumed attempt failed: {second.detail}")
    raised = json.loads((work_dir / RAISED).read_text())
    firsts = [float(p.read_text()) for p in work_dir.glob("first-after-restore-*")]
    last: dict[str, list[int]] = {}
    for table in read_json_files(work_dir, "sums-1-*.json"):
        last.update(table)
    wrong = 0
    for key in range(args.keys):
        values = range(key, args.records, args.keys)
        if last.get(str(key)) != [len(values), sum(values)]:
            wrong += 1
    return {
        "records": args.records,
        "exact": wrong == 0,
        "wrong_keys": wrong,
        "recovery_s": min(firsts) - raised["time"],
        "wall_s": first.wall_s + second.wall_s,
        "raised_at_record": raised["record"],
        "resumed_from_epoch": resumed_from.frontier if resumed_from else None,
        "restart_s": None if not firsts else min(firsts) - first.ended,
    }


def w3(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    spec = make_spec(args)
    with watching(spec, args.poll_ms) as watcher:
        attempt = run_attempt(children, spec, args.timeout_s + args.duration_s)
    if not attempt.ok:
        raise RuntimeError(f"the dataflow failed: {attempt.detail}")
    pairs = [pair for part in read_json_files(Path(spec.work_dir), "latency-0-*.json") for pair in part]
    if not pairs:
        raise RuntimeError("no records reached the sink")
    start = min(stamp for stamp, _ in pairs)
    latencies = sorted(latency * 1000 for stamp, latency in pairs if stamp >= start + 1.0)
    return {
        "records": len(latencies),
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p99_ms": percentile(latencies, 99),
        "latency_max_ms": latencies[-1],
        "wall_s": attempt.wall_s,
        **checkpoint_figures(spec, watcher),
    }


def w4(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    """The snapshot that covers every record is the last epoch's, closed by the end of
    input. Bytewax snapshots only the keys changed in an epoch, so that epoch wrote only
    the keys read since the previous one; the state a resume reads is every key's latest
    snapshot.

    * ``checkpoint_size_bytes``: that state, the key and pickled value bytes of the keyed
      step's snapshot rows once the last epoch is durable (``last_epoch_keys`` and
      ``last_epoch_bytes``: the part the last epoch wrote; ``recovery_store_growth_bytes``:
      the SQLite files' growth, with their pages, index and progress rows);
    * ``checkpoint_duration_ms``: from the last record the keyed step processed (any
      worker) to the last epoch seen durable; ``eof_to_durable_ms`` from the sources'
      end instead (the epoch's close at the input, which also counts draining the records
      in flight).
    """
    if args.checkpoint_interval_ms <= 0:
        raise ValueError("w4 measures a snapshot: give --checkpoint-interval-ms > 0")
    spec = make_spec(args)
    work_dir = Path(spec.work_dir)
    empty = store_size(spec.recovery_dir)
    with watching(spec, args.poll_ms) as watcher:
        attempt = run_attempt(children, spec, args.timeout_s)
    if not attempt.ok:
        raise RuntimeError(f"the dataflow failed: {attempt.detail}")
    if watcher is None or watcher.last is None:
        raise RuntimeError("no durable progress in the recovery store")
    final_epoch = watcher.last.frontier - 1
    durable = watcher.durable_at(final_epoch)
    eof = max(entry["eof"] for entry in read_json_files(work_dir, "source-0-*.json"))
    stored = max(read_json_files(work_dir, "last-stored-0-*.json"))
    step = f"{FLOW_ID}.store.%"
    rows = [
        row
        for part in _parts(spec.recovery_dir)
        for row in _query(
            part,
            "SELECT snap_epoch, COUNT(*), SUM(LENGTH(state_key) + LENGTH(ser_change)) "
            f"FROM snaps WHERE step_id LIKE '{step}' AND ser_change IS NOT NULL "
            "GROUP BY snap_epoch",
        )
    ]
    keys = sum(count for _, count, _ in rows)
    if keys != args.records:
        raise RuntimeError(f"{keys} of {args.records} keys are in the recovery store")
    durations = sorted(epoch_durations(spec, watcher))
    return {
        "keys": keys,
        "value_bytes": args.value_bytes,
        "checkpoint_duration_ms": None if durable is None else (durable - stored) * 1000,
        "checkpoint_size_bytes": sum(size for _, _, size in rows),
        "eof_to_durable_ms": None if durable is None else (durable - eof) * 1000,
        "last_epoch_keys": sum(count for epoch, count, _ in rows if epoch == final_epoch),
        "last_epoch_bytes": sum(size for epoch, _, size in rows if epoch == final_epoch),
        "recovery_store_growth_bytes": store_size(spec.recovery_dir) - empty,
        "checkpoints_completed": watcher.last.durable_epochs,
        "checkpoint_p50_ms": percentile(durations, 50) if durations else None,
        "checkpoint_max_ms": durations[-1] if durations else None,
        "wall_s": attempt.wall_s,
    }


def w5(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    """Keyed tumbling event-time window (``reduce_window`` with an ``EventClock`` and a
    ``TumblingWindower``); figures as every runner's (``w5_events.figures``)."""
    spec = make_spec(args)
    with watching(spec, args.poll_ms) as watcher:
        attempt = run_attempt(children, spec, args.timeout_s)
    if not attempt.ok:
        raise RuntimeError(f"the dataflow failed: {attempt.detail}")
    work_dir = Path(spec.work_dir)
    return {
        **w5_figures(
            spec.events,
            read_json_files(work_dir, "passes-0-*.json"),
            read_json_files(work_dir, "results-0-*.json"),
            per_key_source=True,
        ),
        "wall_s": attempt.wall_s,
        **checkpoint_figures(spec, watcher),
    }


WORKLOADS: dict[str, Callable[[argparse.Namespace, Children], dict[str, Any]]] = {
    "w1": w1,
    "w2": w2,
    "w3": w3,
    "w4": w4,
    "w5": w5,
}


def parse(argv: Iterable[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bytewax_runner.py", description="Bytewax's runner for the bench workloads."
    )
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--work-dir", required=True, type=Path)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument(
        "--per-event-second", type=int, default=100_000, help="w5: records per second of event time"
    )
    parser.add_argument(
        "--mode",
        choices=["processes", "workers"],
        default="processes",
        help="P processes of one worker (default) or one process of P workers",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1000,
        help="records per next_batch of a source partition (default 1000)",
    )
    parser.add_argument(
        "--poll-ms",
        type=float,
        default=10.0,
        help="how often to poll the recovery store for durable epochs (default 10)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=1800.0, help="give up on an attempt after this long (default 1800)"
    )
    return parser.parse_args(list(argv))


def check_args(args: argparse.Namespace) -> None:
    """Reject values that would make a dataflow spin forever rather than fail."""
    for name in ("records", "parallelism", "keys", "batch_size", "value_bytes"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.rate <= 0 or args.duration_s <= 0:
        raise ValueError("--rate and --duration-s must be positive")


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["_dataflow"]:
        dataflow_main(argv[1], int(argv[2]), int(argv[3]))
        return 0
    args = parse(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    signal.signal(signal.SIGTERM, _terminate)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if any(args.work_dir.iterdir()):  # a stale marker or recovery store would skew the run
        log.warning("the work dir %s is not empty; the protocol expects an empty one", args.work_dir)
    units = {"processes": ("process", "processes"), "workers": ("worker", "workers")}[args.mode]
    variant = f"{args.parallelism} {units[args.parallelism != 1]}"
    result: dict[str, Any] = {"system": "bytewax", "variant": variant, "workload": args.workload}
    children = Children()
    code = 0
    try:
        check_args(args)
        result.update(WORKLOADS[args.workload](args, children))
        result["ok"] = True
    except KeyboardInterrupt as exc:
        result.update(ok=False, error=f"KeyboardInterrupt: {exc}")
        code = 130
    except Exception as exc:  # reported in the JSON, as the protocol says
        log.exception("bytewax %s failed", args.workload)
        result.update(ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}")
    finally:
        children.close()
    # The runner's own CPU (mostly the progress watcher): what the measurement costs the
    # machine besides the dataflow.
    log.info("runner process used %.2f s of CPU", time.process_time())
    sys.stdout.write(json.dumps(result) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
