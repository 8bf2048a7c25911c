"""The rest of PyFlink's operators and partitionings: ``KeyedStream.min/max/min_by/max_by``,
``DataStream.rescale`` (Flink's pointwise wiring when parallelisms differ),
``partition_custom`` with a ``Partitioner``, and ``ProcessFunction`` ``ctx.timestamp()``."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from chandy import InvalidProgramError, JobExecutionError, StreamExecutionEnvironment
from chandy.common import Duration, Row, Types, WatermarkStrategy
from chandy.common.watermark_strategy import TimestampAssigner
from chandy.datastream import Partitioner, ProcessFunction
from chandy.datastream.functions import KeySelector, MapFunction, RuntimeContext
from chandy.graph.execution_graph import ExecutionGraph
from chandy.graph.job_graph import DistributionPattern
from chandy.task.operators.keyed import MaxByFunction, MaxFunction, MinByFunction, MinFunction, SumFunction
from chandy.task.partitioners import CustomPartitionerWrapper, RescalePartitioner
from tests.jobs import CountingMap, HoldingSequence, KeyedCounter, final_counts
from tests.probes import Probe
from tests.test_checkpointing_e2e import (
    cancel_keeping_results,
    checkpointing_env,
    drain,
    latest_checkpoint_dir,
    wait_for_checkpoints,
)


def env_with(parallelism: int, executor: str = "local") -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    return env


def by_key(records: list[Any], key: Any) -> dict[Any, list[Any]]:
    """Outputs grouped by key, each key's in the order they were emitted."""
    grouped: dict[Any, list[Any]] = defaultdict(list)
    for record in records:
        grouped[key(record)].append(record)
    return dict(grouped)


# ---------------------------------------------------------------------- min / max / min_by / max_by

TRADES = [("a", 3, "first"), ("b", 7, "b1"), ("a", 1, "second"), ("a", 1, "third"), ("b", 9, "b2")]
TRADES += [("a", 5, "fourth"), ("b", 7, "b3")]


def aggregate_trades(operation: str) -> dict[Any, list[Any]]:
    """``key_by(symbol).<operation>(1)`` over TRADES at parallelism 2: each key's outputs."""
    keyed = env_with(2).from_collection(TRADES).key_by(lambda t: t[0])
    return by_key(getattr(keyed, operation)(1).execute_and_collect(limit=100), lambda t: t[0])


@pytest.mark.parametrize(
    ("operation", "expected_a", "expected_b"),
    [
        # min/max: the field's running extreme, every other field from the key's first record
        ("min", [3, 1, 1, 1], [7, 7, 7]),
        ("max", [3, 3, 3, 5], [7, 9, 9]),
    ],
)
def test_min_and_max_change_only_the_field_and_keep_the_first_records_other_fields(
    operation: str, expected_a: list[int], expected_b: list[int]
) -> None:
    out = aggregate_trades(operation)
    assert out == {
        "a": [("a", v, "first") for v in expected_a],
        "b": [("b", v, "b1") for v in expected_b],
    }


@pytest.mark.parametrize(
    ("operation", "expected_a", "expected_b"),
    [
        # min_by/max_by: the whole record holding the extreme; on a tie the first one stays
        ("min_by", ["first", "second", "second", "second"], ["b1", "b1", "b1"]),
        ("max_by", ["first", "first", "first", "fourth"], ["b1", "b2", "b2"]),
    ],
)
def test_min_by_and_max_by_emit_the_whole_record_holding_the_extreme_first_on_ties(
    operation: str, expected_a: list[str], expected_b: list[str]
) -> None:
    out = aggregate_trades(operation)
    notes = {key: [record[2] for record in records] for key, records in out.items()}
    assert notes == {"a": expected_a, "b": expected_b}
    assert all(record in TRADES for records in out.values() for record in records)


