"""A task's single point of sleep.

A task thread sleeps in exactly one place, :meth:`Wakeup.wait`, and everything
that could give it work signals the same :class:`Wakeup`: a batch arriving on
any input channel, credit coming back on an output channel, a mail (a
checkpoint trigger, a cancel) in its mailbox. The flag makes a signal that
arrives between "nothing to do" and ``wait()`` wake it at once, so no wakeup is
ever lost; waiters always re-check their condition after waking.
"""

from __future__ import annotations

import threading


class Wakeup:
    """A sticky, single-consumer signal."""

    __slots__ = ("_cond", "_signalled")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._signalled = False

    def signal(self) -> None:
        """Wake the waiter (now, or at its next :meth:`wait`)."""
        with self._cond:
            self._signalled = True
            self._cond.notify()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until signalled or ``timeout`` seconds pass; True if signalled."""
        with self._cond:
            if not self._signalled:
                self._cond.wait(timeout)
            signalled = self._signalled
            self._signalled = False
            return signalled
