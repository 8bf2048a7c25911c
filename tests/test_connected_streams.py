"""``DataStream.connect``: ConnectedStreams with CoMapFunction, CoFlatMapFunction,
CoProcessFunction and KeyedCoProcessFunction.

The operators are driven by hand first (keyed state and timers shared by both inputs, side
outputs, timestamps, snapshots), then in local jobs (the API, both ways of keying, errors).
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chandy import StreamExecutionEnvironment
from chandy.api.connected_streams import ConnectedStreams
from chandy.core.functions import (
    CoFlatMapFunction,
    CoMapFunction,
    CoProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    ProcessFunction,
    RuntimeContext,
)
from chandy.core.output_tag import OutputTag
from chandy.core.state import MapStateDescriptor, ValueStateDescriptor
from chandy.core.time import TimeDomain
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.errors import InvalidProgramError, JobExecutionError
from chandy.task.batches import TimestampedBatch
from chandy.task.operators.co_process import CoProcessOperator, KeyedCoProcessOperator
from tests.operator_harness import KeyedOperatorHarness, OperatorHarness

MISSING = OutputTag("missing-price")


def key_of(value: Any) -> Any:
    return value[0]


class PriceJoin(KeyedCoProcessFunction):
    """Input 1: orders ``(product, qty)``; input 2: prices ``(product, price)``. An order is
    priced with its product's latest price; without one it waits for the price, until a
    timer ``wait_ms`` of processing time (or, with timestamps, ``ts + 10`` of event time)
    sends it to MISSING. Every order is priced once whichever input is read first."""

    def __init__(self, wait_ms: int = 100) -> None:
        self.wait_ms = wait_ms

    def open(self, runtime_context: RuntimeContext) -> None:
        self.price = runtime_context.get_state(ValueStateDescriptor("price"))
        self.waiting = runtime_context.get_map_state(MapStateDescriptor("waiting"))

    def process_element1(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:
        price = self.price.value()
        if price is not None:
            yield ("priced", ctx.get_current_key(), value[1] * price, ctx.timestamp())
            return
        timers = ctx.timer_service()
        ts = ctx.timestamp()
        due = ts + 10 if ts is not None else timers.current_processing_time() + self.wait_ms
        self.waiting.put(due, [*(self.waiting.get(due) or []), value[1]])
        if ts is not None:
            timers.register_event_time_timer(due)
        else:
            timers.register_processing_time_timer(due)

    def process_element2(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:
        key, price = ctx.get_current_key(), value[1]
        self.price.update(price)
        yield ("price", key, price, ctx.timestamp())
        for quantities in self.waiting.values():  # their timers find nothing left
            for qty in quantities:
                yield ("priced", key, qty * price, ctx.timestamp())
        self.waiting.clear()

    def on_timer(self, timestamp: int, ctx: KeyedCoProcessFunction.OnTimerContext) -> Any:
        for qty in self.waiting.get(timestamp) or []:
            yield MISSING, (ctx.get_current_key(), qty, ctx.time_domain(), ctx.timestamp())
        self.waiting.remove(timestamp)


def keyed_join(function: Any = None, **kwargs: Any) -> KeyedOperatorHarness:
    return KeyedOperatorHarness(
        KeyedCoProcessOperator(function or PriceJoin()),
        key_of,
        side_output_tags=[MISSING.tag_id],
        **kwargs,
    ).open_keyed()


# ---------------------------------------------------------------------- operators


def test_keyed_state_written_by_one_input_is_read_by_the_other_for_the_same_key_only() -> None:
    h = keyed_join()
    h.process_records([("apple", 3)], input_number=2)
    h.process_records([("apple", 2), ("pear", 5)], input_number=1)
    assert h.values() == [("price", "apple", 3, None), ("priced", "apple", 6, None)]
    h.process_records([("pear", 4)], input_number=2)  # prices the waiting order too
    h.process_records([("pear", 1), ("apple", 1)], input_number=1)
    assert h.values()[2:] == [
        ("price", "pear", 4, None),
        ("priced", "pear", 20, None),
        ("priced", "pear", 4, None),
        ("priced", "apple", 3, None),
    ]


def test_outputs_keep_the_timestamp_of_the_record_of_either_input() -> None:
    h = keyed_join()
    h.process_records([("apple", 3), ("pear", 4)], timestamps=[100, None], input_number=2)
    h.process_records([("apple", 2)], timestamps=[105], input_number=1)
    assert h.batches == [
        TimestampedBatch([("price", "apple", 3, 100), ("price", "pear", 4, None)], [100, None]),
        TimestampedBatch([("priced", "apple", 6, 105)], [105]),
    ]


def test_an_event_time_timer_of_input_one_fires_for_its_key_on_the_watermark_and_to_a_side_output() -> None:
    h = keyed_join()
    h.process_records([("apple", 2), ("pear", 5)], timestamps=[100, 103], input_number=1)
    h.process_records([("pear", 4)], timestamps=[104], input_number=2)  # prices pear's order
    h.watermark(109)
    assert h.side_records(MISSING.tag_id) == []
    h.watermark(113)
    assert h.side_records(MISSING.tag_id) == [(("apple", 2, TimeDomain.EVENT_TIME, 110), 110)]
    assert h.records() == [(("price", "pear", 4, 104), 104), (("priced", "pear", 20, 104), 104)]
    assert h.watermarks == [109, 113], "the watermark is forwarded after the timers it fired"


def test_a_processing_time_timer_fires_with_its_domain_and_sees_the_state_of_its_key() -> None:
    class Expire(KeyedCoProcessFunction):
        def open(self, runtime_context: RuntimeContext) -> None:
            self.seen = runtime_context.get_state(ValueStateDescriptor("seen"))

        def process_element1(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:
            self.seen.update((self.seen.value() or 0) + 1)
            ctx.timer_service().register_processing_time_timer(
                ctx.timer_service().current_processing_time() + 50
            )

        def process_element2(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:
            self.seen.update((self.seen.value() or 0) + 10)

        def on_timer(self, timestamp: int, ctx: KeyedCoProcessFunction.OnTimerContext) -> Any:
            yield ctx.get_current_key(), timestamp, ctx.time_domain(), self.seen.value()

    h = keyed_join(Expire())
    h.process_records([("a", 0)], input_number=1)
    h.process_records([("a", 0), ("b", 0)], input_number=2)
    h.advance_processing_time(49)
    assert h.records() == []
    h.advance_processing_time(1)
    assert h.records() == [(("a", 1_050, TimeDomain.PROCESSING_TIME, 11), None)]


def test_state_and_timers_of_both_inputs_survive_a_snapshot_and_restore() -> None:
    h = keyed_join()
    h.process_records([("apple", 3)], input_number=2)
    h.process_records([("pear", 5)], timestamps=[100], input_number=1)  # waits, timer at 110
    snapshot = h.snapshot_keyed(1)
    h.process_records([("apple", 7)], input_number=2)  # after the checkpoint: lost on failure

    restored = KeyedOperatorHarness(
        KeyedCoProcessOperator(PriceJoin()), key_of, side_output_tags=[MISSING.tag_id]
    ).open_keyed([snapshot])
    restored.process_records([("apple", 1)], input_number=1)
    restored.watermark(110)
    assert restored.values() == [("priced", "apple", 3, None)]
    assert restored.side_records(MISSING.tag_id) == [(("pear", 5, TimeDomain.EVENT_TIME, 110), 110)]


def test_after_rescaling_each_subtask_restores_the_state_and_timers_of_its_keys_from_both_inputs() -> None:
    products = [f"p{i}" for i in range(12)]
    h = keyed_join()
    h.process_records([(p, i) for i, p in enumerate(products) if i % 2 == 0], input_number=2)  # prices
    h.process_records([(p, 1) for p in products], timestamps=[100] * len(products), input_number=1)
    snapshot = h.snapshot_keyed(1)

    owned: list[str] = []
    per_subtask: list[int] = []
    for subtask in range(2):
        restored = KeyedOperatorHarness(
            KeyedCoProcessOperator(PriceJoin()),
            key_of,
            subtask=subtask,
            parallelism=2,
            side_output_tags=[MISSING.tag_id],
        ).open_keyed([snapshot])
        mine = [p for p in products if restored.owns(p)]
        owned += mine
        per_subtask.append(len(mine))
        restored.process_records([(p, 2) for p in mine], input_number=1)
        restored.watermark(110)
        assert sorted(restored.values()) == sorted(
            ("priced", p, 2 * int(p[1:]), None) for p in mine if int(p[1:]) % 2 == 0
        )
        assert sorted(v for v, _ in restored.side_records(MISSING.tag_id)) == sorted(
            (p, 1, TimeDomain.EVENT_TIME, 110) for p in mine if int(p[1:]) % 2 == 1
        )
    assert sorted(owned) == sorted(products), "every key restored on exactly one subtask"
    assert all(per_subtask), "both subtasks own keys (else the test proves little)"


def test_a_co_process_function_on_keyed_inputs_runs_keyed_and_needs_no_timer_tables() -> None:
    """As in PyFlink, a CoProcessFunction on two keyed streams gets keyed state; a function
    that keeps the default on_timer (here: none at all) creates no timer service."""

    class Count(CoProcessFunction):
        def open(self, runtime_context: RuntimeContext) -> None:
            self.count = runtime_context.get_state(ValueStateDescriptor("count"))

        def process_element1(self, value: Any, ctx: ProcessFunction.Context) -> Any:
            self.count.update((self.count.value() or 0) + 1)
            return None

        def process_element2(self, value: Any, ctx: ProcessFunction.Context) -> Any:
            yield value[0], self.count.value()

    class Quiet(KeyedCoProcessFunction):
        def process_element1(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:
            return None

        def process_element2(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:
            return None

    h = keyed_join(Count())
    h.process_records([("a", 0), ("a", 0), ("b", 0)], input_number=1)
    h.process_records([("a", 0), ("b", 0), ("c", 0)], input_number=2)
    assert h.values() == [("a", 2), ("b", 1), ("c", None)]
    for function in (Count(), Quiet()):
        assert keyed_join(function).operator._timers is None  # type: ignore[attr-defined]
    assert keyed_join(PriceJoin()).operator._timers is not None  # type: ignore[attr-defined]


def test_a_co_map_on_keyed_inputs_uses_keyed_state_and_a_none_result_emits_nothing() -> None:
    class Latest(CoMapFunction):
        def open(self, runtime_context: RuntimeContext) -> None:
            self.latest = runtime_context.get_state(ValueStateDescriptor("latest"))

        def map1(self, value: Any) -> Any:
            self.latest.update(value[1])
            return None

        def map2(self, value: Any) -> Any:
            return value[0], self.latest.value()

    h = keyed_join(Latest())
    h.process_records([("a", 1), ("b", 2)], input_number=1)
    h.process_records([("a", None), ("b", None), ("c", None)], input_number=2)
    assert h.batches == [[("a", 1), ("b", 2), ("c", None)]]


def test_a_non_keyed_co_process_function_sees_timestamps_and_may_not_set_timers() -> None:
    class Tag(CoProcessFunction):
        def process_element1(self, value: Any, ctx: ProcessFunction.Context) -> Any:
            yield 1, value, ctx.timestamp(), ctx.timer_service().current_watermark()

        def process_element2(self, value: Any, ctx: ProcessFunction.Context) -> Any:
            ctx.timer_service().register_event_time_timer(5)

    out: list[Any] = []
    h = OperatorHarness(CoProcessOperator(Tag()), output=out.append).open()
    operator = h.operator
    assert isinstance(operator, CoProcessOperator)
    operator.process_batch1(TimestampedBatch(["x"], [7]))
    assert out == [TimestampedBatch([(1, "x", 7, operator.current_watermark)], [7])]
    with pytest.raises(
        InvalidProgramError, match=r"Setting timers is only supported on a keyed stream.*key_by\(k1, k2\)"
    ):
        operator.process_batch2(["y"])
    with pytest.raises(TypeError, match="has two inputs"):
        operator.process_batch(["z"])


# ---------------------------------------------------------------------- jobs


class Either(CoMapFunction):
    def map1(self, value: int) -> Any:
        return "number", value

    def map2(self, value: str) -> Any:
        return "word", value


class Split(CoFlatMapFunction):
    def flat_map1(self, value: int) -> Any:
        yield from range(value)

    def flat_map2(self, value: str) -> Any:
        return list(value)


def test_co_map_and_co_flat_map_see_each_input_with_its_own_method(
    local_env: StreamExecutionEnvironment,
) -> None:
    numbers = local_env.from_sequence(1, 4)
    words = local_env.from_collection(["ab", "c"])
    connected = numbers.connect(words)
    assert isinstance(connected, ConnectedStreams)
    mapped = connected.map(Either())
    assert mapped.get_name() == "Co-Map"
    split = connected.flat_map(Split())
    assert split.get_name() == "Co-Flat Map"
    out = mapped.union(split.map(lambda v: ("split", v))).execute_and_collect(limit=20)
    assert sorted(map(repr, out)) == sorted(
        map(
            repr,
            [("number", i) for i in range(1, 5)]
            + [("word", "ab"), ("word", "c")]
            + [("split", v) for v in [0, 0, 1, 0, 1, 2, 0, 1, 2, 3, "a", "b", "c"]],
        )
    )


ORDERS = [(f"p{i % 7}", i) for i in range(200)]
PRICES = [(f"p{k}", 10 + k) for k in range(7)]


def _priced(out: list[Any]) -> Counter[Any]:
    return Counter((o[1], o[2]) for o in out if o[0] == "priced")


@pytest.mark.parametrize("how", ["two keyed streams", "key_by on the connected streams"])
def test_a_keyed_co_process_join_prices_every_order_on_the_subtask_of_its_key(
    local_env: StreamExecutionEnvironment, how: str
) -> None:
    local_env.set_parallelism(3)
    prices = local_env.from_collection(PRICES)
    orders = local_env.from_collection(ORDERS)
    if how == "two keyed streams":
        connected = orders.key_by(key_of).connect(prices.key_by(key_of))
    else:
        connected = orders.connect(prices).key_by(key_of, key_of)
    joined = connected.process(PriceJoin(wait_ms=60_000))
    assert joined.get_name() == "Keyed Co-Process"
    out = joined.execute_and_collect(limit=len(ORDERS) + len(PRICES))
    assert sorted(o[1:3] for o in out if o[0] == "price") == sorted(PRICES)
    assert _priced(out) == Counter((key, qty * (10 + int(key[1:]))) for key, qty in ORDERS)


def test_key_by_on_connected_keyed_streams_keys_both_anew(local_env: StreamExecutionEnvironment) -> None:
    """Keyed by the wrong field first; the connected streams' key_by replaces both keys."""
    local_env.set_parallelism(3)
    prices = local_env.from_collection(PRICES).key_by(lambda v: v[1])
    orders = local_env.from_collection(ORDERS).key_by(lambda v: v[1])
    joined = orders.connect(prices).key_by(key_of, key_of).process(PriceJoin(wait_ms=60_000))
    out = joined.execute_and_collect(limit=len(ORDERS) + len(PRICES))
    assert _priced(out) == Counter((key, qty * (10 + int(key[1:]))) for key, qty in ORDERS)


