"""Configuration by Flink's keys: parsing, defaults, aliases and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from chandy import Configuration, ConfigurationError, StreamExecutionEnvironment
from chandy.config import parse_duration_ms
from chandy.config.options import CoreOptions, ExecutionOptions, PipelineOptions


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        (500, 500),
        ("500", 500),
        ("500 ms", 500),
        ("1s", 1000),
        ("10 min", 600_000),
        ("1.5 s", 1500),
        ("2 h", 7_200_000),
    ],
)
def test_durations_parse_like_flink(text: object, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["soon", "5 fortnights", -1, True, "1 0 s"])
def test_bad_durations_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(bad)


def test_typed_get_with_defaults_and_deprecated_alias() -> None:
    config = Configuration({"execution.buffer-timeout.interval": "5 ms"})
    assert config.get(ExecutionOptions.BUFFER_TIMEOUT) == 5
    assert config.get(CoreOptions.DEFAULT_PARALLELISM) == 1


def test_bad_value_names_key_value_and_allowed() -> None:
    config = Configuration({"parallelism.default": "many"})
    with pytest.raises(ConfigurationError) as info:
        config.get(CoreOptions.DEFAULT_PARALLELISM)
    message = str(info.value)
    assert "parallelism.default" in message and "'many'" in message and "integer" in message


def test_unknown_key_is_rejected_at_execute_with_a_suggestion() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.configure({"parallelism.defualt": 2})
    env.from_collection([1]).print()
    with pytest.raises(ConfigurationError, match="did you mean 'parallelism.default'"):
        env.execute()


def test_bad_value_is_rejected_at_execute() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.configure({"execution.buffer-timeout": "whenever"})
    env.from_collection([1]).print()
    with pytest.raises(ConfigurationError, match="execution.buffer-timeout"):
        env.execute()


def test_unknown_executor_is_rejected_at_once() -> None:
    with pytest.raises(ConfigurationError, match="execution.target"):
        StreamExecutionEnvironment.get_execution_environment(executor="mainframe")


def test_configuration_from_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("parallelism:\n  default: 3\npipeline.max-parallelism: 64\n")
    config = Configuration.from_file(path)
    assert config.get(CoreOptions.DEFAULT_PARALLELISM) == 3
    assert config.get(PipelineOptions.MAX_PARALLELISM) == 64
    env = StreamExecutionEnvironment.get_execution_environment(config, executor="local")
    assert env.get_parallelism() == 3


def test_missing_or_broken_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read configuration file"):
        Configuration.from_file(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [unclosed\n")
    with pytest.raises(ConfigurationError, match="not valid YAML"):
        Configuration.from_file(bad)


def test_a_config_file_is_checked_when_read_naming_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("execution:\n  checkpointing:\n    interval: 10 s\nparallelism.default: four\n")
    with pytest.raises(ConfigurationError) as bad_value:
        Configuration.from_file(path)
    assert str(bad_value.value).startswith(
        f"configuration file '{path}', line 4: invalid value for 'parallelism.default': 'four' is not "
        "an integer"
    )
    path.write_text("parallelism.default: 2\nexecution:\n  checkpointing:\n    intervall: 10 s\n")
    with pytest.raises(ConfigurationError) as unknown:
        Configuration.from_file(path)
    assert str(unknown.value) == (
        f"configuration file '{path}', line 4: unknown configuration key "
        "'execution.checkpointing.intervall'; did you mean 'execution.checkpointing.interval'?"
    )


def test_setters_validate_at_once() -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    with pytest.raises(ConfigurationError, match="parallelism.default"):
        env.set_parallelism(0)
    with pytest.raises(ConfigurationError, match="pipeline.max-parallelism"):
        env.set_max_parallelism(40000)
