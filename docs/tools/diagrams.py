"""Diagrams from text: a small description in ``docs/diagrams/*.txt`` rendered to SVG.

The docs' figures are kept as text in the repository, so a change to the architecture is a
change to a few readable lines, reviewed like code, and no drawing tool or system binary
(Graphviz) is needed: this module is pure Python and runs wherever the docs build runs.

Two kinds of diagram, named on the first line:

``boxes`` — nodes at grid cells, groups drawn around nodes, and arrows between them::

    boxes
    title Chandy on Spark
    group driver "Spark driver = Flink's JobManager"
    node jm 0 0 "JobMaster" in driver
    node cc 1 0 "CheckpointCoordinator" in driver
    edge cc -> jm "acks"
    edge a <-> b "both ways"     (also -- for a line without arrow heads)

``node ID COL ROW "LABEL" [in GROUP] [wide N]``: a box in column COL and row ROW (numbers,
halves allowed); ``wide N`` spans N columns. ``\\n`` in a label breaks the line.

``sequence`` — participants side by side, messages top to bottom::

    sequence
    title The checkpoint path
    participant cc "CheckpointCoordinator"
    participant src "Source subtask"
    cc -> src "1. trigger"
    src -> src "snapshot"          (a message to itself)
    src --> cc "ack"               (dashed: an answer)
    note src "text beside the lifeline"
    note cc..src "text across the lifelines"

Lines starting with ``#`` are comments. ``render(text)`` returns the SVG; a description that
does not parse raises :class:`DiagramError` naming the line and what is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

FONT = "Helvetica, Arial, sans-serif"
FONT_SIZE = 13
#: An upper bound of a character's width at FONT_SIZE in the fonts above, so boxes never clip.
CHAR_WIDTH = 7.4
LINE_HEIGHT = 17
INK = "#1f2933"
BOX_FILL = "#e8f0fe"
BOX_STROKE = "#3b6fd6"
GROUP_FILL = "#f7f7f2"
GROUP_STROKE = "#9aa0a6"
NOTE_FILL = "#fff7d6"
NOTE_STROKE = "#c9a227"


class DiagramError(ValueError):
    """A diagram description that does not parse: the message names the line and the fix."""


def text_width(text: str, size: float = FONT_SIZE) -> float:
    """The width a line of text takes (an estimate that errs on the wide side)."""
    return len(text) * CHAR_WIDTH * size / FONT_SIZE


def _lines(label: str) -> list[str]:
    return label.split("\\n")


def _text(
    x: float, y: float, label: str, *, anchor: str = "middle", weight: str = "normal", size: int = FONT_SIZE
) -> str:
    """SVG text centred vertically on ``y``, one ``tspan`` per line of the label."""
    lines = _lines(label)
    top = y - (len(lines) - 1) * LINE_HEIGHT / 2
    spans = "".join(
        f'<tspan x="{x:.1f}" y="{top + i * LINE_HEIGHT:.1f}">{escape(line)}</tspan>'
        for i, line in enumerate(lines)
    )
    return (
        f'<text font-family="{FONT}" font-size="{size}" font-weight="{weight}" fill="{INK}" '
        f'text-anchor="{anchor}" dominant-baseline="central">{spans}</text>'
    )


def _svg(width: float, height: float, body: list[str]) -> str:
    marker = (
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{INK}"/></marker></defs>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n{marker}\n' + "\n".join(body) + "\n</svg>\n"
    )


_WORD = re.compile(r'"([^"]*)"|(\S+)')


def _words(line: str, number: int) -> list[str]:
    """Words of a line; a double-quoted label is one word (apostrophes are plain text)."""
    if line.count('"') % 2:
        raise DiagramError(f'line {number}: a quoted label is not closed in {line!r}; close it with a "')
    return [quoted if bare is None or bare == "" else bare for quoted, bare in _WORD.findall(line)]


def _number(word: str, number: int, what: str) -> float:
    try:
        return float(word)
    except ValueError:
        raise DiagramError(f"line {number}: {what} must be a number, got {word!r}") from None


def _statements(
    lines: list[tuple[int, str]], diagram: _Boxes | _Sequence
) -> Iterator[tuple[int, str, list[str]]]:
    """Each line's number, text and words; a ``title`` line sets the diagram's title instead."""
    for number, line in lines:
        words = _words(line, number)
        if words[0] == "title":
            diagram.title = " ".join(words[1:])
        else:
            yield number, line, words


def _declared(words: list[str], number: int, line: str) -> tuple[str, str]:
    """The id and label of a ``group`` or ``participant`` line: ``KIND ID "LABEL"``."""
    if len(words) != 3:
        raise DiagramError(f'line {number}: write {words[0]} ID "LABEL", got {line!r}')
    return words[1], words[2]


# ---------------------------------------------------------------------------------- boxes


@dataclass
class _Node:
    id: str
    col: float
    row: float
    label: str
    group: str | None
    span: float = 1


@dataclass
class _Edge:
    source: str
    target: str
    label: str
    heads: str  # "->", "<->" or "--"
    line: int


@dataclass
class _Boxes:
    title: str = ""
    groups: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, _Node] = field(default_factory=dict)
    edges: list[_Edge] = field(default_factory=list)


MIN_BOX_W = 150
COLUMN_GAP = 120  # between boxes side by side: room for an edge's label
ROW_GAP = 80
BOX_H_PAD = 18
GROUP_PAD = 18
MARGIN = 24
TITLE_H = 40


def _parse_boxes(lines: list[tuple[int, str]]) -> _Boxes:
    diagram = _Boxes()
    for number, line, words in _statements(lines, diagram):
        kind = words[0]
        if kind == "group":
            name, label = _declared(words, number, line)
            diagram.groups[name] = label
        elif kind == "node":
            if len(words) < 5:
                raise DiagramError(f'line {number}: write node ID COL ROW "LABEL" [in GROUP], got {line!r}')
            node = _Node(
                words[1], _number(words[2], number, "COL"), _number(words[3], number, "ROW"), words[4], None
            )
            rest = words[5:]
            while rest:
                if rest[0] == "in" and len(rest) >= 2:
                    if rest[1] not in diagram.groups:
                        raise DiagramError(
                            f"line {number}: no group {rest[1]!r}; declare it before its nodes"
                        )
                    node.group, rest = rest[1], rest[2:]
                elif rest[0] == "wide" and len(rest) >= 2:
                    node.span, rest = _number(rest[1], number, "wide"), rest[2:]
                else:
                    raise DiagramError(f"line {number}: unexpected {rest[0]!r}; use 'in GROUP' or 'wide N'")
            diagram.nodes[node.id] = node
        elif kind == "edge":
            if len(words) not in (4, 5) or words[2] not in ("->", "<->", "--"):
                raise DiagramError(f'line {number}: write edge A -> B ["LABEL"] (or <->, --), got {line!r}')
            diagram.edges.append(
                _Edge(words[1], words[3], words[4] if len(words) == 5 else "", words[2], number)
            )
        else:
            raise DiagramError(f"line {number}: unknown statement {kind!r}; use title, group, node or edge")
    for edge in diagram.edges:
        for end in (edge.source, edge.target):
            if end not in diagram.nodes:
                raise DiagramError(
                    f"line {edge.line}: no node {end!r}; declare it with 'node {end} COL ROW ...'"
                )
    return diagram


def _clip(cx: float, cy: float, hw: float, hh: float, tx: float, ty: float) -> tuple[float, float]:
    """Where the segment from a box's centre towards (tx, ty) leaves the box."""
    dx, dy = tx - cx, ty - cy
    if dx == 0 and dy == 0:
        return cx, cy
    scale = min(hw / abs(dx) if dx else float("inf"), hh / abs(dy) if dy else float("inf"))
    return cx + dx * scale, cy + dy * scale


