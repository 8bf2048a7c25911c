"""Seeded chaos runs: one bounded job per run, faults at random moments, output judged.

A run is fully described by its seed (with the fault kinds allowed and the number of
slots the session offers): the seed draws the job's shape (parallelism 2-4,
checkpoint interval 100-500 ms, records, keys, pace, event-time window, the sizes of the
source splits, the state backend and aligned or unaligned checkpoints; last, with
``path="mixed"``, the record or the batch job) and the fault schedule (which faults,
at how many seconds after the job's slots came up). The same
scenarios run on Spark or on the local executor (``executor``: every subtask a thread of
this process, where there is no process of a slot to kill). Replaying a seed replays
that schedule (with the same version of this module: a new fault kind changes what a
seed draws); where a fault lands in the job (which record, which checkpoint) still
depends on timing, which is the point of random moments.

Fault kinds:

``kill-slot``       SIGKILL of a live slot process (the one running the tasks; its supervisor
                    forks a new one)
``kill-supervisor`` SIGKILL of a slot's supervisor, the Spark task itself (Spark sees the
                    task fail; the stage is resubmitted)
``kill-jvm``        SIGKILL of a Spark executor JVM with its slots (``local-cluster`` only)
``user-raise``      a keyed function raises once: the running sum (on a record) or the
                    event-time branch's timer function (in a timer, possibly after others
                    of the same watermark fired; or, armed for the end, in one of the timers
                    the end of input's watermark fires)
``commit-raise``    a sink's committer (Parquet FileSink, DeltaSink, or the event-time
                    branch's Parquet FileSink) raises once
``storage-raise``   the next checkpoint write (a state file, or ``_metadata``) raises
``storage-hang``    the next checkpoint write (a state file, or ``_metadata``) hangs past the
                    checkpoint timeout, then completes
``storage-partial`` the next state-file write leaves half a file and raises
``finish-raise``    a source subtask reaching a moment of its end (its last record, its final
                    checkpoint's snapshot, that checkpoint's completion notice, its end once
                    that completed: :mod:`chaos.finishing`) raises there, or makes another
                    running source subtask raise at once
``finish-kill``     the same moments, a SIGKILL of the finishing subtask's slot process or of
                    another slot's (Spark only)
``finish-storage``  a storage raise or hang (``_metadata`` or a state file) that waits for the
                    first source split to end (a subtask's final checkpoint) or for all of
                    them (the job's final checkpoint)
``burst``           not a fault: lets a fault follow the one before within 0.1-1.5 s, and
                    then as soon as the job is failing over (within 3 s), so it strikes
                    during the recovery
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chandy import StreamExecutionEnvironment
from chandy.connectors.number_sequence import NumberSequenceSource
from chandy.messages.status import JobStatus
from chandy.storage.snapshot_key import KEY_FILE_NAME
from chaos import batch_job, job
from chaos.faultyfs import SITE_METADATA, SITE_STATE, ArmedFault, FaultPlan
from chaos.finishing import SITE_FINISH, finish_params, finish_storage_params, uneven_sizes
from chaos.verify import SinkVerdict, verify_run

log = logging.getLogger("chaos")

FAULT_KINDS = (
    "kill-slot",
    "kill-supervisor",
    "kill-jvm",
    "user-raise",
    "commit-raise",
    "storage-raise",
    "storage-hang",
    "storage-partial",
    "finish-raise",
    "finish-kill",
    "finish-storage",
    "burst",
)
#: Kinds that need executors in JVMs of their own.
CLUSTER_ONLY = ("kill-jvm",)
#: Kinds the driver strikes itself, at their moment in the schedule.
KILL_KINDS = ("kill-slot", "kill-supervisor", "kill-jvm")
#: Kinds that kill processes of a slot: the local executor runs subtasks as threads.
SPARK_ONLY = (*KILL_KINDS, "finish-kill")
#: Keyed state backends a seed draws from, and the configuration of each (RocksDB gets a
#: local directory inside its run's directory).
BACKENDS: dict[str, dict[str, Any]] = {
    "heap": {},
    "rocksdb": {"state.backend.type": "rocksdb", "execution.checkpointing.incremental": True},
}
#: Processes of a slot, as the executor lists them.
PID_KEYS = ("pid", "supervisor_pid", "jvm_pid")
#: Armed faults wait for their site in the job; the others the driver does itself.
ARMED_KINDS = tuple(k for k in FAULT_KINDS if k not in (*KILL_KINDS, "burst"))
#: Armed faults that a finishing subtask claims, and another party may strike.
FINISH_KINDS = ("finish-raise", "finish-kill")

#: How long after a job's end its checkpoint files may take to be deleted.
LEFTOVER_GRACE_S = 5.0
#: How long a burst's follow-up waits for the job to be failing over before it strikes anyway.
RECOVERY_WAIT_S = 3.0
#: A checkpoint that takes longer than this expires; a hanging write hangs past it.
CHECKPOINT_TIMEOUT_S = 3.0
HANG_BEYOND_TIMEOUT_S = 1.5
#: The jobs a run may build: the record path's, the batch path's, or either, drawn per seed.
PATHS = ("record", "batch", "mixed")
#: How many subtasks a run may have on the local executor (as many as on Spark's local[4]).
LOCAL_SLOTS = 4


@dataclass
class Fault:
    kind: str
    at_s: float
    #: Seeded choices made when it strikes (which slot, which sink, which file).
    choice: float
    outcome: str = "pending"
    #: A burst's follow-up: strikes once the job is failing over (or 3 s after ``at_s``).
    in_recovery: bool = False
    #: The job's status when the driver armed it (armed kinds strike later, in the job).
    armed_while: str = ""

    def describe(self) -> str:
        return f"{self.kind}@{self.at_s:.2f}s{'+recovery' if self.in_recovery else ''}"


@dataclass
class Scenario:
    seed: int
    parallelism: int
    interval_ms: int
    records: int
    keys: int
    duration_s: float
    restart_delay_ms: int
    faults: list[Fault]
    #: The event-time branch's tumbling window.
    window_ms: int = 500
    #: The source splits' sizes (adding to ``records``), or empty for even splits.
    sizes: tuple[int, ...] = ()
    #: ``heap`` or ``rocksdb`` (incremental checkpoints): see :data:`BACKENDS`.
    backend: str = "heap"
    unaligned: bool = False
    #: ``record`` (:mod:`chaos.job`) or ``batch`` (:mod:`chaos.batch_job`, the Arrow path).
    path: str = "record"

    @property
    def split_sizes(self) -> list[int]:
        if self.sizes:
            return list(self.sizes)
        splits = NumberSequenceSource(0, self.records - 1).create_splits(self.parallelism)
        return [split.end - split.position + 1 for split in splits]

    @property
    def rate_per_subtask(self) -> float:
        """Every subtask's pace: the longest split takes ``duration_s``, shorter ones end sooner."""
        return max(self.split_sizes) / self.duration_s

    def shape(self) -> str:
        return (
            f"{self.path} p={self.parallelism} ckpt={self.interval_ms}ms"
            f"{' unaligned' if self.unaligned else ''} "
            f"{self.backend} n={self.records} splits={'/'.join(map(str, self.split_sizes))}"
        )

    def describe(self) -> str:
        return (
            f"seed={self.seed} {self.shape()} keys={self.keys} window={self.window_ms}ms "
            f"faults=[{', '.join(f.describe() for f in self.faults)}]"
        )


