"""The job's own code: the modules whose classes a restore may unpickle.

Restored state legitimately holds objects of the job's classes: an accumulator dataclass, a
named tuple, an enum defined next to the functions that keep them. The restricted unpickler
(:mod:`chandy.state.unpickling`) resolves the classes of those modules, and only those: the
job runs their code anyway, so unpickling one of their classes runs nothing the user does
not already run. Which modules they are is read off the task's operators: the modules that
define the objects reachable from them (user functions, sources, sinks, key selectors), the
functions' closures and defaults, and the classes and modules the functions' code names.

A module counts as the job's code only if it is not chandy's, not in the standard library
and not installed among the interpreter's packages (site-packages): the script
(``__main__``) and the modules next to it or shipped with it (``--py-files``). A job that
keeps objects of an installed package's classes in state allows that package with
``execution.state-recovery.allowed-pickle-modules``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import site
import sys
import sysconfig
import types
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from chandy.config.configuration import Configuration
from chandy.config.options import StateRecoveryOptions
from chandy.state.unpickling import UnpicklingPolicy

log = logging.getLogger(__name__)

#: At most this many objects are looked at from a task's operators: they are small graphs
#: of functions and settings, and a function holding a big table must not make a restore slow.
MAX_OBJECTS = 20_000

_MAIN_MODULES = frozenset({"__main__", "__mp_main__"})
_CONTAINERS = (list, tuple, set, frozenset)


def _library_directories() -> tuple[str, ...]:
    """Where the interpreter's standard library and installed packages live."""
    found: list[str] = []
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            found.append(path)
    found += getattr(site, "getsitepackages", list)()
    user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if isinstance(user_site, str):
        found.append(user_site)
    return tuple(os.path.join(os.path.realpath(path), "") for path in found)


class _Judge:
    """Tells whether a module is the job's own code (see the module docstring)."""

    def __init__(self) -> None:
        self._libraries = _library_directories()
        self._verdicts: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        verdict = self._verdicts.get(name)
        if verdict is None:
            verdict = self._verdicts[name] = self._judge(name)
        return verdict

    def _judge(self, name: str) -> bool:
        if name in _MAIN_MODULES:
            return True
        top = name.partition(".")[0]
        if top in ("chandy", "builtins") or top in sys.stdlib_module_names:
            return False
        file = getattr(sys.modules.get(name), "__file__", None)
        if not isinstance(file, str):
            return False  # built in, a namespace package, or not imported: nothing to load from
        path = os.path.realpath(file)
        return not any(path.startswith(directory) for directory in self._libraries)


def _names_in(code: types.CodeType) -> Iterator[str]:
    """The global names ``code`` (and the functions and classes nested in it) may read."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _names_in(constant)


def user_modules(roots: Iterable[Any], max_objects: int = MAX_OBJECTS) -> frozenset[str]:
    """The modules of the job's own code reachable from ``roots`` (a task's operators)."""
    is_user = _Judge()
    found: set[str] = set()
    seen: set[int] = set()
    queue: deque[Any] = deque(roots)
    looked = 0
    while queue and looked < max_objects:
        obj = queue.popleft()
        looked += 1
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            if is_user(obj.__name__):
                found.add(obj.__name__)
            continue
        if isinstance(obj, type):
            if is_user(obj.__module__):
                found.add(obj.__module__)
                queue.extend(_methods(obj))
            continue
        if isinstance(obj, types.FunctionType):
            _function(obj, is_user, found, queue)
            continue
        if isinstance(obj, types.MethodType):
            queue.extend((obj.__self__, obj.__func__))
            continue
        if isinstance(obj, functools.partial):
            queue.append(obj.func)
            queue.extend(obj.args)
            queue.extend(obj.keywords.values())
            continue
        if type(obj) is dict:  # a function's settings; a big one (a lookup table) only in part
            queue.extend(itertools.islice(obj.keys(), max_objects))
            queue.extend(itertools.islice(obj.values(), max_objects))
            continue
        if type(obj) in _CONTAINERS:  # likewise: a source's records are not looked through
            queue.extend(itertools.islice(obj, max_objects))
            continue
        kind = type(obj)
        queue.append(kind)
        top = kind.__module__.partition(".")[0]
        if top == "chandy" or is_user(kind.__module__):
            queue.extend(_attributes(obj))
    if queue:
        log.debug("looked at %d objects of the job's operators for its modules; stopped there", max_objects)
    return frozenset(found)


def _function(function: types.FunctionType, is_user: _Judge, found: set[str], queue: deque[Any]) -> None:
    """A function: its module, what its closure and defaults hold, and (for the job's own
    functions) the classes and modules its code names."""
    module = function.__module__
    if module is None or not is_user(module):
        return
    found.add(module)
    queue.extend(cell.cell_contents for cell in function.__closure__ or () if _filled(cell))
    queue.extend(function.__defaults__ or ())
    queue.extend((function.__kwdefaults__ or {}).values())
    scope = function.__globals__
    for name in set(_names_in(function.__code__)):
        value = scope.get(name)
        if isinstance(value, (type, types.ModuleType)):
            queue.append(value)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _methods(cls: type) -> Iterator[Any]:
    """The functions a class of the job's own defines (their code names its other classes)."""
    for value in vars(cls).values():
        if isinstance(value, (staticmethod, classmethod)):
            yield value.__func__
        elif isinstance(value, property):
            yield from (f for f in (value.fget, value.fset, value.fdel) if f is not None)
        elif isinstance(value, (types.FunctionType, type)):
            yield value


def _attributes(obj: Any) -> Iterator[Any]:
    """What an object holds: its ``__dict__`` and ``__slots__`` values."""
    try:
        attributes = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        attributes = None
    if isinstance(attributes, dict):
        yield from attributes.values()
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"):
                try:
                    yield object.__getattribute__(obj, slot)
                except AttributeError:
                    continue


def unpickling_policy(config: Mapping[str, Any], roots: Iterable[Any]) -> UnpicklingPolicy:
    """The restricted unpickler's policy for a task restoring state: the job's own modules
    (from its operators, ``roots``) and the modules the configuration allows."""
    allowed = Configuration(config).get(StateRecoveryOptions.ALLOWED_PICKLE_MODULES)
    modules = user_modules(roots)
    log.debug("restored state may unpickle classes of the job's modules %s", sorted(modules))
    return UnpicklingPolicy(user_modules=modules, allowed_modules=tuple(allowed))
