"""Keyed state on RocksDB with incremental checkpoints: spending limits for many users.

Run it with ``python examples/large_state_rocksdb.py`` (``--executor local`` for threads).

The job::

    DataGeneratorSource: first one payment of every user, then payments of a few hot users
      -> key_by(user)
      -> SpendingLimit (a KeyedProcessFunction: each user's running total in ValueState,
                        an alert the first time it passes the limit)
      -> collected alerts

Every user leaves a state behind, so the state grows with the number of users and not with
what fits in memory: ``EmbeddedRocksDBStateBackend`` keeps it serialized in an embedded
RocksDB per subtask on local disk, with the slot's memory budget
(``taskmanager.memory.managed.size``, 64 MB here) bounding RocksDB's caches and chandy's
cache of decoded values together. With incremental checkpoints, a checkpoint uploads only the
RocksDB files the checkpoint storage does not have yet: once the first payments of all users
are checkpointed, later checkpoints (only the hot users change) upload a small part of the
state; every few checkpoints RocksDB's compaction merges the small files of recent changes
with older ones, and that checkpoint uploads the merged file (with state this small, all of
it). The program prints each completed checkpoint's full state size and what it uploaded.

Options: ``--users N`` (default 200,000), ``--hot-payments N`` (default 200,000),
``--executor local|spark`` (default ``spark``), ``--checkpoint-dir DIR`` (default: a new
temporary directory, deleted at the end). See ``docs/state-backends.md``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
from typing import Any

from chandy import StreamExecutionEnvironment, WatermarkStrategy
from chandy.connectors import DataGeneratorSource
from chandy.core.functions import KeyedProcessFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor
from chandy.datastream.state_backend import EmbeddedRocksDBStateBackend

#: A user's running total that raises an alert once it passes this.
LIMIT = 1_000
#: One user in this many is hot: after every user's first payment, only hot users pay.
HOT_ONE_IN = 100


def payment(i: int, users: int) -> tuple[int, int]:
    """Payment ``i``: ``(user, amount)``. The first ``users`` payments are one per user; the
    rest go to the hot users (1 %), spread by a multiplicative hash."""
    user = i if i < users else (i * 2_654_435_761 % (users // HOT_ONE_IN)) * HOT_ONE_IN
    return user, i % 97 + 1


class Payments:
    """``DataGeneratorSource``'s generator (a class, so that it pickles with its ``users``)."""

    def __init__(self, users: int) -> None:
        self.users = users

    def __call__(self, i: int) -> tuple[int, int]:
        return payment(i, self.users)


class SpendingLimit(KeyedProcessFunction):
    """Each user's running total; ``(user, total)`` the first time it passes :data:`LIMIT`."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.total = runtime_context.get_state(ValueStateDescriptor("total"))

    def process_element(self, value: tuple[int, int], ctx: KeyedProcessFunction.Context) -> Any:
        before = self.total.value() or 0
        after = before + value[1]
        self.total.update(after)
        if before <= LIMIT < after:
            yield ctx.get_current_key(), after


def expected_alerts(users: int, hot_payments: int) -> list[tuple[int, int]]:
    """What the job must emit, computed without it (the example's own check)."""
    totals: dict[int, int] = {}
    alerts = []
    for i in range(users + hot_payments):
        user, amount = payment(i, users)
        before = totals.get(user, 0)
        totals[user] = before + amount
        if before <= LIMIT < before + amount:
            alerts.append((user, before + amount))
    return sorted(alerts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--hot-payments", type=int, default=200_000)
    parser.add_argument("--executor", choices=("local", "spark"), default="spark")
    parser.add_argument("--checkpoint-dir", default=None)
    args = parser.parse_args()
    if args.users < HOT_ONE_IN:
        parser.error(f"--users must be at least {HOT_ONE_IN} (one user in {HOT_ONE_IN} is hot)")
    checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="chandy-rocksdb-example-")

    env = StreamExecutionEnvironment.get_execution_environment(executor=args.executor)
    env.set_parallelism(2)
    env.set_state_backend(EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=True))
    env.configure({"taskmanager.memory.managed.size": "64mb"})
    env.enable_checkpointing(250)
    env.get_checkpoint_config().set_checkpoint_storage(checkpoint_dir)

    total = args.users + args.hot_payments
    # One source subtask, paced: the first payments of all users come before the hot ones,
    # and the job runs long enough (about 4 s) for a dozen checkpoints.
    payments = env.from_source(
        DataGeneratorSource(Payments(args.users), total, total / 4),
        WatermarkStrategy.no_watermarks(),
        "payments",
    ).set_parallelism(1)
    alerts = (
        payments.key_by(lambda p: p[0])
        .process(SpendingLimit())
        .uid("limits")
        .execute_and_collect("spending limits on RocksDB")
    )
    got = sorted(alerts)
    history = alerts.job_client.get_checkpoint_statistics()["history"]  # the latest ten

    print(f"{args.users} users, {total} payments, {len(got)} users passed the limit of {LIMIT}")
    for checkpoint in sorted(history, key=lambda c: c["id"]):
        if checkpoint["status"] == "COMPLETED":
            state, uploaded = checkpoint["state_size"], checkpoint["checkpointed_size"]
            share = f"{100 * uploaded / state:.0f} %" if state else "-"
            sizes = f"state {state / 1e6:7.2f} MB, uploaded {uploaded / 1e6:7.2f} MB ({share})"
            print(f"checkpoint {checkpoint['id']:3}: {sizes}")
    if got != expected_alerts(args.users, args.hot_payments):
        raise SystemExit("the alerts differ from what the payments make: not exactly once")
    print("alerts exactly as expected")
    if args.checkpoint_dir is None:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
