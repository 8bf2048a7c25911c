"""CompletedCheckpoint and the store that retains the newest N of them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from chandy.checkpoint.metadata import CheckpointMetadata, MasterState
from chandy.checkpoint.operator_state import OperatorState
from chandy.checkpoint.properties import CheckpointProperties
from chandy.errors import StorageError
from chandy.messages.checkpoint import CheckpointType
from chandy.messages.status import JobStatus
from chandy.state.handles import FileStateHandle
from chandy.storage.checkpoint_storage import CheckpointStorage, is_inside
from chandy.storage.filesystem import DEFAULT_OBJECT_STORE, ObjectStoreOptions, resolve

log = logging.getLogger(__name__)


@dataclass(eq=False)
class CompletedCheckpoint:
    """A checkpoint every task acknowledged and whose ``_metadata`` is written."""

    job_id: str
    checkpoint_id: int
    timestamp: int
    completion_timestamp: int
    operator_states: dict[str, OperatorState]
    props: CheckpointProperties
    #: The checkpoint's directory (``None`` with in-memory storage).
    external_pointer: str | None
    storage: CheckpointStorage | None = None
    master_states: list[MasterState] = field(default_factory=list)
    discarded: bool = False
    #: Set once :meth:`discard` has deleted what it deletes (or failed to).
    discard_finished: threading.Event = field(default_factory=threading.Event, repr=False)
    #: How an ``s3://`` checkpoint outside the job's storage (a claimed one) is reached.
    object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE

    @property
    def state_size(self) -> int:
        return sum(s.state_size for s in self.operator_states.values())

    @property
    def duration_ms(self) -> int:
        return self.completion_timestamp - self.timestamp

    def discard(self) -> None:
        """Delete the checkpoint's directory (its exclusive state and ``_metadata``).

        A checkpoint of this job lives in its storage's ``chk-N``. One the job was restored
        from and claimed (CLAIM mode: a retained checkpoint of another run, or a savepoint)
        lives wherever it was: then its directory and every exclusive state file it
        references go. Shared files of incremental snapshots never go here: other retained
        checkpoints may reference them, and the coordinator's ``SharedStateRegistry``
        deletes each once none does.
        """
        if self.discarded:
            return
        self.discarded = True
        try:
            if self._in_own_storage():
                assert self.storage is not None
                self.storage.discard_checkpoint(self.checkpoint_id)
            elif self.external_pointer is not None:
                object_store = self.storage.object_store if self.storage is not None else self.object_store
                discard_location(self.external_pointer, self.operator_states.values(), object_store)
        finally:
            self.discard_finished.set()

    def _in_own_storage(self) -> bool:
        storage = self.storage
        if storage is None:
            return False
        if not storage.is_persistent or self.external_pointer is None:
            return True
        own = storage.checkpoint_dir(self.checkpoint_id).rstrip("/")
        return self.external_pointer.rstrip("/") == own

    def discard_on_subsume(self) -> bool:
        if self.props.discard_subsumed:
            self.discard()
            return True
        return False

    def discard_on_shutdown(self, job_status: JobStatus) -> bool:
        if self.props.discard_on_job_end(job_status):
            self.discard()
            return True
        log.info(
            "Checkpoint %d of job %s is retained at %s (job %s).",
            self.checkpoint_id,
            self.job_id,
            self.external_pointer,
            job_status.value,
        )
        return False

    def __repr__(self) -> str:
        return f"CompletedCheckpoint({self.checkpoint_id}, {self.external_pointer})"


def discard_location(
    directory: str,
    operator_states: Iterable[OperatorState],
    object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE,
) -> None:
    """Delete a checkpoint or savepoint outside the job's storage: every exclusive state file
    it references inside its directory, then the directory with ``_metadata``. Shared files
    are the ``SharedStateRegistry``'s to delete (see :meth:`CompletedCheckpoint.discard`).

    A file the metadata places outside the directory is left, with a warning: the paths come
    from the snapshot, and a claimed snapshot must not make the job delete anything but
    itself (a crafted absolute path would otherwise name any file the job may delete).

    Best effort, as deleting the job's own checkpoints is: a failure is logged with what
    is left behind, and never fails the job.
    """
    try:
        fs, path = resolve(directory, options=object_store)
        for operator in operator_states:
            for subtask in operator.subtask_states.values():
                for handle in subtask.stream_handles():
                    if not isinstance(handle, FileStateHandle):
                        continue
                    handle_fs, handle_path = resolve(handle.path, options=object_store)
                    if not is_inside(handle_path, path):
                        log.warning(
                            "Leaving %s, which the claimed checkpoint at %s references: it is "
                            "outside that checkpoint's directory, so not the job's to delete.",
                            handle.path,
                            directory,
                        )
                        continue
                    handle_fs.delete(handle_path)
        fs.delete(path, recursive=True)
    except (OSError, StorageError) as exc:
        log.warning(
            "Could not delete the claimed checkpoint at %s; its files may be left: %s", directory, exc
        )
        return
    log.info("Deleted the claimed checkpoint at %s.", directory)


def unclaimed_properties(checkpoint_type: CheckpointType) -> CheckpointProperties:
    """A snapshot the job was restored from without claiming it (Flink's
    ``forUnclaimedSnapshot``): never subsumed away from disk, never deleted at the job's end."""
    return CheckpointProperties(
        checkpoint_type,
        forced=False,
        discard_subsumed=False,
        discard_finished=False,
        discard_cancelled=False,
        discard_failed=False,
    )


