"""Bytes for state keys and values: fast for the common types, data for typed state, pickle for the rest.

RocksDB keeps every key and value in this format, and typed state (a descriptor with
``Types``, :mod:`chandy.state.typed`) is written in it everywhere, without pickle.

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

Typed state (:mod:`chandy.state.typed`) writes these too, never 0x7f unless its type says
``PICKLED_BYTE_ARRAY`` somewhere inside, and the values no tag above holds as data:

    0x11 int outside [-2**63, 2**63): varint length, signed big-endian bytes
    0x42 list: varint count, items
    0x43 dict: varint count, key and value of each entry
    0x50 Row: kind (1 byte, RowKind's value), 0x00 or 0x01 and varint count and a str per
         field name, then varint count and the values
    0x60 decimal.Decimal: str | 0x61 datetime.date: str (ISO) | 0x62 datetime.time: str
    0x63 datetime.datetime: str (ISO, with its UTC offset if it has one)
    0x64 Instant: the seconds and the nanoseconds, each an encoded int

A pickle is read with the ``loads`` the caller gives: plain ``pickle.loads`` for what
this process wrote itself, the restricted unpickler (:mod:`chandy.state.unpickling`) for
bytes that came from a snapshot.
"""

from __future__ import annotations

import datetime
import decimal
import io
import pickle
import struct
from collections.abc import Callable
from typing import Any

from chandy.core.types import Instant, RowKind, _create_row
from chandy.state.missing_classes import class_error_of
from chandy.state.unpicklable import unpicklable_state_error
from chandy.state.unpickling import UNRESTRICTED

_NONE, _FALSE, _TRUE = b"\x00", b"\x01", b"\x02"
_INT, _FLOAT, _STR, _BYTES, _TUPLE, _PICKLE = 0x10, 0x20, 0x30, 0x31, 0x40, 0x7F
_INT_TAG, _FLOAT_TAG, _STR_TAG = b"\x10", b"\x20", b"\x30"
_BYTES_TAG, _TUPLE_TAG, _PICKLE_TAG = b"\x31", b"\x40", b"\x7f"
_FROZENSET, _FROZENSET_TAG = 0x41, b"\x41"
_BIG_INT, _LIST, _DICT, _ROW = 0x11, 0x42, 0x43, 0x50
_DECIMAL, _DATE, _TIME, _DATETIME, _INSTANT = 0x60, 0x61, 0x62, 0x63, 0x64
#: Tag bytes of the typed encoding (see :mod:`chandy.state.typed`).
BIG_INT_TAG, LIST_TAG, DICT_TAG, ROW_TAG = b"\x11", b"\x42", b"\x43", b"\x50"
DECIMAL_TAG, DATE_TAG, TIME_TAG, DATETIME_TAG, INSTANT_TAG = b"\x60", b"\x61", b"\x62", b"\x63", b"\x64"
_ROW_KINDS = {kind.value: kind for kind in RowKind}
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


def varint(n: int) -> bytes:
    """A count or length (``n`` >= 0) as the format writes it."""
    return _varint(n)


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
    if t is int and -_OFFSET <= key < _OFFSET:  # the commonest key, without a call
        return _INT_TAG + int.to_bytes(key + _OFFSET, 8, "big")
    if t in _KEY_ATOMS:
        return encode(key)
    if t is tuple:
        return _TUPLE_TAG + _varint(len(key)) + b"".join([encode_key(v) for v in key])
    if t is frozenset:  # its elements in the order of their bytes, not of their hashes
        return _FROZENSET_TAG + _varint(len(key)) + b"".join(sorted(encode_key(v) for v in key))
    pickled = _canonical_pickle(key)
    return _PICKLE_TAG + _varint(len(pickled)) + pickled


def plain_loads(pickled: bytes) -> Any:
    """``pickle.loads`` for bytes this process wrote; a class it needs that is gone is a
    :class:`~chandy.state.missing_classes.StateClassNotFoundError` naming the state."""
    try:
        return pickle.loads(pickled)
    except (ImportError, AttributeError) as exc:
        error = class_error_of(pickled, policy=UNRESTRICTED)  # a class the state holds is gone
        if error is None:
            raise
        raise error from exc


