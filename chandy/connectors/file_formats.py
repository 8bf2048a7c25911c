"""Record formats of the :class:`~chandy.connectors.file_source.FileSource`.

Two kinds, as in Flink:

- a :class:`StreamFormat` reads records from a byte stream, one after the other
  (text lines, CSV, JSON lines). Its position in a file is the byte offset of
  the next record, so a restore seeks there and continues at the exact line;
- a :class:`BulkFormat` reads a file in blocks through a library
  (:class:`ParquetFormat`: row groups, read in record batches). Its position is
  (row group, rows of it already read).

A format opens a :class:`FileRecordReader` for one :class:`FileSourceSplit`; the
record reader advances the split's position as it hands out records, so the
split is always the exact checkpointable position of the file.
"""

from __future__ import annotations

import codecs
import csv
import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, BinaryIO

from chandy.connectors.arrow_schema import SchemaLike, check_optional_schema
from chandy.errors import UnrecoverableError

log = logging.getLogger(__name__)

#: Read buffer of line-format files: large enough that reading is not syscall-bound.
_BUFFER_BYTES = 1 << 20


class MalformedRecordError(UnrecoverableError, ValueError):
    """A record of an input file cannot be parsed; the message names the file and line.

    Unrecoverable: a restart would read the same bytes and fail again, so the job
    fails at once (also with checkpointing on) instead of restarting forever."""


@dataclass
class FileSourceSplit:
    """One file and how far it has been read (Flink's ``FileSourceSplit`` with its
    ``CheckpointedPosition``).

    ``offset``: for stream formats the byte offset of the next record; for bulk
    formats the index of the next row group. ``records_after_offset``: for bulk
    formats the rows of that row group already emitted (0 for stream formats,
    whose offsets always fall on a record boundary; for the CSV and JSON batch
    formats the rows of the file already emitted). ``line``: lines before
    ``offset``, so error messages name the right line after a restore.
    ``header``: a CSV file's column names, once its header line was read, so a
    restore in the middle of the file still makes dicts without re-reading it.
    """

    path: str
    offset: int = 0
    records_after_offset: int = 0
    line: int = 0
    header: tuple[str, ...] | None = None
    #: Batch formats that infer types (CSV, JSON): the file's Arrow schema (IPC bytes), fixed
    #: when its first block was read, so a restore in the middle reads the same types.
    schema: bytes | None = None

    @property
    def split_id(self) -> str:
        """The file's path: a split is one file."""
        return self.path

    def copy(self) -> FileSourceSplit:
        """A copy of the split, as the reader's checkpointed position is taken from it."""
        return replace(self)


class FileRecordReader(ABC):
    """Reads the records of one split, advancing the split's position."""

    @abstractmethod
    def read_batch(self, max_records: int) -> list[Any] | None:
        """Up to ``max_records`` records (at least one); ``None`` at the end of the file."""

    @abstractmethod
    def close(self) -> None:
        """Close the file being read."""


# --------------------------------------------------------------------------- stream formats


class StreamFormat(ABC):
    """Reads records one after the other from a file's bytes (Flink's ``StreamFormat``)."""

    @abstractmethod
    def create_reader(self, split: FileSourceSplit) -> FileRecordReader:
        """Open ``split.path`` and continue at the split's position."""

    def validate(self) -> None:
        """Reject a bad configuration when the job is built."""

    @staticmethod
    def text_line_format(encoding: str = "utf-8") -> TextLineFormat:
        """Each line of the file is a record: a ``str`` without its line ending (PyFlink's
        ``StreamFormat.text_line_format``)."""
        return TextLineFormat(encoding)


def _check_line_encoding(encoding: str, who: str) -> str:
    """Line formats split the raw bytes at ``b"\\n"`` (so a byte offset always marks a
    line start); that is only right for encodings that write ``\\n`` as that one byte."""
    if not isinstance(encoding, str):
        raise TypeError(f"{who}: encoding must be a str, got {type(encoding).__name__}")
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(f"{who}: unknown encoding {encoding!r}") from None
    if "\n".encode(name) != b"\n" or "a".encode(name) != b"a":
        raise ValueError(
            f"{who}: encoding {encoding!r} is not ASCII-compatible; line formats read "
            "utf-8, latin-1, cp1252 and other encodings that write a newline as one byte"
        )
    return name


