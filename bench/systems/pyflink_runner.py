"""PyFlink reference runner: runs one workload (w1..w6) on a local Flink mini-cluster.

The runner protocol and the workloads are described in ``bench/systems/__init__.py``.
This script runs with the Python of ``bench/.cache/venvs/pyflink`` and imports only
the standard library and PyFlink, so the reference numbers owe nothing to chandy.

The jobs are written as a PyFlink user would write them: DataStream API, a
``NumberSequenceSource``, a Python ``map`` to ``(key, value)``, ``key_by`` and a
Python ``KeyedProcessFunction`` holding a ``ValueState``. ``--mode`` selects how PyFlink
runs the Python functions (``python.execution-mode``):

* ``thread``: embedded in the task manager's JVM (pemja), called record by record; one
  interpreter, hence one GIL, for every subtask; keyed state is the JVM's, read directly.
* ``process``: in a Python worker process per slot (Apache Beam's SDK harness), fed in
  bundles over gRPC, as on a cluster. Keyed state stays in the JVM; the worker keeps a
  cache of ``python.state.cache-size`` keys (default 1000) and asks the JVM over gRPC,
  synchronously, for every key it does not hold: with more keys per subtask than that,
  and keys coming round in turn, every record costs a round trip.
* ``loopback``: process mode as a local PyFlink script gets it by default: the
  "worker processes" only ask a server in the client to run the harness, so every
  subtask's Python runs in threads of this process, under one GIL.
* ``unaligned``: thread mode with unaligned checkpoints
  (``get_checkpoint_config().enable_unaligned_checkpoints()``, aligned-checkpoint timeout
  0: every checkpoint unaligned).

How the figures are taken
-------------------------
* Record times come from the Python functions themselves: the last function of each
  job notes ``time.time()`` of its first and last record (or each record's latency)
  and writes them to a file per function instance in the work dir at ``close()``.
* Checkpoint figures come from Flink's REST API (``/jobs/<id>/checkpoints``), which a
  thread polls every 0.25 s while the job runs, keeping every completed checkpoint of
  the history it sees. The mini-cluster (and its REST endpoint) goes away the moment
  the job ends, and with Flink's default
  ``execution.checkpointing.checkpoints-after-tasks-finish`` the job takes one final
  checkpoint after the source ended, just before it ends, which no poll can see. The
  JobManager's log line for it (``Completed checkpoint <id> for job <job> (<bytes>
  bytes, checkpointDuration=<ms> ms, ...)``, in the work dir) fills that gap. Holding
  the job open in a Python ``close()`` does not work: in process mode Beam stops the
  Python worker without waiting for it.
  ``checkpoint_p50_ms``/``checkpoint_max_ms`` are taken over those checkpoints'
  ``end_to_end_duration`` (nearest rank); a log-only one counts its
  ``checkpointDuration``, which also holds the few ms of finalization.
* w3's records come from Flink's ``DataGeneratorSource``, paced to ``rate`` records/s
  (a smooth rate limiter; Flink SQL's ``datagen`` table instead emits a second's rows
  in one burst); a SQL projection chained to it adds ``CURRENT_ROW_TIMESTAMP()``,
  evaluated in the JVM as the record is emitted (``--w3-source sql``, the default;
  1 ms resolution), and the stream goes on as a DataStream.
  A stamp taken in Python is late in process mode: the JVM hands records to the
  Python worker in bundles (up to ``python.fn-execution.bundle.time``, 1 s), so a
  Python stamp hides up to that wait. ``--w3-source datagen`` (Flink's rate-limited
  ``DataGeneratorSource`` and a stamping Python ``map`` chained behind it) and
  ``--w3-source throttle`` (a Python ``map`` that sleeps to keep the rate and stamps,
  behind a ``NumberSequenceSource``) are there to compare; in thread mode all agree.
* w2 reads with one source reader, so that the values come in order and record N // 2
  is halfway; the map behind it reads slowly until a checkpoint's ``_metadata`` is on
  disk (a Python function cannot wait for a checkpoint: the checkpoint waits for it).
  Restarts: fixed-delay, 0 ms, 3 attempts (other workloads: none, a failure fails the
  run). ``exact`` compares every key's last sum the sink saw (the latest attempt that
  emitted a key wins) with the expected one.
* w4 stores an ASCII ``str`` of ``value_bytes`` characters per key (see
  ``WithPayload``); the checkpoint reported is the first completed one triggered after
  the map behind the source saw its last record, hence the first that surely covers
  every record; its size is the REST API's ``state_size`` (full, not incremental).
* w4r (W4 on RocksDB, ``w4r_records``) runs on ``EmbeddedRocksDBStateBackend`` with
  incremental checkpoints (``state.backend.type: rocksdb``,
  ``execution.checkpointing.incremental: true``, RocksDB's files under the work dir). The
  Python map chained to the ``NumberSequenceSource`` paces the updates by sleeping (chained,
  so the source's barrier never waits behind records in flight); each checkpoint's
  ``checkpointed_size`` (what it uploaded) and ``state_size`` (the whole state it covers)
  come from the REST API.
* w6 (checkpoints under backpressure, ``w6_records``): a Python map chained to the
  ``NumberSequenceSource`` paces the records to the source rate on a schedule that never
  forgives (behind it, the map emits as fast as Flink takes records), W1's running sum,
  and a Python sink chained behind it that sleeps to hold half the rate. Each checkpoint's
  ``checkpoint_type`` and ``persisted_data`` (the in-flight bytes an unaligned checkpoint
  wrote) come from the REST API; the final one, seen only in the log, has neither, and
  falls outside the measured span anyway (it comes after the sources ended).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import sysconfig
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyflink.common import Configuration, Duration, Time, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import (
    CheckpointingMode,
    KeyedProcessFunction,
    KeySelector,
    MapFunction,
    ProcessFunction,
    ReduceFunction,
    RuntimeContext,
    StreamExecutionEnvironment,
)
from pyflink.datastream.connectors.base import Sink, Source
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.state import ValueStateDescriptor
from pyflink.datastream.window import TumblingEventTimeWindows
from pyflink.java_gateway import get_gateway
from w4r_records import Pacer, PhaseNotes, Phases, W4rRecords
from w4r_records import figures as w4r_figures
from w5_events import OUT_OF_ORDERNESS_MS, WINDOW_MS, ResultCheck, W5Events, WatermarkPasses
from w5_events import figures as w5_figures
from w6_records import Notes, W6Plan, unaligned_of
from w6_records import figures as w6_figures

log = logging.getLogger("pyflink_runner")

SYSTEM = "pyflink"
FAILURE_MARKER = "failure.marker"
POLL_INTERVAL_S = 0.25
W5_WATERMARK_INTERVAL_MS = 200


# --------------------------------------------------------------------------------------
# Helpers shared by the driver and the Python functions (which run in Flink's workers)
# --------------------------------------------------------------------------------------


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as JSON atomically, so the runner never reads half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def open_instance() -> tuple[str, float]:
    """A name for a function instance's file, and when it opened (orders the attempts).

    Not the subtask index and attempt number: PyFlink 2.3's thread-mode RuntimeContext
    cannot give them (it calls ``getIndexOfThisSubtask`` on Flink 2's Java
    RuntimeContext, which moved it to ``getTaskInfo()``).
    """
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}", time.time()


def completed_checkpoint_on_disk(checkpoint_dir: str) -> bool:
    """Whether a checkpoint completed: its ``_metadata`` is the last file Flink writes."""
    return bool(glob.glob(os.path.join(checkpoint_dir, "*", "chk-*", "_metadata")))


# --------------------------------------------------------------------------------------
# The job's Python functions
# --------------------------------------------------------------------------------------


class ToKeyValue(MapFunction):
    """``i -> (i % keys, i)``: the record a keyed running sum works on."""

    def __init__(self, keys: int) -> None:
        self.keys = keys

    def map(self, value: int) -> tuple[int, int]:
        return value % self.keys, value


class ThrottledToKeyValue(MapFunction):
    """``i -> (i % keys, i)``, slowed to ``rate`` records/s until a checkpoint completed.

    w2 must fail after a checkpoint completed. A Python function cannot wait for one
    (the checkpoint waits for the Python function to drain its bundle), so the first
    attempt reads slowly until a ``_metadata`` file shows up, then at full speed.
    """

    def __init__(self, keys: int, rate: float, checkpoint_dir: str, work_dir: str) -> None:
        self.keys = keys
        self.rate = rate
        self.checkpoint_dir = checkpoint_dir
        self.work_dir = work_dir
        self.throttled = True
        self.count = 0
        self.started = 0.0
        self.next_check = 0.0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.throttled = not os.path.exists(os.path.join(self.work_dir, FAILURE_MARKER))
        self.started = time.monotonic()
        self.next_check = self.started

    def map(self, value: int) -> tuple[int, int]:
        if self.throttled:
            self.count += 1
            now = time.monotonic()
            if now >= self.next_check:
                self.next_check = now + 0.1
                if completed_checkpoint_on_disk(self.checkpoint_dir):
                    self.throttled = False
            ahead = self.count / self.rate - (now - self.started)
            if self.throttled and ahead > 0.005:
                time.sleep(ahead)
        return value % self.keys, value


class PacedStamp(MapFunction):
    """``i -> (i % keys, i, time.time())`` emitted at ``rate`` records/s (w3 ``throttle``).

    Sleeps until record ``i``'s slot (the first record's time plus ``i / rate``), then
    stamps it: this map plays the part of a Python source emitting at a fixed rate.
    """

    def __init__(self, keys: int, rate: float) -> None:
        self.keys = keys
        self.rate = rate
        self.started: float | None = None

    def map(self, value: int) -> tuple[int, int, float]:
        if self.started is None:
            self.started = time.time() - value / self.rate
        delay = self.started + value / self.rate - time.time()
        if delay > 0:
            time.sleep(delay)
        return value % self.keys, value, time.time()


class FromStampedRow(MapFunction):
    """``Row(i, emitted) -> (i % keys, i, emitted as time.time())`` (w3 ``sql``).

    ``emitted`` is ``CURRENT_ROW_TIMESTAMP()``, taken in the JVM as the source emits the
    record (millisecond precision).
    """

    def __init__(self, keys: int) -> None:
        self.keys = keys

    def map(self, row: Any) -> tuple[int, int, float]:
        i, emitted = row[0], row[1]
        if hasattr(emitted, "seconds"):  # process mode: PyFlink's Instant
            return i % self.keys, i, emitted.seconds + emitted.nanos / 1e9
        return i % self.keys, i, emitted.toEpochMilli() / 1000  # thread mode: Java's Instant


class Stamp(MapFunction):
    """``i -> (i % keys, i, time.time())``: the emission time of a record (w3 ``datagen``)."""

    def __init__(self, keys: int) -> None:
        self.keys = keys

    def map(self, value: int) -> tuple[int, int, float]:
        return value % self.keys, value, time.time()


class WithPayload(MapFunction):
    """``i -> (i, an ASCII str of value_bytes characters)``: one distinct key per record (w4).

    A ``str`` rather than ``bytes``: in thread mode PyFlink 2.3 hands a ``bytes`` value
    to a ``PRIMITIVE_ARRAY(BYTE)`` state as an ``Object[]``, and the checkpoint fails
    with a ClassCastException. Flink writes an ASCII ``str`` as one byte per character.

    Notes when it saw its last record: a checkpoint triggered after that (on every
    subtask) has every record before its barrier, i.e. covers the whole state.
    """

    def __init__(self, work_dir: str, value_bytes: int) -> None:
        self.work_dir = work_dir
        self.value_bytes = value_bytes
        self.last = 0.0
        self.count = 0
        self.instance = ""
        self.opened = 0.0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.instance, self.opened = open_instance()

    def map(self, value: int) -> tuple[int, str]:
        self.last = time.time()
        self.count += 1
        return value, f"{value}|".ljust(self.value_bytes, "x")[: self.value_bytes]

    def close(self) -> None:
        write_json(
            os.path.join(self.work_dir, f"source-{self.instance}.json"),
            {"opened": self.opened, "count": self.count, "last": self.last},
        )


class W4rSource(MapFunction):
    """W4r's source side: number ``n`` -> ``(key, p, value)`` of record ``p`` =
    ``strided(n)``; the updates paced to the run's rate (``w4r_records.Pacer``)."""

    def __init__(self, records: W4rRecords) -> None:
        self.records = records
        self.pacer: Pacer | None = None

    def open(self, runtime_context: RuntimeContext) -> None:
        self.pacer = Pacer(self.records, time.monotonic)

    def map(self, value: int) -> tuple[int, int, str]:
        records = self.records
        p = records.strided(value)
        assert self.pacer is not None
        wait = self.pacer.wait_s(p)
        if wait > 0.001:  # a sleep per record would cost more than the record
            time.sleep(wait)
        return records.key(p), p, records.text_value(p)


