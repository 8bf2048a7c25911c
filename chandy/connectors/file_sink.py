"""FileSink: exactly-once files, row formats (JSON lines, CSV, strings) and Parquet.

Part files go through Flink's three stages, and only the last is visible:

``.part-3-<uuid>.inprogress``  being written by subtask 3
``.part-3-<uuid>.pending``     closed at a checkpoint, waiting for it to complete
``part-3-<uuid>``              committed: renamed when the checkpoint completed

Readers (Spark, pandas, Flink) skip names that start with a dot, so a reader of
the directory sees committed parts only. A part is closed at every checkpoint
(and earlier when it reaches the rolling size or age), so each checkpoint's
output is a set of whole files. After a restore, pending parts of the restored
checkpoint are committed, and the in-progress and pending leftovers of the
failed attempt (whose records will be written again) are deleted.

Paths are local directories (or ``file://``), shared by every executor on a cluster, or
S3 (``s3://bucket/prefix``, reached with the job's ``s3.*`` settings). S3 has no rename,
so there the stages are Flink's S3 ``RecoverableWriter``'s
(:mod:`chandy.storage.multipart`): an in-progress part is a file in the task's local
temporary directory; closed, it is uploaded as a multipart upload under its final key and
left incomplete (nothing is visible under that key); the committer completes the upload
when the checkpoint completes. The upload's id and ETags are the committable, in the
checkpoint: a restore completes them again, and aborts the uploads of the failed attempt.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chandy.connectors.arrow_schema import SchemaLike, check_optional_schema
from chandy.core.connector import (
    Committer,
    PrecommittingSinkWriter,
    SinkWriterContext,
    TwoPhaseCommittingSink,
)
from chandy.errors import InvalidProgramError, StorageError
from chandy.storage.filesystem import DEFAULT_OBJECT_STORE, ObjectStoreOptions
from chandy.storage.multipart import MultipartUpload, S3Uploads, is_s3, split_s3_uri

log = logging.getLogger(__name__)

_PART = re.compile(
    r"^\.(?P<prefix>.+)-(?P<subtask>\d+)-(?P<uid>[0-9a-f]{32})(?P<suffix>.*)"
    r"\.(?P<stage>inprogress|pending)$"
)


_FINAL = r"^(?P<prefix>.+)-(?P<subtask>\d+)-(?P<uid>[0-9a-f]{32})"

#: How many parts of an earlier run the warning about them names.
_PARTS_NAMED = 3


def _target(path: str) -> str:
    """Where the sink writes: an absolute local directory, or an ``s3://bucket/prefix`` URI."""
    if is_s3(path):
        try:
            split_s3_uri(path)
        except StorageError as exc:
            raise InvalidProgramError(f"FileSink: {exc}") from None
        return path.rstrip("/")
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif "://" in path:
        raise InvalidProgramError(
            f"FileSink writes local (or shared, mounted) directories and S3 (s3://bucket/path); "
            f"'{path}' is neither. Use a path, a file:// URI or an s3:// URI."
        )
    return os.path.abspath(os.path.expanduser(path))


# ---------------------------------------------------------------------- argument checks
#
# A bad argument must fail where the job is written, not later inside a running task:
# ``for_row_format(path, "json")`` once built fine and then failed every task with
# ``TypeError: encode() argument 'encoding' must be str, not int``.

_ROW_ENCODERS = (
    "JsonLinesEncoder(), CsvEncoder(fields=[...]), Encoder.simple_string_encoder() or an Encoder subclass"
)
_BULK_FACTORIES = "ParquetBulkWriters.for_records(schema) or a BulkWriterFactory subclass"


def _instance_of(value: Any, expected: type, who: str, argument: str, allowed: str) -> None:
    """``value`` must be an instance of ``expected``; the error names the argument, the bad
    value and what is allowed (and the usual slip: a class where an instance belongs)."""
    if isinstance(value, expected):
        return
    if isinstance(value, type) and issubclass(value, expected):
        raise TypeError(
            f"{who}: {argument} must be an instance, got the class {value.__name__}: use {value.__name__}()"
        )
    article = "an" if expected.__name__[0] in "AEIOU" else "a"
    raise TypeError(
        f"{who}: {argument} must be {article} {expected.__name__}, got {value!r} ({type(value).__name__}); "
        f"use {allowed}"
    )


