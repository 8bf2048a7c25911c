"""W4r's records, pacing and figures, defined once for every system (standard library only).

W4r is W4 on RocksDB: a large keyed state that changes a little every second, which is what
incremental checkpoints are for. Every runner imports this module (it sits beside them;
PyFlink ships it to its Python workers with ``add_python_file``), so every system reads the
same records and its figures are taken the same way.

Records
-------
A run has ``keys`` keys (10 M in the full comparison) with ``value_bytes``-byte values in a
keyed ValueState, and two phases in one job:

* **load**: records ``0 .. keys-1``, record ``p`` is key ``p``, read as fast as the system
  reads them (every key gets its first value);
* **updates**: records ``keys .. records-1`` at ``rate`` = ``update_fraction * keys``
  records per second (1 % of the keys per second), record ``p`` updates key
  ``(p - keys) * STRIDE % keys`` (a prime stride: distinct keys spread over the whole key
  space, as random updates are, not one hot range), for ``update_s`` seconds.

The value of record ``p`` starts with ``p`` (8 bytes big-endian, or ``p|`` as text where a
system stores a ``str``), so an update always changes the key's value and the largest value
of a key is its latest (Spark's ``max`` aggregation keeps it). Checkpoints every second
throughout. Source subtask ``s`` of ``n`` reads records ``s, s + n, s + 2n, ...`` (a
number source split into contiguous ranges maps position ``j`` of split ``s`` to record
``j * n + s``: :meth:`W4rRecords.strided`), so the subtasks finish the load together and
pace their updates together: each paces its own share at ``rate / n``.

Figures
-------
The keyed function (or, for Spark, its micro-batches) notes when the load started and
ended and when the updates did. The figures are over the **steady update phase**: the
checkpoints triggered from one checkpoint interval after the load ended (the first one
after the load still carries the load's last writes) until the last update was processed:

* ``checkpoint_p50_ms`` / ``checkpoint_max_ms``: their end-to-end duration;
* ``uploaded_p50_bytes`` / ``uploaded_max_bytes`` / ``uploaded_mean_bytes``: what each
  wrote to the checkpoint storage (Flink's ``checkpointed_size``; for Spark, the bytes of
  the files that appeared in its checkpoint directory during the batch);
* ``full_size_bytes``: the whole state the last of them covers (Flink's ``state_size``; for
  Spark, what its state store directory held after the load), and ``uploaded_fraction_p50`` =
  ``uploaded_p50_bytes / full_size_bytes`` (the issue's aim: at most 5 %);
* ``load_records_per_s``: ``keys`` over the load's time at the keyed function (first record
  to last), ``update_records_per_s``: the updates over theirs, which is ``rate`` when the
  system keeps up (``updates_kept_up``: the updates took at most 10 % and an interval
  longer than planned).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: The updates' stride through the key space: a prime, so coprime to any key count it does
#: not divide, and ``(j * STRIDE) % keys`` visits distinct keys.
STRIDE = 1_000_003


@dataclass(frozen=True)
class W4rRecords:
    """The records of one W4r run (see the module's docstring)."""

    keys: int
    value_bytes: int = 100
    update_fraction: float = 0.01
    update_s: float = 20.0
    parallelism: int = 2

    def __post_init__(self) -> None:
        if self.keys < 1 or self.keys % STRIDE == 0:
            raise ValueError(f"W4r: keys ({self.keys}) must be positive and not a multiple of {STRIDE}")
        if self.updates > self.keys:
            raise ValueError(
                f"W4r: {self.updates} updates would touch some of the {self.keys} keys twice; "
                "lower update_fraction or update_s"
            )

    @property
    def rate(self) -> int:
        """Updates per second, over every source subtask."""
        return max(1, round(self.keys * self.update_fraction))

    @property
    def records(self) -> int:
        """Every record: the load and ``rate * update_s`` updates, rounded up to a multiple
        of ``parallelism`` (every source subtask reads as many)."""
        wanted = self.keys + math.ceil(self.rate * self.update_s)
        return -(-wanted // self.parallelism) * self.parallelism

    @property
    def updates(self) -> int:
        return self.records - self.keys

    def key(self, p: int) -> int:
        keys = self.keys
        return p if p < keys else (p - keys) * STRIDE % keys

    def value(self, p: int) -> bytes:
        """Record ``p``'s value: ``p`` in 8 bytes big-endian, then filler."""
        return p.to_bytes(8, "big") + b"v" * max(0, self.value_bytes - 8)

    def text_value(self, p: int) -> str:
        """Record ``p``'s value as an ASCII ``str`` of ``value_bytes`` characters (PyFlink
        stores a ``str``: see its runner's W4)."""
        return f"{p}|".ljust(self.value_bytes, "x")[: self.value_bytes]

    def strided(self, n: int) -> int:
        """The record read at number ``n`` of ``0..records-1`` split into ``parallelism``
        equal contiguous ranges: position ``j`` of range ``s`` is record ``j * parallelism + s``."""
        share = self.records // self.parallelism
        return n % share * self.parallelism + n // share

    def due_s(self, p: int) -> float:
        """When update record ``p`` is due, in seconds after the first update was due."""
        return (p - self.keys) / self.rate


class Pacer:
    """Paces one source subtask's updates: record ``p`` not before ``due_s(p)`` after the
    subtask's first update (each subtask reads every ``parallelism``-th record, so the
    subtasks together keep ``rate``). The load is not paced."""

    def __init__(self, records: W4rRecords, clock: Any) -> None:
        self.records = records
        self.clock = clock  # time.monotonic
        self.started: float | None = None
        self.first_due = 0.0

    def wait_s(self, p: int) -> float:
        """How long to wait before emitting record ``p`` (0: now)."""
        if p < self.records.keys:
            return 0.0
        now = self.clock()
        if self.started is None:
            self.started, self.first_due = now, self.records.due_s(p)
        return max(0.0, self.started + self.records.due_s(p) - self.first_due - now)

    def due_until(self, start: int, step: int, limit: int) -> int:
        """The records ``start, start + step, ...`` due now, at most ``limit``: how many."""
        count = 0
        p = start
        while count < limit and self.wait_s(p) == 0.0:
            count += 1
            p += step
        return count


class PhaseNotes:
    """What a keyed function instance notes: first and last wall-clock time and count of the
    load records and of the updates it processed (``observe`` per record or batch)."""

    def __init__(self, keys: int) -> None:
        self.keys = keys
        self.notes: dict[str, Any] = {
            "load_first": None,
            "load_last": None,
            "load_count": 0,
            "update_first": None,
            "update_last": None,
            "update_count": 0,
        }

    def observe(self, p: int, now: float) -> None:
        phase = "load" if p < self.keys else "update"
        notes = self.notes
        if notes[f"{phase}_first"] is None:
            notes[f"{phase}_first"] = now
        notes[f"{phase}_last"] = now
        notes[f"{phase}_count"] += 1

    def to_json(self) -> dict[str, Any]:
        return dict(self.notes)


@dataclass(frozen=True)
class Phases:
    """The run's phases in wall-clock seconds, merged over the keyed function instances."""

    load_first: float
    load_last: float
    load_count: int
    update_first: float
    update_last: float
    update_count: int

    @staticmethod
    def merge(notes: list[dict[str, Any]]) -> Phases:
        def times(name: str) -> list[float]:
            return [n[name] for n in notes if n.get(name) is not None]

        missing = [name for name in ("load_first", "update_first") if not times(name)]
        if missing:
            raise RuntimeError(f"W4r: no keyed function instance noted {', '.join(missing)}")
        return Phases(
            load_first=min(times("load_first")),
            load_last=max(times("load_last")),
            load_count=sum(n.get("load_count", 0) for n in notes),
            update_first=min(times("update_first")),
            update_last=max(times("update_last")),
            update_count=sum(n.get("update_count", 0) for n in notes),
        )


def percentile(ordered: list[float], q: float) -> float:
    """Nearest rank, as the other figures."""
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def figures(
    records: W4rRecords, phases: Phases, checkpoints: list[dict[str, Any]], interval_ms: int
) -> dict[str, Any]:
    """The run's figures (see the module's docstring). ``checkpoints``: every completed
    checkpoint as ``{"trigger_ms", "duration_ms", "uploaded_bytes", "full_bytes"}`` (epoch
    ms); those of the steady update phase are measured."""
    if phases.load_count != records.keys:
        raise RuntimeError(f"W4r: the keyed function loaded {phases.load_count} of {records.keys} keys")
    if phases.update_count != records.updates:
        raise RuntimeError(f"W4r: the keyed function saw {phases.update_count} of {records.updates} updates")
    start_ms = phases.load_last * 1000 + interval_ms
    end_ms = phases.update_last * 1000
    steady = [c for c in checkpoints if start_ms <= c["trigger_ms"] <= end_ms]
    if not steady:
        raise RuntimeError(
            f"W4r: no checkpoint was triggered during the {phases.update_last - phases.update_first:.1f} s "
            f"of updates (of {len(checkpoints)} completed); raise update_s"
        )
    durations = sorted(float(c["duration_ms"]) for c in steady)
    uploaded = sorted(float(c["uploaded_bytes"]) for c in steady)
    full = float(steady[-1]["full_bytes"])
    update_span = phases.update_last - phases.update_first
    return {
        "keys": records.keys,
        "value_bytes": records.value_bytes,
        "updates": records.updates,
        "updates_per_s_target": records.rate,
        "load_records_per_s": records.keys / max(1e-9, phases.load_last - phases.load_first),
        "update_records_per_s": phases.update_count / update_span if update_span > 0 else None,
        # the updates ran at (nearly) their rate: else the checkpoints covered more than a
        # second of updates each, further apart
        "updates_kept_up": update_span <= records.update_s * 1.1 + interval_ms / 1000,
        "load_s": phases.load_last - phases.load_first,
        "update_s": update_span,
        "checkpoints_completed": len(checkpoints),
        "checkpoints_measured": len(steady),
        "checkpoint_p50_ms": percentile(durations, 50),
        "checkpoint_max_ms": durations[-1],
        "uploaded_p50_bytes": percentile(uploaded, 50),
        "uploaded_max_bytes": uploaded[-1],
        "uploaded_mean_bytes": sum(uploaded) / len(uploaded),
        "full_size_bytes": full,
        "uploaded_fraction_p50": percentile(uploaded, 50) / full if full else None,
        "steady_checkpoints": steady,
    }
