"""PyFlink's ``pyflink.datastream.stream_execution_environment``."""

from chandy.api.environment import StreamExecutionEnvironment

__all__ = ["StreamExecutionEnvironment"]
