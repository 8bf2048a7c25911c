"""Restart strategies: whether, and after how long, a failed job restarts (Flink's).

``exponential-delay`` is the default with checkpointing on, as in Flink 2: the first
restart waits ``initial-backoff`` (1 s), each further one ``backoff-multiplier`` (1.5)
times longer, up to ``max-backoff`` (1 min), each moved by up to ``jitter-factor`` (10 %)
of itself; a job that ran ``reset-backoff-threshold`` (1 h) since its last restart starts
again from the initial backoff. A job that fails in a loop therefore slows down instead
of burning the machine, and one that fails once a day restarts after a second.

The strategies take their clock and their randomness as arguments, so a test drives
the backoff sequence with a manual clock and a seeded generator.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod

from chandy.config import Configuration
from chandy.config.options import CheckpointingOptions, RestartStrategyOptions
from chandy.errors import ConfigurationError
from chandy.util.clock import Clock, SystemClock

UNLIMITED = 2_147_483_647  # Flink's Integer.MAX_VALUE restart attempts

#: ``restart-strategy.type`` spellings (Flink's aliases) by canonical name.
_KINDS = {
    "exponential-delay": "exponential-delay",
    "exponentialdelay": "exponential-delay",
    "fixed-delay": "fixed-delay",
    "fixeddelay": "fixed-delay",
    "none": "none",
    "off": "none",
    "disable": "none",
    "no_restart": "none",
}


def describe_delay(ms: float) -> str:
    """A delay for a person: ``0 ms``, ``250 ms``, ``1.5 s``, ``1 min``."""
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.3g} s"
    return f"{ms / 60_000:.3g} min"


class RestartBackoffTimeStrategy(ABC):
    """Flink's ``RestartBackoffTimeStrategy``: told of each failure, says whether the job
    may restart and how long to wait first."""

    #: The most restarts allowed (``None``: unlimited), for "restart 2 of 3" in reports.
    max_attempts: int | None = None

    @abstractmethod
    def notify_failure(self, cause: BaseException) -> None: ...

    @abstractmethod
    def can_restart(self) -> bool: ...

    @abstractmethod
    def get_backoff_time_ms(self) -> int: ...

    def describe(self) -> str:
        return type(self).__name__


class NoRestartBackoffTimeStrategy(RestartBackoffTimeStrategy):
    max_attempts = 0

    def notify_failure(self, cause: BaseException) -> None:
        pass

    def can_restart(self) -> bool:
        return False

    def get_backoff_time_ms(self) -> int:
        return 0

    def describe(self) -> str:
        return "no restarts"


class FixedDelayRestartBackoffTimeStrategy(RestartBackoffTimeStrategy):
    """Up to ``max_attempts`` restarts, ``delay_ms`` after each failure."""

    def __init__(self, max_attempts: int, delay_ms: int) -> None:
        if max_attempts < 0 or delay_ms < 0:
            raise ValueError("restart attempts and delay must be >= 0")
        self.max_attempts = None if max_attempts >= UNLIMITED else max_attempts
        self._limit = max_attempts
        self.delay_ms = delay_ms
        self.failures = 0

    def notify_failure(self, cause: BaseException) -> None:
        self.failures += 1

    def can_restart(self) -> bool:
        return self.failures <= self._limit

    def get_backoff_time_ms(self) -> int:
        return self.delay_ms

    def describe(self) -> str:
        attempts = "unlimited" if self.max_attempts is None else str(self.max_attempts)
        return f"fixed-delay: {attempts} attempts, {describe_delay(self.delay_ms)} apart"


class ExponentialDelayRestartBackoffTimeStrategy(RestartBackoffTimeStrategy):
    """Flink's exponential delay (its 1.19+ behaviour): restart ``n`` since the last reset
    waits ``initial * multiplier**n``, plus a jitter drawn from ``[-j, +j]`` with ``j =
    jitter_factor`` of it, kept within ``[initial, max]``. A failure more than
    ``reset_threshold_ms`` after the restart before it resets ``n`` (and the count of
    attempts). Failures while a restart is already scheduled count once, as in Flink."""

    def __init__(
        self,
        *,
        initial_backoff_ms: int,
        max_backoff_ms: int,
        backoff_multiplier: float,
        reset_threshold_ms: int,
        jitter_factor: float,
        attempts_before_reset: int = UNLIMITED,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if initial_backoff_ms < 1 or max_backoff_ms < 1 or reset_threshold_ms < 1:
            raise ValueError("backoffs and the reset threshold must be at least 1 ms")
        if initial_backoff_ms > max_backoff_ms:
            raise ValueError(
                f"restart-strategy.exponential-delay.initial-backoff ({initial_backoff_ms} ms) is above "
                f"restart-strategy.exponential-delay.max-backoff ({max_backoff_ms} ms): lower the "
                "initial backoff or raise the maximum"
            )
        if backoff_multiplier <= 1 or not 0 <= jitter_factor <= 1 or attempts_before_reset < 1:
            raise ValueError("multiplier must be > 1, jitter within [0, 1], attempts >= 1")
        self.initial_backoff_ms = initial_backoff_ms
        self.max_backoff_ms = max_backoff_ms
        self.backoff_multiplier = backoff_multiplier
        self.reset_threshold_ms = reset_threshold_ms
        self.jitter_factor = jitter_factor
        self.max_attempts = None if attempts_before_reset >= UNLIMITED else attempts_before_reset
        self._limit = attempts_before_reset
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        #: Restarts since the last reset (Flink's ``currentRestartAttempt``).
        self.attempt = 0
        self._next_restart_ms: int | None = None

    def notify_failure(self, cause: BaseException) -> None:
        now = self._clock.now_ms()
        if self._next_restart_ms is not None and now <= self._next_restart_ms:
            return  # the restart already scheduled covers this failure too
        if self._next_restart_ms is not None and now - self._next_restart_ms >= self.reset_threshold_ms:
            self.attempt = 0  # it ran long enough: start again from the initial backoff
        self._next_restart_ms = now + self._backoff_ms()
        self.attempt += 1

    def _backoff_ms(self) -> int:
        backoff = int(self.initial_backoff_ms * self.backoff_multiplier**self.attempt)
        offset = int(backoff * self.jitter_factor)
        jitter = self._rng.randint(-offset, offset) if offset else 0
        return max(self.initial_backoff_ms, min(backoff + jitter, self.max_backoff_ms))

    def can_restart(self) -> bool:
        return self.attempt <= self._limit

    def get_backoff_time_ms(self) -> int:
        if self._next_restart_ms is None:  # a restart no failure was counted for
            return self.initial_backoff_ms
        return max(0, self._next_restart_ms - self._clock.now_ms())

    def describe(self) -> str:
        attempts = "unlimited" if self.max_attempts is None else str(self.max_attempts)
        return (
            f"exponential-delay: {attempts} attempts, waits from {describe_delay(self.initial_backoff_ms)} "
            f"growing x{self.backoff_multiplier:g} up to {describe_delay(self.max_backoff_ms)}"
        )


def _set_keys(config: Configuration, kind: str) -> list[str]:
    return [key for key in RestartStrategyOptions.keys_of(kind) if config.contains(key)]


def restart_kind(config: Configuration) -> str:
    """The strategy ``config`` chooses, by its canonical name.

    Flink's defaults: ``none`` without checkpointing, ``exponential-delay`` with it. One
    difference: with checkpointing on and no type, a ``restart-strategy.fixed-delay.*`` key
    chooses ``fixed-delay`` (unlimited attempts unless it sets them), where Flink would
    ignore the key; the user who wrote it meant that strategy.
    """
    kind = config.get(RestartStrategyOptions.TYPE)
    if kind is not None:
        return _KINDS[kind]
    if config.get(CheckpointingOptions.INTERVAL) is None:
        return "none"
    fixed, exponential = _set_keys(config, "fixed-delay"), _set_keys(config, "exponential-delay")
    return "fixed-delay" if fixed and not exponential else "exponential-delay"


def ignored_restart_keys(config: Configuration) -> list[str]:
    """The ``restart-strategy.<kind>.*`` keys set for a strategy other than the one in use:
    a user who set them expected them to matter (the environment warns)."""
    kind = restart_kind(config)
    return [
        key
        for other in ("fixed-delay", "exponential-delay")
        if other != kind
        for key in _set_keys(config, other)
    ]


def restart_strategy_from(
    config: Configuration, clock: Clock | None = None, rng: random.Random | None = None
) -> RestartBackoffTimeStrategy:
    """The restart strategy ``config`` sets (see :func:`restart_kind`)."""
    kind = restart_kind(config)
    if kind == "none":
        return NoRestartBackoffTimeStrategy()
    if kind == "fixed-delay":
        attempts = config.get(RestartStrategyOptions.ATTEMPTS)
        explicit = config.get(RestartStrategyOptions.TYPE) is not None
        if attempts is None:
            attempts = 1 if explicit else UNLIMITED  # Flink's default, or what was chosen for it
        return FixedDelayRestartBackoffTimeStrategy(attempts, config.get(RestartStrategyOptions.DELAY))
    attempts = config.get(RestartStrategyOptions.ATTEMPTS_BEFORE_RESET)
    try:
        return ExponentialDelayRestartBackoffTimeStrategy(
            initial_backoff_ms=config.get(RestartStrategyOptions.INITIAL_BACKOFF),
            max_backoff_ms=config.get(RestartStrategyOptions.MAX_BACKOFF),
            backoff_multiplier=config.get(RestartStrategyOptions.BACKOFF_MULTIPLIER),
            reset_threshold_ms=config.get(RestartStrategyOptions.RESET_BACKOFF_THRESHOLD),
            jitter_factor=config.get(RestartStrategyOptions.JITTER_FACTOR),
            attempts_before_reset=UNLIMITED if attempts is None else attempts,
            clock=clock,
            rng=rng,
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
