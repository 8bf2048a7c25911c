"""SharedStateRegistry: which retained checkpoints reference which shared state files.

Flink's ``SharedStateRegistryImpl``. An incremental snapshot (the RocksDB backend's native
checkpoint) uploads each SST file once into the job's ``shared/`` directory and every
later checkpoint of the same backend that still contains the file references it again
(:meth:`OperatorSubtaskState.shared_handles`). Such a file belongs to no single checkpoint:
deleting it with the checkpoint that uploaded it would break every later one. The
registry holds, per shared file, the set of retained checkpoints that reference it:

- :meth:`register_checkpoint` when a checkpoint completes (before its ``_metadata`` is
  written), and for the checkpoints a job takes over at its start that it may delete: a
  CLAIM restore and a driver restart's own retained checkpoints. Never for a savepoint
  (every file it needs is its own, in its own directory) nor for a checkpoint restored in
  NO_CLAIM mode (the job never deletes anything of it, so nothing of it may be counted).
- :meth:`unregister_checkpoint` when a registered checkpoint is discarded: subsumed, or
  at the job's end when the retention policy does not keep it. It returns the files no
  registered checkpoint references any more; the coordinator deletes exactly those. A
  checkpoint that is kept (retained after the job, or subsumed without being deleted)
  stays registered, so its files are never returned.
- :meth:`hold_base` when a checkpoint is triggered that names a base (the latest completed
  checkpoint, ``CheckpointOptions.base_checkpoint_id``: the one checkpoint whose files its
  tasks may reference), :meth:`release_base` when it completes (after it is registered) or
  aborts. A base unregistered meanwhile (subsumed) keeps its references until the last
  checkpoint naming it is released: a task may reference its files without having heard
  that a newer checkpoint completed, and they must not be deleted under it.

Exclusive state (keyed and operator state streams, an incremental snapshot's private
files) is not counted: it lives in the checkpoint's own ``chk-N`` directory and goes with
it. Inline shared handles (in-memory checkpoint storage) are not counted either: there is
no file to delete. A file no completed checkpoint ever referenced (the upload of a task
killed half-way) never reaches the registry; the coordinator tidies such files out of
``shared/`` when the job ends.

A checkpoint that references a shared file the registry does not know, and that it did
not upload itself, cannot be registered (:class:`UnknownSharedStateError`): the file was
uploaded by a checkpoint that never completed, or was deleted because no retained
checkpoint referenced it any more (a task reused the files of a checkpoint other than its
barrier's base). Completing it would leave a checkpoint that cannot be restored; the
checkpoint fails instead, like Flink's "Attempt to reference unknown state".
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence

from chandy.checkpoint.operator_state import OperatorState
from chandy.errors import StorageError
from chandy.state.handles import FileStateHandle
from chandy.storage.checkpoint_storage import is_inside
from chandy.storage.filesystem import DEFAULT_OBJECT_STORE, ObjectStoreOptions, resolve

log = logging.getLogger(__name__)


class UnknownSharedStateError(Exception):
    """A checkpoint references a shared file no registered checkpoint holds (see the module)."""


class SharedStateRegistry:
    """Reference sets of shared state files over the registered checkpoints."""

    def __init__(self) -> None:
        #: shared file path -> ids of the registered checkpoints that reference it
        self.references: dict[str, set[int]] = {}
        #: shared file path -> its handle (what is returned for deletion)
        self._handles: dict[str, FileStateHandle] = {}
        #: registered checkpoint id -> the shared file paths it references
        self._by_checkpoint: dict[int, frozenset[str]] = {}
        #: pending checkpoint id -> the completed checkpoint its tasks may reuse files of
        self._bases: dict[int, int] = {}
        #: Unregistered checkpoints that a pending checkpoint names as its base: their
        #: references stay counted until the last such pending checkpoint is released.
        self._deferred: set[int] = set()

    @property
    def registered_checkpoints(self) -> set[int]:
        """The ids of the checkpoints registered now (with shared files or without); not the
        unregistered bases whose files are kept for a pending checkpoint."""
        return set(self._by_checkpoint) - self._deferred

    @property
    def deferred_checkpoints(self) -> set[int]:
        """Unregistered checkpoints whose files are kept because a pending checkpoint names
        them as its base."""
        return set(self._deferred)

    def register_checkpoint(
        self, checkpoint_id: int, operator_states: Iterable[OperatorState], *, restored: bool = False
    ) -> None:
        """Count the shared files of checkpoint ``checkpoint_id``; all or nothing.

        Registering the same checkpoint again adds what it did not hold yet (a repeated
        call changes nothing). ``restored``: a checkpoint the job takes over at its start;
        its files were uploaded by checkpoints this registry never saw, so every one is
        taken as known.

        Raises :class:`UnknownSharedStateError` (nothing registered) if it references a
        shared file that is neither registered nor uploaded by this checkpoint.
        """
        shared: dict[str, FileStateHandle] = {}
        uploaded: set[str] = set()
        for operator_state in operator_states:
            for subtask_state in operator_state.subtask_states.values():
                for handle in subtask_state.shared_handles():
                    if isinstance(handle, FileStateHandle):
                        shared[handle.path] = handle
                uploaded.update(
                    h.path for h in subtask_state.uploaded_handles() if isinstance(h, FileStateHandle)
                )
        if not restored:
            unknown = sorted(p for p in shared if p not in self.references and p not in uploaded)
            if unknown:
                raise UnknownSharedStateError(
                    f"checkpoint {checkpoint_id} references {len(unknown)} shared state file(s) "
                    f"that no retained checkpoint holds, e.g. {unknown[0]}: they belonged to a "
                    "checkpoint that was aborted or subsumed and may be deleted, so this "
                    "checkpoint could not be restored. It fails; the next one uploads them anew."
                )
        for path, handle in shared.items():
            self.references.setdefault(path, set()).add(checkpoint_id)
            self._handles.setdefault(path, handle)
        self._by_checkpoint[checkpoint_id] = self._by_checkpoint.get(checkpoint_id, frozenset()) | frozenset(
            shared
        )

    def unregister_checkpoint(self, checkpoint_id: int) -> list[FileStateHandle]:
        """Forget a discarded checkpoint; returns the shared files (sorted by path) that no
        registered checkpoint references any more: the caller deletes them. A checkpoint
        that was never registered returns nothing. The base of a pending checkpoint is
        forgotten only once that checkpoint is released (:meth:`release_base` returns its
        files then): until then nothing of it is returned."""
        if checkpoint_id in self._bases.values() and checkpoint_id in self._by_checkpoint:
            self._deferred.add(checkpoint_id)
            return []
        return self._forget(checkpoint_id)

    def hold_base(self, checkpoint_id: int, base_checkpoint_id: int) -> None:
        """Pending checkpoint ``checkpoint_id`` may reference the shared files of completed
        checkpoint ``base_checkpoint_id``: none of them is returned for deletion before
        :meth:`release_base` (``checkpoint_id``)."""
        self._bases[checkpoint_id] = base_checkpoint_id

    def release_base(self, checkpoint_id: int) -> list[FileStateHandle]:
        """Checkpoint ``checkpoint_id`` completed (and was registered first) or aborted: if its
        base was unregistered meanwhile and no other pending checkpoint names it, forget it
        now and return the shared files no registered checkpoint references any more."""
        base = self._bases.pop(checkpoint_id, None)
        if base is None or base not in self._deferred or base in self._bases.values():
            return []
        self._deferred.discard(base)
        return self._forget(base)

    def base_of(self, checkpoint_id: int) -> int | None:
        """The base pending checkpoint ``checkpoint_id`` holds, if any."""
        return self._bases.get(checkpoint_id)

    def _forget(self, checkpoint_id: int) -> list[FileStateHandle]:
        unused = []
        for path in sorted(self._by_checkpoint.pop(checkpoint_id, frozenset())):
            holders = self.references[path]
            holders.discard(checkpoint_id)
            if not holders:
                del self.references[path]
                unused.append(self._handles.pop(path))
        return unused


def delete_shared_files(
    handles: Sequence[FileStateHandle],
    job_id: str,
    why: str,
    roots: Collection[str],
    object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE,
) -> None:
    """Delete shared state files no retained checkpoint references (``why`` says how that
    came about, for the log); best effort: a file that cannot be deleted is logged (and left
    behind), the others still go.

    Only files inside one of ``roots`` (the ``shared/`` directories of the job and of the
    checkpoints it claimed) are deleted: a path comes from a checkpoint's metadata, and a
    crafted one must not make the job delete a file anywhere else. Others are left, with a
    warning."""
    if not handles:
        return
    failed = 0
    for handle in handles:
        if not any(is_inside(handle.path, root) for root in roots):
            failed += 1
            log.warning(
                "Job %s leaves shared state file %s: it is outside the shared/ directories the "
                "job may delete from (%s).",
                job_id,
                handle.path,
                ", ".join(sorted(roots)) or "none",
            )
            continue
        try:
            fs, path = resolve(handle.path, options=object_store)
            fs.delete(path)
        except (OSError, StorageError) as exc:
            failed += 1
            log.warning("Could not delete shared state file %s of job %s: %s", handle.path, job_id, exc)
    log.info(
        "Deleted %d shared state file(s) of job %s: %s%s.",
        len(handles) - failed,
        job_id,
        why,
        f"; {failed} could not be deleted" if failed else "",
    )
