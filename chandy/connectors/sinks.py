"""Simple sinks: print to stdout, discard."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from chandy.core.connector import Sink, SinkWriter, SinkWriterContext
from chandy.core.types import PickledBytesTypeInfo, TypeInformation, format_as_flink


class PrintSinkWriter(SinkWriter):
    """The print sink's writer: one line per record on stdout (or stderr), after the subtask's prefix."""

    def __init__(self, prefix: str, stream: TextIO | None, type_info: TypeInformation | None = None) -> None:
        self._prefix = prefix
        self._stream = stream
        self._type_info = None if isinstance(type_info, PickledBytesTypeInfo) else type_info

    def write(self, element: Any) -> None:
        """Print the record."""
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        stream = self._stream or sys.stdout
        prefix = self._prefix
        type_info = self._type_info
        if type_info is None:
            stream.write("".join(f"{prefix}{e}\n" for e in elements))
        else:
            stream.write("".join(f"{prefix}{format_as_flink(e, type_info)}\n" for e in elements))

    def flush(self, end_of_input: bool) -> None:
        (self._stream or sys.stdout).flush()


class PrintSink(Sink):
    """Writes every record to stdout (or ``stderr=True``), one per line.

    As in Flink, with more than one subtask each line starts with the subtask's
    number (``"2> record"``); ``sink_identifier`` is put in front of that. With the
    stream's declared ``type_info`` (PyFlink's ``output_type``) records print as Flink's
    Java prints them (``(hi,0,5,4)``, ``1.0E7``, ``true``); untyped, as ``str(record)``.
    """

    def __init__(
        self,
        sink_identifier: str | None = None,
        stderr: bool = False,
        type_info: TypeInformation | None = None,
    ) -> None:
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
        self.type_info = type_info

    def create_writer(self, context: SinkWriterContext) -> PrintSinkWriter:
        parts = []
        if self.sink_identifier:
            parts.append(self.sink_identifier)
        if context.parallelism > 1:
            parts.append(str(context.subtask_index + 1))
        prefix = ":".join(parts) + "> " if parts else ""
        return PrintSinkWriter(prefix, sys.stderr if self.stderr else None, self.type_info)


class _DiscardingWriter(SinkWriter):
    def write(self, element: Any) -> None:
        pass

    def write_batch(self, elements: list[Any]) -> None:
        pass


class DiscardingSink(Sink):
    """Drops every record (benchmarks, jobs run for their side effects)."""

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        return _DiscardingWriter()
