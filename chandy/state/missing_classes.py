"""Restored state that refers to a class the job's code no longer has.

State values that are not plain data are pickled, and a pickle names each class by its
module and qualified name. When a job is restored with code in which such a class was
renamed, moved or deleted (a savepoint of v1 restored with v2), unpickling fails with
``AttributeError: Can't get attribute 'Acc' on <module ...>`` or ``No module named ...``.
Nothing a restart does changes that: every attempt would read the same bytes with the
same code. So the failure is a :class:`StateClassNotFoundError`, an
:class:`~chandy.errors.UnrecoverableError`, and the job fails once, naming the operator,
the state, the class and the two ways out.

Finding the class costs nothing while the state loads: values are unpickled by the
restricted unpickler (:mod:`chandy.state.unpickling`), and only when that fails is the
pickle read again by an unpickler, as restricted, that records which class it could not
find (an ``AttributeError`` raised by a user's ``__setstate__`` is not a missing class,
and stays what it was). The heap's format before typed state pickled every state of a key
group in one blob, so which state holds the class is found by a third, tolerant reading
that puts a placeholder where the class was.
"""

from __future__ import annotations

import io
import pickle
import sys
from types import FrameType
from typing import Any

from chandy.errors import InvalidCheckpointError
from chandy.state.unpickling import (
    DEFAULT_POLICY,
    PickleRefusal,
    RestrictedUnpickler,
    UnpicklingPolicy,
    refused_error,
)

#: Names of the tables that hold timers (Flink's ``_timer_state/`` prefix): reserved, not user state.
TIMER_STATE_PREFIX = "_timer_state/"


class StateClassNotFoundError(InvalidCheckpointError):
    """Restored state holds an object of a class the job's code no longer has.

    ``missing`` is the class as the pickle names it (``module.qualname``), ``state`` the
    state's name (``None`` when it could not be told) and ``owner`` the operator (its name
    and uid). The message says all of it and the fix.
    """

    missing: str = ""
    state: str | None = None
    owner: str | None = None


def describe_state(name: str, kind: str = "") -> str:
    """How a message names the state ``name`` (timers are state the user never declared);
    ``kind`` (``"operator "``, ``"broadcast "``) for state that is not keyed."""
    if name.startswith(TIMER_STATE_PREFIX):
        return f"its timers (state '{name}')"
    return f"{kind}state '{name}'"


class _Missing:
    """Base of the placeholders a tolerant reading puts where a missing class was: built,
    filled and hashed in every way a pickle may build an object, and doing nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Missing:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass


class _FoundMissing(Exception):
    """Raised by :class:`_Finder` when an object holds a placeholder."""


class _Recorder(RestrictedUnpickler):
    """An unpickler that notes the first class it cannot find; ``tolerant``: and goes on
    with a placeholder in its place. Restricted as every unpickler of restored state: what
    ``policy`` refuses is never looked for, let alone loaded."""

    def __init__(self, data: bytes, tolerant: bool, policy: UnpicklingPolicy) -> None:
        super().__init__(io.BytesIO(data), policy)
        self.tolerant = tolerant
        self.missing: str | None = None
        self.error: BaseException | None = None

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except PickleRefusal:
            if not self.tolerant:
                raise
            return _placeholder(module, name)  # never loaded: a class of this module's own
        except (ImportError, AttributeError) as exc:
            if self.missing is None:
                self.missing, self.error = f"{module}.{name}", exc
            if not self.tolerant:
                raise
            return _placeholder(module, name)


def _placeholder(module: str, name: str) -> type[_Missing]:
    return type(name.rpartition(".")[2], (_Missing,), {"__module__": module, "__qualname__": name})


class _Finder(pickle.Pickler):
    """Walks an object graph (by pickling it to nowhere) and stops at the first placeholder."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _Missing) or (isinstance(obj, type) and issubclass(obj, _Missing)):
            raise _FoundMissing
        return NotImplemented


