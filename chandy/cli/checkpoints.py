"""``chandy checkpoint inspect | list``: what a retained checkpoint or savepoint holds, without running it.

Both read ``_metadata`` through :mod:`chandy.checkpoint.metadata`, the reader a restore
uses, so a checkpoint this command calls valid is one a restore accepts, and one it
refuses (bad checksum, truncated, unknown version) is refused with the same reason.

Neither unpickles anything: the body is JSON, parsed with the restore's bounds. The
signature is reported as what it is: checked with ``CHANDY_SNAPSHOT_KEY``, ``--key-file``,
or else the ``.chandy-snapshot-key`` found in the storage root above the snapshot (named in
the report: that one is only as trustworthy as the directory). A checksum that matches
says the file is intact, not who wrote it; the signature line says that.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass, field

import click

from chandy.checkpoint.metadata import (
    MAX_METADATA_BYTES,
    Authentication,
    CheckpointMetadata,
    authenticate,
    key_id_of,
    parse,
)
from chandy.checkpoint.operator_state import OperatorState
from chandy.cli.errors import CliError
from chandy.config import Configuration
from chandy.errors import InvalidCheckpointError, StorageError
from chandy.state.handles import FileStateHandle, IncrementalKeyedStateHandle
from chandy.state.key_groups import KeyGroupRange
from chandy.storage.checkpoint_storage import CHECKPOINT_DIR_PREFIX, METADATA_FILE_NAME
from chandy.storage.filesystem import FileSystem, resolve
from chandy.storage.snapshot_key import KEY_ENV_VAR, KEY_FILE_NAME, SnapshotKey, read_key_file, snapshot_key

#: Directory names of snapshots: Flink's ``chk-<id>`` and ``savepoint-<job id prefix>-<random>``.
_SNAPSHOT_DIR = re.compile(r"^(chk-\d+|savepoint-.+)$")
#: Where ``_metadata`` keeps its format version: after the 8 magic bytes, 4 bytes big-endian.
_VERSION_OFFSET = 8


# ---------------------------------------------------------------------- the report


@dataclass
class StateFile:
    """A state file ``_metadata`` references, and what was found on disk."""

    path: str
    size: int
    #: "present", "missing", "size mismatch (N bytes on disk)", "checksum mismatch"
    status: str
    #: A shared file of an incremental snapshot (in the job directory's ``shared/``, referenced
    #: by other checkpoints too), not one of this checkpoint's own.
    shared: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "present"


@dataclass
class OperatorStateSummary:
    """One named operator (non-keyed) state of a subtask: how it is redistributed, how many elements."""

    mode: str
    elements: int


@dataclass
class SubtaskReport:
    index: int
    #: False for a subtask the checkpoint holds no state of.
    has_state: bool
    finished: bool
    #: Inclusive ``[start, end]`` key-group ranges of its keyed state (for a keyed operator's
    #: subtask without state: the range it owned).
    key_groups: list[list[int]]
    state_size: int
    operator_states: dict[str, OperatorStateSummary]
    #: Shared and private files of its incremental (RocksDB native) keyed state; 0 and 0 for
    #: keyed state written as key-group streams.
    shared_files: int = 0
    private_files: int = 0
    #: In-flight data of an unaligned checkpoint (on a task's head operator): bytes per input
    #: channel index, for the channels whose barrier overtook data.
    channel_state: dict[int, int] = field(default_factory=dict)


@dataclass
class OperatorReport:
    operator_id: str
    uid: str | None
    name: str | None
    parallelism: int
    max_parallelism: int
    state_size: int
    #: ``state name -> kind`` of its keyed state, when the checkpoint recorded them.
    keyed_states: dict[str, str]
    subtasks: list[SubtaskReport]


@dataclass
class CheckpointReport:
    path: str
    metadata_file: str
    checkpoint_id: int
    checkpoint_type: str
    #: A savepoint's format (CANONICAL / NATIVE); ``None`` for a checkpoint.
    savepoint_format: str | None
    job_id: str
    timestamp: int
    format_version: int
    checksum: str
    #: What the signature says (see :class:`Authentication`): "valid", "unsigned", "other key",
    #: "modified", "no key" (signed, but no key to check it with).
    authentication: str
    #: The signature line, with the key it was checked with.
    signature: str
    state_size: int
    inline_handles: int
    master_states: list[str]
    operators: list[OperatorReport]
    state_files: list[StateFile] = field(default_factory=list)

    @property
    def in_flight_bytes(self) -> int:
        """Bytes of channel state (in-flight data of an unaligned checkpoint) in the snapshot."""
        return sum(sum(sub.channel_state.values()) for op in self.operators for sub in op.subtasks)

    @property
    def broken_files(self) -> list[StateFile]:
        return [f for f in self.state_files if not f.ok]

    @property
    def refused(self) -> bool:
        """A restore with the key it was checked with refuses it (without trust-snapshot)."""
        return self.authentication in (
            Authentication.UNSIGNED.value,
            Authentication.OTHER_KEY.value,
            Authentication.MODIFIED.value,
        )


# ---------------------------------------------------------------------- reading


def _locate(path: str) -> tuple[FileSystem, str, str]:
    """The filesystem, the snapshot's directory and its ``_metadata`` path, for a directory or the file."""
    try:
        fs, resolved = resolve(path)
    except StorageError as exc:
        raise CliError(str(exc)) from None
    resolved = resolved.rstrip("/") or "/"
    if resolved.endswith("/" + METADATA_FILE_NAME) or resolved == METADATA_FILE_NAME:
        directory = resolved.rsplit("/", 1)[0] if "/" in resolved else "."
        return fs, directory, resolved
    return fs, resolved, fs.join(resolved, METADATA_FILE_NAME)


