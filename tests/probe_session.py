"""Run by tests/test_probes.py in a pytest session of its own: a session that makes probes."""

from __future__ import annotations

from pathlib import Path

from tests.probes import Probe


def test_a_session_that_makes_probes() -> None:
    for _ in range(3):
        probe = Probe()
        probe.add("made")
        assert Path(probe.directory).is_dir()
