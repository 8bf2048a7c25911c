"""Flink's REST JSON bodies, built from a JobMaster's state.

Every function here reads the ExecutionGraph, the checkpoint coordinator or the
metrics store, which only the JobMaster thread changes: the server runs them
through ``JobMaster.call`` (once the job ended, on the caller's thread, when
nothing changes any more). Field names are Flink's, because Flink's CLI and other
tools deserialize them strictly (a missing field is an error to them).

Flink names a job vertex by a 32-hex ``JobVertexID`` (the hash of its head
operator); chandy's vertices have small integer ids, so the REST id of a vertex
is its head operator's id, which is a stable 32-hex hash too (of the ``uid``, else
of the position), the same across runs of the same pipeline.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from chandy.checkpoint.stats import CheckpointStats
from chandy.config.options import CheckpointingOptions, ExternalizedCheckpointRetention, StateBackendOptions
from chandy.graph.execution_graph import ExecutionGraph
from chandy.graph.job_graph import JobVertex
from chandy.messages.status import ExecutionState, JobStatus
from chandy.runtime.job_master import JobMaster
from chandy.web.dispatcher import DispatchedJob

#: Flink's ExecutionState names, in Flink's order (task counts list every one of them).
FLINK_EXECUTION_STATES = (
    "CREATED",
    "SCHEDULED",
    "DEPLOYING",
    "RUNNING",
    "FINISHED",
    "CANCELING",
    "CANCELED",
    "FAILED",
    "RECONCILING",
    "INITIALIZING",
)

#: Flink's JobStatus names (``timestamps`` lists every one of them).
FLINK_JOB_STATUSES = (
    "INITIALIZING",
    "CREATED",
    "RUNNING",
    "FAILING",
    "FAILED",
    "CANCELLING",
    "CANCELED",
    "FINISHED",
    "RESTARTING",
    "SUSPENDED",
    "RECONCILING",
)


def now_ms() -> int:
    return int(time.time() * 1000)


def vertex_rest_id(vertex: JobVertex) -> str:
    """The 32-hex id Flink's REST API names this vertex by (its head operator's id)."""
    return vertex.operator_ids[0]


def find_vertex(job_master: JobMaster, rest_id: str) -> JobVertex | None:
    for vertex in job_master.job_graph.vertices:
        if vertex_rest_id(vertex) == rest_id:
            return vertex
    return None


def _start_end(eg: ExecutionGraph) -> tuple[int, int, int]:
    """Flink's start-time, end-time (-1 while running) and duration of a job."""
    start = eg.state_timestamps[JobStatus.CREATED]
    end = eg.state_timestamps.get(eg.state, -1) if eg.state.is_globally_terminal else -1
    return start, end, (end if end >= 0 else now_ms()) - start


def _task_counts(states: list[ExecutionState]) -> dict[str, int]:
    counts = {name.lower(): 0 for name in FLINK_EXECUTION_STATES}
    for state in states:
        counts[state.value.lower()] += 1
    return counts


def _vertex_state(states: list[ExecutionState]) -> str:
    """Flink's aggregate state of a vertex's subtasks."""
    for state in (ExecutionState.FAILED, ExecutionState.CANCELING, ExecutionState.CANCELED):
        if state in states:
            return state.name
    if states and all(s is ExecutionState.FINISHED for s in states):
        return "FINISHED"
    for state in (
        ExecutionState.RUNNING,
        ExecutionState.INITIALIZING,
        ExecutionState.DEPLOYING,
        ExecutionState.SCHEDULED,
    ):
        if state in states:
            return state.name
    return "CREATED"


def job_details(job_master: JobMaster) -> dict[str, Any]:
    """Flink's ``JobDetails``: one entry of ``/jobs/overview`` (what ``flink list`` reads)."""
    eg = job_master.execution_graph
    start, end, duration = _start_end(eg)
    states = [e.state for e in eg.current_executions()]
    tasks = _task_counts(states)
    tasks["total"] = len(states)
    return {
        "jid": job_master.job_id,
        "name": job_master.job_graph.job_name,
        "jobType": "STREAMING",
        "schedulerType": "Default",
        "start-time": start,
        "end-time": end,
        "duration": duration,
        "state": eg.state.value,
        "last-modification": max(eg.state_timestamps.values()),
        "tasks": tasks,
        "pending-operators": 0,
    }


