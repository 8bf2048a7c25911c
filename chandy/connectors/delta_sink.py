"""DeltaSink: exactly-once appends to a Delta Lake table (delta-rs).

Each subtask writes Parquet data files into the table directory as records
arrive; at a checkpoint it closes the file and pre-commits it (the file exists,
but no Delta reader sees it: a Delta table is what its log says). When the
checkpoint completes, the file is added to the log in one Delta transaction
that also records ``(app id, version)``: app id
``<prefix>-<job id>-<sink uid>-<subtask>`` (prefix ``chandy`` unless given),
version the checkpoint id (at the end of the input, ``END_OF_INPUT_VERSION``, past them
all: nothing of that job and subtask follows it). delta-rs does not skip a stale retry by itself, so
the committer reads ``transaction_version(app_id)`` first and skips what the
log already has: a commit replayed after a restore never duplicates rows. The
job id is part of the app id because checkpoint ids start again in every new
job: a second run of the same job into the same table must not find its
versions "already committed". A committable carries its app id, so a new job
restored from a retained checkpoint still commits the old job's pending files
under the old job's id, exactly once.

Files that were written but never committed (an aborted checkpoint, a failed
attempt) are left to Delta's ``vacuum``.

A table in S3 (``s3://bucket/table``) is reached with the job's ``s3.*`` settings: a data
file is written in the task's local temporary directory and uploaded when it is
pre-committed (invisible to readers until the log names it, as on a disk), and delta-rs
commits to the log with conditional PUTs, so concurrent committers never overwrite a log entry.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chandy.connectors.arrow_schema import SchemaLike, check_optional_schema
from chandy.core.connector import (
    Committer,
    PrecommittingSinkWriter,
    SinkWriterContext,
    TwoPhaseCommittingSink,
)
from chandy.errors import InvalidProgramError
from chandy.storage.filesystem import DEFAULT_OBJECT_STORE, FsspecFileSystem, ObjectStoreOptions
from chandy.storage.multipart import is_s3

log = logging.getLogger(__name__)


#: The version of the commit a subtask makes at the end of its input (Kafka's end-of-input
#: marker): past every checkpoint id of the job, so that neither it nor a replay after a
#: later failure is taken for a commit already done, or done again. One past the writer's
#: last checkpoint was both: 0 in an attempt restored after a commit (skipped: rows lost),
#: and below the replayed checkpoints of a restore after it (committed twice).
END_OF_INPUT_VERSION = 2**62


@dataclass(frozen=True)
class DeltaCommittable:
    """One data file to add to the log under ``(app_id, version)``."""

    app_id: str
    version: int
    path: str  # relative to the table root
    size: int
    num_records: int


class DeltaSink(TwoPhaseCommittingSink):
    """Appends records (dicts) to the Delta table at ``table_uri``.

    ``schema`` (a ``pyarrow.Schema`` or a dict of column name to Arrow type) creates the
    table when it does not exist yet (without one, a missing table is an error);
    an existing table's schema is used as it is. ``app_id`` is the prefix of the
    Delta application ids the sink commits under (see the module docs).
    """

    def __init__(
        self,
        table_uri: str,
        schema: SchemaLike | None = None,
        app_id: str | None = None,
        *,
        columnar: bool = False,
    ) -> None:
        self.table_uri = table_uri
        self.schema = check_optional_schema(schema, "DeltaSink(schema)")
        self.app_id = app_id
        #: Takes Arrow record batches (``BatchStream.sink_to``) instead of dict records.
        self.columnar = columnar
        #: How an s3:// table is reached (:meth:`configure`, at submission).
        self.object_store = DEFAULT_OBJECT_STORE
        self.path  # noqa: B018 - refuses a URI of another filesystem now

    @staticmethod
    def for_record_batches(
        table_uri: str, schema: SchemaLike | None = None, app_id: str | None = None
    ) -> DeltaSink:
        """A sink of Arrow record batches: each batch is written as it comes (its columns
        picked by the table's column names and cast to the table's types), exactly once
        like the record sink."""
        return DeltaSink(table_uri, schema, app_id, columnar=True)

    @property
    def path(self) -> str:
        """The table's local directory, or its ``s3://`` URI."""
        uri = self.table_uri
        if is_s3(uri):
            return uri.rstrip("/")
        if uri.startswith("file://"):
            uri = uri[len("file://") :]
        if "://" in uri:
            raise InvalidProgramError(
                f"DeltaSink writes tables on a local or mounted path or in S3 (s3://bucket/table); "
                f"'{self.table_uri}' is neither"
            )
        return os.path.abspath(uri)

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs's options for the table (none for a local one)."""
        return self.object_store.rust_object_store_options() if is_s3(self.path) else {}

    def configure(self, job_parameters: Mapping[str, Any]) -> None:
        """Keep the job's S3 settings; a table in S3 is checked (or created) now, with them."""
        self.object_store = ObjectStoreOptions.from_configuration(job_parameters)
        if is_s3(self.path):
            self._ensure_table()

    def validate(self) -> None:
        """Create the table from ``schema`` when it does not exist; refuse when it cannot.
        A table in S3 waits for :meth:`configure`: its settings are known at submission."""
        if not is_s3(self.path):
            self._ensure_table()

    def _ensure_table(self) -> None:
        from deltalake import DeltaTable

        path = self.path
        options = self.storage_options
        try:
            if DeltaTable.is_deltatable(path, storage_options=options):
                return
        except Exception as exc:  # noqa: BLE001 - unreachable or refused: named, at submission
            raise InvalidProgramError(
                f"DeltaSink cannot reach the Delta table at '{self.table_uri}': {exc}"
            ) from None
        if self.schema is None:
            raise InvalidProgramError(
                f"DeltaSink: there is no Delta table at '{self.table_uri}' and no schema to "
                "create one; pass schema=pyarrow.schema([...]) or create the table first"
            )
        try:
            if not options:
                os.makedirs(path, exist_ok=True)
            DeltaTable.create(path, schema=self.schema, mode="ignore", storage_options=options)
        except Exception as exc:  # noqa: BLE001 - any reason it cannot be created, named
            raise InvalidProgramError(
                f"DeltaSink cannot create a Delta table at '{self.table_uri}': {exc}"
            ) from None

    def create_writer(self, context: SinkWriterContext) -> DeltaSinkWriter:
        return DeltaSinkWriter(self, context)

    def create_committer(self) -> Committer:
        return DeltaCommitter(self.path, self.storage_options)


