"""PyFlink's type information (``Types``, ``TypeInformation``) and its ``Row`` and ``RowKind``.

PyFlink needs type information to pick the Java serializer a record crosses the
JVM with; chandy keeps records as Python objects from source to sink (pickled
only when they cross a process boundary or enter a snapshot), so here type
information mostly *describes*: it has PyFlink's constructors, ``repr`` and
equality and is accepted wherever PyFlink takes an ``output_type``,
``type_info`` or ``key_type``. A PyFlink job keeps its
``Types.TUPLE([Types.STRING(), Types.INT()])`` arguments when ported. Where the
type is visible in PyFlink, chandy follows: ``print()`` writes a typed stream as
Flink's Java does (:func:`format_as_flink`), and ``from_collection(records,
type_info)`` hands functions what PyFlink's round trip through Java would
(:func:`to_declared_type`: a tuple declared as a row type arrives as a ``Row``).

:class:`Row` is a real value class with PyFlink's behaviour (positional and
named fields, attribute and index access, row kinds), since user code builds
and reads rows.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import math
import struct
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "BasicArrayTypeInfo",
    "BasicType",
    "BasicTypeInfo",
    "DateTypeInfo",
    "ExternalTypeInfo",
    "Instant",
    "InstantTypeInfo",
    "ListTypeInfo",
    "LocalTimeTypeInfo",
    "MapTypeInfo",
    "ObjectArrayTypeInfo",
    "PickledBytesTypeInfo",
    "PrimitiveArrayTypeInfo",
    "Row",
    "RowKind",
    "RowTypeInfo",
    "SqlTimeTypeInfo",
    "TimeTypeInfo",
    "TimestampTypeInfo",
    "TupleTypeInfo",
    "TypeInformation",
    "Types",
    "format_as_flink",
    "to_declared_type",
]


# ---------------------------------------------------------------------------- type information


class TypeInformation:
    """Describes the type of a stream's records or a state's values (PyFlink's base class).

    Subclasses compare equal when they describe the same type and print as
    PyFlink prints them. Records are never converted: ``to_internal_type`` and
    ``from_internal_type`` return their argument, ``need_conversion`` is false.
    """

    __slots__ = ()

    def _identity(self) -> tuple[Any, ...]:
        """What makes two descriptions the same type (besides the class)."""
        return ()

    def need_conversion(self) -> bool:
        """Whether values of this type are converted between their Python form and the form they are stored in
        (PyFlink's API; chandy stores Python values as they are)."""
        return False

    def to_internal_type(self, obj: Any) -> Any:
        """The stored form of a value (the value itself in chandy)."""
        return obj

    def from_internal_type(self, obj: Any) -> Any:
        """The Python value of a stored one (the value itself in chandy)."""
        return obj

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TypeInformation)
            and type(other) is type(self)
            and other._identity() == self._identity()
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._identity()))

    def __repr__(self) -> str:
        return type(self).__name__


class BasicType(enum.Enum):
    """The basic types, named as Java names their classes (which is how PyFlink prints them)."""

    STRING = "String"
    BYTE = "Byte"
    BOOLEAN = "Boolean"
    SHORT = "Short"
    INT = "Integer"
    LONG = "Long"
    FLOAT = "Float"
    DOUBLE = "Double"
    CHAR = "Char"
    BIG_INT = "BigInteger"
    BIG_DEC = "BigDecimal"
    INSTANT = "Instant"


