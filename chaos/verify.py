"""Exactly-once, judged from the committed output alone.

Rows are ``{key, id, count, sum}`` (see :mod:`chaos.job`). For each sink:

* every id in ``0..records-1`` appears exactly once (``lost``: missing ids;
  ``duplicated``: rows beyond one per id);
* each key's counts are exactly ``1..n`` (a replayed record repeats a count, a lost
  one leaves a gap), and in count order each ``sum`` is the running sum of the ids
  before it: the keyed state restored after a failure matched the output committed.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field


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


def read_parquet_dir(directory: str) -> dict[str, list[int]]:
    """The committed part files (pending and in-progress parts are hidden dot-files)."""
    import pyarrow.dataset as ds

    if not os.path.isdir(directory):
        return {"key": [], "id": [], "count": [], "sum": []}
    table = ds.dataset(directory, format="parquet").to_table()
    if table.num_rows == 0:
        return {"key": [], "id": [], "count": [], "sum": []}
    return {name: table[name].to_pylist() for name in ("key", "id", "count", "sum")}


def read_delta(table_uri: str) -> dict[str, list[int]]:
    """The rows the Delta log holds."""
    from deltalake import DeltaTable

    if not os.path.isdir(os.path.join(table_uri, "_delta_log")):
        return {"key": [], "id": [], "count": [], "sum": []}
    table = DeltaTable(table_uri).to_pyarrow_table()
    return {name: table[name].to_pylist() for name in ("key", "id", "count", "sum")}


def verify_run(run_dir: str, records: int, num_keys: int) -> list[SinkVerdict]:
    """Both sinks of a run, judged."""
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
    return verdicts
