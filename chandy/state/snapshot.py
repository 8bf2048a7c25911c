"""What one subtask snapshotted: per operator, its keyed and operator state handles (and, for
the head operator of an unaligned checkpoint, the in-flight data of its input channels)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from chandy.state.handles import (
    FileStateHandle,
    IncrementalKeyedStateHandle,
    InputChannelStateHandle,
    KeyedStateHandle,
    OperatorStateHandle,
    StreamStateHandle,
)


@dataclass(frozen=True)
class OperatorSubtaskState:
    """The state of one operator in one subtask."""

    managed_keyed_state: tuple[KeyedStateHandle, ...] = ()
    managed_operator_state: tuple[OperatorStateHandle, ...] = ()
    #: The subtask had finished (all its input read and committed) before this checkpoint:
    #: a restore gives it no state and, being restored, it reads nothing again.
    finished: bool = False
    #: Unaligned checkpoints only, on the head operator of a task with inputs: the data its
    #: barriers overtook, per input channel (slices of one stream per subtask).
    input_channel_state: tuple[InputChannelStateHandle, ...] = ()

    @property
    def state_size(self) -> int:
        return (
            sum(h.state_size for h in self.managed_keyed_state)
            + sum(h.state_size for h in self.managed_operator_state)
            + self.channel_state_size
        )

    @property
    def channel_state_size(self) -> int:
        """Bytes of in-flight data (the channel state slices)."""
        return sum(h.state_size for h in self.input_channel_state)

    def _channel_state_delegates(self) -> Iterator[StreamStateHandle]:
        """The streams holding the channel state, each once (the handles of one subtask
        usually share one stream)."""
        seen: list[StreamStateHandle] = []
        for handle in self.input_channel_state:
            if handle.delegate not in seen:
                seen.append(handle.delegate)
                yield handle.delegate

    def stream_handles(self) -> Iterator[StreamStateHandle]:
        """Every handle this state owns alone (deleted with its checkpoint): keyed and
        operator state streams, and an incremental snapshot's private files. Shared files
        are not among them (see :meth:`shared_handles`). The channel state streams are."""
        for keyed in self.managed_keyed_state:
            if isinstance(keyed, IncrementalKeyedStateHandle):
                yield from (handle for _, handle in keyed.private)
            else:
                yield keyed.delegate
        for operator in self.managed_operator_state:
            yield operator.delegate
        yield from self._channel_state_delegates()

    def shared_handles(self) -> Iterator[StreamStateHandle]:
        """The shared files of incremental keyed state, which several checkpoints may
        reference: the ``SharedStateRegistry`` decides when one may be deleted."""
        for keyed in self.managed_keyed_state:
            if isinstance(keyed, IncrementalKeyedStateHandle):
                yield from (handle for _, handle in keyed.shared)

    def uploaded_handles(self) -> Iterator[StreamStateHandle]:
        """What the checkpoint that produced this state wrote: every exclusive handle and
        the shared files it uploaded itself (to delete when the checkpoint never completes)."""
        for keyed in self.managed_keyed_state:
            if isinstance(keyed, IncrementalKeyedStateHandle):
                yield from keyed.exclusive_handles()
            else:
                yield keyed.delegate
        for operator in self.managed_operator_state:
            yield operator.delegate
        yield from self._channel_state_delegates()

    def is_empty(self) -> bool:
        return (
            not self.managed_keyed_state and not self.managed_operator_state and not self.input_channel_state
        )


@dataclass(frozen=True)
class TaskStateSnapshot:
    """Every operator's state in one subtask, by operator id."""

    subtask_states: dict[str, OperatorSubtaskState] = field(default_factory=dict)

    @property
    def state_size(self) -> int:
        return sum(s.state_size for s in self.subtask_states.values())

    @property
    def is_finished(self) -> bool:
        """The subtask had ended when the checkpoint reached it: every operator is finished."""
        return bool(self.subtask_states) and all(s.finished for s in self.subtask_states.values())

    def file_handles(self) -> list[FileStateHandle]:
        """Every file this snapshot wrote (to discard an unused snapshot): its exclusive files
        and the shared files it uploaded, never shared files of earlier checkpoints."""
        found: dict[str, FileStateHandle] = {}
        for state in self.subtask_states.values():
            for handle in state.uploaded_handles():
                if isinstance(handle, FileStateHandle):
                    found[handle.path] = handle
        return list(found.values())