class BasicTypeInfo(TypeInformation):
    """A primitive type, a string, a big integer or decimal, or an instant."""

    __slots__ = ("_basic_type",)

    def __init__(self, basic_type: BasicType) -> None:
        if not isinstance(basic_type, BasicType):
            raise TypeError(f"BasicTypeInfo takes a BasicType, got {basic_type!r}")
        self._basic_type = basic_type

    def _identity(self) -> tuple[Any, ...]:
        return (self._basic_type,)

    def __eq__(self, other: object) -> bool:
        # PyFlink: INSTANT (an InstantTypeInfo) equals any BasicTypeInfo of the same basic type.
        return isinstance(other, BasicTypeInfo) and other._basic_type is self._basic_type

    def __hash__(self) -> int:
        return hash(("BasicTypeInfo", self._basic_type))

    def __repr__(self) -> str:
        return self._basic_type.value

    @staticmethod
    def STRING_TYPE_INFO() -> BasicTypeInfo:
        """The type of text values (Python ``str``)."""
        return BasicTypeInfo(BasicType.STRING)

    @staticmethod
    def BOOLEAN_TYPE_INFO() -> BasicTypeInfo:
        """The type of ``bool`` values."""
        return BasicTypeInfo(BasicType.BOOLEAN)

    @staticmethod
    def BYTE_TYPE_INFO() -> BasicTypeInfo:
        """The type of 8-bit integers (Python ``int``)."""
        return BasicTypeInfo(BasicType.BYTE)

    @staticmethod
    def SHORT_TYPE_INFO() -> BasicTypeInfo:
        """The type of 16-bit integers (Python ``int``)."""
        return BasicTypeInfo(BasicType.SHORT)

    @staticmethod
    def INT_TYPE_INFO() -> BasicTypeInfo:
        """The type of 32-bit integers (Python ``int``)."""
        return BasicTypeInfo(BasicType.INT)

    @staticmethod
    def LONG_TYPE_INFO() -> BasicTypeInfo:
        """The type of 64-bit integers (Python ``int``)."""
        return BasicTypeInfo(BasicType.LONG)

    @staticmethod
    def FLOAT_TYPE_INFO() -> BasicTypeInfo:
        """The type of 32-bit floats (Python ``float``, rounded to 32 bits where PyFlink rounds)."""
        return BasicTypeInfo(BasicType.FLOAT)

    @staticmethod
    def DOUBLE_TYPE_INFO() -> BasicTypeInfo:
        """The type of 64-bit floats (Python ``float``)."""
        return BasicTypeInfo(BasicType.DOUBLE)

    @staticmethod
    def CHAR_TYPE_INFO() -> BasicTypeInfo:
        """The type of single characters (a one-character ``str``)."""
        return BasicTypeInfo(BasicType.CHAR)

    @staticmethod
    def BIG_INT_TYPE_INFO() -> BasicTypeInfo:
        """The type of integers of any size (Python ``int``)."""
        return BasicTypeInfo(BasicType.BIG_INT)

    @staticmethod
    def BIG_DEC_TYPE_INFO() -> BasicTypeInfo:
        """The type of decimals (``decimal.Decimal``)."""
        return BasicTypeInfo(BasicType.BIG_DEC)

    @staticmethod
    def INSTANT_TYPE_INFO() -> InstantTypeInfo:
        """The type of points in time (:class:`Instant`)."""
        return InstantTypeInfo(BasicType.INSTANT)


class InstantTypeInfo(BasicTypeInfo):
    """An :class:`Instant` (a point on the time line)."""

    __slots__ = ()


class SqlTimeTypeInfo:
    """Factories of the SQL date and time types (PyFlink's ``SqlTimeTypeInfo``)."""

    @staticmethod
    def DATE() -> DateTypeInfo:
        """The type of dates (``datetime.date``)."""
        return DateTypeInfo()

    @staticmethod
    def TIME() -> TimeTypeInfo:
        """The type of times of day (``datetime.time``)."""
        return TimeTypeInfo()

    @staticmethod
    def TIMESTAMP() -> TimestampTypeInfo:
        """The type of timestamps (``datetime.datetime``)."""
        return TimestampTypeInfo()


class DateTypeInfo(TypeInformation):
    """A ``datetime.date``."""

    __slots__ = ()


class TimeTypeInfo(TypeInformation):
    """A ``datetime.time``."""

    __slots__ = ()


class TimestampTypeInfo(TypeInformation):
    """A ``datetime.datetime``."""

    __slots__ = ()


class PickledBytesTypeInfo(TypeInformation):
    """Any picklable Python object (PyFlink's default when no type is given)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PickledByteArrayTypeInfo"


class _ElementTypeInfo(TypeInformation):
    """A container of one element type; prints as ``Name<element>``."""

    __slots__ = ("_element_type",)

    def __init__(self, element_type: TypeInformation) -> None:
        self._element_type = element_type

    def _identity(self) -> tuple[Any, ...]:
        return (self._element_type,)

    def __repr__(self) -> str:
        return f"{type(self).__name__}<{self._element_type}>"


class PrimitiveArrayTypeInfo(_ElementTypeInfo):
    """An array of a primitive type (``byte[]``, ``int[]``, ...)."""

    __slots__ = ()


class BasicArrayTypeInfo(_ElementTypeInfo):
    """An array of boxed primitives or strings (``Integer[]``, ``String[]``, ...)."""

    __slots__ = ()


class ObjectArrayTypeInfo(_ElementTypeInfo):
    """An array of any other type; elements may be ``None``."""

    __slots__ = ()


class ListTypeInfo(_ElementTypeInfo):
    """A list."""

    __slots__ = ()

    @property
    def elem_type(self) -> TypeInformation:
        """The type of the list's elements."""
        return self._element_type


