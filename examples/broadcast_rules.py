"""Broadcast state: spending limits that change over time, applied to every account.

Card transactions ``(id, account, period, category, amount)`` are keyed by account; the
spending limits of each period, ``(period, {category: limit})``, are published on a
second stream that is broadcast to every subtask (``rules.broadcast(LIMITS)``), where a
``KeyedBroadcastProcessFunction`` keeps them in broadcast state. A transaction is checked
against the limits of its own period: it adds to its account's spending in that period
and category (keyed state), and an alert is printed when the spending goes over the limit.

The limits of a period are computed elsewhere and may come after the period's first
transactions. Those wait in keyed state; when the limits arrive, the broadcast side
releases the waiting transactions of every account on its subtask with
``ctx.apply_to_keyed_state``. Each account's transactions of a period are therefore
checked in the order they happened, whether they waited or not, and the alerts are
the same however the two streams interleave (the rules are paced here, to make them
late). Broadcast state is part of every checkpoint: a restarted or rescaled job has the
limits on every subtask without the rules being sent again.

Only PyFlink's names are used (but for the choice of executor and ``apply_to_keyed_state``,
which PyFlink lacks and Java Flink has): with ``pyflink`` for ``chandy`` in the imports the
rest of the job is PyFlink's. Run it with ``python examples/broadcast_rules.py``
(``--executor local`` for threads instead of a local Spark session);
``tests/test_broadcast_state.py`` checks what it prints.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from typing import Any

from chandy.common.typeinfo import Types
from chandy.datastream import StreamExecutionEnvironment
from chandy.datastream.functions import KeyedBroadcastProcessFunction, MapFunction, RuntimeContext
from chandy.datastream.state import ListStateDescriptor, MapStateDescriptor

#: Per period, the limit of each category (a category without one is not limited).
LIMITS_BY_PERIOD = [
    (1, {"groceries": 100, "travel": 300}),
    (2, {"groceries": 60, "travel": 500, "games": 20}),
    (3, {"groceries": 80}),
]

TRANSACTIONS = [
    ("t01", "alice", 1, "groceries", 40),
    ("t02", "bob", 1, "travel", 250),
    ("t03", "alice", 1, "groceries", 70),  # alice: 110 > 100
    ("t04", "dave", 1, "games", 90),  # no limit on games in period 1
    ("t05", "bob", 1, "travel", 80),  # bob: 330 > 300
    ("t06", "alice", 2, "groceries", 30),
    ("t07", "dave", 2, "games", 15),
    ("t08", "dave", 2, "games", 10),  # dave: 25 > 20
    ("t09", "bob", 2, "travel", 450),
    ("t10", "alice", 2, "groceries", 25),
    ("t11", "alice", 2, "groceries", 10),  # alice: 65 > 60
    ("t12", "bob", 3, "travel", 900),  # no limit on travel in period 3
    ("t13", "dave", 3, "groceries", 79),
    ("t14", "dave", 3, "groceries", 2),  # dave: 81 > 80
]

#: The broadcast state: period -> {category: limit}.
LIMITS = MapStateDescriptor("limits", Types.INT(), Types.MAP(Types.STRING(), Types.INT()))
#: Keyed state: the account's transactions whose period has no limits yet.
WAITING = ListStateDescriptor("waiting", Types.PICKLED_BYTE_ARRAY())
#: Keyed state: the account's spending per (period, category).
SPENT = MapStateDescriptor("spent", Types.PICKLED_BYTE_ARRAY(), Types.INT())


class SpendingLimits(KeyedBroadcastProcessFunction):
    """Input 1: transactions keyed by account; input 2: the limits of each period."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.waiting = runtime_context.get_list_state(WAITING)
        self.spent = runtime_context.get_map_state(SPENT)

    def process_element(
        self, value: Any, ctx: KeyedBroadcastProcessFunction.ReadOnlyContext
    ) -> Iterator[Any]:
        limits = ctx.get_broadcast_state(LIMITS).get(value[2])
        if limits is None:
            self.waiting.add(value)  # this period's limits are not here yet
            return
        yield from self.check(value, limits, self.spent)

    def process_broadcast_element(
        self, value: Any, ctx: KeyedBroadcastProcessFunction.Context
    ) -> Iterator[Any]:
        period, limits = value
        ctx.get_broadcast_state(LIMITS).put(period, limits)
        alerts: list[Any] = []

        def release(account: str, waiting: Any) -> None:
            # the state handles are scoped to ``account`` during this call
            still_waiting = []
            for transaction in waiting.get():
                if transaction[2] == period:
                    alerts.extend(self.check(transaction, limits, self.spent))
                else:
                    still_waiting.append(transaction)
            if still_waiting:
                waiting.update(still_waiting)
            else:
                waiting.clear()

        ctx.apply_to_keyed_state(WAITING, release)
        yield from alerts

    @staticmethod
    def check(transaction: Any, limits: dict[str, int], spent: Any) -> Iterator[Any]:
        tx_id, account, period, category, amount = transaction
        total = (spent.get((period, category)) or 0) + amount
        spent.put((period, category), total)
        limit = limits.get(category)
        if limit is not None and total > limit:
            yield "alert", tx_id, account, period, category, total, limit


class Slowly(MapFunction):
    """Paces the rules: they are late on purpose, so transactions wait for them."""

    def map(self, value: Any) -> Any:
        time.sleep(0.05)
        return value


def run(executor: str) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    transactions = env.from_collection(TRANSACTIONS)
    limits = env.from_collection(LIMITS_BY_PERIOD).map(Slowly()).set_parallelism(1)
    alerts = (
        transactions.key_by(lambda transaction: transaction[1], key_type=Types.STRING())
        .connect(limits.broadcast(LIMITS))
        .process(SpendingLimits())
    )
    alerts.print()
    env.execute("spending limits")


def main(argv: list[str] | None = None) -> None:
    """``--executor local`` runs the job on threads; the default, ``spark``, on a local Spark session."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executor", choices=["spark", "local"], default="spark")
    run(parser.parse_args(argv).executor)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
