"""The chaos job: a paced sequence -> keyed running sums -> FileSink (Parquet) and DeltaSink.

Record ``i`` goes to key ``i % keys`` and comes out as ``{key, id, count, sum}``:
``count`` and ``sum`` are the running count and sum of its key, kept in keyed state.
A record processed twice repeats a ``count`` of its key, a lost one leaves a gap,
and the final ``sum`` of a key is the sum of its ids only if each counted once: the
committed output alone shows any loss or duplicate.

Everything here is importable (not defined in ``__main__``), so cloudpickle ships it
by reference and every slot imports this module, and with it :mod:`chaos.faultyfs`,
which registers the ``faulty://`` protocol before the slot's tasks touch storage.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pyarrow as pa

import chaos.faultyfs  # noqa: F401 - registers faulty:// in every process that loads the job
from chandy import StreamExecutionEnvironment
from chandy.connectors import DeltaSink, FileSink, ParquetBulkWriters
from chandy.core.connector import Committer
from chandy.core.functions import KeyedProcessFunction, MapFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor
from chaos.faultyfs import FaultPlan, InjectedFault

SCHEMA = pa.schema([("key", pa.int64()), ("id", pa.int64()), ("count", pa.int64()), ("sum", pa.int64())])

#: How often (seconds) a running function looks for an armed fault of its own.
POLL_S = 0.05


class Pace(MapFunction):
    """Holds each subtask to ``rate`` records per second, so a run lasts long enough for
    its faults to land (sleeps only when ahead: a loaded machine does not slow it more)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def open(self, runtime_context: RuntimeContext) -> None:
        self.start = time.monotonic()
        self.count = 0

    def map(self, value: Any) -> Any:
        self.count += 1
        ahead = self.count / self.rate - (time.monotonic() - self.start)
        if ahead > 0.005:
            time.sleep(ahead)
        return value


class RunningSum(KeyedProcessFunction):
    """Running count and sum per key; raises when the plan arms a ``user`` fault."""

    def __init__(self, plan_dir: str) -> None:
        self.plan_dir = plan_dir

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count"))
        self.sum = runtime_context.get_state(ValueStateDescriptor("sum"))
        self.plan = FaultPlan(self.plan_dir)
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.next_poll = 0.0

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + POLL_S
            fault = self.plan.claim("user")
            if fault is not None:
                self.plan.record_fired(fault, subtask=self.subtask, record=value)
                raise RuntimeError(f"chaos: user function fails on purpose at record {value} ({fault.name})")
        count = (self.count.value() or 0) + 1
        total = (self.sum.value() or 0) + value
        self.count.update(count)
        self.sum.update(total)
        yield {"key": ctx.get_current_key(), "id": value, "count": count, "sum": total}


class FlakyCommitter(Committer):
    """A sink's committer that raises once when the plan arms a ``commit`` fault for it
    (before committing: the restore must commit what this attempt did not)."""

    def __init__(self, inner: Committer, plan_dir: str, sink: str) -> None:
        self.inner = inner
        self.plan = FaultPlan(plan_dir)
        self.sink = sink

    def commit(self, committables: list[Any]) -> None:
        if committables:
            fault = self.plan.claim("commit", sink=self.sink)
            if fault is not None:
                self.plan.record_fired(fault, committables=len(committables))
                raise InjectedFault(f"chaos: the {self.sink} sink's commit fails on purpose ({fault.name})")
        self.inner.commit(committables)

    def close(self) -> None:
        self.inner.close()


class ChaosFileSink(FileSink):
    def __init__(self, plan_dir: str, base_path: str) -> None:
        super().__init__(base_path, bulk_writer_factory=ParquetBulkWriters.for_records(SCHEMA))
        self.plan_dir = plan_dir

    def create_committer(self) -> Committer:
        return FlakyCommitter(super().create_committer(), self.plan_dir, "file")


class ChaosDeltaSink(DeltaSink):
    def __init__(self, plan_dir: str, table_uri: str) -> None:
        super().__init__(table_uri, SCHEMA)
        self.plan_dir = plan_dir

    def create_committer(self) -> Committer:
        return FlakyCommitter(super().create_committer(), self.plan_dir, "delta")


def key_of(value: int, keys: int) -> int:
    return value % keys


def build(
    env: StreamExecutionEnvironment, run_dir: str, plan_dir: str, records: int, keys: int, rate: float
) -> None:
    """The job of one chaos run, writing under ``run_dir`` (``parquet/``, ``delta/``)."""
    counted = (
        env.from_sequence(0, records - 1)
        .uid("source")
        .map(Pace(rate))
        .uid("pace")
        .key_by(lambda i, k=keys: key_of(i, k))
        .process(RunningSum(plan_dir))
        .uid("sum")
    )
    counted.sink_to(ChaosFileSink(plan_dir, os.path.join(run_dir, "parquet"))).uid("parquet")
    counted.sink_to(ChaosDeltaSink(plan_dir, os.path.join(run_dir, "delta"))).uid("delta")