class MapTypeInfo(TypeInformation):
    """A dict (and what ``MapStateDescriptor`` is typed with)."""

    __slots__ = ("_key_type_info", "_value_type_info")

    def __init__(self, key_type_info: TypeInformation, value_type_info: TypeInformation) -> None:
        self._key_type_info = key_type_info
        self._value_type_info = value_type_info

    def _identity(self) -> tuple[Any, ...]:
        return (self._key_type_info, self._value_type_info)

    def __repr__(self) -> str:
        return f"MapTypeInfo<{self._key_type_info}, {self._value_type_info}>"


class TupleTypeInfo(TypeInformation):
    """A tuple with fields of the given types."""

    __slots__ = ("_field_types",)

    def __init__(self, field_types: Sequence[TypeInformation]) -> None:
        self._field_types = list(field_types)

    def get_field_types(self) -> list[TypeInformation]:
        """The fields' types, in order."""
        return self._field_types

    def _identity(self) -> tuple[Any, ...]:
        return tuple(self._field_types)

    def __repr__(self) -> str:
        return "TupleTypeInfo({})".format(", ".join(str(t) for t in self._field_types))


class RowTypeInfo(TypeInformation):
    """A :class:`Row` with fields of the given types, optionally named.

    Unnamed fields are called ``f0``, ``f1``, ... (Flink's names). As in PyFlink,
    two row types are equal when their field types are, whatever the names.
    """

    __slots__ = ("_field_names", "_field_types")

    def __init__(
        self, field_types: Sequence[TypeInformation], field_names: Sequence[str] | None = None
    ) -> None:
        self._field_types = list(field_types)
        if field_names is not None and len(field_names) != len(self._field_types):
            raise ValueError(
                f"a row type needs one name per field type: {len(field_names)} names for "
                f"{len(self._field_types)} types"
            )
        self._field_names = list(field_names) if field_names is not None else None

    def get_field_names(self) -> list[str]:
        """The fields' names (``f0``, ``f1``, ... when the row type has none)."""
        if self._field_names is None:
            return [f"f{i}" for i in range(len(self._field_types))]
        return self._field_names

    def get_field_index(self, field_name: str) -> int:
        """The position of ``field_name``, or -1 when the fields have no names (PyFlink's)."""
        if self._field_names:
            return self._field_names.index(field_name)
        return -1

    def get_field_types(self) -> list[TypeInformation]:
        """The fields' types, in order."""
        return self._field_types

    def _identity(self) -> tuple[Any, ...]:
        return tuple(self._field_types)

    def __repr__(self) -> str:
        if self._field_names:
            fields = ", ".join(f"{n}: {t}" for n, t in zip(self._field_names, self._field_types, strict=True))
        else:
            fields = ", ".join(str(t) for t in self._field_types)
        return f"RowTypeInfo({fields})"


class LocalTimeTypeInfo(TypeInformation):
    """A ``java.time`` local date, time or date-time."""

    class TimeType(enum.Enum):
        """Which local time a ``LocalTimeTypeInfo`` holds: a date, a time of day, or both."""

        LOCAL_DATE = 0
        LOCAL_TIME = 1
        LOCAL_DATE_TIME = 2

    __slots__ = ("_time_type",)

    def __init__(self, time_type: LocalTimeTypeInfo.TimeType) -> None:
        self._time_type = time_type

    def _identity(self) -> tuple[Any, ...]:
        return (self._time_type,)

    def __repr__(self) -> str:
        return f"LocalTimeTypeInfo<{self._time_type.name}>"


class ExternalTypeInfo(TypeInformation):
    """A type as the Table API exchanges it; wraps the type it stands for."""

    __slots__ = ("_type_info",)

    def __init__(self, type_info: TypeInformation) -> None:
        self._type_info = type_info

    def _identity(self) -> tuple[Any, ...]:
        return (self._type_info,)

    def __repr__(self) -> str:
        return f"ExternalTypeInfo<{self._type_info}>"