def _key_for(fs: FileSystem, directory: str, key_file: str | None) -> SnapshotKey | None:
    """The key to check a signature with: ``CHANDY_SNAPSHOT_KEY``, ``key_file``, or the key
    file in the storage root above ``directory`` (its parent: a savepoint directory; its
    grandparent: ``<root>/<job id>/chk-N``), if there is one."""
    if key_file is not None:
        try:
            return read_key_file(key_file)
        except StorageError as exc:
            raise CliError(str(exc)) from None
    try:
        key = snapshot_key(Configuration())
    except StorageError as exc:
        raise CliError(str(exc)) from None
    if key is not None:
        return key
    parent = directory.rstrip("/").rsplit("/", 1)[0]
    for root in (parent, parent.rsplit("/", 1)[0]):
        candidate = fs.join(root or "/", KEY_FILE_NAME)
        try:
            if fs.exists(candidate):
                return read_key_file(candidate)
        except (OSError, StorageError):
            continue
    return None


def _signature(result: Authentication, key: SnapshotKey | None, data: bytes) -> str:
    if result is Authentication.VALID:
        assert key is not None
        return f"valid (HMAC-SHA256 with the key from {key.source})"
    if result is Authentication.UNSIGNED:
        return "NOT SIGNED (format version 1-3): a restore refuses it unless trusted deliberately"
    signer = key_id_of(data)
    named = signer.hex() if signer is not None else "?"
    if result is Authentication.NO_KEY:
        return (
            f"signed (key id {named}), not checked: no key (set {KEY_ENV_VAR} or --key-file "
            f"<storage root>/{KEY_FILE_NAME})"
        )
    assert key is not None
    if result is Authentication.OTHER_KEY:
        return (
            f"SIGNED WITH ANOTHER KEY (key id {named}; the key from {key.source} is "
            f"{key.key_id.hex()}): a restore with that key refuses it"
        )
    return (
        f"INVALID: corrupt or forged, modified after it was signed (the key from {key.source} "
        "does not verify it)"
    )


def read_checkpoint(path: str, *, verify: bool = False, key_file: str | None = None) -> CheckpointReport:
    """Read and check the checkpoint or savepoint at ``path``; an unusable ``_metadata`` is a
    :class:`CliError` naming the file. Missing or damaged state files, and a signature that
    does not verify, are reported, not raised. Nothing is unpickled."""
    try:
        return _read_checkpoint(path, verify, key_file)
    except OSError as exc:
        raise CliError(f"cannot read the checkpoint at {path}: {exc}") from None


