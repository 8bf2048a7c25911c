"""Typed state: a state whose descriptor declares PyFlink ``Types`` is written as data, not pickled.

Flink writes every state with the ``TypeSerializer`` of its declared type, and records the
serializer in the snapshot so that a restore knows how it was written and can tell whether
the type the job declares now is compatible (Flink's state schema compatibility). chandy
does the same for every descriptor that declares a type
(``ValueStateDescriptor("count", Types.LONG())``, ``ListStateDescriptor("names",
Types.STRING())``, ``MapStateDescriptor("prices", Types.STRING(), Types.DOUBLE())``, ROW,
TUPLE, LIST, MAP, arrays, dates and times): its values are written in the data encoding of
:mod:`chandy.state.codec` (numbers, strings, bytes, tuples, lists, dicts, rows, decimals,
dates and times, each tagged with what it is) and read back without pickle. A state
without a type, or declared ``Types.PICKLED_BYTE_ARRAY()``, stays pickled (and is read
back through the restricted unpickler, :mod:`chandy.state.unpickling`).

Why a tagged encoding rather than Flink's untagged bytes: the tags are the ones RocksDB
already wrote for plain values, so a state that gains ``Types`` reads what it held before
without a migration, and a value keeps the Python type it was stored with (a tuple stays a
tuple, a ``Row`` a ``Row``). The declared type decides what is *accepted*: a value that does
not fit it (a string in a ``Types.LONG()`` state) is a :class:`StateValueTypeError` when it
is written (at a checkpoint on the heap, when the cache writes it on RocksDB), never a
silent pickle.

A type is recorded as its :func:`type_spec` (JSON text, PyFlink's names); a restore
compares the recorded type with the declared one (:func:`compatible`). The integer types
(BYTE, SHORT, INT, LONG, BIG_INT) are one family, FLOAT and DOUBLE another, STRING and CHAR
a third, and every array type is a list: within a family the bytes are the same, so a
state may move between its members; anything else (LONG to STRING, a tuple of two fields
to three) fails the restore once with an error naming the state and both types.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Callable
from typing import Any

from chandy.core.state import MapStateDescriptor, StateDescriptor
from chandy.core.types import (
    BasicArrayTypeInfo,
    BasicType,
    BasicTypeInfo,
    DateTypeInfo,
    ExternalTypeInfo,
    Instant,
    InstantTypeInfo,
    ListTypeInfo,
    LocalTimeTypeInfo,
    MapTypeInfo,
    ObjectArrayTypeInfo,
    PickledBytesTypeInfo,
    PrimitiveArrayTypeInfo,
    Row,
    RowTypeInfo,
    TimestampTypeInfo,
    TimeTypeInfo,
    TupleTypeInfo,
    TypeInformation,
    Types,
)
from chandy.errors import UnrecoverableError
from chandy.state.codec import (
    DATE_TAG,
    DATETIME_TAG,
    DECIMAL_TAG,
    DICT_TAG,
    INSTANT_TAG,
    LIST_TAG,
    ROW_TAG,
    TIME_TAG,
    encode,
    encode_key,
    varint,
)

_NONE = b"\x00"
_TUPLE_TAG = b"\x40"
_INT_TAG = b"\x10"
_OFFSET = 1 << 63

#: A value's encoder: its bytes, or a :class:`_Mismatch`.
Encoder = Callable[[Any], bytes]


class StateValueTypeError(UnrecoverableError, TypeError):
    """A value of a typed state does not fit the state's declared type. The same value
    meets the same type after a restart, so the job fails once, naming the state, the
    declared type and the value's type."""

    #: The state's name.
    state: str = ""


class _Mismatch(Exception):
    """Raised inside an encoder: ``value`` does not fit ``expected``."""

    def __init__(self, value: Any, expected: TypeInformation) -> None:
        super().__init__()
        self.value = value
        self.expected = expected


# ------------------------------------------------------------------ declared types


def declared_type(descriptor: StateDescriptor) -> TypeInformation | None:
    """The type ``descriptor`` declares for its values (a map state: a ``MapTypeInfo`` of its
    key and value types), or ``None`` if the state is pickled: no type, a type that is not
    ``TypeInformation``, or ``PICKLED_BYTE_ARRAY`` (a map state: for its key or its value)."""
    info = descriptor.type_info
    if isinstance(descriptor, MapStateDescriptor) and isinstance(info, tuple):
        key, value = (_typed(part) for part in info)
        return MapTypeInfo(key, value) if key is not None and value is not None else None
    return _typed(info)