class Types:
    """The type information of the common types, as PyFlink's ``Types`` makes them.

    Every factory is a call: ``Types.STRING()``, ``Types.TUPLE([Types.INT(), Types.LONG()])``.
    """

    @staticmethod
    def STRING() -> TypeInformation:
        """Text values (``str``)."""
        return BasicTypeInfo(BasicType.STRING)

    @staticmethod
    def BYTE() -> TypeInformation:
        """8-bit integers."""
        return BasicTypeInfo(BasicType.BYTE)

    @staticmethod
    def BOOLEAN() -> TypeInformation:
        """``True``/``False``."""
        return BasicTypeInfo(BasicType.BOOLEAN)

    @staticmethod
    def SHORT() -> TypeInformation:
        """16-bit integers."""
        return BasicTypeInfo(BasicType.SHORT)

    @staticmethod
    def INT() -> TypeInformation:
        """32-bit integers."""
        return BasicTypeInfo(BasicType.INT)

    @staticmethod
    def LONG() -> TypeInformation:
        """64-bit integers: typed state of this type is kept as data, never pickled."""
        return BasicTypeInfo(BasicType.LONG)

    @staticmethod
    def FLOAT() -> TypeInformation:
        """32-bit floats (a typed ``from_collection`` rounds them to 32 bits, as PyFlink does)."""
        return BasicTypeInfo(BasicType.FLOAT)

    @staticmethod
    def DOUBLE() -> TypeInformation:
        """64-bit floats."""
        return BasicTypeInfo(BasicType.DOUBLE)

    @staticmethod
    def CHAR() -> TypeInformation:
        """Single characters."""
        return BasicTypeInfo(BasicType.CHAR)

    @staticmethod
    def BIG_INT() -> TypeInformation:
        """Integers of any size."""
        return BasicTypeInfo(BasicType.BIG_INT)

    @staticmethod
    def BIG_DEC() -> TypeInformation:
        """Decimals (``decimal.Decimal``)."""
        return BasicTypeInfo(BasicType.BIG_DEC)

    @staticmethod
    def INSTANT() -> TypeInformation:
        """Points in time (:class:`Instant`)."""
        return InstantTypeInfo(BasicType.INSTANT)

    @staticmethod
    def SQL_DATE() -> TypeInformation:
        """Dates (``datetime.date``)."""
        return DateTypeInfo()

    @staticmethod
    def SQL_TIME() -> TypeInformation:
        """Times of day (``datetime.time``)."""
        return TimeTypeInfo()

    @staticmethod
    def SQL_TIMESTAMP() -> TypeInformation:
        """Timestamps (``datetime.datetime``)."""
        return TimestampTypeInfo()

    @staticmethod
    def PICKLED_BYTE_ARRAY() -> TypeInformation:
        """Any picklable Python value: the type to declare when no other fits (state of this type is pickled,
        and a restore unpickles it restrictedly)."""
        return PickledBytesTypeInfo()

    @staticmethod
    def ROW(field_types: Sequence[TypeInformation]) -> TypeInformation:
        """Rows with these field types, named ``f0``, ``f1``, ..."""
        return RowTypeInfo(field_types)

    @staticmethod
    def ROW_NAMED(field_names: Sequence[str], field_types: Sequence[TypeInformation]) -> TypeInformation:
        """Rows with these named fields: a record arrives as a :class:`Row`, so ``row.name`` works."""
        return RowTypeInfo(field_types, field_names)

    @staticmethod
    def TUPLE(field_types: Sequence[TypeInformation]) -> TypeInformation:
        """Tuples with these field types."""
        return TupleTypeInfo(field_types)

    @staticmethod
    def PRIMITIVE_ARRAY(element_type: TypeInformation) -> TypeInformation:
        """Arrays of a primitive type (a Python list)."""
        return PrimitiveArrayTypeInfo(element_type)

    @staticmethod
    def BASIC_ARRAY(element_type: TypeInformation) -> TypeInformation:
        """Arrays of a basic type (a Python list)."""
        return BasicArrayTypeInfo(element_type)

    @staticmethod
    def OBJECT_ARRAY(element_type: TypeInformation) -> TypeInformation:
        """Arrays of any type (a Python list)."""
        return ObjectArrayTypeInfo(element_type)

    @staticmethod
    def MAP(key_type_info: TypeInformation, value_type_info: TypeInformation) -> TypeInformation:
        """Dicts with these key and value types."""
        return MapTypeInfo(key_type_info, value_type_info)

    @staticmethod
    def LIST(element_type_info: TypeInformation) -> TypeInformation:
        """Lists of this element type."""
        return ListTypeInfo(element_type_info)


