"""key_groups_of (the batch path's key groups) equals assign_to_key_group (the record path's)
element by element, for every type a key column can have: records and batches of one key must
land on the same subtask, and a checkpoint's key groups must mean the same thing either way."""

from __future__ import annotations

import datetime
import decimal
import math
import struct
import zlib
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chandy.state.arrow_keys import _crc32s, hashes_of, key_groups_of
from chandy.state.key_groups import assign_to_key_group, stable_hash

MAX_PARALLELISMS = st.sampled_from([1, 2, 7, 128, 1000, 4096, 32768])

INT_RANGES = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
    pa.uint8(): (0, 2**8 - 1),
    pa.uint16(): (0, 2**16 - 1),
    pa.uint32(): (0, 2**32 - 1),
    pa.uint64(): (0, 2**64 - 1),
}


def expected(values: list[Any], max_parallelism: int) -> list[int]:
    return [assign_to_key_group(v, max_parallelism) for v in values]


def assert_same(column: Any, values: list[Any], max_parallelism: int) -> None:
    groups = key_groups_of(column, max_parallelism)
    assert groups.dtype == np.int32
    assert groups.tolist() == expected(values, max_parallelism)


def nullable(elements: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(st.one_of(elements, st.none()) | elements, max_size=40)


@st.composite
def typed_ints(draw: st.DrawFn) -> tuple[pa.DataType, list[int | None]]:
    kind = draw(st.sampled_from(list(INT_RANGES)))
    low, high = INT_RANGES[kind]
    # The extremes (and 2**63 for uint64, the first value outside Java's long) often.
    edges = st.sampled_from(sorted({low, high, 0, min(high, 2**63 - 1), min(high, 2**63), max(low, -1)}))
    return kind, draw(nullable(st.integers(low, high) | edges))


@settings(max_examples=300, deadline=None)
@given(typed_ints(), MAX_PARALLELISMS)
def test_ints_of_every_width(typed: tuple[pa.DataType, list[int | None]], max_parallelism: int) -> None:
    kind, values = typed
    assert_same(pa.array(values, type=kind), values, max_parallelism)


@settings(max_examples=150, deadline=None)
@given(typed_ints(), MAX_PARALLELISMS)
def test_numpy_ints(typed: tuple[pa.DataType, list[int | None]], max_parallelism: int) -> None:
    kind, values = typed
    present = [v for v in values if v is not None]
    assert_same(np.array(present, dtype=kind.to_pandas_dtype()), present, max_parallelism)


def test_uint64_above_the_java_long_range_is_hashed_like_a_python_int() -> None:
    values = [2**63, 2**64 - 1, 2**63 + 12345, 5]
    for max_parallelism in (128, 32768):
        assert_same(pa.array(values, type=pa.uint64()), values, max_parallelism)
        assert_same(np.array(values, dtype=np.uint64), values, max_parallelism)


@settings(max_examples=100, deadline=None)
@given(nullable(st.booleans()), MAX_PARALLELISMS)
def test_bools(values: list[bool | None], max_parallelism: int) -> None:
    assert_same(pa.array(values, type=pa.bool_()), values, max_parallelism)
    present = [v for v in values if v is not None]
    assert_same(np.array(present, dtype=bool), present, max_parallelism)


FLOATS = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(2**70), 2**70).map(float)
    | st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 0.5, -1.5, 2.0**63, -(2.0**63), 1e300])
)


