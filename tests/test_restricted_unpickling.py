"""The restricted unpickler every restore reads pickles with (chandy/state/unpickling.py).

Real pickles of real objects: what plain data, chandy's classes and the job's own classes
pickle to resolves; every gadget an attacker's snapshot could hold is refused before its
module is imported, with the state, the refused name and the fix in the message. The job's
modules are found from real operators (chandy/task/user_code.py).
"""

from __future__ import annotations

import builtins
import collections
import datetime
import decimal
import fractions
import importlib
import os
import pickle
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from chandy.config.configuration import Configuration
from chandy.config.options import StateRecoveryOptions
from chandy.connectors.number_sequence import NumberSequenceSplit
from chandy.core.types import Row, RowKind
from chandy.core.windows import TimeWindow
from chandy.errors import ConfigurationError, InvalidCheckpointError
from chandy.network.events import Watermark
from chandy.state.missing_classes import StateClassNotFoundError, load_state
from chandy.state.unpickling import (
    ALLOWED_MODULES_KEY,
    DEFAULT_POLICY,
    PickleRefusedError,
    UnpicklingPolicy,
    restricted_loads,
)
from chandy.task.operators.sink import PendingCommit
from chandy.task.timers import InternalTimer
from chandy.task.user_code import unpickling_policy, user_modules
from tests import typed_jobs
from tests.typed_jobs import Point, Tally, TypedSummary


class Reduces:
    """Pickles as ``target(*args)``: how every gadget is built."""

    def __init__(self, target: Any, *args: Any) -> None:
        self.target, self.args = target, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.target, self.args


def global_pickle(module: str, name: str) -> bytes:
    """A pickle of just ``module.name`` (protocol 4's STACK_GLOBAL), whatever that names."""
    text = b"".join(b"\x8c" + bytes([len(part)]) + part.encode() for part in (module, name))
    return b"\x80\x04" + text + b"\x93."


JOB = UnpicklingPolicy(user_modules=frozenset({"tests.typed_jobs"}))


#: What state holds, by name: built per test (NumPy and Arrow values are no test ids).
DATA: dict[str, Any] = {
    "plain": lambda: [1, 2.5, "s", b"b", None, True, (1, 2), {"k": {1, 2}}, frozenset({3})],
    "bytearray": lambda: bytearray(b"x"),
    "range": lambda: range(3),
    "slice": lambda: slice(1, 5),
    "complex": lambda: complex(1, 2),
    "OrderedDict": lambda: collections.OrderedDict(a=1),
    "deque": lambda: collections.deque([1]),
    "defaultdict": lambda: collections.defaultdict(list, {"a": [1]}),
    "Counter": lambda: collections.Counter("abc"),
    "datetime": lambda: datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
    "timedelta": lambda: datetime.timedelta(seconds=3),
    "Decimal": lambda: decimal.Decimal("1.25"),
    "Fraction": lambda: fractions.Fraction(1, 3),
    "UUID": lambda: uuid.UUID(int=7),
    "RowKind": lambda: RowKind.DELETE,
    "ndarray": lambda: np.arange(5),
    "object ndarray": lambda: np.array([1, "x"], dtype=object),
    "numpy scalar": lambda: np.float64(1.5),
    "RecordBatch": lambda: pa.record_batch([pa.array([1, 2]), pa.array(["a", None])], names=["n", "s"]),
    "Table": lambda: pa.table({"n": [1]}),
    "Row": lambda: Row(a=1, b="x"),
    "TimeWindow": lambda: TimeWindow(0, 10),
    "Watermark": lambda: Watermark(5),
    "NumberSequenceSplit": lambda: NumberSequenceSplit(0, 0, 9),
}


@pytest.mark.parametrize("name", list(DATA))
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_plain_data_and_chandys_state_classes_restore(name: str, protocol: int) -> None:
    value = DATA[name]()
    restored = restricted_loads(pickle.dumps(value, protocol=protocol), DEFAULT_POLICY)
    assert type(restored) is type(value)
    if isinstance(value, np.ndarray):
        assert (restored == value).all()
    elif isinstance(value, (pa.RecordBatch, pa.Table)):
        assert restored.equals(value)
    else:
        assert restored == value


def test_chandys_own_dataclasses_restore_and_its_other_classes_do_not() -> None:
    commit = PendingCommit(0, 3, ("a", 1))  # a sink's pending commit (operator state)
    timer = InternalTimer(5, "k", None)
    assert restricted_loads(pickle.dumps(commit), DEFAULT_POLICY) == commit
    assert restricted_loads(pickle.dumps(timer), DEFAULT_POLICY) == timer
    for module, name in (
        ("chandy.storage.checkpoint_storage", "CheckpointStorage"),  # not a data package
        ("chandy.connectors.file_sink", "FileSink"),  # a class, but no dataclass
        ("chandy.state.unpickling", "restricted_loads"),  # a function
    ):
        with pytest.raises(PickleRefusedError, match=rf"{module}\.{name}"):
            restricted_loads(global_pickle(module, name), DEFAULT_POLICY)


GADGETS = {
    "posix.system": Reduces(os.system, "touch /nonexistent/x"),
    "subprocess.Popen": Reduces(subprocess.Popen, ["true"]),
    "builtins.eval": Reduces(builtins.eval, "1"),
    "builtins.exec": Reduces(builtins.exec, "pass"),
    "builtins.getattr": Reduces(getattr, Path("/"), "unlink"),
    "builtins.__import__": Reduces(__import__, "os"),
    "io.open": Reduces(open, "/etc/hostname"),
    "builtins.type": Reduces(type, "X", (), {}),
    "importlib.import_module": Reduces(importlib.import_module, "os"),
    "_pickle.loads": Reduces(pickle.loads, b"N."),
    "pathlib.Path.touch": Reduces(Path.touch, Path("/nonexistent/x")),
}


