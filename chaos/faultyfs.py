"""A fault-injecting filesystem for checkpoint storage: ``faulty:///abs/path``.

It is the local disk, seen through fsspec, with faults armed from outside: the chaos
driver writes a fault into a plan directory, and the next write the fault matches
(in whichever process makes it: the JobMaster writing ``_metadata``, or a Spark slot
writing a state file) raises, hangs or leaves half a file. chandy opens storage URIs
with other schemes through ``fsspec.filesystem(scheme)``
(``chandy/storage/filesystem.py``), so nothing of chandy is replaced or mocked: this
is one more fsspec implementation, as s3fs would be.

Slot processes are separate Python workers. They find the plan the same way the
driver does: from the path alone. The plan of ``faulty:///runs/7/checkpoints/...``
is the ``.faultplan`` directory of the nearest ancestor that has one
(``/runs/7/.faultplan``). Importing this module registers the protocol with fsspec;
the chaos job's functions import it, so every slot that deserializes them (which it
does before its tasks touch storage) can open ``faulty://`` paths.

A fault is one JSON file, ``armed/<name>.json``. The process that hits it first
claims it by renaming it to ``fired/<name>.json`` (a rename is atomic: exactly one
claimant wins, even across processes), then rewrites it with where and when it
fired. Faults still in ``armed/`` when a run ends did not happen.

Faults timed to a subtask finishing (:mod:`chaos.finishing`) use two more directories:
``marks/`` (a source split whose last record was read: ``ended-<id>``; a storage fault
with ``params["after_ended"] = k`` waits for ``k`` of them, so it strikes during a
subtask's final checkpoint, or the job's) and ``triggers/`` (a finishing subtask asks
another subtask, or the chaos driver, to strike now; whoever takes the trigger, by an
atomic rename again, strikes).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

PROTOCOL = "faulty"
PLAN_DIR_NAME = ".faultplan"

#: Where a storage fault can strike: a task's state file, or the JobMaster's ``_metadata``.
SITE_STATE = "state"
SITE_METADATA = "metadata"


class InjectedFault(OSError):
    """An error a chaos fault raised on purpose (never a real defect by itself)."""


@dataclass(frozen=True)
class ArmedFault:
    """A fault waiting for its site: ``action`` is ``raise``, ``hang`` or ``partial``."""

    name: str
    site: str
    action: str
    hang_s: float = 0.0
    #: Free-form parameters of sites outside this module (e.g. which sink's commit).
    params: dict[str, Any] = field(default_factory=dict)


class FaultPlan:
    """The faults of one chaos run, shared by files between the driver and the slots."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.armed_dir = os.path.join(directory, "armed")
        self.fired_dir = os.path.join(directory, "fired")
        self.marks_dir = os.path.join(directory, "marks")
        self.triggers_dir = os.path.join(directory, "triggers")
        for path in (self.armed_dir, self.fired_dir, self.marks_dir, self.triggers_dir):
            os.makedirs(path, exist_ok=True)

    @staticmethod
    def for_root(root: str) -> FaultPlan:
        """The plan that ``faulty://`` paths under ``root`` consult."""
        return FaultPlan(os.path.join(root, PLAN_DIR_NAME))

    def arm(self, fault: ArmedFault) -> None:
        """Make ``fault`` strike at the next matching site (atomically: never half-read)."""
        tmp = os.path.join(self.directory, f".{fault.name}.{uuid.uuid4().hex}")
        with open(tmp, "w") as f:
            json.dump(asdict(fault), f)
        os.replace(tmp, os.path.join(self.armed_dir, f"{fault.name}.json"))

    def has_armed(self) -> bool:
        try:
            return bool(os.listdir(self.armed_dir))
        except FileNotFoundError:
            return False

    def claim(self, site: str, **match: Any) -> ArmedFault | None:
        """The armed fault for ``site`` (whose params include ``match``), now owned by the
        caller, or ``None``. Several processes may race; exactly one wins each fault."""
        try:
            names = sorted(os.listdir(self.armed_dir))
        except FileNotFoundError:
            return None
        for name in names:
            path = os.path.join(self.armed_dir, name)
            try:
                with open(path) as f:
                    fault = ArmedFault(**json.load(f))
            except (FileNotFoundError, json.JSONDecodeError):
                continue  # claimed by another process meanwhile
            if fault.site != site or any(fault.params.get(k) != v for k, v in match.items()):
                continue
            if len(self.marks("ended-")) < fault.params.get("after_ended", 0):
                continue  # aimed at a final checkpoint: not before enough splits ended
            fired = os.path.join(self.fired_dir, name)
            try:
                os.rename(path, fired)
            except FileNotFoundError:
                continue  # another process won it
            return fault
        return None

    def record_fired(self, fault: ArmedFault, **details: Any) -> None:
        """Note when, where and how a claimed fault struck (for the run's report); a fault
        claimed by one subtask and struck by another is noted twice, the second adding to
        the first (``struck: False``, then ``True``)."""
        record = {**(self.fired(fault.name) or {}), **asdict(fault), "time": time.time(), "pid": os.getpid()}
        record.update(details)
        tmp = os.path.join(self.fired_dir, f".{fault.name}.{uuid.uuid4().hex}")
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, os.path.join(self.fired_dir, f"{fault.name}.json"))

    def fired(self, name: str) -> dict[str, Any] | None:
        """What a fault did, or ``None`` when it did not strike (yet)."""
        try:
            with open(os.path.join(self.fired_dir, f"{name}.json")) as f:
                record: dict[str, Any] = json.load(f)
                return record
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def mark(self, name: str) -> None:
        """Note a fact the whole run may consult (e.g. ``ended-<id>``: a split was read)."""
        with open(os.path.join(self.marks_dir, name), "a"):
            pass

    def marks(self, prefix: str) -> list[str]:
        try:
            return [name for name in os.listdir(self.marks_dir) if name.startswith(prefix)]
        except FileNotFoundError:
            return []

    def post_trigger(self, fault: ArmedFault, **details: Any) -> None:
        """Ask another party to strike ``fault`` now (see :meth:`take_trigger`)."""
        tmp = os.path.join(self.directory, f".{fault.name}.{uuid.uuid4().hex}")
        with open(tmp, "w") as f:
            json.dump({"fault": asdict(fault), **details}, f)
        os.replace(tmp, os.path.join(self.triggers_dir, f"{fault.name}.json"))

    def take_trigger(self, action: str, skip_from: Any = None) -> tuple[ArmedFault, dict[str, Any]] | None:
        """A posted trigger of ``action`` (not one posted by ``skip_from``), now owned by the
        caller (or withdrawn, when the poster takes it back), or ``None``."""
        try:
            names = os.listdir(self.triggers_dir)
        except FileNotFoundError:
            return None
        for name in sorted(n for n in names if n.endswith(".json")):
            path = os.path.join(self.triggers_dir, name)
            try:
                with open(path) as f:
                    trigger: dict[str, Any] = json.load(f)
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            fault = ArmedFault(**trigger.pop("fault"))
            if fault.action != action or (skip_from is not None and trigger.get("from") == skip_from):
                continue
            try:
                os.rename(path, f"{path}.taken")
            except FileNotFoundError:
                continue  # taken by another party, or withdrawn
            return fault, trigger
        return None

    def withdraw_trigger(self, name: str) -> bool:
        """Take back a trigger nobody took; False when someone took it meanwhile."""
        path = os.path.join(self.triggers_dir, f"{name}.json")
        try:
            os.rename(path, f"{path}.withdrawn")
        except FileNotFoundError:
            return False
        return True

    def disarm_all(self) -> list[str]:
        """Take back every fault that has not struck; their names."""
        names = []
        for name in sorted(os.listdir(self.armed_dir)):
            try:
                os.remove(os.path.join(self.armed_dir, name))
                names.append(name.removesuffix(".json"))
            except FileNotFoundError:
                pass  # it struck just now
        return names