def nan_with_payload(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return value


@settings(max_examples=300, deadline=None)
@given(nullable(FLOATS), MAX_PARALLELISMS)
def test_floats(values: list[float | None], max_parallelism: int) -> None:
    assert_same(pa.array(values, type=pa.float64()), values, max_parallelism)
    present = [v for v in values if v is not None]
    assert_same(np.array(present, dtype=np.float64), present, max_parallelism)


def test_nans_with_different_bits_keep_their_own_hash() -> None:
    """The record path hashes a NaN by its bits; Arrow's dictionary encoding treats every NaN
    as one value, so hashing per distinct value must go by bits, not by float equality."""
    values = [math.nan, nan_with_payload(0x7FF8000000000001), nan_with_payload(0xFFF8000000000000), -0.0, 0.0]
    assert len({stable_hash(v) for v in values[:3]}) == 3
    for max_parallelism in (128, 32768):
        assert_same(pa.array(values, type=pa.float64()), values, max_parallelism)
        assert_same(np.array(values), values, max_parallelism)


@settings(max_examples=100, deadline=None)
@given(nullable(st.floats(width=32, allow_nan=False)), MAX_PARALLELISMS)
def test_float32(values: list[float | None], max_parallelism: int) -> None:
    assert_same(pa.array(values, type=pa.float32()), values, max_parallelism)


# Arrow strings are UTF-8: a lone surrogate cannot be stored (pa.array raises), so the
# batch path never sees one; every other code point is generated.
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)


@settings(max_examples=200, deadline=None)
@given(nullable(TEXT), MAX_PARALLELISMS)
def test_strings(values: list[str | None], max_parallelism: int) -> None:
    assert_same(pa.array(values, type=pa.string()), values, max_parallelism)
    assert_same(pa.array(values, type=pa.large_string()), values, max_parallelism)
    assert_same(pa.array(values, type=pa.string_view()), values, max_parallelism)
    present = [v for v in values if v is not None]
    assert_same(np.array(present, dtype=object), present, max_parallelism)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40) | st.none(), max_size=30), st.integers(0, 5))
def test_vectorised_crc32_equals_zlib(values: list[bytes | None], cut: int) -> None:
    array = pa.array(values, type=pa.large_binary())
    crcs = _crc32s(array, always=True)
    assert crcs is not None
    assert crcs.tolist() == [zlib.crc32(v or b"") for v in values]
    sliced = array.slice(min(cut, len(values)))  # an offset into the buffers
    assert _crc32s(sliced, always=True).tolist() == [zlib.crc32(v or b"") for v in values[cut:]]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "kind", [pa.string(), pa.large_string(), pa.string_view(), pa.binary(), pa.large_binary()]
)
def test_many_distinct_strings_and_bytes_take_the_vectorised_hash(kind: pa.DataType) -> None:
    """Enough distinct values for the vectorised CRC-32 (thousands of short keys, as real
    key columns hold), with unicode, empty values, nulls and a dictionary-encoded copy."""
    rng = np.random.default_rng(3)
    alphabet = ["a", "Z", "0", "é", "ß", "€", "😀", "-", " "]
    texts = ["".join(rng.choice(alphabet, size=rng.integers(0, 14))) for _ in range(4000)]
    values: list[Any] = [None if i % 97 == 0 else t for i, t in enumerate(texts)]
    if (
        not pa.types.is_string(kind)
        and not pa.types.is_large_string(kind)
        and not pa.types.is_string_view(kind)
    ):
        values = [None if v is None else v.encode() for v in values]
    distinct = pa.array(values, type=kind)
    assert _crc32s(distinct.cast(pa.large_binary())) is not None  # the cost model picks it
    rows = pa.array([values[i] for i in rng.integers(0, len(values), 20000)], type=kind)
    for max_parallelism in (128, 32768):
        assert_same(rows, rows.to_pylist(), max_parallelism)
        assert_same(rows.dictionary_encode(), rows.to_pylist(), max_parallelism)


def test_a_lone_surrogate_cannot_be_an_arrow_string() -> None:
    with pytest.raises((pa.ArrowException, UnicodeEncodeError)):
        pa.array(["\ud800"])


