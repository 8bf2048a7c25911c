"""The ``_metadata`` format: versioned, signed, not a pickle.

Layout (version 4, what chandy writes)::

    magic      8 bytes   b"CHANDYCK"
    version    4 bytes   big-endian unsigned (4; 1 to 3 are read, see "Compatibility")
    length     8 bytes   big-endian length of the body
    body       length    UTF-8 JSON (below)
    key id     8 bytes   names the signing key without revealing it (:class:`SnapshotKey`)
    checksum   32 bytes  SHA-256 of everything before it (integrity: a damaged file)
    signature  32 bytes  HMAC-SHA256 of everything before it under the deployment's
                         snapshot key (authenticity: who wrote it)

Versions 1 to 3 end after the body with the checksum alone: they are not signed.

The body names every operator (by operator id) with its parallelism, max
parallelism and, per subtask, its keyed state handles (key-group range and one
byte range per key group; or, for an incremental RocksDB checkpoint, key-group
range and the database's files) and operator state handles (per named list: the
distribution mode and one byte range per element). A handle is a file (path,
size, SHA-256) or inline bytes (base64) for small state. File paths inside the checkpoint's own directory
are stored relative to it, so a retained checkpoint or savepoint can be moved and
still restored. Inside an incremental handle, paths under the checkpoint
directory's parent (the job directory, whose ``shared/`` holds the SST files
several checkpoints reference) are stored relative to that parent as
``../shared/<file>``: moving the whole job directory keeps every retained
checkpoint restorable (moving one ``chk-N`` alone does not; it never held its
shared files). Any other path is stored as it is (absolute).

The body, field by field (``?`` marks optional fields)::

    checkpoint_id, job_id, timestamp (ms), checkpoint_type ("CHECKPOINT", "SAVEPOINT", ...)
    operators: [
      { operator_id, parallelism, max_parallelism,
        uid?        the uid() the user set (absent: none was set, or an older file)
        name?       the operator's name when it was checkpointed (absent in older files)
        subtasks: { "<index>": {
            finished,
            keyed: [ <key groups handle> | <incremental handle> ],
            operator: [ { states: { "<name>": { mode, elements: [[from, to], ...] } },
                          delegate: <handle> } ],
            channels?: [ <input channel state handle> ] } } } ]
    master_states: [ { name, data (base64) } ]

    <key groups handle> = { key_group_range: [start, end] (inclusive), ranges: [[from, to], ...],
                            delegate: <handle>, states?: { "<state name>": "<kind>" } }
    <incremental handle> (version 2) = { type: "incremental", key_group_range: [start, end],
                            backend_id, checkpoint_id,
                            shared: [[<local file name>, <handle>], ...],
                            private: [[<local file name>, <handle>], ...],
                            uploaded: [<local file name>, ...],
                            states?: { "<state name>": "<kind>" } }
    <input channel state handle> (version 3) = { channel, offset, length, delegate: <handle> }
    <handle> = { type: "file", path, size, sha256 } | { type: "bytes", name, data (base64) }

An incremental handle (:class:`IncrementalKeyedStateHandle`) is a RocksDB
checkpoint: ``shared`` its SST files (in the job's ``shared/``, referenced by
later checkpoints too), ``private`` the files exclusive to this checkpoint
(``MANIFEST-*``, ``CURRENT``, ``OPTIONS-*``), each under the name it had in the
local database directory; ``uploaded`` names the shared files this checkpoint
uploaded itself (the others were uploaded by earlier checkpoints);
``checkpoint_id`` is the checkpoint that took the snapshot and ``backend_id`` the
backend instance that wrote it.

A subtask's ``channels`` (:attr:`OperatorSubtaskState.input_channel_state`, on
the head operator of a task with inputs, unaligned checkpoints only) is the data
the checkpoint's barriers overtook: per input channel (its index in the subtask's
input gate), the byte range ``[offset, offset + length)`` of the subtask's channel
state stream ``delegate`` holding that channel's items. Its file path is relative
like every other handle's.

A keyed handle's ``states`` maps every state in it to its kind as the heap
backend names it: ``value``, ``list``, ``map``, ``reducing``, ``aggregating``,
the same with a ``namespaced`` prefix for per-window state, and ``timers`` for
timer tables (names starting with ``_timer_state/``). In memory these are
:attr:`OperatorState.uid`, :attr:`OperatorState.name` and
:attr:`KeyGroupsStateHandle.state_kinds`; read them through
:func:`chandy.checkpoint.loader.load_checkpoint_metadata` or :func:`deserialize`.

Compatibility: optional fields are added without a new version, because a
reader of version 1 ignores fields it does not know and restores correctly
without them; files written before they existed read as before (the fields are
``None`` / empty). The version changes only when an older reader could not
restore a newer file correctly, and then this module refuses a version it does
not know, naming it. Version 2 added incremental handles, which a version-1
reader cannot read: a file is written as version 2 only when it holds one, so
every checkpoint of the heap backend (and every canonical savepoint) stays
version 1 and readable by older chandy. Version 3 added input channel state
(unaligned checkpoints): an older reader would ignore the ``channels`` field and
restore without the in-flight data, losing records, so a file holding channel
state is written as version 3 (and one holding none keeps version 1 or 2). This
module reads all three.

Why not pickle: ``_metadata`` is read before anything else of a checkpoint, often
from shared storage, and must be safe to load. JSON reads no code; the checksum
turns a flipped byte into a clear error instead of a wrong restore; the version
lets a later chandy read (or refuse with a clear message) what an earlier one wrote.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import logging
import struct
from dataclasses import dataclass, field
from typing import Any

from chandy.checkpoint.operator_state import OperatorState
from chandy.config.options import UPPER_BOUND_MAX_PARALLELISM
from chandy.errors import InvalidCheckpointError, UntrustedCheckpointError
from chandy.state.handles import (
    ByteStreamStateHandle,
    FileStateHandle,
    IncrementalKeyedStateHandle,
    InputChannelStateHandle,
    KeyedStateHandle,
    KeyGroupsStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
    OperatorStateMeta,
    StreamStateHandle,
)
from chandy.state.key_groups import KeyGroupRange
from chandy.state.snapshot import OperatorSubtaskState
from chandy.storage.snapshot_key import SnapshotKey

log = logging.getLogger(__name__)

MAGIC = b"CHANDYCK"
#: The first version, unsigned: a file of heap-backend state.
VERSION = 1
#: Unsigned, with incremental handles (see "Compatibility").
VERSION_INCREMENTAL = 2
#: Unsigned, with input channel state (unaligned checkpoints).
VERSION_CHANNEL_STATE = 3
#: Signed (key id, checksum, HMAC-SHA256): every file chandy writes now.
VERSION_SIGNED = 4
#: Every version this module reads (1 to 3 only when trusted deliberately, for a restore).
READABLE_VERSIONS = (VERSION, VERSION_INCREMENTAL, VERSION_CHANNEL_STATE, VERSION_SIGNED)
_HEADER = struct.Struct(">8sIQ")
_CHECKSUM_LEN = 32
_KEY_ID_LEN = 8
_SIGNATURE_LEN = 32
#: The trailer of a signed file: key id, SHA-256, HMAC-SHA256.
_SIGNED_TRAILER_LEN = _KEY_ID_LEN + _CHECKSUM_LEN + _SIGNATURE_LEN
#: A ``_metadata`` larger than this is refused unread (inline state is at most 1 MiB per handle).
MAX_METADATA_BYTES = 1 << 30
#: How deep the JSON body may nest (it nests about 8 levels; Python's parser stops near 1000).
_MAX_JSON_DEPTH = 64


class Authentication(enum.Enum):
    """What a ``_metadata``'s signature says about who wrote it (:func:`authenticate`)."""

    #: Signed with the key this deployment checks with.
    VALID = "valid"
    #: A version 1 to 3 file: written before chandy signed them, or crafted to look so.
    UNSIGNED = "unsigned"
    #: Signed with a key other than this deployment's (another deployment, or a forger).
    OTHER_KEY = "other key"
    #: Names this deployment's key but the signature does not match: modified after signing.
    MODIFIED = "modified"
    #: Signed, but this deployment has no key to check it with.
    NO_KEY = "no key"


