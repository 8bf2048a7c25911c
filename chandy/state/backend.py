"""The keyed state backend contract.

A backend holds the keyed state of one operator subtask for its key-group
range. The operator sets the current key (and its key group, which the keyed
partitioner already computed, so the hot path never hashes twice) before it
calls the user function; every state handle then reads and writes under that
key. The heap backend keeps Python objects in dictionaries per key group; a
RocksDB backend keeps serialized bytes under a key-group prefix. Both
snapshot per key group, which is what makes rescaling possible.

A snapshot goes through three steps, whatever the backend (the task's
``SubtaskCheckpointCoordinator`` drives them):

1. :meth:`KeyedStateBackend.snapshot` on the task thread, at the barrier: the
   synchronous part (copy-on-write copies on the heap; a flush and a RocksDB
   checkpoint of hard links on RocksDB);
2. :meth:`SnapshotSerializer.step`, in bounded slices on the task thread, until
   done (pickling key groups; nothing for a native RocksDB snapshot);
3. :meth:`SnapshotResult.write` on the checkpoint I/O pool: the bytes or files
   go to checkpoint storage and come back as keyed state handles.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from chandy.core.state import State, StateDescriptor
from chandy.state.handles import FileStateHandle, KeyedStateHandle, Range, StreamStateHandle
from chandy.state.key_groups import KeyGroupRange
from chandy.state.unpickling import DEFAULT_POLICY, UnpicklingPolicy
from chandy.util.clock import Clock


class LastConfirmed(enum.Enum):
    """The base of a snapshot whose caller names none (:meth:`KeyedStateBackend.snapshot`'s
    default, for a backend driven outside a job: tests, tools): an incremental backend reuses
    the files of the last checkpoint it was told completed. In a job the barrier always names
    the base (``CheckpointOptions.base_checkpoint_id``): a task may not have heard yet of the
    latest completion, and the checkpoint it last heard of may be subsumed, its files deleted."""

    LAST_CONFIRMED = "the last checkpoint confirmed complete"


LAST_CONFIRMED = LastConfirmed.LAST_CONFIRMED
#: Which checkpoint's shared files a snapshot may reference: an id, ``None`` (none: upload
#: everything) or :data:`LAST_CONFIRMED`.
BaseCheckpoint: TypeAlias = int | LastConfirmed | None


class StateWriter(Protocol):
    """Where a snapshot's bytes and files go (``CheckpointStorage`` implements it)."""

    def write_state(
        self, checkpoint_id: int, data: bytes, target_location: str | None = None
    ) -> StreamStateHandle:
        """Store bytes exclusive to one checkpoint (inline when small)."""
        ...

    def upload_file(
        self, checkpoint_id: int, local_path: str, shared: bool, target_location: str | None = None
    ) -> StreamStateHandle:
        """Copy a local file into storage: into ``shared/`` when ``shared`` (and no
        ``target_location``), else beside the checkpoint's other exclusive files (or
        inline when small)."""
        ...

    def discard_handles(self, handles: Iterable[FileStateHandle]) -> None:
        """Delete files written for a snapshot that failed half way (nothing references them)."""
        ...


class StateFileReader(Protocol):
    """Reads what a snapshot wrote (``StateReader`` implements it)."""

    def read(self, handle: StreamStateHandle, byte_range: Range) -> bytes: ...

    def copy_to(self, handle: StreamStateHandle, local_path: str) -> None:
        """Write the handle's whole content to ``local_path``, verified against its checksum."""
        ...


@dataclass
class WrittenKeyedState:
    """What :meth:`SnapshotResult.write` stored."""

    handles: tuple[KeyedStateHandle, ...] = ()
    #: Files written for this checkpoint alone: deleted if the checkpoint fails.
    written: list[FileStateHandle] = field(default_factory=list)
    #: Bytes written by this checkpoint (less than ``state_size`` when incremental).
    checkpointed_size: int = 0
    #: Bytes the whole state takes in storage.
    state_size: int = 0


class SnapshotResult(Protocol):
    """A serialized snapshot, ready to be written (on the checkpoint I/O pool)."""

    def write(
        self, writer: StateWriter, checkpoint_id: int, target_location: str | None
    ) -> WrittenKeyedState: ...


class SnapshotSerializer(Protocol):
    """Serializes a snapshot in steps of bounded duration on the task thread."""

    done: bool

    def step(self, deadline_ns: int | None) -> bool:
        """Work until ``deadline_ns`` (monotonic) passes; True when done."""
        ...

    def result(self) -> SnapshotResult: ...


class KeyedStateSnapshot(Protocol):
    """The synchronous part of a keyed snapshot, taken at the barrier."""

    @property
    def is_empty(self) -> bool: ...

    def serializer(self) -> SnapshotSerializer: ...

    def release(self) -> None:
        """Done with it (written or abandoned): the backend may drop what it kept for it."""
        ...


class KeyedStateBackend(ABC):
    """Keyed state of one operator subtask."""

    def __init__(self, key_group_range: KeyGroupRange, max_parallelism: int) -> None:
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism

    @abstractmethod
    def set_current_key(self, key: Any, key_group: int) -> None:
        """Scope every state handle to ``key`` (which lies in ``key_group``)."""

    @abstractmethod
    def get_current_key(self) -> Any: ...

    @abstractmethod
    def get_partitioned_state(self, descriptor: StateDescriptor) -> State:
        """The handle for ``descriptor``; the same name always gives the same state."""

    @abstractmethod
    def num_keys(self, state_name: str) -> int:
        """How many keys hold a value in ``state_name`` (for tests and metrics)."""

    def has_state(self) -> bool:
        """False while no state was ever declared or restored (nothing to snapshot)."""
        return True

    @abstractmethod
    def snapshot(
        self,
        checkpoint_id: int = 0,
        *,
        canonical: bool = False,
        native: bool = False,
        base_checkpoint_id: BaseCheckpoint = LAST_CONFIRMED,
    ) -> KeyedStateSnapshot:
        """The synchronous part of a snapshot (task thread, at the barrier).

        ``canonical`` asks for the backend-independent format (a savepoint's default), which
        every backend restores; ``native`` for the backend's own format, self-contained (a
        NATIVE savepoint); neither, for what the backend's checkpoints use (RocksDB: native
        and incremental when configured, else canonical). An incremental snapshot references only files of
        ``base_checkpoint_id`` (the barrier's base) and uploads everything else."""

    @abstractmethod
    def restore(
        self,
        handles: Iterable[KeyedStateHandle],
        reader: StateFileReader,
        policy: UnpicklingPolicy = DEFAULT_POLICY,
    ) -> None:
        """Load this backend's key groups from ``handles`` (which may cover other ranges too:
        a restore after rescaling); every pickle in them is read under ``policy``
        (:mod:`chandy.state.unpickling`)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: an incremental backend may now reference
        the files it uploaded for it."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete."""

    def dispose(self) -> None:
        """Drop all state (the task is going away)."""


#: ``factory(key_group_range, max_parallelism, owner, clock)``: a new keyed state backend
#: for one operator subtask (what the configured state backend builds).
KeyedStateBackendFactory = Callable[[KeyGroupRange, int, str, Clock], KeyedStateBackend]