def _typed(info: Any) -> TypeInformation | None:
    while isinstance(info, ExternalTypeInfo):
        info = info._type_info
    if not isinstance(info, TypeInformation) or isinstance(info, PickledBytesTypeInfo):
        return None
    return info


def describe(type_info: TypeInformation) -> str:
    """How PyFlink prints ``type_info`` (``Long``, ``MapTypeInfo<String, Double>``)."""
    return repr(type_info)


_ELEMENT_SPECS: dict[type, str] = {
    ListTypeInfo: "List",
    PrimitiveArrayTypeInfo: "PrimitiveArray",
    BasicArrayTypeInfo: "BasicArray",
    ObjectArrayTypeInfo: "ObjectArray",
}
_LOCAL_SPECS = {
    LocalTimeTypeInfo.TimeType.LOCAL_DATE: "LocalDate",
    LocalTimeTypeInfo.TimeType.LOCAL_TIME: "LocalTime",
    LocalTimeTypeInfo.TimeType.LOCAL_DATE_TIME: "LocalDateTime",
}
_PLAIN_SPECS: dict[type, str] = {
    DateTypeInfo: "Date",
    TimeTypeInfo: "Time",
    TimestampTypeInfo: "Timestamp",
    PickledBytesTypeInfo: "Pickled",
}


def _spec(info: TypeInformation) -> Any:
    """``info`` as JSON data (:func:`type_spec`)."""
    while isinstance(info, ExternalTypeInfo):
        info = info._type_info
    if isinstance(info, BasicTypeInfo):
        return info._basic_type.value
    if isinstance(info, LocalTimeTypeInfo):
        return _LOCAL_SPECS[info._time_type]
    plain = _PLAIN_SPECS.get(type(info))
    if plain is not None:
        return plain
    element = _ELEMENT_SPECS.get(type(info))
    if element is not None:
        return [element, _spec(info._element_type)]  # type: ignore[attr-defined]
    if isinstance(info, MapTypeInfo):
        return ["Map", _spec(info._key_type_info), _spec(info._value_type_info)]
    if isinstance(info, TupleTypeInfo):
        return ["Tuple", [_spec(t) for t in info.get_field_types()]]
    if isinstance(info, RowTypeInfo):
        return ["Row", [_spec(t) for t in info.get_field_types()], info._field_names]
    return "Pickled"  # a TypeInformation of the user's own: its values are pickled


def type_spec(info: TypeInformation) -> str:
    """What a snapshot records of a declared type: JSON text, PyFlink's names
    (``"Long"``, ``["Map","String","Double"]``); :func:`type_of_spec` reads it back."""
    return json.dumps(_spec(info), separators=(",", ":"))


_BASIC_BY_NAME = {basic.value: basic for basic in BasicType}
_LOCAL_BY_NAME = {name: time_type for time_type, name in _LOCAL_SPECS.items()}
_PLAIN_BY_NAME: dict[str, Callable[[], TypeInformation]] = {
    "Date": DateTypeInfo,
    "Time": TimeTypeInfo,
    "Timestamp": TimestampTypeInfo,
    "Pickled": PickledBytesTypeInfo,
}
_ELEMENT_BY_NAME: dict[str, Callable[[TypeInformation], TypeInformation]] = {
    name: kind for kind, name in _ELEMENT_SPECS.items()
}


def _of_spec(spec: Any) -> TypeInformation:
    if isinstance(spec, str):
        if spec in _BASIC_BY_NAME:
            basic = _BASIC_BY_NAME[spec]
            return InstantTypeInfo(basic) if basic is BasicType.INSTANT else BasicTypeInfo(basic)
        if spec in _LOCAL_BY_NAME:
            return LocalTimeTypeInfo(_LOCAL_BY_NAME[spec])
        if spec in _PLAIN_BY_NAME:
            return _PLAIN_BY_NAME[spec]()
    elif isinstance(spec, list) and spec:
        head = spec[0]
        if head in _ELEMENT_BY_NAME and len(spec) == 2:
            return _ELEMENT_BY_NAME[head](_of_spec(spec[1]))
        if head == "Map" and len(spec) == 3:
            return MapTypeInfo(_of_spec(spec[1]), _of_spec(spec[2]))
        if head == "Tuple" and len(spec) == 2 and isinstance(spec[1], list):
            return TupleTypeInfo([_of_spec(t) for t in spec[1]])
        if head == "Row" and len(spec) == 3 and isinstance(spec[1], list):
            names = spec[2]
            if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
                raise ValueError(f"a row type's field names are not strings: {names!r}")
            return RowTypeInfo([_of_spec(t) for t in spec[1]], names)
    raise ValueError(f"{json.dumps(spec)[:200]} is not a type this version of chandy knows")


