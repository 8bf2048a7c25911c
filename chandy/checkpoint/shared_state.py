"""SharedStateRegistry: which completed checkpoints reference which state files.

Every completed checkpoint registers its state handles here. Today every
handle is exclusive to one checkpoint (it lives in that checkpoint's ``chk-N``
directory); incremental snapshots will put files in ``shared/`` that several
checkpoints reference, and this registry's reference counts decide when such
a file may be deleted.
"""

from __future__ import annotations

from collections.abc import Iterable

from chandy.checkpoint.operator_state import OperatorState
from chandy.state.handles import ByteStreamStateHandle, FileStateHandle, StreamStateHandle


def _key(handle: StreamStateHandle) -> str:
    if isinstance(handle, FileStateHandle):
        return handle.path
    if isinstance(handle, ByteStreamStateHandle):
        return f"inline:{handle.name}"
    raise TypeError(handle)


class SharedStateRegistry:
    def __init__(self) -> None:
        #: handle key -> ids of the checkpoints that reference it
        self.references: dict[str, set[int]] = {}
        #: how often each handle was registered (once per referencing checkpoint)
        self.registrations: dict[str, int] = {}

    def register_all(self, operator_states: Iterable[OperatorState], checkpoint_id: int) -> None:
        for operator_state in operator_states:
            for subtask_state in operator_state.subtask_states.values():
                for handle in subtask_state.stream_handles():
                    key = _key(handle)
                    holders = self.references.setdefault(key, set())
                    if checkpoint_id not in holders:
                        holders.add(checkpoint_id)
                        self.registrations[key] = self.registrations.get(key, 0) + 1

    def unregister_checkpoint(self, checkpoint_id: int) -> list[str]:
        """Forget a discarded checkpoint; returns the keys no checkpoint references any more."""
        unused = []
        for key, holders in list(self.references.items()):
            holders.discard(checkpoint_id)
            if not holders:
                del self.references[key]
                unused.append(key)
        return unused
