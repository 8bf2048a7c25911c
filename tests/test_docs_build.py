"""The docs site builds, its diagrams are current, and every public name users import has a
docstring for the API reference to show."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from docs.tools import diagrams
from docs.tools.mkdocs_hooks import REFERENCE, reference_pages

ROOT = Path(__file__).resolve().parent.parent
SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.slow
def test_the_site_builds_strict_with_the_api_reference_and_the_diagrams(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link, a reference that does not resolve or a
    docstring mkdocstrings cannot render fails the build, and so this test."""
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    datastream = (site / "api" / "datastream.html").read_text()
    for name in ("StreamExecutionEnvironment", "KeyedProcessFunction", "TumblingEventTimeWindows"):
        assert name in datastream
    assert "KafkaSource" in (site / "api" / "connectors.html").read_text()
    assert "WatermarkStrategy" in (site / "api" / "common.html").read_text()
    for name in ("architecture", "checkpoint-path", "aligned-checkpoint", "unaligned-checkpoint"):
        built = (site / "images" / f"{name}.svg").read_text()
        assert built == diagrams.render((ROOT / "docs" / "diagrams" / f"{name}.txt").read_text())
    assert 'src="images/checkpoint-path.svg"' in (site / "checkpointing.html").read_text()
    # the docstrings' Sphinx roles are links (or code), never literal ":class:`...`"
    for page in REFERENCE.values():
        built = (site / page[0]).with_suffix(".html").read_text()
        assert not re.search(r":(class|meth|func|mod|attr|data|exc):", built), page[0]
        assert "autoref" not in built.replace("autorefs", "")
    assert 'href="#chandy.datastream.DataStream"><code>DataStream</code></a>' in datastream


def test_a_sphinx_role_becomes_an_optional_autoref_resolved_from_its_docstrings_scope() -> None:
    """``~`` keeps the last part, ``title <target>`` sets the text, and a bare name is looked
    up from the object whose docstring it is (as Sphinx does from the current module)."""
    import griffe

    from docs.tools.griffe_roles import rewrite

    assert rewrite("a :class:`~chandy.api.datastream.DataStream` here") == (
        'a <autoref identifier="chandy.api.datastream.DataStream" optional>'
        "<code>DataStream</code></autoref> here"
    )
    assert rewrite(":meth:`the map <chandy.api.datastream.DataStream.map>`") == (
        '<autoref identifier="chandy.api.datastream.DataStream.map" optional><code>the map</code></autoref>'
    )
    package = griffe.load("chandy.api.datastream", search_paths=[str(ROOT)])
    scope = package["DataStream"]
    assert 'identifier="chandy.api.datastream.DataStream.key_by"' in rewrite(":meth:`key_by`", scope)
    assert 'identifier="chandy.api.datastream.KeyedStream"' in rewrite(":class:`KeyedStream`", scope)
    assert 'identifier="no_such_name"' in rewrite(":func:`no_such_name`", scope)  # left for autorefs


def test_the_committed_diagrams_are_what_their_text_says() -> None:
    """The README shows the copies in docs/images/ (GitHub does not run the docs build)."""
    stale = [
        name
        for name, svg in diagrams.rendered().items()
        if not (ROOT / "docs" / name).is_file() or (ROOT / "docs" / name).read_text() != svg
    ]
    assert not stale, f"run `python -m docs.tools.diagrams` and commit the result: {stale} are not current"


def _texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return [" ".join("".join(t.itertext()).split()) for t in root.iter(f"{SVG}tspan")]


@pytest.mark.parametrize("source", sorted((ROOT / "docs" / "diagrams").glob("*.txt")), ids=lambda p: p.stem)
def test_each_diagram_is_valid_svg_that_holds_its_labels_inside_it(source: Path) -> None:
    svg = diagrams.render(source.read_text())
    root = ET.fromstring(svg)
    width = float(root.get("width") or 0)
    for text in root.iter(f"{SVG}text"):
        anchor = text.get("text-anchor")
        for span in text.iter(f"{SVG}tspan"):
            x, content = float(span.get("x") or 0), span.text or ""
            half = diagrams.text_width(content) / 2
            left, right = (x, x + 2 * half) if anchor == "start" else (x - half, x + half)
            assert 0 <= left and right <= width + 1, f"{content!r} runs outside the picture"
    assert _texts(svg)


def test_a_boxes_diagram_draws_its_nodes_groups_and_edges() -> None:
    svg = diagrams.render(
        'boxes\ntitle T\ngroup g "Group\'s label"\nnode a 0 0 "A\\nsecond line" in g\n'
        'node b 1 0 "B" wide 2\nedge a -> b "calls"\nedge b <-> a ""\n'
    )
    assert _texts(svg) == ["T", "Group's label", "A", "second line", "B", "calls"]
    root = ET.fromstring(svg)
    assert len(root.findall(f"{SVG}line")) == 2
    assert len([r for r in root.iter(f"{SVG}rect") if r.get("stroke-dasharray")]) == 1  # the group