class W4rStore(KeyedProcessFunction):
    """W4r's keyed function: the key's value in a ``ValueState``, noting the phases."""

    def __init__(self, work_dir: str, keys: int) -> None:
        self.work_dir = work_dir
        self.keys = keys
        self.state: Any = None
        self.notes = PhaseNotes(keys)
        self.instance = ""
        self.opened = 0.0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(ValueStateDescriptor("value", Types.STRING()))
        self.notes = PhaseNotes(self.keys)
        self.instance, self.opened = open_instance()

    def process_element(self, value: tuple, ctx: KeyedProcessFunction.Context) -> tuple:  # type: ignore[override]
        self.state.update(value[2])
        self.notes.observe(value[1], time.time())
        return ()

    def close(self) -> None:
        write_json(
            os.path.join(self.work_dir, f"phases-{self.instance}.json"),
            {"opened": self.opened, **self.notes.to_json()},
        )


class FirstField(KeySelector):
    """The key of a ``(key, ...)`` tuple."""

    def get_key(self, value: tuple) -> int:
        return value[0]


class RunningSum(KeyedProcessFunction):
    """Keyed running sum in a ``ValueState``; emits ``(key, sum, *rest)`` per record.

    With ``fail_at`` (w2) it raises once, on the first attempt, at the record with that
    value, noting the time in the marker file; on the attempt after the restore it notes
    when it processes its first record, which is what ``recovery_s`` measures.
    """

    def __init__(self, work_dir: str, fail_at: int | None = None, checkpoint_dir: str = "") -> None:
        self.work_dir = work_dir
        self.fail_at = fail_at
        self.checkpoint_dir = checkpoint_dir
        self.state: Any = None
        self.restored = False
        self.instance = ""
        self.opened = 0.0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(ValueStateDescriptor("sum", Types.LONG()))
        self.instance, self.opened = open_instance()
        self.restored = self.fail_at is not None and os.path.exists(
            os.path.join(self.work_dir, FAILURE_MARKER)
        )

    def process_element(self, value: tuple, ctx: KeyedProcessFunction.Context):  # type: ignore[override]
        if self.fail_at is not None:
            self._failure_bookkeeping(value[1])
        total = (self.state.value() or 0) + value[1]
        self.state.update(total)
        yield (value[0], total, *value[2:])

    def _failure_bookkeeping(self, value: int) -> None:
        if self.restored:
            self.restored = False  # only the first record after the restore counts
            write_json(
                os.path.join(self.work_dir, f"resume-{self.instance}.json"),
                {"opened": self.opened, "t": time.time()},
            )
        elif value == self.fail_at:
            marker = os.path.join(self.work_dir, FAILURE_MARKER)
            if not os.path.exists(marker):
                write_json(
                    marker,
                    {
                        "t": time.time(),
                        "checkpoint_completed": completed_checkpoint_on_disk(self.checkpoint_dir),
                    },
                )
                raise RuntimeError(f"injected failure at record {value}")