def _render_boxes(diagram: _Boxes) -> str:
    top = MARGIN + (TITLE_H if diagram.title else 0)
    # Boxes are as wide as their labels; every column as wide as the widest box per column
    # it spans plus room for an edge label between neighbours, every row as tall as the
    # tallest box plus room for a group's title.
    sizes = {
        node.id: (
            max(max(text_width(s) for s in _lines(node.label)) + 28, MIN_BOX_W),
            len(_lines(node.label)) * LINE_HEIGHT + 2 * BOX_H_PAD,
        )
        for node in diagram.nodes.values()
    }
    cell_w = max(sizes[node.id][0] / node.span for node in diagram.nodes.values()) + COLUMN_GAP
    cell_h = max(h for _, h in sizes.values()) + ROW_GAP
    boxes: dict[str, tuple[float, float, float, float]] = {}  # centre x, centre y, half w, half h
    for node in diagram.nodes.values():
        width, height = sizes[node.id]
        cx = MARGIN + GROUP_PAD + (node.col + node.span / 2) * cell_w
        cy = top + GROUP_PAD + LINE_HEIGHT + (node.row + 0.5) * cell_h
        boxes[node.id] = (cx, cy, width / 2, height / 2)
    body: list[str] = []
    if diagram.title:
        body.append(
            _text(MARGIN, MARGIN + TITLE_H / 2 - 6, diagram.title, anchor="start", weight="bold", size=16)
        )
    right = bottom = 0.0
    for group, label in diagram.groups.items():
        members = [boxes[n.id] for n in diagram.nodes.values() if n.group == group]
        if not members:
            continue
        x0 = min(cx - hw for cx, _, hw, _ in members) - GROUP_PAD
        x1 = max(cx + hw for cx, _, hw, _ in members) + GROUP_PAD
        y0 = min(cy - hh for _, cy, _, hh in members) - GROUP_PAD - LINE_HEIGHT - 4
        y1 = max(cy + hh for _, cy, _, hh in members) + GROUP_PAD
        x1 = max(x1, x0 + text_width(label) + 2 * GROUP_PAD)
        right, bottom = max(right, x1), max(bottom, y1)
        body.append(
            f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" rx="10" '
            f'fill="{GROUP_FILL}" stroke="{GROUP_STROKE}" stroke-dasharray="6 4"/>'
        )
        body.append(_text(x0 + 12, y0 + 14, label, anchor="start", weight="bold"))
    for node in diagram.nodes.values():
        cx, cy, hw, hh = boxes[node.id]
        right, bottom = max(right, cx + hw), max(bottom, cy + hh)
        body.append(
            f'<rect x="{cx - hw:.1f}" y="{cy - hh:.1f}" width="{2 * hw:.1f}" height="{2 * hh:.1f}" rx="6" '
            f'fill="{BOX_FILL}" stroke="{BOX_STROKE}" stroke-width="1.5"/>'
        )
        body.append(_text(cx, cy, node.label))
    labels: list[str] = []
    for edge in diagram.edges:
        sx, sy, shw, shh = boxes[edge.source]
        tx, ty, thw, thh = boxes[edge.target]
        x0, y0 = _clip(sx, sy, shw, shh, tx, ty)
        x1, y1 = _clip(tx, ty, thw, thh, sx, sy)
        ends = ""
        if edge.heads in ("->", "<->"):
            ends += ' marker-end="url(#arrow)"'
        if edge.heads == "<->":
            ends += ' marker-start="url(#arrow)"'
        body.append(
            f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" '
            f'stroke="{INK}" stroke-width="1.4"{ends}/>'
        )
        if edge.label:
            mx, my = (x0 + x1) / 2, (y0 + y1) / 2
            lines = _lines(edge.label)
            w = max(text_width(s, FONT_SIZE - 1) for s in lines) + 8
            h = len(lines) * LINE_HEIGHT + 2
            labels.append(
                f'<rect x="{mx - w / 2:.1f}" y="{my - h / 2:.1f}" width="{w:.1f}" height="{h:.1f}" '
                'fill="white" fill-opacity="0.92"/>'
            )
            labels.append(_text(mx, my, edge.label, size=FONT_SIZE - 1))
            right = max(right, mx + w / 2)
    return _svg(right + MARGIN, bottom + MARGIN, body + labels)


