"""Shared fixtures. Everything runs for real: threads, channels, files."""

from __future__ import annotations

import logging

import pytest

from chandy import StreamExecutionEnvironment


@pytest.fixture(autouse=True)
def _chandy_logging(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chandy")


@pytest.fixture
def local_env() -> StreamExecutionEnvironment:
    """An environment on the local executor with parallelism 2."""
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(2)
    return env