def test_aggregations_take_rows_by_name_dicts_objects_and_plain_values() -> None:
    env = env_with(1)
    rows = Types.ROW_NAMED(["k", "v", "note"], [Types.STRING(), Types.INT(), Types.STRING()])
    mins = (
        env.from_collection([("a", 4, "x"), ("a", 2, "y")], type_info=rows)
        .key_by(lambda r: r.k)
        .min("v")
        .execute_and_collect(limit=10)
    )
    assert mins == [Row(k="a", v=4, note="x"), Row(k="a", v=2, note="x")]
    dicts = (
        env.from_collection([{"k": "a", "n": 1}, {"k": "a", "n": 4}, {"k": "a", "n": 2}])
        .key_by(lambda d: d["k"])
        .max_by("n")
        .execute_and_collect(limit=10)
    )
    assert dicts == [{"k": "a", "n": 1}, {"k": "a", "n": 4}, {"k": "a", "n": 4}]
    numbers = env.from_collection([5, 3, 8, 1]).key_by(lambda _: 0).max().execute_and_collect(limit=10)
    assert numbers == [5, 5, 8, 8]
    words = (
        env.from_collection(["pear", "apple", "fig"]).key_by(lambda _: 0).min().execute_and_collect(limit=10)
    )
    assert words == ["pear", "apple", "apple"]


class Reading(NamedTuple):
    sensor: str
    value: float
    note: str


class Box:
    def __init__(self, key: str, size: int) -> None:
        self.key = key
        self.size = size


def test_the_folds_build_new_records_and_never_change_the_ones_they_got() -> None:
    """Emitted records may be held elsewhere (Flink's object reuse is off): a fold that wrote
    into its accumulator would change a record another operator already received."""
    first, second = ["a", 5], ["a", 2]
    assert MinFunction(1)(first, second) == ["a", 2] and first == ["a", 5]
    row1, row2 = Row(k="a", v=5), Row(k="a", v=9)
    assert MaxFunction("v")(row1, row2) == Row(k="a", v=9) and row1 == Row(k="a", v=5)
    d1 = {"n": 1}
    assert SumFunction("n")(d1, {"n": 2}) == {"n": 3} and d1 == {"n": 1}
    # a position from the end, as PyFlink reads it: the record keeps its length
    assert SumFunction(-1)(("a", 1, 2), ("a", 1, 3)) == ("a", 1, 5)
    assert MaxFunction(-2)(("a", 1, 2), ("a", 4, 0)) == ("a", 4, 2)
    box1, box2 = Box("a", 3), Box("a", 1)
    smaller = MinFunction("size")(box1, box2)
    assert (smaller.key, smaller.size, box1.size) == ("a", 1, 3) and smaller is not box1
    assert MinFunction(1)(Reading("s", 2.0, "x"), Reading("s", 1.0, "y")) == Reading("s", 1.0, "x")
    assert MinByFunction(1)(Reading("s", 2.0, "x"), Reading("s", 1.0, "y")) == Reading("s", 1.0, "y")
    tie = Reading("s", 2.0, "later")
    assert MaxByFunction(1)(Reading("s", 2.0, "x"), tie).note == "x"


def test_a_position_of_the_wrong_type_is_refused_when_the_pipeline_is_built() -> None:
    keyed = env_with(1).from_collection([("a", 1)]).key_by(lambda t: t[0])
    for operation in ("min", "max", "min_by", "max_by", "sum"):
        with pytest.raises(TypeError, match=rf"{operation}\(\) takes a field position"):
            getattr(keyed, operation)(1.5)


def test_a_field_a_record_does_not_have_fails_the_job_naming_the_operation_and_type() -> None:
    """PyFlink's rule: a plain value is its own field 0, and only that."""
    env = env_with(1)
    env.from_collection([1, 2]).key_by(lambda _: 0).max(1).print()
    with pytest.raises(JobExecutionError) as failure:
        env.execute()
    assert "max(1) on a record of type int" in repr(failure.value.__cause__)
    env = env_with(1)
    env.from_collection([("a", 1), ("a", 2)]).key_by(lambda t: t[0]).min_by("v").print()
    with pytest.raises(JobExecutionError) as failure:
        env.execute()
    assert "min_by('v') on a record of type tuple: a tuple or list field is chosen by an int" in repr(
        failure.value.__cause__
    )


def test_a_missing_field_is_named_and_plain_numbers_have_only_field_0_as_in_pyflink() -> None:
    with pytest.raises(TypeError, match=r"sum\(1\) on a record of type int"):
        SumFunction(1)(1, 2)
    with pytest.raises(TypeError, match=r"max\('weight'\) on a record of type Box: it has no attribute"):
        MaxFunction("weight")(Box("a", 1), Box("a", 2))
    # a named tuple's field is also taken by name
    assert SumFunction("value")(Reading("s", 1.0, "x"), Reading("s", 2.0, "y")) == Reading("s", 3.0, "x")
    assert SumFunction(0)(1, 2) == 3 and SumFunction(0)(1.5, 2) == 3.5


