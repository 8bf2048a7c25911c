"""mkdocs hooks (``hooks:`` in mkdocs.yml): the diagrams and the API reference pages.

Both are made while the site is built, from what is in the repository: the SVGs from
``docs/diagrams/*.txt`` (replacing the committed copies in ``docs/images/``, which the
README shows on GitHub and ``tests/test_docs_build.py`` keeps equal to these), and one
reference page per PyFlink-shaped package listing exactly the names it exports, so a name
added to a package's ``__all__`` appears in the reference without anyone editing a page.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:  # mkdocs loads this file by path; its neighbours by package
    sys.path.insert(0, str(ROOT))

from docs.tools import diagrams  # noqa: E402

#: The packages users import, each with what its page says about it.
REFERENCE = {
    "chandy.datastream": (
        "api/datastream.md",
        "PyFlink's `pyflink.datastream` for chandy: the environment, the streams, the functions "
        "you implement, windows, state and the state backends. Its submodules mirror PyFlink's "
        "(`chandy.datastream.functions`, `.window`, `.state`, `.connectors.kafka`, ...); each "
        "section below lists what a submodule adds to the names above.",
    ),
    "chandy.common": (
        "api/common.md",
        "PyFlink's `pyflink.common` for chandy: types and rows, time, watermark strategies, "
        "configuration and serialization schemas.",
    ),
    "chandy.connectors": (
        "api/connectors.md",
        "chandy's sources and sinks. With checkpointing on, sources keep their read positions "
        "in checkpoints and sinks commit in two phases with them: exactly once.",
    ),
}


def _public_modules(package: str) -> list[Any]:
    module = importlib.import_module(package)
    found = [module]
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.append(importlib.import_module(info.name))
    return found


def exported(module: Any) -> list[str]:
    """The public names a module exports: its ``__all__``."""
    return sorted(getattr(module, "__all__", []))


def reference_pages() -> dict[str, str]:
    """``{"api/NAME.md": markdown}``: each package's names, then what each submodule adds."""
    pages = {}
    for package, (src_uri, intro) in REFERENCE.items():
        shown: set[str] = set()
        sections = [f"# `{package}`\n\n{intro}\n"]
        for module in _public_modules(package):
            new = [name for name in exported(module) if name not in shown]
            if not new:
                continue
            shown.update(new)
            heading = "" if module.__name__ == package else f"## `{module.__name__}`\n\n"
            members = "\n".join(f"        - {name}" for name in new)
            sections.append(f"{heading}::: {module.__name__}\n    options:\n      members:\n{members}\n")
        pages[src_uri] = "\n".join(sections)
    return pages


def on_files(files: Any, config: Any) -> Any:
    """Add the rendered diagrams and the reference pages to the site's files."""
    from mkdocs.structure.files import File

    generated = {**diagrams.rendered(), **reference_pages()}
    for src_uri, content in generated.items():
        committed = files.get_file_from_path(src_uri)
        if committed is not None:
            files.remove(committed)
        files.append(File.generated(config, src_uri, content=content))
    return files
