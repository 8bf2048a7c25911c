"""Restricted unpickling: what a restore may load from a snapshot's pickles.

A pickle names the callables that rebuild it (``module.name``), and unpickling imports and
calls them: a pickle that names ``os.system`` runs a command. Checkpoints are authenticated
(``docs/security.md``), but a snapshot accepted with ``--trust-snapshot`` is someone else's
bytes. So every pickle a restore reads (keyed state that declares no ``Types``, timers,
operator, broadcast and source split state, sink committables, unaligned checkpoints'
in-flight records, a RocksDB database restored from its files) goes through one
:class:`RestrictedUnpickler`, whose :meth:`~RestrictedUnpickler.find_class` resolves only:

1. plain builtin types (``int``, ``str``, ``tuple``, ``dict``, ``set``, ``range``, ...) and
   what the pickle protocol itself needs (``copyreg._reconstructor``, ``_codecs.encode``);
2. classes of the data modules of :data:`DATA_CLASS_MODULES` (``collections``,
   ``datetime``, ``decimal``, ``fractions``, ``uuid``, ``enum``), the names of
   :data:`DATA_NAMES` (NumPy's and PyArrow's array reconstruction, ``Row``, windows,
   in-flight batches) and chandy's own data classes (dataclasses and enums of
   :data:`CHANDY_DATA_PACKAGES`: source splits, sink committables, timers);
3. classes (not functions) defined in the modules of the job's own code: where its
   functions and operators are defined (:mod:`chandy.task.user_code` finds them), which
   the job runs anyway;
4. anything in the modules the user allows with
   ``execution.state-recovery.allowed-pickle-modules`` (``pkg.*`` for a package and its
   submodules).

Everything else (``os.system``, ``subprocess.Popen``, ``builtins.eval``, ``getattr``,
``__import__``, ``importlib``, ``pickle`` itself, a function of the job's module) is
refused before its module is even imported, with one :class:`PickleRefusedError` naming
the state, the refused ``module.name`` and the two ways out. Cloudpickled functions are
refused too (their reconstruction builds code objects): state is pickled with plain pickle,
which stores functions by name only, so a function in state restores only from a module
the configuration allows.
"""

from __future__ import annotations

import _compat_pickle
import dataclasses
import enum
import io
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from chandy.errors import InvalidCheckpointError

#: The configuration key that allows more modules (``StateRecoveryOptions.ALLOWED_PICKLE_MODULES``).
ALLOWED_MODULES_KEY = "execution.state-recovery.allowed-pickle-modules"

#: Builtins a pickle of plain data may name (every other builtin, eval/exec/getattr/
#: __import__/open/type included, is refused).
SAFE_BUILTINS = frozenset(
    {
        "int",
        "float",
        "complex",
        "str",
        "bytes",
        "bytearray",
        "tuple",
        "list",
        "dict",
        "set",
        "frozenset",
        "bool",
        "slice",
        "range",
        "object",
        "NotImplemented",
        "Ellipsis",
    }
)

#: Modules whose own classes (defined in them) are data.
DATA_CLASS_MODULES = frozenset({"collections", "datetime", "decimal", "fractions", "uuid", "enum"})

_PYARROW_NAMES = frozenset(
    {
        "_restore_array",
        "_reconstruct_record_batch",
        "_reconstruct_table",
        "chunked_array",
        "py_buffer",
        "schema",
        "field",
        "scalar",
        "type_for_alias",
        "list_",
        "large_list",
        "fixed_size_list",
        "struct",
        "map_",
        "dictionary",
        "timestamp",
        "time32",
        "time64",
        "date32",
        "date64",
        "duration",
        "decimal128",
        "decimal256",
        "binary",
        "large_binary",
        "string",
        "large_string",
        "union",
    }
)

#: Exactly these names of these modules (functions included).
DATA_NAMES: dict[str, frozenset[str]] = {
    "builtins": SAFE_BUILTINS,
    "copyreg": frozenset({"_reconstructor", "__newobj__", "__newobj_ex__"}),
    "_codecs": frozenset({"encode"}),  # bytes in pickle protocols 0 to 2
    "numpy": frozenset({"ndarray", "dtype"}),
    "numpy.core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy._core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy.core.numeric": frozenset({"_frombuffer"}),
    "numpy._core.numeric": frozenset({"_frombuffer"}),
    "pyarrow.lib": _PYARROW_NAMES,
    # chandy's own records and state classes
    "chandy.core.types": frozenset({"Row", "_create_row", "RowKind", "Instant"}),
    "chandy.core.windows": frozenset({"TimeWindow", "CountWindow", "GlobalWindow"}),
    "chandy.core.time": frozenset({"Time", "Duration"}),
    # what unaligned checkpoints keep of the records and events in flight
    "chandy.network.events": frozenset({"Watermark", "WatermarkStatus"}),
    "chandy.task.batches": frozenset({"TimestampedBatch", "KeyedBatch"}),
}


#: chandy's packages whose data classes (dataclasses without ``__post_init__``, enums) are
#: state: splits, committables, timers, in-flight async records, pending commits.
CHANDY_DATA_PACKAGES = (
    "chandy.core.",
    "chandy.connectors.",
    "chandy.task.",
    "chandy.state.",
    "chandy.network.",
)


def _chandy_data_class(found: Any, module: str) -> bool:
    """A class chandy defines in ``module`` whose instances are data: a dataclass that only
    assigns its fields (no ``__post_init__``), or an enum."""
    if not isinstance(found, type) or found.__module__ != module:
        return False
    if issubclass(found, enum.Enum):
        return True
    return dataclasses.is_dataclass(found) and not hasattr(found, "__post_init__")


