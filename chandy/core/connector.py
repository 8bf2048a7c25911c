"""The source contract (Flink's FLIP-27 shape, pulled by the task's own thread).

A :class:`Source` cuts its input into *splits* (a file range, a partition, a slice
of a sequence). Each parallel subtask runs one :class:`SourceReader` that owns
some splits and is *polled* by the task's mailbox thread for the next batch.
Because the task thread both polls and checkpoints, a checkpoint always falls
between two batches and the reader's split positions are exact: after a
restore the reader resumes at those positions and nothing is read twice.

Splits are plain picklable objects that carry their own read position. The
checkpointed state of a reader is its list of splits, redistributed
round-robin when the parallelism changes (Flink's split-distribute list state).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Boundedness(enum.Enum):
    """Whether a source ends: ``BOUNDED`` (the job finishes when every bounded source has, after a final
    checkpoint) or ``CONTINUOUS_UNBOUNDED``."""

    BOUNDED = "BOUNDED"
    CONTINUOUS_UNBOUNDED = "CONTINUOUS_UNBOUNDED"


@dataclass(frozen=True)
class SourceReaderContext:
    """Where a reader runs."""

    subtask_index: int
    parallelism: int
    attempt_number: int


class SourceReader(ABC):
    """Reads the splits of one subtask."""

    #: How long the task may sleep when :meth:`poll_next` returned no records
    #: (it wakes earlier for checkpoints and cancellation).
    idle_wait_s: float = 0.01

    @abstractmethod
    def add_splits(self, splits: Sequence[Any]) -> None:
        """Take ownership of ``splits`` (initial assignment, or restored from a checkpoint)."""

    @abstractmethod
    def poll_next(self, max_records: int) -> list[Any] | None:
        """Up to ``max_records`` records; ``[]`` if none are ready now; ``None`` once
        every split is finished and the source is bounded (end of input)."""

    @abstractmethod
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """The splits this reader owns, with their current positions."""

    def snapshot_shared_state(self, checkpoint_id: int) -> list[Any]:
        """State every subtask gets whole on restore (union list state), e.g. the files a
        directory monitor has already seen: after rescaling a file may belong to another
        subtask, which must still know it was read."""
        return []

    def restore_shared_state(self, elements: list[Any]) -> None:
        """The union of every subtask's :meth:`snapshot_shared_state` at the restored
        checkpoint; called before :meth:`add_splits` on a restore."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The checkpoint holding the positions of :meth:`snapshot_state` is durable."""

    def close(self) -> None:
        """Release files, connections."""


class Source(ABC):
    """A parallel, replayable source of records."""

    #: The reader's ``poll_next`` returns Arrow record batches (up to ``max_records`` rows),
    #: not lists: ``env.from_source`` gives a ``BatchStream``.
    columnar = False

    @abstractmethod
    def get_boundedness(self) -> Boundedness:
        """``BOUNDED`` (the job ends when every reader is done) or ``CONTINUOUS_UNBOUNDED`` (it runs until
        stopped)."""

    @abstractmethod
    def create_splits(self, parallelism: int) -> list[Any]:
        """All splits of a fresh start. Subtask ``i`` gets ``splits[i::parallelism]``."""

    @abstractmethod
    def create_reader(self, context: SourceReaderContext) -> SourceReader:
        """Called by the runtime in every source subtask: the reader that subtask polls for records. Jobs do
        not call it."""

    def validate(self) -> None:
        """Reject a bad configuration when the job is built, with a clear error."""


@dataclass(frozen=True)
class SinkWriterContext:
    """Where a sink writer runs, and what a restore brought back."""

    subtask_index: int
    parallelism: int
    attempt_number: int
    job_id: str
    job_name: str
    #: Stable id of the sink operator (from its ``uid()``): names things that must survive
    #: a restart of the job, such as transaction ids.
    operator_id: str = ""
    #: The job starts from a checkpoint (after a failure, or from a retained one).
    is_restored: bool = False
    #: This subtask's share of the writer state :meth:`SinkWriter.snapshot_state` returned.
    restored_state: tuple[Any, ...] = ()
    #: Every committable of every subtask that the restored checkpoint still held; they were
    #: committed before the writer was created. Cleaning up leftovers must spare what they name.
    restored_committables: tuple[Any, ...] = ()
    checkpointing: bool = False


class SinkWriter(ABC):
    """Writes the records of one subtask."""

    @abstractmethod
    def write(self, element: Any) -> None:
        """Called for each record that reaches the sink subtask: buffer or write it (visible only once
        committed, for a two-phase-commit sink)."""

    def write_batch(self, elements: list[Any]) -> None:
        """Write a whole batch; override when the target takes batches natively."""
        for element in elements:
            self.write(element)

    def flush(self, end_of_input: bool) -> None:
        """Make everything written so far durable: at every checkpoint (at-least-once
        sinks) and at end of input."""

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Writer state to keep in the checkpoint (split-distributed on restore)."""
        return []

    def close(self) -> None:
        """Called once when the subtask ends or is cancelled: release files, connections and producers."""


class Sink(ABC):
    """Where a stream's records go (``ds.sink_to(sink)``)."""

    #: The sink takes Arrow record batches (``BatchStream.sink_to``): its writer's
    #: ``write_batch(batch)`` gets each batch whole instead of ``write`` per record.
    columnar = False

    @abstractmethod
    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        """Called by the runtime in every sink subtask: the writer that receives that subtask's records. Jobs
        do not call it."""

    def validate(self) -> None:
        """Reject a bad configuration when the job is built, with a clear error."""

    def configure(self, job_parameters: Mapping[str, Any]) -> None:
        """Take what the sink needs of the job's final configuration (Flink's sinks read the
        cluster's: an object store's endpoint and credentials). Called once where the job
        is submitted, before the job graph is shipped, so what it keeps travels with the
        sink to every task; it may check the target then (a clear error at submission rather
        than a restart loop). Does nothing by default."""


class PrecommittingSinkWriter(SinkWriter):
    """The first phase: writes that stay invisible until committed."""

    @abstractmethod
    def prepare_commit(self, checkpoint_id: int | None) -> list[Any]:
        """Close what was written since the last call and describe it as committables
        (picklable, small). Called in a checkpoint's synchronous part with its id, and at
        end of input without checkpointing (``None``)."""


class Committer(ABC):
    """The second phase: makes prepared writes visible.

    ``commit`` may be called again with committables it already committed (a restore
    replays those of the restored checkpoint, since the first commit may or may not have
    happened before the failure), so it must be idempotent.
    """

    @abstractmethod
    def commit(self, committables: list[Any]) -> None:
        """Make the given pre-committed output visible, once its checkpoint completed. Called again with the
        same output after a restore, so it must be idempotent."""

    def close(self) -> None:
        """Release what the committer holds (connections, clients)."""


class TwoPhaseCommittingSink(Sink):
    """An exactly-once sink (Flink's ``TwoPhaseCommitSinkFunction`` / Sink V2 with a
    committer): a checkpoint pre-commits what its subtask wrote, the checkpoint's
    completion commits it, and a restore commits what the restored checkpoint pre-committed.
    A later completion commits everything up to it."""

    @abstractmethod
    def create_writer(self, context: SinkWriterContext) -> PrecommittingSinkWriter: ...

    @abstractmethod
    def create_committer(self) -> Committer:
        """Called by the runtime: the committer that makes a checkpoint's pre-committed output visible once
        the checkpoint completes."""