class StoreValue(KeyedProcessFunction):
    """Keeps each key's value in a ``ValueState`` and counts the records (w4); emits nothing."""

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir
        self.state: Any = None
        self.count = 0
        self.last = 0.0
        self.instance = ""
        self.opened = 0.0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(ValueStateDescriptor("value", Types.STRING()))
        self.instance, self.opened = open_instance()

    def process_element(self, value: tuple, ctx: KeyedProcessFunction.Context) -> tuple:  # type: ignore[override]
        self.state.update(value[1])
        self.count += 1
        self.last = time.time()
        return ()

    def close(self) -> None:
        write_json(
            os.path.join(self.work_dir, f"keyed-{self.instance}.json"),
            {"opened": self.opened, "count": self.count, "last": self.last},
        )


class TimingSink(ProcessFunction):
    """Notes the wall-clock time of its first and last record (w1); emits nothing."""

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir
        self.first: float | None = None
        self.last = 0.0
        self.count = 0
        self.instance = ""
        self.opened = 0.0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.instance, self.opened = open_instance()

    def process_element(self, value: tuple, ctx: ProcessFunction.Context) -> tuple:  # type: ignore[override]
        now = time.time()
        if self.first is None:
            self.first = now
        self.last = now
        self.count += 1
        return ()

    def close(self) -> None:
        write_json(
            os.path.join(self.work_dir, f"timing-{self.instance}.json"),
            {"opened": self.opened, "first": self.first, "last": self.last, "count": self.count},
        )


class LastSumSink(ProcessFunction):
    """Keeps the last sum emitted per key and writes them at ``close()`` (w2); emits nothing."""

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir
        self.sums: dict[int, int] = {}
        self.instance = ""
        self.opened = 0.0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.instance, self.opened = open_instance()

    def process_element(self, value: tuple, ctx: ProcessFunction.Context) -> tuple:  # type: ignore[override]
        self.sums[value[0]] = value[1]
        return ()

    def close(self) -> None:
        write_json(
            os.path.join(self.work_dir, f"sums-{self.instance}.json"),
            {"opened": self.opened, "sums": self.sums},
        )


class LatencySink(ProcessFunction):
    """Notes ``time.time() - stamp`` of every record (w3); emits nothing."""

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir
        self.stamps: list[float] = []
        self.latencies: list[float] = []
        self.instance = ""
        self.opened = 0.0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.instance, self.opened = open_instance()

    def process_element(self, value: tuple, ctx: ProcessFunction.Context) -> tuple:  # type: ignore[override]
        now = time.time()
        self.stamps.append(value[2])
        self.latencies.append(now - value[2])
        return ()

    def close(self) -> None:
        write_json(
            os.path.join(self.work_dir, f"latency-{self.instance}.json"),
            {"opened": self.opened, "stamps": self.stamps, "latencies": self.latencies},
        )


class W5Records(MapFunction):
    """W5's source side: number ``n`` of the ``NumberSequenceSource`` -> record
    ``(key, value, timestamp)`` (``W5Events.strided``: the two source subtasks' event times
    advance together), noting when the first record was read and when the largest
    timestamp read passed each window's fire threshold (``WatermarkPasses``)."""

    def __init__(self, work_dir: str, events: W5Events) -> None:
        self.work_dir = work_dir
        self.events = events
        self.passes = WatermarkPasses(events)
        self.instance = ""
        self.opened = 0.0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.instance, self.opened = open_instance()

    def map(self, value: int) -> tuple[int, int, int]:
        events = self.events
        i = events.strided(value)
        timestamp = events.timestamp(i)
        passes = self.passes
        if passes.first is None:
            passes.first = time.time()
        if timestamp >= passes.next_threshold:
            passes.observe(timestamp, time.time())
        return i % events.keys, i, timestamp

    def close(self) -> None:
        write_json(
            os.path.join(self.work_dir, f"source-{self.instance}.json"),
            {"opened": self.opened, **self.passes.to_json()},
        )


class EventTimestamp(TimestampAssigner):
    """W5: the record's own timestamp, its third field."""

    def extract_timestamp(self, value: tuple, record_timestamp: int) -> int:  # type: ignore[override]
        return value[2]


class SumValues(ReduceFunction):
    """W5's window function: the values' sum; key and a timestamp of the window kept."""

    def reduce(self, value1: tuple, value2: tuple) -> tuple:  # type: ignore[override]
        return value1[0], value1[1] + value2[1], value1[2]


class W5Sink(ProcessFunction):
    """Checks every window result as it arrives (``ResultCheck``); emits nothing."""

    def __init__(self, work_dir: str, events: W5Events) -> None:
        self.work_dir = work_dir
        self.check = ResultCheck(events)
        self.instance = ""
        self.opened = 0.0

    def open(self, runtime_context: RuntimeContext) -> None:
        self.instance, self.opened = open_instance()

    def process_element(self, value: tuple, ctx: ProcessFunction.Context) -> tuple:  # type: ignore[override]
        self.check.add(value[0], value[1], value[2], int(time.time() * 1000))
        return ()

    def close(self) -> None:
        write_json(
            os.path.join(self.work_dir, f"results-{self.instance}.json"),
            {"opened": self.opened, **self.check.to_json()},
        )


