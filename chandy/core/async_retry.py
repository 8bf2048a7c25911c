"""Retry strategies and predicates of async I/O (PyFlink's ``async_retry_strategies`` and
``async_retry_predicates``, and the ``AsyncRetryStrategy``/``AsyncRetryPredicate`` interfaces
of ``pyflink.datastream.functions``).

An :class:`AsyncRetryStrategy` decides, after an attempt of ``AsyncFunction.async_invoke``,
whether to try again: its predicate looks at the attempt's result (a list) or its
exception, ``can_retry(attempts)`` bounds the number of attempts, and
``get_backoff_time_millis(attempts)`` is the pause before the next one. The request's
timeout covers every attempt and pause together (Flink's rule): a request still retrying
when it runs out of time ends in ``AsyncFunction.timeout``.

The classes, their arguments and their arithmetic are PyFlink's, so a PyFlink job's
strategy ports unchanged. One difference: a bad argument raises :class:`ValueError`
naming it, where PyFlink uses ``assert`` (which ``python -O`` removes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, TypeVar

OUT = TypeVar("OUT")

#: A condition on an attempt's result that asks for another attempt.
ResultPredicate = Callable[[list[OUT]], bool]
#: A condition on an attempt's exception that asks for another attempt.
ExceptionPredicate = Callable[[Exception], bool]


class AsyncRetryPredicate(ABC, Generic[OUT]):
    """When an attempt is retried: a condition on its result, on its exception, or both."""

    @abstractmethod
    def result_predicate(self) -> ResultPredicate[OUT] | None:
        """A condition on the attempt's result (its list of outputs) that triggers a retry."""

    @abstractmethod
    def exception_predicate(self) -> ExceptionPredicate | None:
        """A condition on the exception the attempt raised that triggers a retry."""


class AsyncRetryStrategy(ABC, Generic[OUT]):
    """Whether, and after how long, a request of an ``AsyncFunction`` is tried again."""

    @abstractmethod
    def can_retry(self, current_attempts: int) -> bool:
        """Whether another attempt may follow ``current_attempts`` attempts (1 after the first)."""

    @abstractmethod
    def get_backoff_time_millis(self, current_attempts: int) -> int:
        """The pause before the attempt that follows ``current_attempts`` attempts."""

    @abstractmethod
    def get_retry_predicate(self) -> AsyncRetryPredicate[OUT]:
        """Which outcomes of an attempt are retried."""

    @staticmethod
    def no_restart() -> AsyncRetryStrategy[Any]:
        """Never retry (what ``unordered_wait``/``ordered_wait`` use)."""
        return NO_RETRY_STRATEGY

    @staticmethod
    def fixed_delay(
        max_attempts: int,
        backoff_time_millis: int,
        result_predicate: ResultPredicate[OUT] | None,
        exception_predicate: ExceptionPredicate | None,
    ) -> FixedDelayRetryStrategy[OUT]:
        """Retry with the same pause every time."""
        return FixedDelayRetryStrategy(
            max_attempts, backoff_time_millis, result_predicate, exception_predicate
        )

    @staticmethod
    def exponential_backoff(
        max_attempts: int,
        initial_delay: int,
        max_retry_delay: int,
        multiplier: float,
        result_predicate: ResultPredicate[OUT] | None,
        exception_predicate: ExceptionPredicate | None,
    ) -> ExponentialBackoffDelayRetryStrategy[OUT]:
        """Retry with a pause that grows by ``multiplier`` up to ``max_retry_delay``."""
        return ExponentialBackoffDelayRetryStrategy(
            max_attempts, initial_delay, max_retry_delay, multiplier, result_predicate, exception_predicate
        )


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} should be greater than zero, got {value!r}")


class RetryPredicate(AsyncRetryPredicate[OUT]):
    """A result predicate and an exception predicate, either of them optional."""

    def __init__(
        self,
        result_predicate: ResultPredicate[OUT] | None,
        exception_predicate: ExceptionPredicate | None,
    ) -> None:
        self._result_predicate = result_predicate
        self._exception_predicate = exception_predicate

    def result_predicate(self) -> ResultPredicate[OUT] | None:
        return self._result_predicate

    def exception_predicate(self) -> ExceptionPredicate | None:
        return self._exception_predicate


