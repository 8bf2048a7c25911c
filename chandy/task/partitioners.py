"""Partitioners: which output channel each record goes to.

A partitioner is a *prototype* in the job graph; every producing subtask gets
its own :meth:`StreamPartitioner.copy` (rebalance keeps a position, shuffle a
random generator). ``partition`` appends a whole batch into per-channel
buffers, so routing costs one Python loop per batch, not a call per record.

Records on a key-partitioned edge travel as ``(key_group, key, value)``: the
keyed operator downstream needs the key and its key group, and computing them
here, once, saves hashing every record twice.
"""

from __future__ import annotations

import copy
import operator
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from chandy.core.functions import KeySelector, Partitioner
from chandy.state.key_groups import KeyGroupAssigner
from chandy.task.batches import KeyedBatch, TimestampedBatch


class StreamPartitioner(ABC):
    """Routes records of one producer subtask to the consumer channels of an edge."""

    #: Name shown in plans and the web UI (Flink's names).
    name = "?"
    #: Pointwise (Flink's POINTWISE distribution): a producer subtask talks only to a contiguous
    #: range of consumer subtasks (subtask i to subtask i when the parallelisms are equal).
    is_pointwise = False
    #: The edge carries event timestamps (set by the job graph): buffers hold a timestamp column.
    timestamped = False
    #: The edge carries Arrow record batches (the batch path): the task gives it the columnar
    #: record writer, and channels send its batches as Arrow IPC.
    columnar = False

    def setup(self, num_channels: int, subtask_index: int) -> None:
        """Bind to this subtask's output channels."""
        self.num_channels = num_channels
        self.subtask_index = subtask_index

    @abstractmethod
    def partition(self, records: list[Any], buffers: list[Any]) -> None:
        """Append every record to the buffer of the channel it goes to."""

    @abstractmethod
    def partition_timestamped(
        self, records: list[Any], timestamps: list[int | None], buffers: list[Any]
    ) -> None:
        """:meth:`partition` on a timestamped edge: buffers are :class:`TimestampedBatch`
        (or :class:`KeyedBatch` with timestamps) and each record keeps its timestamp."""

    def new_buffer(self) -> Any:
        """An empty per-channel buffer (a list; keyed or timestamped edges use columns)."""
        return TimestampedBatch() if self.timestamped else []

    def with_timestamps(self, timestamped: bool) -> StreamPartitioner:
        """A copy of this prototype for an edge that does (or does not) carry timestamps."""
        clone = self.copy()
        clone.timestamped = timestamped
        return clone

    def copy(self) -> StreamPartitioner:
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def __repr__(self) -> str:
        return self.name


class ForwardPartitioner(StreamPartitioner):
    """Subtask i to subtask i (same parallelism on both sides); what chains are made of."""

    name = "FORWARD"
    is_pointwise = True

    def partition(self, records: list[Any], buffers: list[list[Any]]) -> None:
        buffers[0].extend(records)

    def partition_timestamped(
        self, records: list[Any], timestamps: list[int | None], buffers: list[TimestampedBatch]
    ) -> None:
        buffers[0].values.extend(records)
        buffers[0].timestamps.extend(timestamps)


class RebalancePartitioner(StreamPartitioner):
    """Round-robin over all channels, starting at a random one (evens out skew)."""

    name = "REBALANCE"

    def setup(self, num_channels: int, subtask_index: int) -> None:
        super().setup(num_channels, subtask_index)
        self._position = random.Random(subtask_index).randrange(num_channels)

    def partition(self, records: list[Any], buffers: list[list[Any]]) -> None:
        n = self.num_channels
        position = self._position
        if n == 1:
            buffers[0].extend(records)
            return
        for offset in range(min(n, len(records))):
            buffers[(position + offset) % n].extend(records[offset::n])
        self._position = (position + len(records)) % n

    def partition_timestamped(
        self, records: list[Any], timestamps: list[int | None], buffers: list[TimestampedBatch]
    ) -> None:
        n = self.num_channels
        position = self._position
        for offset in range(min(n, len(records))):
            buffer = buffers[(position + offset) % n]
            buffer.values.extend(records[offset::n])
            buffer.timestamps.extend(timestamps[offset::n])
        self._position = (position + len(records)) % n


class RescalePartitioner(RebalancePartitioner):
    """Round-robin over the few consumers this producer is wired to (Flink's RESCALE).

    The edge is pointwise: with parallelism 2 upstream and 4 downstream, producer 0 feeds
    consumers 0 and 1 and producer 1 feeds 2 and 3; with 4 upstream and 2 downstream,
    producers 0 and 1 feed consumer 0. Each producer therefore has only a few channels
    (and a consumer only a few inputs), which keeps connections and barrier alignment
    local where rebalance would connect every pair. Like Flink's, each producer starts
    at its first channel.
    """

    name = "RESCALE"
    is_pointwise = True

    def setup(self, num_channels: int, subtask_index: int) -> None:
        StreamPartitioner.setup(self, num_channels, subtask_index)
        self._position = 0


