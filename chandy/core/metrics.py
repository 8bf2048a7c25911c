"""User-defined metrics, as a user function sees them (PyFlink's ``pyflink.metrics``).

``runtime_context.get_metrics_group()`` returns the operator's :class:`MetricGroup`;
``counter``, ``gauge``, ``meter`` and ``distribution`` register metrics in it under
PyFlink's names and signatures, ``add_group`` nests groups, and ``histogram`` (Flink's
Java API has it, PyFlink has not) keeps the statistics of a sliding window of values.
The task reports them with its own metrics, so they show up in chandy's REST API and
Prometheus endpoint under Flink's names (``docs/metrics.md``).

Updating a metric is meant for the per-record path: a counter's ``inc`` is one
attribute addition on the task's thread, with no lock (the reporting thread only reads).
Anything that costs more (a histogram's percentiles, a meter's rate, calling a gauge)
happens when the metrics are reported, once per ``chandy.metrics.report-interval``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any


class MetricGroup(ABC):
    """A named container for metrics and further metric groups.

    A metric is identified by its place in the hierarchy and its name: the same name
    in two groups is two metrics."""

    @abstractmethod
    def add_group(self, name: str, extra: str | None = None) -> MetricGroup:
        """The sub-group ``name`` of this group (the same object when asked again).

        With ``extra``, a key-value pair: a group ``name`` holding a group ``extra``, which
        is returned; reporters that have labels (Prometheus) show it as the label
        ``name="extra"`` instead of as part of the metric's name (Flink's user variable)."""

    @abstractmethod
    def counter(self, name: str) -> Counter:
        """Registers a :class:`Counter` (the same one when asked again for the same name)."""

    @abstractmethod
    def gauge(self, name: str, obj: Callable[[], Any]) -> None:
        """Registers a gauge: ``obj()`` is called each time the metrics are reported, on the
        reporting thread, never on the task's (keep it cheap and thread-safe: read a value)."""

    @abstractmethod
    def meter(self, name: str, time_span_in_seconds: int = 60) -> Meter:
        """Registers a :class:`Meter`, reported as its events per second over the last
        ``time_span_in_seconds``."""

    @abstractmethod
    def distribution(self, name: str) -> Distribution:
        """Registers a :class:`Distribution` (count, sum, min, max and mean of every value)."""

    @abstractmethod
    def histogram(self, name: str, window_size: int = 1000) -> Histogram:
        """Registers a :class:`Histogram` over the last ``window_size`` values (Flink's
        ``DescriptiveStatisticsHistogram``; PyFlink has no histogram)."""


class Metric(ABC):  # noqa: B024 - PyFlink's marker base, with no methods of its own
    """Base of every metric."""

    __slots__ = ()


class Counter(Metric):
    """A count that goes up (and down) while the job runs."""

    __slots__ = ()

    @abstractmethod
    def inc(self, n: int = 1) -> None:
        """Add ``n``."""

    @abstractmethod
    def dec(self, n: int = 1) -> None:
        """Subtract ``n``."""

    @abstractmethod
    def get_count(self) -> int:
        """The current count."""


class Meter(Metric):
    """Events per second (throughput)."""

    __slots__ = ()

    @abstractmethod
    def mark_event(self, value: int = 1) -> None:
        """``value`` events happened."""

    @abstractmethod
    def get_count(self) -> int:
        """Events marked since the meter was registered."""

    @abstractmethod
    def get_rate(self) -> float:
        """Events per second over the meter's time span (Flink's ``Meter.getRate``)."""


class Distribution(Metric):
    """Statistics of every value seen: count, sum, min, max, mean (PyFlink's, from Beam)."""

    __slots__ = ()

    @abstractmethod
    def update(self, value: int | float) -> None:
        """Record one value of the distribution."""


class Histogram(Metric):
    """Statistics (quantiles, mean, standard deviation) of the most recent values."""

    __slots__ = ()

    @abstractmethod
    def update(self, value: int | float) -> None:
        """Record one value of the histogram."""

    @abstractmethod
    def get_count(self) -> int:
        """Values seen since the histogram was registered (not only those in the window)."""

    @abstractmethod
    def get_statistics(self) -> HistogramStatistics:
        """The statistics of the values in the window now."""


class HistogramStatistics:
    """The statistics of a fixed set of values (Flink's ``HistogramStatistics``).

    Quantiles are estimated as Flink's ``DescriptiveStatisticsHistogram`` does (Apache
    Commons Math's default ``Percentile``: position ``q * (n + 1)``, interpolated); the
    standard deviation is the sample's (divided by ``n - 1``). An empty window gives 0
    everywhere, not NaN, so that every reporter can show it."""

    __slots__ = ("_values",)

    def __init__(self, values: Sequence[int | float]) -> None:
        self._values = sorted(values)

    def get_quantile(self, quantile: float) -> float:
        """The value below which the fraction ``quantile`` of the recorded values lie."""
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"a quantile is between 0 and 1, got {quantile}")
        values = self._values
        n = len(values)
        if n == 0:
            return 0.0
        position = quantile * (n + 1)
        if position < 1:
            return float(values[0])
        if position >= n:
            return float(values[-1])
        below = math.floor(position)
        lower, upper = values[below - 1], values[below]
        return float(lower + (position - below) * (upper - lower))

    def get_values(self) -> list[int | float]:
        """The recorded values (the histogram's window)."""
        return list(self._values)

    def size(self) -> int:
        """How many values the statistics are over."""
        return len(self._values)

    def get_mean(self) -> float:
        """The mean of the values."""
        return math.fsum(self._values) / len(self._values) if self._values else 0.0

    def get_std_dev(self) -> float:
        """The standard deviation of the values."""
        n = len(self._values)
        if n < 2:
            return 0.0
        mean = self.get_mean()
        return math.sqrt(math.fsum((v - mean) ** 2 for v in self._values) / (n - 1))

    def get_max(self) -> float:
        """The largest value."""
        return float(self._values[-1]) if self._values else 0.0

    def get_min(self) -> float:
        """The smallest value."""
        return float(self._values[0]) if self._values else 0.0