def type_of_spec(text: str) -> TypeInformation:
    """The type :func:`type_spec` recorded (a ``ValueError`` for text it did not write)."""
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"the recorded type {text[:200]!r} is not JSON") from exc
    try:
        return _of_spec(spec)
    except RecursionError as exc:
        raise ValueError("the recorded type is nested too deeply") from exc


# ------------------------------------------------------------------ compatibility


_FAMILIES = {
    BasicType.BYTE: "int",
    BasicType.SHORT: "int",
    BasicType.INT: "int",
    BasicType.LONG: "int",
    BasicType.BIG_INT: "int",
    BasicType.FLOAT: "float",
    BasicType.DOUBLE: "float",
    BasicType.STRING: "str",
    BasicType.CHAR: "str",
    BasicType.BOOLEAN: "bool",
    BasicType.BIG_DEC: "decimal",
    BasicType.INSTANT: "instant",
}
_LOCAL_FAMILIES = {
    LocalTimeTypeInfo.TimeType.LOCAL_DATE: "date",
    LocalTimeTypeInfo.TimeType.LOCAL_TIME: "time",
    LocalTimeTypeInfo.TimeType.LOCAL_DATE_TIME: "datetime",
}
_PLAIN_FAMILIES: dict[type, str] = {DateTypeInfo: "date", TimeTypeInfo: "time", TimestampTypeInfo: "datetime"}


def _shape(info: TypeInformation) -> Any:
    """What values of ``info`` look like once written: two types of one shape are compatible
    (``"pickled"`` matches any shape: it holds whatever was stored)."""
    info = _typed(info) or PickledBytesTypeInfo()
    if isinstance(info, PickledBytesTypeInfo):
        return "pickled"
    if isinstance(info, BasicTypeInfo):
        return _FAMILIES[info._basic_type]
    if isinstance(info, LocalTimeTypeInfo):
        return _LOCAL_FAMILIES[info._time_type]
    if type(info) in _PLAIN_FAMILIES:
        return _PLAIN_FAMILIES[type(info)]
    if type(info) in _ELEMENT_SPECS:
        return ("list", _shape(info._element_type))  # type: ignore[attr-defined]
    if isinstance(info, MapTypeInfo):
        return ("map", _shape(info._key_type_info), _shape(info._value_type_info))
    if isinstance(info, TupleTypeInfo):
        return ("tuple", tuple(_shape(t) for t in info.get_field_types()))
    if isinstance(info, RowTypeInfo):
        return ("row", tuple(_shape(t) for t in info.get_field_types()))
    return "pickled"


def _same_shape(written: Any, declared: Any) -> bool:
    if written == "pickled" or declared == "pickled":
        return True
    if isinstance(written, tuple) and isinstance(declared, tuple):
        if written[0] != declared[0] or len(written) != len(declared):
            return False
        if written[0] in ("tuple", "row"):
            return len(written[1]) == len(declared[1]) and all(
                _same_shape(w, d) for w, d in zip(written[1], declared[1], strict=True)
            )
        return all(_same_shape(w, d) for w, d in zip(written[1:], declared[1:], strict=True))
    return bool(written == declared)


def compatible(written: TypeInformation, declared: TypeInformation) -> bool:
    """Whether state written as ``written`` can be restored as ``declared`` (see the module
    docstring): the same shape of values, integer, float and string types each one family."""
    return _same_shape(_shape(written), _shape(declared))


# ------------------------------------------------------------------ encoders


def _encode_int(value: Any, expected: TypeInformation) -> bytes:
    if type(value) is int or type(value) is bool:
        return _int_bytes(value)
    if isinstance(value, int):  # an IntEnum, a NumPy integer's int subclass: its number
        return _int_bytes(int(value))
    raise _Mismatch(value, expected)


