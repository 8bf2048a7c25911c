"""PyFlink's ``pyflink.common.configuration``: ``Configuration``."""

from chandy.config import Configuration

__all__ = ["Configuration"]
