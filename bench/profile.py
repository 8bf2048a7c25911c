"""``python -m bench.profile``: where W1v's (or W5v's) time goes, from cProfile of a local-executor run.

On the local executor every subtask is a thread of this process, and cProfile profiles one
thread: every thread the run starts gets a profiler of its own (``threading.setprofile``
hands each new thread a hook that replaces itself with one), and their statistics are merged.
The batch path calls Python once per batch, not per record, so cProfile's cost per call
distorts it little; the figures are seconds of the threads' time (a thread waiting on the
interpreter lock or a queue counts too), grouped by where the code lives, and the functions
that took the most time themselves.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import pstats
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.systems.chandy_runner import w1v_job, w5v_job
from bench.systems.w5_events import W5Events, last_arrival
from bench.timing import read_timings
from chandy import StreamExecutionEnvironment

#: Where a function's own time is counted, by the first pattern its file name holds.
AREAS = (
    ("chandy/task/operators/batch", "batch operators (grouping, columnar aggregation)"),
    ("chandy/state/columnar", "columnar keyed state"),
    ("chandy/state/arrow_keys", "key groups of a column"),
    ("chandy/task/arrow", "Arrow partitioners and record writer"),
    ("chandy/network", "channels and serialization"),
    ("chandy/connectors", "sources"),
    ("chandy/task", "task loop, chain, other operators"),
    ("chandy/checkpoint", "checkpoints"),
    ("chandy/", "other chandy"),
    ("bench/", "the bench's functions (key column, W5v's events, timing and check sinks)"),
    ("pyarrow", "pyarrow (Python side)"),
    ("numpy", "numpy (Python side)"),
    ("threading", "threads: waits and locks"),
    ("queue", "threads: waits and locks"),
)


def area_of(filename: str, function: str) -> str:
    for pattern, area in AREAS:
        if pattern in filename:
            return area
    if filename == "~":  # a C function: method of a builtin, numpy or pyarrow compute kernel
        if "acquire" in function or "wait" in function or "sleep" in function:
            return "threads: waits and locks"
        return "C functions (numpy, pyarrow kernels, builtins)"
    return "other Python"


def _w5v_span(directory: str) -> float:
    """W5v's first record at a source to its last result at a sink (s), from their notes."""
    passes = [json.loads(p.read_text()) for p in Path(directory).glob("passes-*.json")]
    checks = [json.loads(p.read_text()) for p in Path(directory).glob("results-*.json")]
    return last_arrival(checks) - min(p["first"] for p in passes if p["first"] is not None)


def profiled_run(
    records: int,
    parallelism: int,
    keys: int,
    checkpoint_interval_ms: int,
    cpu_clock: bool = False,
    workload: str = "w1v",
) -> tuple[pstats.Stats, dict[str, Any]]:
    """``cpu_clock``: time every thread by its own CPU time (``time.thread_time``) instead of
    the wall clock, so waits (the interpreter lock, queues, ``fsync``) count nothing."""
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def new_profile() -> cProfile.Profile:
        return cProfile.Profile(time.thread_time) if cpu_clock else cProfile.Profile()

    def start(frame: Any, event: str, arg: Any) -> None:
        profile = new_profile()
        with lock:
            profiles.append(profile)
        profile.enable()  # replaces this hook for the thread

    main = new_profile()
    with tempfile.TemporaryDirectory(prefix="chandy-profile-") as tmp:
        env = StreamExecutionEnvironment.get_execution_environment(executor="local")
        env.set_parallelism(parallelism)
        if checkpoint_interval_ms:
            env.enable_checkpointing(checkpoint_interval_ms)
            env.get_checkpoint_config().set_checkpoint_storage(f"{tmp}/checkpoints")
        if workload == "w5v":
            events = W5Events.rounded(records, keys=keys, parallelism=parallelism)
            records = events.records
            env.configure({"pipeline.auto-watermark-interval": 200})
            w5v_job(env, events, tmp)
        else:
            w1v_job(env, records, keys, tmp)
        threading.setprofile(start)
        started = time.perf_counter()
        main.enable()
        try:
            client = env.execute_async(f"{workload}, profiled")
            client.get_job_execution_result()
        finally:
            main.disable()
            threading.setprofile(None)  # type: ignore[arg-type]
        wall = time.perf_counter() - started
        if workload == "w5v":
            span = _w5v_span(tmp)
        else:
            timing = read_timings(tmp)
            span = timing["last"] - timing["first"]
    stats = pstats.Stats(main)
    for profile in profiles:
        stats.add(profile)
    return stats, {
        "records": records,
        "wall_s": wall,
        "records_per_s_profiled": records / span if span > 0 else None,
        "threads_profiled": len(profiles) + 1,
        "checkpoints": (
            client.get_checkpoint_statistics()["counts"]["completed"] if checkpoint_interval_ms else 0
        ),
    }