class ShufflePartitioner(StreamPartitioner):
    """A random channel per record."""

    name = "SHUFFLE"

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed

    def setup(self, num_channels: int, subtask_index: int) -> None:
        super().setup(num_channels, subtask_index)
        seed = None if self.seed is None else self.seed * 1_000_003 + subtask_index
        self._random = random.Random(seed)
        self._channels = range(num_channels)

    def partition(self, records: list[Any], buffers: list[list[Any]]) -> None:
        targets = self._random.choices(self._channels, k=len(records))
        for record, target in zip(records, targets, strict=True):
            buffers[target].append(record)

    def partition_timestamped(
        self, records: list[Any], timestamps: list[int | None], buffers: list[TimestampedBatch]
    ) -> None:
        targets = self._random.choices(self._channels, k=len(records))
        for record, timestamp, target in zip(records, timestamps, targets, strict=True):
            buffer = buffers[target]
            buffer.values.append(record)
            buffer.timestamps.append(timestamp)


class BroadcastPartitioner(StreamPartitioner):
    """Every record to every channel."""

    name = "BROADCAST"

    def partition(self, records: list[Any], buffers: list[list[Any]]) -> None:
        for buffer in buffers:
            buffer.extend(records)

    def partition_timestamped(
        self, records: list[Any], timestamps: list[int | None], buffers: list[TimestampedBatch]
    ) -> None:
        for buffer in buffers:
            buffer.values.extend(records)
            buffer.timestamps.extend(timestamps)