@dataclass(frozen=True)
class MasterState:
    """State of a master hook (coordinator-side state), by hook identifier."""

    name: str
    data: bytes


@dataclass
class CheckpointMetadata:
    checkpoint_id: int
    job_id: str
    timestamp: int
    checkpoint_type: str
    operator_states: list[OperatorState]
    master_states: list[MasterState] = field(default_factory=list)
    #: A savepoint's format ("CANONICAL" / "NATIVE"); ``None`` for checkpoints and older files.
    savepoint_format: str | None = None


# ---------------------------------------------------------------------- writing


_PARENT = "../"


def _parent(base: str) -> str:
    """The directory holding ``base`` (the job directory of a ``chk-N``)."""
    return base.rstrip("/").rsplit("/", 1)[0]


def _relative(path: str, base: str | None, *, parent: bool = False) -> str:
    """``path`` relative to ``base`` if inside it; with ``parent``, also ``../<rest>`` if it
    is inside ``base``'s parent directory (an incremental handle's shared files)."""
    if base is not None:
        prefix = base.rstrip("/") + "/"
        if path.startswith(prefix):
            return path[len(prefix) :]
        if parent:
            parent_prefix = _parent(base) + "/"
            if parent_prefix != "/" and path.startswith(parent_prefix):
                return _PARENT + path[len(parent_prefix) :]
    return path