# ---------------------------------------------------------------------------- Instant


class Instant:
    """A point on the time line in seconds and nanoseconds since the epoch (PyFlink's ``Instant``)."""

    __slots__ = ("nanos", "seconds")

    def __init__(self, seconds: int, nanos: int) -> None:
        self.seconds = seconds
        self.nanos = nanos

    def to_epoch_milli(self) -> int:
        """Milliseconds since the epoch."""
        return self.seconds * 1000 + self.nanos // 1_000_000

    @staticmethod
    def of_epoch_milli(epoch_milli: int) -> Instant:
        """The instant ``epoch_milli`` milliseconds after the epoch."""
        seconds, millis = divmod(epoch_milli, 1000)
        return Instant(seconds, millis * 1_000_000)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Instant) and (other.seconds, other.nanos) == (self.seconds, self.nanos)

    def __hash__(self) -> int:
        return hash((self.seconds, self.nanos))

    def __repr__(self) -> str:
        return f"Instant<{self.seconds}, {self.nanos}>"


# ---------------------------------------------------------------------------- Row


class RowKind(enum.Enum):
    """What a row means in a changelog: an insertion, or one half of an update, or a deletion."""

    INSERT = 0
    UPDATE_BEFORE = 1
    UPDATE_AFTER = 2
    DELETE = 3

    def __str__(self) -> str:
        return _ROW_KIND_SHORT[self]


_ROW_KIND_SHORT = {
    RowKind.INSERT: "+I",
    RowKind.UPDATE_BEFORE: "-U",
    RowKind.UPDATE_AFTER: "+U",
    RowKind.DELETE: "-D",
}


def _create_row(fields: list[str] | None, values: Sequence[Any], row_kind: RowKind | None = None) -> Row:
    """Rebuild a row (how rows unpickle, and how a row "class" makes rows)."""
    row = Row(*values)
    if fields is not None:
        row._fields = list(fields)
    if row_kind is not None:
        row._row_kind = row_kind
    return row


