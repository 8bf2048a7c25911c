"""How keyed state is laid out in RocksDB: one column family of data, one of metadata.

Every entry's key starts with its key group (2 bytes, big-endian), so a key-group
range is one contiguous scan, and a restore after rescaling drops what is not its
own with two range deletes (Flink's layout: key-group prefix first). Then comes the
state (4 bytes of a BLAKE2b hash of its name: the same on every subtask, every run,
so databases of different subtasks merge without renumbering), then the encoded
key as the heap backend keys its tables (the key; ``(key, namespace)`` for
namespaced state; ``(timestamp, key, namespace)`` for timers)::

    data key   = key_group:2 | state id:4 | encode_key(table key)
    map entry  = key_group:2 | state id:4 | encode_key(table key) | encode_key(map key)
    value      = encode(value)

Map state (kinds in :data:`MAP_KINDS`) keeps each entry under its own RocksDB key,
so iterating a huge map never loads it whole; every other kind keeps one value
per table key. The catalogue of states lives in the column family
:data:`META_COLUMN_FAMILY` (``name`` UTF-8 -> ``kind`` UTF-8, and for a typed state a
newline and its declared type's :func:`~chandy.state.typed.type_spec`), so a restored
database says what it holds and which serializer wrote it.
"""

from __future__ import annotations

import hashlib

#: The column family of the state catalogue: state name -> kind.
META_COLUMN_FAMILY = "chandy-meta"
#: Kinds whose entries are stored one RocksDB key per map entry.
MAP_KINDS = frozenset({"map", "namespaced map"})
KEY_GROUP_BYTES = 2
STATE_ID_BYTES = 4
PREFIX_BYTES = KEY_GROUP_BYTES + STATE_ID_BYTES


def catalogue_entry(kind: str, spec: str | None) -> bytes:
    """The catalogue's value for state of ``kind``, typed as ``spec`` (``None``: pickled)."""
    return (kind if spec is None else f"{kind}\n{spec}").encode("utf-8")


def parse_catalogue_entry(raw: bytes) -> tuple[str, str | None]:
    """``(kind, type spec or None)`` of a catalogue value (a database before typed state
    holds the kind alone)."""
    kind, _, spec = raw.decode("utf-8").partition("\n")
    return kind, spec or None


def key_group_prefix(key_group: int) -> bytes:
    """The first bytes of every key of ``key_group``."""
    return key_group.to_bytes(KEY_GROUP_BYTES, "big")


def key_group_of(db_key: bytes) -> int:
    return int.from_bytes(db_key[:KEY_GROUP_BYTES], "big")


def state_id(name: str) -> bytes:
    """The 4 bytes that stand for state ``name`` in every key."""
    return hashlib.blake2b(name.encode("utf-8"), digest_size=STATE_ID_BYTES).digest()


def table_prefix(key_group: int, name_id: bytes) -> bytes:
    """The first bytes of every key of one state in one key group."""
    return key_group.to_bytes(KEY_GROUP_BYTES, "big") + name_id


def key_group_range_bounds(start: int, end: int) -> tuple[bytes, bytes]:
    """``[lower, upper)`` byte bounds of the keys of key groups ``start..end`` (inclusive)."""
    lower = key_group_prefix(start)
    if end + 1 < 1 << (8 * KEY_GROUP_BYTES):
        return lower, key_group_prefix(end + 1)
    return lower, b"\xff" * (KEY_GROUP_BYTES + 1)