def _whole_number_or_none(value: Any, who: str, argument: str, unit: str, minimum: int) -> None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
        return
    raise ValueError(
        f"{who}: {argument} must be a whole number of {unit} >= {minimum} (or None for no limit), "
        f"got {value!r}"
    )


def _check_rolling(who: str, part_size: Any, rollover: tuple[str, Any], inactivity: tuple[str, Any]) -> None:
    """Sizes are >= 1 byte; an interval of 0 ms is allowed (every write rolls its part)."""
    _whole_number_or_none(part_size, who, "part_size", "bytes", 1)
    _whole_number_or_none(rollover[1], who, rollover[0], "milliseconds", 0)
    _whole_number_or_none(inactivity[1], who, inactivity[0], "milliseconds", 0)


def _base_path(base_path: Any, who: str) -> str:
    if isinstance(base_path, os.PathLike):
        base_path = os.fspath(base_path)
    if not isinstance(base_path, str) or not base_path:
        raise TypeError(
            f"{who}: base_path must be a directory path (a non-empty str or os.PathLike), got {base_path!r}"
        )
    _target(base_path)  # a URI of another filesystem is refused now, not when the job runs
    return base_path


def _file_name_part(value: Any, who: str, argument: str, *, may_be_empty: bool) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{who}: {argument} must be a str, got {value!r} ({type(value).__name__})")
    if not value and not may_be_empty:
        raise ValueError(f"{who}: {argument} must not be empty")
    if "/" in value or os.sep in value or "\0" in value:
        raise ValueError(
            f"{who}: {argument} {value!r} must be part of a file name: no '/'; put parts in "
            "subdirectories with with_bucket_assigner(...) instead"
        )


# ---------------------------------------------------------------------- formats


class Encoder(ABC):
    """Turns one record into the bytes of one row (line) of a part file."""

    @abstractmethod
    def encode(self, element: Any) -> bytes:
        """The bytes of one record in a row-format part file (with its line ending)."""

    @staticmethod
    def simple_string_encoder(charset: str = "utf-8") -> Encoder:
        """``str(record)`` and a newline (PyFlink's default row encoder)."""
        return _StringEncoder(charset)


class _StringEncoder(Encoder):
    def __init__(self, charset: str) -> None:
        who = "Encoder.simple_string_encoder"
        if not isinstance(charset, str):
            raise TypeError(f"{who}: charset must be an encoding name (str), e.g. 'utf-8', got {charset!r}")
        try:
            codecs.lookup(charset)
        except LookupError:
            raise ValueError(
                f"{who}: unknown charset {charset!r}; use a Python codec name such as 'utf-8' or 'latin-1'"
            ) from None
        self.charset = charset

    def encode(self, element: Any) -> bytes:
        return f"{element}\n".encode(self.charset)


class JsonLinesEncoder(Encoder):
    """One JSON document per line (readable by ``spark.read.json``)."""

    def encode(self, element: Any) -> bytes:
        """One JSON line (values JSON cannot hold are written as ``str``)."""
        return (json.dumps(element, separators=(",", ":"), default=str) + "\n").encode()


class CsvEncoder(Encoder):
    """A CSV row per record: a sequence, or a dict written in ``fields`` order."""

    def __init__(self, fields: Sequence[str] | None = None, delimiter: str = ",") -> None:
        if fields is not None and (
            isinstance(fields, (str, bytes))
            or not isinstance(fields, Sequence)
            or not all(isinstance(f, str) for f in fields)
        ):
            raise TypeError(
                "CsvEncoder: fields must be a list of column names (str), e.g. ['id', 'name'], "
                f"got {fields!r}"
            )
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(
                f"CsvEncoder: delimiter must be a single character, e.g. ',' or '\\t', got {delimiter!r}"
            )
        self.fields = list(fields) if fields is not None else None
        self.delimiter = delimiter

    def encode(self, element: Any) -> bytes:
        """One CSV line: a dict's ``fields`` in order, or a tuple's or list's items."""
        row = (
            [element.get(f) for f in self.fields]
            if self.fields is not None and isinstance(element, dict)
            else element
        )
        if isinstance(row, dict):
            raise TypeError("CsvEncoder got a dict record but no fields=[...] to order it by")
        buffer = io.StringIO()
        csv.writer(buffer, delimiter=self.delimiter, lineterminator="\n").writerow(row)
        return buffer.getvalue().encode()