class _LineReader(FileRecordReader):
    """The shared machinery of line formats: seek to the split's offset, then read
    whole lines, keeping ``split.offset`` at the start of the next unread line."""

    def __init__(self, split: FileSourceSplit, encoding: str) -> None:
        self.split = split
        self.encoding = encoding
        self._file: BinaryIO = open(split.path, "rb", buffering=_BUFFER_BYTES)
        if split.offset:
            self._file.seek(split.offset)

    def _error(self, line: int, what: str) -> MalformedRecordError:
        return MalformedRecordError(f"{self.split.path}, line {line}: {what}")

    def _decode(self, raw: bytes, line: int) -> str:
        try:
            return raw.decode(self.encoding)
        except UnicodeDecodeError as e:
            raise self._error(
                line, f"not valid {self.encoding} ({e.reason} at byte {e.start} of the line)"
            ) from None

    def close(self) -> None:
        self._file.close()


def _strip_newline(text: str) -> str:
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    elif text.endswith("\r"):
        text = text[:-1]
    return text


class _ParsedLineReader(_LineReader):
    """One record per line, made by ``parse`` (``None`` skips the line)."""

    def __init__(
        self, split: FileSourceSplit, encoding: str, parse: Callable[[str, int], Any], skip_blank: bool
    ) -> None:
        super().__init__(split, encoding)
        self._parse = parse
        self._skip_blank = skip_blank

    def read_batch(self, max_records: int) -> list[Any] | None:
        split = self.split
        readline = self._file.readline
        parse = self._parse
        out: list[Any] = []
        while len(out) < max_records:
            raw = readline()
            if not raw:
                break
            line = split.line + 1
            text = _strip_newline(self._decode(raw, line))
            if not (self._skip_blank and not text.strip()):
                out.append(parse(text, line))
            # advance only once the line was turned into a record: a parse error
            # leaves the position at the bad line
            split.line = line
            split.offset += len(raw)
        if not out:
            return None
        return out


class TextLineFormat(StreamFormat):
    """Each line is a record (a ``str`` without ``\\n`` / ``\\r\\n``); empty lines are
    records too, as in Flink's ``TextLineInputFormat``."""

    def __init__(self, encoding: str = "utf-8") -> None:
        self.encoding = _check_line_encoding(encoding, "StreamFormat.text_line_format")

    def create_reader(self, split: FileSourceSplit) -> FileRecordReader:
        return _ParsedLineReader(split, self.encoding, lambda text, line: text, skip_blank=False)

    def __repr__(self) -> str:
        return f"TextLineFormat(encoding={self.encoding!r})"


class JsonLinesFormat(StreamFormat):
    """Each non-blank line is one JSON document; the record is the parsed object
    (``dict``, ``list``, ``str``, number, ``bool`` or ``None``).

    A line that is not valid JSON fails the job with the file, line and column.
    """

    def __init__(self, encoding: str = "utf-8") -> None:
        self.encoding = _check_line_encoding(encoding, "JsonLinesFormat")

    def create_reader(self, split: FileSourceSplit) -> FileRecordReader:
        path = split.path
        loads = json.loads

        def parse(text: str, line: int) -> Any:
            try:
                return loads(text)
            except json.JSONDecodeError as e:
                raise MalformedRecordError(
                    f"{path}, line {line}: malformed JSON ({e.msg} at column {e.colno})"
                ) from None

        return _ParsedLineReader(split, self.encoding, parse, skip_blank=True)

    def __repr__(self) -> str:
        return f"JsonLinesFormat(encoding={self.encoding!r})"