def _handle_to_json(handle: StreamStateHandle, base: str | None, *, parent: bool = False) -> dict[str, Any]:
    if isinstance(handle, FileStateHandle):
        return {
            "type": "file",
            "path": _relative(handle.path, base, parent=parent),
            "size": handle.size,
            "sha256": handle.sha256,
        }
    if isinstance(handle, ByteStreamStateHandle):
        return {"type": "bytes", "name": handle.name, "data": base64.b64encode(handle.data).decode("ascii")}
    raise TypeError(f"cannot write state handle {handle!r} into metadata")


def _files_to_json(files: tuple[tuple[str, StreamStateHandle], ...], base: str | None) -> list[Any]:
    return [[name, _handle_to_json(handle, base, parent=True)] for name, handle in files]


def _keyed_to_json(handle: KeyedStateHandle, base: str | None) -> dict[str, Any]:
    data: dict[str, Any]
    if isinstance(handle, IncrementalKeyedStateHandle):
        data = {
            "type": "incremental",
            "key_group_range": [handle.key_group_range.start, handle.key_group_range.end],
            "backend_id": handle.backend_id,
            "checkpoint_id": handle.checkpoint_id,
            "shared": _files_to_json(handle.shared, base),
            "private": _files_to_json(handle.private, base),
            "uploaded": sorted(handle.uploaded),
        }
        if handle.state_kinds:
            data["states"] = dict(handle.state_kinds)
        return data
    data = {
        "key_group_range": [handle.key_group_range.start, handle.key_group_range.end],
        "ranges": [list(r) for r in handle.ranges],
        "delegate": _handle_to_json(handle.delegate, base),
    }
    if handle.state_kinds:
        data["states"] = dict(handle.state_kinds)
    return data


def _operator_to_json(op: OperatorState, base: str | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "operator_id": op.operator_id,
        "parallelism": op.parallelism,
        "max_parallelism": op.max_parallelism,
        "subtasks": {str(i): _subtask_to_json(s, base) for i, s in sorted(op.subtask_states.items())},
    }
    if op.uid is not None:
        data["uid"] = op.uid
    if op.name is not None:
        data["name"] = op.name
    return data


def _subtask_to_json(state: OperatorSubtaskState, base: str | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "finished": state.finished,
        "keyed": [_keyed_to_json(h, base) for h in state.managed_keyed_state],
        "operator": [
            {
                "states": {
                    name: {"mode": meta.mode.value, "elements": [list(r) for r in meta.elements]}
                    for name, meta in h.states.items()
                },
                "delegate": _handle_to_json(h.delegate, base),
            }
            for h in state.managed_operator_state
        ],
    }
    if state.input_channel_state:
        data["channels"] = [
            {
                "channel": h.channel_index,
                "offset": h.offset,
                "length": h.length,
                "delegate": _handle_to_json(h.delegate, base),
            }
            for h in state.input_channel_state
        ]
    return data


def _version(metadata: CheckpointMetadata) -> int:
    """The oldest version that can hold everything in ``metadata`` (see "Compatibility")."""
    subtasks = [subtask for op in metadata.operator_states for subtask in op.subtask_states.values()]
    if any(subtask.input_channel_state for subtask in subtasks):
        return VERSION_CHANNEL_STATE
    if any(
        isinstance(handle, IncrementalKeyedStateHandle)
        for subtask in subtasks
        for handle in subtask.managed_keyed_state
    ):
        return VERSION_INCREMENTAL
    return VERSION


