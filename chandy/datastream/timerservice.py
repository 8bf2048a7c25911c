"""PyFlink's ``pyflink.datastream.timerservice``: ``TimerService``."""

from chandy.core.functions import TimerService

__all__ = ["TimerService"]
