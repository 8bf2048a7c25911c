"""Key-group arithmetic (Flink's KeyGroupRangeAssignment) and the stable hash."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import itertools
import random
import subprocess
import sys
import uuid

import pytest

from chandy.state.key_groups import (
    KeyGroupAssigner,
    KeyGroupRange,
    assign_key_to_parallel_operator,
    assign_to_key_group,
    compute_default_max_parallelism,
    compute_operator_index_for_key_group,
    stable_hash,
)

PAIRS = [(1, 1), (13, 1), (13, 2), (32767, 1), (32767, 13), (32767, 32767)]


def _random_pairs(n: int) -> list[tuple[int, int]]:
    rng = random.Random(51)
    pairs = []
    for _ in range(n):
        max_p = rng.randint(1, 32768)
        pairs.append((max_p, rng.randint(1, max_p)))
    return pairs


@pytest.mark.parametrize(("max_p", "p"), PAIRS + _random_pairs(200))
def test_every_key_group_falls_in_the_range_of_its_operator(max_p: int, p: int) -> None:
    ranges = [KeyGroupRange.of_operator(max_p, p, i) for i in range(p)]
    # Ranges are contiguous, disjoint and cover [0, max_p).
    assert ranges[0].start == 0
    assert ranges[-1].end == max_p - 1
    for left, right in itertools.pairwise(ranges):
        assert right.start == left.end + 1
    probe = range(max_p) if max_p <= 2048 else random.Random(max_p).sample(range(max_p), 2048)
    for kg in probe:
        operator = compute_operator_index_for_key_group(max_p, p, kg)
        assert kg in ranges[operator]


def test_default_max_parallelism_is_flinks() -> None:
    assert compute_default_max_parallelism(1) == 128
    assert compute_default_max_parallelism(2) == 128
    assert compute_default_max_parallelism(100) == 256  # 150 -> 256
    assert compute_default_max_parallelism(1000) == 2048  # 1500 -> 2048
    assert compute_default_max_parallelism(30000) == 32768  # capped


def test_key_group_range_rejects_bad_parallelism() -> None:
    with pytest.raises(ValueError, match="parallelism"):
        KeyGroupRange.of_operator(4, 5, 0)
    with pytest.raises(ValueError, match="max parallelism"):
        KeyGroupRange.of_operator(40000, 1, 0)


def test_stable_hash_is_the_same_in_another_process() -> None:
    """Python's hash() is salted per process; the key group must not be."""
    keys = ["word", "über", 42, -7, 2**70, 3.5, None, True, b"raw", ("a", 1, (2.0, None))]
    here = [assign_to_key_group(k, 128) for k in keys]
    code = (
        f"from chandy.state.key_groups import assign_to_key_group as a;print([a(k, 128) for k in {keys!r}])"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        assert out.strip() == repr(here)


def test_equal_keys_of_different_types_share_a_key_group() -> None:
    assert stable_hash(1) == stable_hash(1.0) == stable_hash(True)
    assert stable_hash(decimal.Decimal("2.0")) == stable_hash(2)


def test_supported_key_types_hash() -> None:
    class Color(enum.Enum):
        RED = "red"

    @dataclasses.dataclass(frozen=True)
    class Point:
        x: int
        y: int

    for key in [
        Color.RED,
        Point(1, 2),
        frozenset({1, 2}),
        datetime.date(2024, 1, 1),
        datetime.datetime(2024, 1, 1, 12),
        uuid.UUID(int=5),
        decimal.Decimal("1.5"),
    ]:
        assert 0 <= assign_to_key_group(key, 128) < 128
    assert stable_hash(frozenset({1, 2})) == stable_hash(frozenset({2, 1}))


def test_unsupported_key_type_is_named_in_the_error() -> None:
    class Opaque:
        pass

    with pytest.raises(TypeError, match="key of type Opaque"):
        stable_hash(Opaque())


def test_unhashable_key_gets_a_clear_error() -> None:
    with pytest.raises(TypeError, match="not hashable.*tuple"):
        KeyGroupAssigner(128).key_group(["a", "list"])


def test_keys_spread_over_operators() -> None:
    counts = [0, 0, 0, 0]
    for i in range(10_000):
        counts[assign_key_to_parallel_operator(f"key-{i}", 128, 4)] += 1
    assert min(counts) > 2000  # roughly uniform


def test_assigner_cache_is_bounded_and_correct() -> None:
    assigner = KeyGroupAssigner(128, cache_size=100)
    for i in range(1000):
        assert assigner.key_group(i) == assign_to_key_group(i, 128)
        assert len(assigner.cache) <= 100