def _read_checkpoint(path: str, verify: bool, key_file: str | None) -> CheckpointReport:
    fs, directory, metadata_file = _locate(path)
    if not fs.exists(directory):
        raise CliError(f"{directory} does not exist")
    if not fs.exists(metadata_file):
        name = directory.rstrip("/").rsplit("/", 1)[-1]
        if not _SNAPSHOT_DIR.match(name) and fs.is_dir(directory) and _snapshots_under(fs, directory):
            raise CliError(
                f"{directory} holds checkpoints or savepoints but is not one itself (it has no "
                f"{METADATA_FILE_NAME}): `chandy checkpoint list {path}` lists them"
            )
        raise CliError(
            f"{metadata_file} does not exist: {directory} is not a complete checkpoint or savepoint "
            "(it was still being written, or was aborted)"
        )
    size = fs.size(metadata_file)
    if size > MAX_METADATA_BYTES:
        raise CliError(f"{metadata_file} is {size} bytes, more than a _metadata file can be: it is not one")
    data = fs.read(metadata_file)
    key = _key_for(fs, directory, key_file)
    try:
        result = authenticate(data, metadata_file, key)
        metadata = parse(data, metadata_file, directory)
    except InvalidCheckpointError as exc:
        raise CliError(str(exc)) from None
    report = _report(metadata, directory, metadata_file, data)
    report.authentication = result.value
    report.signature = _signature(result, key, data)
    report.state_files = _check_files(metadata, verify)
    return report


def _report(
    metadata: CheckpointMetadata, directory: str, metadata_file: str, data: bytes
) -> CheckpointReport:
    operators = [_operator_report(op) for op in metadata.operator_states]
    inline = sum(
        1
        for op in metadata.operator_states
        for subtask in op.subtask_states.values()
        for handle in (*subtask.stream_handles(), *subtask.shared_handles())
        if not isinstance(handle, FileStateHandle)
    )
    return CheckpointReport(
        path=directory,
        metadata_file=metadata_file,
        checkpoint_id=metadata.checkpoint_id,
        checkpoint_type=metadata.checkpoint_type,
        savepoint_format=metadata.savepoint_format,
        job_id=metadata.job_id,
        timestamp=metadata.timestamp,
        format_version=int.from_bytes(data[_VERSION_OFFSET : _VERSION_OFFSET + 4], "big"),
        checksum="ok (SHA-256 matches: the file is intact; who wrote it is the signature's to say)",
        authentication="",
        signature="",
        state_size=sum(op.state_size for op in operators),
        inline_handles=inline,
        master_states=[m.name for m in metadata.master_states],
        operators=operators,
    )


def _operator_report(op: OperatorState) -> OperatorReport:
    keyed_states: dict[str, str] = {}
    keyed = any(state.managed_keyed_state for state in op.subtask_states.values())
    subtasks = []
    for index in range(op.parallelism):
        state = op.subtask_states.get(index)
        if state is None:
            # Subtasks without state are not written; a keyed one still owned its key groups.
            owned = KeyGroupRange.of_operator(op.max_parallelism, op.parallelism, index) if keyed else None
            ranges = [[owned.start, owned.end]] if owned is not None else []
            subtasks.append(SubtaskReport(index, False, False, ranges, 0, {}))
            continue
        operator_states: dict[str, OperatorStateSummary] = {}
        for handle in state.managed_operator_state:
            for name, meta in handle.states.items():
                summary = operator_states.setdefault(name, OperatorStateSummary(meta.mode.value, 0))
                summary.elements += len(meta.elements)
        for keyed_handle in state.managed_keyed_state:
            keyed_states.update(keyed_handle.state_kinds)
        subtasks.append(
            SubtaskReport(
                index=index,
                has_state=True,
                finished=state.finished,
                key_groups=[
                    [h.key_group_range.start, h.key_group_range.end] for h in state.managed_keyed_state
                ],
                state_size=state.state_size,
                operator_states=operator_states,
                shared_files=sum(
                    len(h.shared)
                    for h in state.managed_keyed_state
                    if isinstance(h, IncrementalKeyedStateHandle)
                ),
                private_files=sum(
                    len(h.private)
                    for h in state.managed_keyed_state
                    if isinstance(h, IncrementalKeyedStateHandle)
                ),
                channel_state={h.channel_index: h.length for h in state.input_channel_state},
            )
        )
    return OperatorReport(
        operator_id=op.operator_id,
        uid=op.uid,
        name=op.name,
        parallelism=op.parallelism,
        max_parallelism=op.max_parallelism,
        state_size=op.state_size,
        keyed_states=dict(sorted(keyed_states.items())),
        subtasks=subtasks,
    )


def _check_files(metadata: CheckpointMetadata, verify: bool) -> list[StateFile]:
    """Each referenced state file once, the checkpoint's own and the shared files of its
    incremental snapshots: present with its recorded size (and SHA-256 with ``verify``)."""
    handles: dict[str, tuple[FileStateHandle, bool]] = {}
    for op in metadata.operator_states:
        for subtask in op.subtask_states.values():
            for handle in subtask.stream_handles():
                if isinstance(handle, FileStateHandle):
                    handles.setdefault(handle.path, (handle, False))
            for handle in subtask.shared_handles():
                if isinstance(handle, FileStateHandle):
                    handles.setdefault(handle.path, (handle, True))
    files = []
    for path, (handle, shared) in sorted(handles.items()):
        files.append(StateFile(path, handle.size, _file_status(handle, verify), shared))
    return files