@pytest.mark.slow
def test_min_state_is_checkpointed_and_restored_exactly_once(tmp_path: Path) -> None:
    """min keeps its aggregate in keyed state: a job cancelled after a checkpoint and
    restored from it emits, across both runs, exactly the running minimum of every key once
    per record, with the other fields still those of the key's first record."""
    n, keys, cut = 3_000, 5, 1_300

    def job(env: StreamExecutionEnvironment, hold_after: int | None) -> Any:
        return (
            env.from_source(HoldingSequence(0, n - 1, hold_after), source_name="numbers")
            .uid("source")
            .set_parallelism(1)  # one source: each key's records arrive in order
            .map(lambda x: (x % keys, (x * 7919) % 1000, x))
            .uid("fields")
            .set_parallelism(1)
            .key_by(lambda t: t[0])
            .min(1)
            .uid("min")
        )

    retain = {
        "execution.checkpointing.dir": str(tmp_path / "a"),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "chandy.network.batch-size": 20,
    }
    # The first run's source stops after `cut` records, so the job cannot end before the test
    # cancels it, however slow the machine. The collect sink hands results over when the
    # checkpoint after them completes: once all `cut` are here, a checkpoint holds them all.
    results = job(checkpointing_env(interval_ms=30, **retain), hold_after=cut).execute_and_collect("first")
    first, reader = drain(results)
    deadline = time.monotonic() + 120
    while len(first) < cut and reader.is_alive():
        assert time.monotonic() < deadline, f"{len(first)} of {cut} results after 120 s"
        time.sleep(0.02)
    cancel_keeping_results(results, reader)
    assert len(first) == cut
    env = checkpointing_env(interval_ms=100, **{"execution.checkpointing.dir": str(tmp_path / "b")})
    env.set_restore_path(str(latest_checkpoint_dir(tmp_path / "a")))
    second = job(env, hold_after=None).execute_and_collect("second", limit=10**6)
    expected: dict[int, list[tuple[int, int, int]]] = {}
    for x in range(n):
        key, value = x % keys, (x * 7919) % 1000
        so_far = expected.setdefault(key, [])
        so_far.append((key, min(value, so_far[-1][1]) if so_far else value, key))
    before, after = by_key(first, lambda t: t[0]), by_key(second, lambda t: t[0])
    assert {k: before.get(k, []) + after.get(k, []) for k in range(keys)} == expected


# ---------------------------------------------------------------------- rescale


