"""The canonical format of one key group: each state's values, with the serializer that wrote them.

Every backend writes a key group of the canonical format (heap snapshots, RocksDB's
canonical snapshots and savepoints) with :func:`write_key_group` and reads it with
:func:`read_key_group`. Since typed state (:mod:`chandy.state.typed`)::

    MAGIC                          b"\\xc3KG\\x02"
    varint                         how many states
    per state: str name, str kind, str type, varint length, payload

``str`` is a varint length and UTF-8 bytes. ``type`` is the declared type's
:func:`~chandy.state.typed.type_spec` (a typed state), or empty (a pickled one). So the
format says which serializer wrote each state, and a restore knows how to read it and
whether the job's declared type is still compatible (Flink's serializer snapshots):

- a **typed** payload is a varint count of entries, each the table key in the key
  encoding (:func:`chandy.state.codec.encode_key`) and the value in the typed encoding:
  no pickle (a key that is not plain data, a window say, is pickled inside the key);
- a **pickled** payload is one pickle of ``{table key: value}``.

A key group written before typed state is one pickle of ``{name: (kind, {table key:
value})}`` (it starts with pickle's PROTO opcode, 0x80, never with the magic), and reads as
pickled states. Every pickle is read by the restricted unpickler
(:mod:`chandy.state.unpickling`).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

from chandy.errors import InvalidCheckpointError
from chandy.state.codec import Loads, decode_from, varint
from chandy.state.missing_classes import class_error_of, load_key_group
from chandy.state.typed import StateSerializer
from chandy.state.unpicklable import first_unpicklable, unpicklable_state_error
from chandy.state.unpickling import DEFAULT_POLICY, PickleRefusal, UnpicklingPolicy, refused_error

MAGIC = b"\xc3KG\x02"

#: What :func:`read_key_group` gives per state: kind, values, and the recorded type (``None``: pickled).
RestoredState = tuple[str, dict[Any, Any], str | None]


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return varint(len(raw)) + raw


def write_key_group(
    group: Mapping[str, tuple[str, dict[Any, Any]]], serializers: Mapping[str, StateSerializer]
) -> bytes:
    """The bytes of one key group: ``group`` is ``{name: (kind, {table key: value})}``, and a
    state with a serializer in ``serializers`` is written typed."""
    parts = [MAGIC, varint(len(group))]
    for name, (kind, values) in group.items():
        serializer = serializers.get(name)
        if serializer is None:
            payload = _pickled(name, values)
            spec = ""
        else:
            payload = serializer.encode_table(values)
            spec = serializer.spec
        parts += [_text(name), _text(kind), _text(spec), varint(len(payload)), payload]
    return b"".join(parts)


def _pickled(name: str, values: dict[Any, Any]) -> bytes:
    try:
        return pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        culprit = first_unpicklable(list(values.keys()) + list(values.values()))
        raise unpicklable_state_error(name, culprit, exc) from exc


class _Reader:
    """Reads the fields of a key group's bytes; running past the end is corruption."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = len(MAGIC)

    def count(self) -> int:
        data, pos = self.data, self.pos
        result = shift = 0
        while True:
            if pos >= len(data):
                raise ValueError("the key group ends in the middle of a length")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return result
            shift += 7
            if shift > 63:
                raise ValueError("a length of the key group is too long")

    def raw(self) -> bytes:
        n = self.count()
        end = self.pos + n
        if end > len(self.data):
            raise ValueError(f"the key group holds {len(self.data) - self.pos} of {n} bytes")
        chunk, self.pos = self.data[self.pos : end], end
        return chunk

    def text(self) -> str:
        return self.raw().decode("utf-8")


def read_key_group(
    data: bytes, owner: str, policy: UnpicklingPolicy = DEFAULT_POLICY
) -> dict[str, RestoredState]:
    """The states of one key group's bytes (either format), ``{name: (kind, values, type)}``;
    every pickle read under ``policy``. Bytes that do not parse are an
    :class:`InvalidCheckpointError`, as is a pickle naming what ``policy`` refuses
    (:class:`~chandy.state.unpickling.PickleRefusedError`)."""
    if not data.startswith(MAGIC):
        return {
            name: (kind, values, None) for name, (kind, values) in load_key_group(data, owner, policy).items()
        }
    reader = _Reader(data)
    states: dict[str, RestoredState] = {}
    name = ""
    try:
        for _ in range(reader.count()):
            name, kind, spec = reader.text(), reader.text(), reader.text()
            payload = reader.raw()
            loads = _loader(owner, name, policy)
            if spec:
                states[name] = (kind, _typed_values(payload, loads), spec)
            else:
                states[name] = (kind, _pickled_values(payload, name, loads), None)
        if reader.pos != len(data):
            raise ValueError(f"{len(data) - reader.pos} bytes follow the key group's last state")
    except PickleRefusal as exc:
        raise refused_error(exc.refused, owner, name) from None
    except (ValueError, IndexError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as exc:
        where = f" (in state '{name}')" if name else ""
        raise InvalidCheckpointError(
            f"{owner} cannot restore its keyed state: a key group's bytes are corrupt{where}: "
            f"{type(exc).__name__}: {exc}. Restore from another checkpoint."
        ) from exc
    return states


def _loader(owner: str, name: str, policy: UnpicklingPolicy) -> Loads:
    """``policy.loads``, where a class that is gone is a
    :class:`~chandy.state.missing_classes.StateClassNotFoundError` naming the state."""

    def loads(pickled: bytes) -> Any:
        try:
            return policy.loads(pickled)
        except (ImportError, AttributeError) as exc:
            error = class_error_of(pickled, owner, name, policy=policy)
            if error is None:
                raise
            raise error from exc

    return loads


def _typed_values(payload: bytes, loads: Loads) -> dict[Any, Any]:
    count, pos = _count(payload)
    values: dict[Any, Any] = {}
    for _ in range(count):
        key, pos = decode_from(payload, pos, loads)
        values[key], pos = decode_from(payload, pos, loads)
    if pos != len(payload):
        raise ValueError(f"{len(payload) - pos} bytes follow a typed state's last entry")
    return values


def _count(payload: bytes) -> tuple[int, int]:
    reader = _Reader(payload)
    reader.pos = 0
    return reader.count(), reader.pos


def _pickled_values(payload: bytes, name: str, loads: Loads) -> dict[Any, Any]:
    values = loads(payload)
    if not isinstance(values, dict):
        raise ValueError(f"state '{name}' holds a {type(values).__name__}, not a table")
    return values
