"""Sources of Arrow record batches (``Source.columnar``): ``env.from_source`` gives a ``BatchStream``.

The batch twins of :class:`~chandy.connectors.number_sequence.NumberSequenceSource` and
:class:`~chandy.connectors.data_generator.DataGeneratorSource`. They cut their input into the
same splits, keep the same positions in them and so restore (at any parallelism) exactly like
the record sources: nothing twice, nothing skipped. The only difference is what a poll hands
the task: one ``pyarrow.RecordBatch`` of up to ``max_records`` rows, made by numpy, instead of
a list of Python objects, so producing a row costs nanoseconds instead of a Python call.

The file formats (``FileSource.for_batch_format``) and the Kafka batch deserializer
(``KafkaSourceBuilder.set_batch_deserializer``) live beside their record twins, whose
split and offset machinery they share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pyarrow as pa

from chandy.connectors.data_generator import DataGeneratorReader, DataGeneratorSource
from chandy.connectors.number_sequence import NumberSequenceReader, NumberSequenceSource
from chandy.core.connector import SourceReaderContext
from chandy.task.operators.batch import to_record_batch

__all__ = ["ArrowDataGeneratorSource", "ArrowNumberSequenceSource"]


class ArrowNumberSequenceReader(NumberSequenceReader):
    """One ``np.arange`` per poll: the batch is a zero-copy view of it."""

    def __init__(self, column: str) -> None:
        super().__init__()
        self._schema = pa.schema([(column, pa.int64())])

    def poll_next(self, max_records: int) -> pa.RecordBatch | None:
        taken = self.next_range(max_records)
        if taken is None:
            return None
        values = np.arange(*taken, dtype=np.int64)
        return pa.RecordBatch.from_arrays([pa.array(values)], schema=self._schema)


class ArrowNumberSequenceSource(NumberSequenceSource):
    """Every integer from ``start`` to ``end`` inclusive as an ``int64`` column ``column``,
    split evenly across subtasks like :class:`NumberSequenceSource` (whose splits and
    checkpointed positions it shares), in batches of up to the task's batch size."""

    columnar = True

    def __init__(self, start: int, end: int, column: str = "value") -> None:
        super().__init__(start, end)
        if not isinstance(column, str) or not column:
            raise TypeError(f"ArrowNumberSequenceSource: column must be a non-empty str, got {column!r}")
        self.column = column

    def create_reader(self, context: SourceReaderContext) -> ArrowNumberSequenceReader:
        return ArrowNumberSequenceReader(self.column)


class ArrowDataGeneratorReader(DataGeneratorReader):
    """Hands the generator the due indices as one int64 array; the rate limit and the
    split positions are the record reader's."""

    def poll_next(self, max_records: int) -> pa.RecordBatch | list[Any] | None:
        due = self.next_range(max_records)
        if not isinstance(due, tuple):
            return due
        split, n = due
        indices = np.arange(split.position, split.position + n * split.step, split.step, dtype=np.int64)
        result = self._generate(indices)
        try:
            batch = to_record_batch(result)
        except TypeError:
            raise TypeError(
                "ArrowDataGeneratorSource: the generator must return a pyarrow.RecordBatch, a "
                "pyarrow.Table, a pandas DataFrame or a dict of column name to array (numpy "
                f"array, pyarrow array or list), got {type(result).__name__}"
            ) from None
        self.advance(split, n)  # only once the batch was made: a raising generator moves nothing
        return [] if batch is None else batch


class ArrowDataGeneratorSource(DataGeneratorSource):
    """Rows made by ``generator(indices)`` for the indices ``[0, count)`` (forever when
    ``count`` is ``None``), optionally limited to ``rate_per_second`` rows for the whole
    source: the batch twin of :class:`DataGeneratorSource` (same splits, positions and
    token-bucket limit; see its docs).

    ``generator`` gets a ``numpy.ndarray`` of ``int64`` indices and returns a
    ``pyarrow.RecordBatch``, a ``pyarrow.Table`` or a dict of column name to array; it must
    be deterministic (a restore generates the indices after the checkpoint again). Under a
    rate limit a poll takes only the rows that are due, so at low rates batches are small
    and leave at once: latency stays that of the record source.
    """

    columnar = True
    _FUNCTION_ARGUMENT = "generator"
    _RATE_ARGUMENT = "rate_per_second"

    def __init__(
        self,
        generator: Callable[[np.ndarray], Any],
        count: int | None = None,
        rate_per_second: float | None = None,
    ) -> None:
        # The record source's checks and splits; its reader is replaced by create_reader.
        super().__init__(cast(Callable[[int], Any], generator), count, rate_per_second)

    def create_reader(self, context: SourceReaderContext) -> ArrowDataGeneratorReader:
        share = None if self.records_per_second is None else self.records_per_second / context.parallelism
        return ArrowDataGeneratorReader(
            self.generator_function, share, self.get_boundedness(), self.plan(context)
        )
