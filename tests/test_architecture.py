"""The layering of docs/architecture.md, enforced: imports only point down.

Every ``import`` in ``chandy/`` (module level or deferred inside a function) is
checked against the layer table below. A module may import a lower layer or
its own component; anything else is an upward or sideways arrow, which is how
import cycles and tangled layers start.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "chandy"

#: (rank, component prefixes). Higher ranks may import lower ones.
LAYERS: list[tuple[int, tuple[str, ...]]] = [
    (0, ("chandy.errors",)),
    (0, ("chandy.util",)),
    (0, ("chandy.core",)),  # the package only: each module of it has its own row
    (0, ("chandy.core.time",)),
    (0, ("chandy.core.output_tag",)),
    (0, ("chandy.core.types",)),
    (1, ("chandy.core.watermark_strategy",)),
    (1, ("chandy.config",)),
    (1, ("chandy.core.state",)),
    (1, ("chandy.core.async_retry",)),
    (1, ("chandy.core.metrics",)),
    (2, ("chandy.core.functions",)),
    (2, ("chandy.core.connector",)),
    (3, ("chandy.core.windows",)),
    (3, ("chandy.state",)),
    (4, ("chandy.storage",)),
    (4, ("chandy.messages",)),
    (5, ("chandy.network",)),
    (6, ("chandy.task",)),
    (6, ("chandy.checkpoint",)),
    (7, ("chandy.graph",)),
    (7, ("chandy.connectors",)),
    (8, ("chandy.runtime",)),
    (9, ("chandy.web",)),  # REST API, dashboard, metrics: served by the environment's execute()
    (10, ("chandy.api",)),
    (11, ("chandy.cli",)),
    (11, ("chandy.common",)),
    (12, ("chandy",)),
    (12, ("chandy.datastream",)),
    (12, ("chandy.metrics",)),
]


def component(module: str) -> tuple[int, tuple[str, ...]]:
    best: tuple[int, tuple[str, ...]] | None = None
    best_len = -1
    for rank, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = (rank, prefixes), len(prefix)
    assert best is not None, module
    return best


#: Components that are a package's ``__init__`` only; a module under one of them must have its own row.
PACKAGE_ONLY = ("chandy", "chandy.core")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
    return [(line, name) for line, name in found if name == "chandy" or name.startswith("chandy.")]


def all_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", all_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path: Path) -> None:
    source = module_name(path)
    rank, prefixes = component(source)
    for line, target in imports_of(path):
        if target == "chandy" and source != "chandy":
            pytest.fail(f"{path.name}:{line} imports the top-level package; import the module")
        target_rank, target_prefixes = component(target)
        allowed = target_rank < rank or target_prefixes == prefixes
        assert allowed, (
            f"{source} (layer {rank}) imports {target} (layer {target_rank}) at "
            f"line {line}: arrows must point down (docs/architecture.md)"
        )


@pytest.mark.parametrize("path", all_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_has_a_layer(path: Path) -> None:
    """A new package or contracts module is placed in the table, not ranked by accident.

    Without this, a module under ``chandy.core`` (or a new top-level package) would
    silently take the rank of its parent package's row.
    """
    source = module_name(path)
    _, prefixes = component(source)
    assert not (set(prefixes) & set(PACKAGE_ONLY)) or source in PACKAGE_ONLY, (
        f"{source} belongs to no layer: add it to LAYERS here and to the table in docs/architecture.md"
    )


#: Imports each module named in argv in a child forked from an interpreter that imported
#: nothing of chandy: as a fresh interpreter per module would, without starting ~170 of them.
#: The third-party packages chandy imports (NumPy, PyArrow, PySpark...: about half of each
#: child's import time) are imported once before, whole (top-level packages, as any import
#: of them starts): what is tested is the order among chandy's own modules.
_IMPORT_EACH_ALONE = """
import importlib, os, sys, traceback
failed, running = [], {}

read, write = os.pipe()
lister = os.fork()
if lister == 0:  # which third-party packages importing every module of chandy imports
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except BaseException:
            pass  # its own child below reports it
    tops = {m.partition(".")[0] for m in list(sys.modules)} - set(sys.stdlib_module_names)
    os.write(write, " ".join(sorted(t for t in tops if t not in ("chandy", "__main__"))).encode())
    os._exit(0)
os.close(write)
with os.fdopen(read) as listed:
    third_party = listed.read().split()
os.waitpid(lister, 0)
for name in third_party:
    try:
        importlib.import_module(name)
    except BaseException:
        pass  # a package that cannot be imported first on its own: the child imports it then

def reap():
    pid, status = os.wait()
    if status != 0:
        failed.append(running[pid])
    del running[pid]

for name in sys.argv[1:]:
    if len(running) >= 2:  # two at a time: the machines this runs on have two cores
        reap()
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    running[pid] = name
while running:
    reap()
failed.sort()
print(failed)
"""


@pytest.mark.slow
def test_every_module_imports_on_its_own() -> None:
    """No module depends on another having been imported first (no hidden cycles)."""
    names = [module_name(p) for p in all_modules()]
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH_ALONE, *names], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def test_ruff_is_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--quiet", str(ROOT)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_applied() -> None:
    """The code is formatted by ``ruff format`` (run it before committing)."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", str(ROOT)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


#: A link target or path that leaves the repository: a parent directory, or an absolute path.
_OUTSIDE = re.compile(r"(?<!\.)\.\./|(?<![\w.:/])/(?:work|home|tmp|Users)/")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def outside_references(text: str) -> list[str]:
    """Lines of a Markdown page that point outside the repository."""
    return [line.strip() for line in text.splitlines() if _OUTSIDE.search(line)]


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_stay_inside_the_repository(page: Path) -> None:
    """A user's clone has nothing beside it: the docs name no path outside it, and every
    relative link leads to a file of the repository."""
    text = page.read_text(encoding="utf-8")
    outside = outside_references(text)
    assert outside == [], f"{page.name} points outside the repository: {outside}"
    for target in _LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        resolved = (page.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{page.name} links {target}, outside the repository"
        assert resolved.exists(), f"{page.name} links {target}, which does not exist"


def test_outside_references_are_found() -> None:
    """The check above can fail: the references this issue removed are caught."""
    assert outside_references("The brief is `../shared/DESIGN.md`; see [x](../shared/a.md).")
    assert outside_references("See /work/shared/reference/flink-scenarios.md.")
    assert not outside_references("See [design](docs/design.md), `.../chk-7/_metadata`, s3://b/x.")


def test_the_readme_example_runs_and_counts() -> None:
    """The first code a user copies works as printed (on the local executor, to be quick)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Example\n\n```python\n(.*?)```", text, re.S)
    assert block is not None, "README.md lost its '## Example' Python block"
    code = block.group(1)
    assert "get_execution_environment()" in code
    code = code.replace("get_execution_environment()", 'get_execution_environment(executor="local")')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = sorted(line.split("> ", 1)[1] for line in done.stdout.splitlines())
    expected = ["('be', 1)", "('be', 2)", "('not', 1)", "('or', 1)", "('to', 1)", "('to', 2)"]
    assert printed == expected, done.stdout
