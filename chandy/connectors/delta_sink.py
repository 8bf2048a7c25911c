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
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
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
        uri = self.table_uri
        if uri.startswith("file://"):
            uri = uri[len("file://") :]
        if "://" in uri:
            raise InvalidProgramError(
                f"DeltaSink writes tables on a local or mounted path; '{self.table_uri}' is not one"
            )
        return os.path.abspath(uri)

    def validate(self) -> None:
        """Create the table from ``schema`` when it does not exist; refuse when it cannot."""
        from deltalake import DeltaTable

        path = self.path
        if DeltaTable.is_deltatable(path):
            return
        if self.schema is None:
            raise InvalidProgramError(
                f"DeltaSink: there is no Delta table at '{self.table_uri}' and no schema to "
                "create one; pass schema=pyarrow.schema([...]) or create the table first"
            )
        try:
            os.makedirs(path, exist_ok=True)
            DeltaTable.create(path, schema=self.schema, mode="ignore")
        except Exception as exc:  # noqa: BLE001 - any reason it cannot be created, named
            raise InvalidProgramError(
                f"DeltaSink cannot create a Delta table at '{self.table_uri}': {exc}"
            ) from None

    def create_writer(self, context: SinkWriterContext) -> DeltaSinkWriter:
        return DeltaSinkWriter(self, context)

    def create_committer(self) -> Committer:
        return DeltaCommitter(self.path)


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
        self.schema = DeltaTable(self.path).schema().to_arrow()
        self._writer: Any = None
        self._file: str | None = None
        self._records = 0

    def write(self, element: Any) -> None:
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
            self._writer = pq.ParquetWriter(os.path.join(self.path, self._file), table.schema)
        self._writer.write_table(table)
        self._records += table.num_rows

    def prepare_commit(self, checkpoint_id: int | None) -> list[Any]:
        if self._writer is None:
            return []
        self._writer.close()
        assert self._file is not None
        full = os.path.join(self.path, self._file)
        fd = os.open(full, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        version = checkpoint_id if checkpoint_id is not None else END_OF_INPUT_VERSION
        committable = DeltaCommittable(self.app_id, version, self._file, os.path.getsize(full), self._records)
        self._writer, self._file, self._records = None, None, 0
        return [committable]

    def close(self) -> None:
        if self._writer is not None:  # never pre-committed: drop it
            self._writer.close()
            assert self._file is not None
            try:
                os.remove(os.path.join(self.path, self._file))
            except FileNotFoundError:
                pass
            self._writer = None


class DeltaCommitter(Committer):
    """Adds pre-committed files to the Delta log, once per ``(app_id, version)``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def commit(self, committables: list[Any]) -> None:
        from deltalake import DeltaTable
        from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

        groups: dict[tuple[str, int], list[DeltaCommittable]] = {}
        for c in committables:
            if isinstance(c, DeltaCommittable):
                groups.setdefault((c.app_id, c.version), []).append(c)
        for (app_id, version), files in sorted(groups.items(), key=lambda kv: kv[0][1]):
            table = DeltaTable(self.path)
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