class CsvFormat(StreamFormat):
    """Comma-separated values, read with Python's ``csv`` module; values are ``str``.

    - ``has_header=True`` (the default): the first line names the columns and each
      record is a ``dict`` of column name to value.
    - ``column_names=[...]``: records are dicts with these names; with
      ``has_header=True`` the file's own header line is skipped.
    - ``has_header=False`` and no ``column_names``: each record is a ``list``.

    When records are dicts, a row with a different number of fields than there
    are columns fails the job naming the file and line (a silently shifted
    column is worse than a stopped job), as does a row the ``csv`` module cannot
    parse (``strict`` quoting). Blank lines are skipped. A quoted field may span
    lines; the position kept for checkpoints is always the start of a row.

    ``delimiter``, ``quote_char``, ``escape_char`` and ``double_quote`` are the
    ``csv`` dialect's ``delimiter``, ``quotechar``, ``escapechar`` and ``doublequote``.
    """

    def __init__(
        self,
        *,
        has_header: bool = True,
        column_names: Sequence[str] | None = None,
        delimiter: str = ",",
        quote_char: str | None = '"',
        escape_char: str | None = None,
        double_quote: bool = True,
        encoding: str = "utf-8",
    ) -> None:
        if not isinstance(has_header, bool):
            raise TypeError(f"CsvFormat: has_header must be a bool, got {type(has_header).__name__}")
        if column_names is not None:
            if isinstance(column_names, str) or not all(isinstance(c, str) for c in column_names):
                raise TypeError("CsvFormat: column_names must be a list of str")
            column_names = tuple(column_names)
            if not column_names:
                raise ValueError("CsvFormat: column_names must not be empty")
        for name, value in (
            ("delimiter", delimiter),
            ("quote_char", quote_char),
            ("escape_char", escape_char),
        ):
            if value is not None and (not isinstance(value, str) or len(value) != 1):
                raise ValueError(f"CsvFormat: {name} must be a single character, got {value!r}")
        if delimiter is None or delimiter in "\r\n":
            raise ValueError(
                f"CsvFormat: delimiter must be a single character other than a line break, got {delimiter!r}"
            )
        self.has_header = has_header
        self.column_names: tuple[str, ...] | None = column_names
        self.delimiter = delimiter
        self.quote_char = quote_char
        self.escape_char = escape_char
        self.double_quote = double_quote
        self.encoding = _check_line_encoding(encoding, "CsvFormat")
        self._dialect_args()  # the csv module accepts the combination, or an error now

    def _dialect_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {
            "delimiter": self.delimiter,
            "escapechar": self.escape_char,
            "doublequote": self.double_quote,
            "strict": True,
        }
        if self.quote_char is None:
            args["quoting"] = csv.QUOTE_NONE
        else:
            args["quotechar"] = self.quote_char
        try:
            csv.reader([], **args)
        except (TypeError, csv.Error) as e:
            raise ValueError(f"CsvFormat: invalid dialect: {e}") from None
        return args

    def create_reader(self, split: FileSourceSplit) -> FileRecordReader:
        return _CsvReader(split, self)

    def __repr__(self) -> str:
        return (
            f"CsvFormat(has_header={self.has_header}, column_names={self.column_names}, "
            f"delimiter={self.delimiter!r}, encoding={self.encoding!r})"
        )


class _CsvReader(_LineReader):
    def __init__(self, split: FileSourceSplit, fmt: CsvFormat) -> None:
        super().__init__(split, fmt.encoding)
        self._fmt = fmt
        # The csv module pulls lines from _lines() one at a time and returns a row as soon
        # as the line that ends it was read, so after each row split.offset is exactly at
        # the start of the next one, even when a quoted field spans lines.
        self._rows = csv.reader(self._lines(), **fmt._dialect_args())
        if split.header is None:
            split.header = fmt.column_names
        self._needs_header = fmt.has_header and split.offset == 0

    def _lines(self) -> Iterator[str]:
        readline = self._file.readline
        split = self.split
        while True:
            raw = readline()
            if not raw:
                return
            split.line += 1
            split.offset += len(raw)
            yield self._decode(raw, split.line)

    def _next_row(self) -> tuple[list[str], int] | None:
        """The next non-blank row and the line it starts on; ``None`` at end of file."""
        while True:
            start = self.split.line + 1
            try:
                row = next(self._rows)
            except StopIteration:
                return None
            except csv.Error as e:
                raise self._error(start, f"malformed CSV row ({e})") from None
            if row:
                return row, start

    def read_batch(self, max_records: int) -> list[Any] | None:
        split = self.split
        if self._needs_header:
            self._needs_header = False
            first = self._next_row()
            if first is None:
                return None
            if split.header is None:
                split.header = tuple(first[0])
        names = split.header
        out: list[Any] = []
        while len(out) < max_records:
            found = self._next_row()
            if found is None:
                break
            row, line = found
            if names is None:
                out.append(row)
            else:
                if len(row) != len(names):
                    raise self._error(
                        line,
                        f"CSV row has {len(row)} fields but there are {len(names)} columns {list(names)}",
                    )
                out.append(dict(zip(names, row, strict=True)))
        if not out:
            return None
        return out