# ------------------------------------------------------------------------------- sequence


@dataclass
class _Step:
    kind: str  # "message" or "note"
    source: str
    target: str
    label: str
    dashed: bool = False


@dataclass
class _Sequence:
    title: str = ""
    participants: dict[str, str] = field(default_factory=dict)
    steps: list[_Step] = field(default_factory=list)


def _parse_sequence(lines: list[tuple[int, str]]) -> _Sequence:
    diagram = _Sequence()
    for number, line, words in _statements(lines, diagram):
        kind = words[0]
        if kind == "participant":
            name, label = _declared(words, number, line)
            diagram.participants[name] = label
        elif kind == "note":
            if len(words) != 3:
                raise DiagramError(f'line {number}: write note ID "TEXT" or note A..B "TEXT", got {line!r}')
            first, _, last = words[1].partition("..")
            diagram.steps.append(_Step("note", first, last or first, words[2]))
        elif len(words) == 4 and words[1] in ("->", "-->"):
            diagram.steps.append(_Step("message", words[0], words[2], words[3], dashed=words[1] == "-->"))
        else:
            raise DiagramError(
                f'line {number}: write A -> B "LABEL" (or --> for an answer), note, participant or title; '
                f"got {line!r}"
            )
        if diagram.steps:
            step = diagram.steps[-1]
            for end in (step.source, step.target):
                if end not in diagram.participants:
                    raise DiagramError(f"line {number}: no participant {end!r}; declare it before it is used")
    return diagram


