"""Unaligned checkpoints' settings: PyFlink's ``CheckpointConfig`` methods, Flink's keys, and the
combinations ``execute()`` refuses (issue 16)."""

from __future__ import annotations

import pytest

from chandy.api.environment import StreamExecutionEnvironment
from chandy.config.options import CheckpointingMode, CheckpointingOptions
from chandy.core.time import Duration, Time
from chandy.datastream.checkpoint_config import CheckpointConfig
from chandy.errors import ConfigurationError


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
    with pytest.raises(ConfigurationError, match="aligned-checkpoint-timeout"):
        config.set_aligned_checkpoint_timeout(-1)


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
