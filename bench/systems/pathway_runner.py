"""Pathway reference runner: W1 and W5 on Pathway's Rust dataflow engine (``pathway`` 0.33).

The runner protocol and the workloads are described in ``bench/systems/__init__.py``.
This script runs with the Python of ``bench/.cache/venvs/pathway`` and imports only the
standard library, Pathway, and ``w5_events.py`` / ``steady.py`` beside it.

Jobs (``PATHWAY_THREADS`` = ``--parallelism`` worker threads; persistence on: a
filesystem backend in the work dir, a snapshot every ``--checkpoint-interval-ms``)::

    # W1: a keyed running sum, emitting each key's new sum at every commit
    numbers.groupby(numbers.k).reduce(numbers.k, s=pw.reducers.sum(numbers.v))
    # W5: 1 s tumbling windows on the event time, per key, each result once when the
    # largest time seen passes the window's end by 200 ms (W5's watermark)
    events.windowby(events.ts, window=pw.temporal.tumbling(duration=1000), instance=events.k,
                    behavior=pw.temporal.exactly_once_behavior(shift=200)).reduce(...)

Sources (``--mode``)
--------------------
* ``subject`` (the main variant, ``pathway``): a ``pw.io.python.ConnectorSubject`` that
  calls ``next(k=..., v=...)`` for every record, in index order, committed every
  ``--autocommit-ms`` (100 ms): Pathway's way to stream from Python. Python runs per
  record in the source (as in the other Python systems' sources); the keyed sum and the
  windows run in Rust.
* ``csv`` (``pathway:csv``): the same records written to a CSV file in the work dir
  before the clock starts, read by ``pw.io.csv.read(mode="static")``: Rust parses the file
  and no Python runs per record. Static mode ingests a finite file in one commit (its
  ``streaming`` mode never ends on a finite file), so W1 then emits one sum per key for the
  whole input, like Spark's ``groupBy().agg()``, not a running sum per record.

Pathway's engine has one clock for the whole stream: a commit's updates move together, and
``exactly_once_behavior(shift=200)`` fires a window once the largest event time read is
200 ms past its end, as W5's watermark does. W5's records come in index order from one
source (``W5Events.records_of``), so the stream is W5's events merged: out of order by up
to 100 ms, never late.

How the figures are taken
-------------------------
* ``records_per_s``: records over the time from the source's first record to the end of
  ``pw.run`` (the engine has processed every record and written its last snapshot; the
  sink is ``pw.io.null.write`` for W1, a Python ``pw.io.subscribe`` that checks every
  result for W5). For ``csv``, from the start of ``pw.run``.
* ``steady_records_per_s``: like ``flink_sql_runner``, the job runs three times in this
  process (``records``, ``--steady-factor`` times that, ``records`` again, each with a
  fresh graph and persistence directory) and the steady state is over the last two
  (``steady.py``).
* Correctness: W5 checks every result of every run (``w5_events.ResultCheck``; a run that
  is not exact fails); W1 runs once more on ``--check-records`` records (default 100,000)
  with a subscribing sink and checks every key's last sum (``steady.w1_check``).
* Checkpoint figures: Pathway reports no per-snapshot durations; ``checkpoints_completed``
  etc. are ``null`` and ``snapshot_interval_ms`` says what was asked for.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

WORKLOADS = ("w1", "w2", "w3", "w4", "w4r", "w5", "w6", "w1v", "w3v")
IMPLEMENTED = ("w1", "w5")
SYSTEM = "pathway"
#: How many records the subject hands over per loop (W5's are made a block at a time).
BATCH = 10_000

log = logging.getLogger("pathway_runner")
#: ``time.time``, for the callbacks whose ``time`` argument (Pathway's) hides the module.
wall_clock = time.time


def _configure_threads(parallelism: int) -> None:
    """Pathway reads its worker count from the environment when it starts a run."""
    os.environ["PATHWAY_THREADS"] = str(parallelism)


def run_job(
    args: argparse.Namespace, work: Path, records: int, build: Callable[[Any, int, dict[str, Any]], None]
) -> dict[str, Any]:
    """One job on a fresh graph: ``build(pw, records, notes)`` adds the source and the
    sinks; returns ``notes`` with the time the first record was read and the end of the run."""
    import pathway as pw
    from pathway.internals.parse_graph import G

    G.clear()
    notes: dict[str, Any] = {"first": None}
    build(pw, records, notes)
    store = work / f"persistence-{records}-{time.monotonic_ns()}"
    config = pw.persistence.Config(
        pw.persistence.Backend.filesystem(str(store)),
        snapshot_interval_ms=max(args.checkpoint_interval_ms, 0),
    )
    started = time.time()
    pw.run(
        persistence_config=config if args.checkpoint_interval_ms > 0 else None,
        monitoring_level=pw.MonitoringLevel.NONE,
    )
    notes["end"] = time.time()
    if notes["first"] is None:
        notes["first"] = started
    notes["seconds"] = notes["end"] - notes["first"]
    shutil.rmtree(store, ignore_errors=True)
    return notes


def write_csv_once(
    path: Path, header: str, records: int, rows: Callable[[int, int], Iterable[tuple[int, ...]]]
) -> None:
    """Write ``records`` rows (``rows(lo, hi)`` gives those from ``lo`` to ``hi``), ``BATCH`` at
    a time, under ``header`` into ``path``, unless an earlier job of the run wrote it: the csv
    variant's input, written before the clock starts."""
    if path.exists():
        return
    with path.open("w") as f:
        f.write(header + "\n")
        for lo in range(0, records, BATCH):
            f.write("".join(",".join(map(str, row)) + "\n" for row in rows(lo, min(records, lo + BATCH))))