def make_scenario(seed: int, kinds: tuple[str, ...], max_parallelism: int, path: str = "record") -> Scenario:
    """The run of ``seed``: its job's shape and its fault schedule, on the record or the
    batch ``path`` (``mixed``: drawn last from the seed, so that every other draw of a
    seed is what it is on either path)."""
    if path not in PATHS:
        raise ValueError(f"chaos: path {path!r} is none of {', '.join(PATHS)}")
    rng = random.Random(seed)
    parallelism = rng.randint(2, max(2, min(4, max_parallelism)))
    duration = rng.uniform(5.0, 8.0)
    strikes = [k for k in kinds if k != "burst"]
    faults: list[Fault] = []
    if strikes:
        at = rng.uniform(0.2, 0.5 * duration)
        burst = False
        for _ in range(rng.randint(1, 3)):
            faults.append(Fault(rng.choice(strikes), round(at, 2), rng.random(), in_recovery=burst))
            burst = "burst" in kinds and rng.random() < 0.4
            at += rng.uniform(0.1, 1.5) if burst else rng.uniform(1.0, 0.4 * duration)
            if at > 0.9 * duration:
                break
    interval_ms = rng.randint(100, 500)
    records = rng.randint(20_000, 50_000)
    keys = rng.choice((20, 50, 100, 200))
    restart_delay_ms = rng.choice((0, 0, 100, 500))
    window_ms = rng.choice((250, 500, 1000))
    sizes = tuple(uneven_sizes(rng, records, parallelism))
    backend = rng.choice(tuple(BACKENDS))
    unaligned = rng.random() < 0.4
    if path == "mixed":
        path = "batch" if rng.random() < 0.5 else "record"
    return Scenario(
        seed=seed,
        parallelism=parallelism,
        interval_ms=interval_ms,
        records=records,
        keys=keys,
        duration_s=round(duration, 2),
        restart_delay_ms=restart_delay_ms,
        faults=faults,
        window_ms=window_ms,
        sizes=sizes,
        backend=backend,
        unaligned=unaligned,
        path=path,
    )


