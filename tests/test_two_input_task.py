"""Two-input tasks: the runtime under ``connect``.

A two-input operator heads its own task; every channel of that task knows which input it
feeds, in the order of the task's input gate, and the task hands each batch to
``process_batch1`` or ``process_batch2`` accordingly. These tests drive the contract
through the graph builders directly (the public ``connect`` API is built on it).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from chandy import InvalidProgramError, StreamExecutionEnvironment
from chandy.api.datastream import DataStream
from chandy.graph.execution_graph import ExecutionGraph
from chandy.task.batches import KeyedBatch, TimestampedBatch
from chandy.task.operators.base import TwoInputStreamOperator


class TagInputs(TwoInputStreamOperator):
    """Emits ``(input, value)`` for every record, so the test sees where each went."""

    def process_batch1(self, records: Any) -> None:
        self.output([(1, v) for v in _values(records)])

    def process_batch2(self, records: Any) -> None:
        self.output([(2, v) for v in _values(records)])


def _values(records: Any) -> list[Any]:
    if isinstance(records, (KeyedBatch, TimestampedBatch)):
        return list(records.values)
    return list(records)


def _connect(first: DataStream, second: DataStream, *, keyed: bool = False) -> DataStream:
    node = first._add_two_input_operator(second._inputs, "Tag", functools.partial(TagInputs), keyed=keyed)
    return DataStream._of(first._env, node)


def test_a_two_input_operator_heads_its_task_and_knows_the_input_of_every_channel(
    local_env: StreamExecutionEnvironment,
) -> None:
    first = local_env.from_sequence(1, 10).set_parallelism(3)
    second = local_env.from_sequence(11, 20).set_parallelism(1)
    _connect(first.rebalance(), second).set_parallelism(2).print()
    job = local_env._build_job_graph(None, clear=False)
    tag = next(v for v in job.vertices if v.name.startswith("Tag"))
    assert tag.name == "Tag -> Print to Std. Out", "the two-input head chains its successors"
    assert sorted(e.type_number for e in tag.inputs) == [1, 2]
    graph = ExecutionGraph(job)
    for subtask in range(2):
        channels = graph.input_channel_ids(tag, subtask)
        types = graph.input_types(tag, channels)
        by_edge = {e.index: e.type_number for e in tag.inputs}
        assert types == tuple(by_edge[c.edge_index] for c in channels)
        # three producers of the first input (rebalance), one of the second (rebalance: 1 -> 2)
        assert sorted(types) == [1, 1, 1, 2]
        descriptor = graph.deployment_descriptor(graph.vertices[tag.id][subtask])
        assert descriptor.input_types == types


def test_every_record_reaches_the_input_it_was_connected_to(local_env: StreamExecutionEnvironment) -> None:
    first = local_env.from_sequence(1, 500).set_parallelism(2)
    second = local_env.from_collection([f"s{i}" for i in range(300)])
    result = _connect(first.rebalance(), second.rebalance()).execute_and_collect(limit=800)
    assert sorted(v for i, v in result if i == 1) == list(range(1, 501))
    assert sorted((v for i, v in result if i == 2), key=lambda s: int(s[1:])) == [f"s{i}" for i in range(300)]


def test_keyed_inputs_arrive_as_keyed_batches_on_the_subtask_of_their_key(
    local_env: StreamExecutionEnvironment,
) -> None:
    """Both inputs partitioned by the same key meet on the same subtask: what keyed state
    shared by both inputs (KeyedCoProcessFunction) relies on."""

    class KeyAndSubtask(TwoInputStreamOperator):
        keyed = True

        def _emit(self, side: int, records: KeyedBatch) -> None:
            assert isinstance(records, KeyedBatch)
            assert self.runtime_context is not None
            subtask = self.runtime_context.get_index_of_this_subtask()
            self.output([(side, key, subtask) for key in records.keys])

        def process_batch1(self, records: Any) -> None:
            self._emit(1, records)

        def process_batch2(self, records: Any) -> None:
            self._emit(2, records)

    first = local_env.from_sequence(0, 199).key_by(lambda x: x % 20)
    second = local_env.from_sequence(1000, 1199).key_by(lambda x: x % 20)
    node = first._add_two_input_operator(second._inputs, "Keys", KeyAndSubtask, keyed=True)
    node.parallelism = 3
    result = DataStream._of(local_env, node).execute_and_collect(limit=400)
    subtask_of: dict[Any, set[int]] = {}
    for _side, key, subtask in result:
        subtask_of.setdefault(key, set()).add(subtask)
    assert set(subtask_of) == set(range(20))
    assert all(len(s) == 1 for s in subtask_of.values()), "a key's records of both inputs meet"
    assert sorted(side for side, _, _ in result) == [1] * 200 + [2] * 200


def test_a_node_with_edges_into_only_one_numbered_input_is_refused(
    local_env: StreamExecutionEnvironment,
) -> None:
    source = local_env.from_sequence(1, 10)
    node = local_env._stream_graph.add_node("Half", functools.partial(TagInputs))
    local_env._stream_graph.add_edge(source._inputs[0][0], node, None, None, 1)
    DataStream._of(local_env, node).print()
    with pytest.raises(InvalidProgramError, match=r"'Half' has in-edges for inputs \[1\]"):
        local_env._build_job_graph(None, clear=False)
