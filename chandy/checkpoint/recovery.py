"""What a job starts from: its own checkpoints after a driver restart, or a path the user gave.

Driver restart is Flink's application-mode high availability, over the checkpoint
directory instead of ZooKeeper. Flink keeps the completed checkpoints' pointers and
the checkpoint id counter in its HA store, so a JobManager that comes back under the
same job id finds them. chandy's checkpoint directory already is such a store:
``<execution.checkpointing.dir>/<job-id>/chk-N/_metadata`` is written last and
atomically, only for completed checkpoints. A job submitted with a fixed job id
(``$internal.pipeline.job-id``) therefore looks there first (:func:`find_job_checkpoints`):

- every ``chk-N`` with a valid ``_metadata`` (signed with the deployment's snapshot key,
  state files present with their recorded sizes) is one of its completed checkpoints; the newest is restored,
  and they all join the completed-checkpoint store as the job's own (subsumed and
  deleted like any checkpoint it took, Flink's CLAIM);
- a ``chk-N`` whose ``_metadata`` is corrupt or not authenticated by the key (unsigned,
  another key's, modified: whoever could write there is not trusted to choose what the
  job unpickles), or whose state files are missing or truncated, is skipped with a warning
  naming it and why, and left on disk for inspection;
- a ``chk-N`` without ``_metadata`` is a checkpoint the dead driver never completed:
  nothing references its files, so they are deleted;
- checkpoint ids continue after the highest ``N`` on disk, complete or not, so an id
  is never used twice in the directory.

Found checkpoints take precedence over ``execution.state-recovery.path``, as Flink's
HA store does over ``execution.savepoint.path``: the path is where the job first
started, the checkpoints are how far it got since.

A restore from a path (:func:`restore_from_path`) follows ``execution.state-recovery.claim-mode``:
NO_CLAIM (the default) never deletes the snapshot; CLAIM makes it the job's own.

Either way the snapshot must be signed with the deployment's snapshot key
(:mod:`chandy.storage.snapshot_key`), or trusted deliberately with
``execution.state-recovery.trust-snapshot``; see docs/security.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from chandy.checkpoint.completed_checkpoint import (
    CompletedCheckpoint,
    checkpoint_type_of,
    restored_checkpoint,
    unclaimed_properties,
)
from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.checkpoint.metadata import CheckpointMetadata
from chandy.checkpoint.properties import CheckpointProperties
from chandy.config import Configuration
from chandy.config.options import PipelineOptions, RecoveryClaimMode, StateRecoveryOptions
from chandy.errors import InvalidCheckpointError
from chandy.messages.checkpoint import CheckpointType
from chandy.storage.checkpoint_storage import METADATA_FILE_NAME, CheckpointStorage
from chandy.storage.filesystem import DEFAULT_OBJECT_STORE, ObjectStoreOptions
from chandy.storage.snapshot_key import SnapshotKey

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FoundCheckpoint:
    """A completed checkpoint of the job found on disk."""

    metadata: CheckpointMetadata
    directory: str


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A ``chk-N`` that has a ``_metadata`` but cannot be restored, and why."""

    checkpoint_id: int
    directory: str
    reason: str


@dataclass(frozen=True)
class JobCheckpoints:
    """What a job's checkpoint directory holds, for a job submitted again under its id."""

    job_dir: str
    #: Restorable checkpoints, oldest first.
    completed: tuple[FoundCheckpoint, ...]
    #: ``chk-N`` directories without ``_metadata``: never completed.
    incomplete: tuple[int, ...]
    skipped: tuple[SkippedCheckpoint, ...]
    #: The highest ``N`` of any ``chk-N`` on disk (0: none).
    highest_id: int

    @property
    def latest(self) -> FoundCheckpoint | None:
        return self.completed[-1] if self.completed else None

    @property
    def next_checkpoint_id(self) -> int:
        """The id the job's next checkpoint gets: never one that exists on disk."""
        return self.highest_id + 1


