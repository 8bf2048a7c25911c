"""PyFlink's ``pyflink.common.time``: ``Duration``, ``Time`` and ``Instant``."""

from chandy.core.time import Duration, Time
from chandy.core.types import Instant

__all__ = ["Duration", "Instant", "Time"]