def _render_sequence(diagram: _Sequence) -> str:
    ids = list(diagram.participants)
    # Each gap between neighbouring lifelines is as wide as the widest label that crosses it.
    gaps = [170.0] * max(len(ids) - 1, 0)
    for step in diagram.steps:
        a, b = sorted((ids.index(step.source), ids.index(step.target)))
        width = max(text_width(s) for s in _lines(step.label)) + 30
        if a == b:  # a note or a message to itself sits right of its lifeline
            if a < len(gaps):
                gaps[a] = max(gaps[a], width + 20)
            continue
        share = width / (b - a)
        for i in range(a, b):
            gaps[i] = max(gaps[i], share)
    heads = [
        max(max(text_width(s) for s in _lines(label)) + 24, 120) for label in diagram.participants.values()
    ]
    for i in range(len(gaps)):
        gaps[i] = max(gaps[i], (heads[i] + heads[i + 1]) / 2 + 20)
    xs = [MARGIN + heads[0] / 2]
    for gap in gaps:
        xs.append(xs[-1] + gap)
    top = MARGIN + (TITLE_H if diagram.title else 0)
    head_h = max(len(_lines(label)) for label in diagram.participants.values()) * LINE_HEIGHT + 18
    body: list[str] = []
    if diagram.title:
        body.append(
            _text(MARGIN, MARGIN + TITLE_H / 2 - 6, diagram.title, anchor="start", weight="bold", size=16)
        )
    y = top + head_h + 22
    steps: list[str] = []
    right = xs[-1] + heads[-1] / 2
    for step in diagram.steps:
        lines = _lines(step.label)
        a, b = ids.index(step.source), ids.index(step.target)
        if step.kind == "note":
            lo, hi = min(a, b), max(a, b)
            w = max(text_width(s) for s in lines) + 20
            x0 = xs[lo] + 10 if lo == hi else xs[lo] - 20
            x1 = max(x0 + w, xs[hi] + 20)
            h = len(lines) * LINE_HEIGHT + 12
            steps.append(
                f'<rect x="{x0:.1f}" y="{y:.1f}" width="{x1 - x0:.1f}" height="{h:.1f}" rx="4" '
                f'fill="{NOTE_FILL}" stroke="{NOTE_STROKE}"/>'
            )
            steps.append(_text(x0 + 10, y + h / 2, step.label, anchor="start"))
            right = max(right, x1)
            y += h + 14
            continue
        label_h = len(lines) * LINE_HEIGHT
        dash = ' stroke-dasharray="6 4"' if step.dashed else ""
        if a == b:
            x = xs[a]
            steps.append(_text(x + 42, y + label_h / 2, step.label, anchor="start"))
            loop_y = y + label_h + 4
            steps.append(
                f'<path d="M{x:.1f},{loop_y:.1f} h34 v18 h-32" fill="none" stroke="{INK}" stroke-width="1.4"'
                f'{dash} marker-end="url(#arrow)"/>'
            )
            right = max(right, x + 42 + max(text_width(s) for s in lines))
            y = loop_y + 34
            continue
        steps.append(_text((xs[a] + xs[b]) / 2, y + label_h / 2, step.label))
        arrow_y = y + label_h + 6
        steps.append(
            f'<line x1="{xs[a]:.1f}" y1="{arrow_y:.1f}" x2="{xs[b]:.1f}" y2="{arrow_y:.1f}" stroke="{INK}" '
            f'stroke-width="1.4"{dash} marker-end="url(#arrow)"/>'
        )
        y = arrow_y + 20
    bottom = y + 6
    for x, (pid, label) in zip(xs, diagram.participants.items(), strict=True):
        w = heads[ids.index(pid)]
        body.append(
            f'<line x1="{x:.1f}" y1="{top + head_h:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" '
            f'stroke="{GROUP_STROKE}" stroke-dasharray="4 4"/>'
        )
        body.append(
            f'<rect x="{x - w / 2:.1f}" y="{top:.1f}" width="{w:.1f}" height="{head_h:.1f}" rx="6" '
            f'fill="{BOX_FILL}" stroke="{BOX_STROKE}" stroke-width="1.5"/>'
        )
        body.append(_text(x, top + head_h / 2, label, weight="bold"))
    return _svg(right + MARGIN, bottom + MARGIN, body + steps)


# ------------------------------------------------------------------------------------ api


def render(text: str) -> str:
    """The SVG of a diagram description (see the module's docstring for the language)."""
    lines = [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#")
    ]
    if not lines:
        raise DiagramError("the description is empty: its first line names the kind, boxes or sequence")
    (_, kind), rest = lines[0], lines[1:]
    if kind == "boxes":
        return _render_boxes(_parse_boxes(rest))
    if kind == "sequence":
        return _render_sequence(_parse_sequence(rest))
    raise DiagramError(f"line 1: the first line names the kind of diagram, boxes or sequence; got {kind!r}")


#: Where the descriptions live, and where the rendered SVGs go (the docs link them there).
SOURCES = Path(__file__).resolve().parent.parent / "diagrams"
IMAGES = Path(__file__).resolve().parent.parent / "images"


def rendered() -> dict[str, str]:
    """``{"images/NAME.svg": svg}`` for every ``docs/diagrams/NAME.txt``."""
    return {
        f"images/{source.stem}.svg": render(source.read_text()) for source in sorted(SOURCES.glob("*.txt"))
    }


if __name__ == "__main__":  # python -m docs.tools.diagrams: write the SVGs the README shows
    for name, svg in rendered().items():
        (IMAGES.parent / name).write_text(svg)
        print(f"wrote docs/{name}")