def _int_bytes(value: int) -> bytes:
    if -(1 << 63) <= value < 1 << 63 or type(value) is bool:
        return encode(value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
    return b"\x11" + varint(len(raw)) + raw


def _text(tag: bytes, text: str) -> bytes:
    raw = text.encode("ascii")
    return tag + varint(len(raw)) + raw


def _plain(kind: type, info: TypeInformation, otherwise: Encoder | None = None) -> Encoder:
    """Values of the Python type ``kind`` (a subclass's value as ``kind``: a NumPy float, a
    ``str`` enum), else ``otherwise`` (an int where a float is declared), else a mismatch."""

    def plain(value: Any) -> bytes:
        if type(value) is kind:
            return encode(value)
        if isinstance(value, kind):
            return encode(kind(value))
        if otherwise is None:
            raise _Mismatch(value, info)
        return otherwise(value)

    return plain


def _atom(info: BasicTypeInfo) -> Encoder:
    """The encoder of a basic type's values."""
    family = _FAMILIES[info._basic_type]

    def integer(value: Any) -> bytes:
        if type(value) is int and -_OFFSET <= value < _OFFSET:  # the common case, inline
            return _INT_TAG + (value + _OFFSET).to_bytes(8, "big")
        return _encode_int(value, info)

    if family == "int":
        return integer
    if family == "float":
        return _plain(float, info, integer)
    if family == "str":
        return _plain(str, info)
    if family == "bool":
        return _plain(bool, info)

    if family == "decimal":

        def big_decimal(value: Any) -> bytes:
            if isinstance(value, decimal.Decimal):
                return _text(DECIMAL_TAG, str(value))
            return integer(value)

        return big_decimal

    def instant(value: Any) -> bytes:
        if isinstance(value, Instant):
            return INSTANT_TAG + _int_bytes(int(value.seconds)) + _int_bytes(int(value.nanos))
        raise _Mismatch(value, info)

    return instant


def _temporal(family: str, info: TypeInformation) -> Encoder:
    """Dates, times and timestamps (a datetime stays a datetime where a date is declared)."""

    def temporal(value: Any) -> bytes:
        if isinstance(value, datetime.datetime):
            if family in ("date", "datetime"):
                return _text(DATETIME_TAG, value.isoformat())
        elif isinstance(value, datetime.date):
            if family == "date":
                return _text(DATE_TAG, value.isoformat())
        elif isinstance(value, datetime.time) and family == "time":
            return _text(TIME_TAG, value.isoformat())
        raise _Mismatch(value, info)

    return temporal


def _nullable(encoder: Encoder) -> Encoder:
    """``encoder``, with ``None`` (a null field or element) as itself."""

    def maybe(value: Any) -> bytes:
        return _NONE if value is None else encoder(value)

    return maybe


def _sequence(element: Encoder, info: TypeInformation, byte_elements: bool) -> Encoder:
    """Lists and arrays: a list or a tuple of elements (kept as it is); ``bytes`` too
    where the elements are integers (PyFlink's byte arrays)."""
    item = _nullable(element)

    def sequence(value: Any) -> bytes:
        if type(value) is list:
            return LIST_TAG + varint(len(value)) + b"".join([item(v) for v in value])
        if type(value) is tuple:
            return _TUPLE_TAG + varint(len(value)) + b"".join([item(v) for v in value])
        if byte_elements and isinstance(value, (bytes, bytearray)):
            return encode(bytes(value))
        if isinstance(value, (list, tuple)):
            return sequence(list(value) if isinstance(value, list) else tuple(value))
        raise _Mismatch(value, info)

    return sequence


def _mapping(key: Encoder, val: Encoder, info: TypeInformation) -> Encoder:
    item = _nullable(val)

    def mapping(value: Any) -> bytes:
        if not isinstance(value, dict):
            raise _Mismatch(value, info)
        parts = [DICT_TAG, varint(len(value))]
        for k, v in value.items():
            parts.append(key(k))
            parts.append(item(v))
        return b"".join(parts)

    return mapping


def _fields(fields: list[Encoder], info: TypeInformation, rows: bool) -> Encoder:
    """Tuples (and rows, when ``rows``): exactly one value per declared field, in order."""
    items = [_nullable(f) for f in fields]
    count = len(items)

    def write(values: Any) -> bytes:
        if len(values) != count:
            raise _Mismatch(values, info)
        return varint(count) + b"".join([f(v) for f, v in zip(items, values, strict=True)])

    def record(value: Any) -> bytes:
        if rows and isinstance(value, Row):
            names = value._fields
            head = ROW_TAG + bytes((value.get_row_kind().value,))
            head += b"\x00" if names is None else b"\x01" + varint(len(names)) + b"".join(map(encode, names))
            return head + write(value._values)
        if type(value) is tuple:
            return _TUPLE_TAG + write(value)
        if type(value) is list:
            return LIST_TAG + write(value)
        if isinstance(value, tuple):  # a named tuple: its fields
            return _TUPLE_TAG + write(tuple(value))
        raise _Mismatch(value, info)

    return record


def encoder_of(info: TypeInformation) -> Encoder:
    """The encoder of values of ``info`` (see the module docstring)."""
    while isinstance(info, ExternalTypeInfo):
        info = info._type_info
    if isinstance(info, BasicTypeInfo):
        return _atom(info)
    if isinstance(info, LocalTimeTypeInfo):
        return _temporal(_LOCAL_FAMILIES[info._time_type], info)
    if type(info) in _PLAIN_FAMILIES:
        return _temporal(_PLAIN_FAMILIES[type(info)], info)
    if type(info) in _ELEMENT_SPECS:
        element_type: TypeInformation = info._element_type  # type: ignore[attr-defined]
        byte_elements = _shape(element_type) == "int"
        return _sequence(encoder_of(element_type), info, byte_elements)
    if isinstance(info, MapTypeInfo):
        return _mapping(encoder_of(info._key_type_info), encoder_of(info._value_type_info), info)
    if isinstance(info, TupleTypeInfo):
        return _fields([encoder_of(t) for t in info.get_field_types()], info, rows=False)
    if isinstance(info, RowTypeInfo):
        return _fields([encoder_of(t) for t in info.get_field_types()], info, rows=True)
    return encode  # PICKLED_BYTE_ARRAY (inside a declared type), or a type chandy does not know


# ------------------------------------------------------------------ a state's serializer


def table_type(kind: str, declared: TypeInformation) -> tuple[TypeInformation, TypeInformation]:
    """The type of a table's stored values for state of ``kind`` declared as ``declared``,
    and the type of a map's entry values (what RocksDB stores per map entry). A list state
    stores a list of its elements; state with a time-to-live stores ``(value, last access)``
    pairs (Flink's ``TtlValue``), per element and per map entry."""
    base = kind.removeprefix("namespaced ").removeprefix("ttl ")
    ttl = kind.removeprefix("namespaced ").startswith("ttl ")

    def stamped(info: TypeInformation) -> TypeInformation:
        return Types.TUPLE([info, Types.LONG()]) if ttl else info

    if base == "list":
        element = stamped(declared)
        return Types.LIST(element), element
    if base == "map" and isinstance(declared, MapTypeInfo):
        entry = stamped(declared._value_type_info)
        return Types.MAP(declared._key_type_info, entry), entry
    value = stamped(declared)
    return value, value


class StateSerializer:
    """How the values of one state are written: the encoders of its declared type.

    ``encode`` writes a table value (what the heap keeps per key: a list state's list, a
    map state's dict), ``encode_entry`` one entry value of a map state (what RocksDB keeps
    per map entry). A value that does not fit raises :class:`StateValueTypeError`."""

    __slots__ = ("state", "declared", "spec", "_value", "_entry")

    def __init__(
        self, state: str, kind: str, declared: TypeInformation, stored: TypeInformation | None = None
    ) -> None:
        """``stored``: the type of what is written, when it is not the table type of ``kind``
        (a broadcast state's ``(key, value)`` elements)."""
        self.state = state
        self.declared = declared
        self.spec = type_spec(declared)
        value, entry = (stored, stored) if stored is not None else table_type(kind, declared)
        self._value = encoder_of(value)
        self._entry = self._value if entry is value else encoder_of(entry)

    def encode(self, value: Any) -> bytes:
        try:
            return self._value(value)
        except _Mismatch as mismatch:
            raise self._error(mismatch) from None

    def encode_table(self, values: dict[Any, Any]) -> bytes:
        """One key group's table: its entry count, then each table key (in the key
        encoding, :func:`~chandy.state.codec.encode_key`) and value."""
        encode_value = self._value
        try:
            entries = [encode_key(key) + encode_value(value) for key, value in values.items()]
        except _Mismatch as mismatch:
            raise self._error(mismatch) from None
        return varint(len(values)) + b"".join(entries)

    def encode_entry(self, value: Any) -> bytes:
        try:
            return self._entry(value)
        except _Mismatch as mismatch:
            raise self._error(mismatch) from None

    def _error(self, mismatch: _Mismatch) -> StateValueTypeError:
        value = mismatch.value
        kind = type(value)
        name = (
            kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        )
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        error = StateValueTypeError(
            f"state '{self.state}' is declared as {describe(self.declared)} and holds a value "
            f"that does not fit it: {shown} (a {name}) where {describe(mismatch.expected)} is "
            "declared. Typed state is written as data and each value must fit the declared "
            "type; store values of that type, or declare the type the state holds "
            "(Types.PICKLED_BYTE_ARRAY() for any picklable object). A restart would fail the "
            "same way, so the job fails now."
        )
        error.state = self.state
        return error


def state_serializer(state: str, kind: str, declared: TypeInformation | None) -> StateSerializer | None:
    """The serializer of state ``state`` of ``kind`` declared as ``declared``; ``None`` for
    pickled state (no declared type)."""
    return None if declared is None else StateSerializer(state, kind, declared)
