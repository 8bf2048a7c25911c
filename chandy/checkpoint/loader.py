"""Finding and reading a retained checkpoint or savepoint for a restore."""

from __future__ import annotations

from chandy.checkpoint.metadata import MAX_METADATA_BYTES, CheckpointMetadata, deserialize
from chandy.errors import InvalidCheckpointError, StorageError
from chandy.state.handles import FileStateHandle, StreamStateHandle
from chandy.storage.checkpoint_storage import CHECKPOINT_DIR_PREFIX, METADATA_FILE_NAME
from chandy.storage.filesystem import DEFAULT_OBJECT_STORE, ObjectStoreOptions, resolve
from chandy.storage.snapshot_key import SnapshotKey


def load_checkpoint_metadata(
    pointer: str,
    key: SnapshotKey | None,
    *,
    trust: bool = False,
    object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE,
) -> tuple[CheckpointMetadata, str]:
    """The metadata of the checkpoint at ``pointer`` (a chk-N / savepoint directory or its
    ``_metadata`` file) and its directory. Every way it can be unusable is a clear error.

    ``_metadata`` must be signed with ``key`` (checked before it is parsed), else it is
    refused with :class:`~chandy.errors.UntrustedCheckpointError`, unless ``trust``
    (``execution.state-recovery.trust-snapshot``). ``object_store``: how an ``s3://`` pointer
    is reached."""
    try:
        fs, path = resolve(pointer, options=object_store)
    except StorageError as exc:
        raise InvalidCheckpointError(f"cannot restore from '{pointer}': {exc}") from None
    if path.rstrip("/").endswith("/" + METADATA_FILE_NAME):
        directory = path.rstrip("/").rsplit("/", 1)[0]
        metadata_path = path
    else:
        directory = path.rstrip("/")
        metadata_path = fs.join(directory, METADATA_FILE_NAME)
    try:
        if not fs.exists(directory):
            raise InvalidCheckpointError(
                f"cannot restore from '{pointer}': {directory} does not exist. Check the path "
                "(execution.state-recovery.path / env.set_restore_path)."
            )
        if not fs.exists(metadata_path):
            hint = ""
            if fs.is_dir(directory):
                complete = [
                    n
                    for n in fs.list_dir(directory)
                    if n.startswith(CHECKPOINT_DIR_PREFIX)
                    and fs.exists(fs.join(directory, n, METADATA_FILE_NAME))
                ]
                if complete:
                    hint = (
                        " It looks like a job's checkpoint directory: restore from one of its "
                        f"complete checkpoints, e.g. {fs.join(directory, complete[-1])}."
                    )
            raise InvalidCheckpointError(
                f"cannot restore from '{pointer}': {metadata_path} does not exist, so this is not "
                "a complete checkpoint (it was still being written, or was aborted)." + hint
            )
        size = fs.size(metadata_path)
        if size > MAX_METADATA_BYTES:
            raise InvalidCheckpointError(
                f"{metadata_path} is {size} bytes, more than a _metadata file can be "
                f"({MAX_METADATA_BYTES}): it is not one. Restore from another checkpoint."
            )
        data = fs.read(metadata_path)
    except InvalidCheckpointError:
        raise
    except OSError as exc:
        raise InvalidCheckpointError(f"cannot read {metadata_path}: {exc}") from None
    metadata = deserialize(data, metadata_path, directory, key=key, trust=trust)
    check_state_files(metadata, metadata_path, object_store)
    return metadata, directory


def check_state_files(
    metadata: CheckpointMetadata, source: str, object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE
) -> None:
    """Every state file the checkpoint references exists with its recorded size: its own
    files and the shared files of incremental snapshots (in the job's ``shared/``).

    A cheap check (no file is read) that turns a deleted or truncated file into a
    clear error before anything runs; contents are verified against their
    SHA-256 when a task reads them.
    """
    for operator in metadata.operator_states:
        for subtask in operator.subtask_states.values():
            for handle in subtask.stream_handles():
                _check_file(handle, source, object_store, shared=False)
            for handle in subtask.shared_handles():
                _check_file(handle, source, object_store, shared=True)


def _check_file(
    handle: StreamStateHandle, source: str, object_store: ObjectStoreOptions, *, shared: bool
) -> None:
    if not isinstance(handle, FileStateHandle):
        return
    what = "shared state file" if shared else "state file"
    fs, path = resolve(handle.path, options=object_store)
    try:
        size = fs.size(path)
    except FileNotFoundError:
        cause = (
            "it lives in the job directory's shared/ (several checkpoints reference it), which "
            "was deleted, or the checkpoint was moved without its job directory"
            if shared
            else "the checkpoint was partly deleted or moved without its files"
        )
        raise InvalidCheckpointError(
            f"{what} {handle.path} referenced by {source} is missing: {cause}. Restore from "
            "another checkpoint."
        ) from None
    except OSError as exc:
        raise InvalidCheckpointError(f"cannot check {what} {handle.path}: {exc}") from None
    if size != handle.size:
        raise InvalidCheckpointError(
            f"{what} {handle.path} referenced by {source} is corrupt: it has "
            f"{size} bytes, the checkpoint recorded {handle.size}. Restore from "
            "another checkpoint."
        )
