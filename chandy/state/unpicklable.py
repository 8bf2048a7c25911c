"""State that cannot be pickled: a lock, a socket, an open file or a client kept in state.

State values that are not plain data are pickled, by the heap backend when a checkpoint
serializes them and by the RocksDB backend whenever one is written. A value that cannot be
pickled fails the same way on every attempt: after a restart the job rebuilds the same value
from the same input and state. Retried, such a job would fail its checkpoints (heap) or its
records (RocksDB) forever, so the failure is a :class:`StateNotPicklableError`, an
:class:`~chandy.errors.UnrecoverableError`, and the job fails once, naming the state, the
value's type and the fix.
"""

from __future__ import annotations

import pickle
from typing import Any

from chandy.errors import UnrecoverableError


class StateNotPicklableError(UnrecoverableError, TypeError):
    """A state value cannot be pickled. A ``TypeError`` too, as pickle's own error mostly is."""

    #: The type of the value that cannot be pickled (``module.qualname``).
    value_type: str = ""


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def unpicklable_state_error(state: str | None, value: Any, error: BaseException) -> StateNotPicklableError:
    """The error for ``value`` of ``state`` (``None``: not known here) that pickling failed on."""
    where = f"state '{state}'" if state else "keyed state"
    exc = StateNotPicklableError(
        f"a value of type {_type_name(value)} in {where} cannot be pickled ({type(error).__name__}: "
        f"{error}), so it can be neither checkpointed nor kept in RocksDB. A restart would build the "
        "same value again, so the job fails instead of restarting. Keep plain data in state (numbers, "
        "strings, lists, dicts, dataclasses of them) and create locks, connections, files and "
        "clients in open() instead."
    )
    exc.value_type = _type_name(value)
    return exc


def first_unpicklable(values: Any) -> Any:
    """The first of ``values`` (an iterable) that cannot be pickled alone, else ``values``."""
    for value in values:
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - looking for the culprit of a failure already seen
            return value
    return values
