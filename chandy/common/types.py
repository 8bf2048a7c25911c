"""PyFlink's ``pyflink.common.types``: ``Row`` and ``RowKind``."""

from chandy.core.types import Row, RowKind

__all__ = ["Row", "RowKind"]
