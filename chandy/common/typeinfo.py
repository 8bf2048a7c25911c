"""PyFlink's ``pyflink.common.typeinfo``: ``Types`` and the type information classes.

In chandy type information only describes (records stay Python objects);
see :mod:`chandy.core.types`.
"""

from chandy.core.types import (
    BasicArrayTypeInfo,
    BasicType,
    BasicTypeInfo,
    DateTypeInfo,
    ExternalTypeInfo,
    InstantTypeInfo,
    ListTypeInfo,
    LocalTimeTypeInfo,
    MapTypeInfo,
    ObjectArrayTypeInfo,
    PickledBytesTypeInfo,
    PrimitiveArrayTypeInfo,
    RowTypeInfo,
    SqlTimeTypeInfo,
    TimestampTypeInfo,
    TimeTypeInfo,
    TupleTypeInfo,
    TypeInformation,
    Types,
)

__all__ = [
    "BasicArrayTypeInfo",
    "BasicType",
    "BasicTypeInfo",
    "DateTypeInfo",
    "ExternalTypeInfo",
    "InstantTypeInfo",
    "ListTypeInfo",
    "LocalTimeTypeInfo",
    "MapTypeInfo",
    "ObjectArrayTypeInfo",
    "PickledBytesTypeInfo",
    "PrimitiveArrayTypeInfo",
    "RowTypeInfo",
    "SqlTimeTypeInfo",
    "TimeTypeInfo",
    "TimestampTypeInfo",
    "TupleTypeInfo",
    "TypeInformation",
    "Types",
]