class _PartWriter(ABC):
    """One open part file."""

    size = 0

    @abstractmethod
    def write(self, records: list[Any]) -> None: ...

    @abstractmethod
    def close(self) -> None:
        """Flush and make the bytes durable."""


class _RowPartWriter(_PartWriter):
    def __init__(self, path: str, encoder: Encoder) -> None:
        self._file = open(path, "xb")
        self._encoder = encoder

    def write(self, records: list[Any]) -> None:
        data = b"".join(self._encoder.encode(r) for r in records)
        self._file.write(data)
        self.size += len(data)

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


class BulkWriterFactory(ABC):
    """Makes writers of whole-file (columnar) formats."""

    suffix = ""
    #: Its parts take Arrow record batches: the FileSink is a batch sink (``Sink.columnar``).
    columnar = False

    @abstractmethod
    def create(self, path: str) -> _PartWriter:
        """A writer for one part file at ``path``; the sink calls it when it opens a part."""


class ParquetBulkWriters(BulkWriterFactory):
    """Parquet part files from dict records (``spark.read.parquet`` reads them)."""

    suffix = ".parquet"

    #: What pyarrow's Parquet writer accepts (in any case).
    COMPRESSIONS = ("snappy", "gzip", "brotli", "lz4", "zstd", "none")

    def __init__(
        self, schema: SchemaLike | None = None, compression: str = "snappy", columnar: bool = False
    ) -> None:
        who = "ParquetBulkWriters"
        if not isinstance(compression, str) or compression.lower() not in self.COMPRESSIONS:
            raise ValueError(
                f"{who}: compression must be one of {', '.join(self.COMPRESSIONS)}; got {compression!r}"
            )
        self.schema = check_optional_schema(schema, f"{who}(schema)")
        self.compression = compression
        self.columnar = columnar

    @staticmethod
    def for_records(schema: SchemaLike | None = None, compression: str = "snappy") -> ParquetBulkWriters:
        """Records are dicts; ``schema`` (a ``pyarrow.Schema`` or a dict of column name to
        Arrow type) or the first batch's types."""
        return ParquetBulkWriters(schema, compression)

    @staticmethod
    def for_record_batches(
        schema: SchemaLike | None = None, compression: str = "snappy"
    ) -> ParquetBulkWriters:
        """Arrow record batches (``BatchStream.sink_to``), written as they come, without a
        conversion to rows; cast to ``schema`` when given, else every batch must have the
        first one's schema."""
        return ParquetBulkWriters(schema, compression, columnar=True)

    def create(self, path: str) -> _PartWriter:
        """A Parquet writer with this schema and compression for one part file."""
        return _ParquetPartWriter(path, self.schema, self.compression)