def test_a_sequence_diagram_draws_participants_messages_and_notes() -> None:
    svg = diagrams.render(
        'sequence\nparticipant a "A"\nparticipant b "B"\na -> b "1. ask"\nb --> a "2. answer"\n'
        'b -> b "think"\nnote a..b "both"\n'
    )
    assert _texts(svg) == ["A", "B", "1. ask", "2. answer", "think", "both"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the description is empty"),
        ("flowchart\n", "boxes or sequence"),
        ('boxes\nnode a 0 0 "A" in nowhere\n', "no group 'nowhere'"),
        ('boxes\nnode a 0 0 "A"\nedge a -> b\n', "line 3: no node 'b'"),
        ('boxes\nnode a x 0 "A"\n', "COL must be a number"),
        ('sequence\nparticipant a "A"\na -> b "x"\n', "line 3: no participant 'b'"),
        ('sequence\nparticipant a "A\n', "a quoted label is not closed"),
    ],
)
def test_a_description_that_does_not_parse_names_the_line_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(diagrams.DiagramError, match=message):
        diagrams.render(text)


def test_the_reference_pages_list_every_exported_name_once() -> None:
    pages = reference_pages()
    assert set(pages) == {page for page, _ in REFERENCE.values()}
    datastream = pages["api/datastream.md"]
    assert "::: chandy.datastream\n" in datastream and "- KeyedProcessFunction\n" in datastream
    assert datastream.count("- KeyedProcessFunction\n") == 1  # also in .functions: shown once
    assert "## `chandy.datastream.window`" in datastream and "- TumblingEventTimeWindows\n" in datastream


# ------------------------------------------------------------------------------ docstrings

#: The packages whose public names the API reference shows.
PACKAGES = list(REFERENCE)


def _modules() -> Iterator[Any]:
    for package in PACKAGES:
        module = importlib.import_module(package)
        yield module
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                yield importlib.import_module(info.name)


def public_definitions() -> dict[str, Any]:
    """Every public class and function of the modules that define what the packages export
    (the builders, contexts, readers and writers a user meets through those names too), the
    public classes nested in them, and each public method or property a class defines itself,
    by qualified name."""
    defining = set()
    for module in _modules():
        for name in getattr(module, "__all__", []):
            value = getattr(module, name)
            if (inspect.isclass(value) or inspect.isfunction(value)) and value.__module__.startswith(
                "chandy"
            ):
                defining.add(value.__module__)
    found: dict[str, Any] = {}
    for module_name in sorted(defining):
        for name, value in vars(sys.modules[module_name]).items():
            if name.startswith("_") or not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            if value.__module__ == module_name:
                _add(found, value)
    return found


def _add(found: dict[str, Any], value: Any) -> None:
    qualified = f"{value.__module__}.{value.__qualname__}"
    found[qualified] = value
    if not inspect.isclass(value):
        return
    for member_name, member in vars(value).items():
        if member_name.startswith("_"):
            continue
        if inspect.isclass(member) and member.__qualname__.startswith(value.__qualname__ + "."):
            _add(found, member)  # a nested class: Context, Builder, ...
        elif isinstance(member, staticmethod | classmethod | property) or inspect.isfunction(member):
            found[f"{qualified}.{member_name}"] = (value, member_name)


def has_docstring(definition: Any) -> bool:
    """A docstring of its own, or of the method it overrides (as ``inspect.getdoc`` finds it:
    ``create_reader`` of every source says what ``Source.create_reader`` says)."""
    if isinstance(definition, tuple):
        cls, name = definition
        for owner in cls.__mro__:
            member = vars(owner).get(name)
            if member is None:
                continue
            if isinstance(member, staticmethod | classmethod):
                member = member.__func__
            if (getattr(member, "__doc__", None) or "").strip():
                return True
        return False
    return bool((definition.__doc__ or "").strip())


def test_every_public_name_users_import_has_a_docstring() -> None:
    missing = sorted(
        name for name, definition in public_definitions().items() if not has_docstring(definition)
    )
    total = len(public_definitions())
    assert not missing, (
        f"{len(missing)} of {total} public classes, functions and methods of {', '.join(PACKAGES)} have no "
        "docstring, so the API reference shows them bare; say what each is for (why a user calls it):\n"
        + "\n".join(missing)
    )


class _Documented:
    """A class."""

    def run(self) -> None:
        """Runs."""

    @property
    def size(self) -> int:
        """How big."""
        return 1


class _Bare(_Documented):
    def run(self) -> None:  # inherits the docstring of _Documented.run
        pass

    def stop(self) -> None:
        pass


def test_the_docstring_check_inherits_from_overridden_methods_and_finds_bare_ones() -> None:
    assert has_docstring(_Documented) and not has_docstring(_Bare)
    assert has_docstring((_Bare, "run")) and has_docstring((_Bare, "size"))
    assert not has_docstring((_Bare, "stop"))