def test_a_keyed_stream_connected_with_a_non_keyed_one_runs_non_keyed_partitioned_by_key(
    local_env: StreamExecutionEnvironment,
) -> None:
    """As in Flink: the connection is keyed only when both are; the keyed input still goes
    by key (each key to one subtask), as plain records."""

    class Where(CoProcessFunction):
        def open(self, runtime_context: RuntimeContext) -> None:
            self.subtask = runtime_context.get_index_of_this_subtask()

        def process_element1(self, value: Any, ctx: ProcessFunction.Context) -> Any:
            yield "keyed", value, self.subtask

        def process_element2(self, value: Any, ctx: ProcessFunction.Context) -> Any:
            yield "plain", value, self.subtask

    local_env.set_parallelism(3)
    keyed = local_env.from_sequence(0, 299).key_by(lambda v: v % 10)
    plain = local_env.from_sequence(1000, 1049)
    out = keyed.connect(plain).process(Where()).execute_and_collect(limit=350)
    assert sorted(v for side, v, _ in out if side == "keyed") == list(range(300))
    assert sorted(v for side, v, _ in out if side == "plain") == list(range(1000, 1050))
    subtasks: dict[int, set[int]] = {}
    for side, v, subtask in out:
        if side == "keyed":
            subtasks.setdefault(v % 10, set()).add(subtask)
    assert all(len(s) == 1 for s in subtasks.values()), subtasks


