"""The task mailbox: control actions run on the task thread, between batches.

Anything that must touch a task's operators from outside (trigger a checkpoint,
notify that one completed, cancel) is put into the mailbox as a :class:`Mail`;
the task thread runs it between two batches. Record processing and control
therefore never interleave, and operators need no locks.

When the task ends, the mailbox closes: mails still queued, and mails put
afterwards, are handed to their ``on_drop`` instead (a checkpoint trigger that
can no longer run is declined, not silently lost).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from chandy.network.wakeup import Wakeup


@dataclass(frozen=True, slots=True)
class Mail:
    action: Callable[[], None]
    description: str
    on_drop: Callable[[], None] | None = None

    def drop(self) -> None:
        if self.on_drop is not None:
            self.on_drop()


class Mailbox:
    """Mails for one task, taken in arrival order by the task thread."""

    __slots__ = ("_mails", "_wakeup", "_lock", "_closed")

    def __init__(self, wakeup: Wakeup) -> None:
        self._mails: deque[Mail] = deque()
        self._wakeup = wakeup
        self._lock = threading.Lock()
        self._closed = False

    def put(
        self, action: Callable[[], None], description: str, on_drop: Callable[[], None] | None = None
    ) -> None:
        """Queue ``action`` for the task thread (callable from any thread)."""
        mail = Mail(action, description, on_drop)
        with self._lock:
            if not self._closed:
                self._mails.append(mail)
                mail = None  # type: ignore[assignment]
        if mail is not None:
            mail.drop()
            return
        self._wakeup.signal()

    def try_take(self) -> Mail | None:
        try:
            return self._mails.popleft()
        except IndexError:
            return None

    def has_mail(self) -> bool:
        return bool(self._mails)

    def size(self) -> int:
        return len(self._mails)

    def close(self) -> None:
        """No more mails run: drop what is queued and whatever comes later."""
        with self._lock:
            self._closed = True
            left, self._mails = list(self._mails), deque()
        for mail in left:
            mail.drop()
