"""PyFlink's ``pyflink.datastream.output_tag``: ``OutputTag``."""

from chandy.core.output_tag import OutputTag

__all__ = ["OutputTag"]