def test_side_outputs_of_a_connected_operator_are_a_stream(local_env: StreamExecutionEnvironment) -> None:
    orders = local_env.from_collection([("none", 1), ("none", 2)])
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda v, t: v[1])
    orders = orders.assign_timestamps_and_watermarks(strategy)
    prices = local_env.from_collection([("other", 5)]).assign_timestamps_and_watermarks(strategy)
    joined = orders.key_by(key_of).connect(prices.key_by(key_of)).process(PriceJoin())
    missing = joined.get_side_output(MISSING).execute_and_collect(limit=10)
    assert sorted(missing) == [("none", 1, TimeDomain.EVENT_TIME, 11), ("none", 2, TimeDomain.EVENT_TIME, 12)]


def test_a_keyed_co_process_function_needs_two_keyed_streams(local_env: StreamExecutionEnvironment) -> None:
    numbers = local_env.from_sequence(1, 4)
    for connected in (numbers.connect(numbers), numbers.key_by(lambda v: v).connect(numbers)):
        with pytest.raises(InvalidProgramError, match="both connected streams are keyed"):
            connected.process(PriceJoin())


def test_connect_refuses_what_it_cannot_connect(local_env: StreamExecutionEnvironment) -> None:
    numbers = local_env.from_sequence(1, 4)
    with pytest.raises(InvalidProgramError, match="connect\\(\\) takes a DataStream"):
        numbers.connect([1, 2])  # type: ignore[arg-type]
    other_env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    with pytest.raises(InvalidProgramError, match="different environments"):
        numbers.connect(other_env.from_sequence(1, 2))
    connected = numbers.connect(numbers)
    with pytest.raises(InvalidProgramError, match="takes a CoMapFunction"):
        connected.map(lambda v: v)  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match="takes a CoFlatMapFunction"):
        connected.flat_map(Either())  # type: ignore[arg-type]

    class OneInput(KeyedProcessFunction):
        def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
            return None

    with pytest.raises(InvalidProgramError, match="takes a CoProcessFunction or a KeyedCoProcessFunction"):
        connected.process(OneInput())  # type: ignore[arg-type]