def restored_checkpoint(
    metadata: CheckpointMetadata,
    directory: str,
    props: CheckpointProperties,
    storage: CheckpointStorage | None = None,
    *,
    object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE,
) -> CompletedCheckpoint:
    """The completed checkpoint a job starts from, read from its ``_metadata``.

    ``props`` decide whether the job may delete it: :func:`unclaimed_properties` (NO_CLAIM)
    or the job's own checkpoint properties (CLAIM, and a driver restart's own checkpoints).
    ``storage`` is the job's storage when the checkpoint lies in it (a driver restart).
    """
    return CompletedCheckpoint(
        job_id=metadata.job_id,
        checkpoint_id=metadata.checkpoint_id,
        timestamp=metadata.timestamp,
        completion_timestamp=metadata.timestamp,
        operator_states={s.operator_id: s for s in metadata.operator_states},
        props=props,
        external_pointer=directory,
        storage=storage,
        master_states=list(metadata.master_states),
        object_store=storage.object_store if storage is not None else object_store,
    )


def checkpoint_type_of(metadata: CheckpointMetadata) -> CheckpointType:
    """The type ``_metadata`` records (an unknown one, from a newer chandy, counts as a savepoint)."""
    try:
        return CheckpointType(metadata.checkpoint_type)
    except ValueError:
        return CheckpointType.SAVEPOINT


class CompletedCheckpointStore:
    """Flink's ``StandaloneCompletedCheckpointStore``: the newest ``max_retained`` checkpoints."""

    def __init__(
        self, max_retained: int, io_executor: Callable[[Callable[[], object]], object] | None = None
    ) -> None:
        if max_retained < 1:
            raise ValueError(
                f"a checkpoint store must retain at least one checkpoint, "
                f"got {max_retained} (execution.checkpointing.num-retained)"
            )
        self.max_retained = max_retained
        self._checkpoints: list[CompletedCheckpoint] = []
        #: Runs the deletion of subsumed checkpoints (off the JobMaster thread in a job).
        self._io: Callable[[Callable[[], object]], object] = io_executor or (lambda action: action())

    def add_checkpoint(self, checkpoint: CompletedCheckpoint) -> list[CompletedCheckpoint]:
        """Add the newest checkpoint; returns (and discards) the ones it subsumed.

        Once appended the add has succeeded, so it must not raise: the coordinator would
        take the checkpoint for refused and discard the files of the store's latest one.
        Deleting a subsumed checkpoint is best effort, as in Flink: a failure is logged
        and leaves its files behind.
        """
        self._checkpoints.append(checkpoint)
        subsumed = []
        while len(self._checkpoints) > self.max_retained:
            oldest = self._checkpoints.pop(0)
            subsumed.append(oldest)
            try:
                self._io(oldest.discard_on_subsume)
            except Exception:  # see the docstring
                log.warning(
                    "Could not discard subsumed checkpoint %d of job %s; its files may be left at %s.",
                    oldest.checkpoint_id,
                    oldest.job_id,
                    oldest.external_pointer,
                    exc_info=True,
                )
        return subsumed

    def get_latest_checkpoint(self) -> CompletedCheckpoint | None:
        return self._checkpoints[-1] if self._checkpoints else None

    def get_all_checkpoints(self) -> list[CompletedCheckpoint]:
        """Oldest first."""
        return list(self._checkpoints)

    @property
    def number_of_retained_checkpoints(self) -> int:
        return len(self._checkpoints)

    def shutdown(self, job_status: JobStatus) -> None:
        """The job ended: discard what the retention policy does not keep."""
        for checkpoint in self._checkpoints:
            checkpoint.discard_on_shutdown(job_status)
        self._checkpoints.clear()