def find_job_checkpoints(storage: CheckpointStorage, *, trust: bool = False) -> JobCheckpoints:
    """Every ``chk-N`` in the job's checkpoint directory, sorted into restorable,
    incomplete and unusable ones (each unusable one is logged as a warning). A ``chk-N``
    must be signed with the storage's key (:meth:`CheckpointStorage.signing_key`), unless
    ``trust`` (``execution.state-recovery.trust-snapshot``)."""
    key = storage.signing_key()
    fs = storage.fs
    completed: list[FoundCheckpoint] = []
    incomplete: list[int] = []
    skipped: list[SkippedCheckpoint] = []
    ids = storage.checkpoint_ids_on_disk()
    for checkpoint_id in ids:
        directory = storage.checkpoint_dir(checkpoint_id)
        if not fs.exists(fs.join(directory, METADATA_FILE_NAME)):
            incomplete.append(checkpoint_id)
            continue
        try:
            metadata, found_dir = load_checkpoint_metadata(
                directory, key, trust=trust, object_store=storage.object_store
            )
            if metadata.job_id != storage.job_id:
                raise InvalidCheckpointError(
                    f"{directory} is a checkpoint of job {metadata.job_id}, not of job {storage.job_id}"
                )
            if metadata.checkpoint_id != checkpoint_id:
                raise InvalidCheckpointError(
                    f"{directory} holds checkpoint {metadata.checkpoint_id}, not {checkpoint_id}"
                )
        except InvalidCheckpointError as exc:
            log.warning(
                "Job %s: skipping checkpoint %d at %s, it cannot be restored: %s",
                storage.job_id,
                checkpoint_id,
                directory,
                exc,
            )
            skipped.append(SkippedCheckpoint(checkpoint_id, directory, str(exc)))
            continue
        completed.append(FoundCheckpoint(metadata, found_dir))
    return JobCheckpoints(
        storage.job_dir, tuple(completed), tuple(incomplete), tuple(skipped), max(ids, default=0)
    )


def adopt_job_checkpoints(
    found: JobCheckpoints, storage: CheckpointStorage, props: CheckpointProperties
) -> list[CompletedCheckpoint]:
    """The found checkpoints as the job's own (oldest first), with ``props`` deciding their
    deletion as for checkpoints it takes; the incomplete ones' directories are deleted."""
    for checkpoint_id in found.incomplete:
        log.info(
            "Job %s: deleting what is left of checkpoint %d, which never completed.",
            storage.job_id,
            checkpoint_id,
        )
        storage.discard_checkpoint(checkpoint_id)
    return [restored_checkpoint(c.metadata, c.directory, props, storage) for c in found.completed]


def restore_from_path(
    path: str,
    claim_mode: RecoveryClaimMode,
    job_props: CheckpointProperties | None,
    key: SnapshotKey | None,
    *,
    trust: bool = False,
    object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE,
) -> tuple[CompletedCheckpoint, CheckpointType]:
    """The checkpoint or savepoint at ``path`` (``execution.state-recovery.path``) as the job
    will hold it, and its type. CLAIM gives it the job's checkpoint properties ``job_props``
    (deleted once subsumed, or at the job's end as retention says: even a savepoint);
    NO_CLAIM, or a job without checkpoints (``job_props`` ``None``), properties that never
    delete it. A clear error if it cannot be used, and
    :class:`~chandy.errors.UntrustedCheckpointError` if ``key`` does not authenticate it
    (unless ``trust``)."""
    metadata, directory = load_checkpoint_metadata(path, key, trust=trust, object_store=object_store)
    kind = checkpoint_type_of(metadata)
    if claim_mode is RecoveryClaimMode.CLAIM and job_props is not None:
        props = job_props
    else:
        props = unclaimed_properties(kind)
    return restored_checkpoint(metadata, directory, props, object_store=object_store), kind


