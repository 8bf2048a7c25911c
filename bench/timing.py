"""A discarding sink that records when its first and last records arrived.

Each subtask writes ``timing-<subtask>.json`` into a directory at the end of
its input, so the measurement works wherever the sink runs (this process or a
Spark executor on the same machine). Throughput is then measured from the first
record to the last, which leaves job start-up out.

Each subtask also notes its process's CPU time at its first and last record. Over a
run, the CPU seconds the task processes spent per record are a steadier measure of
what a feature (checkpointing) costs than throughput is: they do not move when the
machine's other tenants slow every process down alike.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from chandy.core.connector import Sink, SinkWriter, SinkWriterContext


class _TimingWriter(SinkWriter):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.first = 0.0
        self.last = 0.0
        self.cpu_first = 0.0
        self.cpu_last = 0.0
        self.count = 0

    def write(self, element: Any) -> None:
        self.write_batch([element])

    def write_batch(self, elements: Any) -> None:
        """``elements``: a list of records, or (from :class:`BatchTimingSink`) a whole Arrow
        record batch, whose ``len`` is its row count: either way one clock read per batch."""
        now = time.time()
        if not self.count:
            self.first, self.cpu_first = now, time.process_time()
        self.last = now
        self.count += len(elements)

    def flush(self, end_of_input: bool) -> None:
        if end_of_input:  # right after the last record: its CPU time, read once, not per batch
            self.cpu_last = time.process_time()
            self.path.write_text(
                json.dumps(
                    {
                        "first": self.first,
                        "last": self.last,
                        "count": self.count,
                        "pid": os.getpid(),
                        "cpu_first": self.cpu_first,
                        "cpu_last": self.cpu_last,
                    }
                )
            )


class TimingSink(Sink):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        return _TimingWriter(Path(self.directory) / f"timing-{context.subtask_index}.json")


class BatchTimingSink(TimingSink):
    """:class:`TimingSink` on the batch path (``Sink.columnar``): its writer gets each Arrow
    record batch whole and counts its rows, so the sink costs one call per batch, not per row."""

    columnar = True


def read_timings(directory: str) -> dict[str, float]:
    """First arrival, last arrival and record count over every subtask, and ``cpu_s``:
    the CPU seconds of the sinks' processes between their first and last records (once
    per process, where several subtasks share one)."""
    parts = [json.loads(p.read_text()) for p in Path(directory).glob("timing-*.json")]
    active = [p for p in parts if p["count"]]
    by_process: dict[int, list[dict[str, float]]] = {}
    for part in active:
        by_process.setdefault(part["pid"], []).append(part)
    cpu = sum(
        max(p["cpu_last"] for p in same) - min(p["cpu_first"] for p in same) for same in by_process.values()
    )
    return {
        "first": min(p["first"] for p in active),
        "last": max(p["last"] for p in active),
        "count": sum(p["count"] for p in parts),
        "cpu_s": cpu,
    }
