"""Keyed state, as a user function sees it: descriptors and state handles.

Names and methods follow PyFlink (``ValueStateDescriptor``, ``state.value()``,
``state.update(v)``, ...). A descriptor names a state; the runtime context turns
it into a handle scoped to the key of the record being processed. Type
information is optional: values are Python objects, serialized with pickle
when a snapshot is written.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class StateDescriptor:
    """Names a piece of state. Two descriptors with the same name are the same state."""

    def __init__(self, name: str, type_info: Any = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a state descriptor needs a non-empty string name")
        self.name = name
        self.type_info = type_info

    def get_name(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class ValueStateDescriptor(StateDescriptor):
    """One value per key. ``ValueStateDescriptor("count", Types.LONG())`` in PyFlink."""

    def __init__(self, name: str, value_type_info: Any = None) -> None:
        super().__init__(name, value_type_info)


class ListStateDescriptor(StateDescriptor):
    """A list of values per key."""

    def __init__(self, name: str, elem_type_info: Any = None) -> None:
        super().__init__(name, elem_type_info)


class MapStateDescriptor(StateDescriptor):
    """A map per key."""

    def __init__(self, name: str, key_type_info: Any = None, value_type_info: Any = None) -> None:
        super().__init__(name, (key_type_info, value_type_info))


class ReducingStateDescriptor(StateDescriptor):
    """One value per key, folded with ``reduce_function`` on every ``add``."""

    def __init__(self, name: str, reduce_function: Any, type_info: Any = None) -> None:
        super().__init__(name, type_info)
        reduce = getattr(reduce_function, "reduce", reduce_function)
        if not callable(reduce):
            raise ValueError(
                f"ReducingStateDescriptor({name!r}) needs a ReduceFunction or a callable (a, b) -> c"
            )
        self.reduce_function: Callable[[Any, Any], Any] = reduce


class AggregatingStateDescriptor(StateDescriptor):
    """One accumulator per key, folded with an ``AggregateFunction`` on every ``add``
    (PyFlink's ``AggregatingStateDescriptor(name, agg_function, state_type_info)``).

    The state keeps the accumulator; ``get()`` returns ``agg_function.get_result`` of it.
    """

    def __init__(self, name: str, agg_function: Any, state_type_info: Any = None) -> None:
        super().__init__(name, state_type_info)
        missing = [
            m
            for m in ("create_accumulator", "add", "get_result", "merge")
            if not callable(getattr(agg_function, m, None))
        ]
        if missing:
            raise TypeError(
                f"AggregatingStateDescriptor({name!r}) needs an AggregateFunction; "
                f"{agg_function!r} has no {', '.join(missing)} method"
            )
        self.agg_function = agg_function

    def get_agg_function(self) -> Any:
        return self.agg_function


class State(ABC):
    """A state handle; every operation applies to the current key."""

    @abstractmethod
    def clear(self) -> None:
        """Remove the value for the current key."""


class ValueState(State):
    @abstractmethod
    def value(self) -> Any:
        """The value for the current key, or ``None``."""

    @abstractmethod
    def update(self, value: Any) -> None:
        """Replace the value for the current key. ``None`` clears it."""


class ListState(State):
    @abstractmethod
    def get(self) -> Iterable[Any]:
        """The values for the current key (empty if none)."""

    @abstractmethod
    def add(self, value: Any) -> None: ...

    @abstractmethod
    def add_all(self, values: Iterable[Any]) -> None: ...

    @abstractmethod
    def update(self, values: Iterable[Any]) -> None:
        """Replace all values for the current key."""


class MapState(State):
    @abstractmethod
    def get(self, key: Any) -> Any: ...

    @abstractmethod
    def put(self, key: Any, value: Any) -> None: ...

    @abstractmethod
    def put_all(self, dict_value: dict[Any, Any]) -> None: ...

    @abstractmethod
    def remove(self, key: Any) -> None: ...

    @abstractmethod
    def contains(self, key: Any) -> bool: ...

    @abstractmethod
    def items(self) -> Iterable[tuple[Any, Any]]: ...

    @abstractmethod
    def keys(self) -> Iterable[Any]: ...

    @abstractmethod
    def values(self) -> Iterable[Any]: ...

    @abstractmethod
    def is_empty(self) -> bool: ...

    def __getitem__(self, key: Any) -> Any:
        return self.get(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        self.remove(key)

    def __contains__(self, key: Any) -> bool:
        return self.contains(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.keys()))


class ReducingState(State):
    @abstractmethod
    def get(self) -> Any:
        """The folded value for the current key, or ``None``."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Fold ``value`` into the current key's value."""


class AggregatingState(State):
    """An accumulator per key, fed by ``add`` and read through the aggregate function's
    ``get_result`` (PyFlink's ``AggregatingState``)."""

    @abstractmethod
    def get(self) -> Any:
        """The aggregate's result for the current key, or ``None`` if nothing was added."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Add ``value`` to the current key's accumulator."""