@settings(max_examples=150, deadline=None)
@given(nullable(st.binary(max_size=12)), MAX_PARALLELISMS)
def test_bytes(values: list[bytes | None], max_parallelism: int) -> None:
    assert_same(pa.array(values, type=pa.binary()), values, max_parallelism)
    assert_same(pa.array(values, type=pa.large_binary()), values, max_parallelism)
    fixed = [None if v is None else v.ljust(12, b"\0") for v in values]
    assert_same(pa.array(fixed, type=pa.binary(12)), fixed, max_parallelism)


@settings(max_examples=100, deadline=None)
@given(nullable(st.dates()), nullable(st.datetimes().map(lambda d: d.replace(fold=0))), MAX_PARALLELISMS)
def test_dates_and_timestamps(
    dates: list[datetime.date | None], stamps: list[datetime.datetime | None], max_parallelism: int
) -> None:
    """Where Arrow gives back the same Python values: dates, naive microsecond timestamps (not
    ``fold=1``, which Arrow does not keep and stable_hash's repr sees)."""
    assert_same(pa.array(dates, type=pa.date32()), dates, max_parallelism)
    assert_same(pa.array(stamps, type=pa.timestamp("us")), stamps, max_parallelism)


@settings(max_examples=100, deadline=None)
@given(
    nullable(st.decimals(min_value=-(10**6), max_value=10**6, places=3, allow_nan=False)), MAX_PARALLELISMS
)
def test_decimals(values: list[decimal.Decimal | None], max_parallelism: int) -> None:
    array = pa.array(values, type=pa.decimal128(12, 3))
    assert_same(array, array.to_pylist(), max_parallelism)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(TEXT, min_size=1, max_size=8),
    st.lists(st.integers(0, 20) | st.none(), max_size=40),
    MAX_PARALLELISMS,
)
def test_dictionary_arrays(dictionary: list[str], picks: list[int | None], max_parallelism: int) -> None:
    indices = [None if p is None else p % len(dictionary) for p in picks]
    array = pa.DictionaryArray.from_arrays(pa.array(indices, type=pa.int32()), pa.array(dictionary))
    assert_same(array, array.to_pylist(), max_parallelism)
    ints = pa.DictionaryArray.from_arrays(
        pa.array(indices, type=pa.int8()), pa.array([i * 7919 - 40 for i in range(len(dictionary))])
    )
    assert_same(ints, ints.to_pylist(), max_parallelism)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(nullable(st.integers(-(2**63), 2**63 - 1)), max_size=4),
    st.lists(nullable(TEXT), max_size=4),
    MAX_PARALLELISMS,
)
def test_chunked_arrays(
    int_chunks: list[list[int | None]], text_chunks: list[list[str | None]], max_parallelism: int
) -> None:
    ints = pa.chunked_array(int_chunks, type=pa.int64())
    assert_same(ints, ints.to_pylist(), max_parallelism)
    texts = pa.chunked_array(text_chunks, type=pa.string())
    assert_same(texts, texts.to_pylist(), max_parallelism)


@pytest.mark.parametrize(
    "array",
    [
        pa.array([None, None, None]),  # Arrow's null type
        pa.array([], type=pa.int64()),
        pa.array([], type=pa.string()),
        pa.array([None, None], type=pa.string()),
        pa.array([None, None], type=pa.int32()),
        pa.chunked_array([], type=pa.float64()),
    ],
    ids=["null-type", "empty-int", "empty-string", "all-null-string", "all-null-int", "empty-chunked"],
)
def test_empty_and_all_null_columns(array: Any) -> None:
    assert_same(array, array.to_pylist(), 128)


def test_hashes_of_equals_stable_hash() -> None:
    values = [0, -1, 2**63 - 1, -(2**63), None, 42]
    assert hashes_of(pa.array(values)).tolist() == [stable_hash(v) for v in values]
    assert hashes_of(pa.array(["a", None, "é"])).tolist() == [stable_hash(v) for v in ["a", None, "é"]]


def test_max_parallelism_outside_the_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        key_groups_of(pa.array([1]), 0)
    with pytest.raises(ValueError, match="outside"):
        key_groups_of(pa.array([1]), 32769)
