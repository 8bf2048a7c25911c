"""W6's pacing and figures, defined once for every system (standard library only).

W6 is checkpoints under backpressure: W1's job (the ints ``0..N-1``, key ``i % keys``, a
keyed ValueState running sum) with a **rate-limited source** and a **sink throttled to half
the source rate**, parallelism 2, checkpoints every second. Every runner imports this
module (it sits beside them; PyFlink ships it to its Python workers), so every system is
paced alike and its figures are taken the same way.

Pacing
------
* **Source**: ``source_rate`` records per second over every source subtask; subtask ``s``
  of ``p`` emits its share at ``source_rate / p``, record ``j`` of its share due ``j /
  (source_rate / p)`` seconds after its first. The schedule is fixed from the start and
  its debt is never forgiven, as a topic produced at that rate is: once the pipeline
  holds the source back, it falls behind the schedule and emits as fast as the pipeline
  takes records, in full batches (a consumer with lag), so every network buffer between
  source and sink fills. (A token bucket with a small burst, like Flink's
  ``RateLimiterStrategy`` or chandy's ``DataGeneratorSource``, forgets the records it
  could not emit and sends small batches: the buffers would hold far fewer records.)
* **Sink**: each sink subtask holds ``sink_rate / p`` = half the source rate over ``p``,
  sleeping after each record (PyFlink) or batch (chandy) until its count is due. The
  sink is chained to the keyed function, so the keyed function is held back too, and the
  keyed exchange's buffers fill up to the source.
* **Length**: ``records = sink_rate * duration_s`` (rounded to a multiple of ``p``): the
  run lasts about ``duration_s`` at the sink, and the source, which would need half that,
  ends about ``duration_s / 2`` behind its schedule (``source_behind_s``, which shows the
  backpressure held).

The backlog in flight is what the buffers between the source and the sink hold, so an
aligned checkpoint's barrier waits about ``backlog / sink_rate`` behind it; an unaligned
barrier overtakes it, and the backlog becomes the checkpoint's persisted in-flight data.

Figures
-------
Over the checkpoints **under backpressure**: triggered from the sinks' first record to the
sources' last (later ones see the backlog drain): ``checkpoint_p50_ms``,
``checkpoint_p99_ms``, ``checkpoint_max_ms`` (end-to-end), ``checkpoints_under_backpressure``,
``unaligned_checkpoints`` (how many of them were unaligned, as the system's statistics
say), ``persisted_p50_bytes`` / ``persisted_max_bytes`` (in-flight data written with a
checkpoint, where the system reports it), and ``checkpoints`` (each one: trigger time after
the sinks' first record, duration, unaligned, persisted bytes). ``records_per_s``:
records over the time from the first record to the last at the sinks (``sink_rate`` when
the sinks kept their pace); ``checkpoints_completed``: every completed checkpoint of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class W6Plan:
    """One W6 run's sizes and rates (see the module's docstring)."""

    source_rate: float
    duration_s: float
    parallelism: int = 2
    keys: int = 10_000

    def __post_init__(self) -> None:
        if self.source_rate <= 0 or self.duration_s <= 0 or self.parallelism < 1:
            raise ValueError(
                f"W6: source_rate ({self.source_rate}), duration_s ({self.duration_s}) and "
                f"parallelism ({self.parallelism}) must be positive"
            )

    @property
    def sink_rate(self) -> float:
        """Records per second the sinks hold, over every subtask: half the source rate."""
        return self.source_rate / 2

    @property
    def records(self) -> int:
        """``sink_rate * duration_s``, rounded up to a multiple of ``parallelism``."""
        wanted = max(self.parallelism, math.ceil(self.sink_rate * self.duration_s))
        return -(-wanted // self.parallelism) * self.parallelism

    def source_pacer(self, clock: Any) -> RatePacer:
        return RatePacer(self.source_rate / self.parallelism, clock)

    def sink_pacer(self, clock: Any) -> RatePacer:
        return RatePacer(self.sink_rate / self.parallelism, clock)


class RatePacer:
    """Record ``n`` (counted from 0) of one subtask is due ``n / rate`` seconds after its
    first; nothing is forgiven when the subtask falls behind."""

    def __init__(self, rate: float, clock: Any) -> None:
        self.rate = rate
        self.clock = clock  # time.monotonic
        self.started: float | None = None

    def start(self) -> float:
        if self.started is None:
            self.started = self.clock()
        return self.started

    def due(self, done: int, limit: int) -> int:
        """How many records after the ``done`` already emitted are due now (at most ``limit``)."""
        elapsed = self.clock() - self.start()
        return max(0, min(limit, math.floor(elapsed * self.rate) + 1 - done))

    def wait_s(self, done: int) -> float:
        """How long to wait once ``done`` records went by, so as not to exceed the rate."""
        return max(0.0, self.start() + done / self.rate - self.clock())

    def behind_s(self, done: int) -> float:
        """How far behind its schedule the subtask is after ``done`` records."""
        return max(0.0, self.clock() - self.start() - (done - 1) / self.rate)


class Notes:
    """What a source or sink instance notes: first and last wall-clock time and count, and
    (sources) how far behind schedule its last record went out."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.count = 0
        self.behind_s = 0.0

    def observe(self, count: int, now: float) -> None:
        if self.first is None:
            self.first = now
        self.last = now
        self.count += count

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "last": self.last, "count": self.count, "behind_s": self.behind_s}


