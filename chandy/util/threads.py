"""Thread confinement made checkable: Flink's main-thread executor assertion.

The JobMaster and the checkpoint coordinator own their state without locks
because every method runs on one thread (the JobMaster loop). That rule is easy
to break by accident: a callback from an I/O pool or an RPC thread that calls
straight into the coordinator races with the loop. A :class:`MainThreadChecker`
is bound to the owning thread and asserted at the entry points, so a violation
fails loudly at the call that breaks the rule instead of corrupting state later.
"""

from __future__ import annotations

import threading


class WrongThreadError(AssertionError):
    """A thread-confined component was called from a thread other than its owner."""


class MainThreadChecker:
    """Remembers the thread a component belongs to and asserts calls come from it.

    Unbound (the default) it accepts any thread: a component driven from a
    test's own thread needs no ceremony. :meth:`bind_to_current_thread` makes it
    strict; the JobMaster binds its checker at the start of :meth:`run`.
    """

    __slots__ = ("_name", "_owner")

    def __init__(self, name: str) -> None:
        self._name = name
        self._owner: threading.Thread | None = None

    def bind_to_current_thread(self) -> None:
        self._owner = threading.current_thread()

    def release(self) -> None:
        """Accept any thread again (the owner has stopped)."""
        self._owner = None

    @property
    def owner(self) -> threading.Thread | None:
        return self._owner

    def is_main_thread(self) -> bool:
        return self._owner is None or self._owner is threading.current_thread()

    def assert_main_thread(self) -> None:
        owner = self._owner
        if owner is not None and owner is not threading.current_thread():
            raise WrongThreadError(
                f"{self._name} must only be called from its main thread {owner.name!r}, "
                f"not from {threading.current_thread().name!r}"
            )