def serialize(metadata: CheckpointMetadata, key: SnapshotKey, base_dir: str | None = None) -> bytes:
    """The bytes of ``_metadata``, signed with ``key`` (always: a written file is always signed,
    so the deployment that wrote it restores it without a second thought); file paths under
    ``base_dir`` are made relative."""
    body = {
        "checkpoint_id": metadata.checkpoint_id,
        "job_id": metadata.job_id,
        "timestamp": metadata.timestamp,
        "checkpoint_type": metadata.checkpoint_type,
        "operators": [_operator_to_json(op, base_dir) for op in metadata.operator_states],
        "master_states": [
            {"name": m.name, "data": base64.b64encode(m.data).decode("ascii")} for m in metadata.master_states
        ],
    }
    if metadata.savepoint_format is not None:
        body["savepoint_format"] = metadata.savepoint_format
    payload = json.dumps(body, separators=(",", ":"), sort_keys=True).encode("utf-8")
    head = _HEADER.pack(MAGIC, VERSION_SIGNED, len(payload)) + payload + key.key_id
    head += hashlib.sha256(head).digest()
    return head + key.sign(head)


def content_version(metadata: CheckpointMetadata) -> int:
    """The oldest unsigned version that could hold ``metadata``'s content (what chandy before
    version 4 wrote it as); the file itself is always written as :data:`VERSION_SIGNED`."""
    return _version(metadata)


# ---------------------------------------------------------------------- reading


def _absolute(path: str, base: str | None) -> str:
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ValueError(f"invalid state file path {path!r}")
    if path.startswith("/") or "://" in path:
        return path
    # A relative path stays inside the snapshot's directory, or is ../<rest> in its job
    # directory (an incremental handle's shared file): never anywhere else.
    inner = path[len(_PARENT) :] if path.startswith(_PARENT) else path
    if inner.startswith("/") or ".." in inner.split("/"):
        raise ValueError(f"state file path {path!r} leaves the checkpoint's directory")
    if base is None:
        return path
    if path.startswith(_PARENT):
        return _parent(base) + "/" + inner
    return base.rstrip("/") + "/" + path


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"'{key}' must be a string, got {type(value).__name__}")
    return value


def _handle_from_json(data: dict[str, Any], base: str | None) -> StreamStateHandle:
    kind = data["type"]
    if kind == "file":
        size = int(data["size"])
        sha256 = data["sha256"]
        if size < 0 or not isinstance(sha256, str):
            raise ValueError(f"invalid file state handle (size {size}, sha256 {sha256!r})")
        return FileStateHandle(_absolute(data["path"], base), size, sha256)
    if kind == "bytes":
        return ByteStreamStateHandle(data["name"], base64.b64decode(data["data"]))
    raise ValueError(f"unknown state handle type {kind!r}")


def _state_kinds(data: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(name), str(kind)) for name, kind in data.get("states", {}).items()))


def _files_from_json(data: list[Any], base: str | None) -> tuple[tuple[str, StreamStateHandle], ...]:
    return tuple((str(name), _handle_from_json(handle, base)) for name, handle in data)


def _keyed_from_json(data: dict[str, Any], base: str | None, version: int) -> KeyedStateHandle:
    kind = data.get("type", "key_groups")
    if kind == "incremental":
        if version < VERSION_INCREMENTAL:
            raise ValueError(f"an incremental keyed handle in a version {version} file")
        return IncrementalKeyedStateHandle(
            KeyGroupRange(*data["key_group_range"]),
            str(data["backend_id"]),
            int(data["checkpoint_id"]),
            _files_from_json(data["shared"], base),
            _files_from_json(data["private"], base),
            frozenset(str(name) for name in data["uploaded"]),
            _state_kinds(data),
        )
    if kind != "key_groups":
        raise ValueError(f"unknown keyed state handle type {kind!r}")
    return KeyGroupsStateHandle(
        KeyGroupRange(*data["key_group_range"]),
        tuple((int(a), int(b)) for a, b in data["ranges"]),
        _handle_from_json(data["delegate"], base),
        _state_kinds(data),
    )


def _subtask_from_json(data: dict[str, Any], base: str | None, version: int) -> OperatorSubtaskState:
    keyed = tuple(_keyed_from_json(h, base, version) for h in data["keyed"])
    operator = tuple(
        OperatorStateHandle(
            {
                name: OperatorStateMeta(
                    OperatorStateDistributionMode(meta["mode"]),
                    tuple((int(a), int(b)) for a, b in meta["elements"]),
                )
                for name, meta in h["states"].items()
            },
            _handle_from_json(h["delegate"], base),
        )
        for h in data["operator"]
    )
    channels = data.get("channels", [])
    if channels and version < VERSION_CHANNEL_STATE:
        raise ValueError(f"input channel state in a version {version} file")
    channel_state = tuple(
        InputChannelStateHandle(
            int(h["channel"]), _handle_from_json(h["delegate"], base), int(h["offset"]), int(h["length"])
        )
        for h in channels
    )
    return OperatorSubtaskState(keyed, operator, bool(data.get("finished", False)), channel_state)


