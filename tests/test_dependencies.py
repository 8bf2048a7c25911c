"""Every third-party import is declared in ``pyproject.toml``.

``chandy/`` may import only what ``[project].dependencies`` lists; the tests, the chaos
suite, the examples and the part of ``bench/`` that runs in the project's environment
(what the tests import or start) may also import the ``dev`` extra. Every ``import`` is
checked, deferred ones inside functions too. An undeclared package works by chance
wherever it happens to be installed and fails on a fresh install: ``./setup.sh`` makes a
new virtual environment from ``pyproject.toml`` alone, so the suite fails there too, but
this test names the module and the file.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Top-level names that are the project's own, not packages to install.
OWN = {"chandy", "tests", "chaos", "bench", "examples", "docs"}

#: Modules a test writes itself (into its tmp_path) before importing them.
MADE_BY_TESTS = {"only_on_the_driver"}  # tests/test_spark_executor.py: a module the slots lack

#: bench/systems runners of the reference systems: each runs in its own virtual environment
#: under bench/.cache/venvs with the packages bench/envs.py pins, never in the project's.
REFERENCE_RUNNERS = {
    "pyflink_runner.py",
    "flink_sql_runner.py",
    "bytewax_runner.py",
    "spark_ss_runner.py",
    "pathway_runner.py",
}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(group: str | None) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = project["dependencies"] if group is None else project["optional-dependencies"][group]
    names = set()
    for requirement in requirements:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match, requirement
        names.add(_normalized(match.group(0)))
    return names


def _imports(paths: Iterable[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Third-party top-level module name -> the files (relative to ``root``) that import it."""
    found: dict[str, list[str]] = {}
    for path in paths:
        siblings = {p.stem for p in path.parent.glob("*.py")}  # scripts that import their neighbours
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in OWN | MADE_BY_TESTS or top in siblings:
                    continue
                found.setdefault(top, []).append(str(path.relative_to(root)))
    return found


def _undeclared(imports: dict[str, list[str]], declared: set[str]) -> list[str]:
    distributions = importlib.metadata.packages_distributions()
    problems = []
    for module, files in sorted(imports.items()):
        providers = {_normalized(d) for d in distributions.get(module, [])}
        if not providers & declared:
            where = ", ".join(sorted(set(files))[:3])
            installed = f"installed from {sorted(providers)}" if providers else "not installed"
            problems.append(f"{module} ({installed}), imported by {where}")
    return problems


def _python_files(*directories: str) -> list[Path]:
    return sorted(p for d in directories for p in (ROOT / d).rglob("*.py"))


def test_chandy_imports_only_its_declared_dependencies() -> None:
    problems = _undeclared(_imports(_python_files("chandy")), _declared(None))
    assert not problems, "add to [project].dependencies in pyproject.toml:\n" + "\n".join(problems)


def test_tests_chaos_examples_and_bench_import_only_declared_packages() -> None:
    files = _python_files("tests", "chaos", "examples", "bench", "docs")
    files = [
        p
        for p in files
        if not p.name.endswith(".pyflink.py")  # PyFlink's own programs, run in bench's PyFlink env
        and p.name not in REFERENCE_RUNNERS
        and ".cache" not in p.relative_to(ROOT).parts
    ]
    problems = _undeclared(_imports(files), _declared(None) | _declared("dev"))
    assert not problems, "add to the dev extra (or the dependencies) in pyproject.toml:\n" + "\n".join(
        problems
    )


def test_the_check_sees_deferred_imports_and_knows_an_undeclared_package(tmp_path: Path) -> None:
    module = ROOT / "chandy" / "state" / "columnar.py"  # imports numpy, which must be declared
    assert "numpy" in _imports([module])
    assert _undeclared({"numpy": ["x.py"]}, {"pyarrow"}) == [
        "numpy (installed from ['numpy']), imported by x.py"
    ]
    deferred = tmp_path / "job.py"
    deferred.write_text("def f():\n    from some_package_nobody_installed.sub import g\n", encoding="utf-8")
    assert _undeclared(_imports([deferred], tmp_path), _declared(None)) == [
        "some_package_nobody_installed (not installed), imported by job.py"
    ]


def _commands(lines: Iterable[str]) -> list[str]:
    """The commands of a shell text: comments and blank lines left out."""
    commands = (line.split("#", 1)[0].strip() for line in lines)
    return [c for c in commands if c]


def test_ci_runs_exactly_the_readme_set_up_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Setup on a fresh machine") :]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "README.md's set-up section lost its bash block"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    steps = [c for c in _commands(ci) if c != "set -euo pipefail" and not c.startswith("cd ")]
    assert steps == _commands(block.group(1).splitlines()) == ["./setup.sh", ".venv/bin/python -m pytest"]
