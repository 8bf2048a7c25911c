"""The task mailbox: control actions run on the task thread, between batches.

Anything that must touch a task's operators from outside (trigger a checkpoint,
notify that one completed, cancel) is put into the mailbox as a :class:`Mail`;
the task thread runs it between two batches. Record processing and control
therefore never interleave, and operators need no locks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from chandy.network.wakeup import Wakeup


@dataclass(frozen=True, slots=True)
class Mail:
    action: Callable[[], None]
    description: str


class Mailbox:
    """Mails for one task, taken in arrival order by the task thread."""

    __slots__ = ("_mails", "_wakeup")

    def __init__(self, wakeup: Wakeup) -> None:
        self._mails: deque[Mail] = deque()
        self._wakeup = wakeup

    def put(self, action: Callable[[], None], description: str) -> None:
        """Queue ``action`` for the task thread (callable from any thread)."""
        self._mails.append(Mail(action, description))
        self._wakeup.signal()

    def try_take(self) -> Mail | None:
        try:
            return self._mails.popleft()
        except IndexError:
            return None

    def has_mail(self) -> bool:
        return bool(self._mails)
