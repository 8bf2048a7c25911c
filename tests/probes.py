"""Test probes: shared counters and logs that tasks write and tests read.

Every subtask gets its own copy of each user function, and on the Spark
executor it runs in another process, so a list captured by a test would be
copied. A :class:`Probe` keeps its data in files under a directory, locked with
``flock``: every task on this machine, in any process, writes into the one the
test holds.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_LENGTH = struct.Struct(">I")
#: The directory under which probes without a directory of their own are made: the test
#: session's (tests/conftest.py sets it, and removes it at the end), so that no run leaves
#: ``chandy-probe-*`` directories behind. Unset (a script), the system's temporary directory.
PROBE_ROOT_ENV_VAR = "CHANDY_TEST_PROBE_ROOT"


class Probe:
    """A bag of values and named counters shared by a test and its tasks."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory or tempfile.mkdtemp(
            prefix="chandy-probe-", dir=os.environ.get(PROBE_ROOT_ENV_VAR)
        )
        Path(self.directory).mkdir(parents=True, exist_ok=True)

    @property
    def _lock_path(self) -> str:
        return os.path.join(self.directory, "lock")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def append(self, value: Any) -> None:
        blob = pickle.dumps(value)
        with self._locked(), open(os.path.join(self.directory, "items"), "ab") as f:
            f.write(_LENGTH.pack(len(blob)) + blob)

    @property
    def items(self) -> list[Any]:
        path = os.path.join(self.directory, "items")
        if not os.path.exists(path):
            return []
        with self._locked():
            data = Path(path).read_bytes()
        out, offset = [], 0
        while offset < len(data):
            (length,) = _LENGTH.unpack_from(data, offset)
            out.append(pickle.loads(data[offset + 4 : offset + 4 + length]))
            offset += 4 + length
        return out

    def _counters(self) -> dict[str, int]:
        path = os.path.join(self.directory, "counters.json")
        return json.loads(Path(path).read_text()) if os.path.exists(path) else {}

    def _update(self, name: str, update: Any) -> int:
        with self._locked():
            counters = self._counters()
            counters[name] = value = update(counters.get(name))
            Path(self.directory, "counters.json").write_text(json.dumps(counters))
            return value

    def add(self, name: str, amount: int = 1) -> int:
        return self._update(name, lambda old: (old or 0) + amount)

    def maximum(self, name: str, value: int) -> None:
        self._update(name, lambda old: value if old is None else max(old, value))

    def get(self, name: str) -> int:
        with self._locked():
            return self._counters().get(name, 0)

    @property
    def counters(self) -> dict[str, int]:
        with self._locked():
            return self._counters()
