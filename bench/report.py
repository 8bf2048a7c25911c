"""Summaries of a suite run: medians with min/max, chandy's ratio to every reference,
the targets, and the Markdown of ``bench/RESULTS.md``.

Every ratio is oriented so that above 1 means chandy is better: throughput is
chandy / reference, a time or a size is reference / chandy. Against a system measured
in several variants the targets use the reference's best variant, so a target is never
met by picking a reference's weak spot.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Metric:
    workload: str
    name: str
    label: str
    unit: str
    higher_is_better: bool
    #: Grows with the record count (W4's keys), so a ratio compares it per record: PyFlink
    #: holds a tenth of the keys of the others.
    per_record: bool = False
    #: The figure's name in a summary, where two workloads report a figure of the same
    #: name (W5's throughput and latency): ``w5_records_per_s``. W1-W4 keep the bare name.
    summary_key: str = ""
    #: Whether chandy's ratio to a reference means anything (a count of checkpoints, or the
    #: in-flight bytes a system's buffers happen to hold, is a fact, not a score).
    compared: bool = True
    #: The reference's figure a ratio compares it with, where that is another workload's:
    #: W1v (chandy's batch path) against the reference's W1 (the same records and keys; only
    #: chandy runs W1v). Empty: the reference's figure of the same name.
    against: str = ""

    @property
    def key(self) -> str:
        return self.summary_key or self.name


METRICS = [
    Metric("w1", "records_per_s", "W1 throughput", "records/s", True),
    #: The anchors' rate with start-up, submission and JIT warm-up excluded (two job sizes in
    #: one process, ``bench/systems/steady.py``); where a reference has it, chandy's
    #: throughput ratios use it (``STEADY``), not the reference's ``records_per_s``.
    Metric(
        "w1",
        "steady_records_per_s",
        "W1 steady-state throughput",
        "records/s",
        True,
        summary_key="w1_steady_records_per_s",
        compared=False,
    ),
    Metric("w1", "checkpoint_p50_ms", "W1 checkpoint p50", "ms", False),
    Metric("w1", "checkpoint_max_ms", "W1 checkpoint max", "ms", False),
    Metric("w2", "recovery_s", "W2 recovery", "s", False),
    Metric("w3", "latency_p50_ms", "W3 latency p50", "ms", False),
    Metric("w3", "latency_p99_ms", "W3 latency p99", "ms", False),
    Metric("w4", "checkpoint_duration_ms", "W4 checkpoint duration", "ms", False, per_record=True),
    Metric("w4", "checkpoint_size_bytes", "W4 checkpoint size", "bytes", False, per_record=True),
    Metric(
        "w4r",
        "load_records_per_s",
        "W4r load throughput",
        "records/s",
        True,
        summary_key="w4r_load_records_per_s",
    ),
    Metric(
        "w4r",
        "update_records_per_s",
        "W4r updates processed",
        "records/s",
        True,
        per_record=True,
        summary_key="w4r_update_records_per_s",
    ),
    Metric(
        "w4r", "checkpoint_p50_ms", "W4r checkpoint p50", "ms", False, summary_key="w4r_checkpoint_p50_ms"
    ),
    Metric(
        "w4r", "checkpoint_max_ms", "W4r checkpoint max", "ms", False, summary_key="w4r_checkpoint_max_ms"
    ),
    Metric(
        "w4r",
        "uploaded_p50_bytes",
        "W4r uploaded per checkpoint p50",
        "bytes",
        False,
        per_record=True,
        summary_key="w4r_uploaded_p50_bytes",
    ),
    Metric(
        "w4r",
        "uploaded_mean_bytes",
        "W4r uploaded per checkpoint mean",
        "bytes",
        False,
        per_record=True,
        summary_key="w4r_uploaded_mean_bytes",
    ),
    Metric(
        "w4r",
        "uploaded_max_bytes",
        "W4r uploaded per checkpoint max",
        "bytes",
        False,
        per_record=True,
        summary_key="w4r_uploaded_max_bytes",
    ),
    Metric(
        "w4r",
        "full_size_bytes",
        "W4r full state size",
        "bytes",
        False,
        per_record=True,
        summary_key="w4r_full_size_bytes",
    ),
    Metric(
        "w4r",
        "uploaded_fraction_p50",
        "W4r uploaded p50 / full size",
        "fraction",
        False,
        summary_key="w4r_uploaded_fraction_p50",
    ),
    Metric("w5", "records_per_s", "W5 throughput", "records/s", True, summary_key="w5_records_per_s"),
    Metric(
        "w5",
        "steady_records_per_s",
        "W5 steady-state throughput",
        "records/s",
        True,
        summary_key="w5_steady_records_per_s",
        compared=False,
    ),
    Metric("w5", "latency_p50_ms", "W5 latency p50", "ms", False, summary_key="w5_latency_p50_ms"),
    Metric("w5", "latency_p99_ms", "W5 latency p99", "ms", False, summary_key="w5_latency_p99_ms"),
    Metric(
        "w5",
        "emitted_latency_p50_ms",
        "W5 latency p50 from the emitted watermark",
        "ms",
        False,
        summary_key="w5_emitted_latency_p50_ms",
    ),
    Metric(
        "w5",
        "emitted_latency_p99_ms",
        "W5 latency p99 from the emitted watermark",
        "ms",
        False,
        summary_key="w5_emitted_latency_p99_ms",
    ),
    Metric("w5", "checkpoint_p50_ms", "W5 checkpoint p50", "ms", False, summary_key="w5_checkpoint_p50_ms"),
    Metric(
        "w5",
        "task_cpu_us_per_record",
        "W5 task CPU per record",
        "µs",
        False,
        summary_key="w5_task_cpu_us_per_record",
    ),
    Metric(
        "w6", "records_per_s", "W6 throughput at the sink", "records/s", True, summary_key="w6_records_per_s"
    ),
    Metric(
        "w6",
        "checkpoint_p50_ms",
        "W6 checkpoint p50 under backpressure",
        "ms",
        False,
        summary_key="w6_checkpoint_p50_ms",
    ),
    Metric(
        "w6",
        "checkpoint_p99_ms",
        "W6 checkpoint p99 under backpressure",
        "ms",
        False,
        summary_key="w6_checkpoint_p99_ms",
    ),
    Metric(
        "w6",
        "checkpoint_max_ms",
        "W6 checkpoint max under backpressure",
        "ms",
        False,
        summary_key="w6_checkpoint_max_ms",
    ),
    Metric(
        "w6",
        "checkpoints_under_backpressure",
        "W6 checkpoints completed under backpressure",
        "",
        True,
        summary_key="w6_checkpoints_under_backpressure",
        compared=False,
    ),
    Metric(
        "w6",
        "persisted_p50_bytes",
        "W6 persisted in-flight data per checkpoint p50",
        "bytes",
        False,
        summary_key="w6_persisted_p50_bytes",
        compared=False,
    ),
    Metric(
        "w6",
        "persisted_max_bytes",
        "W6 persisted in-flight data per checkpoint max",
        "bytes",
        False,
        summary_key="w6_persisted_max_bytes",
        compared=False,
    ),
    Metric(
        "w6",
        "source_behind_s",
        "W6 source behind its schedule at its end",
        "s",
        False,
        summary_key="w6_source_behind_s",
        compared=False,
    ),
    Metric(
        "w1v",
        "records_per_s",
        "W1v throughput (batch path)",
        "records/s",
        True,
        summary_key="w1v_records_per_s",
        against="records_per_s",
    ),
    Metric(
        "w1v", "checkpoint_p50_ms", "W1v checkpoint p50", "ms", False, summary_key="w1v_checkpoint_p50_ms"
    ),
    Metric(
        "w1v", "checkpoint_max_ms", "W1v checkpoint max", "ms", False, summary_key="w1v_checkpoint_max_ms"
    ),
    Metric(
        "w5v",
        "records_per_s",
        "W5v throughput (batch path)",
        "records/s",
        True,
        summary_key="w5v_records_per_s",
        against="w5_records_per_s",
    ),
    Metric(
        "w5v",
        "latency_p50_ms",
        "W5v latency p50 (batch path)",
        "ms",
        False,
        summary_key="w5v_latency_p50_ms",
        against="w5_latency_p50_ms",
    ),
    Metric(
        "w5v",
        "latency_p99_ms",
        "W5v latency p99 (batch path)",
        "ms",
        False,
        summary_key="w5v_latency_p99_ms",
        against="w5_latency_p99_ms",
    ),
    Metric(
        "w5v",
        "task_cpu_us_per_record",
        "W5v task CPU per record",
        "µs",
        False,
        summary_key="w5v_task_cpu_us_per_record",
        against="w5_task_cpu_us_per_record",
    ),
    Metric(
        "w5v", "checkpoint_p50_ms", "W5v checkpoint p50", "ms", False, summary_key="w5v_checkpoint_p50_ms"
    ),
    Metric(
        "w3v",
        "latency_p50_ms",
        "W3v latency p50 (batch path)",
        "ms",
        False,
        summary_key="w3v_latency_p50_ms",
        against="latency_p50_ms",
    ),
    Metric(
        "w3v",
        "latency_p99_ms",
        "W3v latency p99 (batch path)",
        "ms",
        False,
        summary_key="w3v_latency_p99_ms",
        against="latency_p99_ms",
    ),
]
#: W5's throughput, the figure its targets are about.
W5_THROUGHPUT = next(m for m in METRICS if m.key == "w5_records_per_s")
#: A reference's throughput figure -> its steady-state figure, which every ratio against
#: that figure uses where the reference reports it (Flink SQL, Pathway): W1 and W1v against
#: the steady W1, W5 (and any workload whose ``against`` is W5's throughput) the steady W5.
STEADY = {"records_per_s": "w1_steady_records_per_s", "w5_records_per_s": "w5_steady_records_per_s"}


def _spread(values: list[float]) -> dict[str, Any]:
    """A figure over several runs: its median, min, max and how many runs it has."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system/variant: every metric's median, min and max over the successful runs
    (with checkpoints; W1 without them only feeds the overhead), the W1 checkpoint
    overhead, W2's exactness, and the errors of failed runs."""
    summary: dict[str, Any] = {}
    for system, variant in dict.fromkeys((r["system"], r["variant"]) for r in rows):
        mine = [r for r in rows if (r["system"], r["variant"]) == (system, variant)]
        part: dict[str, Any] = {
            "errors": sorted({f"{r['workload']}: {r['error']}" for r in mine if not r.get("ok")})
        }
        for metric in METRICS:
            values = [
                r[metric.name]
                for r in mine
                if r.get("ok")
                and r["workload"] == metric.workload
                and r["checkpoint_interval_ms"]
                and r.get(metric.name) is not None
            ]
            if values:
                part[metric.key] = _spread(values)
        for workload, prefix in OVERHEAD_WORKLOADS.items():
            base = [
                r["records_per_s"]
                for r in mine
                if r.get("ok") and r["workload"] == workload and not r["checkpoint_interval_ms"]
            ]
            if base and f"{prefix}records_per_s" in part:
                part[f"{prefix}records_per_s_without_checkpoints"] = _spread(base)
                part.update(_checkpoint_overhead(mine, part, workload, prefix))
        exact = [r["exact"] for r in mine if r.get("ok") and r["workload"] == "w2"]
        if exact:
            part["w2_exact_runs"] = f"{sum(exact)} of {len(exact)}"
        for windowed_workload in ("w5", "w5v"):
            windowed = [r for r in mine if r["workload"] == windowed_workload]
            if windowed:  # a W5 (W5v) run whose results are not exact fails, so ok means exact
                part[f"{windowed_workload}_exact_runs"] = (
                    f"{sum(1 for r in windowed if r.get('ok'))} of {len(windowed)}"
                )
        backpressured = [r for r in mine if r.get("ok") and r["workload"] == "w6"]
        if backpressured:
            part["w6_unaligned_checkpoints"] = _unaligned_count(backpressured)
        first = [
            r["records_per_s_incl_first_batch"]
            for r in mine
            if r.get("ok")
            and r["workload"] == "w1"
            and r["checkpoint_interval_ms"]
            and r.get("records_per_s_incl_first_batch")
        ]
        if first:
            part["records_per_s_incl_first_batch"] = _spread(first)
        records = {r["workload"]: r.get("records", r.get("keys")) for r in mine if r.get("ok")}
        part["records"] = records
        summary[f"{system}/{variant}"] = part
    if UNALIGNED in summary and ALIGNED in summary:
        summary[UNALIGNED].update(_unaligned_overhead(rows))
    return summary


