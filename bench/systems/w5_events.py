"""W5's events, results and figures, defined once for every system (standard library only).

W5 is a keyed tumbling event-time window: record ``i`` (``0 <= i < records``) is
``(key, value, timestamp) = (i % keys, i, timestamp(i))``, 1 s tumbling event-time windows
per key, the sum of ``value`` per key and window, watermarks ``200 ms`` behind the
largest timestamp (Flink's ``for_bounded_out_of_orderness``). Every runner imports this
module (it sits beside them, so a runner run as a script finds it; PyFlink ships it to its
Python workers with ``add_python_file``), so every system reads the same events and is
held to the same results: the runners share no other code.

Event time
----------
``timestamp(i)`` advances at ``per_event_second`` records per second of event time from
``BASE_MS`` (a whole second), with bounded disorder: within each block of 100 ms of event
time (``per_event_second // 10`` records) the timestamps are dealt out of order by a
fixed permutation (``j -> j * 7919 % block``), so a record can be up to 100 ms older than
one read before it, never more, and the 200 ms bound holds: no record is late. The blocks
tile the windows, so record ``i`` falls in window ``i // per_event_second`` whatever the
permutation, which makes every window's expected sum a closed form.

A source subtask ``s`` of ``p`` reads the records ``s, s + p, s + 2p, ...``, so that the
subtasks' event times advance together, as partitions of one topic would; a system whose
number source splits ``0..N-1`` into contiguous ranges maps position ``j`` of split ``s``
to record ``j * p + s`` (:meth:`W5Events.strided`).

When a window's watermark passes
--------------------------------
A bounded out-of-orderness watermark is ``max timestamp - 200 - 1``; an event-time window
``[start, end)`` fires when the watermark reaches ``end - 1``, i.e. once the largest
timestamp read is ``>= end + 200`` (Spark: its watermark ``max - 200`` reaches ``end``:
the same instant). :class:`WatermarkPasses` notes, per source subtask, the wall-clock time
at which that first happened for each window; the window's watermark passed when the
last subtask got there (the downstream watermark is the minimum over the subtasks). It
is when the input allowed the window to fire, so the latency counts from there
everything a system adds: its periodic watermark emission (Flink's and chandy's
``pipeline.auto-watermark-interval``, 200 ms by default), the watermark's way through the
job, the firing and the results' way to the sink.

Results
-------
A sink subtask feeds every result to a :class:`ResultCheck`: per window, how often each
key's result arrived (a byte per key), the results whose sum is not the expected one, and
the arrival times (per whole millisecond, wall clock). :func:`verify` merges the sink
subtasks' checks: every (key, window) must have arrived exactly once with its exact sum.
"""

from __future__ import annotations

import base64
import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

#: The first window's start, in ms since the epoch (2023-11-14 22:13:20 UTC, a whole second).
BASE_MS = 1_700_000_000_000
WINDOW_MS = 1000
OUT_OF_ORDERNESS_MS = 200
#: The permutation of timestamps within a 100 ms block: ``j -> j * DEAL % block``.
DEAL = 7919


