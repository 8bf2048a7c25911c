"""The state format of unaligned checkpoints: input channel state handles on a subtask's state,
their place in sizes and discards, and the ``_metadata`` version that carries them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.checkpoint.metadata import VERSION_SIGNED, CheckpointMetadata, deserialize, serialize
from chandy.checkpoint.operator_state import OperatorState
from chandy.errors import InvalidCheckpointError
from chandy.network.channel_state import decode_payloads, encode_payloads
from chandy.state.handles import (
    ByteStreamStateHandle,
    FileStateHandle,
    InputChannelStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
    OperatorStateMeta,
)
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot
from chandy.storage.checkpoint_storage import CheckpointStorage, StateReader
from chandy.storage.snapshot_key import SnapshotKey


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


# ---------------------------------------------------------------------- _metadata version 3


JOB_ID = "c4a77e15c4a77e15c4a77e15c4a77e15"


def metadata_with(subtask: OperatorSubtaskState, checkpoint_id: int = 3) -> CheckpointMetadata:
    operator = OperatorState("map", 2, 128, name="map")
    operator.put_state(1, subtask)
    return CheckpointMetadata(checkpoint_id, JOB_ID, 1_000, "CHECKPOINT", [operator])


def written_channel_state(
    storage: CheckpointStorage, checkpoint_id: int
) -> tuple[InputChannelStateHandle, ...]:
    """The channel state stream of one subtask as a task writes it: channels 0 and 2 hold items."""
    channels = {0: [b"a" * 300, b"bc"], 2: [b"d" * storage.inline_threshold]}
    chunks: list[bytes] = []
    layout: list[tuple[int, int, int]] = []
    offset = 0
    for channel, payloads in channels.items():
        encoded = encode_payloads(payloads)
        chunks.append(encoded)
        layout.append((channel, offset, len(encoded)))
        offset += len(encoded)
    stream = storage.write_state(checkpoint_id, b"".join(chunks))
    assert isinstance(stream, FileStateHandle)
    return tuple(InputChannelStateHandle(channel, stream, start, length) for channel, start, length in layout)


def version_of(data: bytes) -> int:
    return int.from_bytes(data[8:12], "big")


KEY = SnapshotKey(b"channel state test key", "test")


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    storage = CheckpointStorage(str(tmp_path), JOB_ID)
    storage.initialize()
    return storage


def test_channel_state_round_trips_in_a_version_3_file_with_relative_paths(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    channels = written_channel_state(storage, 3)
    metadata = metadata_with(OperatorSubtaskState(input_channel_state=channels))
    data = serialize(metadata, storage.signing_key(), storage.checkpoint_dir(3))
    storage.write_metadata(3, data)

    assert version_of(data) == VERSION_SIGNED
    body = json.loads(data[20:-72])
    stored = body["operators"][0]["subtasks"]["1"]["channels"][0]
    assert stored["delegate"]["type"] == "file" and "/" not in stored["delegate"]["path"]
    assert deserialize(data, "m", storage.checkpoint_dir(3), key=storage.signing_key()) == metadata

    moved = tmp_path / "moved-chk"
    os.rename(storage.checkpoint_dir(3), moved)
    loaded, _ = load_checkpoint_metadata(str(moved), storage.signing_key())
    (restored,) = loaded.operator_states[0].subtask_states.values()
    assert [h.channel_index for h in restored.input_channel_state] == [0, 2]
    reader = StateReader()
    for handle in restored.input_channel_state:
        assert isinstance(handle.delegate, FileStateHandle)
        assert handle.delegate.path.startswith(str(moved) + os.sep)
    first, second = restored.input_channel_state
    assert decode_payloads(
        reader.read(first.delegate, (first.offset, first.offset + first.length)), "c0"
    ) == [
        b"a" * 300,
        b"bc",
    ]
    assert len(
        decode_payloads(reader.read(second.delegate, (second.offset, second.offset + second.length)), "")[0]
    ) == (storage.inline_threshold)


def test_a_checkpoint_without_channel_state_writes_no_channels() -> None:
    operator_stream = ByteStreamStateHandle("op", b"xyz")
    operator = OperatorStateHandle(
        {"s": OperatorStateMeta(OperatorStateDistributionMode.SPLIT_DISTRIBUTE, ((0, 3),))}, operator_stream
    )
    data = serialize(metadata_with(OperatorSubtaskState(managed_operator_state=(operator,))), KEY)
    assert "channels" not in json.loads(data[20:-72])["operators"][0]["subtasks"]["1"]
    assert deserialize(data, "m", key=KEY).operator_states[0].subtask_states[1].input_channel_state == ()


def rewritten(data: bytes, version: int) -> bytes:
    """A signed file's body as an unsigned file of ``version`` (as chandy before 4 wrote)."""
    head = data[:8] + version.to_bytes(4, "big") + data[12:-72]
    return head + hashlib.sha256(head).digest()