class _W6Paced:
    """What W6's paced functions share: their plan, a pacer (the source's or the sink's),
    their notes, and the file the notes end in (``<prefix>-<instance>.json``)."""

    prefix = ""

    def __init__(self, work_dir: str, plan: W6Plan) -> None:
        self.work_dir = work_dir
        self.plan = plan
        self.pacer: Any = None
        self.notes = Notes()
        self.instance = ""
        self.opened = 0.0

    def _open(self, pacer: Any) -> None:
        self.pacer = pacer
        self.notes = Notes()
        self.instance, self.opened = open_instance()

    def _write_notes(self) -> None:
        write_json(
            os.path.join(self.work_dir, f"{self.prefix}-{self.instance}.json"),
            {"opened": self.opened, **self.notes.to_json()},
        )


class W6PacedSource(_W6Paced, MapFunction):
    """W6's source side: ``i -> (i % keys, i)``, paced to the subtask's share of the source
    rate (``w6_records``: the schedule never forgives, so behind it the map emits as fast as
    Flink takes records), noting its first and last record."""

    prefix = "source"

    def open(self, runtime_context: RuntimeContext) -> None:
        self._open(self.plan.source_pacer(time.monotonic))

    def map(self, value: int) -> tuple[int, int]:
        wait = self.pacer.wait_s(self.notes.count)
        if wait > 0.001:  # a sleep per record would cost more than the record
            time.sleep(wait)
        self.notes.observe(1, time.time())
        return value % self.plan.keys, value

    def close(self) -> None:
        self.notes.behind_s = self.pacer.behind_s(self.notes.count) if self.notes.count else 0.0
        self._write_notes()


class W6ThrottledSink(_W6Paced, ProcessFunction):
    """Discards records, holding its share of half the source rate (W6): sleeps once the
    records it saw are ahead of the rate; emits nothing."""

    prefix = "sink"

    def open(self, runtime_context: RuntimeContext) -> None:
        self._open(self.plan.sink_pacer(time.monotonic))

    def process_element(self, value: tuple, ctx: ProcessFunction.Context) -> tuple:  # type: ignore[override]
        self.pacer.start()
        self.notes.observe(1, time.time())
        wait = self.pacer.wait_s(self.notes.count)
        if wait > 0.001:
            time.sleep(wait)
        return ()

    def close(self) -> None:
        self._write_notes()


def w6_plan(args: argparse.Namespace) -> W6Plan:
    return W6Plan(args.rate, args.duration_s, args.parallelism, args.keys)


def w6_checkpoints(checkpoints: list[dict]) -> list[dict]:
    """Every completed checkpoint as ``w6_records.figures`` takes them: ``checkpoint_type``
    (``UNALIGNED_CHECKPOINT``) and ``persisted_data`` from the REST history (``None`` for one
    seen only in the log)."""
    return [
        {
            "id": c["id"],
            "trigger_ms": c.get("trigger_timestamp"),
            "duration_ms": c["end_to_end_duration"],
            "unaligned": unaligned_of(c),
            "persisted_bytes": c.get("persisted_data"),
        }
        for c in checkpoints
    ]


def network_buffers() -> dict[str, Any]:
    """Flink's network buffer defaults, which bound W6's backlog in flight: the buffer
    (memory segment) size and whether buffer debloating shrinks them. Flink 2 no longer
    exposes the buffers per channel and gate as options."""
    options = get_gateway().jvm.org.apache.flink.configuration.TaskManagerOptions
    found: dict[str, Any] = {}
    for name in ("MEMORY_SEGMENT_SIZE", "BUFFER_DEBLOAT_ENABLED"):
        try:
            option = getattr(options, name)
            found[option.key()] = str(option.defaultValue())
        except Exception as exc:  # noqa: BLE001 - an option renamed in another Flink version
            log.info("No TaskManagerOptions.%s here: %s", name, exc)
    return found


def w4r_records(args: argparse.Namespace) -> W4rRecords:
    return W4rRecords(args.records, args.value_bytes, args.update_fraction, args.update_s, args.parallelism)


def w4r_checkpoints(checkpoints: list[dict]) -> list[dict]:
    """The REST history's completed checkpoints as ``w4r_records.figures`` takes them (those
    only in the log, taken as the job ended, have no ``checkpointed_size``: left out)."""
    return [
        {
            "id": c["id"],
            "trigger_ms": c["trigger_timestamp"],
            "duration_ms": c["end_to_end_duration"],
            "uploaded_bytes": c["checkpointed_size"],
            "full_bytes": c["state_size"],
        }
        for c in checkpoints
        if c.get("checkpointed_size") is not None and c.get("trigger_timestamp") is not None
    ]


def w5_events(args: argparse.Namespace) -> W5Events:
    return W5Events(args.records, args.keys, args.per_event_second, args.parallelism)


# --------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------