class Row:
    """A fixed-length record with positional or named fields (PyFlink's ``Row``).

    ``Row(1, "a")`` has positional fields; ``Row(id=1, name="a")`` has named ones,
    in the order given, readable as ``row.name``, ``row["name"]`` or ``row[1]``.
    ``Person = Row("name", "age")`` is a row "class": ``Person("Alice", 11)`` is
    ``Row(name='Alice', age=11)``. Rows are equal when their kind and values are
    (named rows: the same names with the same values, in any order); a row hashes
    like the tuple of its values, so it can be a dict key or a ``key_by`` result
    field. Field values may be replaced (``row[0] = x``); names are fixed.
    """

    __slots__ = ("_fields", "_from_dict", "_row_kind", "_values")

    _fields: list[str] | None
    _values: list[Any]
    _from_dict: bool
    _row_kind: RowKind

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args and kwargs:
            raise ValueError("a Row takes positional or named fields, not both")
        self._fields = list(kwargs) if kwargs else None
        self._values = list(kwargs.values()) if kwargs else list(args)
        self._from_dict = bool(kwargs)
        self._row_kind = RowKind.INSERT

    @staticmethod
    def of_kind(row_kind: RowKind, *args: Any, **kwargs: Any) -> Row:
        """A row of the given kind: ``Row.of_kind(RowKind.DELETE, 1, "a")``."""
        row = Row(*args, **kwargs)
        row.set_row_kind(row_kind)
        return row

    def as_dict(self, recursive: bool = False) -> dict[str, Any]:
        """The fields by name; ``recursive`` turns nested rows (also in lists and dicts) into dicts."""
        if self._fields is None:
            raise TypeError(
                "as_dict() needs named fields; this row's are positional (build it as "
                "Row(name=value, ...) or call set_field_names() first)"
            )
        if not recursive:
            return dict(zip(self._fields, self._values, strict=False))
        return {name: _as_plain(value) for name, value in zip(self._fields, self._values, strict=False)}

    def get_row_kind(self) -> RowKind:
        """The row's kind (insert, update before/after, delete), as PyFlink's changelog rows carry it."""
        return self._row_kind

    def set_row_kind(self, row_kind: RowKind) -> None:
        """Set the row's kind (a ``RowKind``)."""
        if not isinstance(row_kind, RowKind):
            raise TypeError(f"set_row_kind() takes a RowKind, got {row_kind!r}")
        self._row_kind = row_kind

    def set_field_names(self, field_names: Sequence[str]) -> None:
        """Name the row's fields, so that ``row.name`` and ``row['name']`` work."""
        self._fields = list(field_names)

    def get_fields_by_names(self, names: Sequence[str]) -> list[Any]:
        """The values of the named fields, in the order of ``names``."""
        if self._fields is None or list(names) == self._fields:
            return self._values
        missing = [name for name in names if name not in self._fields]
        if missing:
            raise ValueError(f"field names {missing} do not exist in {self._fields}")
        return [self._values[self._fields.index(name)] for name in names]

    def _index_of(self, name: str) -> int:
        if self._fields is None:
            raise KeyError(
                f"this row's fields are positional; {name!r} is not a field (index it by position)"
            )
        try:
            return self._fields.index(name)
        except ValueError:
            raise ValueError(f"{name!r} is not a field of this row; its fields are {self._fields}") from None

    # -- container behaviour ----------------------------------------------------

    def __getitem__(self, item: int | slice | str) -> Any:
        if isinstance(item, (int, slice)):
            return self._values[item]
        return self._values[self._index_of(item)]

    def __setitem__(self, key: int | slice | str, value: Any) -> None:
        if isinstance(key, (int, slice)):
            self._values[key] = value
        else:
            self._values[self._index_of(key)] = value

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: a field name (never a private attribute,
        # which keeps copy and pickle probing for __getstate__ etc. off the fields).
        if name.startswith("_"):
            raise AttributeError(name)
        fields = self._fields
        if fields is None or name not in fields:
            raise AttributeError(f"Row has no field {name!r}" + (f" (fields: {fields})" if fields else ""))
        return self._values[fields.index(name)]

    def __setattr__(self, name: str, value: Any) -> None:
        if name in Row.__slots__:
            object.__setattr__(self, name, value)
            return
        raise AttributeError(
            f"a Row's fields are set by index or name (row[{name!r}] = ...), not as attributes"
        )

    def __contains__(self, item: Any) -> bool:
        if self._fields is not None:
            return item in self._fields
        return item in self._values

    def __call__(self, *args: Any) -> Row:
        """A row whose field names are this row's values (``Row("name", "age")("Alice", 11)``)."""
        if len(args) > len(self):
            raise ValueError(
                f"cannot create a Row with fields {self!r}: expected {len(self)} values, got {args!r}"
            )
        return _create_row(list(self._values), args, self._row_kind)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _create_row, (self._fields, tuple(self._values), self._row_kind)

    def __repr__(self) -> str:
        if self._fields is not None:
            fields = ", ".join(f"{k}={v!r}" for k, v in zip(self._fields, self._values, strict=False))
            return f"Row({fields})"
        return "<Row({})>".format(", ".join(repr(v) for v in self._values))

    def _comparable(self) -> tuple[Any, ...]:
        """Values in an order that does not depend on how named fields were ordered."""
        if self._fields is None:
            return tuple(self._values)
        return tuple(sorted(zip(self._fields, self._values, strict=False), key=lambda item: item[0]))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Row) or type(other) is not type(self):  # PyFlink: subclasses differ
            return False
        if (self._fields is None) != (other._fields is None):
            return False
        return self._row_kind is other._row_kind and self._comparable() == other._comparable()

    def __hash__(self) -> int:
        if self._fields is None:
            return hash(tuple(self._values))
        # The values in name order, so that equal named rows hash equally (PyFlink hashes
        # the values in field order, which breaks dict lookups of reordered rows).
        return hash(tuple(value for _, value in self._comparable()))


def _as_plain(value: Any) -> Any:
    if isinstance(value, Row):
        return value.as_dict(True)
    if isinstance(value, list):
        return [_as_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_plain(v) for k, v in value.items()}
    return value


