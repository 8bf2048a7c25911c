"""The type checker, run by the test suite: CI runs only pytest, so this is how mypy runs in CI.

The configuration is ``[tool.mypy]`` in ``pyproject.toml``: the whole ``chandy``
package, ``strict = true``. The checkpoint protocol (``chandy.checkpoint``,
``chandy.network``, ``chandy.task``) must be strict; the rest is held to the same
bar so that nothing it calls returns an unchecked ``Any``. Run it yourself with
``python -m mypy`` from the repository root.

Where making the code type-check meant narrowing a value at run time, the
narrowing is an error a user can meet; those errors are tested here too.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from chandy.core.state import ListStateDescriptor, ValueStateDescriptor
from chandy.errors import InvalidProgramError
from chandy.state.heap import HeapKeyedStateBackend
from chandy.state.key_groups import KeyGroupRange
from chandy.task.operators.keyed import SumFunction
from chandy.task.runtime_context import StreamingRuntimeContext

ROOT = Path(__file__).resolve().parent.parent


def mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def test_mypy_finds_no_errors() -> None:
    """``python -m mypy`` with the project's configuration: no error anywhere in ``chandy``.

    The cache (``.mypy_cache`` at the root, ignored by git) makes runs after the first
    take a few seconds.
    """
    result = mypy()
    assert result.returncode == 0, (
        f"mypy found errors (run `python -m mypy`):\n{result.stdout}{result.stderr}"
    )


def strict_flags() -> set[str]:
    """The flags ``--strict`` turns on, as this mypy documents them (the set grows over time)."""
    help_text = subprocess.run(
        [sys.executable, "-m", "mypy", "--help"], capture_output=True, text=True, check=True
    ).stdout
    section = help_text[help_text.index("--strict ") :]
    section = section[: section.index("--disable-error-code")]
    section = re.sub(r"-\s+", "-", section)  # flags the help text wrapped after a hyphen
    return {flag.replace("-", "_") for flag in re.findall(r"--([a-z-]+)", section)} - {"strict"}


def test_no_module_is_exempt_from_strict() -> None:
    """``strict = true`` for the package, and no per-module section switches a strict flag
    off or silences an error code for a chandy module (exceptions are per line, with a reason)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config.get("strict") is True
    flags = strict_flags()
    assert "disallow_untyped_defs" in flags  # the help text was understood
    for override in config.get("overrides", []):
        modules = [override["module"]] if isinstance(override["module"], str) else override["module"]
        ours = [m for m in modules if m == "chandy" or m.startswith("chandy.")]
        relaxed = sorted(
            k for k, v in override.items() if (k in flags and v is False) or k.startswith("disable")
        )
        assert not (ours and relaxed), f"{ours} relax {relaxed} in pyproject.toml"
    assert not config.get("disable_error_code"), "error codes are silenced per line, not for the package"


@pytest.mark.parametrize("package", ["task", "checkpoint", "network", "api"])
def test_the_checker_fails_on_an_untyped_function(tmp_path: Path, package: str) -> None:
    """The configuration catches what it should: an unannotated function is an error in
    the checkpoint protocol's packages and elsewhere."""
    for path in ("chandy", f"chandy/{package}"):
        (tmp_path / path).mkdir(parents=True, exist_ok=True)
        (tmp_path / path / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "chandy" / package / "untyped.py").write_text("def f(x):\n    return x\n")
    result = mypy("--cache-dir", str(tmp_path / "cache"), f"chandy/{package}/untyped.py", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"chandy/{package}/untyped.py:1: error: Function is missing a type annotation" in result.stdout


# -- narrowings that are run-time checks ------------------------------------------------


def keyed_context() -> StreamingRuntimeContext:
    return StreamingRuntimeContext(
        job_id="job",
        job_name="typing",
        task_name="task",
        operator_name="counter",
        subtask_index=0,
        parallelism=1,
        max_parallelism=128,
        attempt_number=0,
        job_parameters={},
        keyed_state_backend=HeapKeyedStateBackend(KeyGroupRange(0, 127), 128),
    )


def test_state_of_the_wrong_kind_is_refused_by_name() -> None:
    """``get_state`` with a list descriptor used to hand back a list state, which failed
    later with an AttributeError on ``value()``; now the request itself names the fix."""
    context = keyed_context()
    with pytest.raises(InvalidProgramError, match=r"'count'.*ListStateDescriptor.*ValueStateDescriptor"):
        context.get_state(ListStateDescriptor("count"))  # type: ignore[arg-type]
    with pytest.raises(InvalidProgramError, match=r"'seen'.*ValueStateDescriptor.*ListStateDescriptor"):
        context.get_list_state(ValueStateDescriptor("seen"))  # type: ignore[arg-type]
    assert context.get_state(ValueStateDescriptor("total")) is not None


def test_sum_of_list_records_by_field_name_is_refused_by_name() -> None:
    """A list's field is chosen by position: ``sum("amount")`` says so, as it does for tuples."""
    with pytest.raises(
        TypeError,
        match=r"sum\('amount'\) on a record of type list: a tuple or list field is chosen by an int",
    ):
        SumFunction("amount")([1, 2], [3, 4])
    assert SumFunction(1)(["a", 2], ["a", 3]) == ["a", 5]
