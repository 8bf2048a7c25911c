"""``FileSource``: files of a path or directory, read once, bounded or monitored continuously.

Modeled on Flink's (and PyFlink's) ``FileSource``::

    FileSource.for_record_stream_format(StreamFormat.text_line_format(), "/data/in").build()
    FileSource.for_record_stream_format(CsvFormat(), "/data/in").monitor_continuously(1.0).build()
    FileSource.for_bulk_file_format(ParquetFormat(columns=["id"]), "/data/in").build()
    FileSource.for_batch_format(ParquetBatchFormat(), "/data/in").build()  # Arrow batches

A batch format (:class:`ParquetBatchFormat`, :class:`CsvBatchFormat`,
:class:`JsonBatchFormat`) makes a batch source (``Source.columnar``): each poll hands out
one ``pyarrow.RecordBatch``, and ``env.from_source`` gives a ``BatchStream``. Splits,
positions, bounded and continuous modes are the same as with record formats.

Every file is one split, carrying its read position (see
:class:`~chandy.connectors.file_formats.FileSourceSplit`), so a checkpoint stores
how far each file was read and a restore continues at that record.

**Bounded** (the default): the files found when the pipeline is built are dealt
out to the subtasks (sorted by path, so every subtask computes the same
assignment); the source ends when all are read.

**Continuous** (``monitor_continuously``): there is no central enumerator (the
JobMaster runs no source code), so every subtask lists the paths itself, no
more often than the discovery interval, and takes the new files it *owns*:
``stable_hash(path) % parallelism == subtask``. Each subtask remembers the files
it has taken and keeps them in union state: after a restore, at any
parallelism, every subtask knows every file already taken and never takes one
twice, while a file that was half read travels as a split with its position.
Files must appear complete: write them under a hidden name (``.name`` or
``_name``, which the listing skips) and rename them into place.

Only the local filesystem (plain paths and ``file://`` URIs) is supported; on a
Spark cluster every executor must see the same path (a shared mount).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from chandy.connectors.file_formats import (
    BatchFormat,
    BulkFormat,
    CsvBatchFormat,
    CsvFormat,
    FileRecordReader,
    FileSourceSplit,
    JsonBatchFormat,
    JsonLinesFormat,
    MalformedRecordError,
    ParquetBatchFormat,
    ParquetFormat,
    StreamFormat,
    TextLineFormat,
)
from chandy.core.connector import Boundedness, Source, SourceReader, SourceReaderContext
from chandy.state.key_groups import stable_hash

log = logging.getLogger(__name__)

__all__ = [
    "BatchFormat",
    "BulkFormat",
    "CsvBatchFormat",
    "CsvFormat",
    "FileSource",
    "FileSourceBuilder",
    "FileSourceSplit",
    "JsonBatchFormat",
    "JsonLinesFormat",
    "MalformedRecordError",
    "ParquetBatchFormat",
    "ParquetFormat",
    "StreamFormat",
    "TextLineFormat",
]

#: The longest an idle continuous reader lets its task sleep between polls.
_MAX_IDLE_WAIT_S = 0.05
#: Discovery interval when ``monitor_continuously()`` is called without one (Flink has none;
#: one second is what its examples use).
DEFAULT_DISCOVERY_INTERVAL_S = 1.0


def _normalize_path(path: object) -> str:
    """An absolute local path for ``path`` (str, ``os.PathLike`` or ``file://`` URI).

    Absolute, because the string is what continuous mode hashes and remembers,
    and Spark workers may run in another working directory than the driver."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise TypeError(f"FileSource: a path must be a non-empty str or os.PathLike, got {path!r}")
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif "://" in path:
        raise ValueError(f"FileSource: {path!r}: only local paths and file:// URIs are supported")
    return os.path.abspath(path)


def is_hidden(name: str) -> bool:
    """Files Spark, Hadoop and Flink skip: ``.crc``/temporary files, ``_SUCCESS``, ``_temporary``."""
    return name.startswith((".", "_"))


def list_files(paths: Iterable[str]) -> list[str]:
    """The files to read under ``paths``, sorted: a path that is a file is itself; a
    directory contributes its non-hidden regular files (not recursive)."""
    found: set[str] = set()
    for path in paths:
        if os.path.isdir(path):
            with os.scandir(path) as entries:
                for entry in entries:
                    if not is_hidden(entry.name) and entry.is_file():
                        found.add(entry.path)
        elif os.path.isfile(path):
            found.add(path)
    return sorted(found)


def _interval_seconds(interval: Any) -> float:
    if isinstance(interval, timedelta):
        seconds = interval.total_seconds()
    elif hasattr(interval, "to_milliseconds"):  # PyFlink's Duration
        seconds = interval.to_milliseconds() / 1000.0
    elif isinstance(interval, (int, float)) and not isinstance(interval, bool):
        seconds = float(interval)
    else:
        raise TypeError(
            "monitor_continuously: the discovery interval is a number of seconds or a "
            f"datetime.timedelta, got {type(interval).__name__}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"monitor_continuously: the discovery interval must be > 0 seconds, got {seconds}")
    return seconds


class FileSourceBuilder:
    """Configures a :class:`FileSource`; made by ``FileSource.for_*_format``."""

    def __init__(self, fmt: StreamFormat | BulkFormat | BatchFormat, paths: Sequence[Any]) -> None:
        if not paths:
            raise ValueError("FileSource: give at least one path (a file or a directory)")
        self._format = fmt
        self._paths = [_normalize_path(p) for p in paths]
        self._discovery_interval_s: float | None = None

    def monitor_continuously(
        self, discovery_interval: float | timedelta = DEFAULT_DISCOVERY_INTERVAL_S
    ) -> FileSourceBuilder:
        """Keep watching the paths for new files (an unbounded source). The interval
        (seconds, or a ``timedelta``) is the least time between two listings of a subtask."""
        self._discovery_interval_s = _interval_seconds(discovery_interval)
        return self

    def process_static_file_set(self) -> FileSourceBuilder:
        """Read the files present at start, then end (the default)."""
        self._discovery_interval_s = None
        return self

    def build(self) -> FileSource:
        """The configured :class:`FileSource`, to pass to ``env.from_source``."""
        return FileSource(self._format, self._paths, self._discovery_interval_s)


class FileSource(Source):
    """Reads the files of one or more paths with a record format; see the module docs.

    Build it with :meth:`for_record_stream_format` (text lines, CSV, JSON lines),
    :meth:`for_bulk_file_format` (Parquet) or :meth:`for_batch_format` (Parquet, CSV, JSON
    lines as Arrow record batches).
    """

    def __init__(
        self,
        fmt: StreamFormat | BulkFormat | BatchFormat,
        paths: Sequence[str],
        discovery_interval_s: float | None = None,
    ) -> None:
        if not isinstance(fmt, (StreamFormat, BulkFormat, BatchFormat)):
            raise TypeError(
                "FileSource: the format must be a StreamFormat, BulkFormat or BatchFormat, got "
                f"{type(fmt).__name__}"
            )
        self.format = fmt
        #: A batch format's reads are Arrow record batches.
        self.columnar = isinstance(fmt, BatchFormat)
        self.paths = [_normalize_path(p) for p in paths]
        self.discovery_interval_s = discovery_interval_s
        #: Bounded mode: the files to read, fixed by validate() when the job is built.
        self._files: list[str] | None = None

    @staticmethod
    def for_record_stream_format(stream_format: StreamFormat, *paths: Any) -> FileSourceBuilder:
        """Records read one after the other from each file (``StreamFormat.text_line_format()``,
        ``CsvFormat()``, ``JsonLinesFormat()``)."""
        if not isinstance(stream_format, StreamFormat):
            raise TypeError(
                "for_record_stream_format() takes a StreamFormat (text_line_format(), "
                f"CsvFormat(), JsonLinesFormat()), got {type(stream_format).__name__}"
            )
        return FileSourceBuilder(stream_format, paths)

    @staticmethod
    def for_bulk_file_format(bulk_format: BulkFormat, *paths: Any) -> FileSourceBuilder:
        """Records read block by block by a library (``ParquetFormat()``)."""
        if not isinstance(bulk_format, BulkFormat):
            raise TypeError(
                "for_bulk_file_format() takes a BulkFormat (ParquetFormat()), got "
                f"{type(bulk_format).__name__}"
            )
        return FileSourceBuilder(bulk_format, paths)

    @staticmethod
    def for_batch_format(batch_format: BatchFormat, *paths: Any) -> FileSourceBuilder:
        """Arrow record batches read by pyarrow (``ParquetBatchFormat()``, ``CsvBatchFormat()``,
        ``JsonBatchFormat()``): a batch source, ``env.from_source`` gives a ``BatchStream``."""
        if not isinstance(batch_format, BatchFormat):
            raise TypeError(
                "for_batch_format() takes a BatchFormat (ParquetBatchFormat(), CsvBatchFormat(), "
                f"JsonBatchFormat()), got {type(batch_format).__name__}"
            )
        return FileSourceBuilder(batch_format, paths)

    @property
    def continuous(self) -> bool:
        """Whether the source keeps watching for new files (``monitor_continuously``) instead of ending."""
        return self.discovery_interval_s is not None

    def get_boundedness(self) -> Boundedness:
        return Boundedness.CONTINUOUS_UNBOUNDED if self.continuous else Boundedness.BOUNDED

    def validate(self) -> None:
        """Every path must exist and be readable. In bounded mode the files to read are
        fixed here, when the job is built, so every subtask (and every restart before
        the first checkpoint) deals out the same list."""
        self.format.validate()
        for path in self.paths:
            if not os.path.exists(path):
                raise FileNotFoundError(f"FileSource: {path} does not exist")
            is_dir = os.path.isdir(path)
            if not os.access(path, os.R_OK | (os.X_OK if is_dir else 0)):
                raise PermissionError(f"FileSource: {path} is not readable")
            if not is_dir and not os.path.isfile(path):
                raise ValueError(f"FileSource: {path} is neither a regular file nor a directory")
        if not self.continuous:
            self._files = list_files(self.paths)
            if not self._files:
                log.warning(
                    "FileSource: no files to read under %s; the bounded source ends at once.",
                    ", ".join(self.paths),
                )

    def create_splits(self, parallelism: int) -> list[FileSourceSplit]:
        if self.continuous:
            # Readers discover every file (also those present at start) by ownership;
            # dealing some out here as well would read them twice.
            return []
        files = self._files if self._files is not None else list_files(self.paths)
        return [FileSourceSplit(path) for path in files]

    def create_reader(self, context: SourceReaderContext) -> FileSourceReader:
        return FileSourceReader(self, context)

    def __repr__(self) -> str:
        mode = f"continuous every {self.discovery_interval_s}s" if self.continuous else "bounded"
        return f"FileSource({self.format!r}, {self.paths}, {mode})"


class FileSourceReader(SourceReader):
    """Reads its splits one file at a time; in continuous mode also discovers new files."""

    def __init__(self, source: FileSource, context: SourceReaderContext) -> None:
        self._format = source.format
        self._paths = source.paths
        self._interval = source.discovery_interval_s
        self._subtask = context.subtask_index
        self._parallelism = context.parallelism
        self._pending: deque[FileSourceSplit] = deque()
        self._current: FileSourceSplit | None = None
        self._records: FileRecordReader | None = None
        #: Continuous mode: every file known to be taken by some subtask (never take again) ...
        self._seen: set[str] = set()
        #: ... and the part of it this subtask reports in union state: the files it owns
        #: at this parallelism or took itself. Together the subtasks report every seen
        #: file, each about once, so the union state does not grow with the parallelism.
        self._remembered: set[str] = set()
        self._next_discovery = 0.0
        if self._interval is not None:
            self.idle_wait_s = min(_MAX_IDLE_WAIT_S, self._interval)

    def _owns(self, path: str) -> bool:
        return stable_hash(path) % self._parallelism == self._subtask

    def add_splits(self, splits: Sequence[FileSourceSplit]) -> None:
        for split in splits:
            self._pending.append(split.copy())
            self._seen.add(split.path)
            self._remembered.add(split.path)

    def restore_shared_state(self, elements: list[Any]) -> None:
        self._seen.update(elements)
        self._remembered.update(p for p in elements if self._owns(p))

    def _discover(self) -> None:
        new = [p for p in list_files(self._paths) if p not in self._seen and self._owns(p)]
        for path in new:
            self._pending.append(FileSourceSplit(path))
            self._seen.add(path)
            self._remembered.add(path)
        if new:
            log.info(
                "FileSource subtask %d/%d found %d new file(s): %s",
                self._subtask,
                self._parallelism,
                len(new),
                ", ".join(os.path.basename(p) for p in new[:5]) + (", ..." if len(new) > 5 else ""),
            )

    def poll_next(self, max_records: int) -> list[Any] | None:
        if self._interval is not None:
            now = time.monotonic()
            if now >= self._next_discovery:
                self._discover()
                self._next_discovery = time.monotonic() + self._interval
        while True:
            if self._records is None:
                if not self._pending:
                    return [] if self._interval is not None else None
                self._current = self._pending.popleft()
                self._records = self._format.create_reader(self._current)
            batch = self._records.read_batch(max_records)
            if batch is not None:
                return batch
            self._close_current()

    def _close_current(self) -> None:
        if self._records is not None:
            self._records.close()
        self._records = None
        self._current = None

    def snapshot_state(self, checkpoint_id: int) -> list[FileSourceSplit]:
        splits = [self._current.copy()] if self._current is not None else []
        splits.extend(s.copy() for s in self._pending)
        return splits

    def snapshot_shared_state(self, checkpoint_id: int) -> list[str]:
        return sorted(self._remembered)

    def close(self) -> None:
        self._close_current()