def job_detail_info(job: DispatchedJob, io_metrics: dict[int, dict[str, int]]) -> dict[str, Any]:
    """Flink's ``JobDetailsInfo`` (``/jobs/:jobid``): status, timestamps, vertices, plan.

    ``io_metrics`` holds per vertex (chandy id) Flink's ``IOMetricsInfo`` counters
    (records in/out, accumulated busy/idle/backpressured time)."""
    job_master = job.job_master
    eg = job_master.execution_graph
    graph = job_master.job_graph
    start, end, duration = _start_end(eg)
    # Subtask i of every vertex runs in slot i: one slot sharing group, as Flink's default.
    slot_sharing_group = hashlib.sha256(f"{job_master.job_id}:slot-sharing".encode()).hexdigest()[:32]
    vertices = []
    status_counts = {name: 0 for name in FLINK_EXECUTION_STATES}
    for vertex in graph.vertices:
        states = [ev.current_execution.state for ev in eg.vertices[vertex.id]]
        state = _vertex_state(states)
        status_counts[state] += 1
        vertices.append(
            {
                "id": vertex_rest_id(vertex),
                "slotSharingGroupId": slot_sharing_group,
                "name": vertex.name,
                "maxParallelism": vertex.max_parallelism,
                "parallelism": vertex.parallelism,
                "status": state,
                "start-time": start,
                "end-time": end,
                "duration": duration,
                # JobVertexDetailsInfo keys its counts by ExecutionState (upper case), unlike
                # the overview's JobDetails (lower case)
                "tasks": {name.upper(): count for name, count in _task_counts(states).items()},
                "metrics": _io_metrics(io_metrics.get(vertex.id, {})),
            }
        )
    return {
        "jid": job_master.job_id,
        "name": graph.job_name,
        "isStoppable": False,
        "state": eg.state.value,
        "job-type": "STREAMING",
        "schedulerType": "Default",
        "start-time": start,
        "end-time": end,
        "duration": duration,
        "maxParallelism": max(v.max_parallelism for v in graph.vertices),
        "now": now_ms(),
        "timestamps": {
            name: eg.state_timestamps.get(JobStatus(name), 0) if name in JobStatus.__members__ else 0
            for name in FLINK_JOB_STATUSES
        },
        "vertices": vertices,
        "status-counts": status_counts,
        "plan": job_plan(job_master),
        "pending-operators": 0,
        "restarts": job_master.restarts,
    }


_IO_METRICS = (
    "read-bytes",
    "read-bytes-complete",
    "write-bytes",
    "write-bytes-complete",
    "read-records",
    "read-records-complete",
    "write-records",
    "write-records-complete",
    "accumulated-backpressured-time",
    "accumulated-idle-time",
    "accumulated-busy-time",
)


def _io_metrics(values: dict[str, int]) -> dict[str, Any]:
    """Flink's ``IOMetricsInfo``; chandy does not count bytes (always 0, complete)."""
    data: dict[str, Any] = {name: values.get(name, 0) for name in _IO_METRICS}
    for name in (
        "read-bytes-complete",
        "write-bytes-complete",
        "read-records-complete",
        "write-records-complete",
    ):
        data[name] = True
    return data


def job_plan(job_master: JobMaster) -> dict[str, Any]:
    """Flink's ``JobPlanInfo`` plan: the chained vertices and the edges between them."""
    graph = job_master.job_graph
    return {
        "jid": job_master.job_id,
        "name": graph.job_name,
        "type": "STREAMING",
        "nodes": [
            {
                "id": vertex_rest_id(vertex),
                "parallelism": vertex.parallelism,
                "operator": "",
                "operator_strategy": "",
                "description": " -> ".join(op.name for op in vertex.operators) or vertex.name,
                "inputs": [
                    {
                        "num": index,
                        "id": vertex_rest_id(graph.vertex(edge.source_vertex_id)),
                        "ship_strategy": edge.partitioner.name,
                        "exchange": "pipelined_bounded",
                    }
                    for index, edge in enumerate(vertex.inputs)
                ],
                "optimizer_properties": {},
            }
            for vertex in graph.vertices
        ],
    }


def job_exceptions(job: DispatchedJob) -> dict[str, Any]:
    """Flink's ``JobExceptionsInfoWithHistory``: every failure (failovers included), newest
    first, plus Flink 1.x's root-exception fields for older readers."""
    entries: list[dict[str, Any]] = [
        {
            "exceptionName": e.exception_name,
            "stacktrace": e.stacktrace,
            "timestamp": e.timestamp,
            "taskName": None,
            "endpoint": None,
            "taskManagerId": None,
            "failureLabels": {},
            "concurrentExceptions": [],
        }
        for e in job.exceptions()
    ]
    root = entries[0] if entries else None
    return {
        "root-exception": root["stacktrace"] if root else None,
        "timestamp": root["timestamp"] if root else None,
        "all-exceptions": [],
        "truncated": False,
        "exceptionHistory": {"entries": entries, "truncated": False},
    }