def authenticate(data: bytes, source: str, key: SnapshotKey | None) -> Authentication:
    """Who wrote ``_metadata`` bytes ``data`` (read from ``source``, named in every error),
    checked before anything else of them is parsed; raises :class:`InvalidCheckpointError`
    for a file that is truncated, not a ``_metadata``, of an unknown version, or damaged
    (its checksum does not match: integrity, which says nothing about who wrote it)."""
    if len(data) < _HEADER.size + _CHECKSUM_LEN:
        raise InvalidCheckpointError(
            f"{source} is truncated ({len(data)} bytes): the checkpoint "
            "was not written completely. Restore from another checkpoint."
        )
    magic, version, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise InvalidCheckpointError(
            f"{source} is not a chandy checkpoint metadata file (wrong "
            "magic bytes). Point the restore path at a chk-N directory "
            "or savepoint written by chandy."
        )
    if version not in READABLE_VERSIONS:
        raise InvalidCheckpointError(
            f"{source} has metadata format version {version}; this chandy reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}. Restore it with the chandy version that wrote it."
        )
    end = _HEADER.size + length
    trailer = _SIGNED_TRAILER_LEN if version == VERSION_SIGNED else _CHECKSUM_LEN
    checksum_at = end + (_KEY_ID_LEN if version == VERSION_SIGNED else 0)
    if (
        len(data) != end + trailer
        or hashlib.sha256(data[:checksum_at]).digest() != data[checksum_at : checksum_at + _CHECKSUM_LEN]
    ):
        raise InvalidCheckpointError(
            f"{source} is corrupt (checksum mismatch): the file was damaged or modified after it "
            "was written. Restore from another checkpoint."
        )
    if version != VERSION_SIGNED:
        return Authentication.UNSIGNED
    if key is None:
        return Authentication.NO_KEY
    if not hmac.compare_digest(data[end : end + _KEY_ID_LEN], key.key_id):
        return Authentication.OTHER_KEY
    signed = len(data) - _SIGNATURE_LEN
    if not hmac.compare_digest(key.sign(data[:signed]), data[signed:]):
        return Authentication.MODIFIED
    return Authentication.VALID


def key_id_of(data: bytes) -> bytes | None:
    """The key id a signed ``_metadata`` names (``None`` for an unsigned or unreadable one)."""
    if len(data) < _HEADER.size + _SIGNED_TRAILER_LEN:
        return None
    magic, version, length = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION_SIGNED:
        return None
    end = _HEADER.size + length
    return data[end : end + _KEY_ID_LEN]


_TRUST_HINT = (
    "If you know where it comes from and trust it, restore it deliberately with "
    "--trust-snapshot (chandy run) or execution.state-recovery.trust-snapshot: true"
)


def refusal(source: str, result: Authentication, key: SnapshotKey | None, data: bytes) -> str:
    """Why ``source`` is not restored, and both ways out (see docs/security.md)."""
    this_key = f"this deployment's snapshot key ({key.source})" if key is not None else ""
    if result is Authentication.UNSIGNED:
        why = (
            "it is not signed (metadata format version 1-3: written by chandy before snapshots "
            "were signed, or crafted), so nothing proves who wrote it"
        )
        fix = _TRUST_HINT + "; the next checkpoint the job takes is signed."
    elif result is Authentication.NO_KEY:
        why = (
            "this deployment has no snapshot key to check its signature with (no "
            "CHANDY_SNAPSHOT_KEY, execution.checkpointing.snapshot-key-file, "
            "execution.checkpointing.dir or execution.checkpointing.savepoint-dir)"
        )
        fix = "Configure the key it was written with, or: " + _TRUST_HINT + "."
    elif result is Authentication.OTHER_KEY:
        other = key_id_of(data)
        named = other.hex() if other is not None else "?"
        assert key is not None
        why = (
            f"it is signed with another key (key id {named}) than {this_key}, key id "
            f"{key.key_id.hex()}: it was written by another deployment, or forged"
        )
        fix = (
            "Set the key it was written with (CHANDY_SNAPSHOT_KEY or "
            "execution.checkpointing.snapshot-key-file), or: " + _TRUST_HINT + "."
        )
    else:
        why = (
            f"its signature does not match {this_key}: it is corrupt or forged (modified after it was signed)"
        )
        fix = "Restore from another checkpoint. " + _TRUST_HINT + "."
    return f"{source} is refused: {why}. Restoring it would unpickle its state, which runs code. {fix}"


