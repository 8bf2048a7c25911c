"""PyFlink's ``pyflink.datastream.connectors.number_seq``: ``NumberSequenceSource``."""

from chandy.connectors import NumberSequenceSource

__all__ = ["NumberSequenceSource"]
