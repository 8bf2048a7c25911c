"""The ``_metadata`` format: versioned, checksummed, not a pickle.

Layout::

    magic      8 bytes   b"CHANDYCK"
    version    4 bytes   big-endian unsigned (1, 2 or 3, see "Compatibility")
    length     8 bytes   big-endian length of the body
    body       length    UTF-8 JSON (below)
    checksum   32 bytes  SHA-256 of everything before it

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
import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any

from chandy.checkpoint.operator_state import OperatorState
from chandy.errors import InvalidCheckpointError
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

MAGIC = b"CHANDYCK"
#: The version written when the file holds no incremental handle.
VERSION = 1
#: The version written when it does (see "Compatibility").
VERSION_INCREMENTAL = 2
#: The version written when it holds input channel state (unaligned checkpoints).
VERSION_CHANNEL_STATE = 3
#: Every version this module reads.
READABLE_VERSIONS = (VERSION, VERSION_INCREMENTAL, VERSION_CHANNEL_STATE)
_HEADER = struct.Struct(">8sIQ")
_CHECKSUM_LEN = 32


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


def serialize(metadata: CheckpointMetadata, base_dir: str | None = None) -> bytes:
    """The bytes of ``_metadata``; file paths under ``base_dir`` are made relative."""
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
    version = _version(metadata)
    head = _HEADER.pack(MAGIC, version, len(payload)) + payload
    return head + hashlib.sha256(head).digest()


# ---------------------------------------------------------------------- reading


def _absolute(path: str, base: str | None) -> str:
    if base is None or path.startswith("/") or "://" in path:
        return path
    if path.startswith(_PARENT):
        return _parent(base) + "/" + path[len(_PARENT) :]
    return base.rstrip("/") + "/" + path


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"'{key}' must be a string, got {type(value).__name__}")
    return value


def _handle_from_json(data: dict[str, Any], base: str | None) -> StreamStateHandle:
    kind = data["type"]
    if kind == "file":
        return FileStateHandle(_absolute(data["path"], base), int(data["size"]), data["sha256"])
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


def deserialize(data: bytes, source: str, base_dir: str | None = None) -> CheckpointMetadata:
    """Parse ``_metadata`` bytes read from ``source`` (named in every error)."""
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
    if len(data) != end + _CHECKSUM_LEN or hashlib.sha256(data[:end]).digest() != data[end:]:
        raise InvalidCheckpointError(
            f"{source} is corrupt (checksum mismatch): the file was damaged or modified after it "
            "was written. Restore from another checkpoint."
        )
    try:
        body = json.loads(data[_HEADER.size : end].decode("utf-8"))
        operators = []
        for op in body["operators"]:
            state = OperatorState(
                op["operator_id"],
                int(op["parallelism"]),
                int(op["max_parallelism"]),
                uid=_optional_str(op, "uid"),
                name=_optional_str(op, "name"),
            )
            for index, subtask in op["subtasks"].items():
                state.put_state(int(index), _subtask_from_json(subtask, base_dir, version))
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
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise InvalidCheckpointError(
            f"{source} has a valid checksum but an unreadable body ({type(exc).__name__}: {exc})"
        ) from None
