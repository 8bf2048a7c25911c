"""Operator chaining decisions (read from the public execution plan)."""

from __future__ import annotations

import json

import pytest

from chandy import InvalidProgramError, StreamExecutionEnvironment


def plan(env: StreamExecutionEnvironment) -> list[dict]:
    return json.loads(env.get_execution_plan())["nodes"]


def chains(env: StreamExecutionEnvironment) -> list[list[str]]:
    return [node["operators"] for node in plan(env)]


def test_forward_edges_of_equal_parallelism_chain(local_env: StreamExecutionEnvironment) -> None:
    local_env.from_sequence(1, 10).map(lambda x: x).name("m").filter(bool).name("f").print()
    assert chains(local_env) == [["Sequence Source", "m", "f", "Print to Std. Out"]]


def test_key_by_breaks_the_chain(local_env: StreamExecutionEnvironment) -> None:
    local_env.from_sequence(1, 10).map(lambda x: x).key_by(lambda x: x).sum().print()
    nodes = plan(local_env)
    assert [n["operators"] for n in nodes] == [["Sequence Source", "Map"], ["Keyed Sum", "Print to Std. Out"]]
    assert nodes[1]["inputs"] == [{"id": nodes[0]["id"], "ship_strategy": "HASH"}]


def test_parallelism_change_breaks_the_chain_with_rebalance(local_env: StreamExecutionEnvironment) -> None:
    local_env.from_sequence(1, 10).map(lambda x: x).set_parallelism(3).print()
    nodes = plan(local_env)
    # the print sink takes the default parallelism (2), so it is a third task
    assert [n["operators"] for n in nodes] == [["Sequence Source"], ["Map"], ["Print to Std. Out"]]
    assert [n["parallelism"] for n in nodes] == [2, 3, 2]
    assert nodes[1]["inputs"][0]["ship_strategy"] == "REBALANCE"
    assert nodes[2]["inputs"][0]["ship_strategy"] == "REBALANCE"


def test_explicit_partitionings_break_the_chain(local_env: StreamExecutionEnvironment) -> None:
    src = local_env.from_sequence(1, 10)
    src.rebalance().map(lambda x: x).name("a").print()
    src.shuffle().map(lambda x: x).name("b").print()
    src.broadcast().map(lambda x: x).name("c").print()
    strategies = {n["operators"][0]: n["inputs"][0]["ship_strategy"] for n in plan(local_env) if n["inputs"]}
    assert strategies == {"a": "REBALANCE", "b": "SHUFFLE", "c": "BROADCAST"}


def test_union_target_is_a_chain_head(local_env: StreamExecutionEnvironment) -> None:
    a = local_env.from_sequence(1, 5)
    b = local_env.from_sequence(6, 10)
    a.union(b).map(lambda x: x).print()
    nodes = plan(local_env)
    assert ["Map", "Print to Std. Out"] in [n["operators"] for n in nodes]
    union_node = next(n for n in nodes if n["operators"][0] == "Map")
    assert len(union_node["inputs"]) == 2


def test_fan_out_chains_both_branches(local_env: StreamExecutionEnvironment) -> None:
    src = local_env.from_sequence(1, 10)
    src.map(lambda x: x).name("left").print()
    src.map(lambda x: x).name("right").print()
    assert chains(local_env) == [
        ["Sequence Source", "left", "Print to Std. Out", "right", "Print to Std. Out"]
    ]


def test_chaining_can_be_disabled_per_operator_and_globally(local_env: StreamExecutionEnvironment) -> None:
    local_env.from_sequence(1, 10).map(lambda x: x).name("m").disable_chaining().print()
    assert chains(local_env) == [["Sequence Source"], ["m"], ["Print to Std. Out"]]
    local_env._stream_graph.clear()
    local_env.from_sequence(1, 10).map(lambda x: x).name("m").start_new_chain().print()
    assert chains(local_env) == [["Sequence Source"], ["m", "Print to Std. Out"]]
    local_env._stream_graph.clear()
    local_env.disable_operator_chaining()
    local_env.from_sequence(1, 10).map(lambda x: x).print()
    assert len(chains(local_env)) == 3


def test_forward_with_different_parallelism_is_rejected(local_env: StreamExecutionEnvironment) -> None:
    local_env.from_sequence(1, 10).forward().map(lambda x: x).set_parallelism(3).print()
    with pytest.raises(InvalidProgramError, match="forward partitioning does not allow"):
        local_env.get_execution_plan()


def test_max_parallelism_below_parallelism_is_rejected(local_env: StreamExecutionEnvironment) -> None:
    local_env.set_max_parallelism(2)
    local_env.from_sequence(1, 10).key_by(lambda x: x).sum().set_parallelism(3).print()
    with pytest.raises(InvalidProgramError, match="max parallelism"):
        local_env.get_execution_plan()


def test_duplicate_uid_is_rejected(local_env: StreamExecutionEnvironment) -> None:
    local_env.from_sequence(1, 10).map(lambda x: x).uid("same").map(lambda x: x).uid("same").print()
    with pytest.raises(InvalidProgramError, match="uid 'same'"):
        local_env.get_execution_plan()