@dataclass
class RestPoller:
    """Polls the mini-cluster's REST API for the job's checkpoint statistics.

    Keeps the last answer and every completed checkpoint seen in the (bounded) history,
    since the endpoint disappears with the job.
    """

    base: str
    job_id: str
    latest: dict | None = None
    completed: dict[int, dict] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def poll(self) -> None:
        """One poll; errors (the endpoint not up yet, or gone) are ignored."""
        with self._lock:
            url = f"{self.base}/jobs/{self.job_id}/checkpoints"
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    data = json.load(response)
            except (OSError, ValueError) as exc:
                log.debug("REST poll failed: %s", exc)
                return
            self.latest = data
            for entry in data.get("history") or []:
                if entry.get("status") == "COMPLETED" and not entry.get("is_savepoint"):
                    self.completed[int(entry["id"])] = entry

    def _loop(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            self.poll()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="rest-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


TRIGGERED = re.compile(r"Triggering checkpoint (\d+) .*@ (\d+) for job ([0-9a-f]+)")
COMPLETED = re.compile(
    r"Completed checkpoint (\d+) for job ([0-9a-f]+) \((\d+) bytes, "
    r"checkpointDuration=(\d+) ms"
)


def checkpoints_of(poller: RestPoller | None, log_dir: Path, job_id: str) -> list[dict]:
    """Every completed checkpoint of the job, oldest first, as REST history entries.

    The REST answers give most of them; the JobManager's log gives those completed
    after the last poll (above all the final one, taken as the job ends). A checkpoint
    found only in the log has ``"from": "log"`` and no ``checkpointed_size``.
    """
    found: dict[int, dict] = {}
    triggered: dict[int, int] = {}
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if (m := TRIGGERED.search(line)) and m.group(3) == job_id:
                triggered[int(m.group(1))] = int(m.group(2))
            elif (m := COMPLETED.search(line)) and m.group(2) == job_id:
                found[int(m.group(1))] = {
                    "id": int(m.group(1)),
                    "from": "log",
                    "state_size": int(m.group(3)),
                    "checkpointed_size": None,
                    "end_to_end_duration": int(m.group(4)),
                }
    for checkpoint_id, entry in found.items():
        entry["trigger_timestamp"] = triggered.get(checkpoint_id)
    if poller is not None:
        for checkpoint_id, entry in poller.completed.items():
            found[checkpoint_id] = {**entry, "from": "rest"}
    return [found[k] for k in sorted(found)]


def checkpoint_figures(checkpoints: list[dict], enabled: bool) -> dict:
    """``checkpoints_completed`` and the end-to-end duration p50/max over all of them."""
    if not enabled:
        return {"checkpoints_completed": 0, "checkpoint_p50_ms": None, "checkpoint_max_ms": None}
    durations = sorted(float(c["end_to_end_duration"]) for c in checkpoints)
    return {
        "checkpoints_completed": len(durations),
        "checkpoint_p50_ms": percentile(durations, 50) if durations else None,
        "checkpoint_max_ms": durations[-1] if durations else None,
        "checkpoints_from_log": sum(1 for c in checkpoints if c["from"] == "log"),
    }


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    index = min(len(sorted_values) - 1, max(0, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


class RunFailed(Exception):
    """A failure already put in one line (``<Type>: <message>``) while the JVM was up."""


def process_age_s() -> float:
    """How long this process has been running (so far: starting Python, importing PyFlink)."""
    fields = _stat(os.getpid())
    if fields is None:
        return 0.0
    with open("/proc/uptime") as f:
        uptime_s = float(f.read().split()[0])
    return max(0.0, uptime_s - int(fields[19]) / os.sysconf("SC_CLK_TCK"))


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the mini-cluster's REST endpoint."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe(exc: BaseException) -> str:
    """One line: the exception's type and message, or the root cause of a Java error.

    PyFlink wraps Java failures; their message holds the whole Java trace, whose last
    ``Caused by:`` line is the actual reason (for a Python error, the worker's trace
    follows it, ending in the Python exception's own line).
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [i for i, line in enumerate(lines) if line.startswith("Caused by: ")]
    message = lines[0] if lines else ""
    if causes:
        message = lines[causes[-1]][len("Caused by: ") :]
        python_error = [
            line
            for line in lines[causes[-1] :]
            if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", line)
            and not line.startswith(("java.", "org.", "Caused by"))
        ]
        if python_error:
            message = f"{message.split(':')[0]}: {python_error[-1]}"
    message = " ".join(message.split())
    if len(message) > 600:
        message = message[:597] + "..."
    return f"{type(exc).__name__}: {message}"


_SEEN: dict[int, str] = {}
"""Every process seen below the runner (pid -> start time): the JVM and its workers.

Kept because a worker outlives the JVM as an orphan if the JVM dies first (PyFlink's
JVM exits by itself when it loses the runner, e.g. on Ctrl-C); the start time tells a
reused pid from ours.
"""


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def note_descendants() -> None:
    """Adds the processes now below the runner to ``_SEEN``."""
    children: dict[int, list[int]] = {}
    for path in glob.glob("/proc/[0-9]*/stat"):
        pid = int(path.split("/")[2])
        if (fields := _stat(pid)) is not None:
            children.setdefault(int(fields[1]), []).append(pid)
    todo = [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            if (fields := _stat(child)) is not None:
                _SEEN.setdefault(child, fields[19])
            todo.append(child)


def alive(pid: int) -> bool:
    """Whether our process ``pid`` still runs (not a zombie, not a reused pid)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == _SEEN.get(pid)


def reap() -> None:
    """Collect exited children so they do not linger as zombies."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def end_processes(pids: list[int], grace_s: float = 10.0) -> None:
    """SIGTERM the given processes (ours), then SIGKILL whatever outlives ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        live = [p for p in pids if alive(p)]
        if not live:
            break
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(alive(p) for p in live):
            reap()
            time.sleep(0.05)
    reap()
    if still := [p for p in pids if alive(p)]:
        log.warning("Processes still alive after SIGKILL: %s", still)


def stop_jvm() -> None:
    """Ends the gateway JVM and every process it started (Python workers), by pid.

    PyFlink's JVM would exit by itself once this process is gone (it watches its stdin),
    but the runner must leave nothing behind when it returns, also after an error.
    """
    note_descendants()
    # Disconnect py4j first, or its finalizers keep calling the dying JVM (and log errors).
    with contextlib.suppress(Exception):
        get_gateway().shutdown()
    if ours := [pid for pid in _SEEN if alive(pid)]:
        log.info("Stopping the JVM and its workers: %s", ours)
        end_processes(ours)


def make_env(args: argparse.Namespace, work: Path, rest_port: int) -> StreamExecutionEnvironment:
    """The execution environment: a local mini-cluster configured for the benchmark."""
    config = Configuration()
    thread_mode = args.mode in ("thread", "unaligned")
    config.set_string("python.execution-mode", "thread" if thread_mode else "process")
    # The workers must run this venv's Python, not whatever ``python`` is on the PATH.
    config.set_string("python.executable", sys.executable)
    config.set_string("python.client.executable", sys.executable)
    if thread_mode:
        # The interpreter embedded in the JVM starts from the base Python, without this venv's
        # site-packages (where pemja and pyflink are): add them to its sys.path.
        config.set_string("python.pythonpath", sysconfig.get_paths()["purelib"])
    config.set_string("rest.address", "127.0.0.1")
    config.set_string("rest.bind-address", "127.0.0.1")
    config.set_string("rest.port", str(rest_port))
    config.set_string("rest.bind-port", str(rest_port))
    config.set_string("parallelism.default", str(args.parallelism))
    config.set_string("taskmanager.numberOfTaskSlots", str(args.parallelism))
    # Flink's scratch files (its RPC system's jar, 24 MB, the mini-cluster's blobs) go to
    # the work dir: the JVM is ended by a signal, and would leave them in /tmp.
    config.set_string("io.tmp.dirs", str(work / "tmp"))
    config.set_string("execution.checkpointing.storage", "filesystem")
    config.set_string("execution.checkpointing.dir", (work / "checkpoints").as_uri())
    # The REST API caches checkpoint statistics for web.refresh-interval (3 s) by default
    # and keeps the last 10 in its history: fresh answers and a long history miss none.
    config.set_string("rest.cache.checkpoint-statistics.timeout", "100 ms")
    config.set_string("web.checkpoints.history", "1000")
    if args.workload == "w4r":  # EmbeddedRocksDBStateBackend, incremental checkpoints
        config.set_string("state.backend.type", "rocksdb")
        config.set_string("execution.checkpointing.incremental", "true")
        config.set_string("state.backend.rocksdb.localdir", str(work / "rocksdb"))
    if args.workload == "w5":  # Flink's default, spelled out: W5's latency counts it
        config.set_string("pipeline.auto-watermark-interval", f"{W5_WATERMARK_INTERVAL_MS} ms")
    if args.workload == "w2":
        config.set_string("restart-strategy.type", "fixed-delay")
        config.set_string("restart-strategy.fixed-delay.attempts", "3")
        config.set_string("restart-strategy.fixed-delay.delay", "0 ms")
    else:  # a failure is a failed run, not a silent restart loop
        config.set_string("restart-strategy.type", "none")
    for key, value in python_options(args).items():
        if value is not None:
            config.set_string(key, str(value))
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(args.parallelism)
    if args.buffer_timeout_ms is not None:
        env.set_buffer_timeout(args.buffer_timeout_ms)
    if args.checkpoint_interval_ms > 0:
        env.enable_checkpointing(args.checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
        if args.mode == "unaligned":
            checkpoint_config = env.get_checkpoint_config()
            checkpoint_config.enable_unaligned_checkpoints()
            checkpoint_config.set_aligned_checkpoint_timeout(Duration.of_millis(0))
    return env


def python_options(args: argparse.Namespace) -> dict[str, int | None]:
    """PyFlink's tuning options the command line sets (``None``: Flink's default)."""
    return {
        "python.fn-execution.bundle.size": args.bundle_size,
        "python.fn-execution.bundle.time": args.bundle_time_ms,
        "python.state.cache-size": args.state_cache_size,
    }


def flink_default(key: str) -> Any:
    """The default of one of PyFlink's options, as this Flink version defines it."""
    options = get_gateway().jvm.org.apache.flink.python.PythonOptions
    for name in ("MAX_BUNDLE_SIZE", "MAX_BUNDLE_TIME_MILLS", "STATE_CACHE_SIZE"):
        option = getattr(options, name)
        if option.key() == key:
            return option.defaultValue()
    return None


def discarding_sink() -> Sink:
    """Flink's own ``DiscardingSink`` (Java), the end of every job."""
    j_sink = get_gateway().jvm.org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink()
    return Sink(j_sink)


def rate_limited_source(count: int, rate: float) -> Source:
    """Flink's ``DataGeneratorSource`` emitting ``0..count-1`` at ``rate`` records/s in all."""
    jvm = get_gateway().jvm
    long_type = Types.LONG().get_java_type_info()
    elements = (
        jvm.java.util.stream.LongStream.range(0, count)
        .boxed()
        .collect(jvm.java.util.stream.Collectors.toList())
    )
    function = jvm.org.apache.flink.connector.datagen.functions.IndexLookupGeneratorFunction(
        long_type, elements
    )
    strategy = jvm.org.apache.flink.api.connector.source.util.ratelimit.RateLimiterStrategy.perSecond(
        float(rate)
    )
    return Source(
        jvm.org.apache.flink.connector.datagen.source.DataGeneratorSource(
            function, count, strategy, long_type
        )
    )


def build(env: StreamExecutionEnvironment, args: argparse.Namespace, work: Path) -> None:
    """Adds the workload's job to ``env``."""
    out = str(work / "out")
    pair = Types.TUPLE([Types.LONG(), Types.LONG()])
    triple = Types.TUPLE([Types.LONG(), Types.LONG(), Types.DOUBLE()])
    checkpoint_dir = str(work / "checkpoints")
    no_watermarks = WatermarkStrategy.no_watermarks()

    if args.workload == "w1":
        stream = env.from_source(NumberSequenceSource(0, args.records - 1), no_watermarks, "numbers")
        (
            stream.map(ToKeyValue(args.keys), output_type=pair)
            .name("to-key-value")
            .key_by(FirstField(), key_type=Types.LONG())
            .process(RunningSum(out), output_type=pair)
            .name("running-sum")
            .process(TimingSink(out))
            .name("timing-sink")
            .sink_to(discarding_sink())
            .name("discard")
        )
    elif args.workload == "w2":
        # One reader, so that the values arrive in order and record N // 2 is halfway.
        stream = env.from_source(NumberSequenceSource(0, args.records - 1), no_watermarks, "numbers")
        interval_s = max(args.checkpoint_interval_ms, 1) / 1000
        rate = max(1000.0, (args.records // 2) / (3 * interval_s))
        (
            stream.set_parallelism(1)
            .map(ThrottledToKeyValue(args.keys, rate, checkpoint_dir, out), output_type=pair)
            .set_parallelism(1)
            .name("to-key-value")
            .key_by(FirstField(), key_type=Types.LONG())
            .process(
                RunningSum(out, fail_at=args.records // 2, checkpoint_dir=checkpoint_dir), output_type=pair
            )
            .name("running-sum")
            .process(LastSumSink(out))
            .name("last-sum-sink")
            .sink_to(discarding_sink())
            .name("discard")
        )
    elif args.workload == "w3":
        count = int(args.rate * args.duration_s)
        if args.w3_source == "sql":
            from pyflink.table import StreamTableEnvironment

            # Flink SQL's own datagen table emits its rows-per-second in one burst a second;
            # the DataStream DataGeneratorSource paces them evenly. A SQL projection chained
            # to it stamps each record in the JVM as it is emitted. One reader: each reader's
            # rate limiter lets out the permits it saved while starting in one burst, and one
            # burst falls in the first second, which is not measured. (The planner gives its
            # operators the environment's parallelism at translation.)
            t_env = StreamTableEnvironment.create(env)
            env.set_parallelism(1)
            t_env.create_temporary_view(
                "numbers",
                env.from_source(rate_limited_source(count, args.rate), no_watermarks, "rate-source"),
            )
            rows = t_env.sql_query("SELECT f0 AS i, CURRENT_ROW_TIMESTAMP() AS emitted FROM numbers")
            stamped = (
                t_env.to_data_stream(rows)
                .map(FromStampedRow(args.keys), output_type=triple)
                .name("to-key-value")
            )
            env.set_parallelism(args.parallelism)
        elif args.w3_source == "datagen":
            stream = env.from_source(rate_limited_source(count, args.rate), no_watermarks, "rate-source")
            stamped = stream.map(Stamp(args.keys), output_type=triple).name("stamp")
        else:
            stream = env.from_source(NumberSequenceSource(0, count - 1), no_watermarks, "numbers")
            stamped = (
                stream.set_parallelism(1)
                .map(PacedStamp(args.keys, args.rate), output_type=triple)
                .set_parallelism(1)
                .name("paced-stamp")
            )
        (
            stamped.key_by(FirstField(), key_type=Types.LONG())
            .process(RunningSum(out), output_type=triple)
            .name("running-sum")
            .process(LatencySink(out))
            .name("latency-sink")
            .sink_to(discarding_sink())
            .name("discard")
        )
    elif args.workload == "w4":
        payload = Types.TUPLE([Types.LONG(), Types.STRING()])
        stream = env.from_source(NumberSequenceSource(0, args.records - 1), no_watermarks, "numbers")
        (
            stream.map(WithPayload(out, args.value_bytes), output_type=payload)
            .name("with-payload")
            .key_by(FirstField(), key_type=Types.LONG())
            .process(StoreValue(out))
            .name("store-value")
            .sink_to(discarding_sink())
            .name("discard")
        )
    elif args.workload == "w4r":
        records = w4r_records(args)
        env.add_python_file(str(Path(__file__).resolve().parent / "w4r_records.py"))
        keyed = Types.TUPLE([Types.LONG(), Types.LONG(), Types.STRING()])
        stream = env.from_source(NumberSequenceSource(0, records.records - 1), no_watermarks, "numbers")
        (
            stream.map(W4rSource(records), output_type=keyed)
            .name("w4r-records")
            .key_by(FirstField(), key_type=Types.LONG())
            .process(W4rStore(out, records.keys))
            .name("store-value")
            .sink_to(discarding_sink())
            .name("discard")
        )
    elif args.workload == "w5":
        # W5: Python map to events, Flink's bounded out-of-orderness watermarks with a
        # Python timestamp assigner, a keyed 1 s tumbling event-time window with a Python
        # reduce, and a checking sink. The events module goes to the Python workers.
        events = w5_events(args)
        env.add_python_file(str(Path(__file__).resolve().parent / "w5_events.py"))
        record = Types.TUPLE([Types.LONG(), Types.LONG(), Types.LONG()])
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(
            Duration.of_millis(OUT_OF_ORDERNESS_MS)
        ).with_timestamp_assigner(EventTimestamp())
        stream = env.from_source(NumberSequenceSource(0, events.records - 1), no_watermarks, "numbers")
        (
            stream.map(W5Records(out, events), output_type=record)
            .name("to-events")
            .assign_timestamps_and_watermarks(strategy)
            .key_by(FirstField(), key_type=Types.LONG())
            .window(TumblingEventTimeWindows.of(Time.milliseconds(WINDOW_MS)))
            .reduce(SumValues(), output_type=record)
            .name("window-sum")
            .process(W5Sink(out, events))
            .name("check-sink")
            .sink_to(discarding_sink())
            .name("discard")
        )
    elif args.workload == "w6":
        # W6: a pacing Python map chained to the source, W1's running sum, a throttled
        # Python sink chained behind it. The pacing module goes to the Python workers.
        plan = w6_plan(args)
        env.add_python_file(str(Path(__file__).resolve().parent / "w6_records.py"))
        stream = env.from_source(NumberSequenceSource(0, plan.records - 1), no_watermarks, "numbers")
        (
            stream.map(W6PacedSource(out, plan), output_type=pair)
            .name("paced-source")
            .key_by(FirstField(), key_type=Types.LONG())
            .process(RunningSum(out), output_type=pair)
            .name("running-sum")
            .process(W6ThrottledSink(out, plan))
            .name("throttled-sink")
            .sink_to(discarding_sink())
            .name("discard")
        )
    else:
        raise ValueError(f"unknown workload '{args.workload}'")


def read_files(out: Path, prefix: str) -> list[dict]:
    """The files ``<prefix>-<instance>.json`` of the function instances, in opening order."""
    found = [json.loads(path.read_text()) for path in out.glob(f"{prefix}-*.json")]
    return sorted(found, key=lambda d: d.get("opened", 0.0))


def figures_of(args: argparse.Namespace, work: Path, checkpoints: list[dict], process_started: float) -> dict:
    """The workload's figures, from the files the functions wrote and the checkpoints.

    ``process_started`` is the runner's start (``time.time()``), for ``startup_s``.
    """
    out = work / "out"
    enabled = args.checkpoint_interval_ms > 0
    if args.workload == "w1":
        timings = [t for t in read_files(out, "timing") if t["first"] is not None]
        seen = sum(t["count"] for t in timings)
        if seen != args.records:
            raise RuntimeError(f"the sink saw {seen} records, expected {args.records}")
        span = max(t["last"] for t in timings) - min(t["first"] for t in timings)
        return {
            "records": args.records,
            "records_per_s": round(args.records / span, 1) if span > 0 else None,
            "first_to_last_s": round(span, 3),
            "startup_s": round(min(t["first"] for t in timings) - process_started, 3),
            **checkpoint_figures(checkpoints, enabled),
        }

    if args.workload == "w2":
        final: dict[int, int] = {}
        for part in read_files(out, "sums"):  # the last attempt that emitted a key wins
            final.update({int(k): v for k, v in part["sums"].items()})
        expected = [0] * args.keys
        for i in range(args.records):
            expected[i % args.keys] += i
        wrong = sum(1 for k in range(args.keys) if final.get(k) != expected[k])
        marker = out / FAILURE_MARKER
        if not marker.exists():
            raise RuntimeError("the injected failure never happened")
        raised = json.loads(marker.read_text())
        resumes = read_files(out, "resume")
        return {
            "exact": wrong == 0,
            "wrong_keys": wrong,
            "records": args.records,
            "recovery_s": round(min(r["t"] for r in resumes) - raised["t"], 3) if resumes else None,
            "checkpoint_before_failure": raised["checkpoint_completed"],
            **checkpoint_figures(checkpoints, enabled),
        }

    if args.workload == "w3":
        stamps: list[float] = []
        latencies: list[float] = []
        for part in read_files(out, "latency"):
            stamps.extend(part["stamps"])
            latencies.extend(part["latencies"])
        if len(stamps) != int(args.rate * args.duration_s):
            raise RuntimeError(
                f"the sink saw {len(stamps)} records, expected {int(args.rate * args.duration_s)}"
            )
        warm_up_end = min(stamps) + 1.0
        kept = sorted(lat for s, lat in zip(stamps, latencies, strict=True) if s >= warm_up_end)
        if not kept:
            raise RuntimeError("no records after the first second")
        return {
            "records": len(kept),
            "records_total": len(stamps),
            "latency_p50_ms": round(percentile(kept, 50) * 1000, 2),
            "latency_p99_ms": round(percentile(kept, 99) * 1000, 2),
            "latency_max_ms": round(kept[-1] * 1000, 2),
            "rate": args.rate,
            "duration_s": args.duration_s,
            "emit_span_s": round(max(stamps) - min(stamps), 3),
            "w3_source": args.w3_source,
            **checkpoint_figures(checkpoints, enabled),
        }

    if args.workload == "w4":
        seen = sum(p["count"] for p in read_files(out, "keyed"))
        if seen != args.records:
            raise RuntimeError(f"the keyed function saw {seen} records, expected {args.records}")
        all_read_ms = max(p["last"] for p in read_files(out, "source")) * 1000
        covering = [
            c
            for c in checkpoints
            if c["trigger_timestamp"] is not None and c["trigger_timestamp"] >= all_read_ms
        ]
        if not covering:
            raise RuntimeError("no completed checkpoint was triggered after the last record")
        first = covering[0]
        return {
            "keys": args.records,
            "value_bytes": args.value_bytes,
            "checkpoint_id": first["id"],
            "checkpoint_duration_ms": first["end_to_end_duration"],
            "checkpoint_size_bytes": first["state_size"],
            "checkpointed_size_bytes": first.get("checkpointed_size"),
            "checkpoint_figures_from": first["from"],
            "checkpoints_completed": len(checkpoints),
        }

    if args.workload == "w4r":
        phases = Phases.merge(read_files(out, "phases"))
        return {
            **w4r_figures(
                w4r_records(args), phases, w4r_checkpoints(checkpoints), args.checkpoint_interval_ms
            ),
            "state_backend": "EmbeddedRocksDBStateBackend, incremental",
        }

    if args.workload == "w5":
        return {
            **w5_figures(w5_events(args), read_files(out, "source"), read_files(out, "results")),
            "auto_watermark_interval_ms": W5_WATERMARK_INTERVAL_MS,
            **checkpoint_figures(checkpoints, enabled),
        }

    if args.workload == "w6":
        return {
            **w6_figures(
                w6_plan(args), read_files(out, "source"), read_files(out, "sink"), w6_checkpoints(checkpoints)
            ),
            "unaligned_enabled": args.mode == "unaligned",
            "network_buffers": network_buffers(),
        }

    raise ValueError(f"unknown workload '{args.workload}'")


def run(args: argparse.Namespace) -> dict:
    """Runs the workload once; returns its figures. Leaves no process behind."""
    age = process_age_s()  # wall_s counts starting Python and importing PyFlink too
    started, process_started = time.monotonic() - age, time.time() - age
    work = Path(args.work_dir).resolve()
    (work / "out").mkdir(parents=True, exist_ok=True)
    (work / "tmp").mkdir(exist_ok=True)
    if args.workload in ("w3", "w4", "w4r", "w6") and args.checkpoint_interval_ms <= 0:
        raise ValueError(f"{args.workload} needs checkpoints (--checkpoint-interval-ms > 0)")
    # Flink's own logs go to the work dir (not into the venv), where the runner reads them.
    log_dir = work / "flink-log"
    os.environ["FLINK_LOG_DIR"] = str(log_dir)
    os.environ["FLINK_IDENT_STRING"] = "bench"
    # In a local mini-cluster PyFlink runs process mode's workers in "loopback": as threads
    # of the client (this process, one GIL for every subtask), unless told otherwise.
    if args.mode in ("process", "loopback"):
        os.environ["_python_worker_execution_mode"] = args.mode

    client = None
    poller: RestPoller | None = None
    try:
        get_gateway()  # starts the JVM that runs the mini-cluster
        note_descendants()
        rest_port = free_port()
        env = make_env(args, work, rest_port)
        build(env, args, work)
        buffer_timeout = env.get_buffer_timeout()
        client = env.execute_async(f"bench-{args.workload}-{args.mode}")
        job_id = str(client.get_job_id())
        log.info(
            "Submitted job %s (%s, %s mode); REST on 127.0.0.1:%d",
            job_id,
            args.workload,
            args.mode,
            rest_port,
        )
        poller = RestPoller(f"http://127.0.0.1:{rest_port}", job_id)
        poller.start()
        result = client.get_job_execution_result()
        deadline = started + args.timeout_s
        next_note = 0.0
        while not result.done():
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"the job did not finish within {args.timeout_s} s")
            if now > next_note:  # the Python workers come and go with the tasks
                note_descendants()
                next_note = now + 1.0
            time.sleep(0.05)
        result.result()  # raises if the job failed
        wall_s = time.monotonic() - started
        poller.stop()
        figures = figures_of(args, work, checkpoints_of(poller, log_dir, job_id), process_started)
        settings = {
            key: (flink_default(key) if value is None else value)
            for key, value in python_options(args).items()
        }
        return {
            **figures,
            "wall_s": round(wall_s, 3),
            "parallelism": args.parallelism,
            "checkpoint_interval_ms": args.checkpoint_interval_ms,
            "buffer_timeout_ms": buffer_timeout,
            "bundle_size": settings["python.fn-execution.bundle.size"],
            "bundle_time_ms": settings["python.fn-execution.bundle.time"],
            "state_cache_size": settings["python.state.cache-size"],
        }
    except Exception as exc:
        # Describe it now: a Java exception's text comes from the JVM, about to be stopped.
        log.exception("Run failed")
        raise RunFailed(describe(exc)) from None
    finally:
        if poller is not None:
            poller.stop()
        if client is not None:
            try:
                if not client.get_job_execution_result().done():
                    log.info("Cancelling the job")
                    client.cancel().result()
            except Exception as exc:  # noqa: BLE001 - the job or the cluster may be gone already
                log.info("Could not cancel the job: %s", exc)
        stop_jvm()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=["w1", "w2", "w3", "w4", "w4r", "w5", "w6"])
    parser.add_argument("--work-dir", required=True)
    parser.add_argument(
        "--records", type=int, default=1_000_000, help="records (w1, w2) or distinct keys (w4, w4r)"
    )
    parser.add_argument(
        "--update-fraction", type=float, default=0.01, help="w4r: keys updated per second (a fraction)"
    )
    parser.add_argument("--update-s", type=float, default=20.0, help="w4r: seconds of updates")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--duration-s", type=float, default=20)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument(
        "--per-event-second", type=int, default=100_000, help="w5: records per second of event time"
    )
    parser.add_argument(
        "--mode",
        choices=["thread", "process", "loopback", "unaligned"],
        default="thread",
        help="PyFlink's python.execution-mode: thread (in the JVM), process (a "
        "Python worker process per slot, as on a cluster) or loopback (process "
        "mode as a local PyFlink script runs it: the workers are threads of "
        "this process); unaligned: thread mode with unaligned checkpoints",
    )
    parser.add_argument(
        "--buffer-timeout-ms",
        type=int,
        default=None,
        help="Flink's network buffer timeout (default: Flink's, 100 ms)",
    )
    parser.add_argument(
        "--bundle-size",
        type=int,
        default=None,
        help="python.fn-execution.bundle.size, process mode (Flink's default: 100000)",
    )
    parser.add_argument(
        "--bundle-time-ms",
        type=int,
        default=None,
        help="python.fn-execution.bundle.time, process mode (Flink's default: 1000)",
    )
    parser.add_argument(
        "--state-cache-size",
        type=int,
        default=None,
        help="python.state.cache-size: keys whose state the process-mode worker "
        "caches (Flink's default: 1000)",
    )
    parser.add_argument(
        "--w3-source",
        choices=["sql", "datagen", "throttle"],
        default="sql",
        help="w3's rate source: Flink's rate-limited DataGeneratorSource with the "
        "emission time taken in the JVM (SQL's CURRENT_ROW_TIMESTAMP) or in a "
        "Python map behind it (datagen), or a Python map that sleeps to keep "
        "the rate and stamps (throttle)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=3600, help="cancel the job and fail after this long"
    )
    return parser.parse_args(argv)


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM ends the run like Ctrl-C does, so that the cleanup in ``run`` happens."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Beam replaces the root logger's handlers when a loopback worker starts in this process
    # (and sends their records to the JVM): the runner keeps a handler of its own.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    logging.getLogger("py4j").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _terminate)
    result: dict[str, Any] = {"system": SYSTEM, "variant": args.mode, "workload": args.workload}
    code = 0
    try:
        figures = run(args)
        result["ok"] = True
        result.update(figures)
    except KeyboardInterrupt as exc:
        result.update(ok=False, error=f"KeyboardInterrupt: {str(exc) or 'interrupted'}")
        code = 130
    except RunFailed as exc:
        result.update(ok=False, error=str(exc))
    except Exception as exc:
        log.exception("Run failed")
        result.update(ok=False, error=describe(exc))
    sys.stderr.flush()
    print(json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