# --------------------------------------------------------------------------- bulk formats


class BulkFormat(ABC):
    """Reads a file in blocks through a library (Flink's ``BulkFormat``)."""

    @abstractmethod
    def create_reader(self, split: FileSourceSplit) -> FileRecordReader:
        """Open ``split.path`` and continue at the split's position."""

    def validate(self) -> None:
        """Reject a bad configuration when the job is built."""


class ParquetFormat(BulkFormat):
    """Apache Parquet files, read with pyarrow; each record is a ``dict`` of column to value.

    ``columns`` reads only these columns (all when ``None``). The file is read one
    row group at a time, in record batches of at most ``batch_size`` rows, never
    whole: memory stays bounded by a batch however large the file. The position
    kept for checkpoints is (row group, rows of it already emitted).
    Needs ``pyarrow`` (``pip install pyarrow``).
    """

    def __init__(self, columns: Sequence[str] | None = None, batch_size: int = 8192) -> None:
        if columns is not None:
            if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
                raise TypeError("ParquetFormat: columns must be a list of column names (str)")
            columns = list(columns)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"ParquetFormat: batch_size must be an int >= 1, got {batch_size!r}")
        self.columns: list[str] | None = columns
        self.batch_size = batch_size

    def validate(self) -> None:
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise ImportError("ParquetFormat needs pyarrow: pip install pyarrow") from None

    def create_reader(self, split: FileSourceSplit) -> FileRecordReader:
        return _ParquetReader(split, self)

    def __repr__(self) -> str:
        return f"ParquetFormat(columns={self.columns}, batch_size={self.batch_size})"


class _ParquetReader(FileRecordReader):
    def __init__(self, split: FileSourceSplit, fmt: ParquetFormat | ParquetBatchFormat) -> None:
        import pyarrow.parquet as pq

        self.split = split
        self._fmt = fmt
        try:
            self._file = pq.ParquetFile(split.path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise MalformedRecordError(f"{split.path}: not a readable Parquet file ({e})") from None
        self._num_row_groups = self._file.num_row_groups
        self._batches: Iterator[Any] | None = None
        self._batch: Any = None
        self._batch_pos = 0

    def _open_row_group(self) -> None:
        """Iterate over the split's current row group, skipping the rows already emitted."""
        split = self.split
        self._batches = self._file.iter_batches(
            batch_size=self._fmt.batch_size, row_groups=[split.offset], columns=self._fmt.columns
        )
        self._batch, self._batch_pos = None, 0
        skip = split.records_after_offset
        while skip:
            batch = next(self._batches, None)
            if batch is None:
                return
            if batch.num_rows > skip:
                self._batch, self._batch_pos = batch, skip
                return
            skip -= batch.num_rows

    def read_batch(self, max_records: int) -> list[Any] | None:
        split = self.split
        while split.offset < self._num_row_groups:
            if self._batches is None:
                self._open_row_group()
            if self._batch is None or self._batch_pos >= self._batch.num_rows:
                self._batch = next(self._batches, None)  # type: ignore[arg-type]
                self._batch_pos = 0
                if self._batch is None:  # row group done
                    split.offset += 1
                    split.records_after_offset = 0
                    self._batches = None
                    continue
                if self._batch.num_rows == 0:
                    continue
            n = min(max_records, self._batch.num_rows - self._batch_pos)
            records: list[Any] = self._emit(self._batch.slice(self._batch_pos, n))
            self._batch_pos += n
            split.records_after_offset += n
            return records
        return None

    def _emit(self, batch: Any) -> Any:
        """What a read hands out for ``batch`` (a slice of the file): its rows as dicts."""
        return batch.to_pylist()

    def close(self) -> None:
        self._batches = None
        self._batch = None
        self._file.close()


# --------------------------------------------------------------------------- batch formats


class BatchFormat(ABC):
    """Reads a file as Arrow record batches (``FileSource.for_batch_format``): the source is
    a batch source (``Source.columnar``) and ``env.from_source`` gives a ``BatchStream``.

    A read hands out one ``pyarrow.RecordBatch`` of up to ``max_records`` rows (never
    empty); the split keeps the position as the record formats do, so a checkpoint and
    a restore are exact."""

    @abstractmethod
    def create_reader(self, split: FileSourceSplit) -> FileRecordReader:
        """Open ``split.path`` and continue at the split's position."""

    def validate(self) -> None:
        """Reject a bad configuration when the job is built."""


class ParquetBatchFormat(BatchFormat):
    """Apache Parquet files as record batches (only ``columns``, all when ``None``), read a
    row group at a time in batches of at most ``batch_size`` rows, with no conversion to
    Python objects. The position is (row group, rows of it emitted), as
    :class:`ParquetFormat` keeps it."""

    def __init__(self, columns: Sequence[str] | None = None, batch_size: int = 65_536) -> None:
        # The same arguments and checks as the record format's.
        checked = ParquetFormat(columns, batch_size)
        self.columns = checked.columns
        self.batch_size = checked.batch_size

    def create_reader(self, split: FileSourceSplit) -> FileRecordReader:
        return _ParquetBatchReader(split, self)

    def __repr__(self) -> str:
        return f"ParquetBatchFormat(columns={self.columns}, batch_size={self.batch_size})"


class _ParquetBatchReader(_ParquetReader):
    def _emit(self, batch: Any) -> Any:
        return batch


def _schema_bytes(schema: Any) -> bytes:
    return bytes(schema.serialize().to_pybytes())


def _schema_of(data: bytes) -> Any:
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(data))


