"""Flink SQL reference runner: W1, W3 and W5 in Flink's JVM engine, written in SQL, no Python
per record.

The runner protocol and the workloads are described in ``bench/systems/__init__.py``.
This script runs with the Python of PyFlink's environment (``apache-flink`` 2.3.0, the
same installation as ``pyflink_runner.py``, whose JVM and process handling it reuses) and
drives Flink's Table API: PyFlink only plans and submits the job; sources, keyed state,
windows and sinks are Flink's generated Java code. It is the strongest anchor for what a
JVM engine does with the same work, not a Python API.

Jobs (parallelism ``--parallelism``, heap state, checkpoints every
``--checkpoint-interval-ms`` to local disk)::

    -- W1: a keyed running SUM, one update per input row (Flink's default, per record)
    INSERT INTO sink SELECT MOD(i, keys) AS k, SUM(i) AS s FROM numbers GROUP BY MOD(i, keys)
    -- W5: 1 s tumbling event-time windows per key, watermark 200 ms behind
    INSERT INTO sink SELECT k, window_start, SUM(i)
      FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' SECOND))
      GROUP BY k, window_start, window_end

``--mode``: ``per_record`` (default) or ``minibatch`` (``table.exec.mini-batch.enabled``
with ``allow-latency`` and ``size``: Flink then buffers rows per key, pre-aggregates them
before the shuffle (local-global aggregation) and emits one update per key and batch,
not one per row). W5's window aggregation pre-aggregates per window slice in both modes.

Sources (``--source``)
----------------------
* ``numbers`` (default): Flink's ``NumberSequenceSource`` (the DataStream source the
  PyFlink runner reads) as a table (``from_data_stream``: a Java stream, no Python in
  it), ``p`` contiguous splits. W5's record ``i`` is computed in SQL from the number ``n``
  exactly as ``W5Events.strided`` does, so each source subtask reads ``s, s + p, ...``
  with W5's timestamps: the same events, in the same order per subtask, as every other
  system.
* ``datagen``: SQL's ``datagen`` connector, ``fields.i.kind = sequence`` (``rows-per-second``
  far above what it reaches, so unthrottled). Its subtasks read ``s, s + p, ...``
  natively, so W5's events need no remapping. It is the textbook SQL source, but the
  sequence generator (the legacy ``SourceFunction``, still behind the connector in 2.3)
  holds every number it has yet to emit as a boxed ``Long`` in a deque and copies that
  deque into every checkpoint (tens of MB per checkpoint and hundreds of MB of heap at
  W1's sizes, a cost of the source, not of the keyed sum); and in this runner's setting
  (no final checkpoint) Flink stopped its checkpoint scheduler early in every datagen job
  tried (``Stopping checkpoint scheduler, current job status: RUNNING`` in the log) and
  took no checkpoint at all, a cause not looked into further. Hence not the default.

W5's timestamps are the closed form of ``W5Events.timestamp`` in SQL (``MOD`` and
integer arithmetic on ``i``), the watermark ``WATERMARK FOR ts AS ts - INTERVAL '0.2'
SECOND`` (Flink's bounded out-of-orderness; emitted every 200 ms, Flink's default), so the
out-of-order pattern and the results are exactly W5's.

How the figures are taken
-------------------------
* A blackhole sink has no first or last record to note, and the mini-cluster (with its
  REST API) goes away with the job, so a job's time is its own runtime from Flink's
  ``JobExecutionResult.getNetRuntime()``: from the job's creation in the JobManager to
  its end (task deployment and start-up included; the JVM's start, the SQL planning and
  the submission not). ``records_per_s`` is ``records`` over it, for the first job of a
  fresh JVM, like every other runner's single cold run.
* ``steady_records_per_s`` (the figure chandy's ratios use): the runner then runs the job
  again at ``--steady-factor`` times the records and once more at ``records``, both on
  the warm JVM, and takes ``(N2 - N1) / (t2 - t1)`` (``steady.py``): start-up, submission,
  deployment and JIT warm-up cancel out.
  ``execution.checkpointing.checkpoints-after-tasks-finish`` is off: the blackhole sink
  commits nothing, and the final checkpoint would only add a wait of up to one interval
  for the next trigger to every job's end, noise in the difference.
* Checkpoint figures come from the JobManager's log lines (``pyflink_runner.checkpoints_of``)
  of the first job.
* Correctness (``--check-records``, default 100,000 for W1 and 3 windows for W5; 0 skips):
  after the timed jobs the same query runs once more on that many records, its changelog
  written by Flink's ``FileSink`` (``changelog``; no Python per row) and read back: W1's
  ``+I``/``+U`` rows (``-U`` left out) must end in every key's exact sum
  (``steady.w1_check``; per record there is an update per record, but for one that leaves
  the sum as it was, which Flink does not emit: record 0 when key 0 saw another first), W5's
  results must be every (key, window) sum once and exact (``w5_events.verify``). A check that
  fails fails the run.
* W3 (``w3_figures``): ``rate`` records/s from Flink's rate-limited ``DataGeneratorSource``
  (the PyFlink runner's ``rate_limited_source``), each stamped ``CURRENT_ROW_TIMESTAMP()``
  in the projection chained to the source, W1's running sum carrying its record's stamp
  (``LAST_VALUE``), and ``CURRENT_ROW_TIMESTAMP()`` again in the projection chained to the
  sink: the latency is the difference (one clock, 1 ms resolution; Flink's network buffers
  flush every 100 ms, its default, as in the PyFlink runner). The rows are written by the
  check's ``FileSink``; the first second is left out.
* W5's latency is not measured (a blackhole sink has no arrival times, and the check's
  files say nothing of when a result was written): ``latency_*`` are ``null``.
"""