# ------------------------------------------------------------------ records as PyFlink hands them over


def to_declared_type(value: Any, type_info: TypeInformation | None) -> Any:
    """``value`` as a function receives it in PyFlink after it crossed into Java typed as
    ``type_info`` and back (what ``from_collection(records, type_info)`` does to each record).

    A row type makes a :class:`Row` with the type's field names (``f0``, ``f1``, ... when
    unnamed) out of a tuple or list, and puts a named row's fields in the type's order; a
    tuple type makes a tuple of a list; a FLOAT is rounded to 32 bits; containers convert
    their elements. Anything else, and every untyped value, is returned as it is.
    """
    if value is None or type_info is None:
        return value
    if isinstance(type_info, RowTypeInfo) and isinstance(value, (Row, tuple, list)):
        names = type_info.get_field_names()
        values = value.get_fields_by_names(names) if isinstance(value, Row) and value._fields else list(value)
        fields = zip(values, _field_types(type_info.get_field_types(), values), strict=False)
        row = _create_row(names, [to_declared_type(v, t) for v, t in fields])
        if isinstance(value, Row):
            row.set_row_kind(value.get_row_kind())
        return row
    if isinstance(type_info, TupleTypeInfo) and isinstance(value, (tuple, list)):
        fields = zip(value, _field_types(type_info.get_field_types(), value), strict=False)
        return tuple(to_declared_type(v, t) for v, t in fields)
    if (
        isinstance(type_info, BasicTypeInfo)
        and type_info._basic_type is BasicType.FLOAT
        and isinstance(value, float)
    ):
        return struct.unpack("<f", struct.pack("<f", value))[0]
    if isinstance(type_info, _ElementTypeInfo) and isinstance(value, (list, tuple)):
        return [to_declared_type(v, type_info._element_type) for v in value]
    if isinstance(type_info, MapTypeInfo) and isinstance(value, dict):
        key_type, value_type = type_info._key_type_info, type_info._value_type_info
        return {to_declared_type(k, key_type): to_declared_type(v, value_type) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------- printing as Flink prints


def format_as_flink(value: Any, type_info: TypeInformation | None) -> str:
    """The line Flink's ``print()`` writes for ``value`` on a stream of type ``type_info``.

    PyFlink hands a typed stream to Java, whose ``toString`` prints it: a tuple as
    ``(hi,0,5,4)``, a double as ``1.0E7``, a boolean as ``true``, ``None`` as
    ``null``. An untyped (pickled) stream prints ``str(value)``, and a stream of
    rows ``+I[1,a]``, both made in Python. chandy prints the same, so a ported
    job's output reads as it did on PyFlink.
    """
    if type_info is None or isinstance(type_info, PickledBytesTypeInfo):
        return value if isinstance(value, str) else str(value)
    if isinstance(type_info, (RowTypeInfo, ExternalTypeInfo)) and isinstance(value, Row):
        return f"{value.get_row_kind()}[{','.join(str(v) for v in value)}]"
    return _java_string(value, type_info)


def _java_string(value: Any, type_info: Any) -> str:
    """``toString()`` of the Java object PyFlink turns ``value`` into (Flink's
    ``StringUtils.arrayAwareToString`` for fields, so arrays print their elements).

    A value that does not fit its declared type (which PyFlink would fail to
    serialize; chandy never converts, so the job runs) prints as ``str(value)``."""
    if value is None:
        return "null"
    if isinstance(type_info, BasicTypeInfo):
        return _java_basic_string(value, type_info._basic_type)
    if isinstance(value, (str, bytes)):
        return str(value)
    if isinstance(type_info, TupleTypeInfo) and isinstance(value, (tuple, list)):
        fields = zip(value, _field_types(type_info.get_field_types(), value), strict=False)
        return "(" + ",".join(_java_string(v, t) for v, t in fields) + ")"
    if isinstance(type_info, RowTypeInfo) and isinstance(value, (Row, tuple, list)):
        kind = value.get_row_kind() if isinstance(value, Row) else RowKind.INSERT
        fields = zip(value, _field_types(type_info.get_field_types(), value), strict=False)
        return f"{kind}[" + ", ".join(_java_string(v, t) for v, t in fields) + "]"
    if isinstance(type_info, _ElementTypeInfo) and isinstance(value, (tuple, list)):
        return "[" + ", ".join(_java_string(v, type_info._element_type) for v in value) + "]"
    if isinstance(type_info, MapTypeInfo) and isinstance(value, dict):
        key_type, value_type = type_info._key_type_info, type_info._value_type_info
        pairs = (f"{_java_string(k, key_type)}={_java_string(v, value_type)}" for k, v in value.items())
        return "{" + ", ".join(pairs) + "}"
    if isinstance(type_info, TimestampTypeInfo) and isinstance(value, datetime.datetime):
        # java.sql.Timestamp: nanoseconds without trailing zeros, at least one digit.
        fraction = f"{value.microsecond:06d}".rstrip("0") or "0"
        return f"{value:%Y-%m-%d %H:%M:%S}.{fraction}"
    if isinstance(type_info, TimeTypeInfo) and isinstance(value, datetime.time):
        return f"{value:%H:%M:%S}"
    if isinstance(type_info, LocalTimeTypeInfo) and isinstance(value, (datetime.date, datetime.time)):
        return _java_local_time_string(value)
    return value.isoformat() if isinstance(value, datetime.date) else str(value)


def _field_types(types: list[TypeInformation], value: Any) -> list[Any]:
    """One type per field; fields beyond the declared ones print as Python does."""
    return types + [None] * (len(value) - len(types))


def _java_basic_string(value: Any, basic_type: BasicType) -> str:
    if basic_type is BasicType.BOOLEAN and isinstance(value, bool):
        return "true" if value else "false"
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if basic_type is BasicType.DOUBLE and is_number:
        return _java_floating_string(float(value), repr(float(value)))
    if basic_type is BasicType.FLOAT and is_number:
        return _java_floating_string(float(value), _shortest_float32(float(value)))
    if basic_type is BasicType.INSTANT and isinstance(value, Instant):
        return _java_instant_string(value)
    return str(value)


def _shortest_float32(value: float) -> str:
    """The shortest decimal that reads back as the same 32-bit float (what Java's
    ``Float.toString`` prints the digits of: ``110.1`` rather than ``110.0999984741211``)."""
    single = struct.unpack("<f", struct.pack("<f", value))[0]
    for digits in range(1, 10):
        text = f"{single:.{digits}g}"
        if struct.unpack("<f", struct.pack("<f", float(text)))[0] == single:
            return text
    return repr(single)


def _java_floating_string(value: float, shortest: str) -> str:
    """Java's ``Double.toString``/``Float.toString`` layout of the digits in ``shortest``:
    plain between 10^-3 and 10^7 (always with a fraction), else ``d.dddE±n``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign, digit_tuple, exponent = decimal.Decimal(shortest).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + int(exponent)  # digits[:point] is the integer part
    minus = "-" if sign else ""
    if 1e-3 <= abs(value) < 1e7:
        if point <= 0:
            return f"{minus}0.{'0' * -point}{digits}"
        if point >= len(digits):
            return f"{minus}{digits}{'0' * (point - len(digits))}.0"
        return f"{minus}{digits[:point]}.{digits[point:]}"
    return f"{minus}{digits[0]}.{digits[1:] or '0'}E{point - 1}"


def _java_instant_string(instant: Instant) -> str:
    moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=instant.seconds)
    text = f"{moment:%Y-%m-%dT%H:%M:%S}"
    if instant.nanos:
        text += "." + _java_fraction(instant.nanos)
    return text + "Z"


def _java_fraction(nanos: int) -> str:
    """``java.time``'s fraction of a second: in groups of three digits, as few as needed."""
    text = f"{nanos:09d}"
    for width in (3, 6):
        if text[width:] == "0" * (9 - width):
            return text[:width]
    return text


def _java_local_time_string(value: Any) -> str:
    """``java.time.LocalDate/LocalTime/LocalDateTime.toString``."""
    if isinstance(value, datetime.datetime):
        return f"{value.date().isoformat()}T{_java_local_time_string(value.time())}"
    if isinstance(value, datetime.time):
        text = f"{value:%H:%M}"
        if value.second or value.microsecond:
            text += f":{value:%S}"
        if value.microsecond:
            text += "." + _java_fraction(value.microsecond * 1000)
        return text
    return value.isoformat() if isinstance(value, datetime.date) else str(value)
