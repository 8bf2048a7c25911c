"""The Starlette application: Flink's REST routes, the dashboard's files, ``/metrics``.

Each route exists twice, as Flink's do: at its path and under ``/v1`` (Flink's
client asks for ``/v1/jobs/overview``). Errors are Flink's ``{"errors": [...]}``
with Flink's status codes (404 for an unknown job, 409 for cancelling a job
that already ended otherwise), so Flink's CLI reports them as it reports
Flink's own.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chandy.config.options import RestOptions, SavepointFormatType
from chandy.errors import ConfigurationError
from chandy.graph.job_graph import JobVertex
from chandy.messages.status import JobStatus
from chandy.runtime.job_master import JobMaster
from chandy.web import views
from chandy.web.auth import IDENTITY_PATH, BearerTokenAuth, token_proof
from chandy.web.dispatcher import DispatchedJob, Dispatcher
from chandy.web.failure import serialized_throwable
from chandy.web.guard import HostAllowList, RequestGuard
from chandy.web.prometheus import PrometheusExporter

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: The dashboard's files (index.html, app.js, style.css).
STATIC_DIR = Path(__file__).parent / "static"

#: How long a request waits for a JobMaster busy elsewhere (deploying Spark slots, say).
CALL_TIMEOUT_S = 30.0


def chandy_version() -> str:
    try:
        return importlib.metadata.version("chandy")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class RestApi:
    """The handlers; they read the dispatcher's jobs through their JobMasters."""

    def __init__(
        self, dispatcher: Dispatcher, *, token: str | None = None, call_timeout_s: float = CALL_TIMEOUT_S
    ) -> None:
        self.dispatcher = dispatcher
        self._token = token
        self.call_timeout_s = call_timeout_s
        self.prometheus = PrometheusExporter(dispatcher, call_timeout_s)

    # ------------------------------------------------------------------ helpers

    def _job(self, request: Request) -> DispatchedJob:
        job_id = request.path_params["jobid"]
        job = self.dispatcher.job(job_id)
        if job is None:
            raise HTTPException(404, f"Job {job_id} not found.")
        return job

    async def _ask(self, job: DispatchedJob, action: Callable[[], _T]) -> _T:
        """``action``'s result from the job's JobMaster thread, without blocking the server."""
        future = job.job_master.call(action)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.call_timeout_s)
        except TimeoutError:
            raise HTTPException(
                503,
                f"the JobMaster of job {job.job_id} did not answer within {self.call_timeout_s:.0f} s "
                "(it may be deploying tasks or waiting for cancelled ones to stop); try again",
            ) from None

    def routes(self) -> list[BaseRoute]:
        return [
            Route(IDENTITY_PATH, self.identity, methods=["GET"]),
            Route("/config", self.config),
            Route("/overview", self.overview),
            Route("/jobs", self.jobs),
            Route("/jobs/overview", self.jobs_overview),
            Route("/jobs/{jobid}", self.job, methods=["GET"]),
            Route("/jobs/{jobid}", self.cancel, methods=["PATCH"]),
            Route("/jobs/{jobid}/exceptions", self.exceptions),
            Route("/jobs/{jobid}/plan", self.plan),
            Route("/jobs/{jobid}/checkpoints", self.checkpoints),
            Route("/jobs/{jobid}/checkpoints/config", self.checkpoints_config),
            Route("/jobs/{jobid}/checkpoints/details/{checkpointid:int}", self.checkpoint_details),
            Route(
                "/jobs/{jobid}/checkpoints/details/{checkpointid:int}/subtasks/{vertexid}",
                self.checkpoint_subtasks,
            ),
            Route("/jobs/{jobid}/metrics", self.job_metrics),
            Route("/jobs/{jobid}/savepoints", self.trigger_savepoint, methods=["POST"]),
            Route("/jobs/{jobid}/savepoints/{triggerid}", self.savepoint_status),
            Route("/jobs/{jobid}/stop", self.stop_with_savepoint, methods=["POST"]),
            Route("/jobs/{jobid}/vertices/{vertexid}/backpressure", self.backpressure),
            Route("/jobs/{jobid}/vertices/{vertexid}/metrics", self.vertex_metrics),
        ]

    # ------------------------------------------------------------------ cluster

    async def identity(self, request: Request) -> Response:
        """chandy's own, served without the token: whether this server needs a token and,
        if so, proof that it holds it (:func:`~chandy.web.auth.token_proof` of the client's
        ``nonce``). A client checks the proof before it sends its token, so the token never
        goes to whatever else listens where the client looked (another job, another program)."""
        nonce = request.query_params.get("nonce", "")
        if not _NONCE.match(nonce):
            raise HTTPException(400, "'nonce' must be 32 to 128 hexadecimal digits")
        token = self._token
        return JSONResponse(
            {
                "service": "chandy",
                "version": chandy_version(),
                "token-required": token is not None,
                "proof": token_proof(token, nonce) if token is not None else None,
            }
        )

    async def config(self, request: Request) -> Response:
        """Flink's ``DashboardConfiguration``."""
        version = chandy_version()
        return JSONResponse(
            {
                "refresh-interval": 3000,
                "timezone-name": "UTC",
                "timezone-offset": 0,
                "flink-version": f"chandy {version}",
                "flink-revision": version,
                "features": {
                    "web-submit": False,
                    "web-cancel": True,
                    "web-rescale": False,
                    "web-history": False,
                },
            }
        )

    async def overview(self, request: Request) -> Response:
        """Flink's ``ClusterOverviewWithVersion``: the driver is the one TaskManager; a job
        holds one slot per parallel subtask index (Flink's slot sharing)."""
        jobs = self.dispatcher.jobs()
        statuses = [job.job_master.execution_graph.state for job in jobs]
        running = [job for job, status in zip(jobs, statuses, strict=True) if not status.is_globally_terminal]
        slots = sum(job.job_master.job_graph.max_parallelism_of_any_vertex for job in running)
        version = chandy_version()
        return JSONResponse(
            {
                "taskmanagers": 1,
                "slots-total": slots,
                "slots-available": 0,
                "jobs-running": len(running),
                "jobs-finished": statuses.count(JobStatus.FINISHED),
                "jobs-cancelled": statuses.count(JobStatus.CANCELED),
                "jobs-failed": statuses.count(JobStatus.FAILED),
                "flink-version": f"chandy {version}",
                "flink-commit": version,
                "taskmanagers-blocked": 0,
                "slots-free-and-blocked": 0,
            }
        )

    async def jobs(self, request: Request) -> Response:
        """Flink's ``JobIdsWithStatusOverview``."""
        return JSONResponse(
            {
                "jobs": [
                    {"id": job.job_id, "status": job.job_master.execution_graph.state.value}
                    for job in self.dispatcher.jobs()
                ]
            }
        )

    async def jobs_overview(self, request: Request) -> Response:
        """Flink's ``MultipleJobsDetails``: what ``flink list`` reads."""
        details = [
            await self._ask(job, functools.partial(views.job_details, job.job_master))
            for job in self.dispatcher.jobs()
        ]
        return JSONResponse({"jobs": details})

    # ------------------------------------------------------------------ one job

    async def job(self, request: Request) -> Response:
        job = self._job(request)
        return JSONResponse(
            await self._ask(job, lambda: views.job_detail_info(job, views.io_metrics(job.job_master)))
        )

    async def plan(self, request: Request) -> Response:
        job = self._job(request)
        return JSONResponse({"plan": await self._ask(job, lambda: views.job_plan(job.job_master))})

    async def cancel(self, request: Request) -> Response:
        """``PATCH /jobs/:jobid?mode=cancel`` (``flink cancel``): 202 and an empty body; 409
        if the job already ended otherwise."""
        job = self._job(request)
        mode = request.query_params.get("mode", "cancel")
        if mode != "cancel":
            raise HTTPException(
                400, f"unsupported mode '{mode}': only 'cancel' (use /jobs/:jobid/stop to stop)"
            )
        status = job.job_master.execution_graph.state
        if status.is_globally_terminal and status is not JobStatus.CANCELED:
            raise HTTPException(
                409,
                "Job cancellation failed because the job has already reached another terminal state "
                f"({status.value}).",
            )
        log.info("Cancelling job %s on request of %s.", job.job_id, _client(request))
        job.job_master.cancel(f"cancelled through the REST API by {_client(request)}")
        return JSONResponse({}, status_code=202)

    async def exceptions(self, request: Request) -> Response:
        job = self._job(request)
        return JSONResponse(views.job_exceptions(job))

    # ------------------------------------------------------------------ checkpoints

    def _coordinator_required(self, job: DispatchedJob) -> None:
        if job.job_master.coordinator is None:
            raise HTTPException(404, f"Checkpointing is not enabled for job {job.job_id}.")

    async def checkpoints(self, request: Request) -> Response:
        """Flink's ``CheckpointingStatistics``: counts, summary, latest, history."""
        job = self._job(request)
        self._coordinator_required(job)
        coordinator = job.job_master.coordinator
        assert coordinator is not None
        return JSONResponse(await self._ask(job, coordinator.stats.to_json))

    async def checkpoints_config(self, request: Request) -> Response:
        job = self._job(request)
        self._coordinator_required(job)
        return JSONResponse(views.checkpoint_config(job.job_master))

    async def _checkpoint(self, request: Request, job: DispatchedJob) -> Any:
        self._coordinator_required(job)
        coordinator = job.job_master.coordinator
        assert coordinator is not None
        checkpoint_id: int = request.path_params["checkpointid"]
        stats = await self._ask(job, lambda: coordinator.stats.get_checkpoint(checkpoint_id))
        if stats is None:
            raise HTTPException(
                404,
                f"Could not find checkpointing statistics for checkpoint {checkpoint_id} "
                "(only the latest web.checkpoints.history are kept).",
            )
        return stats

    async def checkpoint_details(self, request: Request) -> Response:
        job = self._job(request)
        stats = await self._checkpoint(request, job)
        return JSONResponse(await self._ask(job, lambda: views.checkpoint_details(job.job_master, stats)))

    async def checkpoint_subtasks(self, request: Request) -> Response:
        """Flink's ``TaskCheckpointStatisticsWithSubtaskDetails`` for one vertex."""
        job = self._job(request)
        stats = await self._checkpoint(request, job)
        vertex = views.find_vertex(job.job_master, request.path_params["vertexid"])
        if vertex is None or vertex.id not in stats.vertices:
            raise HTTPException(
                404, f"No vertex {request.path_params['vertexid']} in checkpoint {stats.checkpoint_id}."
            )
        return JSONResponse(await self._ask(job, lambda: stats.task_json(vertex.id)))

    # ------------------------------------------------------------------ metrics

    async def job_metrics(self, request: Request) -> Response:
        """Flink's metric query: without ``get``, the ids of the job's metrics; with
        ``get=a,b``, their values (as strings, as Flink's)."""
        job = self._job(request)
        values = await self._ask(job, job.job_master.metrics.job_metrics)
        return JSONResponse(_metric_query(values, request))

    def _vertex(self, request: Request, job: DispatchedJob) -> JobVertex:
        vertex = views.find_vertex(job.job_master, request.path_params["vertexid"])
        if vertex is None:
            raise HTTPException(404, f"Job {job.job_id} has no vertex {request.path_params['vertexid']}.")
        return vertex

    async def vertex_metrics(self, request: Request) -> Response:
        """A vertex's metrics by Flink's ids (``0.numRecordsInPerSecond``, ``0.Map.numRecordsOut``)."""
        job = self._job(request)
        vertex = self._vertex(request, job)
        return JSONResponse(_metric_query(views.vertex_metrics(job.job_master, vertex.id), request))

    async def backpressure(self, request: Request) -> Response:
        job = self._job(request)
        vertex = self._vertex(request, job)
        return JSONResponse(views.vertex_backpressure(job.job_master, vertex.id))

    # ------------------------------------------------------------------ savepoints

    async def _body(self, request: Request) -> dict[str, Any]:
        """The request's JSON object; anything else is Flink's 400 (never a 500)."""
        raw = await request.body()
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise HTTPException(
                400,
                "Request did not match expected format: the body is not UTF-8 "
                f"({exc.reason} at byte {exc.start}).",
            ) from None
        except json.JSONDecodeError as exc:
            raise HTTPException(400, f"Request did not match expected format: {exc}") from None
        except RecursionError:
            raise HTTPException(
                400, "Request did not match expected format: the JSON is nested too deeply."
            ) from None
        if not isinstance(body, dict):
            raise HTTPException(400, "Request did not match expected format: a JSON object is expected.")
        return body

    def _trigger(
        self,
        job: DispatchedJob,
        body: dict[str, Any],
        directory_field: str,
        start: Callable[[str | None, SavepointFormatType], Future[str]],
    ) -> Response:
        """Start a savepoint or stop; 202 with the trigger id the client polls with."""
        trigger_id = _trigger_id(body)
        if trigger_id is not None and trigger_id in job.triggers:
            return JSONResponse({"request-id": trigger_id}, status_code=202)  # Flink: idempotent by id
        status = job.job_master.execution_graph.state
        if status.is_globally_terminal:
            raise HTTPException(
                409, f"Job {job.job_id} has already reached a terminal state ({status.value})."
            )
        format_name = (_string_field(body, "formatType") or "CANONICAL").upper()
        if format_name not in SavepointFormatType.__members__ or format_name == "DEFAULT":
            raise HTTPException(400, f"unknown formatType '{format_name}': use CANONICAL or NATIVE")
        directory = _target_directory(body, directory_field)
        future = start(directory, SavepointFormatType[format_name])
        if future.done() and isinstance(future.exception(), ConfigurationError):
            raise HTTPException(400, str(future.exception()))  # no directory: Flink answers 400 too
        return JSONResponse(
            {"request-id": self.dispatcher.add_trigger(job, future, trigger_id)}, status_code=202
        )

    async def trigger_savepoint(self, request: Request) -> Response:
        """``POST /jobs/:jobid/savepoints`` (``flink savepoint``): ``target-directory``,
        ``cancel-job`` (cancel once the savepoint completed), ``formatType``, ``triggerId``."""
        job = self._job(request)
        body = await self._body(request)
        master = job.job_master
        cancel_job = _flink_boolean(body, "cancel-job")

        def start(directory: str | None, format_type: SavepointFormatType) -> Future[str]:
            savepoint = master.trigger_savepoint(directory, format_type)
            if not cancel_job:
                return savepoint
            return _then_cancel(savepoint, master, _client(request))

        response = self._trigger(job, body, "target-directory", start)
        log.info(
            "Savepoint of job %s into %s requested by %s%s.",
            job.job_id,
            body.get("target-directory") or "the default directory",
            _client(request),
            " (then cancel)" if cancel_job else "",
        )
        return response

    async def stop_with_savepoint(self, request: Request) -> Response:
        """``POST /jobs/:jobid/stop`` (``flink stop``): ``targetDirectory``, ``drain``, ``formatType``."""
        job = self._job(request)
        body = await self._body(request)
        drain = _flink_boolean(body, "drain")
        response = self._trigger(
            job,
            body,
            "targetDirectory",
            lambda directory, fmt: job.job_master.stop_with_savepoint(drain, directory, fmt),
        )
        log.info(
            "Stop-with-savepoint%s of job %s into %s requested by %s.",
            " with drain" if drain else "",
            job.job_id,
            body.get("targetDirectory") or "the default directory",
            _client(request),
        )
        return response

    async def savepoint_status(self, request: Request) -> Response:
        """Flink's ``AsynchronousOperationResult<SavepointInfo>`` of a savepoint or stop."""
        job = self._job(request)
        trigger_id = request.path_params["triggerid"]
        trigger = self.dispatcher.fetch_trigger(job, trigger_id)
        if trigger is None:
            raise HTTPException(
                404, f"There is no savepoint operation with triggerId={trigger_id} for job {job.job_id}."
            )
        future = trigger.future
        if not future.done():
            return JSONResponse({"status": {"id": "IN_PROGRESS"}, "operation": None})
        error = future.exception()
        operation = (
            {"location": None, "failure-cause": serialized_throwable(error)}
            if error is not None
            else {"location": future.result(), "failure-cause": None}
        )
        return JSONResponse({"status": {"id": "COMPLETED"}, "operation": operation})

    async def prometheus_metrics(self, request: Request) -> Response:
        body = await run_in_threadpool(self.prometheus.render)
        return Response(body, media_type=self.prometheus.content_type)