class PickleRefusedError(InvalidCheckpointError):
    """A restored pickle names something a snapshot may not load (see the module docstring).

    ``refused`` is what it named (``module.name``), ``state`` the state being restored
    (``None`` when it could not be told), ``owner`` the operator.
    """

    refused: str = ""
    state: str | None = None
    owner: str | None = None


class PickleRefusal(Exception):
    """Raised inside the unpickler for a name it may not load; whoever knows which state it
    was reading turns it into a :class:`PickleRefusedError` (:func:`refused_error`)."""

    def __init__(self, refused: str) -> None:
        super().__init__(refused)
        self.refused = refused


def _module_matches(module: str, allowed: Iterable[str]) -> bool:
    """``module`` is one of ``allowed`` (``pkg.*``: ``pkg`` or any module under it)."""
    for entry in allowed:
        if entry.endswith(".*"):
            package = entry[:-2]
            if module == package or module.startswith(package + "."):
                return True
        elif module == entry:
            return True
    return False


@dataclass(frozen=True)
class UnpicklingPolicy:
    """What a restore may unpickle: the fixed allowlist, plus ``user_modules`` (their own
    classes: the job's code) and ``allowed_modules`` (anything in them: the configuration)."""

    user_modules: frozenset[str] = frozenset()
    allowed_modules: tuple[str, ...] = ()
    #: Resolve every name, as plain pickle does: only for bytes that never come from a
    #: snapshot (a record another slot of this job sent over an authenticated connection).
    unrestricted: bool = False

    def resolve(self, module: str, name: str, find: Callable[[str, str], Any]) -> Any:
        """The object ``module.name`` stands for, found with ``find`` (pickle's own lookup)
        only once the name is allowed; a :class:`PickleRefusal` otherwise."""
        checked_module, checked_name = _modern_names(module, name)
        names = DATA_NAMES.get(checked_module)
        if self.unrestricted:
            found = find(module, name)
        elif names is not None and checked_name in names:
            found = find(module, name)
        elif _module_matches(checked_module, self.allowed_modules):
            found = find(module, name)
        elif checked_module.startswith(CHANDY_DATA_PACKAGES):
            found = find(module, name)
            if not _chandy_data_class(found, checked_module):
                raise PickleRefusal(f"{checked_module}.{checked_name}")
        elif checked_module in DATA_CLASS_MODULES or checked_module in self.user_modules:
            found = find(module, name)
            # A class defined there: not a function, not a class it merely imported
            # (``from subprocess import Popen``), not an attribute reached through one.
            if not isinstance(found, type) or found.__module__ != checked_module:
                raise PickleRefusal(f"{checked_module}.{checked_name}")
        else:
            raise PickleRefusal(f"{checked_module}.{checked_name}")
        return found

    def loads(self, data: bytes) -> Any:
        """``data`` unpickled under this policy; a :class:`PickleRefusal` for a name it may
        not load (:func:`restricted_loads` turns it into the error naming the state)."""
        return RestrictedUnpickler(io.BytesIO(data), self).load()


def _modern_names(module: str, name: str) -> tuple[str, str]:
    """Python 2 names (pickle protocols 0 to 2) as Python 3 calls them, as pickle maps them."""
    mapped = _compat_pickle.NAME_MAPPING.get((module, name))
    if mapped is not None:
        return mapped
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


#: A policy with the fixed allowlist only (no job code, nothing configured).
DEFAULT_POLICY = UnpicklingPolicy()
#: Plain pickle's lookups, for what never comes from a snapshot (see ``unrestricted``).
UNRESTRICTED = UnpicklingPolicy(unrestricted=True)


class RestrictedUnpickler(pickle.Unpickler):
    """The one unpickler of restored state: names resolve through ``policy``."""

    def __init__(self, file: io.BytesIO, policy: UnpicklingPolicy) -> None:
        super().__init__(file)
        self.policy = policy

    def find_class(self, module: str, name: str) -> Any:
        return self.policy.resolve(module, name, super().find_class)


def refused_error(
    refused: str, owner: str | None, state: str | None, kind: str = "", what: str | None = None
) -> PickleRefusedError:
    """The error for a pickle of ``state`` (``what`` when it is not one of the operator's
    named states) that names ``refused``."""
    from chandy.state.missing_classes import describe_state  # deferred: it builds on this module

    who = owner or "an operator"
    if what is None:
        what = describe_state(state, kind) if state else "its state"
    module = refused.rpartition(".")[0] or refused
    exc = PickleRefusedError(
        f"{who} cannot restore {what}: its pickled data names {refused}, which a restore does "
        "not load. A restore unpickles only plain data (numbers, strings, containers, "
        "datetime, decimal, NumPy and Arrow data), chandy's own state classes and the "
        "classes defined in the job's own modules, because unpickling anything else runs "
        "code and a snapshot from elsewhere may be crafted to. If this snapshot is yours and "
        f"the state legitimately holds {refused}, allow its module: "
        f"{ALLOWED_MODULES_KEY}: {module} (a list; 'pkg.*' for a package). Better, declare "
        "Types on the state (ValueStateDescriptor(name, Types.LONG()), ...): typed state is "
        "written as data, without pickle. If you did not write this snapshot, do not restore "
        "it. A restart would fail the same way, so the job fails now."
    )
    exc.refused, exc.owner, exc.state = refused, owner, state
    return exc


def restricted_loads(
    data: bytes,
    policy: UnpicklingPolicy,
    owner: str | None = None,
    state: str | None = None,
    kind: str = "",
    what: str | None = None,
) -> Any:
    """``data`` unpickled under ``policy``; what it may not load is a
    :class:`PickleRefusedError` naming ``owner`` and ``state``."""
    try:
        return policy.loads(data)
    except PickleRefusal as exc:
        raise refused_error(exc.refused, owner, state, kind, what) from None
