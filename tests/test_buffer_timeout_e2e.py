"""Output leaves within the buffer timeout, on both executors (issue 26 §3).

A source of 10 records chained to a slow map (0.2 s a record), then a rebalance to a sink of
parallelism 2 that logs each arrival: on the Spark executor the sink's second subtask runs in
the other slot, so half the records cross a TCP channel. With the default batch size all 10
records are one batch; Flink sends each within ``execution.buffer-timeout`` (100 ms) of its
map call returning, and so must chandy, even while the task thread is inside the next call.

Nothing here bounds wall-clock time (the suite runs on loaded machines): the map *waits*
inside one of its calls until the sink has received records the task produced before that
call, which only a flush during the call can bring about; had they stayed in the writer, the
wait would time out and the job fail. The recorded times are compared only as an order.
The batch path is checked the same way: a batch function's rows leave while its next call runs.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest

from chandy import StreamExecutionEnvironment
from chandy.connectors.arrow_sources import ArrowNumberSequenceSource
from chandy.core.functions import MapBatchesFunction, MapFunction, RuntimeContext, SinkFunction
from tests.probes import Probe

RECORDS = 10
#: What a slow call costs, as in the issue: 10 records take 2 s.
SLOW_S = 0.2
#: Longest a map call waits for records to arrive downstream before it fails the job.
WAIT_LIMIT_S = 60.0


class ArrivalSink(SinkFunction):
    """Logs ``("arrived", value, subtask, time)`` for every record."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.subtask = -1

    def open(self, runtime_context: RuntimeContext) -> None:
        self.subtask = runtime_context.get_index_of_this_subtask()

    def invoke(self, value: Any, context: SinkFunction.Context) -> None:
        self.probe.append(("arrived", value, self.subtask, time.time()))


def wait_for_arrivals(probe: Probe, needed: list[int], what: str) -> None:
    """Return once the sink has received every record of ``needed``; raise after
    :data:`WAIT_LIMIT_S` (the records stayed in their writer)."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not set(needed) <= {item[1] for item in probe.items if item[0] == "arrived"}:
        if time.monotonic() > deadline:
            raise TimeoutError(f"records {needed} did not reach the sink while {what} waited")
        time.sleep(0.01)


class WaitingMap(MapFunction):
    """Sleeps ``slow_s`` a record and logs ``("mapped", value, time)`` when a call returns;
    the call for a record in ``waits`` first waits until the sink has received the records
    ``waits[record]`` (raising after :data:`WAIT_LIMIT_S`)."""

    def __init__(self, probe: Probe, slow_s: float, waits: dict[int, list[int]]) -> None:
        self.probe = probe
        self.slow_s = slow_s
        self.waits = waits

    def map(self, value: int) -> int:
        needed = self.waits.get(value)
        if needed:
            wait_for_arrivals(self.probe, needed, f"record {value}")
        time.sleep(self.slow_s)
        self.probe.append(("mapped", value, time.time()))
        return value


def run(executor: str, probe: Probe, slow_s: float, waits: dict[int, list[int]], **config: Any) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(1)
    env.configure(config)
    (
        env.from_collection(list(range(RECORDS)))
        .map(WaitingMap(probe, slow_s, waits))  # chained to the source: the source's batch is slow
        .rebalance()
        .add_sink(ArrivalSink(probe))
        .set_parallelism(2)
    )
    env.execute("buffer timeout")


def times(probe: Probe, kind: str) -> dict[int, float]:
    return {item[1]: item[-1] for item in probe.items if item[0] == kind}


def test_a_slow_maps_records_arrive_while_it_still_maps_the_others(executor: str) -> None:
    """Default settings: before its 5th call, the map waits until records 0 and 1 arrived, on
    both sink subtasks (one of them across TCP on Spark)."""
    probe = Probe()
    run(executor, probe, SLOW_S, {4: [0, 1]})
    arrived, mapped = times(probe, "arrived"), times(probe, "mapped")
    assert sorted(arrived) == sorted(mapped) == list(range(RECORDS))
    subtasks = {item[1]: item[2] for item in probe.items if item[0] == "arrived"}
    assert {subtasks[0], subtasks[1]} == {0, 1}, "consecutive records went to both sink subtasks"
    assert arrived[0] < mapped[4] and arrived[1] < mapped[4]
    assert min(arrived.values()) < max(mapped.values()), "spread out, not all at the end"


@pytest.mark.parametrize("executor", ["local"])
def test_with_a_timeout_of_zero_every_record_leaves_before_the_next_is_mapped(executor: str) -> None:
    """0 (Flink's flush after every record): each call waits for the previous record to have
    arrived, with no slow calls for the estimate to split the batch by."""
    probe = Probe()
    run(executor, probe, 0.0, {i: [i - 1] for i in range(1, RECORDS)}, **{"execution.buffer-timeout": 0})
    assert sorted(times(probe, "arrived")) == list(range(RECORDS))


@pytest.mark.parametrize("executor", ["local"])
def test_with_a_timeout_of_minus_one_only_the_end_of_the_input_sends_a_partly_filled_batch(
    executor: str,
) -> None:
    """-1 (Flink's flush only full buffers): the 10 records are less than a batch, so none
    leaves before the map is done with all of them, however long that takes."""
    probe = Probe()
    run(executor, probe, SLOW_S / 4, {}, **{"execution.buffer-timeout": -1})
    arrived, mapped = times(probe, "arrived"), times(probe, "mapped")
    assert sorted(arrived) == list(range(RECORDS))
    assert min(arrived.values()) > max(mapped.values())


class WaitingBatchMap(MapBatchesFunction):
    """Keeps the first row of every batch (so a channel's buffer stays partly filled), slowly;
    the call for the batch that starts with a row of ``waits`` first waits for the rows
    ``waits[row]`` to reach the sink."""

    def __init__(self, probe: Probe, waits: dict[int, list[int]]) -> None:
        self.probe = probe
        self.waits = waits

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        first = batch.column("value")[0].as_py()
        needed = self.waits.get(first)
        if needed:
            wait_for_arrivals(self.probe, needed, f"the batch of row {first}")
        time.sleep(SLOW_S)
        self.probe.append(("mapped", first, time.time()))
        return batch.slice(0, 1)


def test_the_batch_paths_rows_leave_while_the_next_batch_function_call_runs(executor: str) -> None:
    """Batches of 2 rows, one kept: rows 0, 2, 4, 6 and 8, each less than a batch on its
    channel, the batches alternating between the sink's subtasks. The call for the fourth
    batch waits until rows 2 and 4, which the two calls before it produced, reached the sink
    (row 4 right before it: only a flush during the waiting call can send it)."""
    probe = Probe()
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(1)
    env.configure({"chandy.network.arrow-batch-size": 2})
    (
        env.from_source(ArrowNumberSequenceSource(0, RECORDS - 1), source_name="numbers")
        .map_batches(WaitingBatchMap(probe, {6: [2, 4]}))
        .rebalance()
        .to_records()
        .set_parallelism(2)
        .map(lambda row: row.value)
        .add_sink(ArrivalSink(probe))
        .set_parallelism(2)
    )
    env.execute("buffer timeout, batch path")
    arrived, mapped = times(probe, "arrived"), times(probe, "mapped")
    assert sorted(arrived) == sorted(mapped) == [0, 2, 4, 6, 8]
    assert arrived[4] < mapped[6]