@dataclass(frozen=True)
class W5Events:
    """The events of one W5 run: ``records`` records over ``keys`` keys, read by
    ``parallelism`` source subtasks, ``per_event_second`` records per second of event time."""

    records: int
    keys: int = 10_000
    per_event_second: int = 100_000
    parallelism: int = 2

    def __post_init__(self) -> None:
        block = self.per_event_second // 10
        problems = []
        if self.per_event_second % 10 or block < 1 or math.gcd(DEAL, block) != 1:
            problems.append(
                f"per_event_second ({self.per_event_second}) must be a multiple of 10 whose tenth "
                f"is coprime to {DEAL}"
            )
        if self.per_event_second % self.keys:
            problems.append(
                f"per_event_second ({self.per_event_second}) must be a multiple of keys ({self.keys})"
            )
        if self.records < self.per_event_second or self.records % self.per_event_second:
            problems.append(
                f"records ({self.records}) must be a positive multiple of per_event_second "
                f"({self.per_event_second}): whole windows only"
            )
        if self.records % self.parallelism or self.keys % self.parallelism:
            problems.append(
                f"records ({self.records}) and keys ({self.keys}) must be multiples of parallelism "
                f"({self.parallelism})"
            )
        if problems:
            raise ValueError("W5: " + "; ".join(problems))

    @staticmethod
    def rounded(records: int, per_event_second: int = 100_000, **kwargs: Any) -> W5Events:
        """The events of about ``records`` records: rounded up to whole windows."""
        windows = max(1, -(-records // per_event_second))
        return W5Events(windows * per_event_second, per_event_second=per_event_second, **kwargs)

    @property
    def block(self) -> int:
        """Records per 100 ms of event time, the span within which timestamps are dealt."""
        return self.per_event_second // 10

    @property
    def windows(self) -> int:
        return self.records // self.per_event_second

    @property
    def per_key_and_window(self) -> int:
        return self.per_event_second // self.keys

    def timestamp(self, i: int) -> int:
        block = self.block
        j = i % block
        return BASE_MS + (i - j + j * DEAL % block) * WINDOW_MS // self.per_event_second

    def records_of(self, indexes: range) -> list[tuple[int, int, int]]:
        """``(key, value, timestamp)`` of the records ``indexes`` (a source's batch; a range
        with a positive step), block by block: a block's timestamps are its start's plus a
        table lookup, which makes a batch about a third cheaper than one formula per record."""
        dealt, keys, block = self._dealt, self.keys, self.block
        out: list[tuple[int, int, int]] = []
        lo, hi, step = indexes.start, indexes.stop, indexes.step
        while lo < hi:
            number = lo // block
            start = number * block
            end = min(hi, start + block)
            part = range(lo, end, step)
            at = BASE_MS + number * (block * WINDOW_MS // self.per_event_second)
            stamps = [at + d for d in dealt[lo - start : end - start : step]]
            out.extend(zip([i % keys for i in part], part, stamps, strict=True))
            lo = part.start + len(part) * step
        return out

    @functools.cached_property
    def _dealt(self) -> list[int]:
        """Each position's timestamp offset within its block (ms)."""
        block, rate = self.block, self.per_event_second
        return [j * DEAL % block * WINDOW_MS // rate for j in range(block)]

    def strided(self, n: int) -> int:
        """The record read at number ``n`` of ``0..records-1`` split into ``parallelism``
        equal contiguous ranges (PyFlink's ``NumberSequenceSource``): position ``j`` of
        range ``s`` is record ``j * parallelism + s``."""
        share = self.records // self.parallelism
        return n % share * self.parallelism + n // share

    def timestamp_floor(self, i: int) -> int:
        """The smallest timestamp of record ``i``'s 100 ms block. The fire thresholds fall
        on block starts (window end + 200 ms), so the largest timestamp read reaches one
        exactly when the floor of the largest record index read does: a source that reads
        records in order can tell by its batch's last index, without looking at every
        timestamp."""
        return BASE_MS + i // self.block * (self.block * WINDOW_MS // self.per_event_second)

    def source_of_key(self, key: int) -> int:
        """The source subtask that reads every event of ``key`` (``keys`` is a multiple of
        the parallelism, so record ``i``'s key and ``i`` agree modulo it)."""
        return key % self.parallelism

    def window_of(self, timestamp: int) -> int:
        return (timestamp - BASE_MS) // WINDOW_MS

    def window_start(self, window: int) -> int:
        return BASE_MS + window * WINDOW_MS

    def fire_threshold(self, window: int) -> int:
        """The largest timestamp read at which a 200 ms bounded out-of-orderness watermark
        passes the end of ``window``."""
        return BASE_MS + (window + 1) * WINDOW_MS + OUT_OF_ORDERNESS_MS

    def expected_sum(self, window: int, key: int) -> int:
        """``sum(i for i in window's records if i % keys == key)``, in closed form."""
        count = self.per_key_and_window
        return count * (window * self.per_event_second + key) + self.keys * count * (count - 1) // 2


def sql_strided(n: str, events: W5Events) -> str:
    """:meth:`W5Events.strided` as a SQL expression of the number column ``n``, for a source
    of ``parallelism`` contiguous splits in a SQL engine (Flink SQL's runner)."""
    share = events.records // events.parallelism
    return f"(MOD({n}, {share}) * {events.parallelism} + ({n} - MOD({n}, {share})) / {share})"


def sql_timestamp_ms(i: str, events: W5Events) -> str:
    """:meth:`W5Events.timestamp` as a SQL expression of the record column ``i``: ``MOD`` and
    the division of an exact multiple only, so it is exact whether the engine's ``/``
    truncates or not."""
    block, rate = events.block, events.per_event_second
    j = f"MOD({i}, {block})"
    scaled = f"(({i} - {j} + MOD({j} * {DEAL}, {block})) * {WINDOW_MS})"
    return f"CAST({BASE_MS} + ({scaled} - MOD({scaled}, {rate})) / {rate} AS BIGINT)"


class WatermarkPasses:
    """A source subtask's notes: when it read its first record, and for each window the
    wall-clock time at which the largest timestamp it had read first reached the
    window's :meth:`~W5Events.fire_threshold`. ``observe`` is per record (one comparison
    unless a threshold is crossed), ``observe_batch`` per batch (its largest timestamp)."""

    def __init__(self, events: W5Events) -> None:
        self.events = events
        self.first: float | None = None
        self.next_window = 0
        self.next_threshold = events.fire_threshold(0)
        self.passed: dict[int, float] = {}

    def observe(self, timestamp: int, now: float) -> None:
        if timestamp >= self.next_threshold:
            self._passed(timestamp, now)

    def observe_batch(self, largest_timestamp: int, now: float) -> None:
        if self.first is None:
            self.first = now
        if largest_timestamp >= self.next_threshold:
            self._passed(largest_timestamp, now)

    def _passed(self, timestamp: int, now: float) -> None:
        while timestamp >= self.next_threshold:
            self.passed[self.next_window] = now
            self.next_window += 1
            self.next_threshold = self.events.fire_threshold(self.next_window)

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "passed": {str(w): t for w, t in self.passed.items()}}


class ResultCheck:
    """A sink subtask's check of the window results it receives (see the module doc)."""

    def __init__(self, events: W5Events) -> None:
        self.events = events
        self.seen: dict[int, bytearray] = {}
        #: per window and source subtask of the key: arrivals per whole millisecond
        self.arrivals: dict[tuple[int, int], Counter[int]] = {}
        self.wrong = 0
        self.outside = 0  # results of windows that the events do not have
        self.count = 0

    def add(self, key: int, total: int, timestamp: int, now_ms: int) -> None:
        """One result: ``key``'s ``total`` in the window holding ``timestamp``, which
        arrived at ``now_ms`` (wall clock, whole milliseconds)."""
        events = self.events
        window = (timestamp - BASE_MS) // WINDOW_MS
        seen = self.seen.get(window)
        if seen is None:
            if not 0 <= window < events.windows:
                self.outside += 1
                return
            seen = self.seen[window] = bytearray(events.keys)
        self.count += 1
        if not 0 <= key < events.keys:
            self.wrong += 1
            return
        if seen[key] < 255:
            seen[key] += 1
        if total != events.expected_sum(window, key):
            self.wrong += 1
        at = (window, key % events.parallelism)
        arrivals = self.arrivals.get(at)
        if arrivals is None:
            arrivals = self.arrivals[at] = Counter()
        arrivals[now_ms] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "wrong": self.wrong,
            "outside": self.outside,
            "seen": {str(w): base64.b64encode(bytes(s)).decode() for w, s in self.seen.items()},
            "arrivals": {
                f"{w}/{s}": {str(ms): n for ms, n in a.items()} for (w, s), a in self.arrivals.items()
            },
        }


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not ordered:
        raise RuntimeError("nothing measured")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def verify(events: W5Events, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the sink subtasks' checks; ``exact`` only if every (key, window) result arrived
    exactly once with its exact sum, and nothing else arrived."""
    per_window: dict[int, list[int]] = {}
    for check in checks:
        for window, encoded in check["seen"].items():
            counts = base64.b64decode(encoded)
            merged = per_window.setdefault(int(window), [0] * events.keys)
            for key, n in enumerate(counts):
                if n:
                    merged[key] += n
    missing = duplicated = 0
    for window in range(events.windows):
        counts = per_window.get(window)
        if counts is None:
            missing += events.keys
            continue
        missing += counts.count(0)
        duplicated += sum(n - 1 for n in counts if n > 1)
    wrong = sum(c["wrong"] for c in checks)
    outside = sum(c["outside"] for c in checks)
    return {
        "exact": missing == duplicated == wrong == outside == 0,
        "results": sum(c["count"] for c in checks),
        "results_expected": events.windows * events.keys,
        "missing_results": missing,
        "duplicate_results": duplicated,
        "wrong_sums": wrong,
        "results_outside_windows": outside,
    }


def exactness_error(verdict: dict[str, Any]) -> str | None:
    """Why a run's results are not exact (``None`` if they are): a W5 run that is not
    exact fails."""
    if verdict["exact"]:
        return None
    return (
        f"W5 results are not exact: {verdict['missing_results']} missing, "
        f"{verdict['duplicate_results']} duplicated, {verdict['wrong_sums']} with a wrong sum, "
        f"{verdict['results_outside_windows']} outside the windows "
        f"({verdict['results']} of {verdict['results_expected']} arrived)"
    )


def watermark_passed_at(
    events: W5Events, passes: list[dict[str, Any]], per_key_source: bool = False
) -> dict[tuple[int, int], float]:
    """Per window and source subtask ``s``: when the watermark that fires the window's
    results for the keys read by ``s`` passed the window's end.

    In Flink, chandy and Spark a window fires on the watermark of the operator, the
    minimum over its inputs: the time the last source subtask's largest timestamp reached
    the window's fire threshold, the same for every ``s``. Bytewax keeps a clock per key,
    fed by that key's events only (``per_key_source``): its windows fire on ``s``'s own
    time. Windows that some source never got there for are left out: they fired at the
    end of the input, not because event time passed them."""
    result = {}
    sources = [{int(w): t for w, t in p["passed"].items()} for p in passes]
    for window in range(events.windows):
        times = [p.get(window) for p in sources]
        if len(times) != events.parallelism or any(t is None for t in times):
            continue
        for s in range(events.parallelism):
            result[(window, s)] = times[s] if per_key_source else max(times)  # type: ignore[type-var]
    return result


def latency_figures(
    passed_at: dict[tuple[int, int], float], checks: list[dict[str, Any]], skip_windows: int = 1
) -> dict[str, Any]:
    """Latency of every result of the windows whose watermark passed during the run: its
    arrival at the sink minus when the watermark firing it passed its window's end (ms).
    The first ``skip_windows`` windows are left out as warm-up (the first window's results
    meet a cold pipeline: imports, code generation, a JIT). ``window_complete_p50_ms``:
    the median over windows of the latency of a window's last result."""
    latencies: Counter[int] = Counter()
    last: dict[int, float] = {}
    for check in checks:
        for at, arrivals in check["arrivals"].items():
            window, source = (int(x) for x in at.split("/"))
            passed = passed_at.get((window, source))
            if window < skip_windows or passed is None:
                continue
            base = passed * 1000
            for ms, n in arrivals.items():
                latency = round(int(ms) - base)
                latencies[latency] += n
                last[window] = max(last.get(window, latency), latency)
    ordered = sorted(latencies.elements())
    if not ordered:
        return {
            "latency_p50_ms": None,
            "latency_p99_ms": None,
            "latency_max_ms": None,
            "latency_results": 0,
            "latency_windows": 0,
        }
    completes = sorted(last.values())
    return {
        "latency_p50_ms": float(percentile(ordered, 50)),
        "latency_p99_ms": float(percentile(ordered, 99)),
        "latency_max_ms": float(ordered[-1]),
        "latency_min_ms": float(ordered[0]),
        "latency_results": len(ordered),
        "latency_windows": len(last),
        "window_complete_p50_ms": float(percentile(completes, 50)),
    }


def last_arrival(checks: list[dict[str, Any]]) -> float:
    """The wall-clock time (s) of the last result at any sink subtask."""
    return max(int(ms) for c in checks for a in c["arrivals"].values() for ms in a) / 1000


def figures(
    events: W5Events,
    passes: list[dict[str, Any]],
    checks: list[dict[str, Any]],
    skip_windows: int = 1,
    per_key_source: bool = False,
) -> dict[str, Any]:
    """W5's figures from the sources' and sinks' notes; raises if the results are not
    exact. Throughput is records over the time from the first record a source read to
    the last result at a sink."""
    verdict = verify(events, checks)
    error = exactness_error(verdict)
    if error:
        raise RuntimeError(error)
    first = min(p["first"] for p in passes if p["first"] is not None)
    span = last_arrival(checks) - first
    return {
        "records": events.records,
        "records_per_s": events.records / span if span > 0 else None,
        "first_to_last_s": span,
        "windows": events.windows,
        "keys": events.keys,
        "records_per_event_second": events.per_event_second,
        "out_of_orderness_ms": OUT_OF_ORDERNESS_MS,
        **verdict,
        "watermark_per_key": per_key_source,
        **latency_figures(watermark_passed_at(events, passes, per_key_source), checks, skip_windows),
    }
