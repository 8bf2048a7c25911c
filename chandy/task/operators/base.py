"""The operator contract.

An operator consumes whole batches: ``process_batch`` is called once per batch
that arrives, and emits whole batches to its output, which is the next
operator's ``process_batch`` inside a chain or a record writer at the end of
it. Per-record work is a plain Python loop inside one call.

Lifecycle, in Flink's order: ``setup`` -> ``open`` -> ``process_batch``* ->
``end_input`` -> ``finish`` (flush what is buffered) -> ``close`` (release).
``close`` also runs when the task is cancelled or fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chandy.api.functions import Function
from chandy.task.runtime_context import StreamingRuntimeContext

#: Where an operator sends its output batches.
Emit = Callable[[list[Any]], None]


def _discard(records: list[Any]) -> None:
    pass


class StreamOperator:
    """Base class of every operator."""

    #: True when the input is a keyed stream: records arrive as ``(key_group, key, value)``.
    keyed = False

    def __init__(self) -> None:
        self.name = type(self).__name__
        self.operator_id = ""
        self.output: Emit = _discard
        self.runtime_context: StreamingRuntimeContext | None = None

    def setup(self, runtime_context: StreamingRuntimeContext, output: Emit) -> None:
        """Bind to the task: context (and keyed state backend) and output."""
        self.runtime_context = runtime_context
        self.output = output

    def bind_task_services(self, services: Any, should_abort: Callable[[], bool]) -> None:
        """Operators that talk to the hosting process (the collect sink) take its services here."""

    def open(self) -> None:
        """Ready to process (user functions' ``open`` runs here)."""

    def process_batch(self, records: list[Any]) -> None:
        """Process one input batch."""
        raise NotImplementedError(f"{type(self).__name__} takes no input")

    def end_input(self) -> None:
        """Every input channel has ended."""

    def finish(self) -> None:
        """No more input: emit anything still buffered."""

    def close(self) -> None:
        """Release resources; runs on success, failure and cancellation alike."""


class UdfOperator(StreamOperator):
    """An operator around a user function (a :class:`Function` or a plain callable)."""

    def __init__(self, user_function: Any) -> None:
        super().__init__()
        self.user_function = user_function

    def open(self) -> None:
        if isinstance(self.user_function, Function):
            assert self.runtime_context is not None
            self.user_function.open(self.runtime_context)

    def close(self) -> None:
        if isinstance(self.user_function, Function):
            self.user_function.close()


def resolve_call(user_function: Any, method: str) -> Callable[..., Any]:
    """The callable to invoke: ``user_function.<method>`` for a function class, else itself."""
    bound = getattr(user_function, method, None)
    if bound is not None and isinstance(user_function, Function):
        return bound
    if callable(user_function):
        return user_function
    raise TypeError(f"{user_function!r} is neither callable nor has a '{method}' method")
