"""State handles: where a piece of snapshotted state lives, and which byte ranges mean what.

A handle never holds an open file. It names the bytes (a file with its size and
SHA-256, or the bytes themselves when they are small enough to inline into the
checkpoint's ``_metadata``) and the ranges inside them: per key group for keyed
state, per list element for operator state. The ranges are what make
rescaling possible without reading the data: the JobMaster assigns ranges to
the new subtasks and each subtask reads only its own.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

from chandy.state.key_groups import KeyGroupRange

#: A byte range ``[start, end)`` inside a stream.
Range = tuple[int, int]


@dataclass(frozen=True)
class StreamStateHandle(ABC):
    """Bytes somewhere."""

    @property
    @abstractmethod
    def state_size(self) -> int: ...


@dataclass(frozen=True)
class ByteStreamStateHandle(StreamStateHandle):
    """Bytes inlined into the checkpoint metadata (small state)."""

    name: str
    data: bytes

    @property
    def state_size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class FileStateHandle(StreamStateHandle):
    """A file in checkpoint storage; ``sha256`` is checked before its bytes are used."""

    path: str
    size: int
    sha256: str

    @property
    def state_size(self) -> int:
        return self.size


@dataclass(frozen=True)
class KeyGroupsStateHandle:
    """Keyed state of a key-group range: ``ranges[i]`` holds key group ``key_group_range.start + i``."""

    key_group_range: KeyGroupRange
    ranges: tuple[Range, ...]
    delegate: StreamStateHandle
    #: ``(state name, kind)`` of every state the snapshot holds (kinds as the backend names
    #: them: "value", "list", ..., "timers"); empty in checkpoints that did not record them.
    state_kinds: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if len(self.ranges) != self.key_group_range.number_of_key_groups:
            raise ValueError("one byte range per key group is required")

    def range_of(self, key_group: int) -> Range:
        return self.ranges[key_group - self.key_group_range.start]

    def key_groups(self) -> Iterator[tuple[int, Range]]:
        return zip(self.key_group_range, self.ranges, strict=True)

    def intersection(self, other: KeyGroupRange) -> KeyGroupsStateHandle | None:
        """The part of this handle inside ``other``, or ``None`` if they do not overlap."""
        common = self.key_group_range.intersection(other)
        if common.number_of_key_groups == 0:
            return None
        first = common.start - self.key_group_range.start
        return KeyGroupsStateHandle(
            common, self.ranges[first : first + common.number_of_key_groups], self.delegate, self.state_kinds
        )

    @property
    def state_size(self) -> int:
        return sum(end - start for start, end in self.ranges)


@dataclass(frozen=True)
class IncrementalKeyedStateHandle:
    """Keyed state of a key-group range as a RocksDB checkpoint (Flink's
    ``IncrementalRemoteKeyedStateHandle``): the database's files, not a byte stream.

    ``shared`` holds its SST files, each uploaded once into the storage's ``shared/``
    directory and referenced by every later checkpoint of the same backend that still
    contains it; the JobMaster's ``SharedStateRegistry`` counts those references and deletes
    a shared file once no retained checkpoint holds it. ``private`` holds the files that
    change with every checkpoint (``MANIFEST-*``, ``CURRENT``, ``OPTIONS-*``): exclusive to
    this checkpoint, in its ``chk-N`` directory or inline. Both map the file's name in the
    local RocksDB directory to where it is stored, so a restore lays the files out again
    and opens the database as it was.

    ``uploaded`` names the shared files (by local name) that *this* checkpoint uploaded: if
    the checkpoint is aborted, only those are deleted; the others belong to earlier,
    completed checkpoints.

    The handle is not split by key group: a restore after rescaling opens the whole
    database and clips it to its own range (``intersection`` only says whether it overlaps).
    """

    key_group_range: KeyGroupRange
    #: The backend instance that wrote it (a restore starts a new one).
    backend_id: str
    checkpoint_id: int
    shared: tuple[tuple[str, StreamStateHandle], ...]
    private: tuple[tuple[str, StreamStateHandle], ...]
    uploaded: frozenset[str] = frozenset()
    #: As :attr:`KeyGroupsStateHandle.state_kinds`.
    state_kinds: tuple[tuple[str, str], ...] = ()

    def intersection(self, other: KeyGroupRange) -> IncrementalKeyedStateHandle | None:
        """This handle if its range overlaps ``other`` (the restore clips), else ``None``."""
        if self.key_group_range.intersection(other).number_of_key_groups == 0:
            return None
        return self

    @property
    def state_size(self) -> int:
        """The size of the whole database (every file it needs)."""
        return sum(h.state_size for _, h in self.shared) + sum(h.state_size for _, h in self.private)

    @property
    def checkpointed_size(self) -> int:
        """What this checkpoint wrote: its private files and the shared files it uploaded."""
        uploaded = self.uploaded
        return sum(h.state_size for name, h in self.shared if name in uploaded) + sum(
            h.state_size for _, h in self.private
        )

    def exclusive_handles(self) -> Iterator[StreamStateHandle]:
        """The handles this checkpoint owns alone: private files and the shared files it
        uploaded (nothing else references them until it completes)."""
        for _, handle in self.private:
            yield handle
        uploaded = self.uploaded
        for name, handle in self.shared:
            if name in uploaded:
                yield handle


#: Keyed state of a key-group range in either form.
KeyedStateHandle = KeyGroupsStateHandle | IncrementalKeyedStateHandle


class OperatorStateDistributionMode(enum.Enum):
    """How a list of operator state is spread over subtasks on restore (Flink's modes)."""

    SPLIT_DISTRIBUTE = "SPLIT_DISTRIBUTE"  # the elements are divided round-robin
    UNION = "UNION"  # every subtask gets every element
    BROADCAST = "BROADCAST"  # every subtask gets one (identical) copy


@dataclass(frozen=True)
class OperatorStateMeta:
    """One named operator state inside a handle: its mode and one byte range per element."""

    mode: OperatorStateDistributionMode
    elements: tuple[Range, ...]


@dataclass(frozen=True)
class OperatorStateHandle:
    """Operator (non-keyed) state of one subtask: named lists of separately serialized elements."""

    states: dict[str, OperatorStateMeta]
    delegate: StreamStateHandle

    @property
    def state_size(self) -> int:
        return sum(end - start for meta in self.states.values() for start, end in meta.elements)


@dataclass(frozen=True)
class InputChannelStateHandle:
    """The in-flight data of one input channel of one subtask in an unaligned checkpoint
    (Flink's ``InputChannelStateHandle``): the items the checkpoint's barrier overtook on
    that channel, to replay into it before any new input after a restore.

    A subtask writes the channel state of all its channels into one stream; each handle is
    the slice ``[offset, offset + length)`` of it holding one channel's items, encoded by
    :func:`chandy.network.channel_state.encode_payloads`. ``channel_index`` is the index of
    the channel in the subtask's input gate, so the state is only meaningful to a subtask
    with the same index, parallelism and inputs (see ``chandy.checkpoint.state_assignment``).
    """

    channel_index: int
    delegate: StreamStateHandle
    offset: int
    length: int

    def __post_init__(self) -> None:
        if self.channel_index < 0 or self.offset < 0 or self.length < 0:
            raise ValueError(
                f"invalid channel state handle: channel {self.channel_index}, "
                f"offset {self.offset}, length {self.length}"
            )

    @property
    def state_size(self) -> int:
        return self.length
