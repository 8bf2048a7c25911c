"""The test probes' directories do not outlive the test session that made them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.probes import PROBE_ROOT_ENV_VAR

#: A session that makes probes, run on its own below (not collected by the suite: its name
#: does not match test_*.py, and pytest collects a file named on its command line anyway).
INNER_SESSION = Path(__file__).with_name("probe_session.py")


def test_a_test_session_leaves_no_probe_directories(tmp_path: Path) -> None:
    tmp, base = tmp_path / "tmp", tmp_path / "base"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != PROBE_ROOT_ENV_VAR}
    env["TMPDIR"] = str(tmp)
    inner = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",  # one session, in this process: the probe root is its own
            "-p",
            "no:cacheprovider",
            f"--basetemp={base}",
            str(INNER_SESSION),
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