class DeltaSinkWriter(PrecommittingSinkWriter):
    """Writes the data files of one subtask."""

    def __init__(self, sink: DeltaSink, context: SinkWriterContext) -> None:
        from deltalake import DeltaTable

        self.sink = sink
        self.path = sink.path
        self.app_id = (
            f"{sink.app_id or 'chandy'}-{context.job_id}-"
            f"{context.operator_id or 'sink'}-{context.subtask_index}"
        )
        self.schema = DeltaTable(self.path, storage_options=sink.storage_options).schema().to_arrow()
        #: In S3: data files are written here, uploaded when pre-committed.
        self._fs = FsspecFileSystem("s3", sink.object_store) if is_s3(self.path) else None
        self._spool = tempfile.mkdtemp(prefix="chandy-delta-") if self._fs is not None else None
        self._writer: Any = None
        self._file: str | None = None
        self._records = 0

    def write(self, element: Any) -> None:
        """Buffer a record for the next Parquet file."""
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema(self.schema)
        if isinstance(elements, pa.RecordBatch):
            missing = [name for name in schema.names if name not in elements.schema.names]
            if missing:
                raise ValueError(
                    f"DeltaSink: the batch has no column {', '.join(map(repr, missing))} of the Delta "
                    f"table at '{self.sink.table_uri}' (the batch has {elements.schema.names}); "
                    "add them (map_batches) or write to a table with the batch's columns"
                )
            table = pa.Table.from_batches([elements]).select(schema.names).cast(schema)
        else:
            table = pa.Table.from_pylist(elements, schema=schema)
        if self._writer is None:
            self._file = f"part-{uuid.uuid4().hex}.parquet"
            self._writer = pq.ParquetWriter(self._local(self._file), table.schema)
        self._writer.write_table(table)
        self._records += table.num_rows

    def prepare_commit(self, checkpoint_id: int | None) -> list[Any]:
        if self._writer is None:
            return []
        self._writer.close()
        assert self._file is not None
        full = self._local(self._file)
        size = os.path.getsize(full)
        if self._fs is not None:  # S3: one upload, whole; no reader sees it before the log names it
            fs, target = self._fs, f"{self.path}/{self._file}"
            try:
                fs.call("uploading", target, lambda: fs.raw.put_file(full, target))
            finally:
                os.remove(full)
        else:
            fd = os.open(full, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        version = checkpoint_id if checkpoint_id is not None else END_OF_INPUT_VERSION
        committable = DeltaCommittable(self.app_id, version, self._file, size, self._records)
        self._writer, self._file, self._records = None, None, 0
        return [committable]

    def _local(self, name: str) -> str:
        """Where data file ``name`` is written: the table's directory, or the local spool."""
        return os.path.join(self._spool or self.path, name)

    def close(self) -> None:
        """Delete the file that was never pre-committed (a restore writes its records again)."""
        if self._writer is not None:  # never pre-committed: drop it
            self._writer.close()
            assert self._file is not None
            try:
                os.remove(self._local(self._file))
            except FileNotFoundError:
                pass
            self._writer = None
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)


class DeltaCommitter(Committer):
    """Adds pre-committed files to the Delta log, once per ``(app_id, version)``."""

    def __init__(self, path: str, storage_options: dict[str, str] | None = None) -> None:
        self.path = path
        self.storage_options = storage_options or {}

    def commit(self, committables: list[Any]) -> None:
        """Add a checkpoint's files to the Delta table in one transaction, once; a transaction already in the
        log is not written again."""
        from deltalake import DeltaTable
        from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

        groups: dict[tuple[str, int], list[DeltaCommittable]] = {}
        for c in committables:
            if isinstance(c, DeltaCommittable):
                groups.setdefault((c.app_id, c.version), []).append(c)
        for (app_id, version), files in sorted(groups.items(), key=lambda kv: kv[0][1]):
            table = DeltaTable(self.path, storage_options=self.storage_options)
            done = table.transaction_version(app_id)
            if done is not None and done >= version:
                log.debug("Delta table %s already has %s version %d", self.path, app_id, version)
                continue
            now = int(time.time() * 1000)
            actions: list[AddAction | RemoveAction] = [
                AddAction(f.path, f.size, {}, now, True, json.dumps({"numRecords": f.num_records}))
                for f in files
            ]
            table.create_write_transaction(
                actions,
                mode="append",
                schema=table.schema(),
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app_id, version)], max_commit_retries=20
                ),
            )