from __future__ import annotations

import argparse
import calendar
import json
import logging
import os
import signal
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.common.serialization import Encoder
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.datastream.connectors.file_system import FileSink
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.java_gateway import get_gateway
from pyflink.table import DataTypes, Schema, StreamTableEnvironment, Table
from pyflink_runner import (
    RunFailed,
    checkpoint_figures,
    checkpoints_of,
    describe,
    free_port,
    note_descendants,
    percentile,
    process_age_s,
    rate_limited_source,
    stop_jvm,
)
from steady import Timed, steady_figures, w1_check, w1_check_error
from w5_events import (
    OUT_OF_ORDERNESS_MS,
    WINDOW_MS,
    ResultCheck,
    W5Events,
    exactness_error,
    sql_strided,
    sql_timestamp_ms,
    verify,
)

log = logging.getLogger("flink_sql_runner")

SYSTEM = "flink_sql"
WORKLOADS = ("w1", "w2", "w3", "w4", "w4r", "w5", "w6", "w1v", "w3v")
IMPLEMENTED = ("w1", "w3", "w5")
#: W5's correctness check: this many windows of events, every result read back.
W5_CHECK_WINDOWS = 3


def unique(prefix: str) -> str:
    """A fresh table name: every job of a run registers its own tables in one environment."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def make_table_env(
    args: argparse.Namespace, work: Path, final_checkpoint: bool = False
) -> tuple[StreamExecutionEnvironment, StreamTableEnvironment]:
    """A streaming table environment on a local mini-cluster configured for the benchmark."""
    config = Configuration()
    rest_port = str(free_port())
    for key, value in {
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "rest.port": rest_port,
        "rest.bind-port": rest_port,
        "parallelism.default": str(args.parallelism),
        "taskmanager.numberOfTaskSlots": str(args.parallelism),
        # Flink's scratch files go to the work dir: the JVM is ended by a signal.
        "io.tmp.dirs": str(work / "tmp"),
        "restart-strategy.type": "none",
        "execution.checkpointing.storage": "filesystem",
        "execution.checkpointing.dir": (work / "checkpoints").as_uri(),
        "execution.checkpointing.checkpoints-after-tasks-finish": str(final_checkpoint).lower(),
        "pipeline.auto-watermark-interval": "200 ms",
        "table.local-time-zone": "UTC",
    }.items():
        config.set_string(key, value)
    if args.checkpoint_interval_ms > 0:
        config.set_string("execution.checkpointing.interval", f"{args.checkpoint_interval_ms} ms")
        config.set_string("execution.checkpointing.mode", "EXACTLY_ONCE")
    if args.mode == "minibatch":
        config.set_string("table.exec.mini-batch.enabled", "true")
        config.set_string("table.exec.mini-batch.allow-latency", f"{args.minibatch_latency_ms} ms")
        config.set_string("table.exec.mini-batch.size", str(args.minibatch_size))
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(args.parallelism)
    return env, StreamTableEnvironment.create(env)


def numbers(
    env: StreamExecutionEnvironment, t_env: StreamTableEnvironment, args: argparse.Namespace, records: int
) -> Table:
    """``0..records-1`` as a table of one BIGINT column ``n`` (``--source``)."""
    if args.source == "datagen":
        name = unique("numbers")
        t_env.execute_sql(
            f"CREATE TEMPORARY TABLE {name} (n BIGINT) WITH ("
            "'connector' = 'datagen', 'fields.n.kind' = 'sequence', 'fields.n.start' = '0', "
            f"'fields.n.end' = '{records - 1}', 'rows-per-second' = '1000000000000')"
        )
        return t_env.from_path(name)
    source = env.from_source(
        NumberSequenceSource(0, records - 1), WatermarkStrategy.no_watermarks(), "numbers", Types.LONG()
    )
    return t_env.from_data_stream(source).alias("n")


def w5_source(
    env: StreamExecutionEnvironment, t_env: StreamTableEnvironment, args: argparse.Namespace, events: W5Events
) -> str:
    """A fresh table of W5's events, ``(i, k, ts)`` with W5's watermark on ``ts``; its name."""
    name = unique("events")
    if args.source == "datagen":
        t_env.execute_sql(
            f"CREATE TEMPORARY TABLE {name} ("
            "i BIGINT, "
            f"k AS MOD(i, {events.keys}), "
            f"ts AS TO_TIMESTAMP_LTZ({sql_timestamp_ms('i', events)}, 3), "
            f"WATERMARK FOR ts AS ts - INTERVAL '{OUT_OF_ORDERNESS_MS / 1000:g}' SECOND"
            ") WITH ("
            "'connector' = 'datagen', 'fields.i.kind' = 'sequence', 'fields.i.start' = '0', "
            f"'fields.i.end' = '{events.records - 1}', 'rows-per-second' = '1000000000000')"
        )
        return name
    source = env.from_source(
        NumberSequenceSource(0, events.records - 1),
        WatermarkStrategy.no_watermarks(),
        "numbers",
        Types.LONG(),
    )
    i = sql_strided("f0", events)
    schema = (
        Schema.new_builder()
        .column("f0", DataTypes.BIGINT())
        .column_by_expression("i", i)
        .column_by_expression("k", f"MOD({i}, {events.keys})")
        .column_by_expression("ts", f"TO_TIMESTAMP_LTZ({sql_timestamp_ms(i, events)}, 3)")
        .watermark("ts", f"ts - INTERVAL '{OUT_OF_ORDERNESS_MS / 1000:g}' SECOND")
        .build()
    )
    t_env.create_temporary_view(name, t_env.from_data_stream(source, schema))
    return name


def w1_query(
    env: StreamExecutionEnvironment, t_env: StreamTableEnvironment, args: argparse.Namespace, records: int
) -> Table:
    view = unique("w1_numbers")
    t_env.create_temporary_view(view, numbers(env, t_env, args, records))
    return t_env.sql_query(
        f"SELECT MOD(n, {args.keys}) AS k, SUM(n) AS s FROM {view} GROUP BY MOD(n, {args.keys})"
    )


def w5_query(
    env: StreamExecutionEnvironment, t_env: StreamTableEnvironment, args: argparse.Namespace, events: W5Events
) -> Table:
    view = w5_source(env, t_env, args, events)
    return t_env.sql_query(
        f"SELECT k, window_start, SUM(i) AS s FROM TABLE(TUMBLE(TABLE {view}, DESCRIPTOR(ts), "
        f"INTERVAL '{WINDOW_MS // 1000}' SECOND)) GROUP BY k, window_start, window_end"
    )


def timed_job(
    t_env: StreamTableEnvironment, query: Table, records: int, deadline: float
) -> tuple[Timed, str]:
    """Runs ``query`` into a blackhole sink; its records and its runtime in the JobManager."""
    sink = unique("blackhole")
    columns = ", ".join(
        f"`{name}` {dtype}"
        for name, dtype in zip(
            query.get_schema().get_field_names(),
            (str(t).replace(" NOT NULL", "") for t in query.get_schema().get_field_data_types()),
            strict=True,
        )
    )
    t_env.execute_sql(f"CREATE TEMPORARY TABLE {sink} ({columns}) WITH ('connector' = 'blackhole')")
    result = query.execute_insert(sink)
    client = result.get_job_client()
    job_id = str(client.get_job_id())
    future = client.get_job_execution_result()
    while not future.done():
        if time.monotonic() > deadline:
            client.cancel().result()
            raise TimeoutError("the job did not finish within the run's timeout")
        note_descendants()
        time.sleep(0.05)
    net_ms = future.result().get_net_runtime()
    log.info("Job %s: %d records in %.3f s", job_id, records, net_ms / 1000)
    return Timed(records, net_ms / 1000), job_id


def changelog(args: argparse.Namespace, work: Path, build: Any) -> list[tuple[str, list[str]]]:
    """Runs ``build(env, t_env)``'s table into files, in a job of its own; its rows in the
    order each sink subtask wrote them: ``(kind, fields)``, kind ``+I``, ``-U``, ``+U`` or
    ``-D``.

    The rows leave the table as a changelog stream (``toChangelogStream``) into Flink's
    ``FileSink``, which writes each ``Row`` as Java prints it (``+U[3, 40003]``): no Python
    per row (PyFlink's ``collect()`` crosses py4j once a row: tens of seconds for 100,000).
    The job has its own environment, with Flink's final checkpoint at the end of the input
    (the file sink commits its files on it)."""
    out = work / f"check-{uuid.uuid4().hex[:8]}"
    env, t_env = make_table_env(args, work, final_checkpoint=True)
    stream = t_env.to_changelog_stream(build(env, t_env))
    stream.sink_to(FileSink.for_row_format(out.as_uri(), Encoder.simple_string_encoder()).build())
    env.execute("flink-sql-check")
    rows = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        for line in path.read_text().splitlines():
            kind, _, rest = line.partition("[")
            rows.append((kind, [f.strip() for f in rest.rstrip("]").split(",")]))
    return rows


def w1_collect_check(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """W1's query on ``--check-records`` records, its changelog checked in Python."""
    rows = changelog(args, work, lambda env, t_env: w1_query(env, t_env, args, args.check_records))
    updates = [(int(k), int(s)) for kind, (k, s) in rows if kind in ("+I", "+U")]
    return w1_check(args.check_records, args.keys, updates)


def w5_collect_check(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """W5's query on a few windows, every (key, window) sum checked in Python."""
    events = W5Events(
        W5_CHECK_WINDOWS * args.per_event_second, args.keys, args.per_event_second, args.parallelism
    )
    check = ResultCheck(events)
    now_ms = int(time.time() * 1000)
    for kind, (key, start, total) in changelog(
        args, work, lambda env, t_env: w5_query(env, t_env, args, events)
    ):
        if kind != "+I":
            raise RuntimeError(f"W5's window results must be inserts only; got a {kind} row")
        start_ms = calendar.timegm(datetime.fromisoformat(start).utctimetuple()) * 1000
        check.add(int(key), int(total), start_ms, now_ms)
    verdict = verify(events, [check.to_json()])
    return {f"check_{k}" if k != "exact" else k: v for k, v in verdict.items()}


def w3_figures(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """W3 in SQL: ``rate`` records/s from Flink's rate-limited ``DataGeneratorSource`` (the
    PyFlink runner's), stamped ``CURRENT_ROW_TIMESTAMP()`` as the source emits them, W1's
    keyed running sum carrying its record's stamp (``LAST_VALUE``, the key's latest), and
    ``CURRENT_ROW_TIMESTAMP()`` again in the projection chained to the sink; the latency is
    the difference (ms resolution, one clock). The first second is left out as warm-up."""
    count = int(args.rate * args.duration_s)

    def build(env: StreamExecutionEnvironment, t_env: StreamTableEnvironment) -> Table:
        paced = env.from_source(
            rate_limited_source(count, args.rate), WatermarkStrategy.no_watermarks(), "paced", Types.LONG()
        )
        view = unique("paced")
        t_env.create_temporary_view(view, t_env.from_data_stream(paced).alias("n"))
        return t_env.sql_query(
            "SELECT k, s, emitted, CURRENT_ROW_TIMESTAMP() AS arrived FROM ("
            f"SELECT MOD(n, {args.keys}) AS k, SUM(n) AS s, LAST_VALUE(emitted) AS emitted FROM ("
            f"SELECT n, CURRENT_ROW_TIMESTAMP() AS emitted FROM {view}) GROUP BY MOD(n, {args.keys}))"
        )

    stamps = [
        (datetime.fromisoformat(emitted), datetime.fromisoformat(arrived))
        for kind, (_, _, emitted, arrived) in changelog(args, work, build)
        if kind in ("+I", "+U")
    ]
    if len(stamps) < count - 1:  # Flink leaves out an update that leaves a sum as it was
        raise RuntimeError(f"W3: {len(stamps)} results for {count} records")
    start = min(emitted for emitted, _ in stamps).timestamp() + 1.0
    latencies = sorted(
        (arrived - emitted).total_seconds() * 1000
        for emitted, arrived in stamps
        if emitted.timestamp() >= start
    )
    return {
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p99_ms": percentile(latencies, 99),
        "latency_max_ms": latencies[-1],
        "records": len(latencies),
        "rate": args.rate,
        "duration_s": args.duration_s,
        "latency_resolution_ms": 1,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the workload's three timed jobs and its check; their figures. Leaves no process
    behind."""
    age = process_age_s()
    started = time.monotonic() - age
    deadline = started + args.timeout_s
    work = Path(args.work_dir).resolve()
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    log_dir = work / "flink-log"
    os.environ["FLINK_LOG_DIR"] = str(log_dir)
    os.environ["FLINK_IDENT_STRING"] = "bench"
    big_records = args.records * args.steady_factor
    try:
        get_gateway()
        note_descendants()
        if args.workload == "w3":
            if args.checkpoint_interval_ms <= 0:
                raise ValueError("w3 needs checkpoints (--checkpoint-interval-ms > 0)")
            figures = w3_figures(args, work)
            return {
                **figures,
                "wall_s": round(time.monotonic() - started, 3),
                "parallelism": args.parallelism,
                "checkpoint_interval_ms": args.checkpoint_interval_ms,
            }
        env, t_env = make_table_env(args, work)
        if args.workload == "w5":
            sizes = [
                W5Events(n, args.keys, args.per_event_second, args.parallelism)
                for n in (args.records, big_records, args.records)
            ]
            jobs = [timed_job(t_env, w5_query(env, t_env, args, e), e.records, deadline) for e in sizes]
        else:
            jobs = [
                timed_job(t_env, w1_query(env, t_env, args, n), n, deadline)
                for n in (args.records, big_records, args.records)
            ]
        (cold, first_job), (big, _), (small, _) = jobs
        figures = steady_figures(cold, small, big)
        if args.checkpoint_interval_ms > 0 and not any(log_dir.glob("*.log")):
            # once, Flink wrote no log here: no checkpoint lines is then not "no checkpoints"
            figures.update(checkpoints_completed=None, checkpoint_p50_ms=None, checkpoint_max_ms=None)
            figures["checkpoint_log_missing"] = True
        else:
            checkpoints = checkpoints_of(None, log_dir, first_job)
            figures.update(checkpoint_figures(checkpoints, args.checkpoint_interval_ms > 0))
        if args.check_records > 0:
            if args.workload == "w5":
                check = w5_collect_check(args, work)
                error = exactness_error({k.removeprefix("check_"): v for k, v in check.items()})
            else:
                check = w1_collect_check(args, work)
                error = w1_check_error(check)
            if error:
                raise RuntimeError(error)
            figures.update(check)
        if args.workload == "w5":
            figures.update(
                windows=args.records // args.per_event_second,
                keys=args.keys,
                records_per_event_second=args.per_event_second,
                out_of_orderness_ms=OUT_OF_ORDERNESS_MS,
                latency_p50_ms=None,
                latency_p99_ms=None,
                latency_max_ms=None,
            )
        return {
            **figures,
            "wall_s": round(time.monotonic() - started, 3),
            "source": args.source,
            "parallelism": args.parallelism,
            "checkpoint_interval_ms": args.checkpoint_interval_ms,
            "steady_factor": args.steady_factor,
            **(
                {"minibatch_latency_ms": args.minibatch_latency_ms, "minibatch_size": args.minibatch_size}
                if args.mode == "minibatch"
                else {}
            ),
        }
    except Exception as exc:
        log.exception("Run failed")
        raise RunFailed(describe(exc)) from None
    finally:
        stop_jvm()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument(
        "--per-event-second", type=int, default=100_000, help="w5: records per second of event time"
    )
    parser.add_argument("--mode", choices=["per_record", "minibatch"], default="per_record")
    parser.add_argument("--source", choices=["numbers", "datagen"], default="numbers")
    parser.add_argument(
        "--steady-factor",
        type=int,
        default=2,
        help="the steady state's second job reads this many times --records",
    )
    parser.add_argument(
        "--check-records",
        type=int,
        default=100_000,
        help="W1: records of the correctness check (written to files, read back); W5: 3 windows; 0: none",
    )
    parser.add_argument("--minibatch-latency-ms", type=int, default=1000)
    parser.add_argument("--minibatch-size", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=1000, help="w3: records per second")
    parser.add_argument("--duration-s", type=float, default=20, help="w3: seconds of records")
    # accepted for the protocol's sake; the workloads run here do not use them
    for name, kind in (
        ("--value-bytes", int),
        ("--update-fraction", float),
        ("--update-s", float),
    ):
        parser.add_argument(name, type=kind, default=None)
    parser.add_argument("--timeout-s", type=float, default=3600)
    return parser.parse_args(argv)


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _terminate)
    result: dict[str, Any] = {"system": SYSTEM, "variant": args.mode, "workload": args.workload}
    code = 0
    try:
        if args.workload not in IMPLEMENTED:
            raise NotImplementedError(
                f"{args.workload} is not implemented for flink_sql (it runs {', '.join(IMPLEMENTED)}: "
                "the JVM anchor for throughput); use the pyflink system for the others"
            )
        result.update(ok=True, **run(args))
    except KeyboardInterrupt as exc:
        result.update(ok=False, error=f"KeyboardInterrupt: {str(exc) or 'interrupted'}")
        code = 130
    except (RunFailed, NotImplementedError) as exc:
        result.update(
            ok=False, error=str(exc) if isinstance(exc, RunFailed) else f"NotImplementedError: {exc}"
        )
    except Exception as exc:
        log.exception("Run failed")
        result.update(ok=False, error=describe(exc))
    sys.stderr.flush()
    print(json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
