"""PyFlink's ``pyflink.metrics``: the metric interfaces ``runtime_context.get_metrics_group()``
hands out (``MetricGroup``, ``Counter``, ``Meter``, ``Distribution``), plus Flink's
``Histogram``. Replace ``pyflink`` by ``chandy`` in a job's imports."""

from chandy.core.metrics import (
    Counter,
    Distribution,
    Histogram,
    HistogramStatistics,
    Meter,
    Metric,
    MetricGroup,
)

__all__ = ["Counter", "Distribution", "Histogram", "HistogramStatistics", "Meter", "Metric", "MetricGroup"]