class _ArrowStreamReader(FileRecordReader):
    """Files pyarrow reads as a stream of batches (CSV, JSON lines). The position is the
    number of rows of the file already emitted (``records_after_offset``): a restore reads
    and drops that many rows first (pyarrow's readers cannot seek to a row), with the types
    the file's first block gave (kept in ``split.schema``), so the batches after a restore are
    those the failed attempt would have read."""

    #: What the file was read as, for error messages.
    _kind = ""

    def __init__(self, split: FileSourceSplit, fmt: Any) -> None:
        self.split = split
        self._fmt = fmt
        known = _schema_of(split.schema) if split.schema is not None else None
        self._reader: Any = None
        if os.path.getsize(split.path):  # an empty file has no rows (and pyarrow no schema for it)
            try:
                self._reader = self._open(split.path, known)
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
                raise self._malformed(e) from None
            if split.schema is None:
                split.schema = _schema_bytes(self._reader.schema)
        self._batch: Any = None
        self._batch_pos = 0
        skip = split.records_after_offset
        while skip and self._next():
            assert self._batch is not None
            taken = min(skip, self._batch.num_rows)
            self._batch_pos, skip = taken, skip - taken

    @abstractmethod
    def _open(self, path: str, schema: Any) -> Any:
        """A pyarrow streaming reader of ``path`` (with the types of ``schema`` if given)."""

    def _malformed(self, error: Exception) -> MalformedRecordError:
        return MalformedRecordError(
            f"{self.split.path}: cannot be read as {self._kind} after row "
            f"{self.split.records_after_offset} ({error})"
        )

    def _next(self) -> bool:
        """Move to the next non-empty block; ``False`` at the end of the file."""
        while True:
            if self._reader is None:
                return False
            try:
                self._batch = self._reader.read_next_batch()
            except StopIteration:
                self._reader = None
                self._batch = None
                return False
            except Exception as e:  # noqa: BLE001 - ArrowInvalid and friends: a bad row
                raise self._malformed(e) from None
            self._batch_pos = 0
            if self._batch.num_rows:
                return True

    def read_batch(self, max_records: int) -> Any:
        if self._batch is None or self._batch_pos >= self._batch.num_rows:
            if not self._next():
                return None
        n = min(max_records, self._batch.num_rows - self._batch_pos)
        out = self._batch.slice(self._batch_pos, n)
        self._batch_pos += n
        self.split.records_after_offset += n
        return out

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._batch = None


