"""Bytes for keys and values in RocksDB: fast for the common types, pickle for the rest.

Why not pickle everything: a state access on RocksDB encodes its key every time,
and the common keys (ints, strings, tuples of them) encode faster by hand. And
why self-delimiting: a map state's entry key is the encoded state key followed by
the encoded map key, so a prefix scan over one state key must never pick up the
entries of another key whose encoding happens to start with the same bytes. Every
encoding here says where it ends (a fixed width or a length), which rules that out.

Equal keys must encode to equal bytes (RocksDB finds an entry by its bytes): keys go
through :func:`encode_key`, which pickles what it cannot encode by hand canonically
(no memo) and encodes a frozenset's elements in a fixed order (a set's own order
follows string hashes, which change from process to process), so named tuples,
``Row``s, dataclasses and frozensets key state as the heap does. A key object whose
pickle depends on more than its value (a set inside a dataclass, a custom
``__reduce__``) is beyond it: key state by tuples of plain values for that. ``1`` and
``True`` and ``1.0`` encode differently although Python finds them equal; state keyed
by a mix of them is keyed by type too. Values go through :func:`encode`, plain pickle for the rest (shared
references and cycles kept).

Format: one tag byte, then::

    0x00 None | 0x01 False | 0x02 True
    0x10 int in [-2**63, 2**63): 8 bytes big-endian of value + 2**63 (ordered)
    0x20 float: 8 bytes IEEE 754 big-endian
    0x30 str: varint length, UTF-8 bytes | 0x31 bytes: varint length, bytes
    0x40 tuple: varint count, items
    0x41 frozenset (keys only): varint count, items in the order of their bytes
    0x7f anything else: varint length, pickle (highest protocol)
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any

from chandy.state.missing_classes import class_error_of
from chandy.state.unpicklable import unpicklable_state_error

_NONE, _FALSE, _TRUE = b"\x00", b"\x01", b"\x02"
_INT, _FLOAT, _STR, _BYTES, _TUPLE, _PICKLE = 0x10, 0x20, 0x30, 0x31, 0x40, 0x7F
_INT_TAG, _FLOAT_TAG, _STR_TAG = b"\x10", b"\x20", b"\x30"
_BYTES_TAG, _TUPLE_TAG, _PICKLE_TAG = b"\x31", b"\x40", b"\x7f"
_FROZENSET, _FROZENSET_TAG = 0x41, b"\x41"
_OFFSET = 1 << 63
_DOUBLE = struct.Struct(">d")
_UNPACK_DOUBLE = _DOUBLE.unpack_from


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    result = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def encode(value: Any) -> bytes:
    """The bytes of ``value`` (self-delimiting; equal values of one type give equal bytes)."""
    t = type(value)
    if t is int:
        if -_OFFSET <= value < _OFFSET:
            return _INT_TAG + int.to_bytes(value + _OFFSET, 8, "big")
    elif t is str:
        data: bytes = value.encode("utf-8", "surrogatepass")
        return _STR_TAG + _varint(len(data)) + data
    elif t is tuple:
        return _TUPLE_TAG + _varint(len(value)) + b"".join([encode(v) for v in value])
    elif value is None:
        return _NONE
    elif t is float:
        return _FLOAT_TAG + _DOUBLE.pack(value)
    elif t is bytes:
        raw: bytes = value
        return _BYTES_TAG + _varint(len(raw)) + raw
    elif t is bool:
        return _TRUE if value else _FALSE
    try:
        pickled = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise unpicklable_state_error(None, value, exc) from exc
    return _PICKLE_TAG + _varint(len(pickled)) + pickled


_KEY_ATOMS = frozenset({int, str, bytes, float, bool, type(None)})


def _canonical_pickle(value: Any) -> bytes:
    """Pickle without memo: pickle's back-references follow which objects happen to be
    shared, so ``K(s, s)`` and an equal ``K(s, copy_of_s)`` pickled differently."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.fast = True  # no memo
    pickler.dump(value)
    return buffer.getvalue()


def encode_key(key: Any) -> bytes:
    """The bytes of a state key, a namespace or a map key: as :func:`encode`, except that a
    key pickle would encode is pickled canonically, so that equal keys always give equal
    bytes (RocksDB finds an entry by its bytes: a second encoding of an equal key would
    hold a second, separate state)."""
    t = type(key)
    if t in _KEY_ATOMS:
        return encode(key)
    if t is tuple:
        return _TUPLE_TAG + _varint(len(key)) + b"".join([encode_key(v) for v in key])
    if t is frozenset:  # its elements in the order of their bytes, not of their hashes
        return _FROZENSET_TAG + _varint(len(key)) + b"".join(sorted(encode_key(v) for v in key))
    pickled = _canonical_pickle(key)
    return _PICKLE_TAG + _varint(len(pickled)) + pickled


def decode_from(data: bytes, pos: int = 0) -> tuple[Any, int]:
    """The value encoded at ``data[pos:]`` and the position after it."""
    tag = data[pos]
    if tag == _INT:
        return int.from_bytes(data[pos + 1 : pos + 9], "big") - _OFFSET, pos + 9
    if tag == _STR:
        n, start = _read_varint(data, pos + 1)
        return data[start : start + n].decode("utf-8", "surrogatepass"), start + n
    if tag == _TUPLE:
        items, pos = _decode_items(data, pos + 1)
        return tuple(items), pos
    if tag == 0x00:
        return None, pos + 1
    if tag == 0x01:
        return False, pos + 1
    if tag == 0x02:
        return True, pos + 1
    if tag == _FLOAT:
        return _UNPACK_DOUBLE(data, pos + 1)[0], pos + 9
    if tag == _BYTES:
        n, start = _read_varint(data, pos + 1)
        return data[start : start + n], start + n
    if tag == _FROZENSET:
        items, pos = _decode_items(data, pos + 1)
        return frozenset(items), pos
    if tag == _PICKLE:
        n, start = _read_varint(data, pos + 1)
        pickled = data[start : start + n]
        try:
            return pickle.loads(pickled), start + n
        except (ImportError, AttributeError) as exc:
            error = class_error_of(pickled)  # a class the restored state holds is gone
            if error is None:
                raise
            raise error from exc
    raise ValueError(f"corrupt state bytes: unknown tag 0x{tag:02x} at offset {pos}")


def _decode_items(data: bytes, pos: int) -> tuple[list[Any], int]:
    """A varint count at ``data[pos:]`` and that many encoded values after it."""
    count, pos = _read_varint(data, pos)
    items = []
    for _ in range(count):
        item, pos = decode_from(data, pos)
        items.append(item)
    return items, pos


def decode(data: bytes) -> Any:
    """The value ``data`` holds (exactly one encoded value)."""
    if data[0] == _INT and len(data) == 9:  # the commonest value (counts, sums) without a call
        return int.from_bytes(data[1:], "big") - _OFFSET
    value, end = decode_from(data, 0)
    if end != len(data):
        raise ValueError(f"corrupt state bytes: {len(data) - end} bytes after the value")
    return value
