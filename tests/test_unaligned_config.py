"""Unaligned checkpoints' settings: PyFlink's ``CheckpointConfig`` methods, Flink's keys, and the
combinations ``execute()`` refuses (issue 16)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from chandy.api.environment import StreamExecutionEnvironment
from chandy.checkpoint.loader import load_checkpoint_metadata
from chandy.checkpoint.metadata import serialize
from chandy.config.options import CheckpointingMode, CheckpointingOptions
from chandy.core.time import Duration, Time
from chandy.datastream.checkpoint_config import CheckpointConfig
from chandy.errors import ConfigurationError, InvalidCheckpointError
from chandy.network.channel_state import encode_payloads
from chandy.state.handles import ByteStreamStateHandle, InputChannelStateHandle
from chandy.state.snapshot import OperatorSubtaskState
from chandy.storage.checkpoint_storage import METADATA_FILE_NAME
from chandy.storage.snapshot_key import SnapshotKey, environment_key
from tests.jobs import KeyedCounter, Throttle
from tests.test_restore import KEYS, N, counter_job, restored_env, retained_run


def local_env() -> StreamExecutionEnvironment:
    return StreamExecutionEnvironment.get_execution_environment(executor="local")


def test_unaligned_checkpoints_are_off_by_default_with_a_zero_timeout() -> None:
    config = local_env().get_checkpoint_config()
    assert isinstance(config, CheckpointConfig)
    assert not config.is_unaligned_checkpoints_enabled()
    assert config.get_aligned_checkpoint_timeout() == Duration.of_millis(0)


def test_enable_and_disable_write_flinks_key() -> None:
    env = local_env()
    config = env.get_checkpoint_config()
    assert config.enable_unaligned_checkpoints() is config
    assert config.is_unaligned_checkpoints_enabled()
    assert env.get_configuration().get(CheckpointingOptions.UNALIGNED) is True
    config.enable_unaligned_checkpoints(False)
    assert not config.is_unaligned_checkpoints_enabled()
    config.enable_unaligned_checkpoints(True).disable_unaligned_checkpoints()
    assert env.get_configuration().get(CheckpointingOptions.UNALIGNED) is False
    with pytest.raises(TypeError, match="takes a bool"):
        config.enable_unaligned_checkpoints("yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("timeout", "millis"),
    [(Duration.of_seconds(30), 30_000), (Time.milliseconds(250), 250), (1_500, 1_500), (0, 0)],
    ids=["duration", "time", "int-ms", "zero"],
)
def test_aligned_checkpoint_timeout_takes_a_duration_or_milliseconds(
    timeout: Duration | Time | int, millis: int
) -> None:
    env = local_env()
    config = env.get_checkpoint_config().set_aligned_checkpoint_timeout(timeout)
    assert config.get_aligned_checkpoint_timeout() == Duration.of_millis(millis)
    assert env.get_configuration().get(CheckpointingOptions.ALIGNED_CHECKPOINT_TIMEOUT) == millis


def test_a_bad_aligned_checkpoint_timeout_is_refused_at_once() -> None:
    config = local_env().get_checkpoint_config()
    with pytest.raises(TypeError, match="aligned checkpoint timeout must be a Duration"):
        config.set_aligned_checkpoint_timeout("30 s")  # type: ignore[arg-type]
    config.set_aligned_checkpoint_timeout(Duration.of_millis(300))
    with pytest.raises(ConfigurationError, match="aligned-checkpoint-timeout"):
        config.set_aligned_checkpoint_timeout(-1)
    # The refused value was not stored: the setting is the one before the mistake.
    assert config.get_aligned_checkpoint_timeout() == Duration.of_millis(300)


def test_pyflinks_force_unaligned_switch_is_accepted_and_read_back() -> None:
    env = local_env()
    config = env.get_checkpoint_config()
    assert not config.is_force_unaligned_checkpoints()
    assert config.set_force_unaligned_checkpoints(True) is config
    assert config.is_force_unaligned_checkpoints()
    assert env.get_configuration().to_dict()["execution.checkpointing.unaligned.forced"] is True
    with pytest.raises(TypeError, match="takes a bool"):
        config.set_force_unaligned_checkpoints("yes")  # type: ignore[arg-type]


def test_buffer_debloat_keys_are_refused_saying_what_bounds_in_flight_data() -> None:
    env = local_env().configure({"taskmanager.network.memory.buffer-debloat.enabled": "true"})
    env.from_collection([1, 2, 3]).print()
    with pytest.raises(ConfigurationError) as error:
        env.execute("debloat")
    message = str(error.value)
    assert "buffer debloating is not implemented" in message
    assert "taskmanager.network.memory.buffers-per-channel" in message
    assert "did you mean" not in message


def test_the_deprecated_alignment_timeout_methods_still_work_and_warn() -> None:
    config = local_env().get_checkpoint_config()
    with pytest.warns(DeprecationWarning, match="use set_aligned_checkpoint_timeout"):
        config.set_alignment_timeout(Duration.of_millis(700))
    with pytest.warns(DeprecationWarning, match="use get_aligned_checkpoint_timeout"):
        assert config.get_alignment_timeout() == Duration.of_millis(700)
    assert config.get_aligned_checkpoint_timeout() == Duration.of_millis(700)


def test_flinks_keys_and_their_deprecated_spellings_configure_the_same() -> None:
    env = local_env().configure(
        {
            "execution.checkpointing.unaligned": "true",
            "execution.checkpointing.alignment-timeout": "2 s",
            "execution.checkpointing.unaligned.max-subtasks-per-channel-state-file": 3,
        }
    )
    config = env.get_checkpoint_config()
    assert config.is_unaligned_checkpoints_enabled()
    assert config.get_aligned_checkpoint_timeout() == Duration.of_seconds(2)
    assert env.get_configuration().get(CheckpointingOptions.MAX_SUBTASKS_PER_CHANNEL_STATE_FILE) == 3


def job(env: StreamExecutionEnvironment) -> None:
    env.enable_checkpointing(100)
    env.get_checkpoint_config().enable_unaligned_checkpoints()
    env.from_collection([1, 2, 3]).map(lambda x: x + 1).print()


def test_execute_refuses_unaligned_checkpoints_in_at_least_once_mode() -> None:
    env = local_env()
    job(env)
    env.get_checkpoint_config().set_checkpointing_mode(CheckpointingMode.AT_LEAST_ONCE)
    with pytest.raises(ConfigurationError) as error:
        env.execute("unaligned at least once")
    assert "execution.checkpointing.mode is AT_LEAST_ONCE: unaligned checkpoints need EXACTLY_ONCE" in str(
        error.value
    )


def test_unaligned_settings_are_not_checked_for_a_job_that_never_checkpoints() -> None:
    env = local_env().configure(
        {"execution.checkpointing.unaligned.enabled": "true", "execution.checkpointing.mode": "AT_LEAST_ONCE"}
    )
    env.from_collection([1, 2, 3]).map(lambda x: x + 1).print()
    env.execute("no checkpoints")  # a shared configuration must not fail a job without checkpoints


def test_execute_refuses_unaligned_checkpoints_with_concurrent_checkpoints() -> None:
    env = local_env()
    job(env)
    env.get_checkpoint_config().set_max_concurrent_checkpoints(3)
    with pytest.raises(
        ConfigurationError, match="max-concurrent-checkpoints is 3: unaligned checkpoints run one"
    ):
        env.execute("unaligned concurrent")


def test_a_bad_max_subtasks_per_channel_state_file_is_refused() -> None:
    env = local_env().configure({"execution.checkpointing.unaligned.max-subtasks-per-channel-state-file": 0})
    with pytest.raises(ConfigurationError, match="max-subtasks-per-channel-state-file"):
        env.get_configuration().get(CheckpointingOptions.MAX_SUBTASKS_PER_CHANNEL_STATE_FILE)


# ---------------------------------------------------------------------- restore: rescaling refused


def with_channel_state(checkpoint: Path, uid: str) -> None:
    """Rewrite a retained checkpoint's ``_metadata`` as an unaligned checkpoint's: in-flight data
    on two input channels of subtask 0 of the operator with ``uid``."""
    metadata, directory = load_checkpoint_metadata(str(checkpoint), suite_key())
    (operator,) = [op for op in metadata.operator_states if op.uid == uid]
    stream = ByteStreamStateHandle("in-flight", encode_payloads([b"x" * 10]) * 2)
    half = len(stream.data) // 2
    channels = (InputChannelStateHandle(0, stream, 0, half), InputChannelStateHandle(1, stream, half, half))
    old = operator.subtask_states.get(0, OperatorSubtaskState())
    operator.put_state(0, dataclasses.replace(old, input_channel_state=channels))
    (checkpoint / METADATA_FILE_NAME).write_bytes(serialize(metadata, suite_key(), directory))


@pytest.mark.slow
def test_restoring_an_unaligned_checkpoint_at_another_parallelism_is_refused_at_submit(
    tmp_path: Path,
) -> None:
    """The whole path: a real retained checkpoint holding channel state, a job built again with
    another parallelism of the operator, then of the vertex feeding it (its input channels)."""
    _, retained = retained_run(tmp_path / "a")
    with_channel_state(retained, "counter")

    env = restored_env(tmp_path / "b", retained, parallelism=3)
    counter_job(env).print()
    with pytest.raises(InvalidCheckpointError) as info:
        env.execute()
    message = str(info.value)
    assert message.startswith(f"{retained}: operator ")
    assert "(uid 'counter') cannot be restored because its parallelism changed from 2 to 3" in message
    assert "unaligned and holds in-flight data" in message and "Restore it at parallelism 2 first" in message

    env = restored_env(tmp_path / "c", retained, parallelism=2)
    stream = env.from_sequence(0, N - 1).uid("source").map(Throttle(0.0)).uid("throttle").set_parallelism(3)
    stream.key_by(lambda x: x % KEYS).process(KeyedCounter(N // KEYS)).uid("counter").print()
    with pytest.raises(InvalidCheckpointError) as info:
        env.execute()
    message = str(info.value)
    assert "(uid 'counter') cannot be restored because its number of input channels changed" in message
    assert "upstream operator 'Map' (uid 'throttle', operator id" in message and "from 2 to 3" in message


def suite_key() -> SnapshotKey:
    """The test suite's snapshot key (tests/conftest.py), which the jobs here sign and check with."""
    key = environment_key()
    assert key is not None
    return key