Loads = Callable[[bytes], Any]


def decode_from(data: bytes, pos: int = 0, loads: Loads = plain_loads) -> tuple[Any, int]:
    """The value encoded at ``data[pos:]`` and the position after it; a pickle in it is
    read with ``loads``."""
    tag = data[pos]
    if tag == _INT:
        return int.from_bytes(data[pos + 1 : pos + 9], "big") - _OFFSET, pos + 9
    if tag == _STR:
        n, start = _read_varint(data, pos + 1)
        return data[start : start + n].decode("utf-8", "surrogatepass"), start + n
    if tag == _TUPLE:
        items, pos = _decode_items(data, pos + 1, loads)
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
        items, pos = _decode_items(data, pos + 1, loads)
        return frozenset(items), pos
    if tag == _PICKLE:
        n, start = _read_varint(data, pos + 1)
        return loads(data[start : start + n]), start + n
    if tag == _LIST:
        return _decode_items(data, pos + 1, loads)
    if tag == _DICT:
        return _decode_dict(data, pos + 1, loads)
    return _decode_typed(tag, data, pos, loads)


def _decode_typed(tag: int, data: bytes, pos: int, loads: Loads) -> tuple[Any, int]:
    """The rarer values of the typed encoding (see the module docstring)."""
    if tag == _ROW:
        kind = _ROW_KINDS[data[pos + 1]]
        names: list[str] | None = None
        pos += 3
        if data[pos - 1] == 1:
            raw, pos = _decode_items(data, pos, loads)
            names = [name for name in raw if type(name) is str]
            if len(names) != len(raw):
                raise ValueError("corrupt state bytes: a row's field name that is not a string")
        values, pos = _decode_items(data, pos, loads)
        return _create_row(names, values, kind), pos
    if tag == _BIG_INT:
        n, start = _read_varint(data, pos + 1)
        return int.from_bytes(data[start : start + n], "big", signed=True), start + n
    if tag in _FROM_TEXT:
        n, start = _read_varint(data, pos + 1)
        return _FROM_TEXT[tag](data[start : start + n].decode("ascii")), start + n
    if tag == _INSTANT:
        seconds, pos = decode_from(data, pos + 1, loads)
        nanos, pos = decode_from(data, pos, loads)
        if type(seconds) is not int or type(nanos) is not int:
            raise ValueError("corrupt state bytes: an instant whose parts are not integers")
        return Instant(seconds, nanos), pos
    raise ValueError(f"corrupt state bytes: unknown tag 0x{tag:02x} at offset {pos}")


_FROM_TEXT: dict[int, Callable[[str], Any]] = {
    _DECIMAL: decimal.Decimal,
    _DATE: datetime.date.fromisoformat,
    _TIME: datetime.time.fromisoformat,
    _DATETIME: datetime.datetime.fromisoformat,
}


def _decode_items(data: bytes, pos: int, loads: Loads = plain_loads) -> tuple[list[Any], int]:
    """A varint count at ``data[pos:]`` and that many encoded values after it."""
    count, pos = _read_varint(data, pos)
    items = []
    for _ in range(count):
        item, pos = decode_from(data, pos, loads)
        items.append(item)
    return items, pos


def _decode_dict(data: bytes, pos: int, loads: Loads) -> tuple[dict[Any, Any], int]:
    count, pos = _read_varint(data, pos)
    entries: dict[Any, Any] = {}
    for _ in range(count):
        key, pos = decode_from(data, pos, loads)
        entries[key], pos = decode_from(data, pos, loads)
    return entries, pos


def decode(data: bytes, loads: Loads = plain_loads) -> Any:
    """The value ``data`` holds (exactly one encoded value)."""
    if data[0] == _INT and len(data) == 9:  # the commonest value (counts, sums) without a call
        return int.from_bytes(data[1:], "big") - _OFFSET
    value, end = decode_from(data, 0, loads)
    if end != len(data):
        raise ValueError(f"corrupt state bytes: {len(data) - end} bytes after the value")
    return value
