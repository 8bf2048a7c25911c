"""PyFlink's ``pyflink.datastream.time_domain``: ``TimeDomain``."""

from chandy.core.time import TimeDomain

__all__ = ["TimeDomain"]
