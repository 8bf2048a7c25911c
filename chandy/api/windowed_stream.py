"""WindowedStream and AllWindowedStream: PyFlink's builders of window operations.

``keyed.window(assigner)`` (or ``count_window``) gives a :class:`WindowedStream`;
``stream.window_all(assigner)`` an :class:`AllWindowedStream`, which is a window
over one constant key and so runs as one subtask (Flink does exactly this). Set
a ``trigger``, ``allowed_lateness`` and ``side_output_late_data`` on it, then end
it with ``reduce``, ``aggregate``, ``apply`` or ``process``: that adds the one
window operator (see :mod:`chandy.task.operators.window`) and returns its
output stream, whose records carry the window's ``max_timestamp()``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chandy.core.functions import (
    AggregateFunction,
    AllWindowFunction,
    Function,
    ProcessAllWindowFunction,
    ProcessWindowFunction,
    ReduceFunction,
    WindowFunction,
)
from chandy.core.output_tag import OutputTag
from chandy.core.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
)
from chandy.core.time import to_millis
from chandy.core.windows import MergingWindowAssigner, Trigger, WindowAssigner
from chandy.errors import InvalidProgramError
from chandy.task.operators.window import (
    WINDOW_STATE_NAME,
    ApplyWindowFunction,
    InternalWindowFunction,
    PassThroughWindowFunction,
    ProcessWindowFunctionCall,
    WindowOperator,
)

if TYPE_CHECKING:
    from chandy.api.datastream import DataStream, KeyedStream
    from chandy.api.environment import StreamExecutionEnvironment


def _null_key(value: Any) -> int:
    """The one key of ``window_all`` (Flink's ``NullByteKeySelector``)."""
    return 0


def _reduce_function(reduce_function: Any) -> Any:
    if isinstance(reduce_function, ReduceFunction) or (
        callable(reduce_function) and not isinstance(reduce_function, Function)
    ):
        return reduce_function
    raise InvalidProgramError(
        f"reduce() takes a ReduceFunction or a callable (a, b) -> c, got {type(reduce_function).__name__}"
    )


class _WindowedStreamBase:
    """What a keyed and a non-keyed windowed stream share."""

    _keyed_window = True

    def __init__(self, keyed_stream: KeyedStream, window_assigner: WindowAssigner[Any, Any]) -> None:
        if not isinstance(window_assigner, WindowAssigner):
            raise InvalidProgramError(
                f"a window needs a WindowAssigner, got {type(window_assigner).__name__}"
            )
        self._keyed_stream = keyed_stream
        self._window_assigner = window_assigner
        self._allowed_lateness = 0
        self._late_data_output_tag: OutputTag | None = None
        self._window_trigger: Trigger[Any, Any] | None = None

    def get_execution_environment(self) -> StreamExecutionEnvironment:
        return self._keyed_stream.get_execution_environment()

    def trigger(self, trigger: Trigger[Any, Any]) -> Any:
        """The trigger that decides when windows are evaluated (instead of the assigner's default)."""
        if not isinstance(trigger, Trigger):
            raise InvalidProgramError(f"trigger() takes a Trigger, got {type(trigger).__name__}")
        if isinstance(self._window_assigner, MergingWindowAssigner) and not trigger.can_merge():
            raise InvalidProgramError(
                f"a merging window assigner ({self._window_assigner!r}) cannot be used with a trigger "
                f"that does not support merging ({type(trigger).__name__})"
            )
        self._window_trigger = trigger
        return self

    def allowed_lateness(self, time_ms: Any) -> Any:
        """How long after a window's end records may still join it (and fire it again);
        later records are dropped, or sent to ``side_output_late_data``. Milliseconds, a
        Time or a Duration; 0 by default. Only event-time windows have late records."""
        lateness = to_millis(time_ms, "allowed_lateness")
        if lateness < 0:
            raise InvalidProgramError(f"the allowed lateness cannot be negative, got {lateness}")
        self._allowed_lateness = lateness
        return self

    def side_output_late_data(self, output_tag: OutputTag) -> Any:
        """Send records that arrive after their windows' end plus the allowed lateness to the
        side output ``output_tag`` (``result.get_side_output(output_tag)``)."""
        if not isinstance(output_tag, OutputTag):
            raise InvalidProgramError(
                f"side_output_late_data() takes an OutputTag, got {type(output_tag).__name__}"
            )
        self._late_data_output_tag = output_tag
        return self

    # ------------------------------------------------------------------ building

    def _window_function(self, window_function: Any, *, single_value: bool) -> InternalWindowFunction:
        keyed = self._keyed_window
        process_type: type = ProcessWindowFunction if keyed else ProcessAllWindowFunction
        apply_type: type = WindowFunction if keyed else AllWindowFunction
        if window_function is None:
            return PassThroughWindowFunction()
        if isinstance(window_function, process_type):
            return ProcessWindowFunctionCall(window_function, keyed=keyed, single_value=single_value)
        if isinstance(window_function, apply_type) or (
            callable(window_function) and not isinstance(window_function, Function)
        ):
            return ApplyWindowFunction(window_function, keyed=keyed, single_value=single_value)
        raise InvalidProgramError(
            f"the window function must be a {apply_type.__name__}, a {process_type.__name__} or a "
            f"callable, got {type(window_function).__name__}"
        )

    def _build(
        self,
        descriptor: StateDescriptor,
        window_function: InternalWindowFunction,
        description: str,
        functions: list[Any],
        output_type: Any,
    ) -> DataStream:
        from chandy.api.datastream import DataStream

        assigner = self._window_assigner
        trigger = self._window_trigger or assigner.get_default_trigger(self.get_execution_environment())
        factory: Callable[[], WindowOperator] = functools.partial(
            WindowOperator,
            assigner,
            trigger,
            descriptor,
            window_function,
            allowed_lateness=self._allowed_lateness,
            late_data_output_tag=self._late_data_output_tag,
            functions=functions,
        )
        kind = "Window" if self._keyed_window else "AllWindow"
        node = self._keyed_stream._add_operator(
            f"{kind}({assigner!r}, {type(trigger).__name__}, {description})",
            factory,
            keyed=True,
            output_type=output_type,
        )
        node.assigns_timestamps = True  # outputs carry their window's max timestamp
        if not self._keyed_window:
            node.parallelism = 1
            node.max_parallelism = 1
        return DataStream._of(self.get_execution_environment(), node)

    # ------------------------------------------------------------------ the operations

    def reduce(
        self, reduce_function: Any, window_function: Any = None, output_type: Any = None
    ) -> DataStream:
        """Fold each window's records with ``reduce_function`` as they arrive (one value per
        key and window is kept); the result, or what ``window_function`` makes of it, is
        emitted when the window fires."""
        reduce_function = _reduce_function(reduce_function)
        wrapped = self._window_function(window_function, single_value=True)
        if output_type is None and window_function is None:
            output_type = self._keyed_stream._output_type()
        return self._build(
            ReducingStateDescriptor(WINDOW_STATE_NAME, reduce_function),
            wrapped,
            _describe(reduce_function, window_function),
            [reduce_function],
            output_type,
        )

    def aggregate(
        self,
        aggregate_function: AggregateFunction,
        window_function: Any = None,
        accumulator_type: Any = None,
        output_type: Any = None,
    ) -> DataStream:
        """Aggregate each window's records incrementally into an accumulator; its result, or
        what ``window_function`` makes of it, is emitted when the window fires."""
        if not isinstance(aggregate_function, AggregateFunction):
            raise InvalidProgramError(
                f"aggregate() takes an AggregateFunction, got {type(aggregate_function).__name__}"
            )
        return self._build(
            AggregatingStateDescriptor(WINDOW_STATE_NAME, aggregate_function, accumulator_type),
            self._window_function(window_function, single_value=True),
            _describe(aggregate_function, window_function),
            [aggregate_function],
            output_type,
        )

    def apply(self, window_function: Any, output_type: Any = None) -> DataStream:
        """Call ``window_function.apply`` with all of a window's records when it fires (they
        are all kept until then)."""
        if window_function is None:
            raise InvalidProgramError("apply() needs a window function")
        return self._build(
            ListStateDescriptor(WINDOW_STATE_NAME),
            self._window_function(window_function, single_value=False),
            _describe(window_function, None),
            [],
            output_type,
        )

    def process(self, process_window_function: Any, output_type: Any = None) -> DataStream:
        """Call ``process_window_function.process`` with all of a window's records and a
        context (the window, time, per-window and per-key state) when it fires."""
        process_type: type = ProcessWindowFunction if self._keyed_window else ProcessAllWindowFunction
        if not isinstance(process_window_function, process_type):
            raise InvalidProgramError(
                f"process() takes a {process_type.__name__}, got {type(process_window_function).__name__}"
            )
        return self._build(
            ListStateDescriptor(WINDOW_STATE_NAME),
            self._window_function(process_window_function, single_value=False),
            _describe(process_window_function, None),
            [],
            output_type,
        )


def _describe(function: Any, window_function: Any) -> str:
    names = [getattr(function, "__name__", type(function).__name__)]
    if window_function is not None:
        names.append(getattr(window_function, "__name__", type(window_function).__name__))
    return ", ".join(names)


class WindowedStream(_WindowedStreamBase):
    """A keyed stream split into windows per key (``keyed_stream.window(assigner)``)."""


class AllWindowedStream(_WindowedStreamBase):
    """A whole stream split into windows (``data_stream.window_all(assigner)``): one
    subtask sees every record."""

    _keyed_window = False

    def __init__(self, data_stream: DataStream, window_assigner: WindowAssigner[Any, Any]) -> None:
        super().__init__(data_stream.key_by(_null_key), window_assigner)
