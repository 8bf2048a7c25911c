"""One check for every Arrow schema argument of the batch path.

``to_batches``, ``process_batches``, the batch file formats, the Parquet and Delta batch sinks
and the Kafka batch deserializer all take a schema; each accepts the same two forms (a
``pyarrow.Schema``, or a mapping of column name to an Arrow type or its name) and refuses
anything else with the same error. It lives here, under the API and beside the connectors
(tests/test_architecture.py's layers), so that both can use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import pyarrow as pa

from chandy.errors import InvalidProgramError
from chandy.state.arrow_keys import INTERNAL_COLUMNS

#: What a schema may be given as: an Arrow schema, or a mapping of column name to an Arrow
#: type (``pa.int64()``) or its name (``"int64"``).
SchemaLike: TypeAlias = "pa.Schema | Mapping[str, pa.DataType | str]"


def check_schema(schema: Any, what: str) -> pa.Schema:
    """``schema`` as a ``pa.Schema``, or an error naming ``what`` and the accepted forms."""
    if isinstance(schema, pa.Schema):
        fields = list(schema)
    elif isinstance(schema, Mapping):
        fields = []
        for name, kind in schema.items():
            if not isinstance(name, str) or not name:
                raise InvalidProgramError(f"{what}: column names are non-empty strings, got {name!r}")
            fields.append(pa.field(name, _arrow_type(kind, f"{what}: column {name!r}")))
    else:
        raise InvalidProgramError(
            f"{what} takes a pyarrow.Schema or a dict of column name to Arrow type "
            f"(e.g. {{'total': pa.int64()}}), got {type(schema).__name__}"
        )
    if not fields:
        raise InvalidProgramError(f"{what} has no columns")
    names = [f.name for f in fields]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise InvalidProgramError(f"{what} names the column(s) {duplicated} more than once")
    internal = sorted(set(names) & set(INTERNAL_COLUMNS))
    if internal:
        raise InvalidProgramError(f"{what}: {internal} are chandy's internal column names; rename them")
    return schema if isinstance(schema, pa.Schema) else pa.schema(fields)  # a Schema keeps its metadata


def check_optional_schema(schema: Any, what: str) -> pa.Schema | None:
    """:func:`check_schema`, with ``None`` (infer the types) passed through."""
    return None if schema is None else check_schema(schema, what)


def _arrow_type(kind: Any, what: str) -> pa.DataType:
    if isinstance(kind, pa.DataType):
        return kind
    if isinstance(kind, str):
        try:
            return pa.type_for_alias(kind)
        except ValueError:
            pass
    raise InvalidProgramError(
        f"{what} has type {kind!r}: give a pyarrow type (pa.int64(), pa.float64(), ...) or its name ('int64')"
    )
