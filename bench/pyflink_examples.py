"""PyFlink's own event-time and state examples, run by chandy with only their imports changed.

``python -m bench.pyflink_examples`` takes the window examples PyFlink 2.3 ships
(``pyflink/examples/datastream/windowing/*.py``) and its state TTL example
(``state_access.py``), both from the PyFlink the benchmarks
install under ``bench/.cache/venvs/pyflink``), replaces ``pyflink`` by ``chandy``
in them, runs each, and compares what it prints with what PyFlink printed
(``tests/pyflink_outputs/``). It also checks that every name those examples
import resolves under ``chandy``. It lives here, beside the benchmarks, because
it needs the reference installation; the test suite runs chandy's own ports of
the same examples (``examples/windowing.py``) against the same stored outputs.
Prints one line per check and exits non-zero if any failed.
"""

from __future__ import annotations

import ast
import importlib
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.envs import ensure_env

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = ROOT / "tests" / "pyflink_outputs"
WINDOW_EXAMPLES = {
    "tumbling_time_window": "tumbling",
    "sliding_time_window": "sliding",
    "session_with_gap_window": "session",
    "session_with_dynamic_gap_window": "dynamic-session",
    "tumbling_count_window": "count",
}


def examples_dir() -> Path:
    python = ensure_env("pyflink")
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    return site / "pyflink" / "examples" / "datastream"


def run_window_example(examples: Path, original: str, kind: str) -> str | None:
    """``None`` if chandy prints what PyFlink printed, else what differs."""
    source = (examples / "windowing" / f"{original}.py").read_text(encoding="utf-8")
    ported = source.replace("pyflink", "chandy").replace(
        "get_execution_environment()", 'get_execution_environment(executor="local")'
    )
    with tempfile.TemporaryDirectory(prefix="chandy-pyflink-example-") as tmp:
        script = Path(tmp) / f"{original}.py"
        script.write_text(ported, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=300, cwd=ROOT
        )
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr[-2000:]}"
    expected = (OUTPUTS / f"windowing-{kind}.txt").read_text(encoding="utf-8").splitlines()
    if done.stdout.splitlines() != expected:
        return f"printed {done.stdout.splitlines()!r}, PyFlink printed {expected!r}"
    return None


def run_state_access_example(examples: Path) -> str | None:
    """``None`` if chandy prints what PyFlink printed: the same records in the same order.
    PyFlink ran at parallelism 2 and prefixed its lines with the subtask (``1> ``); chandy's
    default parallelism is 1, which prints none, so the prefixes are not compared."""
    ported = (
        (examples / "state_access.py")
        .read_text(encoding="utf-8")
        .replace("pyflink", "chandy")
        .replace("get_execution_environment()", 'get_execution_environment(executor="local")')
    )
    done = subprocess.run(
        [sys.executable, "-c", ported], check=False, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr[-2000:]}"
    unprefixed = [line.split("> ", 1)[-1] for line in done.stdout.splitlines()]
    expected = [
        line.split("> ", 1)[-1]
        for line in (OUTPUTS / "state-access.txt").read_text(encoding="utf-8").splitlines()
    ]
    if unprefixed != expected:
        return f"printed {done.stdout.splitlines()!r}, PyFlink printed {expected!r}"
    return None


def unresolved_imports(examples: Path) -> list[str]:
    """Names PyFlink's event-time, window and state examples import that chandy lacks."""
    files = [
        examples / "event_time_timer.py",
        examples / "state_access.py",
        *sorted((examples / "windowing").glob("*.py")),
    ]
    missing = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyflink.")):
                continue
            module = (node.module or "").replace("pyflink.", "chandy.", 1)
            for alias in node.names:
                try:
                    getattr(importlib.import_module(module), alias.name)
                except (ImportError, AttributeError) as error:
                    missing.append(f"{path.name}: {module}.{alias.name}: {error}")
    return missing


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    examples = examples_dir()
    failed = 0
    for original, kind in WINDOW_EXAMPLES.items():
        problem = run_window_example(examples, original, kind)
        failed += problem is not None
        print(
            f"{'ok  ' if problem is None else 'FAIL'} windowing/{original}.py"
            + (f": {problem}" if problem else "")
        )
    problem = run_state_access_example(examples)
    failed += problem is not None
    print(f"{'ok  ' if problem is None else 'FAIL'} state_access.py" + (f": {problem}" if problem else ""))
    missing = unresolved_imports(examples)
    failed += bool(missing)
    print("ok   every import resolves" if not missing else "FAIL imports: " + "; ".join(missing))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