def unaligned_of(entry: dict[str, Any]) -> bool | None:
    """Whether a checkpoint of a REST history was unaligned: Flink's ``checkpoint_type``
    (``UNALIGNED_CHECKPOINT``), or an ``is_unaligned`` flag where a system reports one;
    ``None`` when the entry says neither."""
    if entry.get("is_unaligned") is not None:
        return bool(entry["is_unaligned"])
    kind = entry.get("checkpoint_type")
    return None if kind is None else kind == "UNALIGNED_CHECKPOINT"


def percentile(ordered: list[float], q: float) -> float:
    """Nearest rank, as the other figures."""
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def figures(
    plan: W6Plan,
    sources: list[dict[str, Any]],
    sinks: list[dict[str, Any]],
    checkpoints: list[dict[str, Any]],
) -> dict[str, Any]:
    """The run's figures (see the module's docstring). ``sources`` / ``sinks``: the instances'
    ``Notes.to_json()``; ``checkpoints``: every completed checkpoint as ``{"id", "trigger_ms"
    (epoch ms), "duration_ms", "unaligned" (bool or None: not reported), "persisted_bytes"
    (int or None)}``."""
    sinks = [s for s in sinks if s.get("first") is not None]
    seen = sum(s["count"] for s in sinks)
    if seen != plan.records:
        raise RuntimeError(f"W6: the sinks saw {seen} records, expected {plan.records}")
    emitted = sum(s["count"] for s in sources)
    if emitted != plan.records:
        raise RuntimeError(f"W6: the sources emitted {emitted} records, expected {plan.records}")
    first = min(s["first"] for s in sinks)
    last = max(s["last"] for s in sinks)
    source_last = max(s["last"] for s in sources)
    start_ms, end_ms = first * 1000, source_last * 1000
    measured = sorted(
        (c for c in checkpoints if c.get("trigger_ms") is not None and start_ms <= c["trigger_ms"] <= end_ms),
        key=lambda c: c["trigger_ms"],
    )
    if not measured:
        raise RuntimeError(
            f"W6: no checkpoint was triggered while the sources were held back (of {len(checkpoints)} "
            "completed); raise the duration"
        )
    durations = sorted(float(c["duration_ms"]) for c in measured)
    known = [c for c in measured if c.get("unaligned") is not None]
    persisted = sorted(float(c["persisted_bytes"]) for c in measured if c.get("persisted_bytes") is not None)
    span = last - first
    return {
        "records": plan.records,
        "source_rate": plan.source_rate,
        "sink_rate": plan.sink_rate,
        "records_per_s": plan.records / span if span > 0 else None,
        "first_to_last_s": span,
        "source_behind_s": max(s["behind_s"] for s in sources),
        "checkpoints_completed": len(checkpoints),
        "checkpoints_under_backpressure": len(measured),
        "checkpoint_p50_ms": percentile(durations, 50),
        "checkpoint_p99_ms": percentile(durations, 99),
        "checkpoint_max_ms": durations[-1],
        "unaligned_checkpoints": sum(1 for c in known if c["unaligned"]) if known else None,
        "persisted_p50_bytes": percentile(persisted, 50) if persisted else None,
        "persisted_max_bytes": persisted[-1] if persisted else None,
        "checkpoints": [
            {
                "id": c["id"],
                "trigger_s": round(c["trigger_ms"] / 1000 - first, 3),
                "duration_ms": c["duration_ms"],
                "unaligned": c.get("unaligned"),
                "persisted_bytes": c.get("persisted_bytes"),
            }
            for c in measured
        ],
    }
