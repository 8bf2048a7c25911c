"""Restart strategies: whether, and after how long, a failed job restarts."""

from __future__ import annotations

from abc import ABC, abstractmethod

from chandy.config import Configuration
from chandy.config.options import CheckpointingOptions, RestartStrategyOptions

UNLIMITED = 2_147_483_647  # Flink's Integer.MAX_VALUE restart attempts


class RestartBackoffTimeStrategy(ABC):
    @abstractmethod
    def notify_failure(self, cause: BaseException) -> None: ...

    @abstractmethod
    def can_restart(self) -> bool: ...

    @abstractmethod
    def get_backoff_time_ms(self) -> int: ...

    def describe(self) -> str:
        return type(self).__name__


class NoRestartBackoffTimeStrategy(RestartBackoffTimeStrategy):
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
        self.max_attempts = max_attempts
        self.delay_ms = delay_ms
        self.failures = 0

    def notify_failure(self, cause: BaseException) -> None:
        self.failures += 1

    def can_restart(self) -> bool:
        return self.failures <= self.max_attempts

    def get_backoff_time_ms(self) -> int:
        return self.delay_ms

    def describe(self) -> str:
        attempts = "unlimited" if self.max_attempts >= UNLIMITED else str(self.max_attempts)
        return f"fixed delay ({attempts} attempts, {self.delay_ms} ms delay)"


def restart_strategy_from(config: Configuration) -> RestartBackoffTimeStrategy:
    """Flink's defaults: none unless configured; fixed-delay (unlimited, 1 s) when
    checkpointing is on and no strategy is set."""
    kind = config.get(RestartStrategyOptions.TYPE)
    checkpointing = config.get(CheckpointingOptions.INTERVAL) is not None
    delay = config.get(RestartStrategyOptions.DELAY)
    attempts = config.get(RestartStrategyOptions.ATTEMPTS)
    if kind is None:
        if not checkpointing:
            return NoRestartBackoffTimeStrategy()
        return FixedDelayRestartBackoffTimeStrategy(UNLIMITED if attempts is None else attempts, delay)
    if kind in ("fixed-delay", "fixeddelay"):
        return FixedDelayRestartBackoffTimeStrategy(1 if attempts is None else attempts, delay)
    return NoRestartBackoffTimeStrategy()
