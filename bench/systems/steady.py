"""Steady-state rates and small-N checks for the reference runners that run no Python per
record (``flink_sql_runner.py``, ``pathway_runner.py``); standard library only, like
``w5_events.py`` beside it.

A steady-state rate
-------------------
A run's rate, records over its time, holds what every run pays once: a JVM's (or an
engine's) start, planning and submitting the job, deploying its tasks, JIT compilation,
the first checkpoint's set-up. For a system that runs no Python per record those fixed
costs are a large part of a run of seconds, so its rate understates what it sustains. Two
jobs of different sizes in one process, both on a warm engine, share those costs; the
difference of their sizes over the difference of their times is the rate of the records
alone::

    steady = (records_big - records_small) / (seconds_big - seconds_small)

:func:`steady_rate` computes it and refuses a pair that cannot give one (the bigger job
was not slower: the noise of a loaded machine exceeds the work the sizes differ by).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timed:
    """One job of a steady-state pair: ``records`` read in ``seconds`` (its own runtime)."""

    records: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def steady_rate(small: Timed, big: Timed) -> float:
    """Records per second of the records the two jobs differ by (see the module doc)."""
    if big.records <= small.records:
        raise ValueError(
            f"the steady state needs a bigger second job: {big.records} records after {small.records}"
        )
    if big.seconds <= small.seconds:
        raise ValueError(
            f"the steady state is not measurable: {big.records} records took {big.seconds:.3f} s, "
            f"no longer than {small.records} records ({small.seconds:.3f} s); the machine's noise "
            "exceeds the work the sizes differ by: give more records"
        )
    return (big.records - small.records) / (big.seconds - small.seconds)


def steady_figures(cold: Timed, small: Timed, big: Timed) -> dict[str, Any]:
    """The figures of a run of three jobs in one process: ``cold`` (the first, on a fresh
    engine: the rate every other runner reports), then ``big`` and ``small`` again, warm.
    ``steady_records_per_s`` is over the warm pair; ``null``, with ``steady_error`` saying
    why, when the pair gives none (the run's other figures still stand)."""
    try:
        steady: float | None = steady_rate(small, big)
        error = None
    except ValueError as exc:
        steady, error = None, str(exc)
    return {
        "records": cold.records,
        "records_per_s": cold.rate,
        "job_s": cold.seconds,
        "steady_records_per_s": steady,
        **({"steady_error": error} if error else {}),
        "steady_jobs": [
            {"records": t.records, "seconds": t.seconds, "warm": warm}
            for t, warm in ((cold, False), (big, True), (small, True))
        ],
    }


def w1_expected_sums(records: int, keys: int) -> dict[int, int]:
    """W1's final sum per key: ``sum(i for i in range(records) if i % keys == k)``, in
    closed form (key ``k`` holds ``k, k + keys, ...``)."""
    sums = {}
    for key in range(min(keys, records)):
        count = (records - 1 - key) // keys + 1
        sums[key] = count * key + keys * count * (count - 1) // 2
    return sums


def w1_check(records: int, keys: int, updates: Iterable[tuple[int, int]]) -> dict[str, Any]:
    """Checks W1's running sums as the sink saw them: ``updates`` are ``(key, sum)`` in
    arrival order (the inserts and updates of a changelog; retractions left out). Every
    key's last sum must be exact, and each update must be the key's sum so far grown:
    ``updates_emitted`` counts them (``records`` of them when every record emitted one)."""
    expected = w1_expected_sums(records, keys)
    last: dict[int, int] = {}
    emitted = shrunk = 0
    for key, total in updates:
        emitted += 1
        if total < last.get(key, -1):
            shrunk += 1
        last[key] = total
    wrong = sum(1 for key, total in expected.items() if last.get(key) != total)
    unknown = sum(1 for key in last if key not in expected)
    return {
        "exact": wrong == unknown == shrunk == 0,
        "check_records": records,
        "check_wrong_keys": wrong + unknown,
        "check_updates_emitted": emitted,
        "check_updates_shrunk": shrunk,
    }


def w1_check_error(check: dict[str, Any]) -> str | None:
    """Why a W1 check failed (``None`` if it passed): a reference that is not exact must not
    be a reference."""
    if check["exact"]:
        return None
    return (
        f"W1 results are not exact on {check['check_records']} records: "
        f"{check['check_wrong_keys']} keys with a wrong or missing final sum, "
        f"{check['check_updates_shrunk']} updates smaller than the key's sum before"
    )
