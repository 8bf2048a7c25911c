"""The contracts users implement and call: functions, state descriptors, sources and sinks.

These are interfaces, the way Flink keeps them in ``flink-core``: operators in
``chandy.task`` call user functions and connectors implement ``Source`` and
``Sink``, so the contracts must sit below all of them. They import nothing from
the rest of chandy but errors and utilities. The builders a job is written
with (``StreamExecutionEnvironment``, ``DataStream``) are in ``chandy.api``.
This package imports nothing eagerly.
"""