@dataclass
class RunResult:
    scenario: Scenario
    seconds: float
    status: str
    restarts: int
    verdicts: list[SinkVerdict] = field(default_factory=list)
    error: str | None = None
    hung: bool = False
    #: Checkpoint files still there after the job FINISHED: a leak, not an exactness failure
    #: (without retained checkpoints a finished job should leave its directory empty).
    leftovers: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.status == JobStatus.FINISHED.name and all(v.exact for v in self.verdicts)

    @property
    def fired(self) -> list[Fault]:
        return [f for f in self.scenario.faults if f.outcome.startswith("fired")]

    @property
    def finished(self) -> bool:
        return self.status == JobStatus.FINISHED.name

    @property
    def lost(self) -> int:
        """Records (event-time windows, for the ``windows`` sink) missing from a sink of a job
        that FINISHED (a job that did not finish leaves the rest unwritten; that is counted
        as the run's failure, not as losses)."""
        return max((v.lost for v in self.verdicts), default=0) if self.finished else 0

    @property
    def duplicated(self) -> int:
        """Rows beyond one per record (per event-time window, for the ``windows`` sink)."""
        return max((v.duplicated for v in self.verdicts), default=0)

    def line(self) -> str:
        faults = ", ".join(f"{f.describe()} {f.outcome}" for f in self.scenario.faults) or "none"
        verdict = "exact" if self.exact else "NOT EXACT"
        text = (
            f"seed={self.scenario.seed} {self.scenario.shape()}: {faults} | restarts={self.restarts} "
            f"{self.status} {verdict} {self.seconds:.1f}s"
        )
        if self.hung:
            text += " HUNG"
        if self.leftovers:
            text += f" (left {len(self.leftovers)} checkpoint files: {', '.join(self.leftovers[:3])})"
        if self.error:
            text += f" error: {self.error}"
        for v in self.verdicts:
            text += "".join(f"\n    {v.sink}: {p}" for p in v.problems)
        return text


