"""The state format of unaligned checkpoints: input channel state handles on a subtask's state,
their place in sizes and discards, and the ``_metadata`` version that carries them."""

from __future__ import annotations

import pytest

from chandy.state.handles import (
    ByteStreamStateHandle,
    FileStateHandle,
    InputChannelStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
    OperatorStateMeta,
)
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot


def _channel_state(
    path: str = "/ck/job/chk-3/channel-state-0", sizes: tuple[int, ...] = (5, 0, 7)
) -> tuple[InputChannelStateHandle, ...]:
    stream = FileStateHandle(path, sum(sizes), "ab" * 32)
    handles = []
    offset = 0
    for channel, size in enumerate(sizes):
        handles.append(InputChannelStateHandle(channel, stream, offset, size))
        offset += size
    return tuple(handles)


def test_channel_state_counts_in_size_and_emptiness() -> None:
    state = OperatorSubtaskState(input_channel_state=_channel_state())
    assert state.state_size == 12
    assert state.channel_state_size == 12
    assert not state.is_empty()
    assert OperatorSubtaskState().is_empty()


def test_a_shared_channel_state_stream_is_discarded_once() -> None:
    operator_stream = ByteStreamStateHandle("op", b"xyz")
    operator = OperatorStateHandle(
        {"s": OperatorStateMeta(OperatorStateDistributionMode.SPLIT_DISTRIBUTE, ((0, 3),))}, operator_stream
    )
    channels = _channel_state()
    state = OperatorSubtaskState(managed_operator_state=(operator,), input_channel_state=channels)
    assert list(state.stream_handles()) == [operator_stream, channels[0].delegate]
    assert list(state.uploaded_handles()) == [operator_stream, channels[0].delegate]
    assert TaskStateSnapshot({"op": state}).file_handles() == [channels[0].delegate]


def test_invalid_channel_state_handle_is_refused() -> None:
    with pytest.raises(ValueError, match="channel -1"):
        InputChannelStateHandle(-1, ByteStreamStateHandle("c", b""), 0, 0)
