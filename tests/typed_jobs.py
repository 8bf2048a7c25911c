"""Jobs whose keyed state declares PyFlink ``Types`` or holds the job's own classes
(importable, so every subtask rebuilds them; tests/test_typed_state.py runs them)."""

from __future__ import annotations

import os
from collections import namedtuple
from dataclasses import dataclass
from typing import Any

from chandy.api.environment import StreamExecutionEnvironment
from chandy.core.functions import KeyedProcessFunction, RuntimeContext
from chandy.core.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from chandy.core.types import Row, TypeInformation, Types
from tests.jobs import HoldingSequence

#: Numbers and keys of :func:`summary_job`.
N, KEYS = 600, 6


@dataclass
class Tally:
    """A class of the job's own module kept in (pickled) state."""

    count: int
    total: int


Point = namedtuple("Point", ["x", "y"])

LAST = Types.ROW_NAMED(["value", "parity"], [Types.LONG(), Types.STRING()])


def expected_summary(key: Any, values: list[int]) -> tuple[Any, ...]:
    """What :class:`TypedSummary` emits for ``key`` once it saw ``values`` (in any order)."""
    sums: dict[str, float] = {}
    for value in values:
        parity = "even" if value % 2 == 0 else "odd"
        sums[parity] = sums.get(parity, 0.0) + value / 2
    return key, len(values), sum(values), sorted(sums.items())


class TypedSummary(KeyedProcessFunction):
    """Per key: a count (``count_type``, LONG by default), the first three values as strings
    (LIST of STRING), half-sums by parity (MAP of STRING to DOUBLE), the last value (a named
    ROW), and two states without types holding the job's own classes (a dataclass and a
    named tuple). Emits ``(key, count, total, sums)`` once a key saw ``per_key`` records,
    and ``("bad type", key, what)`` whenever a value it reads (restored ones included) is
    not of the type it stored."""

    def __init__(self, per_key: int, count_type: TypeInformation | None = None) -> None:
        self.per_key = per_key
        self.count_type = count_type if count_type is not None else Types.LONG()

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", self.count_type))
        self.seen = runtime_context.get_list_state(ListStateDescriptor("seen", Types.STRING()))
        self.sums = runtime_context.get_map_state(MapStateDescriptor("sums", Types.STRING(), Types.DOUBLE()))
        self.last = runtime_context.get_state(ValueStateDescriptor("last", LAST))
        self.tally = runtime_context.get_state(ValueStateDescriptor("tally"))
        self.point = runtime_context.get_state(ValueStateDescriptor("point"))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        key = ctx.get_current_key()
        yield from self._check(key)
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        parity = "even" if value % 2 == 0 else "odd"
        if count <= 3:
            self.seen.add(str(value))
        self.sums.put(parity, (self.sums.get(parity) or 0.0) + value / 2)
        self.last.update(Row(value=value, parity=parity))
        tally = self.tally.value() or Tally(0, 0)
        self.tally.update(Tally(tally.count + 1, tally.total + value))
        self.point.update(Point(count, value))
        if count == self.per_key:
            tally = self.tally.value()
            yield key, count, tally.total, sorted(self.sums.items())

    def _check(self, key: Any) -> Any:
        count, last, tally, point = (
            self.count.value(),
            self.last.value(),
            self.tally.value(),
            self.point.value(),
        )
        seen, sums = list(self.seen.get()), dict(self.sums.items())
        if count is None:
            return
        checks = {
            "count": type(count) is int,
            "seen": bool(seen) and all(type(s) is str for s in seen),
            "sums": bool(sums) and all(type(k) is str and type(v) is float for k, v in sums.items()),
            "last": type(last) is Row and last.as_dict().keys() == {"value", "parity"},
            "tally": type(tally) is Tally and tally.count == count,
            "point": type(point) is Point and point.x == count,
        }
        for what, ok in checks.items():
            if not ok:
                yield "bad type", key, what


def summary_job(
    env: StreamExecutionEnvironment,
    hold_after: int | None,
    count_type: TypeInformation | None = None,
    more_per_checkpoint: int = 0,
) -> Any:
    """``0..N-1`` keyed by ``x % KEYS`` into :class:`TypedSummary` (uids "source" and
    "summary"): the job of tests/test_typed_state.py and of the savepoints written before
    typed state (tests/scripts/make_savepoints_before_typed_state.py)."""
    source = HoldingSequence(0, N - 1, hold_after, more_per_checkpoint)
    stream = env.from_source(source, source_name="numbers").uid("source").key_by(lambda x: x % KEYS)
    return stream.process(TypedSummary(N // KEYS, count_type)).uid("summary")


def expected_summaries() -> list[tuple[Any, ...]]:
    """What :func:`summary_job` emits over all its runs together."""
    return sorted(expected_summary(k, [x for x in range(N) if x % KEYS == k]) for k in range(KEYS))


class Gadget:
    """An object whose pickle runs a shell command when it is loaded: what an attacker's
    crafted state would hold (here written by the job itself, to its own state)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return os.system, (f"touch {self.marker}",)


class KeepsAGadget(KeyedProcessFunction):
    """Stores a :class:`Gadget` under key ``"gadget"`` the first time that key comes (never
    reading it back in that run), and counts every other key; reads the gadget's state
    again whenever the key comes back (a restored run)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(ValueStateDescriptor("kept"))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        if value == "gadget":
            if not self.gadget_stored():
                self.state.update(Gadget(self.marker))
            yield "stored"
            return
        self.state.update((self.state.value() or 0) + 1)
        yield value

    def gadget_stored(self) -> bool:
        """Whether this key holds a value already (read in a restored run)."""
        return self.state.value() is not None
