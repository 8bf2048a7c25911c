"""Master hooks: state that lives on the JobMaster side of a checkpoint.

Flink's ``MasterTriggerRestoreHook``. A hook is asked for its state when a
checkpoint is triggered, before any task is; its bytes go into ``_metadata``
and come back through :meth:`MasterTriggerRestoreHook.restore_checkpoint` on
restore. A continuous file source's directory listing, or a split
enumerator's assignments, are such state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future


class MasterTriggerRestoreHook(ABC):
    @abstractmethod
    def get_identifier(self) -> str:
        """Unique among the job's hooks, stable across runs (state is restored by it)."""

    @abstractmethod
    def trigger_checkpoint(self, checkpoint_id: int, timestamp: int) -> Future[bytes | None] | None:
        """The hook's state for this checkpoint; ``None`` (or a future of ``None``) for none.
        A future that fails aborts the checkpoint (TRIGGER_CHECKPOINT_FAILURE)."""

    @abstractmethod
    def restore_checkpoint(self, checkpoint_id: int, data: bytes | None) -> None:
        """Restore the state the hook gave for ``checkpoint_id`` (``None``: it gave none)."""