class _ParquetPartWriter(_PartWriter):
    def __init__(self, path: str, schema: Any, compression: str) -> None:
        self._path = path
        self._schema = schema
        self._compression = compression
        self._writer: Any = None

    def write(self, records: list[Any]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if isinstance(records, pa.RecordBatch):
            table = pa.Table.from_batches([records])
            if self._schema is not None and table.schema != self._schema:
                table = table.cast(self._schema)
        else:
            table = pa.Table.from_pylist(records, schema=self._schema)
        if self._writer is None:
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self._path, table.schema, compression=self._compression)
        self._writer.write_table(table)
        self.size += table.nbytes

    def close(self) -> None:
        if self._writer is None:  # opened but nothing written: still a valid (empty) file
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({}), self._path)
            return
        self._writer.close()
        fd = os.open(self._path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------- policies


@dataclass(frozen=True)
class RollingPolicy:
    """When an in-progress part is closed before the next checkpoint closes it anyway."""

    part_size: int | None = 128 * 1024 * 1024
    rollover_interval_ms: int | None = 60_000
    inactivity_interval_ms: int | None = 60_000

    def __post_init__(self) -> None:
        _check_rolling(
            "RollingPolicy",
            self.part_size,
            ("rollover_interval_ms", self.rollover_interval_ms),
            ("inactivity_interval_ms", self.inactivity_interval_ms),
        )

    @staticmethod
    def default_rolling_policy(
        part_size: int = 128 * 1024 * 1024, rollover_interval: int = 60_000, inactivity_interval: int = 60_000
    ) -> RollingPolicy:
        """PyFlink's arguments: ``part_size`` in bytes, the intervals in milliseconds."""
        _check_rolling(
            "RollingPolicy.default_rolling_policy",
            part_size,
            ("rollover_interval", rollover_interval),
            ("inactivity_interval", inactivity_interval),
        )
        return RollingPolicy(part_size, rollover_interval, inactivity_interval)

    @staticmethod
    def on_checkpoint_rolling_policy() -> RollingPolicy:
        """Parts close only at checkpoints (Flink's rule for bulk formats)."""
        return RollingPolicy(None, None, None)

    def should_roll(self, size: int, opened_ms: float, last_write_ms: float, now_ms: float) -> bool:
        """Whether the open part file is closed now: by size, by age, or by time since its last write."""
        return (
            (self.part_size is not None and size >= self.part_size)
            or (self.rollover_interval_ms is not None and now_ms - opened_ms >= self.rollover_interval_ms)
            or (
                self.inactivity_interval_ms is not None
                and now_ms - last_write_ms >= self.inactivity_interval_ms
            )
        )


@dataclass(frozen=True)
class OutputFileConfig:
    """Names of committed parts: ``<part_prefix>-<subtask>-<id><part_suffix>``."""

    part_prefix: str = "part"
    part_suffix: str = ""

    def __post_init__(self) -> None:
        _file_name_part(self.part_prefix, "OutputFileConfig", "part_prefix", may_be_empty=False)
        _file_name_part(self.part_suffix, "OutputFileConfig", "part_suffix", may_be_empty=True)
        if self.part_prefix.startswith((".", "_")):
            raise ValueError(
                f"OutputFileConfig: part_prefix {self.part_prefix!r} starts with {self.part_prefix[0]!r}: "
                "readers (Spark, pandas, Flink) skip such files, so the committed output would look empty"
            )

    @staticmethod
    def builder() -> OutputFileConfigBuilder:
        """PyFlink's ``OutputFileConfig.builder().with_part_prefix(...).with_part_suffix(...).build()``."""
        return OutputFileConfigBuilder()


class OutputFileConfigBuilder:
    """Builds an :class:`OutputFileConfig`; each value is checked when it is set."""

    def __init__(self) -> None:
        self._prefix = "part"
        self._suffix = ""

    def with_part_prefix(self, prefix: str) -> OutputFileConfigBuilder:
        """The prefix of part file names."""
        OutputFileConfig(prefix, self._suffix)
        self._prefix = prefix
        return self

    def with_part_suffix(self, suffix: str) -> OutputFileConfigBuilder:
        """The suffix of part file names (an extension such as ``.jsonl``)."""
        OutputFileConfig(self._prefix, suffix)
        self._suffix = suffix
        return self

    def build(self) -> OutputFileConfig:
        """The configuration, for ``FileSink``'s ``with_output_file_config``."""
        return OutputFileConfig(self._prefix, self._suffix)


@dataclass(frozen=True)
class FileCommittable:
    """A closed part: where it waits, and the name that makes it visible."""

    pending_path: str
    final_path: str


@dataclass(frozen=True)
class S3PartCommittable:
    """A closed part on S3: uploaded under its final key, not completed (so invisible)."""

    final_path: str
    upload_id: str
    #: ``(part number, ETag)`` of the upload's parts.
    parts: tuple[tuple[int, str], ...]

    @property
    def upload(self) -> MultipartUpload:
        """The multipart upload this part file completes on commit."""
        return MultipartUpload(self.final_path, self.upload_id, self.parts)


# ---------------------------------------------------------------------- the sink

_ROLLING_POLICIES = (
    "RollingPolicy.default_rolling_policy(...) or RollingPolicy.on_checkpoint_rolling_policy()"
)
_FILE_CONFIGS = "OutputFileConfig(part_prefix, part_suffix) or OutputFileConfig.builder()...build()"


def _check_encoder(encoder: Any, who: str) -> None:
    if isinstance(encoder, BulkWriterFactory):
        raise TypeError(
            f"{who}: {type(encoder).__name__} writes whole files, not rows: use "
            "FileSink.for_bulk_format(base_path, writer_factory)"
        )
    _instance_of(encoder, Encoder, who, "encoder", _ROW_ENCODERS)


def _check_bulk_writer_factory(factory: Any, who: str) -> None:
    if isinstance(factory, Encoder):
        raise TypeError(
            f"{who}: {type(factory).__name__} encodes rows: use FileSink.for_row_format(base_path, encoder)"
        )
    _instance_of(factory, BulkWriterFactory, who, "writer_factory", _BULK_FACTORIES)


def _check_bucket_assigner(assigner: Any, who: str) -> None:
    if not callable(assigner) or isinstance(assigner, type):
        raise TypeError(
            f"{who}: assigner must be a function of a record that returns its bucket (subdirectory) "
            f"name, e.g. lambda record: record['day'], got {assigner!r} ({type(assigner).__name__})"
        )


class FileSink(TwoPhaseCommittingSink):
    """Exactly-once part files in a directory (Flink's ``FileSink``)."""

    def __init__(
        self,
        base_path: str,
        *,
        encoder: Encoder | None = None,
        bulk_writer_factory: BulkWriterFactory | None = None,
        rolling_policy: RollingPolicy | None = None,
        output_file_config: OutputFileConfig | None = None,
        bucket_assigner: Callable[[Any], str] | None = None,
    ) -> None:
        if (encoder is None) == (bulk_writer_factory is None):
            raise InvalidProgramError("a FileSink needs a row encoder or a bulk writer factory")
        who = "FileSink"
        base_path = _base_path(base_path, who)
        if encoder is not None:
            _check_encoder(encoder, who)
        if bulk_writer_factory is not None:
            _check_bulk_writer_factory(bulk_writer_factory, who)
        if rolling_policy is not None:
            _instance_of(rolling_policy, RollingPolicy, who, "rolling_policy", _ROLLING_POLICIES)
        if output_file_config is not None:
            _instance_of(output_file_config, OutputFileConfig, who, "output_file_config", _FILE_CONFIGS)
        if bucket_assigner is not None:
            _check_bucket_assigner(bucket_assigner, who)
        #: A batch sink when its bulk writers take Arrow record batches.
        self.columnar = bulk_writer_factory is not None and bulk_writer_factory.columnar
        if self.columnar and bucket_assigner is not None:
            raise InvalidProgramError(
                "FileSink: a bucket assigner is a function of a record; a sink of Arrow record "
                "batches (ParquetBulkWriters.for_record_batches) writes into the base path: "
                "leave out with_bucket_assigner, or convert with to_records() and use "
                "ParquetBulkWriters.for_records()"
            )
        self.base_path = base_path
        self.encoder = encoder
        self.bulk_writer_factory = bulk_writer_factory
        self.rolling_policy = rolling_policy or (
            RollingPolicy.on_checkpoint_rolling_policy()
            if bulk_writer_factory
            else RollingPolicy.default_rolling_policy()
        )
        suffix = bulk_writer_factory.suffix if bulk_writer_factory else ""
        self.output_file_config = output_file_config or OutputFileConfig(part_suffix=suffix)
        self.bucket_assigner = bucket_assigner
        #: How an s3:// base path is reached (:meth:`configure`, at submission).
        self.object_store = DEFAULT_OBJECT_STORE

    @staticmethod
    def for_row_format(base_path: str, encoder: Encoder) -> FileSinkBuilder:
        """PyFlink's ``FileSink.for_row_format(base_path, encoder)``: ``encoder`` is an
        :class:`Encoder` object, e.g. ``JsonLinesEncoder()`` (not a format name)."""
        who = "FileSink.for_row_format"
        base_path = _base_path(base_path, who)
        _check_encoder(encoder, who)
        return FileSinkBuilder(base_path, encoder=encoder)

    @staticmethod
    def for_bulk_format(base_path: str, writer_factory: BulkWriterFactory) -> FileSinkBuilder:
        """PyFlink's ``FileSink.for_bulk_format(base_path, writer_factory)``."""
        who = "FileSink.for_bulk_format"
        base_path = _base_path(base_path, who)
        _check_bulk_writer_factory(writer_factory, who)
        return FileSinkBuilder(base_path, bulk_writer_factory=writer_factory)

    @property
    def directory(self) -> str:
        """The local directory, or the ``s3://`` URI, the parts go to."""
        return _target(self.base_path)

    @property
    def on_s3(self) -> bool:
        """Whether the sink writes to ``s3://``, where part files are multipart uploads completed on
        commit."""
        return is_s3(self.base_path)

    def configure(self, job_parameters: Mapping[str, Any]) -> None:
        """Keep the job's S3 settings (``s3.*``, else the submitting process's ``AWS_*``) and,
        on S3, prove the prefix writable now: wrong credentials are one clear error at
        submission, not a task failing at its first part over and over."""
        self.object_store = ObjectStoreOptions.from_configuration(job_parameters)
        if not self.on_s3:
            return
        uploads = S3Uploads(self.object_store)
        probe = f"{self.directory}/.chandy-probe-{uuid.uuid4().hex}"
        try:
            uploads.abort(probe, uploads.start(probe))  # never visible: an upload not completed
        except OSError as exc:
            raise InvalidProgramError(
                f"FileSink cannot write to '{self.base_path}': {exc}. Check s3.endpoint and the "
                "credentials (s3.access-key / s3.secret-key, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)."
            ) from None

    def validate(self) -> None:
        if self.on_s3:
            return  # reached with the job's settings, known at submission: configure() checks it
        directory = self.directory
        try:
            os.makedirs(directory, exist_ok=True)
            probe = os.path.join(directory, f".chandy-probe-{uuid.uuid4().hex}")
            with open(probe, "wb"):
                pass
            os.remove(probe)
        except OSError as exc:
            raise InvalidProgramError(
                f"FileSink cannot write to '{self.base_path}': {exc.strerror or exc}. Give it a "
                "directory this job can create files in (on a cluster: shared by every "
                "executor)."
            ) from None

    def create_writer(self, context: SinkWriterContext) -> FileSinkWriter:
        return FileSinkWriter(self, context)

    def create_committer(self) -> Committer:
        return FileCommitter(self.object_store)


class FileSinkBuilder:
    """``FileSink.for_row_format(path, encoder).with_rolling_policy(...).build()``."""

    def __init__(self, base_path: str, **kwargs: Any) -> None:
        self._base_path = base_path
        self._kwargs = kwargs

    def with_rolling_policy(self, policy: RollingPolicy) -> FileSinkBuilder:
        """When part files are closed (by size, age or inactivity) besides at every checkpoint."""
        _instance_of(
            policy, RollingPolicy, "FileSinkBuilder.with_rolling_policy", "policy", _ROLLING_POLICIES
        )
        self._kwargs["rolling_policy"] = policy
        return self

    def with_output_file_config(self, config: OutputFileConfig) -> FileSinkBuilder:
        """How part files are named (prefix, suffix)."""
        who = "FileSinkBuilder.with_output_file_config"
        _instance_of(config, OutputFileConfig, who, "config", _FILE_CONFIGS)
        self._kwargs["output_file_config"] = config
        return self

    def with_bucket_assigner(self, assigner: Callable[[Any], str]) -> FileSinkBuilder:
        """``assigner(record)`` names the subdirectory (bucket) a record goes to."""
        _check_bucket_assigner(assigner, "FileSinkBuilder.with_bucket_assigner")
        self._kwargs["bucket_assigner"] = assigner
        return self

    def build(self) -> FileSink:
        """The configured :class:`FileSink`, for ``stream.sink_to``."""
        return FileSink(self._base_path, **self._kwargs)


class _OpenPart:
    def __init__(
        self, writer: _PartWriter, in_progress: str, pending: str, final: str, opened_ms: float
    ) -> None:
        self.writer = writer
        self.in_progress = in_progress
        self.pending = pending
        self.final = final
        self.opened_ms = self.last_write_ms = opened_ms


class FileSinkWriter(PrecommittingSinkWriter):
    """The parts of one subtask."""

    def __init__(self, sink: FileSink, context: SinkWriterContext) -> None:
        self.sink = sink
        self.context = context
        self.directory = sink.directory
        self._open: dict[str, _OpenPart] = {}
        self._closed_parts: list[FileCommittable | S3PartCommittable] = []
        #: On S3: the uploads, and a local directory for the parts being written.
        self._uploads = S3Uploads(sink.object_store) if sink.on_s3 else None
        self._spool = tempfile.mkdtemp(prefix="chandy-filesink-") if sink.on_s3 else None
        if context.is_restored or context.attempt_number > 0:
            # A restart without a checkpoint to restore (the first failed before any
            # completed) leaves the failed attempt's parts behind just the same.
            self._clean_up_after_failure()
        elif context.subtask_index == 0 and self._uploads is None:
            self._warn_of_earlier_parts()

    def _warn_of_earlier_parts(self) -> None:
        """A fresh start (not a restore, not a restart) into a directory that already holds
        committed parts of this sink's naming: an earlier run's output, which this run's
        parts join, and a reader of the directory sees both. Said once (subtask 0), naming
        the directory and a few of the parts; nothing is deleted."""
        final = re.compile(_FINAL + re.escape(self.sink.output_file_config.part_suffix) + "$")
        prefix = self.sink.output_file_config.part_prefix
        found: list[str] = []
        for root, _, files in os.walk(self.directory):
            for name in sorted(files):
                match = final.match(name)
                if match is not None and match.group("prefix") == prefix:
                    found.append(os.path.relpath(os.path.join(root, name), self.directory))
                    if len(found) > _PARTS_NAMED:
                        break
            if len(found) > _PARTS_NAMED:
                break
        if not found:
            return
        named = ", ".join(found[:_PARTS_NAMED]) + (", ..." if len(found) > _PARTS_NAMED else "")
        log.warning(
            "FileSink: %s already holds committed parts of an earlier run (%s); this job's parts "
            "are added beside them, and a reader of the directory sees both. Give each run its own "
            "directory, or empty it first, unless adding to it is what you want. (A job restored "
            "from a checkpoint or savepoint is not warned: its own parts are expected there.)",
            self.directory,
            named,
        )

    def _mine(self, name: str, pattern: re.Pattern[str]) -> bool:
        """Whether part file ``name`` is this subtask's (by the sink's prefix and the subtask
        index, modulo the parallelism: after a rescale the parts of a vanished subtask too)."""
        match = pattern.match(name)
        return (
            match is not None
            and match.group("prefix") == self.sink.output_file_config.part_prefix
            and int(match.group("subtask")) % self.context.parallelism == self.context.subtask_index
        )

    def _clean_up_after_failure(self) -> None:
        """Delete the in-progress and pending parts a failed attempt left behind (their
        records are written again after the restore), except those a restored checkpoint
        names: those were just committed or are another subtask's to commit. On S3 the
        leftovers are uploads never completed: they are aborted."""
        restored = self.context.restored_committables
        if self._uploads is not None:
            keep_uploads = {c.upload_id for c in restored if isinstance(c, S3PartCommittable)}
            final = re.compile(_FINAL + re.escape(self.sink.output_file_config.part_suffix) + "$")
            for uri, upload_id in list(self._uploads.in_progress(self.directory)):
                if upload_id not in keep_uploads and self._mine(uri.rsplit("/", 1)[-1], final):
                    log.info("FileSink aborts the upload of %s left by a failed attempt", uri)
                    self._uploads.abort(uri, upload_id)
            return
        keep = {c.pending_path for c in restored if isinstance(c, FileCommittable)}
        for root, _, files in os.walk(self.directory):
            for name in files:
                path = os.path.join(root, name)
                if self._mine(name, _PART) and path not in keep:
                    log.info("FileSink removes the leftover part %s of a failed attempt", path)
                    try:
                        os.remove(path)
                    except FileNotFoundError:
                        pass

    def _part(self, bucket: str, now_ms: float) -> _OpenPart:
        part = self._open.get(bucket)
        if part is None:
            config = self.sink.output_file_config
            name = f"{config.part_prefix}-{self.context.subtask_index}-{uuid.uuid4().hex}{config.part_suffix}"
            if self._spool is not None:  # S3: written here, uploaded when it closes
                final = "/".join(p for p in (self.directory, bucket, name) if p)
                in_progress = os.path.join(self._spool, name)
                pending = final
            else:
                directory = os.path.join(self.directory, bucket) if bucket else self.directory
                os.makedirs(directory, exist_ok=True)
                in_progress = os.path.join(directory, f".{name}.inprogress")
                pending = os.path.join(directory, f".{name}.pending")
                final = os.path.join(directory, name)
            if self.sink.bulk_writer_factory is not None:
                writer: _PartWriter = self.sink.bulk_writer_factory.create(in_progress)
            else:
                assert self.sink.encoder is not None
                writer = _RowPartWriter(in_progress, self.sink.encoder)
            part = self._open[bucket] = _OpenPart(writer, in_progress, pending, final, now_ms)
        return part

    def write(self, element: Any) -> None:
        """Write a record to the bucket's open part file (rolling it when the policy says)."""
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        assigner = self.sink.bucket_assigner
        if assigner is None:
            groups = {"": elements}
        else:
            groups = {}
            for element in elements:
                groups.setdefault(str(assigner(element)), []).append(element)
        now = time.time() * 1000
        for bucket, records in groups.items():
            part = self._part(bucket, now)
            part.writer.write(records)
            part.last_write_ms = now
            if self.sink.rolling_policy.should_roll(
                part.writer.size, part.opened_ms, part.last_write_ms, now
            ):
                self._close(bucket)
        self._roll_idle(now)

    def _roll_idle(self, now: float) -> None:
        policy = self.sink.rolling_policy
        for bucket, part in list(self._open.items()):
            if policy.should_roll(part.writer.size, part.opened_ms, part.last_write_ms, now):
                self._close(bucket)

    def _close(self, bucket: str) -> None:
        part = self._open.pop(bucket)
        part.writer.close()
        if self._uploads is None:
            os.replace(part.in_progress, part.pending)
            self._closed_parts.append(FileCommittable(part.pending, part.final))
            return
        try:
            upload = self._uploads.upload(part.in_progress, part.final)
        finally:
            _remove(part.in_progress)
        self._closed_parts.append(S3PartCommittable(part.final, upload.upload_id, upload.parts))

    def prepare_commit(self, checkpoint_id: int | None) -> list[Any]:
        for bucket in list(self._open):
            self._close(bucket)
        closed, self._closed_parts = self._closed_parts, []
        return list(closed)

    def close(self) -> None:
        """Parts not pre-committed by a checkpoint (still open, or rolled since the last
        one) are lost with a cancelled or failed task: delete them (abort their uploads).
        Pre-committed parts stay: a restore commits them."""
        for part in self._open.values():
            try:
                part.writer.close()
            except Exception as exc:  # noqa: BLE001 - the part is being dropped anyway
                log.debug("FileSink: closing the dropped part %s failed: %r", part.in_progress, exc)
            _remove(part.in_progress)
        self._open.clear()
        for committable in self._closed_parts:
            if isinstance(committable, S3PartCommittable):
                assert self._uploads is not None
                try:
                    self._uploads.abort(committable.final_path, committable.upload_id)
                except OSError as exc:  # a restart's clean-up aborts it then
                    log.warning("FileSink could not abort the upload of %s: %s", committable.final_path, exc)
            else:
                _remove(committable.pending_path)
        self._closed_parts = []
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class FileCommitter(Committer):
    """Renames pending parts to their final names (a part already renamed is skipped); on
    S3, completes their uploads (one completed before is skipped)."""

    def __init__(self, object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE) -> None:
        self.object_store = object_store

    def commit(self, committables: list[Any]) -> None:
        """Publish a checkpoint's part files (rename, or complete their multipart uploads on S3); a part
        already published is left as it is."""
        uploads = [c for c in committables if isinstance(c, S3PartCommittable)]
        if uploads:
            self._complete(uploads)
        directories = set()
        for committable in committables:
            if not isinstance(committable, FileCommittable):
                continue
            if os.path.exists(committable.final_path):
                continue  # committed before (a restore replays commits)
            try:
                os.replace(committable.pending_path, committable.final_path)
            except FileNotFoundError:
                log.warning(
                    "FileSink cannot commit %s: neither it nor its pending part %s exists "
                    "(moved or deleted outside the job?)",
                    committable.final_path,
                    committable.pending_path,
                )
                continue
            directories.add(os.path.dirname(committable.final_path))
        for directory in directories:  # make the renames durable
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _complete(self, committables: list[S3PartCommittable]) -> None:
        s3 = S3Uploads(self.object_store)
        for committable in committables:
            try:
                s3.complete(committable.upload)
            except FileNotFoundError:
                log.warning(
                    "FileSink cannot commit %s: neither it nor its upload %s exists (aborted or "
                    "deleted outside the job?)",
                    committable.final_path,
                    committable.upload_id,
                )