class FaultyFileSystem(LocalFileSystem):  # type: ignore[misc]  # fsspec ships no type information
    """fsspec's local filesystem whose whole-file writes consult a :class:`FaultPlan`.

    ``pipe_file`` (what chandy writes every checkpoint file with) is made atomic
    (temporary file, then rename), as an object store's PUT is and as chandy expects
    of fsspec filesystems; only an armed ``partial`` fault leaves half a file behind.
    """

    protocol = (PROTOCOL,)
    root_marker = "/"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plans: dict[str, FaultPlan | None] = {}

    def _plan_for(self, path: str) -> FaultPlan | None:
        directory = os.path.dirname(path)
        if directory not in self._plans:
            plan = None
            probe = directory
            while True:
                if os.path.isdir(os.path.join(probe, PLAN_DIR_NAME)):
                    plan = FaultPlan(os.path.join(probe, PLAN_DIR_NAME))
                    break
                parent = os.path.dirname(probe)
                if parent == probe:
                    break
                probe = parent
            self._plans[directory] = plan
        return self._plans[directory]

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        plan = self._plan_for(path)
        if plan is not None and plan.has_armed():
            site = SITE_METADATA if os.path.basename(path) == "_metadata" else SITE_STATE
            if not os.path.basename(path).startswith(".probe-"):
                fault = plan.claim(site)
                if fault is not None:
                    self._strike(plan, fault, path, value)
        self._write_whole(path, value)

    def _strike(self, plan: FaultPlan, fault: ArmedFault, path: str, value: bytes) -> None:
        plan.record_fired(fault, path=path, size=len(value))
        if fault.action == "raise":
            raise InjectedFault(f"chaos: injected write failure of {path} ({fault.name})")
        if fault.action == "partial":
            with open(path, "wb") as f:
                f.write(value[: len(value) // 2])
            raise InjectedFault(
                f"chaos: injected torn write of {path}: "
                f"{len(value) // 2} of {len(value)} bytes ({fault.name})"
            )
        if fault.action == "hang":
            time.sleep(fault.hang_s)  # then write: a slow store, not a broken one
            return
        raise ValueError(f"unknown fault action {fault.action!r} of {fault.name}")

    @staticmethod
    def _write_whole(path: str, value: bytes) -> None:
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(value)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.remove(tmp)
            except FileNotFoundError:
                pass
            raise


fsspec.register_implementation(PROTOCOL, FaultyFileSystem, clobber=True)
