"""The metrics user functions register (``runtime_context.get_metrics_group()``).

Each operator of a chain has one :class:`OperatorMetricGroup` (its
:class:`~chandy.task.metrics.OperatorCounters` own it); the task reports its
:meth:`~OperatorMetricGroup.snapshot` with the operator's own counters, so user
metrics reach the JobMaster in the existing metrics reports, on both executors.

Two threads touch a metric, as in :mod:`chandy.task.metrics`: the task's thread
updates it, the reporting thread reads it. Updates are therefore plain attribute
writes (a counter's ``inc`` is ``self.count += n``: no lock, no call into the
runtime), and everything that costs more runs on the reporting thread once per
report: a histogram's percentiles are computed from a copy of its window, a meter's
rate from the counts it saw at earlier reports, a gauge is called. A read may see a
distribution between two of its fields' updates (a sum one value ahead of its count);
the next report is consistent again, which is all a metric needs.

Names follow Flink's rules: a metric is identified by its group path and name; asking
again for a metric of the same name and kind returns the one registered (PyFlink does
the same: its metrics live in Beam cells keyed by name), a gauge registered again
replaces the function. A name already taken by a metric of another kind, or by one of
the operator's own metrics (``numRecordsIn`` ...), is Flink's "name collision": a
warning, and the new metric works but is not reported.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from chandy.core.metrics import (
    Counter,
    Distribution,
    Histogram,
    HistogramStatistics,
    Meter,
    Metric,
    MetricGroup,
)
from chandy.messages.metrics import UserMetric, UserMetricKind
from chandy.util.clock import Clock, SystemClock

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=Metric)

#: The operator's own metrics (``docs/metrics.md``): a user metric may not take their names.
SYSTEM_OPERATOR_METRICS = frozenset(
    {
        "numRecordsIn",
        "numRecordsOut",
        "numRecordsInPerSecond",
        "numRecordsOutPerSecond",
        "currentInputWatermark",
        "currentOutputWatermark",
    }
)

#: The statistics a histogram reports, by Flink's names (its REST API's ``<name>_<statistic>``),
#: with the quantile each stands for (``None``: not a quantile).
HISTOGRAM_STATISTICS: tuple[tuple[str, float | None], ...] = (
    ("min", None),
    ("max", None),
    ("mean", None),
    ("median", 0.5),
    ("stddev", None),
    ("p75", 0.75),
    ("p90", 0.90),
    ("p95", 0.95),
    ("p98", 0.98),
    ("p99", 0.99),
    ("p999", 0.999),
)


class SimpleCounter(Counter):
    """A count in one attribute (Flink's ``SimpleCounter``)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def inc(self, n: int = 1) -> None:
        self.count += n

    def dec(self, n: int = 1) -> None:
        self.count -= n

    def get_count(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"SimpleCounter({self.count})"


class MeterView(Meter):
    """Counts events; its rate is the count's increase over the last ``time_span_in_seconds``.

    The rate is computed when asked (by the reporting thread, each report), from the
    counts seen at earlier asks: the oldest kept is the last one at or before the start
    of the span, and the rate divides by the time actually covered, so a young meter
    shows its true rate (Flink's ``MeterView`` divides by the whole span and ramps up
    over its first span)."""

    __slots__ = ("count", "_span_ns", "_clock", "_history", "_lock")

    def __init__(self, time_span_in_seconds: int, clock: Clock) -> None:
        if time_span_in_seconds <= 0:
            raise ValueError(
                f"a meter's time span is a positive number of seconds, got {time_span_in_seconds}"
            )
        self.count = 0
        self._span_ns = int(time_span_in_seconds * 1_000_000_000)
        self._clock = clock
        #: (monotonic ns, count) at the meter's creation and at each rate asked since.
        self._history: collections.deque[tuple[int, int]] = collections.deque([(clock.monotonic_ns(), 0)])
        self._lock = threading.Lock()

    def mark_event(self, value: int = 1) -> None:
        self.count += value

    def get_count(self) -> int:
        return self.count

    def get_rate(self) -> float:
        now = self._clock.monotonic_ns()
        count = self.count
        with self._lock:
            history = self._history
            history.append((now, count))
            start = now - self._span_ns
            while len(history) > 2 and history[1][0] <= start:
                history.popleft()
            since, base = history[0]
        elapsed = now - since
        return (count - base) * 1e9 / elapsed if elapsed > 0 else 0.0


class ValueDistribution(Distribution):
    """Count, sum, minimum and maximum of every value (PyFlink's distribution, from Beam)."""

    __slots__ = ("count", "sum", "min", "max")

    def __init__(self) -> None:
        self.count = 0
        self.sum: int | float = 0
        self.min: int | float = math.inf
        self.max: int | float = -math.inf

    def update(self, value: int | float) -> None:
        self.count += 1
        self.sum += value
        # Comparisons, not min()/max(): a builtin call costs more than the rest of update().
        if value < self.min:  # noqa: PLR1730
            self.min = value
        if value > self.max:  # noqa: PLR1730
            self.max = value

    def statistics(self) -> tuple[int, tuple[tuple[str, float], ...]]:
        """(count, ``sum``/``min``/``max``/``mean``); 0 for each while there is no value."""
        count, total, low, high = self.count, self.sum, self.min, self.max
        if not count:
            return 0, (("sum", 0.0), ("min", 0.0), ("max", 0.0), ("mean", 0.0))
        return count, (
            ("sum", float(total)),
            ("min", float(low)),
            ("max", float(high)),
            ("mean", total / count),
        )


class WindowHistogram(Histogram):
    """The last ``window_size`` values (Flink's ``DescriptiveStatisticsHistogram``)."""

    __slots__ = ("count", "_window")

    def __init__(self, window_size: int) -> None:
        if window_size <= 0:
            raise ValueError(f"a histogram's window holds at least one value, got window_size={window_size}")
        self.count = 0
        self._window: collections.deque[int | float] = collections.deque(maxlen=window_size)

    def update(self, value: int | float) -> None:
        self.count += 1
        self._window.append(value)

    def get_count(self) -> int:
        return self.count

    def get_statistics(self) -> HistogramStatistics:
        # tuple() of a deque of numbers runs in C without releasing the GIL: a consistent copy
        # even while the task thread appends.
        return HistogramStatistics(tuple(self._window))


class _Gauge(Metric):
    __slots__ = ("obj", "failed")

    def __init__(self, obj: Callable[[], Any]) -> None:
        self.obj = obj
        #: The last call raised (logged once, until it works again).
        self.failed = False


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a group sits: what its metrics' identifiers, names and labels are made of."""

    scope: tuple[str, ...]
    logical_scope: tuple[str, ...]
    variables: tuple[tuple[str, str], ...]

    def child(self, name: str) -> _Place:
        """A group under this one (also the key of a key-value pair)."""
        return _Place((*self.scope, name), (*self.logical_scope, name), self.variables)

    def value(self, key: str, value: str) -> _Place:
        """The value group under this key group: in the identifier, a label to Prometheus."""
        return _Place((*self.scope, value), self.logical_scope, (*self.variables, (key, value)))

    def describe(self) -> str:
        return f"group '{'.'.join(self.scope)}'" if self.scope else "the operator's group"


@dataclass(frozen=True, slots=True)
class _Registered:
    place: _Place
    name: str
    kind: UserMetricKind
    metric: Metric


_KINDS: dict[type[Metric], UserMetricKind] = {
    SimpleCounter: "counter",
    _Gauge: "gauge",
    MeterView: "meter",
    WindowHistogram: "histogram",
    ValueDistribution: "distribution",
}


class UserMetricGroup(MetricGroup):
    """One group of an operator's metrics (the operator's own, or one under it)."""

    def __init__(self, root: OperatorMetricGroup, place: _Place) -> None:
        self._root = root
        self._place = place
        #: Sub-groups by (name, "generic" | "key" | "value"): PyFlink keeps a generic group and
        #: a key group of the same name apart.
        self._groups: dict[tuple[str, str], UserMetricGroup] = {}
        self._metrics: dict[str, _Registered] = {}

    def add_group(self, name: str, extra: str | None = None) -> MetricGroup:
        name = _checked_name(name, "group")
        if extra is None:
            return self._group(name, "generic", self._place.child(name))
        value = _checked_name(extra, "group value")
        key_group = self._group(name, "key", self._place.child(name))
        return key_group._group(value, "value", key_group._place.value(name, value))

    def _group(self, name: str, kind: str, place: _Place) -> UserMetricGroup:
        group = self._groups.get((name, kind))
        if group is None:
            group = self._groups[name, kind] = UserMetricGroup(self._root, place)
        return group

    def counter(self, name: str) -> Counter:
        return self._register(name, SimpleCounter, SimpleCounter)

    def gauge(self, name: str, obj: Callable[[], Any]) -> None:
        if not callable(obj):
            raise TypeError(f"gauge '{name}' needs a function that returns its value, got {obj!r}")
        gauge = self._register(name, _Gauge, lambda: _Gauge(obj))
        gauge.obj = obj  # registered again: the new function replaces the old (PyFlink's)

    def meter(self, name: str, time_span_in_seconds: int = 60) -> Meter:
        clock = self._root.clock
        return self._register(name, MeterView, lambda: MeterView(time_span_in_seconds, clock))

    def distribution(self, name: str) -> Distribution:
        return self._register(name, ValueDistribution, ValueDistribution)

    def histogram(self, name: str, window_size: int = 1000) -> Histogram:
        return self._register(name, WindowHistogram, lambda: WindowHistogram(window_size))

    def _register(self, name: str, kind: type[_M], create: Callable[[], _M]) -> _M:
        """The metric registered as ``name`` if it is of ``kind``, else a new one: registered,
        or not (a warning) when the name is taken."""
        name = _checked_name(name, "metric")
        existing = self._metrics.get(name)
        if existing is not None and isinstance(existing.metric, kind):
            return existing.metric
        metric = create()
        if existing is not None:
            taken = f"a {existing.kind}"
        elif not self._place.scope and name in SYSTEM_OPERATOR_METRICS:
            taken = "a metric of the operator itself"
        else:
            registered = _Registered(self._place, name, _KINDS[kind], metric)
            self._metrics[name] = registered
            self._root._add(registered)
            return metric
        log.warning(
            "Operator '%s': %s already has %s named '%s'; the new %s works but is not reported "
            "(Flink's name collision). Give it another name.",
            self._root.operator_name,
            self._place.describe(),
            taken,
            name,
            _KINDS[kind],
        )
        return metric


class OperatorMetricGroup(UserMetricGroup):
    """An operator's metric group: the root of its user metrics, and their reporter."""

    def __init__(self, operator_name: str, clock: Clock | None = None) -> None:
        self.operator_name = operator_name
        self.clock: Clock = clock if clock is not None else SystemClock()
        #: Every registered metric, in registration order; replaced (never mutated) on
        #: registration, so the reporting thread iterates a stable tuple.
        self._registered: tuple[_Registered, ...] = ()
        super().__init__(self, _Place((), (), ()))

    def _add(self, registered: _Registered) -> None:
        self._registered = (*self._registered, registered)

    def snapshot(self) -> tuple[UserMetric, ...]:
        """Every reported metric's value now (called by the reporting thread)."""
        registered = self._registered
        if not registered:
            return ()
        values = []
        for entry in registered:
            value = self._read(entry)
            if value is not None:
                values.append(value)
        return tuple(values)

    def _read(self, entry: _Registered) -> UserMetric | None:
        metric = entry.metric
        place = entry.place
        statistics: tuple[tuple[str, float], ...] = ()
        value: int | float | str
        if isinstance(metric, SimpleCounter):
            value = metric.count
        elif isinstance(metric, _Gauge):
            read = self._call_gauge(entry, metric)
            if read is None:
                return None
            value = read
        elif isinstance(metric, MeterView):
            value = metric.get_rate()
        elif isinstance(metric, WindowHistogram):
            value = metric.count
            stats = metric.get_statistics()
            statistics = tuple(
                (name, stats.get_quantile(q) if q is not None else _plain(stats, name))
                for name, q in HISTOGRAM_STATISTICS
            )
        elif isinstance(metric, ValueDistribution):
            value, statistics = metric.statistics()
        else:  # pragma: no cover - every kind registered is handled above
            raise TypeError(f"unknown metric {metric!r}")
        return UserMetric(
            place.scope, entry.name, entry.kind, value, statistics, place.variables, place.logical_scope
        )

    def _call_gauge(self, entry: _Registered, gauge: _Gauge) -> int | float | str | None:
        """The gauge's value; None (left out of this report) when it raised or returned None."""
        try:
            value = gauge.obj()
        except Exception as exc:  # noqa: BLE001 - a failing gauge never fails the task or the report
            if not gauge.failed:
                log.warning(
                    "Operator '%s': gauge '%s' raised %r; it is left out of the metrics until it works.",
                    self.operator_name,
                    ".".join((*entry.place.scope, entry.name)),
                    exc,
                )
            gauge.failed = True
            return None
        gauge.failed = False
        if value is None:
            return None  # Flink leaves out a gauge whose value is null
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, (int, float)):
            return value
        return str(value)


def _plain(stats: HistogramStatistics, name: str) -> float:
    if name == "min":
        return stats.get_min()
    if name == "max":
        return stats.get_max()
    if name == "mean":
        return stats.get_mean()
    return stats.get_std_dev()


def _checked_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {what} name is a non-empty string, got {name!r}")
    return name
