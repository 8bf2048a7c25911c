"""The batch path's partitioners: every row lands where the record path would put its record."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chandy.errors import InvalidProgramError, UnrecoverableError
from chandy.graph.job_graph import DistributionPattern, create_job_graph
from chandy.graph.stream_graph import StreamGraph
from chandy.state.arrow_keys import KEY_COLUMN, KEY_GROUP_COLUMN
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.task.arrow_partitioners import (
    ArrowBroadcastPartitioner,
    ArrowForwardPartitioner,
    ArrowKeyGroupPartitioner,
    ArrowRebalancePartitioner,
    ArrowRescalePartitioner,
    ArrowShufflePartitioner,
    ColumnarPartitioner,
)
from chandy.task.operators.base import StreamOperator
from chandy.task.partitioners import ForwardPartitioner, KeyGroupStreamPartitioner, RebalancePartitioner


def keyed(partitioner: ArrowKeyGroupPartitioner, channels: int, subtask: int = 0) -> ArrowKeyGroupPartitioner:
    copy = partitioner.copy()
    assert isinstance(copy, ArrowKeyGroupPartitioner)
    copy.setup(channels, subtask)
    return copy


def random_batch(rng: random.Random, n: int, kind: str) -> pa.RecordBatch:
    if kind == "int":
        keys: pa.Array = pa.array(
            [rng.randrange(-(2**40), 2**40) if rng.random() < 0.3 else rng.randrange(50) for _ in range(n)],
            pa.int64(),
        )
    else:
        keys = pa.array([f"user-{rng.randrange(300)}" if rng.random() < 0.95 else None for _ in range(n)])
    return pa.record_batch({"key": keys, "row": pa.array(range(n), pa.int64())})


@pytest.mark.parametrize("kind", ["int", "str"])
@pytest.mark.parametrize("channels", [1, 2, 3, 8, 20])
def test_every_row_goes_to_the_subtask_owning_its_record_path_key_group(kind: str, channels: int) -> None:
    rng = random.Random(f"{kind}{channels}")
    max_p = 128
    partitioner = keyed(ArrowKeyGroupPartitioner("key").for_target(max_p, ship_keys=True), channels)
    record_path = KeyGroupStreamPartitioner(lambda row: row[0]).for_target(max_p, ship_keys=True)
    record_path.setup(channels, 0)
    for _ in range(5):
        batch = random_batch(rng, rng.randrange(1, 3000), kind)
        pieces = partitioner.split(batch)
        assert len({c for c, _ in pieces}) == len(pieces) and all(p.num_rows for _, p in pieces)
        seen = []
        for channel, piece in pieces:
            assert piece.schema.names == ["key", "row", KEY_GROUP_COLUMN]
            assert piece.schema.field(KEY_GROUP_COLUMN).type == pa.int32()
            rows = piece.column("row").to_pylist()
            assert rows == sorted(rows)  # batch order kept within a channel
            seen += rows
            for key, group in zip(
                piece.column("key").to_pylist(), piece.column(KEY_GROUP_COLUMN).to_pylist(), strict=True
            ):
                assert group == assign_to_key_group(key, max_p)
                assert group in KeyGroupRange.of_operator(max_p, channels, channel)
        assert sorted(seen) == list(range(batch.num_rows))
        # The record path routes the same keys to the same channels.
        buffers = [record_path.new_buffer() for _ in range(channels)]
        record_path.partition(
            list(zip(batch.column("key").to_pylist(), batch.column("row").to_pylist(), strict=True)), buffers
        )
        for channel, piece in pieces:
            assert [v[1] for v in buffers[channel].values] == piece.column("row").to_pylist()


def test_a_function_key_ships_its_keys_and_groups_and_ship_keys_off_leaves_the_batch_as_it_came() -> None:
    max_p = 64
    batch = pa.record_batch(
        {"a": pa.array(range(1000), pa.int64()), "b": pa.array([i % 7 for i in range(1000)], pa.int64())}
    )

    def key(b: pa.RecordBatch) -> Any:
        return pc.add(pc.multiply(b.column("b"), 10), pc.bit_wise_and(b.column("a"), 1))

    shipped = keyed(ArrowKeyGroupPartitioner(key).for_target(max_p, ship_keys=True), 3)
    plain = keyed(ArrowKeyGroupPartitioner(key).for_target(max_p, ship_keys=False), 3)
    shipped_pieces, plain_pieces = shipped.split(batch), plain.split(batch)
    assert [c for c, _ in shipped_pieces] == [c for c, _ in plain_pieces]
    for (channel, piece), (_, bare) in zip(shipped_pieces, plain_pieces, strict=True):
        assert piece.schema.names == ["a", "b", KEY_COLUMN, KEY_GROUP_COLUMN]
        assert bare.schema.names == ["a", "b"]
        assert bare.equals(piece.select(["a", "b"]))
        for a, b, k, g in zip(*(piece.column(i).to_pylist() for i in range(4)), strict=True):
            assert k == b * 10 + (a & 1) and g == assign_to_key_group(k, max_p)
            assert g in KeyGroupRange.of_operator(max_p, 3, channel)
    # Keyed again downstream of a keyed operator: the old internal columns are replaced.
    again = keyed(ArrowKeyGroupPartitioner("a").for_target(max_p, ship_keys=True), 1)
    [(_, rekeyed)] = again.split(pa.concat_batches([p for _, p in shipped_pieces]))
    assert rekeyed.schema.names == ["a", "b", KEY_GROUP_COLUMN]


def test_a_function_returning_numpy_or_a_list_and_its_errors() -> None:
    batch = pa.record_batch({"x": pa.array([3, 1, 3, 2], pa.int64())})
    numpy_key = keyed(
        ArrowKeyGroupPartitioner(lambda b: b.column("x").to_numpy() * 2).for_target(16, True), 2
    )
    list_key = keyed(
        ArrowKeyGroupPartitioner(lambda b: [str(v) for v in b.column("x").to_pylist()]).for_target(16, True),
        2,
    )
    for partitioner, expected in ((numpy_key, [6, 2, 6, 4]), (list_key, ["3", "1", "3", "2"])):
        keys = [k for _, p in partitioner.split(batch) for k in p.column(KEY_COLUMN).to_pylist()]
        assert sorted(keys) == sorted(expected)
    # mistakes of the job's definition: the built-in type, and unrecoverable (a restart repeats them)
    for kind, match, key, split in (
        (ValueError, "returned 1 keys for a batch of 4 rows", lambda b: [1], batch),
        (KeyError, r"^key_by\('y'\): the batch has no column 'y'; its columns are \['x'\]$", "y", batch),
        (TypeError, "to_batches", "x", [1, 2]),
    ):
        with pytest.raises(kind, match=match) as refused:
            keyed(ArrowKeyGroupPartitioner(key).for_target(16, True), 2).split(split)
        assert isinstance(refused.value, UnrecoverableError), refused.value
    with pytest.raises(ValueError, match="outside"):
        keyed(ArrowKeyGroupPartitioner("x").for_target(4, True), 5)


def test_a_key_function_treating_the_batch_as_a_record_or_returning_many_columns_is_told_why() -> None:
    """The key function gets the whole RecordBatch: one written for a record (r.customer)
    failed with the bare AttributeError; one returning several columns per row (tuples, a
    struct) failed deep in Arrow's dictionary encoding, or as 'not an array'."""
    batch = pa.record_batch({"x": [1, 2], "y": ["a", "b"]})

    def split(key: Any) -> Any:
        return keyed(ArrowKeyGroupPartitioner(key).for_target(16, True), 2).split(batch)

    with pytest.raises(TypeError, match=r"gets the whole RecordBatch.*array of one key per row") as wrong:
        split(lambda r: r.customer)
    assert isinstance(wrong.value, UnrecoverableError)
    assert isinstance(wrong.value.__cause__, AttributeError)
    with pytest.raises(ZeroDivisionError):  # an error of another kind is the function's own
        split(lambda b: 1 // 0)
    nested = batch.append_column("s", pa.StructArray.from_arrays([batch["x"], batch["y"]], names=["x", "y"]))
    for key in (
        lambda b: [(1, "a"), (2, "b")],
        lambda b: [(1, 2), (3, 4)],
        lambda b: pa.StructArray.from_arrays([b["x"], b["y"]], names=["x", "y"]),
        lambda b: np.array([[1, 2], [3, 4]]),
    ):
        with pytest.raises(TypeError, match="one key per row, not several.*map_batches") as many:
            split(key)
        assert isinstance(many.value, UnrecoverableError)
    with pytest.raises(TypeError, match=r"key_by\('s'\).*struct.*one key per row, not several"):
        keyed(ArrowKeyGroupPartitioner("s").for_target(16, True), 2).split(nested)


def test_whole_batch_partitioners() -> None:
    batches = [pa.record_batch({"v": pa.array(range(i, i + 10))}) for i in range(0, 120, 10)]
    empty = batches[0].slice(0, 0)

    def route(partitioner: ColumnarPartitioner, channels: int, subtask: int = 0) -> list[list[int]]:
        partitioner.setup(channels, subtask)
        out: list[list[int]] = [[] for _ in range(channels)]
        assert partitioner.split(empty) == []
        for batch in batches:
            buffers: list[Any] = [partitioner.new_buffer() for _ in range(channels)]
            partitioner.partition(batch, buffers)
            for channel, pieces in enumerate(buffers):
                for piece in pieces:
                    out[channel] += piece.column("v").to_pylist()
        return out

    assert route(ArrowForwardPartitioner(), 1) == [list(range(120))]
    assert isinstance(ArrowForwardPartitioner(), ForwardPartitioner)  # chains like the record one
    rebalanced = route(ArrowRebalancePartitioner(), 4, subtask=1)
    assert [len(c) for c in rebalanced] == [30] * 4 and sorted(v for c in rebalanced for v in c) == list(
        range(120)
    )
    assert route(ArrowRescalePartitioner(), 3)[0][:10] == list(range(10))  # starts at its first channel
    assert ArrowRescalePartitioner().is_pointwise and not ArrowRebalancePartitioner().is_pointwise
    assert route(ArrowBroadcastPartitioner(), 3) == [list(range(120))] * 3
    shuffled = route(ArrowShufflePartitioner(seed=3), 4)
    assert sorted(v for c in shuffled for v in c) == list(range(120)) and all(
        c == sorted(c) for c in shuffled
    )
    assert min(len(c) for c in shuffled) > 10
    assert shuffled == route(ArrowShufflePartitioner(seed=3), 4)  # seeded: reproducible


def test_columnar_partitioners_never_carry_the_record_paths_timestamps() -> None:
    for partitioner in (ArrowForwardPartitioner(), ArrowKeyGroupPartitioner("k"), ArrowShufflePartitioner()):
        timed = partitioner.with_timestamps(True)
        assert type(timed) is type(partitioner) and not timed.timestamped and timed.columnar
        with pytest.raises(TypeError, match="never carries"):
            timed.partition_timestamped([], [], [])


def test_key_groups_spread_evenly_over_many_channels() -> None:
    """Beyond the per-channel take the batch is cut by one argsort: same routing, rows in order."""
    rng = np.random.default_rng(5)
    batch = pa.record_batch(
        {"k": pa.array(rng.integers(0, 10_000, 20_000)), "row": pa.array(np.arange(20_000))}
    )
    partitioner = keyed(ArrowKeyGroupPartitioner("k").for_target(256, True), 40)
    pieces = partitioner.split(batch)
    counts = Counter({c: p.num_rows for c, p in pieces})
    assert sum(counts.values()) == 20_000 and len(counts) == 40
    for channel, piece in pieces:
        groups = piece.column(KEY_GROUP_COLUMN).to_numpy()
        assert np.all(groups * 40 // 256 == channel)
        rows = piece.column("row").to_numpy()
        assert np.all(np.diff(rows) > 0)


# ---------------------------------------------------------------------- the job graph's batch edges


def never_built() -> StreamOperator:
    raise AssertionError("building the job graph builds no operator")


def batch_graph(partitioner: Any, *, source_columnar: bool, parallelisms: tuple[int, int] = (2, 2)) -> Any:
    """source -> sink, the source emitting batches (or records), on the given partitioner."""
    graph = StreamGraph()
    source = graph.add_node("src", never_built, is_source=True, parallelism=parallelisms[0])
    source.columnar = source_columnar
    source.assigns_timestamps = True  # a batch edge carries no timestamp column all the same
    sink = graph.add_node("sink", never_built, is_sink=True, keyed=True, parallelism=parallelisms[1])
    graph.add_edge(source, sink, partitioner)
    return create_job_graph(
        graph,
        job_name="j",
        default_parallelism=2,
        default_max_parallelism=0,
        chaining_enabled=True,
        config={},
    )


def test_a_batch_edge_without_a_partitioner_is_columnar_forward_and_chains_or_columnar_rebalance() -> None:
    chained = batch_graph(None, source_columnar=True)
    assert len(chained.vertices) == 1 and not chained.edges  # forward chains, as on the record path
    split = batch_graph(None, source_columnar=True, parallelisms=(1, 3))
    [edge] = split.edges
    assert type(edge.partitioner) is ArrowRebalancePartitioner and not edge.partitioner.timestamped
    assert edge.pattern is DistributionPattern.ALL_TO_ALL
    records = batch_graph(None, source_columnar=False, parallelisms=(1, 3))
    assert type(records.edges[0].partitioner) is RebalancePartitioner
    rescaled = batch_graph(ArrowRescalePartitioner(), source_columnar=True, parallelisms=(1, 3))
    assert rescaled.edges[0].pattern is DistributionPattern.POINTWISE


def test_a_keyed_batch_edge_gets_the_target_max_parallelism_and_ships_keys_into_a_keyed_operator() -> None:
    [edge] = batch_graph(ArrowKeyGroupPartitioner("k"), source_columnar=True, parallelisms=(2, 3)).edges
    partitioner = edge.partitioner
    assert isinstance(partitioner, ArrowKeyGroupPartitioner)
    assert partitioner.max_parallelism == 128 and partitioner.ship_keys and not partitioner.timestamped


def test_a_partitioner_of_the_other_path_is_an_invalid_program_naming_the_conversion() -> None:
    with pytest.raises(InvalidProgramError, match=r"emits Arrow record batches.*REBALANCE.*to_records\(\)"):
        batch_graph(RebalancePartitioner(), source_columnar=True)
    with pytest.raises(InvalidProgramError, match=r"emits Arrow record batches.*HASH.*to_records\(\)"):
        batch_graph(KeyGroupStreamPartitioner(lambda r: r), source_columnar=True)
    with pytest.raises(InvalidProgramError, match=r"emits records.*SHUFFLE.*to_batches\(\)"):
        batch_graph(ArrowShufflePartitioner(), source_columnar=False)
    with pytest.raises(
        InvalidProgramError, match="forward partitioning does not allow a change of parallelism"
    ):
        batch_graph(ArrowForwardPartitioner(), source_columnar=True, parallelisms=(1, 2))
