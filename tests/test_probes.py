"""The test probes' directories do not outlive the test session that made them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.probes import PROBE_ROOT_ENV_VAR, Probe

_INNER = "CHANDY_TEST_INNER_PROBE_SESSION"


@pytest.mark.skipif(_INNER not in os.environ, reason="run by the test below, in a session of its own")
def test_a_session_that_makes_probes() -> None:
    for _ in range(3):
        probe = Probe()
        probe.add("made")
        assert Path(probe.directory).is_dir()


def test_a_test_session_leaves_no_probe_directories(tmp_path: Path) -> None:
    tmp, base = tmp_path / "tmp", tmp_path / "base"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != PROBE_ROOT_ENV_VAR}
    env.update({_INNER: "1", "TMPDIR": str(tmp)})
    inner = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={base}",
            f"{__file__}::test_a_session_that_makes_probes",
        ],
        cwd=Path(__file__).parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert inner.returncode == 0, inner.stdout + inner.stderr
    assert "1 passed" in inner.stdout
    left = [str(p) for p in tmp_path.rglob("chandy-probe-*")]
    assert left == []