class _CsvBatchReader(_ArrowStreamReader):
    _kind = "CSV"

    def _open(self, path: str, schema: Any) -> Any:
        import pyarrow.csv as pcsv

        fmt, csv_fmt = self._fmt, self._fmt.csv
        names = list(csv_fmt.column_names) if csv_fmt.column_names is not None else None
        read = pcsv.ReadOptions(
            block_size=fmt.block_size,
            encoding=csv_fmt.encoding,
            column_names=names,
            skip_rows=1 if names is not None and csv_fmt.has_header else 0,
            autogenerate_column_names=names is None and not csv_fmt.has_header,
        )
        parse = pcsv.ParseOptions(
            delimiter=csv_fmt.delimiter,
            quote_char=csv_fmt.quote_char if csv_fmt.quote_char is not None else False,
            escape_char=csv_fmt.escape_char if csv_fmt.escape_char is not None else False,
            double_quote=csv_fmt.double_quote,
            newlines_in_values=True,
        )
        types = schema if schema is not None else fmt.schema
        convert = pcsv.ConvertOptions(column_types=types) if types is not None else None
        return pcsv.open_csv(path, read_options=read, parse_options=parse, convert_options=convert)


class _JsonBatchReader(_ArrowStreamReader):
    _kind = "JSON lines"

    def _open(self, path: str, schema: Any) -> Any:
        import pyarrow.json as pjson

        explicit = self._fmt.schema if self._fmt.schema is not None else schema
        parse = (
            pjson.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="ignore")
            if explicit is not None
            else None
        )
        return pjson.open_json(
            path, read_options=pjson.ReadOptions(block_size=self._fmt.block_size), parse_options=parse
        )


class _TypedBatchFormat(BatchFormat):
    """A batch format whose types come from ``schema`` or are inferred by pyarrow, which
    parses ``block_size`` bytes at a time."""

    def __init__(self, schema: SchemaLike | None, block_size: int) -> None:
        who = type(self).__name__
        schema = check_optional_schema(schema, f"{who}(schema)")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1024:
            raise ValueError(f"{who}: block_size must be an int >= 1024 (bytes), got {block_size!r}")
        self.schema = schema
        self.block_size = block_size

    def create_reader(self, split: FileSourceSplit) -> FileRecordReader:
        return (
            _CsvBatchReader(split, self)
            if isinstance(self, CsvBatchFormat)
            else _JsonBatchReader(split, self)
        )


class CsvBatchFormat(_TypedBatchFormat):
    """CSV files as record batches, parsed and typed by ``pyarrow.csv`` (columns get numeric,
    boolean, timestamp or string types, inferred from the file's first block unless
    ``schema`` gives them).

    ``has_header`` (default ``True``): the first line names the columns.
    ``column_names``: the names to use (with ``has_header`` the file's own header line is
    skipped); without either, columns are named ``f0, f1, ...``. Quoted values may span
    lines. ``block_size`` is the bytes pyarrow parses at a time. A row pyarrow cannot parse
    (a wrong number of fields, a value not of its column's type) fails the job naming the file.
    """

    _reader_class = _CsvBatchReader

    def __init__(
        self,
        *,
        schema: SchemaLike | None = None,
        has_header: bool = True,
        column_names: Sequence[str] | None = None,
        delimiter: str = ",",
        quote_char: str | None = '"',
        escape_char: str | None = None,
        double_quote: bool = True,
        encoding: str = "utf-8",
        block_size: int = 1 << 20,
    ) -> None:
        # The record format's checks of the shared arguments.
        checked = CsvFormat(
            has_header=has_header,
            column_names=column_names,
            delimiter=delimiter,
            quote_char=quote_char,
            escape_char=escape_char,
            double_quote=double_quote,
            encoding=encoding,
        )
        super().__init__(schema, block_size)
        self.csv = checked

    def __repr__(self) -> str:
        return f"CsvBatchFormat(schema={self.schema}, {self.csv!r})"


class JsonBatchFormat(_TypedBatchFormat):
    """Newline-delimited JSON as record batches, parsed by ``pyarrow.json``: one object per
    line, its fields the columns (nested objects become struct columns). Types are inferred
    from the file's first block unless ``schema`` gives them (then other fields are
    ignored). Blank lines are skipped. ``block_size`` is the bytes pyarrow parses at a time."""

    _reader_class = _JsonBatchReader

    def __init__(self, *, schema: SchemaLike | None = None, block_size: int = 1 << 20) -> None:
        super().__init__(schema, block_size)

    def __repr__(self) -> str:
        return f"JsonBatchFormat(schema={self.schema})"