class KeyGroupStreamPartitioner(StreamPartitioner):
    """By key: ``key_group * parallelism // max_parallelism`` (Flink's HASH edge).

    ``max_parallelism`` is the consuming vertex's, set by the job graph
    (:meth:`for_target`) once parallelisms are known. Into a keyed operator the
    records travel as :class:`~chandy.task.batches.KeyedBatch` columns
    (key group, key, value); into any other operator (``key_by(...).print()``)
    as plain values.
    """

    name = "HASH"

    def __init__(
        self, key_selector: Callable[[Any], Any], max_parallelism: int = 0, ship_keys: bool = True
    ) -> None:
        self.key_selector = key_selector
        self.max_parallelism = max_parallelism
        self.ship_keys = ship_keys

    def for_target(self, max_parallelism: int, ship_keys: bool) -> KeyGroupStreamPartitioner:
        target = KeyGroupStreamPartitioner(self.key_selector, max_parallelism, ship_keys)
        target.timestamped = self.timestamped
        return target

    def setup(self, num_channels: int, subtask_index: int) -> None:
        super().setup(num_channels, subtask_index)
        max_p = self.max_parallelism
        if not 1 <= num_channels <= max_p:
            raise ValueError(f"parallelism {num_channels} is outside [1, max parallelism {max_p}]")
        self._assigner = KeyGroupAssigner(max_p)
        self._channel_of = [kg * num_channels // max_p for kg in range(max_p)]

    def new_buffer(self) -> Any:
        if self.ship_keys:
            return KeyedBatch.with_timestamps() if self.timestamped else KeyedBatch()
        return TimestampedBatch() if self.timestamped else []

    def _key_groups(self, keys: list[Any]) -> list[int]:
        """Key groups of ``keys``: C-speed cache lookups, Python only for new keys."""
        assigner = self._assigner
        try:
            groups = list(map(assigner.cache.get, keys))
        except TypeError:
            groups = [None] * len(keys)  # an unhashable key: key_group() names it
        if None in groups:
            key_group = assigner.key_group
            groups = [kg if kg is not None else key_group(k) for kg, k in zip(groups, keys, strict=True)]
        return groups  # type: ignore[return-value]

    def partition(self, records: list[Any], buffers: list[Any]) -> None:
        keys = list(map(self.key_selector, records))
        groups = self._key_groups(keys)
        if len(buffers) == 1:
            buffer = buffers[0]
            if self.ship_keys:
                buffer.key_groups.extend(groups)
                buffer.keys.extend(keys)
                buffer.values.extend(records)
            else:
                buffer.extend(records)
            return
        channel_of = self._channel_of
        if self.ship_keys:
            # One Python loop beats per-channel masks from two channels on (measured).
            group_appenders = [b.key_groups.append for b in buffers]
            key_appenders = [b.keys.append for b in buffers]
            value_appenders = [b.values.append for b in buffers]
            for kg, key, value in zip(groups, keys, records, strict=True):
                channel = channel_of[kg]
                group_appenders[channel](kg)
                key_appenders[channel](key)
                value_appenders[channel](value)
        else:
            appenders = [b.append for b in buffers]
            for kg, value in zip(groups, records, strict=True):
                appenders[channel_of[kg]](value)

    def partition_timestamped(
        self, records: list[Any], timestamps: list[int | None], buffers: list[Any]
    ) -> None:
        keys = list(map(self.key_selector, records))
        groups = self._key_groups(keys)
        ship_keys = self.ship_keys
        if len(buffers) == 1:
            buffer = buffers[0]
            if ship_keys:
                buffer.key_groups.extend(groups)
                buffer.keys.extend(keys)
            buffer.values.extend(records)
            buffer.timestamps.extend(timestamps)
            return
        channel_of = self._channel_of
        value_appenders = [b.values.append for b in buffers]
        time_appenders = [b.timestamps.append for b in buffers]
        if ship_keys:
            group_appenders = [b.key_groups.append for b in buffers]
            key_appenders = [b.keys.append for b in buffers]
            for kg, key, value, timestamp in zip(groups, keys, records, timestamps, strict=True):
                channel = channel_of[kg]
                group_appenders[channel](kg)
                key_appenders[channel](key)
                value_appenders[channel](value)
                time_appenders[channel](timestamp)
        else:
            for kg, value, timestamp in zip(groups, records, timestamps, strict=True):
                channel = channel_of[kg]
                value_appenders[channel](value)
                time_appenders[channel](timestamp)


class CustomPartitionerWrapper(StreamPartitioner):
    """``partition_custom``: the user's ``Partitioner.partition(key, num_partitions)`` picks
    the channel of each record by its key (Flink's CUSTOM edge, all-to-all).

    ``num_partitions`` is the number of consumer subtasks. A return value that is not an
    int in ``[0, num_partitions)`` fails the task with an error naming the partitioner,
    the key and the value: Python would otherwise index a negative channel from the end
    and route the record silently to the wrong subtask.
    """

    name = "CUSTOM"

    def __init__(self, partitioner: Partitioner | Callable[[Any, int], Any], key_selector: Any) -> None:
        self.partitioner = partitioner
        self.key_selector = key_selector

    def setup(self, num_channels: int, subtask_index: int) -> None:
        super().setup(num_channels, subtask_index)
        # Each producing subtask gets its own copy of the user's objects, as of its functions.
        partitioner = copy.deepcopy(self.partitioner)
        selector = copy.deepcopy(self.key_selector)
        self.partition_function: Callable[[Any, int], Any] = (
            partitioner.partition if isinstance(partitioner, Partitioner) else partitioner
        )
        self._select: Callable[[Any], Any] = (
            selector.get_key if isinstance(selector, KeySelector) else selector
        )

    def _channel(self, channel: Any, key: Any) -> int:
        """``channel`` as a valid channel index (an int-like, e.g. numpy's), else the error."""
        n = self.num_channels
        if not isinstance(channel, bool):
            try:
                index = operator.index(channel)
            except TypeError:
                pass
            else:
                if 0 <= index < n:
                    return index
        raise ValueError(
            f"partition_custom: {_callable_name(self.partition_function)} returned {channel!r} for key "
            f"{key!r}, but the partition must be an int in [0, {n}) (num_partitions is {n}, the "
            "parallelism of the next operator): return key_hash % num_partitions or similar"
        )

    def partition(self, records: list[Any], buffers: list[list[Any]]) -> None:
        select = self._select
        partition = self.partition_function
        n = self.num_channels
        appenders = [b.append for b in buffers]
        for record in records:
            key = select(record)
            channel = partition(key, n)
            if channel.__class__ is not int or not 0 <= channel < n:
                channel = self._channel(channel, key)
            appenders[channel](record)

    def partition_timestamped(
        self, records: list[Any], timestamps: list[int | None], buffers: list[TimestampedBatch]
    ) -> None:
        select = self._select
        partition = self.partition_function
        n = self.num_channels
        for record, timestamp in zip(records, timestamps, strict=True):
            key = select(record)
            channel = partition(key, n)
            if channel.__class__ is not int or not 0 <= channel < n:
                channel = self._channel(channel, key)
            buffer = buffers[channel]
            buffer.values.append(record)
            buffer.timestamps.append(timestamp)


def _callable_name(function: Any) -> str:
    """How an error names a user's function: its class for a bound method, else its name."""
    owner = getattr(function, "__self__", None)
    if owner is not None:
        return f"{type(owner).__name__}.{function.__name__}"
    return getattr(function, "__qualname__", repr(function))