#: Workloads measured with checkpoints and without (``suite.WITH_NO_CHECKPOINT_BASELINE``), and
#: the prefix of their figures' names in a summary: W1's checkpoint overhead is
#: ``checkpoint_overhead``, W1v's ``w1v_checkpoint_overhead``.
OVERHEAD_WORKLOADS = {"w1": "", "w1v": "w1v_"}

#: chandy's variants with unaligned checkpoints and without (the same executor otherwise).
UNALIGNED, ALIGNED = "chandy/unaligned", "chandy/spark"


def _unaligned_count(rows: list[dict[str, Any]]) -> str:
    """How many of the checkpoints W6 measured were unaligned, over every run."""
    if any(r.get("unaligned_checkpoints") is None for r in rows):
        return "not reported"
    unaligned = sum(r["unaligned_checkpoints"] for r in rows)
    return f"{unaligned} of {sum(r['checkpoints_under_backpressure'] for r in rows)}"


def _unaligned_overhead(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """W1 (no backpressure) with unaligned checkpoints against aligned ones, both every
    second: the median over runs of each run's throughput lost to unaligned checkpoints
    (the two cases of a run are measured one after the other), and the extra task CPU per
    record."""

    def of(run: int, key: str, metric: str) -> list[float]:
        return [
            r[metric]
            for r in rows
            if r.get("ok")
            and r["workload"] == "w1"
            and r["checkpoint_interval_ms"]
            and r.get("run", 0) == run
            and f"{r['system']}/{r['variant']}" == key
            and r.get(metric) is not None
        ]

    found: dict[str, Any] = {}
    for metric, name in (
        ("records_per_s", "w1_unaligned_overhead"),
        ("task_cpu_us_per_record", "w1_unaligned_cpu_overhead"),
    ):
        pairs = []
        for run in sorted({r.get("run", 0) for r in rows}):
            unaligned, aligned = of(run, UNALIGNED, metric), of(run, ALIGNED, metric)
            if len(unaligned) == 1 and len(aligned) == 1:
                pairs.append((unaligned[0], aligned[0]))
        if not pairs:
            continue
        if metric == "records_per_s":  # throughput lost
            changes = [1 - u / a for u, a in pairs]
        else:  # CPU added
            changes = [u / a - 1 for u, a in pairs]
        found[name] = statistics.median(changes)
        found[f"{name}_runs"] = _spread(changes)
    return found


def paired_runs(rows: list[dict[str, Any]], metric: str, workload: str = "w1") -> list[tuple[float, float]]:
    """(with checkpoints, without) of ``metric`` for every run that has both cases of
    ``workload`` (W1, or W1v).

    The two cases of a run follow each other, so a pair saw the same machine; a drift of
    the machine's speed over the whole comparison (see ``machine_loop_ms``) then moves
    both figures of a pair alike instead of one median."""
    pairs = []
    for run in sorted({r.get("run", 0) for r in rows}):
        w1 = [
            r
            for r in rows
            if r.get("ok")
            and r["workload"] == workload
            and r.get("run", 0) == run
            and r.get(metric) is not None
        ]
        checked = [r[metric] for r in w1 if r["checkpoint_interval_ms"]]
        unchecked = [r[metric] for r in w1 if not r["checkpoint_interval_ms"]]
        if len(checked) == 1 and len(unchecked) == 1:
            pairs.append((checked[0], unchecked[0]))
    return pairs


def _checkpoint_overhead(
    rows: list[dict[str, Any]], part: dict[str, Any], workload: str = "w1", prefix: str = ""
) -> dict[str, Any]:
    """W1's (or W1v's) checkpoint overhead: the median over runs of each run's throughput
    lost to checkpoints (the ratio of the two medians where runs cannot be paired), and,
    where the system reports it, the extra CPU time per record its task processes spent.
    The figures' names start with ``prefix``."""
    found: dict[str, Any] = {}
    pairs = paired_runs(rows, "records_per_s", workload)
    if pairs:
        losses = [1 - checked / unchecked for checked, unchecked in pairs]
        found[f"{prefix}checkpoint_overhead"] = statistics.median(losses)
        found[f"{prefix}checkpoint_overhead_runs"] = _spread(losses)
    else:
        found[f"{prefix}checkpoint_overhead"] = (
            1
            - part[f"{prefix}records_per_s"]["median"]
            / part[f"{prefix}records_per_s_without_checkpoints"]["median"]
        )
    cpu = paired_runs(rows, "task_cpu_us_per_record", workload)
    if cpu:
        found[f"{prefix}task_cpu_us_per_record"] = _spread([c for c, _ in cpu])
        found[f"{prefix}task_cpu_us_per_record_without_checkpoints"] = _spread([u for _, u in cpu])
        found[f"{prefix}checkpoint_cpu_overhead"] = statistics.median(c / u - 1 for c, u in cpu)
    return found


def analysis(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run's rows say: the summary, the ratios and the targets."""
    summary = summarize(rows)
    return {"summary": summary, "ratios": ratios(summary), "targets": targets(summary)}


def ratios(summary: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """For each chandy variant, each reference variant, each metric: chandy's advantage."""
    result: dict[str, dict[str, dict[str, float]]] = {}
    for mine, own in summary.items():
        if not mine.startswith("chandy/"):
            continue
        result[mine] = {}
        for reference, theirs in summary.items():
            if reference.startswith("chandy/"):
                continue
            row = {}
            for metric in METRICS:
                if not metric.compared or not _like_for_like(metric, mine, reference):
                    continue
                a, b = _comparable(own, metric), _comparable(theirs, _steady_or(theirs, metric))
                if a and b:
                    row[metric.key] = a / b if metric.higher_is_better else b / a
            result[mine][reference] = row
    return result


#: Workloads whose ratios compare only like with like: W6's aligned variants with each
#: other and its unaligned ones with each other.
LIKE_FOR_LIKE = {
    "w6": {("chandy/spark", "pyflink/thread"), ("chandy/unaligned", "pyflink/unaligned")},
}


def _reference_metric(metric: Metric) -> Metric:
    """The reference's metric ``metric`` is compared with (``Metric.against``)."""
    if not metric.against:
        return metric
    return next(m for m in METRICS if m.key == metric.against)


def _steady_or(part: dict[str, Any], metric: Metric) -> Metric:
    """The reference's metric a ratio of ``metric`` uses: its steady-state throughput where it
    reports one (``STEADY``), else ``_reference_metric``."""
    reference = _reference_metric(metric)
    steady = STEADY.get(reference.key)
    if steady and part.get(steady):
        return next(m for m in METRICS if m.key == steady)
    return reference


def _like_for_like(metric: Metric, mine: str, reference: str) -> bool:
    pairs = LIKE_FOR_LIKE.get(metric.workload)
    return pairs is None or (mine, reference) in pairs


#: Variants of a reference that keep per-key state in Python, record by record, as chandy's
#: W1 does. Spark's ``groupBy().agg()`` is a JVM aggregation that emits one row per key
#: and micro-batch instead of a running sum per record; it is also a target, as the
#: reference's best variant, and this is the like-for-like comparison beside it.
PYTHON_STATE_VARIANTS = {"spark_ss": ("pandas_state", "twsip")}


def _comparable(part: dict[str, Any], metric: Metric) -> float | None:
    """The median of ``metric``, per record where it grows with the record count."""
    figure = part.get(metric.key)
    if not figure or not figure["median"]:
        return None
    if not metric.per_record:
        return figure["median"]
    records = part["records"].get(metric.workload)
    return figure["median"] / records if records else None


def _best(
    summary: dict[str, Any], system: str, metric: Metric, variants: tuple[str, ...] | None = None
) -> tuple[str, float] | None:
    """The reference's best variant for ``metric`` (its most favourable figure), among
    ``variants`` if given. Where a variant measured its steady state (the anchors), that is
    its figure, as in the ratios, and the variant's name says so: a target is held to the
    strongest fair figure of the reference."""
    found = []
    for key, part in summary.items():
        if not key.startswith(f"{system}/") or metric.key not in part:
            continue
        if variants is not None and key.split("/", 1)[1] not in variants:
            continue
        used = _steady_or(part, metric)
        label = f"{key}, steady state" if used is not metric else key
        found.append((label, part[used.key]["median"]))
    if not found:
        return None
    return (max if metric.higher_is_better else min)(found, key=lambda kv: kv[1])


def targets(summary: dict[str, Any], chandy: str = "chandy/spark") -> list[dict[str, Any]]:
    """The issue's targets for chandy on the Spark executor, each with its measured figure."""
    own = summary.get(chandy, {})
    throughput = METRICS[0]
    checks: list[dict[str, Any]] = []
    for system, factor in (("spark_ss", 3.0), ("bytewax", 3.0), ("pyflink", 50.0)):
        best = _best(summary, system, throughput)
        if best and "records_per_s" in own:
            ratio = own["records_per_s"]["median"] / best[1]
            checks.append(
                {
                    "target": f"W1 >= {factor:g}x {system} (best variant: {best[0]})",
                    "measured": f"{ratio:.2f}x",
                    "met": ratio >= factor,
                }
            )
        like = (
            _best(summary, system, throughput, PYTHON_STATE_VARIANTS[system])
            if system in PYTHON_STATE_VARIANTS
            else None
        )
        if like and "records_per_s" in own:
            ratio = own["records_per_s"]["median"] / like[1]
            checks.append(
                {
                    "target": f"W1 >= {factor:g}x {system} with Python state, like for "
                    f"like (best: {like[0]})",
                    "measured": f"{ratio:.2f}x",
                    "met": ratio >= factor,
                }
            )

    def limit(name: str, label: str, bound: float, unit: str) -> None:
        if name in own:
            value = own[name]["median"]
            checks.append(
                {
                    "target": f"{label} <= {bound:g} {unit}",
                    "measured": f"{value:.3g} {unit}",
                    "met": value <= bound,
                }
            )

    if "checkpoint_overhead" in own:
        overhead = own["checkpoint_overhead"]
        checks.append(
            {
                "target": "W1 checkpoint overhead <= 5 %",
                "measured": f"{overhead:.1%}",
                "met": overhead <= 0.05,
            }
        )
    limit("checkpoint_p50_ms", "W1 checkpoint p50", 50, "ms")
    limit("latency_p99_ms", "W3 latency p99", 3, "ms")
    limit("recovery_s", "W2 recovery (raised exception)", 1, "s")
    checks += w5_targets(summary, own)
    checks += batch_targets(summary, own)
    checks += rocksdb_targets(summary)
    checks += unaligned_targets(summary)
    return checks


#: Issue 16's aims: under backpressure an unaligned checkpoint takes at most a second, and
#: without backpressure unaligned checkpoints cost at most 5 % of W1's throughput.
W6_MAX_UNALIGNED_P99_MS = 1000
W1_MAX_UNALIGNED_OVERHEAD = 0.05


def unaligned_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """W6: chandy's unaligned checkpoint p99 under backpressure <= 1 s, and its aligned one
    above that (else the run built no backlog worth overtaking, and the first figure proves
    nothing); W1: unaligned against aligned checkpoints, <= 5 % throughput lost."""
    checks: list[dict[str, Any]] = []
    unaligned, aligned = summary.get(UNALIGNED, {}), summary.get(ALIGNED, {})
    bound = W6_MAX_UNALIGNED_P99_MS
    for variant, part, label, within in (
        (UNALIGNED, unaligned, f"W6 unaligned checkpoint p99 under backpressure <= {bound} ms", True),
        (ALIGNED, aligned, f"W6 aligned checkpoints wait for the backlog: p99 > {bound} ms", False),
    ):
        if "w6_checkpoint_p99_ms" in part:
            p99 = part["w6_checkpoint_p99_ms"]["median"]
            kinds = f" ({part['w6_unaligned_checkpoints']} unaligned)" if within else ""
            checks.append(
                {
                    "target": f"{label} ({variant})",
                    "measured": f"{p99:.0f} ms{kinds}",
                    "met": (p99 <= bound) == within,
                }
            )
    if "w1_unaligned_overhead" in unaligned:
        overhead = unaligned["w1_unaligned_overhead"]
        checks.append(
            {
                "target": f"W1 unaligned checkpoints cost <= {W1_MAX_UNALIGNED_OVERHEAD:.0%} "
                f"throughput against aligned ({UNALIGNED} vs {ALIGNED})",
                "measured": f"{overhead:.1%}",
                "met": overhead <= W1_MAX_UNALIGNED_OVERHEAD,
            }
        )
    return checks


#: The batch path's aims: W1v at least 3x Spark's best W1 (its JVM
#: ``groupBy().agg()``) and 30 M records/s, checkpoints costing at most 2 % of it, and W3's
#: latency at 1,000 rows/s within 5 ms at p99.
W1V_RATIO_TARGETS = (("spark_ss", 3.0),)
W1V_MIN_RECORDS_PER_S = 30_000_000
W1V_MAX_CHECKPOINT_OVERHEAD = 0.02
W3V_MAX_LATENCY_P99_MS = 5.0
#: W5v (W5 on the batch path): at least 3x Flink SQL's W5 in its steady state (about
#: 1.08 M records/s measured, so at least 3.3 M records/s) and 3x Spark's.
W5V_RATIO_TARGETS = (("flink_sql", 3.0), ("spark_ss", 3.0))
W5V_MIN_RECORDS_PER_S = 3_300_000


def batch_targets(summary: dict[str, Any], own: dict[str, Any]) -> list[dict[str, Any]]:
    """W1v (W1 on chandy's batch path) against the references' W1, its own rate and
    checkpoint overhead; W5v against the references' W5 and its own rate; W3v's p99 latency."""
    checks: list[dict[str, Any]] = []
    if "w1v_records_per_s" in own:
        rate = own["w1v_records_per_s"]["median"]
        for system, factor in W1V_RATIO_TARGETS:
            best = _best(summary, system, METRICS[0])
            if best:
                checks.append(
                    {
                        "target": f"W1v >= {factor:g}x {system}'s W1 (best variant: {best[0]})",
                        "measured": f"{rate / best[1]:.2f}x",
                        "met": rate / best[1] >= factor,
                    }
                )
        checks.append(
            {
                "target": f"W1v >= {W1V_MIN_RECORDS_PER_S / 1e6:g} M records/s",
                "measured": f"{rate / 1e6:.2f} M records/s",
                "met": rate >= W1V_MIN_RECORDS_PER_S,
            }
        )
    if "w1v_checkpoint_overhead" in own:
        overhead = own["w1v_checkpoint_overhead"]
        checks.append(
            {
                "target": f"W1v checkpoint overhead <= {W1V_MAX_CHECKPOINT_OVERHEAD:.0%}",
                "measured": f"{overhead:.1%}",
                "met": overhead <= W1V_MAX_CHECKPOINT_OVERHEAD,
            }
        )
    if "w5v_records_per_s" in own:
        rate = own["w5v_records_per_s"]["median"]
        for system, factor in W5V_RATIO_TARGETS:
            best = _best(summary, system, W5_THROUGHPUT)
            if best:
                checks.append(
                    {
                        "target": f"W5v >= {factor:g}x {system}'s W5 (best variant: {best[0]})",
                        "measured": f"{rate / best[1]:.2f}x",
                        "met": rate / best[1] >= factor,
                    }
                )
        checks.append(
            {
                "target": f"W5v >= {W5V_MIN_RECORDS_PER_S / 1e6:g} M records/s",
                "measured": f"{rate / 1e6:.2f} M records/s",
                "met": rate >= W5V_MIN_RECORDS_PER_S,
            }
        )
    if "w3v_latency_p99_ms" in own:
        p99 = own["w3v_latency_p99_ms"]["median"]
        checks.append(
            {
                "target": f"W3v latency p99 <= {W3V_MAX_LATENCY_P99_MS:g} ms",
                "measured": f"{p99:.3g} ms",
                "met": p99 <= W3V_MAX_LATENCY_P99_MS,
            }
        )
    return checks


#: Issue 15's aims for chandy on RocksDB.
W4R_MAX_CHECKPOINT_MS = 200
W4R_MAX_UPLOADED_FRACTION = 0.05
ROCKSDB_W1_MIN_OF_HEAP = 0.5


def rocksdb_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """W4r on chandy's RocksDB backend: an incremental checkpoint takes at most 200 ms and
    uploads at most 5 % of the full state (medians over the update phase's checkpoints);
    and W1 on RocksDB runs at least half as fast as on the heap (``chandy/rocksdb`` and
    ``chandy/spark`` are the same executor)."""
    checks: list[dict[str, Any]] = []
    own = summary.get("chandy/rocksdb", {})
    if "w4r_checkpoint_p50_ms" in own:
        p50 = own["w4r_checkpoint_p50_ms"]["median"]
        checks.append(
            {
                "target": f"W4r incremental checkpoint p50 <= {W4R_MAX_CHECKPOINT_MS} ms (chandy/rocksdb)",
                "measured": f"{p50:.0f} ms",
                "met": p50 <= W4R_MAX_CHECKPOINT_MS,
            }
        )
    if "w4r_uploaded_fraction_p50" in own:
        fraction = own["w4r_uploaded_fraction_p50"]["median"]
        checks.append(
            {
                "target": "W4r uploaded per checkpoint (p50) <= "
                f"{W4R_MAX_UPLOADED_FRACTION:.0%} of the full size",
                "measured": f"{fraction:.2%}",
                "met": fraction <= W4R_MAX_UPLOADED_FRACTION,
            }
        )
    heap = summary.get("chandy/spark", {})
    if "records_per_s" in own and "records_per_s" in heap:
        ratio = own["records_per_s"]["median"] / heap["records_per_s"]["median"]
        checks.append(
            {
                "target": f"W1 on RocksDB >= {ROCKSDB_W1_MIN_OF_HEAP:g}x the heap's "
                "(chandy/rocksdb / chandy/spark)",
                "measured": f"{ratio:.2f}x",
                "met": ratio >= ROCKSDB_W1_MIN_OF_HEAP,
            }
        )
    return checks


#: Issue 12's W5 targets: chandy's own rate, and its ratio to a reference's best variant.
W5_MIN_RECORDS_PER_S = 1_500_000
W5_RATIO_TARGETS = (("bytewax", 3.0), ("pyflink", 50.0))


def w5_targets(summary: dict[str, Any], own: dict[str, Any]) -> list[dict[str, Any]]:
    """W5 (keyed tumbling event-time window) throughput: at least 1.5 M records/s, at least
    3x Bytewax and 50x PyFlink (each against its best variant)."""
    key = W5_THROUGHPUT.key
    if key not in own:
        return []
    rate = own[key]["median"]
    checks = [
        {
            "target": f"W5 >= {W5_MIN_RECORDS_PER_S / 1e6:g} M records/s",
            "measured": f"{rate / 1e6:.2f} M records/s",
            "met": rate >= W5_MIN_RECORDS_PER_S,
        }
    ]
    for system, factor in W5_RATIO_TARGETS:
        best = _best(summary, system, W5_THROUGHPUT)
        if best:
            ratio = rate / best[1]
            checks.append(
                {
                    "target": f"W5 >= {factor:g}x {system} (best variant: {best[0]})",
                    "measured": f"{ratio:.2f}x",
                    "met": ratio >= factor,
                }
            )
    return checks


def combine(runs: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One report from several suite runs: every workload's rows come from the last run
    that measured it, whole, so each ratio and target still compares systems measured
    in one run. Used when one workload was measured again (after a fix to its
    harness, say) without rerunning the others."""
    chosen: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, results in runs:
        for workload in dict.fromkeys(r["workload"] for r in results["rows"]):
            chosen[workload] = (name, results)
    rows = [
        r for workload, (_, results) in chosen.items() for r in results["rows"] if r["workload"] == workload
    ]
    latest = runs[-1][1]
    sources = []
    for name, results in runs:
        workloads = [w for w, (n, _) in chosen.items() if n == name]
        if workloads:
            sources.append(
                {
                    "file": name,
                    "date": results["date"],
                    "command": results["command"],
                    "workloads": workloads,
                    "runs": results["runs"],
                }
            )
    loads = [r["load_avg_1m_before"] for r in rows if "load_avg_1m_before" in r]
    machine = {
        **latest["machine"],
        "load_avg_1m_before": runs[0][1]["machine"]["load_avg_1m_before"],
        "load_avg_1m_min": min(loads),
        "load_avg_1m_max": max(loads),
    }
    versions: dict[str, str] = {}
    for _, results in runs:
        versions.update(results["versions"])
    return {
        **latest,
        "sources": sources,
        "machine": machine,
        "versions": versions,
        **analysis(rows),
        "rows": rows,
    }


# ---------------------------------------------------------------------- text


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float | int):
        if unit == "bytes":
            return f"{value / 1e6:,.1f} MB" if abs(value) >= 1e6 else f"{value / 1e3:,.1f} kB"
        if unit == "fraction":
            return f"{value:.2%}"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def table(rows: list[list[str]], header: list[str]) -> str:
    """A Markdown table (also readable as plain text)."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in rows
    ]
    return "\n".join(lines)


def figures_table(summary: dict[str, Any]) -> str:
    rows = []
    for key, part in summary.items():
        for metric in METRICS:
            m = part.get(metric.key)
            if m:
                rows.append(
                    [
                        key,
                        metric.label,
                        f"{fmt(m['median'], metric.unit)} {metric.unit}"
                        if metric.unit not in ("bytes", "fraction")
                        else fmt(m["median"], metric.unit),
                        fmt(m["min"], metric.unit),
                        fmt(m["max"], metric.unit),
                        str(m["runs"]),
                        fmt(part["records"].get(metric.workload)),
                    ]
                )
        for workload, prefix in OVERHEAD_WORKLOADS.items():
            rows += _overhead_rows(key, part, workload, prefix)
        if "records_per_s_incl_first_batch" in part:
            rows.append(
                _throughput_row(
                    key,
                    part,
                    "records_per_s_incl_first_batch",
                    "W1 throughput incl. Spark's first micro-batch",
                )
            )
        if "w2_exact_runs" in part:
            rows.append([key, "W2 every key's sum exact", part["w2_exact_runs"], "", "", "", ""])
        if "w5_exact_runs" in part:
            rows.append([key, "W5 every window's sums exact, once", part["w5_exact_runs"], "", "", "", ""])
        if "w5v_exact_runs" in part:
            rows.append([key, "W5v every window's sums exact, once", part["w5v_exact_runs"], "", "", "", ""])
        if "w6_unaligned_checkpoints" in part:
            rows.append(
                [
                    key,
                    "W6 checkpoints under backpressure that were unaligned",
                    part["w6_unaligned_checkpoints"],
                    "",
                    "",
                    "",
                    fmt(part["records"].get("w6")),
                ]
            )
        for name, label in (
            ("w1_unaligned_overhead", "W1 throughput lost to unaligned checkpoints (vs aligned)"),
            ("w1_unaligned_cpu_overhead", "W1 task CPU added by unaligned checkpoints (vs aligned)"),
        ):
            if name in part:
                rows.append(_share_row(key, part, name, label))
    return table(rows, ["system/variant", "figure", "median", "min", "max", "runs", "records"])


def _overhead_rows(key: str, part: dict[str, Any], workload: str, prefix: str) -> list[list[str]]:
    """W1's (or W1v's) throughput without checkpoints, checkpoint overhead and task CPU per
    record with and without checkpoints."""
    rows: list[list[str]] = []
    w = workload[0].upper() + workload[1:]  # W1, W1v
    if f"{prefix}checkpoint_overhead" in part:
        rows.append(
            _throughput_row(
                key,
                part,
                f"{prefix}records_per_s_without_checkpoints",
                f"{w} throughput without checkpoints",
                workload,
            )
        )
        rows.append(
            _share_row(key, part, f"{prefix}checkpoint_overhead", f"{w} checkpoint overhead", workload)
        )
    if f"{prefix}checkpoint_cpu_overhead" in part:
        for name, label in (
            (f"{prefix}task_cpu_us_per_record", f"{w} task CPU per record"),
            (
                f"{prefix}task_cpu_us_per_record_without_checkpoints",
                f"{w} task CPU per record without checkpoints",
            ),
        ):
            figure = part[name]
            rows.append(
                [
                    key,
                    label,
                    f"{figure['median']:.3f} µs",
                    f"{figure['min']:.3f}",
                    f"{figure['max']:.3f}",
                    str(figure["runs"]),
                    fmt(part["records"].get(workload)),
                ]
            )
        overhead = part[f"{prefix}checkpoint_cpu_overhead"]
        rows.append([key, f"{w} checkpoint CPU overhead", f"{overhead:.1%}", "", "", "", ""])
    return rows


def _share_row(key: str, part: dict[str, Any], name: str, label: str, workload: str = "w1") -> list[str]:
    """A W1 figure that is a share (an overhead): its median over runs, with the spread of
    the runs' own figures (``<name>_runs``) where the runs could be paired."""
    spread = part.get(f"{name}_runs")
    return [
        key,
        label,
        f"{part[name]:.1%}",
        f"{spread['min']:.1%}" if spread else "",
        f"{spread['max']:.1%}" if spread else "",
        str(spread["runs"]) if spread else "",
        fmt(part["records"].get(workload)),
    ]


def _throughput_row(key: str, part: dict[str, Any], name: str, label: str, workload: str = "w1") -> list[str]:
    figure = part[name]
    return [
        key,
        label,
        f"{fmt(figure['median'])} records/s",
        fmt(figure["min"]),
        fmt(figure["max"]),
        str(figure["runs"]),
        fmt(part["records"].get(workload)),
    ]


def ratios_table(summary: dict[str, Any]) -> str:
    rows = []
    for mine, references in ratios(summary).items():
        for reference, row in references.items():
            for metric in METRICS:
                if metric.key in row:
                    label = metric.label + (" per key" if metric.per_record else "")
                    against = _steady_or(summary[reference], metric)
                    if against.key != metric.key:
                        label += f" vs the reference's {against.label}"
                    rows.append([mine, reference, label, f"{row[metric.key]:.2f}x"])
    if not rows:
        return "(no reference system measured)"
    return table(rows, ["chandy", "reference", "figure", "chandy's advantage"])


def errors_table(summary: dict[str, Any]) -> str:
    rows = [[key, error] for key, part in summary.items() for error in part["errors"]]
    return table(rows, ["system/variant", "could not run"]) if rows else "(none)"


def targets_table(summary: dict[str, Any]) -> str:
    checks = targets(summary)
    rows = [[c["target"], c["measured"], "met" if c["met"] else "**not met**"] for c in checks]
    return table(rows, ["target (chandy, Spark executor)", "measured", ""]) if rows else "(none)"


#: The line of ``bench/RESULTS.md`` below which the text is written by hand (a run measured
#: apart from the combined tables): ``python -m bench report`` keeps it as it is.
HAND_WRITTEN = "<!-- Written by hand below this line: python -m bench report keeps it. -->"


def hand_written(previous: str) -> str:
    """What a report keeps of the Markdown it replaces: the marker and everything below it."""
    at = previous.find(HAND_WRITTEN)
    return "" if at < 0 else "\n" + previous[at:].rstrip("\n") + "\n"


def markdown(results: dict[str, Any], chart: str | None = None) -> str:
    """``bench/RESULTS.md``: where and how it was measured, the chart of the side-by-side
    (``chart``, a path relative to the Markdown) and then every figure."""
    machine = results["machine"]
    summary = results["summary"]
    versions = ", ".join(f"{k} {v}" for k, v in results["versions"].items())
    if results.get("sources"):
        made = (
            "Combined from several runs, each workload from one run: "
            + "; ".join(
                f"{', '.join(s['workloads']).upper()} from `{s['command']}` ({s['date']}, `{s['file']}`, "
                f"{s.get('runs', results['runs'])} run(s) of each case)"
                for s in results["sources"]
            )
            + ". The runs of a command interleaved; "
        )
    else:
        made = f"`{results['command']}`: {results['runs']} run(s) of each case, interleaved; "
    if "--quick" in results["command"]:
        made = (
            "**A `--quick` sanity pass: runs this short measure start-up, not the "
            "systems; the figures and targets below mean nothing. Compare full runs "
            "only.** "
        ) + made
    return (
        "\n\n".join(
            [
                f"# Benchmark results, {results['date']}",
                made + f"parallelism {results['parallelism']}, checkpoints (commits, snapshots) every "
                "1 s to local disk. Medians with min and max. Ratios: above 1 means chandy is "
                "better (throughput chandy / reference; times and sizes reference / chandy).",
                f"Machine: {machine['cpus']} CPUs, {machine['platform']}, Python "
                f"{machine['python']}, {machine['java']}. Load average (1 min) before the suite "
                f"{machine['load_avg_1m_before']:.2f}, after {machine['load_avg_1m_after']:.2f}; "
                f"per run it ranged {machine['load_avg_1m_min']:.2f}-{machine['load_avg_1m_max']:.2f}."
                + _machine_speed(results["rows"]),
                f"Versions: {versions}.",
                *(
                    [
                        "## Side by side",
                        f"![chandy (Spark executor) beside each reference's best variant]({chart})",
                    ]
                    if chart
                    else []
                ),
                "## Targets",
                targets_table(summary),
                "## Figures",
                figures_table(summary),
                "## chandy's ratio to each reference",
                ratios_table(summary),
                "## What could not run, and why",
                errors_table(summary),
                "## How to read these figures",
                NOTES,
            ]
        )
        + "\n"
    )


def _machine_speed(rows: list[dict[str, Any]]) -> str:
    loops = [r["machine_loop_ms"] for r in rows if r.get("machine_loop_ms")]
    if not loops:
        return ""
    return (
        f" A fixed Python loop, timed before each run, took {min(loops):.0f}-"
        f"{max(loops):.0f} ms (median {statistics.median(loops):.0f} ms): the machine's "
        "speed over the comparison."
    )


NOTES = """\
- **W1 throughput** is records divided by the time from the first record to the last at
  the sink, so start-up is excluded for every system. Spark Structured Streaming's
  figure also leaves out its first micro-batch (class loading, code generation and the
  Python workers' start make it several times slower than the next ones); the figure
  with it is listed beside it.
- **Spark's `groupby` variant is not the same work.** `groupBy().agg()` runs in the JVM
  and emits one row per key and micro-batch; chandy, Bytewax, PyFlink and Spark's
  `pandas_state` / `twsip` variants keep per-key state in Python and emit a running sum
  for every record. The targets hold chandy to the reference's best variant anyway, and
  list the like-for-like ratio beside it.
- **Record counts differ where speeds do.** Rates and percentiles do not depend on the
  count once a run lasts seconds and spans several checkpoints. In W1 chandy reads 10
  times the records and Spark's `groupby` 30 times, in batches of 12 M rows (2 M take
  either well under a second, and smaller batches finish before Spark's 1 s trigger,
  which then throttles it: the runner counts such batches);
  PyFlink, about 100 times slower per record, reads a hundredth in W1 and a tenth in
  W2 and W4. Every figure names its record count.
- **Checkpoint overhead** is the median over runs of the throughput each run lost to
  checkpoints against the run without them that followed it, so a change of the
  machine's speed during the comparison does not enter it; min and max are over runs.
  For chandy, the CPU time its task processes spent per record (sources, keyed
  function and sinks, from the sinks' first record to their last) is listed with and
  without checkpoints: it does not move with the machine's other tenants.
- **W4's ratios are per key**: PyFlink holds a tenth of the keys. Its duration per key
  flatters PyFlink somewhat (a checkpoint's fixed costs are spread over fewer keys).
  Spark's state store compresses its files (LZ4) and W4's 100-byte values are mostly
  one repeated byte, so Spark's size is far below the others'; chandy, like Flink by
  default, writes checkpoints uncompressed.
- **W5** (keyed tumbling event-time window) is the same events everywhere
  (`bench/systems/w5_events.py`), every (key, window) sum checked at the sink (a run that
  is not exact fails). Its latency counts from the moment the sources' largest timestamps
  let the watermark pass a window's end (when the last source got there; in Bytewax,
  whose watermark is per key, the key's own source) to each result at the sink; so it
  holds the periodic watermark (200 ms in chandy and PyFlink) and, for Spark, the whole
  micro-batch that emits the window. chandy's latency from its emitted watermark, without
  that wait, is listed beside it. `bench/README.md` says how each system is measured.
- **W6** (checkpoints under backpressure, `bench/systems/w6_records.py`) is W1's job between
  a source paced to 10,000 records/s and a sink that sleeps to hold half of it, for 40 s;
  the figures are over the checkpoints triggered while the sources were held back. An
  aligned barrier waits behind every record the buffers between source and sink hold, so
  its duration follows the backlog in flight (chandy: credits per channel x records per
  batch; Flink: its network buffers); an unaligned barrier overtakes it, and the backlog
  becomes the checkpoint's persisted in-flight data. Ratios compare aligned with aligned and
  unaligned with unaligned. `chandy/unaligned` is the Spark executor with
  `execution.checkpointing.unaligned.enabled: true` and an aligned-checkpoint timeout of 0;
  its W1 beside `chandy/spark`'s gives what unaligned checkpoints cost without backpressure.
- **W1v and W3v** are W1 and W3 on chandy's batch path: the same records and
  keys as Arrow record batches (`ArrowNumberSequenceSource` -> `map_batches` adding the key
  -> `key_by("key").running_sum("value")`, one output row per input row as W1's running sum;
  W3v's rows from a rate-limited `ArrowDataGeneratorSource`), into a sink that takes whole
  batches. Only chandy runs them: their ratios compare with each reference's W1 and W3
  (Spark's `groupBy().agg()` is already vectorised, in its JVM). W1v's records are ten times
  W1's and more, so that a run lasts seconds at its rate.
- **Flink SQL and Pathway are anchors, not Python APIs**: no Python runs per record in
  them (Flink SQL's keyed `SUM` and windows are generated Java; Pathway's `groupby().reduce()`
  and `windowby()` run in Rust, its `subject` source calls Python per record, its `csv` source
  none). They run W1 and W5 (Flink SQL W3 too). Their `records_per_s` is a fresh process's first job (for
  Flink SQL the job's own runtime in the JobManager, whose blackhole sink has no first or
  last record); their steady-state throughput is `(N2 - N1) / (t2 - t1)` over two more jobs of
  N2 = 2 N1 and N1 records in the same, warm process, which leaves start-up, submission and
  JIT warm-up out. chandy's ratios to them use the steady state (the line names it).
  `flink_sql/per_record` emits an update per record, as chandy does; `flink_sql/minibatch`
  buffers and pre-aggregates per key (one update per key and batch), and `pathway` emits each
  key's sum once per commit (100 ms), `pathway/csv` once for its whole input.
- **W2 recovery** is from the raised exception to the first record processed after the
  restore: chandy and PyFlink restart inside the running job; Spark restarts the query
  from its checkpoint location, as a supervisor would (local mode retries no task);
  Bytewax resumes a new execution from its recovery store.
"""
