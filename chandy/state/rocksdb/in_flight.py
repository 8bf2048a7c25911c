"""Snapshot results on their way to storage, counted so a disposed backend knows when its
local directory may go.

A task may end (and dispose its backend) while the checkpoint I/O pool still uploads a
snapshot whose files lie in the backend's directory: a native snapshot's hard-linked
``chk-N``, a full snapshot's spill file. Deleting the directory at once would fail that
upload; leaving it to a watcher thread left it behind whenever the process exited first
(a program that ends right after its job). So every result says when it is done, and the
last one done after the dispose deletes the directory, on the thread that finished it (the
I/O pool's, which the interpreter joins at exit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class InFlightResults:
    """How many snapshot results of one backend are not written, failed or dropped yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._when_idle: Callable[[], None] | None = None

    def started(self) -> Callable[[], None]:
        """Count one more result; call what this returns (once, more calls do nothing) when
        it is done with its files."""
        with self._lock:
            self._count += 1
        done = False

        def ended() -> None:
            nonlocal done
            with self._lock:
                if done:
                    return
                done = True
                self._count -= 1
                action = self._when_idle if self._count == 0 else None
                if action is not None:
                    self._when_idle = None
            if action is not None:
                action()

        return ended

    def close_when_idle(self, action: Callable[[], None]) -> None:
        """Run ``action`` now if no result is in flight, else when the last one ends."""
        with self._lock:
            if self._count:
                self._when_idle = action
                return
        action()

    @property
    def count(self) -> int:
        with self._lock:
            return self._count
