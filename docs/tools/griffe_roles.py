"""A griffe extension for the API reference: Sphinx cross-reference roles as links.

chandy's docstrings cross-reference the way Python docstrings usually do, with Sphinx's
roles (``:class:`~chandy.api.datastream.DataStream```): ``help()`` and editors show them
as written, and they read well there. mkdocstrings renders Markdown, where a role is
literal text, so the reference showed ``:class:`` and backticks around a dotted path.

This extension rewrites each docstring of the loaded package, for the site only, into an
*optional* autoref: a link when the target is an object the reference renders, the name in
code otherwise (an internal class, a relative name). ``~`` keeps only the last part of the
path, as in Sphinx, and ``title <target>`` sets the text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import griffe

#: A Sphinx role in the Python domain: ``:class:`...```, ``:py:meth:`...```, ...
ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const|type):`([^`]+)`")
#: ``title <target>`` inside a role.
TITLED = re.compile(r"^(.*?)\s*<([^<>]+)>$")


def as_autoref(match: re.Match[str], scope: griffe.Object | None = None) -> str:
    """One role as an optional autoref (an inline HTML element that mkdocs-autorefs resolves
    after the page is rendered, and leaves as plain code when it cannot). A name that is not
    a full path (``DataStream``, ``get_job_execution_result``) is looked up from ``scope``,
    the object whose docstring it is, as Sphinx looks it up from the current module and class."""
    content = match[1].strip()
    titled = TITLED.match(content)
    if titled:
        title, target = titled[1], titled[2]
    else:
        target = content.lstrip("~")
        title = target.rsplit(".", 1)[-1] if content.startswith("~") else target
    target = target.removesuffix("()").lstrip(".")
    if scope is not None and not target.startswith("chandy."):
        target = _resolved(scope, target)
    return f'<autoref identifier="{html.escape(target)}" optional><code>{html.escape(title)}</code></autoref>'


def _resolved(scope: griffe.Object, target: str) -> str:
    """``target``'s full path as seen from ``scope`` (its first part resolved, the rest kept),
    or ``target`` unchanged when nothing there has that name."""
    first, _, rest = target.partition(".")
    current: griffe.Object | None = scope
    while current is not None:
        if first in current.members:
            path = current.members[first].path
            return f"{path}.{rest}" if rest else path
        try:
            path = current.resolve(first)
        except (griffe.NameResolutionError, KeyError, ValueError):
            current = current.parent
            continue
        return f"{path}.{rest}" if rest else path
    return target


def rewrite(text: str, scope: griffe.Object | None = None) -> str:
    """``text`` with every role replaced by its autoref."""
    return ROLE.sub(lambda match: as_autoref(match, scope), text)


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and everything defined in it (aliases, which point elsewhere, left out)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring once the package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj)
