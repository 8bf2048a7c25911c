"""The side-by-side of ``bench/RESULTS.md`` as an SVG bar chart (``python -m bench report``).

One panel per headline figure of a workload; in each, chandy on the Spark executor and the
best variant of every reference system that measured it (the variant the targets hold
chandy to, so the picture never flatters chandy by showing a reference's weak spot). The
bars are on a logarithmic scale, because the systems differ by up to two orders of
magnitude, and each is labelled with its figure, so nothing has to be read off the axis.
Pure Python, no plotting library: the chart is made wherever the report is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any

from bench.report import METRICS, STEADY, Metric, _best, fmt

#: The figures the chart shows, by ``Metric.key``: one panel each, in this order.
PANELS = [
    "records_per_s",
    "checkpoint_p50_ms",
    "recovery_s",
    "latency_p99_ms",
    "w5_records_per_s",
    "w5_latency_p99_ms",
]
#: The reference systems, in the order their bars appear; the anchors (no Python per record)
#: last, with their steady-state throughput where they have one (``report.STEADY``).
REFERENCES = ["spark_ss", "bytewax", "pyflink", "flink_sql", "pathway"]
CHANDY = "chandy/spark"

FONT = "Helvetica, Arial, sans-serif"
CHAR_WIDTH = 7.0  # an upper bound at 12 px, so labels never run past the edge
LABEL_W = 170
BAR_W = 300
BAR_H = 18
GAP = 6
PANEL_GAP = 26
MARGIN = 20
COLOURS = {
    "chandy": "#3b6fd6",
    "spark_ss": "#e07b39",
    "bytewax": "#5aa469",
    "pyflink": "#8e6cc4",
    "flink_sql": "#b5527f",
    "pathway": "#7a7a7a",
}


@dataclass(frozen=True)
class Bar:
    label: str  # system/variant
    value: float


def _metric(key: str) -> Metric:
    return next(m for m in METRICS if m.key == key)


def panels(summary: dict[str, Any]) -> list[tuple[Metric, list[Bar]]]:
    """Each shown figure with its bars: chandy first, then each reference's best variant (an
    anchor's throughput: its steady state, labelled so); a figure chandy did not measure, or
    no reference did, is left out."""
    found = []
    for key in PANELS:
        metric = _metric(key)
        own = summary.get(CHANDY, {}).get(key)
        if not own:
            continue
        bars = [Bar(CHANDY, own["median"])]
        steady = _metric(STEADY[key]) if key in STEADY else None
        for system in REFERENCES:
            figure = steady if steady and _best(summary, system, steady) else metric
            best = _best(summary, system, figure)
            if best is not None and best[1]:
                bars.append(Bar(best[0] + (" (steady)" if figure is not metric else ""), best[1]))
        if len(bars) > 1:
            found.append((metric, bars))
    return found


def _text(
    x: float, y: float, text: str, anchor: str = "start", weight: str = "normal", size: int = 12
) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-family="{FONT}" font-size="{size}" font-weight="{weight}" '
        f'fill="#1f2933" text-anchor="{anchor}" dominant-baseline="central">{escape(text)}</text>'
    )


def svg(summary: dict[str, Any], title: str) -> str:
    """The chart of a suite summary (``results["summary"]``), titled ``title``."""
    shown = panels(summary)
    if not shown:
        raise ValueError(
            f"no figure to chart: the results hold no {CHANDY} figure that a reference system "
            "also measured; chart a run with chandy and at least one reference system"
        )
    label_w = max(LABEL_W, *(len(bar.label) * CHAR_WIDTH + 12 for _, bars in shown for bar in bars))
    right = MARGIN + label_w + BAR_W
    body = [_text(MARGIN, MARGIN + 8, title, weight="bold", size=15)]
    y = MARGIN + 34
    for metric, bars in shown:
        better = "higher is better" if metric.higher_is_better else "lower is better"
        body.append(_text(MARGIN, y, f"{metric.label} ({metric.unit}, {better})", weight="bold", size=13))
        y += 18
        values = [bar.value for bar in bars]
        low = math.log10(min(values)) - 0.3  # every bar shows, the smallest too
        high = math.log10(max(values))
        for bar in bars:
            share = (math.log10(bar.value) - low) / (high - low) if high > low else 1.0
            length = max(2.0, share * BAR_W)
            system = bar.label.split("/", 1)[0]
            x0 = MARGIN + label_w
            body.append(
                _text(
                    x0 - 8,
                    y + BAR_H / 2,
                    bar.label,
                    anchor="end",
                    weight="bold" if system == "chandy" else "normal",
                )
            )
            body.append(
                f'<rect x="{x0:.1f}" y="{y:.1f}" width="{length:.1f}" height="{BAR_H}" rx="2" '
                f'fill="{COLOURS.get(system, "#9aa0a6")}"/>'
            )
            ratio = ""
            if bar.label != CHANDY:
                chandy = bars[0].value
                advantage = chandy / bar.value if metric.higher_is_better else bar.value / chandy
                better, factor = ("better", advantage) if advantage >= 1 else ("worse", 1 / advantage)
                shown_factor = f"{factor:.2g}" if factor < 10 else f"{factor:,.0f}"
                ratio = f"  (chandy {shown_factor}x {better})"
            value = f"{fmt(bar.value)} {metric.unit}{ratio}"
            body.append(_text(x0 + length + 6, y + BAR_H / 2, value, size=11))
            right = max(right, x0 + length + 6 + len(value) * CHAR_WIDTH * 11 / 12)
            y += BAR_H + GAP
        y += PANEL_GAP - GAP
    width = right + MARGIN
    height = y + MARGIN - PANEL_GAP + 12
    body.append(
        _text(
            MARGIN,
            height - MARGIN,
            "Medians, log scale; each reference by its best variant. Every figure: bench/RESULTS.md.",
            size=11,
        )
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}">\n<rect width="100%" height="100%" fill="white"/>\n'
        + "\n".join(body)
        + "\n</svg>\n"
    )