@pytest.mark.parametrize("refused", list(GADGETS))
@pytest.mark.parametrize("policy", [DEFAULT_POLICY, JOB], ids=["default", "job"])
def test_every_gadget_is_refused_with_the_state_the_name_and_the_fix(
    refused: str, policy: UnpicklingPolicy
) -> None:
    data = pickle.dumps({"ok": [1, 2], "bad": GADGETS[refused]})
    with pytest.raises(PickleRefusedError) as error:
        restricted_loads(data, policy, "operator 'Counter' (uid 'counter')", "count")
    message = str(error.value)
    assert error.value.refused == refused and error.value.state == "count"
    assert "operator 'Counter' (uid 'counter') cannot restore state 'count'" in message
    assert f"names {refused}" in message
    assert ALLOWED_MODULES_KEY in message and "Types" in message
    assert isinstance(error.value, InvalidCheckpointError)  # unrecoverable: the job fails once


def test_a_refused_module_is_not_even_imported() -> None:
    name = "tests.never_imported_by_a_restore"
    data = global_pickle(name, "X")
    with pytest.raises(PickleRefusedError, match=rf"{name}\.X"):
        restricted_loads(data, DEFAULT_POLICY)
    assert name not in sys.modules


def test_the_jobs_own_classes_restore_but_not_its_functions_nor_what_it_imported() -> None:
    for value in (Tally(2, 7), Point(1, 2), [Tally(0, 0)]):
        assert restricted_loads(pickle.dumps(value), JOB) == value
    with pytest.raises(PickleRefusedError, match=r"tests\.typed_jobs\.Tally"):
        restricted_loads(pickle.dumps(Tally(1, 1)), DEFAULT_POLICY)  # not a module of this job
    with pytest.raises(PickleRefusedError, match=r"tests\.typed_jobs\.expected_summary"):
        restricted_loads(pickle.dumps(Reduces(typed_jobs.expected_summary, 0, [])), JOB)  # a function
    # a class the module imported is that class's module's, whatever name reaches it
    imported = global_pickle("tests.typed_jobs", "Row")
    with pytest.raises(PickleRefusedError, match=r"tests\.typed_jobs\.Row"):
        restricted_loads(imported, JOB)
    # and an attribute reached through one of its classes is no class of it
    through = global_pickle("tests.typed_jobs", "Tally.__init__")
    with pytest.raises(PickleRefusedError, match=r"Tally\.__init__"):
        restricted_loads(through, JOB)


def test_configured_modules_allow_everything_in_them_and_pkg_star_their_submodules() -> None:
    allowed = UnpicklingPolicy(allowed_modules=("tests.typed_jobs",))
    assert restricted_loads(pickle.dumps(Reduces(typed_jobs.expected_summary, 0, [1])), allowed)[1] == 1
    package = UnpicklingPolicy(allowed_modules=("tests.*",))
    assert restricted_loads(pickle.dumps(Tally(1, 2)), package) == Tally(1, 2)
    with pytest.raises(PickleRefusedError):
        restricted_loads(pickle.dumps(Reduces(os.system, "true")), package)


def test_the_configuration_key_takes_lists_and_refuses_what_is_no_module_name() -> None:
    option = StateRecoveryOptions.ALLOWED_PICKLE_MODULES
    assert Configuration({}).get(option) == ()
    assert Configuration({option.key: "a.b; c.*,d"}).get(option) == ("a.b", "c.*", "d")
    assert Configuration({option.key: ["x", "y.z"]}).get(option) == ("x", "y.z")
    for bad in ("os system", "a..b", "1abc", 5):
        with pytest.raises((ConfigurationError, ValueError)):
            Configuration({option.key: bad}).get(option)


def test_a_missing_class_is_still_named_as_one_and_a_refusal_as_a_refusal() -> None:
    gone = global_pickle("tests.typed_jobs", "NoSuchClass")
    with pytest.raises(StateClassNotFoundError, match=r"tests\.typed_jobs\.NoSuchClass"):
        load_state(gone, "operator 'x'", "s", policy=JOB)
    with pytest.raises(PickleRefusedError, match="state 's'"):
        load_state(pickle.dumps(GADGETS["posix.system"]), "operator 'x'", "s", policy=JOB)


# ---------------------------------------------------------------------- the job's own modules


@dataclass
class Holder:
    """Stands for an operator that holds a user function (as chandy's do)."""

    function: Any


def test_the_jobs_modules_are_read_off_its_functions_but_never_chandys_nor_the_libraries() -> None:
    found = user_modules([Holder(TypedSummary(1)), Holder(lambda x: x), Holder(np.arange)])
    assert "tests.typed_jobs" in found  # the class of the function object
    assert __name__ in found  # the module the lambda is defined in
    assert not any(m.startswith(("chandy", "numpy", "os", "builtins")) for m in found)


def test_the_policy_joins_the_jobs_modules_and_the_configured_ones() -> None:
    policy = unpickling_policy({ALLOWED_MODULES_KEY: "mypackage.*"}, [Holder(TypedSummary(1))])
    assert "tests.typed_jobs" in policy.user_modules and policy.allowed_modules == ("mypackage.*",)