def pointwise_pairs(producers: int, consumers: int) -> set[tuple[int, int]]:
    """Flink's EdgeManagerBuildUtil.connectPointwise, written out as Flink writes it."""
    if producers == consumers:
        return {(i, i) for i in range(producers)}
    if producers > consumers:
        return {
            (i, j)
            for j in range(consumers)
            for i in range(j * producers // consumers, (j + 1) * producers // consumers)
        }
    return {
        (i, j)
        for i in range(producers)
        for j in range(
            (i * consumers + producers - 1) // producers, ((i + 1) * consumers + producers - 1) // producers
        )
    }


def rescale_graph(producers: int, consumers: int, partitioning: str = "rescale") -> ExecutionGraph:
    env = env_with(1)
    stream = env.from_sequence(0, 9).set_parallelism(producers)
    getattr(stream, partitioning)().map(lambda x: x).set_parallelism(consumers).print().set_parallelism(
        consumers
    )
    return ExecutionGraph(env._build_job_graph("rescale"))


@pytest.mark.parametrize(("producers", "consumers"), [(2, 3), (3, 2), (2, 4), (4, 2), (3, 5), (5, 3), (4, 4)])
def test_a_rescale_edge_is_wired_as_flinks_pointwise_distribution(producers: int, consumers: int) -> None:
    graph = rescale_graph(producers, consumers)
    source, target = graph.job_graph.vertices
    (edge,) = source.outputs
    assert (edge.partitioner.name, edge.pattern) == ("RESCALE", DistributionPattern.POINTWISE)
    written = {
        (c.producer_subtask, c.consumer_subtask)
        for i in range(producers)
        for c in graph.output_channel_ids(source, i)[0]
    }
    read = {
        (c.producer_subtask, c.consumer_subtask)
        for j in range(consumers)
        for c in graph.input_channel_ids(target, j)
    }
    assert written == read == pointwise_pairs(producers, consumers)
    # a contiguous range each: nobody left without a partner
    assert {i for i, _ in written} == set(range(producers)) and {j for _, j in written} == set(
        range(consumers)
    )


def test_forward_stays_subtask_i_to_subtask_i() -> None:
    env = env_with(3)
    env.from_sequence(0, 9).map(lambda x: x).disable_chaining().print()
    graph = ExecutionGraph(env._build_job_graph("forward"))
    source, target = graph.job_graph.vertices[:2]
    assert source.outputs[0].partitioner.name == "FORWARD"
    for i in range(3):
        assert [(c.producer_subtask, c.consumer_subtask) for c in graph.output_channel_ids(source, i)[0]] == [
            (i, i)
        ]
        assert [(c.producer_subtask, c.consumer_subtask) for c in graph.input_channel_ids(target, i)] == [
            (i, i)
        ]


def test_rescale_at_equal_parallelism_is_pointwise_but_not_chained() -> None:
    """Flink chains only forward edges; a rescale edge stays a network edge, i to i."""
    graph = rescale_graph(3, 3)
    assert len(graph.job_graph.vertices) == 2
    assert graph.job_graph.edges[0].partitioner.name == "RESCALE"


def test_the_rescale_partitioner_round_robins_from_its_first_channel_across_batches() -> None:
    partitioner = RescalePartitioner()
    partitioner.setup(2, 5)
    buffers: list[list[int]] = [[], []]
    partitioner.partition([0, 1, 2], buffers)
    partitioner.partition([3, 4], buffers)
    assert buffers == [[0, 2, 4], [1, 3]]  # Flink's RescalePartitioner starts at channel 0
    timed = RescalePartitioner().with_timestamps(True)
    timed.setup(3, 0)
    batches = [timed.new_buffer() for _ in range(3)]
    timed.partition_timestamped(["a", "b", "c", "d"], [10, None, 30, 40], batches)
    assert [(b.values, b.timestamps) for b in batches] == [
        (["a", "d"], [10, 40]),
        (["b"], [None]),
        (["c"], [30]),
    ]


class Tag(MapFunction):
    """Appends the index of the subtask the record passed through."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.subtask = runtime_context.get_index_of_this_subtask()

    def map(self, value: Any) -> Any:
        return (*value, self.subtask) if isinstance(value, tuple) else (value, self.subtask)


def rescale_job(env: StreamExecutionEnvironment, n: int, parallelisms: tuple[int, int, int]) -> Any:
    """source(p0) -> rescale -> tag(p1) -> rescale -> tag(p2): records as (value, s0, s1, s2)."""
    p0, p1, p2 = parallelisms
    return (
        env.from_sequence(0, n - 1)
        .set_parallelism(p0)
        .map(Tag())
        .set_parallelism(p0)
        .rescale()
        .map(Tag())
        .set_parallelism(p1)
        .rescale()
        .map(Tag())
        .set_parallelism(p2)
    )


def assert_rescaled(out: list[tuple[int, int, int, int]], n: int, parallelisms: tuple[int, int, int]) -> None:
    p0, p1, p2 = parallelisms
    assert sorted(value for value, *_ in out) == list(range(n))  # every record exactly once
    assert {(a, b) for _, a, b, _ in out} == pointwise_pairs(p0, p1)
    assert {(b, c) for _, _, b, c in out} == pointwise_pairs(p1, p2)
    # round-robin: each producer spreads its records evenly over the consumers it feeds
    for hop in (1, 2):
        per_producer: dict[int, Counter[int]] = defaultdict(Counter)
        for record in out:
            per_producer[record[hop]][record[hop + 1]] += 1
        for producer, counts in per_producer.items():
            assert max(counts.values()) - min(counts.values()) <= 1, (hop, producer, counts)


@pytest.mark.parametrize("parallelisms", [(2, 3, 2), (3, 2, 4)])
def test_rescale_sends_every_record_once_along_the_pointwise_channels(
    parallelisms: tuple[int, int, int],
) -> None:
    n = 3_000
    out = rescale_job(env_with(1), n, parallelisms).execute_and_collect(limit=10 * n)
    assert_rescaled(out, n, parallelisms)


@pytest.mark.slow
def test_rescale_between_parallelism_2_and_3_on_spark(spark_session: Any) -> None:
    n = 3_000
    out = rescale_job(env_with(1, "spark"), n, (2, 3, 2)).execute_and_collect(limit=10 * n)
    assert_rescaled(out, n, (2, 3, 2))


@pytest.mark.slow
@pytest.mark.parametrize(("on", "new_parallelism"), [("local", 2), ("local", 4), ("spark", 4)])
def test_restore_of_a_job_whose_rescale_edge_changed_parallelism(
    tmp_path: Path, on: str, new_parallelism: int, request: pytest.FixtureRequest
) -> None:
    """Cut at a checkpoint of source(2) -rescale-> map(3), then run on with the map at another
    parallelism (the edge is wired anew: 2 -> 2 is one channel each, 2 -> 4 two): the map's
    operator state and the keyed counts continue exactly once."""
    if on == "spark":
        request.getfixturevalue("spark_session")
    n, keys = 20_000, 20

    def job(
        env: StreamExecutionEnvironment, hold_after: int | None, map_parallelism: int, probe: Probe
    ) -> Any:
        return (
            env.from_source(HoldingSequence(0, n - 1, hold_after), source_name="numbers")
            .uid("source")
            .rescale()
            .map(CountingMap("map", probe))
            .uid("map")
            .set_parallelism(map_parallelism)
            .key_by(lambda x: x % keys)
            .process(KeyedCounter(n // keys))
            .uid("counter")
        )

    retain = {
        "execution.checkpointing.dir": str(tmp_path),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    }
    first_env = checkpointing_env(interval_ms=50, executor=on, **retain)
    # Each source subtask stops half-way (no key is complete, so nothing is collected): the
    # first run is still running whenever its first checkpoint completes, however slow the machine.
    results = job(first_env, n // 4, 3, Probe()).execute_and_collect("first run")
    first, reader = drain(results)
    wait_for_checkpoints(tmp_path, 1)
    cancel_keeping_results(results, reader)
    assert first == []
    env = checkpointing_env(
        interval_ms=100, executor=on, **{"execution.checkpointing.dir": str(tmp_path / "second")}
    )
    env.set_restore_path(str(latest_checkpoint_dir(tmp_path)))
    probe = Probe()
    second = job(env, None, new_parallelism, probe).execute_and_collect("second run", limit=10**6)
    assert sorted(second) == [(k, n // keys) for k in range(keys)]
    # the restored counters continue where the checkpoint was, redistributed over the new subtasks
    assert sum(final_counts(probe, "map").values()) == n
    assert len(final_counts(probe, "map")) == new_parallelism


# ---------------------------------------------------------------------- partition_custom


class ByFirstLetter(Partitioner):
    """Words starting with a-h to partition 0, i-p to 1, the rest to the last."""

    def partition(self, key: Any, num_partitions: int) -> int:
        if key <= "h":
            return 0
        return 1 if key <= "p" else num_partitions - 1


class FirstLetter(KeySelector):
    def get_key(self, value: Any) -> Any:
        return value[0]


WORDS = ["apple", "kiwi", "zucchini", "banana", "mango", "tomato", "fig", "olive", "yam"]


def test_partition_custom_sends_each_record_where_the_partitioner_says() -> None:
    env = env_with(3)
    out = (
        env.from_collection(WORDS)
        .partition_custom(ByFirstLetter(), FirstLetter())
        .map(Tag())
        .execute_and_collect(limit=100)
    )
    assert sorted(out) == sorted((w, 0 if w[0] <= "h" else 1 if w[0] <= "p" else 2) for w in WORDS)
    # lambdas work as well; num_partitions is the parallelism of the next operator
    env = env_with(2)
    out = (
        env.from_sequence(0, 99)
        .partition_custom(lambda key, num_partitions: key % num_partitions, lambda x: x // 10)
        .map(Tag())
        .set_parallelism(4)
        .execute_and_collect(limit=1000)
    )
    assert sorted(out) == [(x, (x // 10) % 4) for x in range(100)]


class CountingPartitioner(Partitioner):
    """Counts its calls in itself: shows whose copy a subtask uses."""

    def __init__(self) -> None:
        self.calls = 0

    def partition(self, key: Any, num_partitions: int) -> int:
        self.calls += 1
        return key % num_partitions


def test_each_producing_subtask_partitions_with_its_own_copy_of_the_partitioner() -> None:
    prototype = CountingPartitioner()
    wrapper = CustomPartitionerWrapper(prototype, lambda x: x)
    first, second = wrapper.copy(), wrapper.copy()
    first.setup(2, 0)
    second.setup(2, 1)
    buffers: list[list[int]] = [[], []]
    first.partition([0, 1, 2], buffers)
    second.partition([3], buffers)
    assert buffers == [[0, 2], [1, 3]]
    assert prototype.calls == 0
    owners = [f.partition_function.__self__ for f in (first, second)]  # type: ignore[attr-defined]
    assert [o.calls for o in owners] == [3, 1]


def test_a_bad_partition_on_a_timestamped_edge_is_the_same_error() -> None:
    wrapper = CustomPartitionerWrapper(lambda key, n: -1, lambda x: x).with_timestamps(True)
    wrapper.setup(2, 0)
    with pytest.raises(
        ValueError, match=r"returned -1 for key 7, but the partition must be an int in \[0, 2\)"
    ):
        wrapper.partition_timestamped([7], [70], [wrapper.new_buffer(), wrapper.new_buffer()])


class Index:
    """An int-like that is not an int (as numpy's integers): accepted via ``__index__``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_an_int_like_partition_is_accepted() -> None:
    out = (
        env_with(2)
        .from_sequence(0, 9)
        .partition_custom(lambda key, n: Index(key % n), lambda x: x)
        .map(Tag())
        .execute_and_collect(limit=100)
    )
    assert sorted(out) == [(x, x % 2) for x in range(10)]


@pytest.mark.parametrize("bad", [-1, 3, "1", 1.0, True, None])
def test_a_partition_outside_the_range_fails_the_job_naming_partitioner_key_and_value(bad: Any) -> None:
    """-1 would silently be the last channel in Python, 1.0 and True would pass for 1."""

    class Bad(Partitioner):
        def partition(self, key: Any, num_partitions: int) -> Any:
            return bad if key == "k" else 0

    env = env_with(3)
    env.from_collection(WORDS).partition_custom(Bad(), FirstLetter()).print()
    with pytest.raises(JobExecutionError) as failure:
        env.execute()
    cause = failure.value.__cause__
    assert isinstance(cause, ValueError)
    assert f"partition_custom: Bad.partition returned {bad!r} for key 'k'" in str(cause)
    assert "the partition must be an int in [0, 3)" in str(cause)


def test_partition_custom_refuses_what_is_not_a_partitioner_or_key_selector() -> None:
    stream = env_with(1).from_collection([1])
    with pytest.raises(InvalidProgramError, match=r"partition_custom\(\) takes a Partitioner"):
        stream.partition_custom(42, lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match=r"partition_custom\(\) takes a KeySelector"):
        stream.partition_custom(lambda k, n: 0, "x")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- ProcessFunction ctx.timestamp()


class WithTimestamp(ProcessFunction):
    def process_element(self, value: Any, ctx: ProcessFunction.Context) -> Any:
        yield value, ctx.timestamp()


class TenTimes(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return value * 10


def test_process_function_sees_each_records_timestamp_across_rescale_and_custom_edges() -> None:
    env = env_with(2)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(5)).with_timestamp_assigner(
        TenTimes()
    )
    timed = env.from_sequence(0, 49).assign_timestamps_and_watermarks(strategy)
    rescaled = timed.rescale().process(WithTimestamp()).set_parallelism(3)
    custom = timed.partition_custom(lambda k, n: k % n, lambda x: x).process(WithTimestamp())
    out = rescaled.union(custom).execute_and_collect(limit=1000)
    assert sorted(out) == sorted([(x, x * 10) for x in range(50)] * 2)


def test_process_function_timestamp_is_none_without_event_time() -> None:
    out = env_with(2).from_sequence(0, 9).rescale().process(WithTimestamp()).execute_and_collect(limit=100)
    assert sorted(out) == [(x, None) for x in range(10)]