#: The checkpoint path's functions (``file:function``) that ``--checkpoint-path`` lists.
CHECKPOINT_PATH = (
    "task/checkpointing.py:checkpoint_state",
    "task/checkpointing.py:_serialize_step",
    "task/checkpointing.py:_write_and_acknowledge",
    "task/operator_chain.py:snapshot_state",
    "state/columnar.py:snapshot",
    "state/columnar.py:serialize",
    "storage/checkpoint_storage.py:write_state",
    "checkpoint/coordinator.py:receive_acknowledge_message",
    "checkpoint/pending_checkpoint.py:write_metadata",
    "checkpoint/completed_checkpoint.py:discard",
)


def checkpoint_path(stats: pstats.Stats, checkpoints: int | None) -> list[str]:
    """Cumulative time of :data:`CHECKPOINT_PATH`'s functions, in total and per checkpoint
    (``_serialize_step`` and ``checkpoint_state`` run on the task threads, the others on the
    checkpoint I/O pool and the JobMaster)."""
    entries = stats.stats.items()  # type: ignore[attr-defined]
    found = sorted(
        (
            (cumtime, calls, f"{filename}:{function}")
            for (filename, _, function), (_, calls, _, cumtime, _) in entries
        ),
        reverse=True,
    )
    lines = [f"checkpoint path ({checkpoints} checkpoints completed), cumulative:"]
    for cumtime, calls, name in found:
        if any(name.endswith(wanted) for wanted in CHECKPOINT_PATH):
            each = f"{cumtime / checkpoints * 1e3:7.2f} ms a checkpoint" if checkpoints else ""
            lines.append(f"  {cumtime:7.3f} s {each}  {calls:6d} calls  {name.split('chandy/', 1)[-1]}")
    return lines


def by_area(stats: pstats.Stats) -> dict[str, float]:
    """Own time (``tottime``) of every function, summed by :data:`AREAS`."""
    areas: dict[str, float] = defaultdict(float)
    for (filename, _, function), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        areas[area_of(filename, function)] += tottime
    return dict(sorted(areas.items(), key=lambda kv: -kv[1]))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--workload", choices=("w1v", "w5v"), default="w1v")
    parser.add_argument("--records", type=int, default=20_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000)
    parser.add_argument("--top", type=int, default=25, help="functions listed by own time")
    parser.add_argument(
        "--cpu-clock",
        action="store_true",
        help="seconds of each thread's CPU (time.thread_time), not of the wall clock: what a "
        "checkpoint costs in CPU, whatever the other tenants of the machine do",
    )
    parser.add_argument(
        "--checkpoint-path",
        action="store_true",
        help="also list the cumulative time of the checkpoint path's functions, per checkpoint",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    stats, run = profiled_run(
        args.records, args.parallelism, args.keys, args.checkpoint_interval_ms, args.cpu_clock, args.workload
    )
    areas = by_area(stats)
    total = sum(areas.values())
    name = args.workload[0].upper() + args.workload[1:]
    out = [f"{name} on the local executor, profiled: {run}", "", "own time by area (all threads):"]
    out += [f"  {seconds:8.2f} s  {seconds / total:6.1%}  {area}" for area, seconds in areas.items()]
    listing = io.StringIO()
    stats.stream = listing  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(args.top)
    out += ["", listing.getvalue()]
    if args.checkpoint_path:
        out += ["", *checkpoint_path(stats, run["checkpoints"])]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