def deserialize(
    data: bytes,
    source: str,
    base_dir: str | None = None,
    *,
    key: SnapshotKey | None = None,
    trust: bool = False,
) -> CheckpointMetadata:
    """Parse ``_metadata`` bytes read from ``source`` (named in every error).

    The signature is checked first (:func:`authenticate`): unless ``key`` authenticates the
    file, it is refused with :class:`UntrustedCheckpointError` before its body is parsed,
    unless ``trust`` (then with a warning). The body is then parsed with bounds: a file
    that passes and is still malformed is an :class:`InvalidCheckpointError`.
    """
    result = authenticate(data, source, key)
    if result is not Authentication.VALID:
        message = refusal(source, result, key, data)
        if not trust:
            raise UntrustedCheckpointError(message)
        log.warning("Trusted deliberately (execution.state-recovery.trust-snapshot): %s", message)
    return parse(data, source, base_dir)


def parse(data: bytes, source: str, base_dir: str | None = None) -> CheckpointMetadata:
    """The body of ``_metadata`` bytes that :func:`authenticate` accepted (or that are only
    shown, never restored: ``chandy checkpoint inspect``), parsed with bounds. Parsing runs
    no code and decodes no state; restoring is what unpickles, so a restore goes through
    :func:`deserialize`. The structure and checksum are checked first, as there."""
    authenticate(data, source, None)
    version = _HEADER.unpack_from(data)[1]
    end = _HEADER.size + _HEADER.unpack_from(data)[2]
    try:
        body = json.loads(data[_HEADER.size : end].decode("utf-8"))
        _check_depth(body)
        if not isinstance(body, dict):
            raise TypeError("the body is not a JSON object")
        operators = []
        for op in body["operators"]:
            parallelism = _bounded(op["parallelism"], "parallelism")
            max_parallelism = _bounded(op["max_parallelism"], "max_parallelism")
            state = OperatorState(
                op["operator_id"],
                parallelism,
                max_parallelism,
                uid=_optional_str(op, "uid"),
                name=_optional_str(op, "name"),
            )
            for index, subtask in op["subtasks"].items():
                restored = _subtask_from_json(subtask, base_dir, version)
                for keyed in restored.managed_keyed_state:
                    kg = keyed.key_group_range
                    if kg.start < 0 or kg.end >= max_parallelism:
                        raise ValueError(
                            f"key groups {kg.start}-{kg.end} outside max parallelism {max_parallelism}"
                        )
                state.put_state(int(index), restored)
            operators.append(state)
        masters = [MasterState(m["name"], base64.b64decode(m["data"])) for m in body["master_states"]]
        return CheckpointMetadata(
            int(body["checkpoint_id"]),
            body["job_id"],
            int(body["timestamp"]),
            body["checkpoint_type"],
            operators,
            masters,
            savepoint_format=body.get("savepoint_format"),
        )
    except RecursionError:
        raise InvalidCheckpointError(
            f"{source} has a valid checksum but an unreadable body (JSON nested too deeply)"
        ) from None
    except (KeyError, ValueError, TypeError, IndexError, AttributeError, OverflowError) as exc:
        raise InvalidCheckpointError(
            f"{source} has a valid checksum but an unreadable body ({type(exc).__name__}: {exc})"
        ) from None


def _bounded(value: Any, what: str) -> int:
    """A parallelism from the body, refused outside ``1..32768`` (Flink's upper bound): a
    crafted ``1e9`` would otherwise size loops and lists by it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"'{what}' must be a number, got {type(value).__name__}")
    number = int(value)
    if not 1 <= number <= UPPER_BOUND_MAX_PARALLELISM:
        raise ValueError(f"'{what}' {value} is outside 1..{UPPER_BOUND_MAX_PARALLELISM}")
    return number


def _check_depth(body: Any) -> None:
    """Refuse JSON nested deeper than the format ever is (iteratively: no recursion)."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > _MAX_JSON_DEPTH:
            raise ValueError(f"JSON nested deeper than {_MAX_JSON_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, (dict, list)))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, (dict, list)))