def test_a_timer_in_a_non_keyed_co_process_function_fails_the_job_with_the_fix(
    local_env: StreamExecutionEnvironment,
) -> None:
    class SetsTimer(CoProcessFunction):
        def process_element1(self, value: Any, ctx: ProcessFunction.Context) -> Any:
            ctx.timer_service().register_processing_time_timer(0)

        def process_element2(self, value: Any, ctx: ProcessFunction.Context) -> Any:
            return None

    local_env.configure({"restart-strategy.type": "none"})
    numbers = local_env.from_sequence(1, 4)
    with pytest.raises(JobExecutionError) as failure:
        numbers.connect(numbers).process(SetsTimer()).execute_and_collect(limit=1)
    assert "key_by(k1, k2)" in str(failure.value.__cause__)


@pytest.mark.slow
def test_the_connected_streams_example_prints_each_payment_at_the_rate_of_its_time() -> None:
    """examples/connected_streams.py, as a user runs it (on the local executor)."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "connected_streams.py"), "--executor", "local"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split("> ", 1) for line in done.stdout.splitlines()]
    assert sorted((prefix.split(":")[0], value) for prefix, value in lines) == [
        ("converted", "(p2,GBP,20.0,1.3,26.0)"),
        ("converted", "(p3,USD,50.0,0.9,45.0)"),
        ("converted", "(p5,USD,10.0,0.92,9.2)"),
        ("converted", "(p6,GBP,40.0,1.3,52.0)"),
        ("converted", "(p7,GBP,8.0,1.25,10.0)"),
        ("converted", "(p8,USD,200.0,0.88,176.0)"),
        ("converted", "(p9,USD,30.0,0.9,27.0)"),  # out of order: the rate of its time
        ("no rate", "(p1,USD,100.0)"),
        ("no rate", "(p4,CHF,5.0)"),
    ]


@pytest.mark.slow
def test_a_user_function_annotated_with_the_co_contexts_type_checks(tmp_path: Path) -> None:
    """``KeyedCoProcessFunction.Context`` and its siblings are PyFlink's names for the
    contexts; a user's strictly type-checked job annotates with them."""
    from tests.test_typing import mypy

    job = tmp_path / "job.py"
    job.write_text(
        "from typing import Any\n"
        "from chandy.datastream.functions import CoProcessFunction, KeyedCoProcessFunction\n"
        "from chandy.datastream import TimeDomain\n\n\n"
        "class Join(KeyedCoProcessFunction):\n"
        "    def process_element1(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:\n"
        "        return [ctx.get_current_key(), ctx.timestamp()]\n\n"
        "    def process_element2(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:\n"
        "        return None\n\n"
        "    def on_timer(self, timestamp: int, ctx: KeyedCoProcessFunction.OnTimerContext) -> Any:\n"
        "        domain: TimeDomain = ctx.time_domain()\n"
        "        return [domain]\n\n\n"
        "class Tag(CoProcessFunction):\n"
        "    def process_element1(self, value: Any, ctx: CoProcessFunction.Context) -> Any:\n"
        "        return [ctx.timer_service().current_watermark()]\n\n"
        "    def process_element2(self, value: Any, ctx: CoProcessFunction.Context) -> Any:\n"
        "        return None\n",
        encoding="utf-8",
    )
    result = mypy("--strict", str(job))
    assert result.returncode == 0, result.stdout + result.stderr
