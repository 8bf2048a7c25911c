"""``AsyncDataStream``: apply an :class:`~chandy.core.functions.AsyncFunction` to a stream
(PyFlink's ``pyflink.datastream.AsyncDataStream``, same methods and arguments).

``unordered_wait`` emits each result when its request completes; ``ordered_wait`` emits in
input order. Both keep watermarks in place, bound the requests in flight by ``capacity``,
and store the requests in flight in checkpoints, so a restart repeats them and the output
holds every result exactly once (see :mod:`chandy.task.operators.async_wait`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from chandy.api.datastream import DataStream
from chandy.core.async_retry import NO_RETRY_STRATEGY, AsyncRetryStrategy
from chandy.core.functions import AsyncFunction
from chandy.core.time import Duration, Time, to_millis
from chandy.errors import InvalidProgramError
from chandy.task.operators.async_wait import AsyncWaitOperator

#: The operator's name (PyFlink's).
OPERATOR_NAME = "async wait operator"


class AsyncDataStream:
    """Helpers that apply an :class:`AsyncFunction` to a :class:`DataStream`."""

    @staticmethod
    def unordered_wait(
        data_stream: DataStream,
        async_function: AsyncFunction[Any, Any],
        timeout: Time | Duration | int,
        capacity: int = 100,
        output_type: Any = None,
    ) -> DataStream:
        """Results leave as soon as their request completes (watermarks still keep their
        place). ``timeout`` bounds each request (``timeout(value)`` gives its outputs then);
        ``capacity`` bounds the requests in flight."""
        return AsyncDataStream.unordered_wait_with_retry(
            data_stream, async_function, timeout, NO_RETRY_STRATEGY, capacity, output_type
        )

    @staticmethod
    def unordered_wait_with_retry(
        data_stream: DataStream,
        async_function: AsyncFunction[Any, Any],
        timeout: Time | Duration | int,
        async_retry_strategy: AsyncRetryStrategy[Any],
        capacity: int = 100,
        output_type: Any = None,
    ) -> DataStream:
        """``unordered_wait``, trying a request again as ``async_retry_strategy`` says
        (within the same ``timeout``)."""
        return AsyncDataStream._apply(
            data_stream, async_function, timeout, async_retry_strategy, capacity, output_type, ordered=False
        )

    @staticmethod
    def ordered_wait(
        data_stream: DataStream,
        async_function: AsyncFunction[Any, Any],
        timeout: Time | Duration | int,
        capacity: int = 100,
        output_type: Any = None,
    ) -> DataStream:
        """Results leave in the order of their inputs."""
        return AsyncDataStream.ordered_wait_with_retry(
            data_stream, async_function, timeout, NO_RETRY_STRATEGY, capacity, output_type
        )

    @staticmethod
    def ordered_wait_with_retry(
        data_stream: DataStream,
        async_function: AsyncFunction[Any, Any],
        timeout: Time | Duration | int,
        async_retry_strategy: AsyncRetryStrategy[Any],
        capacity: int = 100,
        output_type: Any = None,
    ) -> DataStream:
        """``ordered_wait``, trying a request again as ``async_retry_strategy`` says."""
        return AsyncDataStream._apply(
            data_stream, async_function, timeout, async_retry_strategy, capacity, output_type, ordered=True
        )

    @staticmethod
    def _apply(
        data_stream: DataStream,
        async_function: AsyncFunction[Any, Any],
        timeout: Time | Duration | int,
        async_retry_strategy: AsyncRetryStrategy[Any],
        capacity: int,
        output_type: Any,
        *,
        ordered: bool,
    ) -> DataStream:
        timeout_ms = AsyncDataStream._validate(async_function, timeout, async_retry_strategy, capacity)
        node = data_stream._add_operator(
            OPERATOR_NAME,
            functools.partial(
                AsyncWaitOperator, async_function, timeout_ms, capacity, ordered, async_retry_strategy
            ),
            output_type=output_type,
        )
        return DataStream._of(data_stream.get_execution_environment(), node)

    @staticmethod
    def _validate(async_function: Any, timeout: Any, async_retry_strategy: Any, capacity: Any) -> int:
        """PyFlink's checks, with the cause and the fix in each message; returns the timeout in ms."""
        if not isinstance(async_function, AsyncFunction):
            raise InvalidProgramError(
                f"AsyncDataStream takes an AsyncFunction, got {type(async_function).__name__}: "
                "subclass chandy.datastream.AsyncFunction and define 'async def async_invoke(self, value)'"
            )
        if not inspect.iscoroutinefunction(async_function.async_invoke):
            raise InvalidProgramError(
                f"Method 'async_invoke' of class '{type(async_function).__name__}' should be declared "
                "as 'async def'."
            )
        try:
            timeout_ms = to_millis(timeout, "timeout")
        except TypeError as exc:
            raise InvalidProgramError(str(exc)) from None
        if not isinstance(async_retry_strategy, AsyncRetryStrategy):
            raise InvalidProgramError(
                "Async retry strategy should be an AsyncRetryStrategy (NO_RETRY_STRATEGY for none), "
                f"got {async_retry_strategy!r}"
            )
        if async_retry_strategy is not NO_RETRY_STRATEGY and timeout_ms <= 0:
            raise InvalidProgramError(
                "Timeout should be configured when do async with retry: a positive timeout bounds "
                "all the attempts of a request"
            )
        if async_retry_strategy.get_retry_predicate() is None:
            raise InvalidProgramError(
                f"Retry predicate of the async retry strategy '{type(async_retry_strategy).__name__}' "
                "is None."
            )
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise InvalidProgramError(
                f"capacity (the most requests in flight) must be a positive integer, got {capacity!r}"
            )
        return timeout_ms
