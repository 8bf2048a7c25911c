"""Simple sinks: print to stdout, discard."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from chandy.core.connector import Sink, SinkWriter, SinkWriterContext


class PrintSinkWriter(SinkWriter):
    def __init__(self, prefix: str, stream: TextIO | None) -> None:
        self._prefix = prefix
        self._stream = stream

    def write(self, element: Any) -> None:
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        stream = self._stream or sys.stdout
        prefix = self._prefix
        stream.write("".join(f"{prefix}{e}\n" for e in elements))

    def flush(self, end_of_input: bool) -> None:
        (self._stream or sys.stdout).flush()


class PrintSink(Sink):
    """Writes every record to stdout (or ``stderr=True``), one per line.

    As in Flink, with more than one subtask each line starts with the subtask's
    number (``"2> record"``); ``sink_identifier`` is put in front of that.
    """

    def __init__(self, sink_identifier: str | None = None, stderr: bool = False) -> None:
        if sink_identifier is not None and not isinstance(sink_identifier, str):
            raise TypeError(
                "PrintSink: sink_identifier must be a str put in front of every line, or None, got "
                f"{sink_identifier!r} ({type(sink_identifier).__name__})"
            )
        if not isinstance(stderr, bool):
            raise TypeError(
                f"PrintSink: stderr must be True (print to stderr) or False (stdout), got {stderr!r}"
            )
        self.sink_identifier = sink_identifier
        self.stderr = stderr

    def create_writer(self, context: SinkWriterContext) -> PrintSinkWriter:
        parts = []
        if self.sink_identifier:
            parts.append(self.sink_identifier)
        if context.parallelism > 1:
            parts.append(str(context.subtask_index + 1))
        prefix = ":".join(parts) + "> " if parts else ""
        return PrintSinkWriter(prefix, sys.stderr if self.stderr else None)


class _DiscardingWriter(SinkWriter):
    def write(self, element: Any) -> None:
        pass

    def write_batch(self, elements: list[Any]) -> None:
        pass


class DiscardingSink(Sink):
    """Drops every record (benchmarks, jobs run for their side effects)."""

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        return _DiscardingWriter()