def _file_status(handle: FileStateHandle, verify: bool) -> str:
    try:
        fs, path = resolve(handle.path)
        size = fs.size(path)
        if size != handle.size:
            return f"size mismatch ({size} bytes on disk)"
        if verify:
            digest = hashlib.sha256()
            for chunk in fs.read_chunks(path):  # an SST file of hundreds of MB never whole in memory
                digest.update(chunk)
            if digest.hexdigest() != handle.sha256:
                return "checksum mismatch"
    except FileNotFoundError:
        return "missing"
    except (OSError, StorageError) as exc:
        return f"unreadable ({exc})"
    return "present"


# ---------------------------------------------------------------------- finding snapshots


def _snapshots_under(fs: FileSystem, root: str) -> list[str]:
    """Snapshot directories at ``root`` itself, directly under it, or one level further
    (a checkpoint root holds ``<job id>/chk-N``; a job directory ``chk-N``; a savepoint root
    ``savepoint-*``)."""
    name = root.rstrip("/").rsplit("/", 1)[-1]
    if _SNAPSHOT_DIR.match(name):
        return [root]
    found = []
    for child in sorted(fs.list_dir(root)):
        path = fs.join(root, child)
        if not fs.is_dir(path):
            continue
        if _SNAPSHOT_DIR.match(child):
            found.append(path)
            continue
        for grandchild in sorted(fs.list_dir(path)):
            if _SNAPSHOT_DIR.match(grandchild) and fs.is_dir(fs.join(path, grandchild)):
                found.append(fs.join(path, grandchild))
    return found


def find_savepoint(directory: str, job_id: str, since_ms: int) -> str | None:
    """The newest complete, valid savepoint of ``job_id`` directly under ``directory`` taken at
    or after ``since_ms``, or ``None``."""
    try:
        fs, root = resolve(directory)
        names = fs.list_dir(root) if fs.is_dir(root) else []
    except (OSError, StorageError):
        return None
    best: CheckpointReport | None = None
    for name in names:
        if not name.startswith("savepoint-"):
            continue
        try:
            report = read_checkpoint(fs.join(root, name))
        except CliError:
            continue
        if (
            report.job_id == job_id
            and "SAVEPOINT" in report.checkpoint_type
            and report.timestamp >= since_ms
            and not report.broken_files
            and not report.refused
            and (best is None or report.timestamp > best.timestamp)
        ):
            best = report
    return best.path if best is not None else None


@dataclass
class ListEntry:
    path: str
    checkpoint_id: int | None
    checkpoint_type: str | None
    job_id: str | None
    timestamp: int | None
    state_size: int | None
    valid: bool
    problem: str | None


#: The STATUS of a snapshot in ``checkpoint list`` whose signature a restore refuses.
_REFUSED_PROBLEM = {
    Authentication.UNSIGNED.value: "_metadata is not signed (format version 1-3)",
    Authentication.OTHER_KEY.value: "_metadata is signed with another key",
    Authentication.MODIFIED.value: "_metadata's signature does not verify (corrupt or forged)",
}


def _list_entry(path: str) -> ListEntry:
    try:
        report = read_checkpoint(path)
    except CliError as exc:
        return ListEntry(path, None, None, None, None, None, False, _short_reason(exc.message, path))
    broken = report.broken_files
    problem = None
    if report.refused:
        problem = _REFUSED_PROBLEM[report.authentication]
    elif broken:
        kinds = sorted({f.status.split(" (")[0] for f in broken})
        problem = f"{len(broken)} of {len(report.state_files)} state files {' or '.join(kinds)}"
        shared = sum(1 for f in broken if f.shared)
        if shared:
            problem += f" ({shared} of them shared files in the job directory's shared/)"
    return ListEntry(
        path,
        report.checkpoint_id,
        report.checkpoint_type,
        report.job_id,
        report.timestamp,
        report.state_size,
        not broken and not report.refused,
        problem,
    )


