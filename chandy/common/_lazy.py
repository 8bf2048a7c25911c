"""Lazy re-exports for the PyFlink-shaped packages (``chandy.common``, ``chandy.datastream``).

A module that mirrors a PyFlink path names where each of its names really lives
and defines ``__getattr__(name)`` as ``load_export(__name__, exports, name)``; the
defining module is imported on first use. ``from chandy.datastream import
MapFunction`` therefore does not import the job runtime, and a name whose
module cannot be imported fails when it is used, not when its neighbours are.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any


def load_export(module_name: str, exports: Mapping[str, str], name: str) -> Any:
    """The value of ``name`` re-exported by ``module_name`` from ``exports[name]``; cached on
    the module so that later lookups do not come here."""
    source = exports.get(name)
    if source is None:
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    setattr(sys.modules[module_name], name, value)
    return value


def exports_of(module: str, *names: str) -> dict[str, str]:
    """``{name: module}`` for each name (to build an ``exports`` table)."""
    return dict.fromkeys(names, module)