def _with_rest_vertex_ids(job_master: JobMaster, data: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``tasks`` keyed by Flink's vertex ids instead of chandy's."""
    if "tasks" in data:
        data["tasks"] = {
            vertex_rest_id(job_master.job_graph.vertex(int(vid))): task for vid, task in data["tasks"].items()
        }
    return data


def checkpoint_details(job_master: JobMaster, stats: CheckpointStats) -> dict[str, Any]:
    """Flink's ``CheckpointStatistics`` with per-vertex ``tasks`` (``/checkpoints/details/:id``)."""
    return _with_rest_vertex_ids(job_master, stats.to_json(with_tasks=True))


def checkpoint_config(job_master: JobMaster) -> dict[str, Any]:
    """Flink's ``CheckpointConfigInfo`` (``/jobs/:jobid/checkpoints/config``)."""
    coordinator = job_master.coordinator
    assert coordinator is not None
    settings = coordinator.config
    retention = settings.retention
    storage = job_master.checkpoint_storage
    return {
        "mode": "exactly_once" if settings.exactly_once else "at_least_once",
        "interval": settings.interval_ms if settings.interval_ms is not None else 0x7FFFFFFFFFFFFFFF,
        "timeout": settings.timeout_ms,
        "min_pause": settings.min_pause_ms,
        "max_concurrent": settings.max_concurrent,
        "externalization": {
            "enabled": retention is not ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS,
            "delete_on_cancellation": retention is not ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION,
        },
        "state_backend": "EmbeddedRocksDBStateBackend"
        if job_master.config.get(StateBackendOptions.TYPE) == "rocksdb"
        else "HashMapStateBackend",
        "checkpoint_storage": "FileSystemCheckpointStorage"
        if storage is not None and storage.base_uri
        else "JobManagerCheckpointStorage",
        "unaligned_checkpoints": settings.unaligned,
        "tolerable_failed_checkpoints": settings.tolerable_failures,
        "aligned_checkpoint_timeout": settings.aligned_checkpoint_timeout_ms,
        "checkpoints_after_tasks_finish": True,
        "state_changelog_enabled": False,
        "changelog_periodic_materialization_interval": 0,
        "changelog_storage": "memory",
        "checkpoint_dir": job_master.config.get(CheckpointingOptions.DIRECTORY),
        "savepoint_dir": job_master.config.get(CheckpointingOptions.SAVEPOINT_DIRECTORY),
    }


def subtasks_of(job_master: JobMaster, vertex_id: int) -> list[dict[str, Any]]:
    """The metrics store's entries of one vertex's subtasks (see ``JobMetricsStore``)."""
    return [s for s in job_master.metrics.subtask_metrics() if s["vertex_id"] == vertex_id]


def vertex_metrics(job_master: JobMaster, vertex_id: int) -> dict[str, Any]:
    """Flink's metric ids of a vertex: ``<subtask>.<metric>`` for the task,
    ``<subtask>.<operator name>.<metric>`` for each operator of its chain."""
    values: dict[str, Any] = {}
    for subtask in subtasks_of(job_master, vertex_id):
        index = subtask["subtask_index"]
        for name, value in subtask["metrics"].items():
            values[f"{index}.{name}"] = value
        for operator in subtask["operators"]:
            for name, value in operator["metrics"].items():
                values[f"{index}.{operator['operator_name']}.{name}"] = value
    return values


def io_metrics(job_master: JobMaster) -> dict[int, dict[str, int]]:
    """Per vertex, Flink's ``IOMetricsInfo`` counters summed over its subtasks."""
    result: dict[int, dict[str, int]] = {}
    for subtask in job_master.metrics.subtask_metrics():
        metrics = subtask["metrics"]
        totals = result.setdefault(subtask["vertex_id"], {})
        for flink_name, name in (
            ("read-records", "numRecordsIn"),
            ("write-records", "numRecordsOut"),
            ("accumulated-busy-time", "accumulateBusyTimeMs"),
            ("accumulated-idle-time", "accumulateIdleTimeMs"),
            ("accumulated-backpressured-time", "accumulateBackPressuredTimeMs"),
        ):
            totals[flink_name] = totals.get(flink_name, 0) + int(metrics[name])
    return result


def backpressure_level(ratio: float) -> str:
    """Flink's levels: ok up to 10 % of the time backpressured, low up to 50 %, else high."""
    return "ok" if ratio <= 0.10 else ("low" if ratio <= 0.5 else "high")


def vertex_backpressure(job_master: JobMaster, vertex_id: int) -> dict[str, Any]:
    """Flink's ``JobVertexBackPressureInfo`` from the subtasks' backpressured, idle and busy
    time per second (Flink 1.13+ measures it the same way, no stack sampling)."""
    subtasks = []
    for subtask in subtasks_of(job_master, vertex_id):
        metrics = subtask["metrics"]
        ratio = metrics["backPressuredTimeMsPerSecond"] / 1000
        subtasks.append(
            {
                "subtask": subtask["subtask_index"],
                "attempt-number": subtask["attempt_number"],
                "backpressure-level": backpressure_level(ratio),
                "backpressureLevel": backpressure_level(ratio),  # Flink writes both spellings
                "ratio": ratio,
                "idleRatio": metrics["idleTimeMsPerSecond"] / 1000,
                "busyRatio": metrics["busyTimeMsPerSecond"] / 1000,
            }
        )
    if not subtasks:
        return {"status": "deprecated"}  # Flink's answer while no statistics exist yet
    worst = max(s["ratio"] for s in subtasks)
    return {
        "status": "ok",
        "backpressure-level": backpressure_level(worst),
        "backpressureLevel": backpressure_level(worst),
        "end-timestamp": now_ms(),
        "subtasks": subtasks,
    }