class Runner:
    """Runs scenarios one after another on one Spark session (starting one costs seconds):
    ``session`` when given (a test's), else one on ``master`` that :meth:`close` stops. With
    ``executor="local"`` every job runs on the local executor (threads of this process), and
    there is no session."""

    def __init__(
        self,
        workdir: str,
        master: str,
        timeout_s: float,
        keep: bool = False,
        session: Any = None,
        executor: str = "spark",
    ) -> None:
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.keep = keep
        self.executor = executor
        #: Never kill this one: it is the driver (and, on local[N], the only executor).
        self.driver_jvm_pid: int | None = None
        self._owns_session = session is None and executor == "spark"
        self.session = None
        if executor == "local":
            self.master = "the local executor"
            self.slots = LOCAL_SLOTS
            return
        self.session = start_session(master) if session is None else session
        self.master = self.session.sparkContext.master
        gateway = getattr(self.session.sparkContext, "_gateway", None)
        proc = getattr(gateway, "proc", None)
        self.driver_jvm_pid = proc.pid if proc is not None else None
        self.slots = _total_slots(self.session)

    def run(self, scenario: Scenario) -> RunResult:
        run_dir = os.path.join(self.workdir, f"run-{scenario.seed}")
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        plan = FaultPlan.for_root(run_dir)
        env = StreamExecutionEnvironment.get_execution_environment(executor=self.executor)
        env.set_parallelism(scenario.parallelism)
        env.enable_checkpointing(scenario.interval_ms)
        env.configure(BACKENDS[scenario.backend])
        if scenario.backend == "rocksdb":
            env.configure({"state.backend.rocksdb.localdir": os.path.join(run_dir, "rocksdb")})
        if scenario.unaligned:
            env.configure({"execution.checkpointing.unaligned.enabled": True})
        env.configure(
            {
                "execution.checkpointing.dir": f"faulty://{run_dir}/checkpoints",
                "execution.checkpointing.timeout": f"{int(CHECKPOINT_TIMEOUT_S * 1000)} ms",
                # keyed state goes to files (where storage faults strike), not into _metadata
                "execution.checkpointing.data-inline-threshold": 256,
                "restart-strategy.fixed-delay.delay": f"{scenario.restart_delay_ms} ms",
                "chandy.spark.slot-wait": "60 s",
            }
        )
        (batch_job.build if scenario.path == "batch" else job.build)(
            env,
            run_dir,
            plan.directory,
            scenario.split_sizes,
            scenario.keys,
            scenario.rate_per_subtask,
            scenario.window_ms,
        )
        started = time.monotonic()
        client = env.execute_async(f"chaos seed {scenario.seed}")
        error: str | None = None
        hung = False
        stop_watching = threading.Event()
        watcher = threading.Thread(
            target=self._strike_finish_kills,
            args=(client, plan, stop_watching),
            name=f"chaos-finish-kills-{scenario.seed}",
            daemon=True,
        )
        if any(f.kind == "finish-kill" for f in scenario.faults):
            watcher.start()
        try:
            self._inject(client, plan, scenario, self._wait_running(client, started))
        except BaseException:
            stop_watching.set()
            client.cancel()  # a defect of the chaos driver itself (or Ctrl-C): no job left behind
            raise
        try:
            remaining = max(1.0, started + self.timeout_s - time.monotonic())
            client.get_job_execution_result(timeout=remaining)
        except TimeoutError:
            hung = True
            error = f"no end within {self.timeout_s:.0f} s (status {client.get_job_status().name})"
            client.cancel()
            try:
                client.get_job_execution_result(timeout=30)
            except Exception as exc:  # noqa: BLE001 - the run failed already; note why it ended
                log.info("hung run %d ended after cancel: %s", scenario.seed, exc)
        except Exception as exc:  # noqa: BLE001 - a failed job is a finding, reported per run
            error = _first_line(exc)
        seconds = time.monotonic() - started
        stop_watching.set()
        if watcher.is_alive():
            watcher.join()
        for name in plan.disarm_all():
            self._fault_named(scenario, name).outcome = "not happened (job ended first)"
        for i, fault in enumerate(scenario.faults):
            if fault.kind in ARMED_KINDS and fault.outcome == "armed":
                fault.outcome = _armed_outcome(fault, plan.fired(_fault_name(i, fault)))
        status = client.get_job_status().name
        verdicts = verify_run(run_dir, scenario.split_sizes, scenario.keys, scenario.window_ms, scenario.path)
        result = RunResult(scenario, seconds, status, client.restarts, verdicts, error, hung)
        deadline = time.monotonic() + LEFTOVER_GRACE_S  # deletes run off the JobMaster thread
        while result.finished and time.monotonic() < deadline:
            result.leftovers = _files_under(os.path.join(run_dir, "checkpoints"))
            if not result.leftovers:
                break
            time.sleep(0.1)
        if result.exact and not self.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        return result

    def _wait_running(self, client: Any, started: float) -> float:
        """When the job's slots are up (on the local executor: when it runs): the origin of
        the fault schedule."""
        while not client.is_done() and time.monotonic() < started + self.timeout_s:
            if client.get_job_status() == JobStatus.RUNNING and (
                self.executor == "local" or client.get_task_slots()
            ):
                break
            time.sleep(0.02)
        return time.monotonic()

    def _inject(self, client: Any, plan: FaultPlan, scenario: Scenario, t0: float) -> None:
        stale: set[int] = set()  # processes of stages a kill already failed
        restarts = client.restarts  # failovers begun before the previous fault
        for i, fault in enumerate(scenario.faults):
            while time.monotonic() < t0 + fault.at_s and not client.is_done():
                time.sleep(0.01)
            if fault.in_recovery:  # wait for the failover the previous fault starts
                while (
                    time.monotonic() < t0 + fault.at_s + RECOVERY_WAIT_S
                    and not client.is_done()
                    and client.restarts == restarts
                    and _phase(client.get_job_status(), client.get_task_slots()) == "RUNNING"
                ):
                    time.sleep(0.002)
            restarts = client.restarts
            if client.is_done():
                fault.outcome = "not happened (job ended first)"
                continue
            if fault.kind in ARMED_KINDS:
                plan.arm(_armed(_fault_name(i, fault), fault, scenario.parallelism))
                fault.outcome = "armed"
                fault.armed_while = _phase(client.get_job_status(), client.get_task_slots())
            else:
                fault.outcome = self._kill(client, fault, stale)
                fault.outcome = fault.outcome.replace(")", f", at {time.monotonic() - t0:.2f}s)", 1)
            log.info("seed %d: %s %s", scenario.seed, fault.describe(), fault.outcome)

    def _kill(self, client: Any, fault: Fault, stale: set[int]) -> str:
        """SIGKILL a live slot process (or its supervisor, or its executor JVM). While the job
        fails over after an earlier kill, and for a burst's follow-up, the victim is a
        process that came up since (a re-forked slot process, a new stage's Spark task, also
        one not registered with the driver yet), not a survivor: a failure during recovery.
        There may be none for a moment: wait up to 5 s for one."""
        deadline = time.monotonic() + 5.0
        gone: set[int] = set()
        key = {"kill-jvm": "jvm_pid", "kill-supervisor": "supervisor_pid"}.get(fault.kind, "pid")
        while not client.is_done():
            listed = client.get_task_slots()
            phase = _phase(client.get_job_status(), listed)
            # a burst's follow-up strikes what the failover brought up, even once it runs again
            recovering = phase != "RUNNING" or fault.in_recovery
            skip = gone | stale if recovering else gone
            victims = [
                (f"slot {s['index']}", s[key])
                for s in listed
                if s["alive"] and s.get(key) and s[key] not in skip and s[key] != self.driver_jvm_pid
            ]
            workers = self._python_workers()
            if recovering and key != "jvm_pid":
                # the new stage's workers, also those that have not registered with the driver yet
                registered = {s[k] for s in listed for k in PID_KEYS if s.get(k)}
                victims += [("unregistered", pid) for pid in sorted(workers - registered - skip)]
            if victims:
                stale.update(workers, (s[k] for s in listed for k in PID_KEYS if s.get(k)))
                where, pid = victims[int(fault.choice * len(victims))]
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    gone.add(pid)  # died since the driver last heard from it
                    continue
                return f"fired ({where}, pid {pid}, job {phase})"
            if time.monotonic() > deadline:
                return "not happened (no live slot for 5 s)"
            time.sleep(0.02)
        return "not happened (job ended first)"

    def _strike_finish_kills(self, client: Any, plan: FaultPlan, stop: threading.Event) -> None:
        """Takes the ``finish-kill`` triggers a finishing subtask posts (it waits in its moment
        meanwhile) and SIGKILLs its slot process (``self``) or another live slot's (``other``)."""
        while not stop.is_set():
            taken = plan.take_trigger("kill")
            if taken is None:
                stop.wait(0.003)
                continue
            fault, trigger = taken
            poster = trigger["pid"]
            live = [s for s in client.get_task_slots() if s["alive"] and s.get("pid")]
            if fault.params["victim"] == "self":
                victims = [s for s in live if s["pid"] == poster]
            else:
                victims = [s for s in live if s["pid"] != poster and s["pid"] != self.driver_jvm_pid]
            if not victims:
                plan.record_fired(fault, gave_up=f"no live slot process to kill ({fault.params['victim']})")
                continue
            slot = victims[int(fault.params["choice"] * len(victims))]
            struck_by = f"SIGKILL of slot {slot['index']} (pid {slot['pid']})"
            plan.record_fired(fault, struck=True, struck_by=struck_by)
            try:
                os.kill(slot["pid"], signal.SIGKILL)
            except ProcessLookupError:
                plan.record_fired(fault, struck=False, gave_up=f"slot {slot['index']} was gone")

    def _python_workers(self) -> set[int]:
        """This session's PySpark worker processes (forked by a ``pyspark.daemon`` that
        descends from our driver JVM; other sessions on the machine are never touched)."""
        if self.driver_jvm_pid is None:
            return set()
        table: dict[int, tuple[int, str]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
                    with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                        table[int(entry)] = (ppid, cmdline.read().decode(errors="replace"))
                except (OSError, IndexError, ValueError):
                    continue  # gone meanwhile
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        ours, todo = set(), [self.driver_jvm_pid]
        while todo:
            pid = todo.pop()
            for child in children.get(pid, []):
                if child not in ours:
                    ours.add(child)
                    todo.append(child)

        def is_daemon(pid: int) -> bool:
            return "pyspark.daemon" in table.get(pid, (0, ""))[1]

        return {pid for pid in ours if is_daemon(pid) and is_daemon(table[pid][0])}

    @staticmethod
    def _fault_named(scenario: Scenario, name: str) -> Fault:
        index = int(name.split("-", 1)[0])
        return scenario.faults[index]

    def close(self) -> None:
        if self._owns_session and self.session is not None:
            self.session.stop()


def _phase(status: JobStatus, slots: list[dict[str, Any]]) -> str:
    """The job's status, or ``RECOVERING`` while it is RUNNING but a slot is lost: a slot
    process re-forked in place is replaced in well under a second, and the job may pass
    through RESTARTING in milliseconds."""
    if status == JobStatus.RUNNING and any(not s["alive"] for s in slots):
        return "RECOVERING"
    return status.name


def _fault_name(index: int, fault: Fault) -> str:
    return f"{index}-{fault.kind}"


def _armed(name: str, fault: Fault, parallelism: int) -> ArmedFault:
    if fault.kind == "user-raise":
        function = "sum" if fault.choice < 0.4 else "timers" if fault.choice < 0.75 else "timers-at-end"
        return ArmedFault(name, "user", "raise", params={"function": function})
    if fault.kind == "commit-raise":
        sink = "file" if fault.choice < 1 / 3 else "windows" if fault.choice < 2 / 3 else "delta"
        return ArmedFault(name, "commit", "raise", params={"sink": sink})
    if fault.kind == "storage-raise":
        return ArmedFault(name, SITE_METADATA if fault.choice < 0.3 else SITE_STATE, "raise")
    if fault.kind == "storage-hang":
        site = SITE_METADATA if fault.choice < 0.25 else SITE_STATE
        return ArmedFault(name, site, "hang", hang_s=CHECKPOINT_TIMEOUT_S + HANG_BEYOND_TIMEOUT_S)
    if fault.kind == "storage-partial":
        return ArmedFault(name, SITE_STATE, "partial")
    if fault.kind in FINISH_KINDS:
        action = "raise" if fault.kind == "finish-raise" else "kill"
        return ArmedFault(name, SITE_FINISH, action, params=finish_params(fault.choice))
    if fault.kind == "finish-storage":
        drawn = finish_storage_params(fault.choice)
        params = {"after_ended": 1 if drawn["after"] == "first" else parallelism}
        hang_s = CHECKPOINT_TIMEOUT_S + HANG_BEYOND_TIMEOUT_S if drawn["action"] == "hang" else 0.0
        return ArmedFault(name, drawn["site"], drawn["action"], hang_s=hang_s, params=params)
    raise ValueError(f"{fault.kind} is not an armed fault")


def _armed_outcome(fault: Fault, fired: dict[str, Any] | None) -> str:
    """What an armed fault did, from what its plan recorded."""
    if fired is None:
        return "not happened"
    if fault.kind in FINISH_KINDS:
        moment = f"{fired['params']['moment']}, victim {fired['params']['victim']}"
        if not fired.get("struck"):
            why = fired.get("gave_up", "no strike")
            return f"not happened ({moment}: claimed by {fired['record']}; {why})"
        return f"fired ({moment}: {fired['record']}; {fired['struck_by']}, armed while {fault.armed_while})"
    where = _where(fired)
    if fault.kind == "finish-storage":
        where += f", after {fired['params']['after_ended']} split(s) ended"
    return f"fired ({where}, armed while {fault.armed_while})"


def _where(fired: dict[str, Any]) -> str:
    if "path" in fired:
        return f"{fired['site']} {Path(fired['path']).parent.name}/{Path(fired['path']).name[:8]}"
    if "subtask" in fired:
        return f"subtask {fired['subtask']}, {fired['record']}"
    return f"{fired['params'].get('sink', fired['site'])} commit"


def _files_under(directory: str) -> list[str]:
    """Files below ``directory``, as ``chk-N/name`` (empty directories do not count). The
    snapshot key chandy generates in the storage root is kept on purpose (later restores
    verify with it): not a leftover."""
    found = []
    for root, _, files in os.walk(directory):
        kept = [name for name in sorted(files) if not (root == directory and name == KEY_FILE_NAME)]
        found += [os.path.join(os.path.basename(root), name[:8]) for name in kept]
    return sorted(found)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def start_session(master: str) -> Any:
    """A Spark session for every run; slots must import :mod:`chaos` (for ``faulty://``
    and the job's functions), so the repository root goes on their ``PYTHONPATH``."""
    from chandy.runtime.spark.session import get_or_create_session

    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    logging.getLogger("py4j").setLevel(logging.WARNING)
    session = get_or_create_session(4, {"spark.master": master, "spark.ui.showConsoleProgress": "false"})
    session.sparkContext.setLogLevel("OFF")
    return session


def _total_slots(session: Any) -> int:
    from chandy.runtime.spark.session import wait_for_slots

    return wait_for_slots(session, 4, 60)


@dataclass
class Summary:
    results: list[RunResult]

    def line(self) -> str:
        runs = len(self.results)
        exact = sum(r.exact for r in self.results)
        faults = sum(len(r.fired) for r in self.results)
        missed = sum(len(r.scenario.faults) - len(r.fired) for r in self.results)
        lost = sum(r.lost for r in self.results)
        duplicated = sum(r.duplicated for r in self.results)
        hung = sum(r.hung for r in self.results)
        text = f"chaos: {exact}/{runs} runs exact, {faults} faults, {lost} lost, {duplicated} duplicated"
        by_kind = Counter(f.kind for r in self.results for f in r.fired)
        extra = [", ".join(f"{n} {kind}" for kind, n in sorted(by_kind.items()))] if by_kind else []
        if missed:
            extra.append(f"{missed} faults did not happen")
        if hung:
            extra.append(f"{hung} hung")
        leaking = sum(bool(r.leftovers) for r in self.results)
        if leaking:
            extra.append(f"{leaking} runs left checkpoint files behind")
        unfinished = Counter(r.status for r in self.results if not r.finished and not r.hung)
        extra += [f"{n} ended {status}" for status, n in sorted(unfinished.items())]
        if self.results:
            times = [r.seconds for r in self.results]
            extra.append(
                f"run time median {statistics.median(times):.1f} s, "
                f"range {min(times):.1f}-{max(times):.1f} s, total {sum(times) / 60:.1f} min"
            )
        return text + (f" ({'; '.join(extra)})" if extra else "")

    @property
    def failed_seeds(self) -> list[int]:
        return [r.scenario.seed for r in self.results if not r.exact]