def _entry_order(entry: ListEntry) -> tuple[str, int, int, str]:
    """By directory, then id (``chk-N`` by its N; a savepoint, whose name is random, by the id in
    its metadata), then time."""
    parent, _, name = entry.path.rstrip("/").rpartition("/")
    number = name.removeprefix(CHECKPOINT_DIR_PREFIX)
    if number.isdigit():
        checkpoint_id = int(number)
    else:
        checkpoint_id = entry.checkpoint_id if entry.checkpoint_id is not None else sys.maxsize
    return (parent, checkpoint_id, entry.timestamp or 0, name)


def _short_reason(message: str, path: str) -> str:
    """The first clause of an error about the snapshot at ``path``, with the path shortened."""
    metadata_file = path.rstrip("/") + "/" + METADATA_FILE_NAME
    text = message.replace(metadata_file, METADATA_FILE_NAME).replace(path.rstrip("/"), "the directory")
    for separator in (": ", ". "):
        text = text.split(separator, 1)[0]
    return text


# ---------------------------------------------------------------------- rendering


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _time(millis: int | None) -> str:
    if millis is None:
        return "-"
    local = datetime.datetime.fromtimestamp(millis / 1000, tz=datetime.UTC).astimezone()
    return local.strftime("%Y-%m-%d %H:%M:%S.") + f"{millis % 1000:03d} " + local.strftime("%Z")


def _shorten(path: str, base: str) -> str:
    """``path`` relative to the snapshot's directory ``base``, or to the job directory above it
    (``../shared/...``), as ``_metadata`` stores it; else as it is."""
    prefix = base.rstrip("/") + "/"
    if path.startswith(prefix):
        return path[len(prefix) :]
    parent = base.rstrip("/").rsplit("/", 1)[0] + "/"
    return "../" + path[len(parent) :] if parent != "/" and path.startswith(parent) else path


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _in_flight(report: CheckpointReport) -> str:
    """The top line on channel state: an unaligned checkpoint's in-flight data, or none."""
    subtasks = [sub for op in report.operators for sub in op.subtasks if sub.channel_state]
    if not subtasks:
        return "none (no channel state: aligned, or nothing was in flight)"
    channels = sum(len(sub.channel_state) for sub in subtasks)
    return (
        f"{_size(report.in_flight_bytes)} in {_count(channels, 'input channel')} of "
        f"{_count(len(subtasks), 'subtask')} (unaligned checkpoint; restored at the same parallelism only)"
    )


def _render(report: CheckpointReport) -> list[str]:
    kind = "Savepoint" if "SAVEPOINT" in report.checkpoint_type else "Checkpoint"
    broken = report.broken_files
    files = f"{len(report.state_files)} state files" if report.state_files else "no state files"
    shared = sum(1 for f in report.state_files if f.shared)
    if shared:
        files += f" ({shared} shared with other checkpoints)"
    if broken:
        files += f", {len(broken)} of them MISSING or damaged"
    elif report.state_files:
        files += " (all present)"
    lines = [
        f"{kind} {report.checkpoint_id} of job {report.job_id}",
        f"  path:            {report.path}",
        f"  type:            {report.checkpoint_type}"
        + (f", {report.savepoint_format} format" if report.savepoint_format else ""),
        f"  taken:           {_time(report.timestamp)} (timestamp {report.timestamp})",
        f"  format version:  {report.format_version}",
        f"  checksum:        {report.checksum}",
        f"  signature:       {report.signature}",
        f"  state:           {_size(report.state_size)}: {files}, {report.inline_handles} inline handles",
        f"  master states:   {', '.join(report.master_states) or 'none'}",
        f"  in-flight data:  {_in_flight(report)}",
        f"  operators:       {len(report.operators)}",
    ]
    for op in report.operators:
        title = f"'{op.name}'" if op.name else "(name not recorded)"
        uid = f"uid '{op.uid}'" if op.uid is not None else "no uid"
        lines += [
            "",
            f"Operator {title}, {uid}, operator id {op.operator_id}",
            f"  parallelism {op.parallelism}, max parallelism {op.max_parallelism}, "
            f"state {_size(op.state_size)}",
        ]
        if op.keyed_states:
            lines.append("  keyed state:")
            lines += [f"    '{name}': {kind}" for name, kind in op.keyed_states.items()]
        for sub in op.subtasks:
            text = f"  subtask {sub.index}: "
            if sub.key_groups:
                text += "key groups " + ", ".join(f"{a}-{b}" for a, b in sub.key_groups) + ", "
            text += _size(sub.state_size) if sub.has_state else "no state"
            if sub.shared_files or sub.private_files:
                text += f", incremental ({sub.shared_files} shared + {sub.private_files} private files)"
            lines.append(text + (", finished" if sub.finished else ""))
            if sub.channel_state:
                channels = ", ".join(f"{c}: {_size(n)}" for c, n in sorted(sub.channel_state.items()))
                lines.append(
                    f"    in-flight data: {_size(sum(sub.channel_state.values()))} in "
                    f"{_count(len(sub.channel_state), 'input channel')} ({channels})"
                )
            for name, summary in sub.operator_states.items():
                count = _count(summary.elements, "element")
                lines.append(f"    operator state '{name}': {summary.mode}, {count}")
    if report.state_files:
        lines += ["", "State files:"]
        for f in report.state_files:
            status = f.status if f.ok else f.status.upper()
            marker = "  (shared)" if f.shared else ""
            lines.append(f"  {status:<10} {f.size:>12} B  {_shorten(f.path, report.path)}{marker}")
    return lines