def numbers_source(pw: Any, args: argparse.Namespace, work: Path, records: int, notes: dict[str, Any]) -> Any:
    """W1's records ``(k, v) = (i % keys, i)`` as a Pathway table (``--mode``)."""

    class Numbers(pw.Schema):
        k: int
        v: int

    if args.mode == "csv":
        path = work / f"numbers-{records}.csv"
        write_csv_once(path, "k,v", records, lambda lo, hi: ((i % args.keys, i) for i in range(lo, hi)))
        return pw.io.csv.read(str(path), schema=Numbers, mode="static", name=f"numbers{records}")

    keys = args.keys

    class Subject(pw.io.python.ConnectorSubject):
        @property
        def _deletions_enabled(self) -> bool:
            return False

        def run(self) -> None:
            notes["first"] = time.time()
            add = self.next
            for i in range(records):
                add(k=i % keys, v=i)

    return pw.io.python.read(
        Subject(), schema=Numbers, autocommit_duration_ms=args.autocommit_ms, name=f"numbers{records}"
    )


def w1_build(
    args: argparse.Namespace, work: Path, collect: list[tuple[int, int]] | None
) -> Callable[..., None]:
    def build(pw: Any, records: int, notes: dict[str, Any]) -> None:
        t = numbers_source(pw, args, work, records, notes)
        sums = t.groupby(t.k).reduce(t.k, s=pw.reducers.sum(t.v))
        if collect is None:
            pw.io.null.write(sums)
            return

        def on_change(key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
            if is_addition:
                collect.append((time, row["k"], row["s"]))  # type: ignore[arg-type]

        pw.io.subscribe(sums, on_change=on_change)

    return build


def w5_build(args: argparse.Namespace, work: Path, checks: list[dict[str, Any]]) -> Callable[..., None]:
    from w5_events import OUT_OF_ORDERNESS_MS, WINDOW_MS, ResultCheck, W5Events

    def build(pw: Any, records: int, notes: dict[str, Any]) -> None:
        events = W5Events(records, args.keys, args.per_event_second, args.parallelism)

        class Event(pw.Schema):
            k: int
            v: int
            ts: int

        if args.mode == "csv":
            path = work / f"events-{records}.csv"
            write_csv_once(path, "k,v,ts", records, lambda lo, hi: events.records_of(range(lo, hi)))
            table = pw.io.csv.read(str(path), schema=Event, mode="static", name=f"events{records}")
        else:

            class Subject(pw.io.python.ConnectorSubject):
                @property
                def _deletions_enabled(self) -> bool:
                    return False

                def run(self) -> None:
                    notes["first"] = time.time()
                    add = self.next
                    for lo in range(0, records, BATCH):
                        for k, v, ts in events.records_of(range(lo, min(records, lo + BATCH))):
                            add(k=k, v=v, ts=ts)

            table = pw.io.python.read(
                Subject(), schema=Event, autocommit_duration_ms=args.autocommit_ms, name=f"events{records}"
            )
        results = table.windowby(
            table.ts,
            window=pw.temporal.tumbling(duration=WINDOW_MS),
            instance=table.k,
            behavior=pw.temporal.exactly_once_behavior(shift=OUT_OF_ORDERNESS_MS),
        ).reduce(k=pw.this._pw_instance, start=pw.this._pw_window_start, s=pw.reducers.sum(pw.this.v))
        check = ResultCheck(events)
        retracted = [0]

        def on_change(key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
            if not is_addition:
                retracted[0] += 1
                return
            check.add(row["k"], row["s"], row["start"], int(wall_clock() * 1000))

        def on_end() -> None:
            checks.append({**check.to_json(), "retracted": retracted[0]})

        pw.io.subscribe(results, on_change=on_change, on_end=on_end)

    return build


def run(args: argparse.Namespace) -> dict[str, Any]:
    from steady import Timed, steady_figures, w1_check, w1_check_error
    from w5_events import W5Events, exactness_error, verify

    _configure_threads(args.parallelism)
    started = time.monotonic()
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    sizes = (args.records, args.records * args.steady_factor, args.records)
    figures: dict[str, Any] = {}
    if args.workload == "w5":
        checks: list[dict[str, Any]] = []
        build = w5_build(args, work, checks)
        timed = []
        for records in sizes:
            checks.clear()
            notes = run_job(args, work, records, build)
            events = W5Events(records, args.keys, args.per_event_second, args.parallelism)
            verdict = verify(events, checks)
            if error := exactness_error(verdict):
                raise RuntimeError(error)
            if checks[0]["retracted"]:
                raise RuntimeError(f"W5: {checks[0]['retracted']} window results were retracted")
            timed.append(Timed(records, notes["seconds"]))
            if not figures:
                figures.update(verdict)
        figures.update(
            windows=args.records // args.per_event_second,
            keys=args.keys,
            records_per_event_second=args.per_event_second,
            latency_p50_ms=None,
            latency_p99_ms=None,
            latency_max_ms=None,
        )
    else:
        build = w1_build(args, work, None)
        timed = [Timed(n, run_job(args, work, n, build)["seconds"]) for n in sizes]
        if args.check_records > 0:
            collected: list[tuple[int, int, int]] = []
            run_job(args, work, args.check_records, w1_build(args, work, collected))  # type: ignore[arg-type]
            collected.sort(key=lambda row: row[0])  # Pathway's logical time, in commit order
            check = w1_check(args.check_records, args.keys, [(k, s) for _, k, s in collected])
            if error := w1_check_error(check):
                raise RuntimeError(error)
            figures.update(check)
    cold, big, small = timed
    figures.update(steady_figures(cold, small, big))
    return {
        **figures,
        "wall_s": round(time.monotonic() - started, 3),
        "parallelism": args.parallelism,
        "pathway_threads": args.parallelism,
        "checkpoint_interval_ms": args.checkpoint_interval_ms,
        "snapshot_interval_ms": args.checkpoint_interval_ms,
        "autocommit_ms": args.autocommit_ms if args.mode == "subject" else None,
        "steady_factor": args.steady_factor,
        "checkpoints_completed": None,
        "checkpoint_p50_ms": None,
        "checkpoint_max_ms": None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--per-event-second", type=int, default=100_000)
    parser.add_argument("--mode", choices=["subject", "csv"], default="subject")
    parser.add_argument(
        "--autocommit-ms", type=int, default=100, help="subject: the source's commit interval"
    )
    parser.add_argument("--steady-factor", type=int, default=2)
    parser.add_argument("--check-records", type=int, default=100_000, help="W1's correctness check; 0: none")
    for name, kind in (
        ("--rate", float),
        ("--duration-s", float),
        ("--value-bytes", int),
        ("--update-fraction", float),
        ("--update-s", float),
    ):
        parser.add_argument(name, type=kind, default=None)  # the protocol's; W1 and W5 do not use them
    return parser.parse_args(argv)


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    signal.signal(signal.SIGTERM, _terminate)
    result: dict[str, Any] = {"system": SYSTEM, "variant": args.mode, "workload": args.workload}
    code = 0
    try:
        if args.workload not in IMPLEMENTED:
            raise NotImplementedError(
                f"{args.workload} is not implemented for pathway (it runs {', '.join(IMPLEMENTED)}, "
                "the throughput anchors)"
            )
        result.update(ok=True, **run(args))
    except KeyboardInterrupt as exc:
        result.update(ok=False, error=f"KeyboardInterrupt: {str(exc) or 'interrupted'}")
        code = 130
    except Exception as exc:
        log.exception("Run failed")
        result.update(ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}")
    sys.stdout.flush()
    sys.stderr.flush()
    print(json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