@dataclass(frozen=True)
class StartingPoint:
    """The checkpoint a job starts from, and what its coordinator takes over with it."""

    checkpoint: CompletedCheckpoint
    #: Checkpoints for the completed store, oldest first; the restored one is the last.
    to_store: tuple[CompletedCheckpoint, ...]
    #: The id the job's first checkpoint gets.
    next_checkpoint_id: int
    is_savepoint: bool
    #: Found in the job's own checkpoint directory (a driver restart), not given as a path.
    is_driver_restart: bool


def choose_starting_point(
    config: Configuration,
    storage: CheckpointStorage | None,
    job_props: CheckpointProperties | None,
    key: SnapshotKey | None,
) -> StartingPoint | None:
    """Where a job starts: its own latest checkpoint when it was submitted again under its
    fixed job id, else ``execution.state-recovery.path`` if set, else nothing (a fresh start).

    ``job_props`` are the properties of the job's checkpoints (``None`` without
    checkpointing: nothing the job starts from can then be deleted by it). ``key`` is the
    deployment's snapshot key (:func:`chandy.storage.snapshot_key.snapshot_key`), which must
    authenticate what the job starts from unless ``execution.state-recovery.trust-snapshot``.
    """
    path = config.get(StateRecoveryOptions.PATH)
    trust = config.get(StateRecoveryOptions.TRUST_SNAPSHOT)
    if config.get(PipelineOptions.FIXED_JOB_ID) is not None:
        own = _own_latest_checkpoint(storage, job_props, trust)
        if own is not None:
            if path is not None:
                log.info(
                    "Job %s resumes from its own checkpoint %d, not from "
                    "execution.state-recovery.path %s: it got further than where it first started.",
                    own.checkpoint.job_id,
                    own.checkpoint.checkpoint_id,
                    path,
                )
            return own
    if path is None:
        return None
    checkpoint, kind = restore_from_path(
        path,
        config.get(StateRecoveryOptions.CLAIM_MODE),
        job_props,
        key,
        trust=trust,
        object_store=storage.object_store
        if storage is not None
        else ObjectStoreOptions.from_configuration(config),
    )
    return StartingPoint(
        checkpoint,
        (checkpoint,),
        checkpoint.checkpoint_id + 1,
        kind.is_savepoint,
        is_driver_restart=False,
    )


def _own_latest_checkpoint(
    storage: CheckpointStorage | None, job_props: CheckpointProperties | None, trust: bool
) -> StartingPoint | None:
    """The job's latest checkpoint in its own directory (a driver restart), or ``None``."""
    if storage is None or not storage.is_persistent or job_props is None:
        log.warning(
            "Job %s has a fixed job id but no checkpoints on persistent storage: if its driver "
            "dies, a resubmission starts from the beginning. Enable checkpointing with "
            "execution.checkpointing.dir on storage that outlives the driver.",
            storage.job_id if storage is not None else "?",
        )
        return None
    found = find_job_checkpoints(storage, trust=trust)
    if found.latest is None:
        if found.highest_id:
            log.warning(
                "Job %s: %s holds no restorable checkpoint (%d incomplete, %d unusable); it "
                "starts from the beginning.",
                storage.job_id,
                found.job_dir,
                len(found.incomplete),
                len(found.skipped),
            )
        return None
    owned = adopt_job_checkpoints(found, storage, job_props)
    latest = owned[-1]
    log.info(
        "Job %s was submitted again: it resumes from its checkpoint %d at %s (%d restorable, "
        "%d incomplete deleted, %d unusable skipped); checkpoint ids continue at %d.",
        storage.job_id,
        latest.checkpoint_id,
        latest.external_pointer,
        len(owned),
        len(found.incomplete),
        len(found.skipped),
        found.next_checkpoint_id,
    )
    return StartingPoint(
        latest, tuple(owned), found.next_checkpoint_id, is_savepoint=False, is_driver_restart=True
    )
