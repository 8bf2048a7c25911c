"""PyFlink's ``pyflink.datastream.window``: windows, window assigners and triggers.

They live in :mod:`chandy.core.windows` (a contract module that imports no runtime),
re-exported here whole.
"""

from chandy.core import windows as _windows
from chandy.core.windows import *  # noqa: F403 - the whole module, under PyFlink's path

__all__ = list(_windows.__all__)