class NoRetryStrategy(AsyncRetryStrategy[OUT]):
    """Every request is attempted once."""

    def can_retry(self, current_attempts: int) -> bool:
        return False

    def get_backoff_time_millis(self, current_attempts: int) -> int:
        return -1

    def get_retry_predicate(self) -> AsyncRetryPredicate[OUT]:
        return RetryPredicate(None, None)


class _BoundedRetryStrategy(AsyncRetryStrategy[OUT]):
    """At most ``max_attempts`` retries of what the predicates select."""

    def __init__(
        self,
        max_attempts: int,
        result_predicate: ResultPredicate[OUT] | None,
        exception_predicate: ExceptionPredicate | None,
    ) -> None:
        _positive("max_attempts", max_attempts)
        self._max_attempts = max_attempts
        self._result_predicate = result_predicate
        self._exception_predicate = exception_predicate

    def can_retry(self, current_attempts: int) -> bool:
        return current_attempts <= self._max_attempts

    def get_retry_predicate(self) -> AsyncRetryPredicate[OUT]:
        return RetryPredicate(self._result_predicate, self._exception_predicate)


class FixedDelayRetryStrategy(_BoundedRetryStrategy[OUT]):
    """Up to ``max_attempts`` retries, ``backoff_time_millis`` apart."""

    def __init__(
        self,
        max_attempts: int,
        backoff_time_millis: int,
        result_predicate: ResultPredicate[OUT] | None,
        exception_predicate: ExceptionPredicate | None,
    ) -> None:
        super().__init__(max_attempts, result_predicate, exception_predicate)
        _positive("backoff_time_millis", backoff_time_millis)
        self._backoff_time_millis = backoff_time_millis

    def get_backoff_time_millis(self, current_attempts: int) -> int:
        return self._backoff_time_millis


class ExponentialBackoffDelayRetryStrategy(_BoundedRetryStrategy[OUT]):
    """Up to ``max_attempts`` retries; the first after ``initial_delay`` ms, each next one
    ``multiplier`` times later than the one before, at most ``max_retry_delay`` ms."""

    def __init__(
        self,
        max_attempts: int,
        initial_delay: int,
        max_retry_delay: int,
        multiplier: float,
        result_predicate: ResultPredicate[OUT] | None,
        exception_predicate: ExceptionPredicate | None,
    ) -> None:
        super().__init__(max_attempts, result_predicate, exception_predicate)
        _positive("initial_delay", initial_delay)
        _positive("max_retry_delay", max_retry_delay)
        _positive("multiplier", multiplier)
        self._max_retry_delay = max_retry_delay
        self._multiplier = multiplier
        self._initial_delay = initial_delay

    def get_backoff_time_millis(self, current_attempts: int) -> int:
        # Flink's sequence for one request (initial, then times the multiplier up to the
        # maximum, truncated at each step), derived from the attempt number rather than kept
        # on the strategy as PyFlink and Flink do: one strategy serves every request in
        # flight, and a kept last delay would make each request's backoff grow from another's.
        delay = self._initial_delay
        for _ in range(current_attempts - 1):
            delay = int(min(delay * self._multiplier, self._max_retry_delay))
        return delay


#: The strategy of ``unordered_wait``/``ordered_wait``: no retries.
NO_RETRY_STRATEGY: AsyncRetryStrategy[Any] = NoRetryStrategy()


def empty_result_predicate(result: list[object] | None) -> bool:
    """Retry when an attempt produced nothing."""
    return result is None or len(result) == 0


def has_exception_predicate(error: BaseException | None) -> bool:
    """Retry when an attempt raised anything."""
    return error is not None


def exception_type_predicate(error: BaseException | None, expected_error_type: type[BaseException]) -> bool:
    """Retry when an attempt raised ``expected_error_type``; bind it with
    ``functools.partial(exception_type_predicate, expected_error_type=TimeoutError)``."""
    return isinstance(error, expected_error_type)
