"""Exactly-once, judged from the committed output alone.

Running sums: rows are ``{key, id, count, sum}`` (see :mod:`chaos.job`). For each sink:

* every id in ``0..records-1`` appears exactly once (``lost``: missing ids;
  ``duplicated``: rows beyond one per id);
* each key's counts are exactly ``1..n`` (a replayed record repeats a count, a lost
  one leaves a gap), and in count order each ``sum`` is the running sum of the ids
  before it: the keyed state restored after a failure matched the output committed.

Event time: rows are ``{key, window_start, count, sum}``. Every (key, window) that holds
records appears exactly once (``lost``: windows missing; ``duplicated``: rows beyond one
per window) with the count and sum of the ids whose timestamps fall in it, computed here
from the ids with the job's own :class:`chaos.job.EventTime`; no other window appears.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from chaos.batch_job import SLIDING_WINDOWS, SUM_ONLY
from chaos.job import EARLY, NO_ROW, EventTime

#: ``(key, window_start)`` and its ``(count, sum)``.
Window = tuple[int, int]
Totals = tuple[int, int]


@dataclass
class SinkVerdict:
    sink: str
    rows: int
    lost: int
    duplicated: int
    problems: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.problems


def check_rows(
    sink: str,
    ids: list[int],
    keys: list[int],
    counts: list[int],
    sums: list[int],
    records: int,
    num_keys: int,
) -> SinkVerdict:
    """Judge one sink's committed rows against the job's ``records`` ids over ``num_keys`` keys."""
    seen = Counter(ids)
    lost = sum(1 for i in range(records) if i not in seen)
    duplicated = sum(n - 1 for n in seen.values() if n > 1)
    verdict = SinkVerdict(sink, len(ids), lost, duplicated)
    if lost:
        verdict.problems.append(f"{lost} of {records} ids missing (e.g. {_sample(records, seen)})")
    if duplicated:
        repeated = sorted(i for i, n in seen.items() if n > 1)
        verdict.problems.append(f"{duplicated} rows repeat an id (e.g. {repeated[:5]})")
    strays = sorted(i for i in seen if not 0 <= i < records)
    if strays:
        verdict.problems.append(f"{len(strays)} ids outside 0..{records - 1} (e.g. {strays[:5]})")
    per_key: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for key, i, count, total in zip(keys, ids, counts, sums, strict=True):
        if key != i % num_keys:
            verdict.problems.append(f"id {i} came out under key {key}, not {i % num_keys}")
            return verdict
        per_key[key].append((count, i, total))
    for key in sorted(per_key):
        rows = sorted(per_key[key])
        if [c for c, _, _ in rows] != list(range(1, len(rows) + 1)):
            verdict.problems.append(
                f"key {key}: counts are not 1..{len(rows)} (a record counted twice or lost)"
            )
            continue
        running = 0
        for count, i, total in rows:
            running += i
            if total != running:
                verdict.problems.append(
                    f"key {key}: count {count} (id {i}) has sum {total}, "
                    f"but the ids up to it add to {running}"
                )
                break
    return verdict


def _sample(records: int, seen: Counter[int]) -> list[int]:
    missing = []
    for i in range(records):
        if i not in seen:
            missing.append(i)
            if len(missing) == 5:
                break
    return missing


def expected_windows(
    sizes: list[int], num_keys: int, window_ms: int, size_ms: int | None = None
) -> dict[Window, Totals]:
    """``(key, window_start) -> (count, sum)`` of the ids in each window of an exact run
    whose source splits have ``sizes``: tumbling windows of ``window_ms``, or with
    ``size_ms`` sliding windows of that size sliding by ``window_ms`` (a record is in every
    one that holds it, as Flink's ``SlidingEventTimeWindows`` assigns it)."""
    event_time = EventTime(sizes)
    size = window_ms if size_ms is None else size_ms
    expected: dict[Window, Totals] = {}
    for i in range(sum(sizes)):
        ts = event_time.of(i)
        start = ts - ts % window_ms
        while start > ts - size:
            window = (i % num_keys, start)
            count, total = expected.get(window, (0, 0))
            expected[window] = (count + 1, total + i)
            start -= window_ms
    return expected


def check_windows(
    sink: str,
    keys: list[int],
    starts: list[int],
    counts: list[int],
    sums: list[int],
    expected: dict[Window, Totals],
) -> SinkVerdict:
    """Judge the event-time branch's committed rows against the windows an exact run emits."""
    seen = Counter(zip(keys, starts, strict=True))
    lost = sum(1 for window in expected if window not in seen)
    duplicated = sum(n - 1 for n in seen.values() if n > 1)
    verdict = SinkVerdict(sink, len(keys), lost, duplicated)
    if lost:
        missing = sorted(window for window in expected if window not in seen)
        verdict.problems.append(f"{lost} of {len(expected)} (key, window start) missing (e.g. {missing[:5]})")
    if duplicated:
        repeated = sorted(window for window, n in seen.items() if n > 1)
        verdict.problems.append(f"{duplicated} rows repeat a (key, window start) (e.g. {repeated[:5]})")
    strays = sorted(window for window in seen if window not in expected)
    if strays:
        verdict.problems.append(f"{len(strays)} windows that hold no record (e.g. {strays[:5]})")
    for marker, problem in (
        (NO_ROW, "without their window's row"),
        (EARLY, "before the watermark passed them"),
    ):
        marked = sorted({(k, s) for k, s, c in zip(keys, starts, counts, strict=True) if c == marker})
        if marked:
            verdict.problems.append(f"{len(marked)} timers fired {problem} (e.g. {marked[:5]})")
    wrong = sorted(
        {
            (k, s, c, total, *expected[k, s])
            for k, s, c, total in zip(keys, starts, counts, sums, strict=True)
            if (k, s) in expected and c not in (NO_ROW, EARLY) and (c, total) != expected[k, s]
        }
    )
    if wrong:
        verdict.problems.append(
            f"{len(wrong)} windows with a wrong count or sum (key, start, count, sum, expected count, "
            f"expected sum: e.g. {wrong[:3]})"
        )
    return verdict


def read_parquet_dir(
    directory: str, columns: tuple[str, ...] = ("key", "id", "count", "sum")
) -> dict[str, list[int]]:
    """The committed part files (pending and in-progress parts are hidden dot-files)."""
    import pyarrow.dataset as ds

    if not os.path.isdir(directory):
        return {name: [] for name in columns}
    table = ds.dataset(directory, format="parquet").to_table()
    if table.num_rows == 0:
        return {name: [] for name in columns}
    return {name: table[name].to_pylist() for name in columns}


def read_delta(table_uri: str) -> dict[str, list[int]]:
    """The rows the Delta log holds."""
    from deltalake import DeltaTable

    if not os.path.isdir(os.path.join(table_uri, "_delta_log")):
        return {"key": [], "id": [], "count": [], "sum": []}
    table = DeltaTable(table_uri).to_pyarrow_table()
    return {name: table[name].to_pylist() for name in ("key", "id", "count", "sum")}


def verify_run(
    run_dir: str, sizes: list[int], num_keys: int, window_ms: int, path: str = "record"
) -> list[SinkVerdict]:
    """The three sinks of a run (whose source splits have ``sizes``) on ``path`` (``record``
    or ``batch``: :mod:`chaos.batch_job`), judged."""
    records = sum(sizes)
    verdicts = []
    for sink, columns in (
        ("parquet", read_parquet_dir(os.path.join(run_dir, "parquet"))),
        ("delta", read_delta(os.path.join(run_dir, "delta"))),
    ):
        verdicts.append(
            check_rows(
                sink, columns["id"], columns["key"], columns["count"], columns["sum"], records, num_keys
            )
        )
    if path == "batch":
        return verdicts + check_batch_windows(run_dir, sizes, num_keys, window_ms)
    windows = read_parquet_dir(os.path.join(run_dir, "windows"), ("key", "window_start", "count", "sum"))
    verdicts.append(
        check_windows(
            "windows",
            windows["key"],
            windows["window_start"],
            windows["count"],
            windows["sum"],
            expected_windows(sizes, num_keys, window_ms),
        )
    )
    return verdicts


def check_batch_windows(run_dir: str, sizes: list[int], num_keys: int, window_ms: int) -> list[SinkVerdict]:
    """The batch job's window sink: its tumbling rows (count and sum) and its sliding rows
    (sum only: their ``count`` is :data:`chaos.batch_job.SUM_ONLY`, so the oracle gets the
    expected count in its place and judges the sum, the presence and the uniqueness)."""
    columns = ("key", "window_start", "window_end", "count", "sum")
    rows = read_parquet_dir(os.path.join(run_dir, "windows"), columns)
    sliding_ms = SLIDING_WINDOWS * window_ms
    verdicts = []
    for sink, size_ms in (("windows", window_ms), ("sliding", sliding_ms)):
        picked = [
            (key, start, count, total)
            for key, start, end, count, total in zip(*(rows[name] for name in columns), strict=True)
            if end - start == size_ms
        ]
        expected = expected_windows(sizes, num_keys, window_ms, size_ms)
        keys = [key for key, _, _, _ in picked]
        starts = [start for _, start, _, _ in picked]
        counts = [
            expected.get((key, start), (count, 0))[0] if count == SUM_ONLY else count
            for key, start, count, _ in picked
        ]
        sums = [total for _, _, _, total in picked]
        verdicts.append(check_windows(sink, keys, starts, counts, sums, expected))
    odd = sorted({end - start for start, end in zip(rows["window_start"], rows["window_end"], strict=True)})
    odd = [size for size in odd if size not in (window_ms, sliding_ms)]
    if odd:
        verdicts[0].problems.append(f"windows of sizes {odd} ms (expected {window_ms} and {sliding_ms})")
    return verdicts
