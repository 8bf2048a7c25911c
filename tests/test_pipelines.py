"""End-to-end pipelines on the local executor: what a user's job does."""

from __future__ import annotations

import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from chandy import InvalidProgramError, JobExecutionError, StreamExecutionEnvironment
from chandy.core.connector import (
    Boundedness,
    Sink,
    SinkWriter,
    SinkWriterContext,
    Source,
    SourceReader,
    SourceReaderContext,
)
from chandy.core.functions import (
    KeyedProcessFunction,
    MapFunction,
    ProcessFunction,
    RuntimeContext,
    SinkFunction,
)
from chandy.core.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from chandy.errors import JobCancelledError
from tests.probes import Probe

TEXT = ["to be or not to be", "that is the question", "to be is to do", "do be do be do"]


def env_with(parallelism: int, executor: str = "local") -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)
    env.set_parallelism(parallelism)
    return env


def final_counts(pairs: Sequence[tuple[str, int]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word, count in pairs:
        counts[word] = max(count, counts.get(word, 0))
    return counts


@pytest.mark.parametrize(
    ("on", "parallelism"),
    # On Spark, 2 and 4 take the same path (slot processes exchanging the keyed stream over
    # TCP, 4 just with more of them); 1 is the case without an exchange between slots.
    [("local", 1), ("local", 2), ("local", 4), ("spark", 1), ("spark", 4)],
    ids=["local-1", "local-2", "local-4", "spark-1", "spark-4"],
)
def test_word_count_is_the_same_at_every_parallelism(
    on: str, parallelism: int, request: pytest.FixtureRequest
) -> None:
    if on == "spark":
        request.getfixturevalue("spark_session")
    env = env_with(parallelism, on)
    result = (
        env.from_collection(TEXT * 50)
        .flat_map(lambda line: line.split())
        .map(lambda w: (w, 1))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .execute_and_collect("word count", limit=10**6)
    )
    expected = Counter(w for line in TEXT * 50 for w in line.split())
    assert final_counts(result) == dict(expected)
    assert len(result) == sum(expected.values())  # one update per input word


class CountAndSum(KeyedProcessFunction):
    """Emits (key, count, sum) once a key has seen ``per_key`` records."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count"))
        self.total = runtime_context.get_reducing_state(ReducingStateDescriptor("sum", lambda a, b: a + b))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        self.total.add(value)
        if count == self.per_key:
            yield ctx.get_current_key(), count, self.total.get()


def test_keyed_state_sums_are_exact_over_a_million_records(executor: str) -> None:
    n, keys = 1_000_000, 1000
    env = env_with(2, executor)
    out = (
        env.from_sequence(0, n - 1)
        .key_by(lambda i: i % keys)
        .process(CountAndSum(n // keys))
        .execute_and_collect(limit=keys + 1)
    )
    assert len(out) == keys
    for key, count, total in out:
        assert count == n // keys
        assert total == sum(range(key, n, keys))


class CountingSource(Source):
    def __init__(self, total: int, progress: Probe) -> None:
        self.total = total
        self.progress = progress

    def get_boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED

    def create_splits(self, parallelism: int) -> list[int]:
        return [0]

    def create_reader(self, context: SourceReaderContext) -> SourceReader:
        source = self

        class Reader(SourceReader):
            position = 0

            def add_splits(self, splits: Sequence[Any]) -> None:
                pass

            def poll_next(self, max_records: int) -> list[int] | None:
                if self.position >= source.total:
                    return None
                batch = list(range(self.position, min(source.total, self.position + max_records)))
                self.position += len(batch)
                source.progress.add("emitted", len(batch))
                return batch

            def snapshot_state(self, checkpoint_id: int) -> list[Any]:
                return []

        return Reader()


class SlowSink(Sink):
    def __init__(self, progress: Probe, delay_s: float) -> None:
        self.progress = progress
        self.delay_s = delay_s

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        progress, delay = self.progress, self.delay_s

        class Writer(SinkWriter):
            def write(self, element: Any) -> None:
                raise AssertionError("batches only")

            def write_batch(self, elements: list[Any]) -> None:
                time.sleep(delay)
                consumed = progress.add("consumed", len(elements))
                progress.maximum("ahead", progress.get("emitted") - consumed)

        return Writer()


def test_a_slow_sink_backpressures_a_fast_source(executor: str) -> None:
    batch, credits = 100, 4
    env = env_with(1, executor)
    env.configure(
        {"chandy.network.batch-size": batch, "taskmanager.network.memory.buffers-per-channel": credits}
    )
    progress = Probe()
    (
        env.from_source(CountingSource(30_000, progress))
        .map(lambda x: x)
        .disable_chaining()  # two network hops between source and sink
        .sink_to(SlowSink(progress, 0.001))
        .disable_chaining()
    )
    env.execute("backpressure")
    assert progress.get("consumed") == 30_000
    # At most: each hop's channel credits + a partly filled batch + the batch in hand.
    bound = 2 * (credits + 2) * batch
    assert 0 < progress.get("ahead") <= bound, progress.get("ahead")


class Boom(MapFunction):
    def map(self, value: int) -> int:
        if value == 500:
            raise ValueError("bad record 500")
        return value


def test_a_raising_user_function_fails_the_job_with_its_exception(executor: str) -> None:
    env = env_with(2, executor)
    env.from_sequence(0, 100_000).key_by(lambda x: x % 7).map(Boom()).name("boom").print()
    started = time.monotonic()
    with pytest.raises(JobExecutionError) as info:
        env.execute("failing job")
    assert time.monotonic() - started < 30
    assert isinstance(info.value.__cause__, ValueError)
    assert "bad record 500" in str(info.value)
    assert "operator 'boom'" in str(info.value)
    assert "failing job" in str(info.value)
    cause = info.value.__cause__
    if cause.__traceback__ is not None:  # raised in this process
        frames = [f.name for f in traceback.extract_tb(cause.__traceback__)]
        assert "map" in frames  # the user's own frame is on the traceback
    else:  # raised in a Spark slot: the remote traceback is in the message
        assert 'raise ValueError("bad record 500")' in str(info.value)
    # every task thread ended: nothing is left running
    deadline = time.monotonic() + 5
    while any(t.name.startswith("chandy ") for t in threading.enumerate()):
        assert time.monotonic() < deadline, [t.name for t in threading.enumerate()]
        time.sleep(0.01)


def test_execute_twice_runs_two_jobs(executor: str) -> None:
    env = env_with(2, executor)
    first = env.from_collection([1, 2, 3]).map(lambda x: x * 2).execute_and_collect(limit=10)
    second = env.from_collection([4, 5]).map(lambda x: x + 1).execute_and_collect(limit=10)
    assert sorted(first) == [2, 4, 6]
    assert sorted(second) == [5, 6]
    env.from_collection(["x"]).print()
    r1 = env.execute("one")
    env.from_collection(["y"]).print()
    r2 = env.execute("two")
    assert r1.get_job_id() != r2.get_job_id()
    assert r2.get_job_name() == "two" and r2.get_net_runtime() >= 0


def test_execute_without_operators_or_sinks_is_a_clear_error() -> None:
    env = env_with(1)
    with pytest.raises(InvalidProgramError, match="no operators"):
        env.execute()
    env.from_collection([1]).map(lambda x: x)
    with pytest.raises(InvalidProgramError, match="no sink"):
        env.execute()


class Forever(Source):
    def get_boundedness(self) -> Boundedness:
        return Boundedness.CONTINUOUS_UNBOUNDED

    def create_splits(self, parallelism: int) -> list[int]:
        return list(range(parallelism))

    def create_reader(self, context: SourceReaderContext) -> SourceReader:
        class Reader(SourceReader):
            n = 0

            def add_splits(self, splits: Sequence[Any]) -> None:
                pass

            def poll_next(self, max_records: int) -> list[int]:
                self.n += 1
                return [self.n]

            def snapshot_state(self, checkpoint_id: int) -> list[Any]:
                return []

        return Reader()


def test_closing_the_collect_iterator_cancels_an_unbounded_job(executor: str) -> None:
    env = env_with(2, executor)
    stream = env.from_source(Forever()).map(lambda x: x * 10)
    with stream.execute_and_collect() as results:
        taken = [next(results) for _ in range(50)]
    assert all(x % 10 == 0 for x in taken)
    deadline = time.monotonic() + 10
    while any(t.name.startswith("chandy ") for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert list(results) == []  # closed: nothing more


def test_collect_iterator_reports_the_job_failure(executor: str) -> None:
    env = env_with(1, executor)
    results = env.from_collection([1, 2, 0, 4]).map(lambda x: 10 // x).execute_and_collect()
    with pytest.raises(JobExecutionError) as info:
        list(results)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert not isinstance(info.value, JobCancelledError)


def test_partitionings_deliver_the_right_records(executor: str) -> None:
    env = env_with(3, executor)
    src = env.from_sequence(1, 300)
    union = (
        src.rebalance()
        .map(lambda x: ("r", x))
        .union(
            src.shuffle().map(lambda x: ("s", x)),
            src.broadcast().map(lambda x: ("b", x)),
            src.forward().map(lambda x: ("f", x)),
        )
    )
    out = union.execute_and_collect(limit=10**5)
    by_tag = Counter(tag for tag, _ in out)
    assert by_tag == {"r": 300, "s": 300, "b": 900, "f": 300}
    for tag in "rsf":
        assert sorted(x for t, x in out if t == tag) == list(range(1, 301))


class SubtaskTagger(ProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.index = runtime_context.get_index_of_this_subtask()
        self.parallelism = runtime_context.get_number_of_parallel_subtasks()

    def process_element(self, value: int, ctx: ProcessFunction.Context) -> Any:
        return [(self.index, self.parallelism, value)]


def test_per_operator_parallelism(executor: str) -> None:
    out = (
        env_with(2, executor)
        .from_sequence(1, 1000)
        .process(SubtaskTagger())
        .set_parallelism(4)
        .execute_and_collect(limit=10**4)
    )
    assert {p for _, p, _ in out} == {4}
    assert {i for i, _, _ in out} == {0, 1, 2, 3}
    assert sorted(v for _, _, v in out) == list(range(1, 1001))


def test_rebalance_spreads_evenly(executor: str) -> None:
    env = env_with(4, executor)
    out = (
        env.from_collection(list(range(4000)))
        .rebalance()
        .process(SubtaskTagger())
        .execute_and_collect(limit=10**4)
    )
    assert Counter(i for i, _, _ in out) == {0: 1000, 1: 1000, 2: 1000, 3: 1000}


def test_print_prefixes_the_subtask(capsys: pytest.CaptureFixture[str], executor: str) -> None:
    env = env_with(2, executor)
    env.from_collection(["a", "b", "c", "d"]).rebalance().print()
    env.execute()
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(["1> a", "2> b", "1> c", "2> d"]) or sorted(
        line[3:] for line in lines
    ) == ["a", "b", "c", "d"]
    assert {line[:3] for line in lines} == {"1> ", "2> "}
    env = env_with(1, executor)
    env.from_collection([("w", 1)]).print("counts")
    env.execute()
    assert capsys.readouterr().out == "counts> ('w', 1)\n"


class Lifecycle(MapFunction):
    """Records open/close calls into a probe."""

    def __init__(self, log: Probe) -> None:
        self.log = log

    def open(self, runtime_context: RuntimeContext) -> None:
        self.name = runtime_context.get_task_name_with_subtasks()
        self.log.append(f"open {runtime_context.get_index_of_this_subtask()}")

    def map(self, value: int) -> int:
        return value

    def close(self) -> None:
        self.log.append("close")


def test_function_classes_are_opened_and_closed_once_per_subtask(executor: str) -> None:
    log = Probe()
    env = env_with(2, executor)
    env.from_sequence(1, 100).map(Lifecycle(log)).print()
    env.execute()
    assert sorted(log.items) == ["close", "close", "open 0", "open 1"]


class Stateful(MapFunction):
    """Counts in ``self``: each subtask must count only its own records."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = 0
        self.index = runtime_context.get_index_of_this_subtask()

    def map(self, value: int) -> tuple[int, int]:
        self.seen += 1
        return self.index, self.seen


def test_every_subtask_gets_its_own_copy_of_a_function(executor: str) -> None:
    env = env_with(2, executor)
    out = env.from_collection(list(range(100))).rebalance().map(Stateful()).execute_and_collect(limit=1000)
    for index in (0, 1):
        counts = sorted(seen for i, seen in out if i == index)
        assert counts == list(range(1, 51))  # 1..50 per subtask: nothing shared


def test_a_function_that_cannot_be_copied_is_named(executor: str) -> None:
    env = env_with(1, executor)
    lock = threading.Lock()
    env.from_collection([1]).map(lambda x: (x, lock)).name("holds a lock").print()
    with pytest.raises(InvalidProgramError, match="operator 'holds a lock'.*open()"):
        env.execute()


class Collecting(SinkFunction):
    def __init__(self, into: Probe) -> None:
        self.into = into

    def invoke(self, value: Any, context: SinkFunction.Context) -> None:
        assert context.timestamp() is None
        self.into.append(value)

    def finish(self) -> None:
        self.into.append("finished")


def test_add_sink_with_a_function_class_and_a_lambda(executor: str) -> None:
    into = Probe()
    env = env_with(1, executor)
    env.from_collection([1, 2, 3]).add_sink(Collecting(into))
    env.execute()
    assert into.items == [1, 2, 3, "finished"]
    plain = Probe()
    env.from_collection([4]).add_sink(plain.append)
    env.execute()
    assert plain.items == [4]


class Sessions(KeyedProcessFunction):
    """List and map state: remember every page per user and count visits per page."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.pages = runtime_context.get_list_state(ListStateDescriptor("pages"))
        self.visits = runtime_context.get_map_state(MapStateDescriptor("visits"))

    def process_element(self, value: tuple[str, str], ctx: KeyedProcessFunction.Context) -> Any:
        user, page = value
        self.pages.add(page)
        self.visits.put(page, (self.visits.get(page) or 0) + 1)
        if page == "logout":
            yield user, list(self.pages.get()), dict(self.visits.items())
            self.pages.clear()
            self.visits.clear()


def test_list_and_map_state_in_a_job(executor: str) -> None:
    events = [
        ("ann", "home"),
        ("bob", "home"),
        ("ann", "cart"),
        ("ann", "home"),
        ("bob", "logout"),
        ("ann", "logout"),
        ("bob", "home"),
        ("bob", "logout"),
    ]
    env = env_with(2, executor)
    out = (
        env.from_collection(events).key_by(lambda e: e[0]).process(Sessions()).execute_and_collect(limit=100)
    )
    assert sorted(out, key=repr) == sorted(
        [
            ("ann", ["home", "cart", "home", "logout"], {"home": 2, "cart": 1, "logout": 1}),
            ("bob", ["home", "logout"], {"home": 1, "logout": 1}),
            ("bob", ["home", "logout"], {"home": 1, "logout": 1}),
        ],
        key=repr,
    )


class RunningMax(MapFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.best = runtime_context.get_state(ValueStateDescriptor("best"))

    def map(self, value: tuple[str, int]) -> tuple[str, int]:
        best = max(value[1], self.best.value() or value[1])
        self.best.update(best)
        return value[0], best


def test_keyed_map_filter_flat_map_use_keyed_state(executor: str) -> None:
    env = env_with(2, executor)
    data = [("a", 3), ("b", 1), ("a", 1), ("b", 5), ("a", 7)]
    out = env.from_collection(data).key_by(lambda t: t[0]).map(RunningMax()).execute_and_collect(limit=100)
    assert sorted(out) == sorted([("a", 3), ("b", 1), ("a", 3), ("b", 5), ("a", 7)])
    keyed = env.from_collection(data).key_by(lambda t: t[0])
    flat = keyed.flat_map(lambda t: [t[0]] * t[1]).execute_and_collect(limit=100)
    assert Counter(flat) == {"a": 11, "b": 6}
    kept = (
        env.from_collection(data)
        .key_by(lambda t: t[0])
        .filter(lambda t: t[1] > 2)
        .execute_and_collect(limit=100)
    )
    assert sorted(kept) == [("a", 3), ("a", 7), ("b", 5)]


def test_sum_on_tuples_numbers_and_dicts(executor: str) -> None:
    env = env_with(2, executor)
    tuples = (
        env.from_collection([("a", 1, "x"), ("a", 2, "y"), ("b", 5, "z")])
        .key_by(lambda t: t[0])
        .sum(1)
        .execute_and_collect(limit=10)
    )
    assert final_counts([(t[0], t[1]) for t in tuples]) == {"a": 3, "b": 5}
    assert ("a", 3, "x") in tuples  # other fields come from the first record, as in Flink
    numbers = env.from_collection([1, 2, 3, 4]).key_by(lambda x: x % 2).sum().execute_and_collect(limit=10)
    assert max(numbers) == 6 and 4 in numbers
    dicts = (
        env.from_collection([{"k": "a", "n": 1}, {"k": "a", "n": 4}])
        .key_by(lambda d: d["k"])
        .sum("n")
        .execute_and_collect(limit=10)
    )
    assert dicts[-1] == {"k": "a", "n": 5}


def test_keyed_state_outside_a_keyed_stream_is_a_clear_error(executor: str) -> None:
    class Bad(MapFunction):
        def open(self, runtime_context: RuntimeContext) -> None:
            runtime_context.get_state(ValueStateDescriptor("x"))

        def map(self, value: Any) -> Any:
            return value

    env = env_with(1, executor)
    env.from_collection([1]).map(Bad()).print()
    with pytest.raises(JobExecutionError, match="key_by"):
        env.execute()


def test_an_unpartitionable_key_fails_the_job_with_the_type_named(executor: str) -> None:
    env = env_with(2, executor)
    env.from_collection([object()]).key_by(lambda x: x).sum().print()
    with pytest.raises(JobExecutionError, match="key of type object"):
        env.execute()


def test_bad_functions_are_rejected_when_the_pipeline_is_built() -> None:
    env = env_with(1)
    with pytest.raises(InvalidProgramError, match="map"):
        env.from_collection([1]).map(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match="KeyedProcessFunction"):
        env.from_collection([1]).key_by(lambda x: x).process(SubtaskTagger())
    with pytest.raises(InvalidProgramError, match="partitioning or a union"):
        env.from_collection([1]).rebalance().set_parallelism(2)