_TRIGGER_ID = re.compile(r"^[0-9a-fA-F]{32}$")
_NONCE = re.compile(r"^[0-9a-fA-F]{32,128}$")

#: The spellings of a boolean Flink's Jackson accepts in a JSON string.
_JACKSON_BOOLEANS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}


def _flink_boolean(body: dict[str, Any], field: str) -> bool:
    """A boolean field as Flink's Jackson reads it: ``true``/``false``, or those words as a
    string (``"false"`` is false: a non-empty string is not true); absent or null is false;
    anything else is a 400."""
    value = body.get(field)
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in _JACKSON_BOOLEANS:
        return _JACKSON_BOOLEANS[value]
    raise HTTPException(
        400,
        f"Request did not match expected format: '{field}' must be true or false, got {json.dumps(value)}.",
    )


def _string_field(body: dict[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is None or isinstance(value, str):
        return value
    raise HTTPException(
        400, f"Request did not match expected format: '{field}' must be a string, got {json.dumps(value)}."
    )


def _trigger_id(body: dict[str, Any]) -> str | None:
    """Flink's ``triggerId``: 32 hexadecimal digits, as Flink's ``TriggerId`` parses it."""
    value = _string_field(body, "triggerId")
    if value is not None and not _TRIGGER_ID.match(value):
        raise HTTPException(
            400,
            "Request did not match expected format: 'triggerId' must be 32 hexadecimal digits, "
            f"got {value!r}.",
        )
    return value.lower() if value is not None else None


def _target_directory(body: dict[str, Any], field: str) -> str | None:
    """The directory a client asked for: an absolute path or a URI; none (absent, null or
    empty) is ``execution.checkpointing.savepoint-dir``. A relative path is refused: it
    would be resolved against the driver's working directory, which the client neither
    knows nor chose, and could climb out of it (``../..``)."""
    directory = _string_field(body, field)
    if not directory:
        return None
    parsed = urlparse(directory)
    local = parsed.scheme in ("", "file")
    path = parsed.path if parsed.scheme == "file" else directory
    if local and not os.path.isabs(path):
        raise HTTPException(
            400,
            f"'{field}' must be an absolute path or a URI (such as s3://bucket/savepoints), got "
            f"'{directory}': a relative path would be resolved against the driver's working directory. "
            "Pass an absolute path (chandy's CLI makes a relative one absolute on your side), or none "
            "for the job's execution.checkpointing.savepoint-dir.",
        )
    return directory


def _then_cancel(savepoint: Future[str], master: JobMaster, client: str) -> Future[str]:
    """Flink's cancel-with-savepoint: cancel once the savepoint completed (not if it failed)."""
    result: Future[str] = Future()

    def done(future: Future[str]) -> None:
        error = future.exception()
        if error is not None:
            result.set_exception(error)
            return
        master.cancel(f"cancelled with savepoint {future.result()} through the REST API by {client}")
        result.set_result(future.result())

    savepoint.add_done_callback(done)
    return result


def _metric_query(values: dict[str, Any], request: Request) -> list[dict[str, str]]:
    wanted = request.query_params.get("get")
    if wanted is None:
        return [{"id": name} for name in values]
    names = [name for name in wanted.split(",") if name]
    return [{"id": name, "value": str(values[name])} for name in names if name in values]


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "an unknown client"


async def _error(request: Request, exc: Exception) -> Response:
    """Flink's error body for every failure (a missing route or file included)."""
    if isinstance(exc, HTTPException):
        return JSONResponse({"errors": [exc.detail]}, status_code=exc.status_code, headers=exc.headers)
    log.exception("REST request %s %s failed.", request.method, request.url.path)
    return JSONResponse({"errors": [f"Internal server error: {type(exc).__name__}: {exc}"]}, status_code=500)


def create_app(
    dispatcher: Dispatcher,
    *,
    token: str | None = None,
    static_dir: Path = STATIC_DIR,
    allowed_hosts: HostAllowList | None = None,
    max_content_length: int = RestOptions.MAX_CONTENT_LENGTH.default,
) -> Starlette:
    """The server's ASGI app: the API at its paths and under ``/v1``, ``/metrics``, and
    the dashboard at ``/``. With ``token`` every API request needs it (the dashboard's own
    files do not: they hold no job data, and the page asks for the token). Every request
    first passes :class:`~chandy.web.guard.RequestGuard` (``Host`` among ``allowed_hosts``,
    loopback names and addresses by default; JSON for what changes state; the body limit)."""
    api = RestApi(dispatcher, token=token)
    routes = api.routes()
    app = Starlette(
        routes=[
            *routes,
            Mount("/v1", routes=routes),
            Route("/metrics", api.prometheus_metrics),
            Mount("/", StaticFiles(directory=static_dir, html=True, check_dir=False)),
        ],
        exception_handlers={HTTPException: _error, Exception: _error},
    )
    if token is not None:
        app.add_middleware(BearerTokenAuth, token=token, public_dir=static_dir)
    app.add_middleware(
        RequestGuard,
        allowed_hosts=allowed_hosts or HostAllowList.of("127.0.0.1", None, None),
        max_content_length=max_content_length,
    )
    app.add_middleware(_RequestLog)
    return app


class _RequestLog:
    """Every request and its status at DEBUG (``chandy.web.app``): what a client such as
    Flink's CLI asks for, when one does not work as expected."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.DEBUG):
            await self.app(scope, receive, send)
            return

        async def send_logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                query = scope.get("query_string", b"").decode()
                log.debug(
                    "%s %s%s -> %d",
                    scope["method"],
                    scope["path"],
                    f"?{query}" if query else "",
                    message["status"],
                )
            await send(message)

        await self.app(scope, receive, send_logged)
