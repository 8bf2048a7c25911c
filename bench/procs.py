"""The machine's processes as Linux's /proc lists them: what the bench's runners and the
standalone cluster need to find the processes a process started, whatever group or
session they moved to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """Every process: its pid and its ``/proc/<pid>/stat`` fields after the command name
    (``state ppid pgrp session ...``), read past the name, which may hold spaces and
    parentheses. Processes that end while being read are skipped."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        yield int(entry.name), stat[stat.rindex(")") + 2 :].split()
