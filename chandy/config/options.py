"""Every configuration key chandy understands, by Flink's names where Flink has one.

Grouped as Flink groups them. ``ALL_OPTIONS`` is what ``execute()`` checks the
user's keys against, so a misspelt key is an error, not silently ignored.
"""

from __future__ import annotations

from chandy.config.configuration import ConfigOption

UPPER_BOUND_MAX_PARALLELISM = 32768


class PipelineOptions:
    NAME = ConfigOption.string("pipeline.name", None, "The job name when execute() is given none.")
    MAX_PARALLELISM = ConfigOption.integer(
        "pipeline.max-parallelism", -1,
        "Number of key groups; the upper bound for rescaling keyed state. -1 derives it from "
        "the parallelism as Flink does.", minimum=-1, maximum=UPPER_BOUND_MAX_PARALLELISM)
    OPERATOR_CHAINING = ConfigOption.boolean(
        "pipeline.operator-chaining.enabled", True,
        "Chain operators joined by forward edges of equal parallelism into one task.",
        deprecated_keys=("pipeline.operator-chaining",))


class CoreOptions:
    DEFAULT_PARALLELISM = ConfigOption.integer(
        "parallelism.default", 1, "Parallelism of operators that set none.", minimum=1,
        maximum=UPPER_BOUND_MAX_PARALLELISM)


class ExecutionOptions:
    TARGET = ConfigOption.string(
        "execution.target", "local",
        "Where the job runs: 'local' (every subtask in this process).",
        choices=("local",))
    BUFFER_TIMEOUT = ConfigOption.duration(
        "execution.buffer-timeout", 100,
        "Longest time a record waits in a partly filled output batch while its task is busy. "
        "An idle task flushes at once, so this bounds latency only under load.",
        deprecated_keys=("execution.buffer-timeout.interval",))


class NetworkOptions:
    BATCH_SIZE = ConfigOption.integer(
        "chandy.network.batch-size", 1024,
        "Records per batch, the unit that crosses a channel (Flink's network buffer).",
        minimum=1, maximum=1 << 20)
    BUFFERS_PER_CHANNEL = ConfigOption.integer(
        "taskmanager.network.memory.buffers-per-channel", 4,
        "Credits per input channel: batches a receiver accepts before its senders block "
        "(backpressure).", minimum=1, maximum=1 << 16)


def all_options() -> list[ConfigOption]:
    """Every option declared in this module."""
    found: list[ConfigOption] = []
    for holder in (PipelineOptions, CoreOptions, ExecutionOptions, NetworkOptions):
        found.extend(v for v in vars(holder).values() if isinstance(v, ConfigOption))
    return found
