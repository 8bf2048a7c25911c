"""Side outputs: a process function yields ``(output_tag, value)``; ``get_side_output(tag)``
is the stream of those values, chained or across the network, beside the main output."""

from __future__ import annotations

from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.core.functions import KeyedProcessFunction, ProcessFunction
from chandy.core.output_tag import OutputTag
from chandy.errors import InvalidProgramError

ODD = OutputTag("odd")
BIG = OutputTag("big")


class SplitOdd(ProcessFunction):
    def process_element(self, value: int, ctx: ProcessFunction.Context) -> Any:
        if value % 2:
            yield ODD, value
        else:
            yield value
        if value >= 90:
            yield BIG, f"big {value}"


class KeyedSplit(KeyedProcessFunction):
    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        yield (ODD, (ctx.get_current_key(), value)) if value % 2 else (ctx.get_current_key(), value)


def collect_all(env: StreamExecutionEnvironment, *streams: Any) -> list[list[Any]]:
    """Run one job that collects several streams (each tagged by its position)."""
    tagged = [s.map(lambda v, i=i: (i, v)) for i, s in enumerate(streams)]
    union = tagged[0].union(*tagged[1:]) if len(tagged) > 1 else tagged[0]
    got: list[list[Any]] = [[] for _ in streams]
    for i, v in union.execute_and_collect():
        got[i].append(v)
    return got


def test_a_process_function_splits_a_stream_into_main_and_side_outputs(executor: str) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(2)
    main = env.from_sequence(0, 99).process(SplitOdd())
    odd = main.get_side_output(ODD)
    big = main.get_side_output(BIG).rebalance()  # across the network, not chained
    evens, odds, bigs = collect_all(env, main, odd, big)
    assert sorted(evens) == list(range(0, 100, 2))
    assert sorted(odds) == list(range(1, 100, 2))
    assert sorted(bigs) == [f"big {v}" for v in range(90, 100)]


def test_a_keyed_process_function_has_side_outputs_too() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    main = env.from_sequence(0, 19).key_by(lambda v: v % 3).process(KeyedSplit())
    evens, odds = collect_all(env, main, main.get_side_output(ODD))
    assert sorted(evens) == sorted((v % 3, v) for v in range(0, 20, 2))
    assert sorted(odds) == sorted((v % 3, v) for v in range(1, 20, 2))


def test_a_side_output_nobody_reads_is_dropped() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    assert sorted(env.from_sequence(0, 9).process(SplitOdd()).execute_and_collect()) == [0, 2, 4, 6, 8]


def test_get_side_output_needs_an_output_tag_and_an_operator() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    stream = env.from_sequence(0, 9).process(SplitOdd())
    with pytest.raises(InvalidProgramError, match="OutputTag"):
        stream.get_side_output("odd")  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match="operator"):
        stream.rebalance().get_side_output(ODD)