def test_channel_state_in_an_older_version_file_is_a_clear_error() -> None:
    channels = (InputChannelStateHandle(0, ByteStreamStateHandle("c", b"\x00\x00\x00\x01x"), 0, 5),)
    data = serialize(metadata_with(OperatorSubtaskState(input_channel_state=channels)), KEY)
    assert (
        deserialize(data, "m", key=KEY).operator_states[0].subtask_states[1].input_channel_state == channels
    )
    with pytest.raises(
        InvalidCheckpointError, match="m has a valid checksum.*input channel state in a version 1"
    ):
        deserialize(rewritten(data, 1), "m", trust=True)


def test_an_unknown_version_names_every_readable_one() -> None:
    data = serialize(metadata_with(OperatorSubtaskState()), KEY)
    with pytest.raises(InvalidCheckpointError, match="version 5; this chandy reads versions 1, 2, 3, 4"):
        deserialize(rewritten(data, 5), "m", trust=True)


# ---------------------------------------------------------------------- chandy checkpoint inspect

ROOT = Path(__file__).resolve().parents[1]


def chandy(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``chandy`` command of this working tree, in a process of its own."""
    command = [sys.executable, "-c", "from chandy.cli.main import main; main()", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.slow
def test_checkpoint_inspect_lists_the_channel_state(storage: CheckpointStorage) -> None:
    """The installed command, on a real ``chk-N``: per subtask the channels holding in-flight
    data and their bytes, a summary line, and the channel state file among the state files."""
    channels = written_channel_state(storage, 3)
    metadata = metadata_with(OperatorSubtaskState(input_channel_state=channels))
    pointer = storage.write_metadata(3, serialize(metadata, storage.signing_key(), storage.checkpoint_dir(3)))
    assert pointer is not None

    result = chandy("checkpoint", "inspect", pointer, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["format_version"] == VERSION_SIGNED and report["valid"]
    assert report["authentication"] == "valid"
    sizes = {h.channel_index: h.length for h in channels}
    assert report["operators"][0]["subtasks"][1]["channel_state"] == {str(c): n for c, n in sizes.items()}
    assert report["operators"][0]["subtasks"][0]["channel_state"] == {}
    assert report["in_flight_bytes"] == sum(sizes.values())
    (state_file,) = report["state_files"]
    assert state_file["path"] == channels[0].delegate.path  # type: ignore[attr-defined]

    text = chandy("checkpoint", "inspect", pointer, "--verify")
    assert text.returncode == 0, text.stderr
    total = sum(sizes.values())
    assert (
        f"  in-flight data:  {total / 1024:.1f} KiB in 2 input channels of 1 subtask (unaligned"
        in text.stdout
    )
    assert (
        f"    in-flight data: {total / 1024:.1f} KiB in 2 input channels (0: {sizes[0]} B, 2: " in text.stdout
    )


def test_checkpoint_inspect_says_an_aligned_checkpoint_holds_no_in_flight_data(
    storage: CheckpointStorage,
) -> None:
    pointer = storage.write_metadata(
        4, serialize(metadata_with(OperatorSubtaskState(), 4), storage.signing_key())
    )
    assert pointer is not None
    result = chandy("checkpoint", "inspect", pointer)
    assert result.returncode == 0, result.stderr
    assert "  in-flight data:  none (no channel state" in result.stdout


def test_a_missing_channel_state_file_is_named_before_a_restore(storage: CheckpointStorage) -> None:
    channels = written_channel_state(storage, 5)
    pointer = storage.write_metadata(
        5,
        serialize(
            metadata_with(OperatorSubtaskState(input_channel_state=channels), 5),
            storage.signing_key(),
            storage.checkpoint_dir(5),
        ),
    )
    assert pointer is not None
    stream = channels[0].delegate
    assert isinstance(stream, FileStateHandle)
    os.remove(stream.path)
    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint_metadata(pointer, storage.signing_key())
    assert f"state file {stream.path} referenced by" in str(error.value) and "is missing" in str(error.value)
