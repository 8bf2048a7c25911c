"""Seeded chaos runs of a bounded job, each judged exactly-once from its committed output.

``python -m chaos --runs N --seed S [--executor spark|local] [--faults kill-slot,...]
[--path record|batch|mixed] [--master M] [--only-seed X]``.

Prints one line per run (its seed, shape, faults and what they did, the verdict, the
time) and a summary; exits non-zero when a run was not exact. A failing run replays
alone with ``--only-seed`` and the same ``--executor``, ``--faults`` and ``--master``.

``--executor local`` runs the same scenarios on the local executor, every subtask a thread
of this process: there is no slot process, Spark task or executor JVM to kill, so the kinds
that kill (kill-slot, kill-supervisor, kill-jvm, finish-kill) are not offered there; its
default is every other kind (user, commit, storage and finishing faults, and bursts).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile

from chaos.suite import CLUSTER_ONLY, FAULT_KINDS, PATHS, SPARK_ONLY, Runner, Summary, make_scenario

DEFAULT_FAULTS = {
    "spark": tuple(k for k in FAULT_KINDS if k not in CLUSTER_ONLY),
    "local": tuple(k for k in FAULT_KINDS if k not in SPARK_ONLY),
}


def _out(line: str) -> None:
    """The report is the command's output (stdout), apart from the logs (stderr)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="how many seeded runs (default 20)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first run; run i has seed S+i")
    parser.add_argument("--only-seed", type=int, help="replay this one run")
    parser.add_argument(
        "--executor",
        choices=("spark", "local"),
        default="spark",
        help="spark (default): slots are Spark tasks; local: every subtask a thread of this "
        f"process, without the kinds that kill a process ({', '.join(SPARK_ONLY)})",
    )
    parser.add_argument(
        "--path",
        choices=PATHS,
        default="mixed",
        help="the job: record (the record API), batch (the Arrow batch path) or mixed "
        "(default: each seed draws one of the two)",
    )
    parser.add_argument(
        "--master",
        help="Spark master (default local[4]; local-cluster[4,1,1024] when --faults has kill-jvm)",
    )
    parser.add_argument(
        "--faults",
        help=f"comma-separated fault kinds from {', '.join(FAULT_KINDS)}, or 'all' "
        "(default: on spark all but kill-jvm; on local all but the kinds that kill; 'all' "
        "means every kind the executor offers)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a run counts as hung")
    parser.add_argument("--workdir", help="where runs write (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the output of exact runs too")
    parser.add_argument("-v", "--verbose", action="store_true", help="chandy's and chaos's logs on stderr")
    args = parser.parse_args(argv)
    local = args.executor == "local"
    if args.faults is None:
        kinds = DEFAULT_FAULTS[args.executor]
    else:
        kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip())
    if kinds == ("all",):
        kinds = DEFAULT_FAULTS["local"] if local else FAULT_KINDS
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; choose from {', '.join(FAULT_KINDS)}")
    killing = [k for k in kinds if k in SPARK_ONLY]
    if local and killing:
        parser.error(f"{killing} kill processes of Spark slots; the local executor runs subtasks as threads")
    args.kinds = kinds
    if local:
        if args.master is not None:
            parser.error("--master is for --executor spark")
        args.master = ""
        return args
    if args.master is None:
        args.master = "local-cluster[4,1,1024]" if "kill-jvm" in kinds else "local[4]"
    if "kill-jvm" in kinds and not args.master.startswith("local-cluster"):
        parser.error(
            f"kill-jvm needs executors in JVMs of their own (--master 'local-cluster[4,1,1024]'); "
            f"on {args.master} the executor is the driver's JVM"
        )
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    seeds = [args.only_seed] if args.only_seed is not None else [args.seed + i for i in range(args.runs)]
    workdir = args.workdir or tempfile.mkdtemp(prefix="chaos-")
    runner = Runner(workdir, args.master, args.timeout, keep=args.keep, executor=args.executor)
    _out(
        f"chaos: {len(seeds)} runs on {runner.master} ({runner.slots} slots), path {args.path}, "
        f"faults {','.join(args.kinds)}"
    )
    results = []
    try:
        for seed in seeds:
            scenario = make_scenario(seed, args.kinds, runner.slots, args.path)
            _out(f"  {scenario.describe()}")
            result = runner.run(scenario)
            results.append(result)
            _out(result.line())
    finally:
        summary = Summary(results)
        _out(summary.line())
        target = f"--master '{args.master}'" if args.master else "--executor local"
        for seed in summary.failed_seeds:
            _out(
                f"  replay: python -m chaos --only-seed {seed} --path {args.path} "
                f"--faults {','.join(args.kinds)} {target}  (output kept in {workdir}/run-{seed})"
            )
        runner.close()
    return 0 if results and not summary.failed_seeds else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
