"""A discarding sink that records when its first and last records arrived.

Each subtask writes ``timing-<subtask>.json`` into a directory at the end of
its input, so the measurement works wherever the sink runs (this process or a
Spark executor on the same machine). Throughput is then measured from the first
record to the last, which leaves job start-up out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from chandy.api.connector import Sink, SinkWriter, SinkWriterContext


class _TimingWriter(SinkWriter):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.first = 0.0
        self.last = 0.0
        self.count = 0

    def write(self, element: Any) -> None:
        self.write_batch([element])

    def write_batch(self, elements: list[Any]) -> None:
        now = time.time()
        if not self.count:
            self.first = now
        self.last = now
        self.count += len(elements)

    def flush(self, end_of_input: bool) -> None:
        if end_of_input:
            self.path.write_text(json.dumps({"first": self.first, "last": self.last,
                                             "count": self.count}))


class TimingSink(Sink):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def create_writer(self, context: SinkWriterContext) -> SinkWriter:
        return _TimingWriter(Path(self.directory) / f"timing-{context.subtask_index}.json")


def read_timings(directory: str) -> dict[str, float]:
    """First arrival, last arrival and record count over every subtask."""
    parts = [json.loads(p.read_text()) for p in Path(directory).glob("timing-*.json")]
    active = [p for p in parts if p["count"]]
    return {"first": min(p["first"] for p in active), "last": max(p["last"] for p in active),
            "count": sum(p["count"] for p in parts)}