def _holds_missing(value: Any) -> bool:
    try:
        _Finder(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except _FoundMissing:
        return True
    except Exception:  # noqa: BLE001 - only a placeholder found counts
        return False
    return False


def find_missing_class(
    data: bytes, policy: UnpicklingPolicy = DEFAULT_POLICY
) -> tuple[str, BaseException] | None:
    """The class (``module.qualname``) that unpickling ``data`` cannot find, with the error
    it raised; ``None`` when every class is found (the failure was something else)."""
    recorder = _Recorder(data, tolerant=False, policy=policy)
    try:
        recorder.load()
    except Exception:  # noqa: BLE001 - what failed is what the recorder noted, if anything
        pass
    if recorder.missing is None or recorder.error is None:
        return None
    return recorder.missing, recorder.error


def states_holding_missing(data: bytes, policy: UnpicklingPolicy = DEFAULT_POLICY) -> list[str]:
    """The names of the states in a key group's blob (``{name: (kind, values)}``, the heap's
    format before typed state) whose keys or values hold the missing class (or a name
    ``policy`` refuses); empty when that cannot be told."""
    try:
        group = _Recorder(data, tolerant=True, policy=policy).load()
    except Exception:  # noqa: BLE001 - a pickle even a placeholder cannot mend: no names
        return []
    if not isinstance(group, dict):
        return []
    return [str(name) for name, entry in group.items() if _holds_missing(entry)]


def missing_class_error(
    missing: str,
    error: BaseException,
    owner: str | None,
    states: list[str],
    kind: str = "",
    what: str | None = None,
) -> StateClassNotFoundError:
    """The error for state that holds ``missing``, with what it says and what to do
    (``what`` names the state when it is not one of the operator's named states)."""
    who = owner or "an operator"
    if what is None:
        what = _describe_states(states, kind)
    module, _, qualname = missing.rpartition(".")
    shipping = ""
    if isinstance(error, ImportError):
        shipping = (
            f" If module '{module}' does exist, it must be importable where the tasks run: on "
            "Spark, ship it with spark.submit.pyFiles (spark-submit --py-files) or install it "
            "in the executors' Python."
        )
    exc = StateClassNotFoundError(
        f"{who} cannot restore {what}: it holds objects of class {missing}, which the job's code "
        f"no longer has ({type(error).__name__}: {error}). State is restored with the classes "
        "it was saved with, found by module and name, so the class was renamed, moved or "
        "deleted since the snapshot was taken. Either keep the class importable as "
        f"{missing} (keep it in module '{module}' under the name '{qualname}', or add an "
        f"alias there: {qualname} = <the new class>), or start the operator without its "
        "state: give it a new uid() and restore with allow_non_restored_state "
        "(execution.state-recovery.ignore-unclaimed-state: true, chandy run "
        f"--allow-non-restored-state).{shipping} A restart would fail the same way, so the "
        "job fails now."
    )
    exc.missing, exc.owner = missing, owner
    exc.state = states[0] if len(states) == 1 else None
    return exc


def _describe_states(states: list[str], kind: str) -> str:
    if len(states) == 1:
        return describe_state(states[0], kind)
    if states:
        return "states " + ", ".join(f"'{s}'" for s in states)
    return "its state"


def load_state(
    data: bytes,
    owner: str | None = None,
    state: str | None = None,
    kind: str = "",
    policy: UnpicklingPolicy = DEFAULT_POLICY,
) -> Any:
    """``data`` unpickled under ``policy``: what it may not load is a
    :class:`~chandy.state.unpickling.PickleRefusedError`, a class it needs that is gone a
    :class:`StateClassNotFoundError` (``kind`` as :func:`describe_state` takes it). Without
    ``owner`` and ``state`` they are looked for on the caller's stack (see
    :func:`_state_on_stack`): RocksDB decodes values where only its callers know them."""
    try:
        return RestrictedUnpickler(io.BytesIO(data), policy).load()
    except PickleRefusal as exc:
        if owner is None and state is None:
            owner, state = _state_on_stack()
        raise refused_error(exc.refused, owner, state, kind) from None
    except (ImportError, AttributeError) as exc:
        error = class_error_of(data, owner, state, kind, policy)
        if error is None:
            raise
        raise error from exc


def class_error_of(
    data: bytes,
    owner: str | None = None,
    state: str | None = None,
    kind: str = "",
    policy: UnpicklingPolicy = DEFAULT_POLICY,
) -> StateClassNotFoundError | None:
    """Why unpickling ``data`` failed, if a class it needs is gone; ``None`` if not (the
    caller re-raises what it caught). Without ``owner`` and ``state`` they are looked for
    on the caller's stack (see :func:`_state_on_stack`)."""
    found = find_missing_class(data, policy)
    if found is None:
        return None
    if owner is None and state is None:
        owner, state = _state_on_stack()
    return missing_class_error(*found, owner, [state] if state else [], kind)


def load_key_group(
    data: bytes, owner: str, policy: UnpicklingPolicy = DEFAULT_POLICY
) -> dict[str, tuple[str, dict[Any, Any]]]:
    """A key group's blob in the heap's format before typed state (``{name: (kind,
    values)}``, one pickle) read under ``policy``; a class it needs that is gone is a
    :class:`StateClassNotFoundError` naming the state(s) holding it."""
    try:
        group: dict[str, tuple[str, dict[Any, Any]]] = RestrictedUnpickler(io.BytesIO(data), policy).load()
        return group
    except PickleRefusal as exc:
        states = states_holding_missing(data, policy)
        what = None if len(states) == 1 else _describe_states(states, "")
        raise refused_error(exc.refused, owner, states[0] if len(states) == 1 else None, what=what) from None
    except (ImportError, AttributeError) as exc:
        found = find_missing_class(data, policy)
        if found is None:
            raise
        raise missing_class_error(*found, owner, states_holding_missing(data, policy)) from exc


def _state_on_stack() -> tuple[str | None, str | None]:
    """The operator and the state whose value is being read, from the frames that called
    the reading: the innermost one holding a state table (a state handle's ``_table``, a
    timer queue's ``table``, a local ``table``) names the state, and a keyed state backend
    (a handle's ``_backend``, or the backend itself) the operator. Only on the failure
    path; the state's code stays free of bookkeeping for an error that is this rare."""
    owner: str | None = None
    state: str | None = None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (owner is None or state is None):
        local = frame.f_locals
        holder = local.get("self")
        if state is None:
            tables = (getattr(holder, "_table", None), getattr(holder, "table", None), local.get("table"))
            for table in tables:
                name = getattr(table, "name", None)
                if isinstance(name, str) and hasattr(table, "maps"):
                    state = name
                    break
        if owner is None:
            for backend in (getattr(holder, "_backend", None), holder):
                described = getattr(backend, "owner", None)
                if isinstance(described, str) and hasattr(backend, "tables"):
                    owner = described
                    break
        frame = frame.f_back
    return owner, state
