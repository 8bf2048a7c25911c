"""Restart strategies: Flink 2's exponential-delay default, its backoff sequence (driven by a
manual clock and seeded jitter), fixed-delay and none, and the settings refused or warned of."""

from __future__ import annotations

import logging
import random
import re

import pytest

from chandy import StreamExecutionEnvironment
from chandy.config import Configuration
from chandy.errors import ConfigurationError
from chandy.runtime.restart_strategy import (
    UNLIMITED,
    ExponentialDelayRestartBackoffTimeStrategy,
    FixedDelayRestartBackoffTimeStrategy,
    NoRestartBackoffTimeStrategy,
    restart_strategy_from,
)
from chandy.util.clock import ManualClock

CHECKPOINTING = {"execution.checkpointing.interval": 1000}
FAILURE = RuntimeError("induced")


def exponential(
    clock: ManualClock, seed: int = 1, **settings: object
) -> ExponentialDelayRestartBackoffTimeStrategy:
    strategy = restart_strategy_from(
        Configuration({**CHECKPOINTING, **settings}), clock=clock, rng=random.Random(seed)
    )
    assert isinstance(strategy, ExponentialDelayRestartBackoffTimeStrategy)
    return strategy


def backoffs(strategy: ExponentialDelayRestartBackoffTimeStrategy, clock: ManualClock, n: int) -> list[int]:
    """The waits of ``n`` failures in a row, each one the moment its restart happened."""
    waits = []
    for _ in range(n):
        strategy.notify_failure(FAILURE)
        assert strategy.can_restart()
        waits.append(strategy.get_backoff_time_ms())
        clock.advance_ms(waits[-1] + 1)  # the restart, and a failure just after it
    return waits


def test_with_checkpointing_and_no_strategy_the_default_is_flinks_exponential_delay() -> None:
    strategy = exponential(ManualClock())
    assert strategy.initial_backoff_ms == 1000
    assert strategy.max_backoff_ms == 60_000
    assert strategy.backoff_multiplier == 1.5
    assert strategy.reset_threshold_ms == 3_600_000
    assert strategy.jitter_factor == 0.1
    assert strategy.max_attempts is None  # attempts-before-reset-backoff: unlimited
    assert isinstance(restart_strategy_from(Configuration()), NoRestartBackoffTimeStrategy)


def test_the_backoff_grows_by_the_multiplier_up_to_the_maximum_without_jitter() -> None:
    clock = ManualClock()
    strategy = exponential(clock, **{"restart-strategy.exponential-delay.jitter-factor": 0})
    assert backoffs(strategy, clock, 12) == [
        1000,
        1500,
        2250,
        3375,
        5062,
        7593,
        11390,
        17085,
        25628,
        38443,
        57665,
        60000,  # max-backoff
    ]


def test_seeded_jitter_is_deterministic_and_within_the_factor() -> None:
    first = backoffs(exponential(clock := ManualClock(), seed=7), clock, 8)
    again = backoffs(exponential(clock := ManualClock(), seed=7), clock, 8)
    other = backoffs(exponential(clock := ManualClock(), seed=8), clock, 8)
    assert first == again
    assert first != other
    for n, wait in enumerate(first):
        base = int(1000 * 1.5**n)
        assert max(1000, base - base // 10) <= wait <= base + base // 10, (n, wait)


def test_a_job_that_ran_past_the_threshold_starts_again_from_the_initial_backoff() -> None:
    clock = ManualClock()
    strategy = exponential(
        clock,
        **{
            "restart-strategy.exponential-delay.jitter-factor": 0,
            "restart-strategy.exponential-delay.reset-backoff-threshold": "10 min",
        },
    )
    assert backoffs(strategy, clock, 3) == [1000, 1500, 2250]
    clock.advance_ms(10 * 60_000)  # ran 10 minutes since its last restart
    assert backoffs(strategy, clock, 2) == [1000, 1500]


def test_failures_while_a_restart_is_scheduled_count_once_and_the_delay_runs_from_the_failure() -> None:
    clock = ManualClock()
    strategy = exponential(clock, **{"restart-strategy.exponential-delay.jitter-factor": 0})
    strategy.notify_failure(FAILURE)
    clock.advance_ms(400)  # another task of the same attempt fails, while cancelling
    strategy.notify_failure(FAILURE)
    assert strategy.attempt == 1
    assert strategy.get_backoff_time_ms() == 600


def test_attempts_before_reset_bound_the_restarts() -> None:
    clock = ManualClock()
    strategy = exponential(
        clock,
        **{
            "restart-strategy.type": "exponentialdelay",  # Flink's alias
            "restart-strategy.exponential-delay.attempts-before-reset-backoff": 2,
            "restart-strategy.exponential-delay.initial-backoff": "1 ms",
        },
    )
    assert strategy.max_attempts == 2
    backoffs(strategy, clock, 2)
    strategy.notify_failure(FAILURE)
    assert not strategy.can_restart()


def test_fixed_delay_and_none_are_kept() -> None:
    explicit = restart_strategy_from(
        Configuration({"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "2 s"})
    )
    assert isinstance(explicit, FixedDelayRestartBackoffTimeStrategy)
    assert (explicit.max_attempts, explicit.delay_ms) == (1, 2000)  # Flink's default attempts: 1
    # With checkpointing and no type, a fixed-delay key chooses fixed-delay (unlimited attempts).
    chosen = restart_strategy_from(Configuration({**CHECKPOINTING, "restart-strategy.fixed-delay.delay": 0}))
    assert isinstance(chosen, FixedDelayRestartBackoffTimeStrategy)
    assert chosen.max_attempts is None and chosen._limit == UNLIMITED
    off = Configuration({**CHECKPOINTING, "restart-strategy.type": "none"})
    assert isinstance(restart_strategy_from(off), NoRestartBackoffTimeStrategy)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {
                "restart-strategy.exponential-delay.initial-backoff": "2 min",
                "restart-strategy.exponential-delay.max-backoff": "1 min",
            },
            "initial-backoff (120000 ms) is above restart-strategy.exponential-delay.max-backoff",
        ),
        (
            {"restart-strategy.exponential-delay.backoff-multiplier": 1},
            "backoff-multiplier': 1.0 is not above 1.0",
        ),
        (
            {"restart-strategy.exponential-delay.jitter-factor": "lots"},
            "jitter-factor': 'lots' is not a number",
        ),
        ({"restart-strategy.exponential-delay.initial-backoff": 0}, "below the minimum 1 ms"),
        ({"restart-strategy.type": "failure-rate"}, "is not one of exponential-delay"),
    ],
)
def test_bad_settings_are_refused_when_the_job_is_built(settings: dict[str, object], message: str) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.enable_checkpointing(1000)
    env.configure(settings)
    env.from_collection([1]).print()
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        env.get_execution_plan()


def test_keys_of_a_strategy_not_in_use_are_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.enable_checkpointing(1000)
    env.configure({"restart-strategy.type": "none", "restart-strategy.fixed-delay.attempts": 3})
    env.from_collection([1]).print()
    with caplog.at_level(logging.WARNING, logger="chandy"):
        env.get_execution_plan()
    assert (
        "restart-strategy.fixed-delay.attempts has no effect: the job's restart strategy is no restarts"
        in (caplog.text)
    )