# ---------------------------------------------------------------------- commands


@click.group("checkpoint")
def checkpoint() -> None:
    """Inspect retained checkpoints and savepoints on disk (nothing is run or changed)."""


@checkpoint.command("inspect")
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--verify", is_flag=True, help="Also read every state file (shared ones too) and check its SHA-256."
)
@click.option(
    "--key-file",
    metavar="FILE",
    help=f"Check the signature with the key in FILE (default: {KEY_ENV_VAR}, else the "
    f"{KEY_FILE_NAME} in the storage root above the snapshot).",
)
def inspect(path: str, as_json: bool, verify: bool, key_file: str | None) -> None:
    """Show what the checkpoint or savepoint at PATH (a chk-N or savepoint directory, or its
    _metadata file) holds: operators, uids, state kinds and sizes, key-group ranges, files
    (with the shared files of incremental RocksDB checkpoints, in the job directory's shared/).

    Exits 1 if _metadata is unusable (corrupt, truncated, unknown version), its signature
    does not verify with the key (unsigned, another key's, modified), or state files (its
    own or shared ones) are missing or damaged: a restore from it would be refused. Nothing
    of the snapshot is unpickled.
    """
    report = read_checkpoint(path, verify=verify, key_file=key_file)
    if as_json:
        data = asdict(report)
        data["valid"] = not report.broken_files and not report.refused
        data["in_flight_bytes"] = report.in_flight_bytes
        click.echo(json.dumps(data, indent=2))
    else:
        for line in _render(report):
            click.echo(line)
    if report.refused:
        raise CliError(
            f"the signature of {report.metadata_file} does not verify: {report.signature}. A "
            "restore would refuse it unless trusted deliberately (--trust-snapshot)"
        )
    broken = report.broken_files
    if broken:
        first = broken[0]
        where = (
            f"shared state file {first.path} (in the job directory's shared/, referenced by other "
            "checkpoints too; deleted, or the checkpoint was moved without its job directory)"
            if first.shared
            else first.path
        )
        raise CliError(
            f"{len(broken)} of {len(report.state_files)} state files of {report.path} are missing or "
            f"damaged ({where}: {first.status}): a restore from it would be refused"
        )


@checkpoint.command("list")
@click.argument("directory")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def list_checkpoints(directory: str, as_json: bool) -> None:
    """List the checkpoints and savepoints under DIRECTORY (a checkpoint root holding job
    directories, one job's directory, or a savepoint directory): id, type, time, size, and
    whether each is valid (and why not)."""
    try:
        fs, root = resolve(directory)
    except StorageError as exc:
        raise CliError(str(exc)) from None
    try:
        if not fs.is_dir(root):
            raise CliError(f"{directory} is not a directory (or does not exist)")
        entries = sorted((_list_entry(path) for path in _snapshots_under(fs, root)), key=_entry_order)
    except OSError as exc:
        raise CliError(f"cannot list {directory}: {exc}") from None
    if as_json:
        click.echo(json.dumps([asdict(e) for e in entries], indent=2))
        return
    if not entries:
        click.echo(f"No checkpoints or savepoints under {directory}.")
        return
    rows = [("PATH", "ID", "TYPE", "TIME", "SIZE", "STATUS")]
    for e in entries:
        status = "valid" if e.valid else f"INVALID: {e.problem}"
        rows.append(
            (
                _shorten(e.path, root),
                "-" if e.checkpoint_id is None else str(e.checkpoint_id),
                e.checkpoint_type or "-",
                _time(e.timestamp),
                _size(e.state_size),
                status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1]
        )
