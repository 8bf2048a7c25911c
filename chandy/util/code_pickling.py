"""cloudpickle that keeps where the code came from.

Functions defined in a job's main script (or anywhere cloudpickle ships by value) travel
as code objects. cloudpickle replaces each one's file name with ``<dynamic-code>`` to make
its output the same wherever the code was defined; a traceback from such a function,
raised in a task, then reads ``File "<dynamic-code>", line 13`` and the user cannot tell
which file line 13 is in. chandy needs no byte-identical payloads, so it ships code
objects whole (:mod:`marshal` keeps the file name, the line table, everything), and the
traceback names the script and the line, with the line's text wherever the file exists.
Marshal's format is the interpreter's, which the executors must share with the driver
anyway (cloudpickle's code objects are built for one Python version too).
"""

from __future__ import annotations

import io
import marshal
import pickle
import types
from typing import Any


def dumps(obj: Any, protocol: int | None = None) -> bytes:
    """``cloudpickle.dumps(obj)``, but code objects keep their ``co_filename``."""
    import cloudpickle

    class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no type hints
        def reducer_override(self, value: Any) -> Any:
            if type(value) is types.CodeType:
                return marshal.loads, (marshal.dumps(value),)
            return super().reducer_override(value)

    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL if protocol is None else protocol).dump(obj)
    return buffer.getvalue()
