"""``chandy list | savepoint | stop | cancel``: Flink's CLI commands against a job's REST API.

The output is Flink's (``flink list``, ``flink savepoint``, ...), so a Flink user reads
it, and scripts written for Flink's CLI find what they look for.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from chandy.cli.checkpoints import find_savepoint
from chandy.cli.errors import CliError
from chandy.cli.rest import (
    DEFAULT_ADDRESS,
    TOKEN_ENV_VAR,
    ApiUnreachable,
    RestClient,
    SavepointOutcome,
    check_job_id,
)

F = TypeVar("F", bound=Callable[..., Any])

#: Flink's ``JobStatus``: not yet scheduled, and globally terminal.
_SCHEDULED = frozenset({"CREATED", "INITIALIZING"})
_TERMINAL = frozenset({"FINISHED", "CANCELED", "FAILED"})
_FORMATS = click.Choice(["canonical", "native"], case_sensitive=False)
_LINE = "--------------------------------------------------------------"


def _all_of(*options: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying several click options (listed in the order ``--help`` shows them)."""

    def apply(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


#: ``-m/--jobmanager`` and ``--token``, as on every command that talks to a running job.
rest_options = _all_of(
    click.option(
        "-m",
        "--jobmanager",
        "address",
        default=DEFAULT_ADDRESS,
        show_default=True,
        metavar="HOST:PORT",
        help="Address of the job's REST API (its rest.address and rest.port).",
    ),
    click.option(
        "--token",
        envvar=TOKEN_ENV_VAR,
        default=None,
        metavar="TOKEN",
        help=f"Bearer token of the REST API (its rest.auth.token); default: ${TOKEN_ENV_VAR}.",
    ),
)

#: ``-t/--type`` (the savepoint's format) and ``--timeout``, as on ``savepoint`` and ``stop``.
_savepoint_options = _all_of(
    click.option(
        "-t",
        "--type",
        "format_type",
        type=_FORMATS,
        default="canonical",
        show_default=True,
        help=(
            "Savepoint format: CANONICAL restores on either state backend (switch backends "
            "through it); NATIVE is the backend's own: on RocksDB "
            "its database files (faster to take and restore, restores on RocksDB only), "
            "on the hashmap backend the same as CANONICAL."
        ),
    ),
    click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=600.0,
        show_default=True,
        help="Seconds to wait for the savepoint to complete.",
    ),
)


@click.command("list")
@rest_options
@click.option("-r", "--running", is_flag=True, help="Show only running and restarting jobs.")
@click.option("-s", "--scheduled", is_flag=True, help="Show only scheduled jobs.")
@click.option("-a", "--all", "show_all", is_flag=True, help="Show all jobs (the default).")
def list_jobs(address: str, token: str | None, running: bool, scheduled: bool, show_all: bool) -> None:
    """List the jobs of the REST API at -m: running, scheduled and terminated ones.

    As `flink list`; a chandy REST API lives as long as the process running its jobs, so
    terminated jobs are shown by default (-r / -s narrow it down).
    """
    if not (running or scheduled) or show_all:
        running = scheduled = show_all = True
    click.echo("Waiting for response...")
    with RestClient(address, token) as client:
        jobs = client.jobs_overview()
    groups: dict[str, list[dict[str, Any]]] = {"running": [], "scheduled": [], "terminated": []}
    for job in jobs:
        state = str(job.get("state", ""))
        kind = "scheduled" if state in _SCHEDULED else "terminated" if state in _TERMINAL else "running"
        groups[kind].append(job)
    if running:
        _print_group("------------------ Running/Restarting Jobs -------------------", groups["running"])
        if not groups["running"]:
            click.echo("No running jobs.")
    if scheduled:
        _print_group("----------------------- Scheduled Jobs -----------------------", groups["scheduled"])
        if not groups["scheduled"]:
            click.echo("No scheduled jobs.")
    if show_all:
        _print_group("---------------------- Terminated Jobs -----------------------", groups["terminated"])


def _print_group(header: str, jobs: list[dict[str, Any]]) -> None:
    if not jobs:
        return
    click.echo(header)
    for job in sorted(jobs, key=lambda j: (int(j.get("start-time", 0) or 0), str(j.get("jid")))):
        click.echo(
            f"{_time(job.get('start-time'))} : {job.get('jid')} : {job.get('name')} ({job.get('state')})"
        )
    click.echo(_LINE)


def _time(millis: Any) -> str:
    """Flink's ``dd.MM.yyyy HH:mm:ss`` in local time."""
    try:
        stamp = int(millis)
    except (TypeError, ValueError):
        return "-"
    if stamp <= 0:
        return "-"
    return datetime.datetime.fromtimestamp(stamp / 1000).strftime("%d.%m.%Y %H:%M:%S")


@click.command("savepoint")
@rest_options
@click.argument("job_id", metavar="JOBID")
@click.argument("directory", metavar="[DIR]", required=False)
@_savepoint_options
def savepoint(
    address: str, token: str | None, job_id: str, directory: str | None, format_type: str, timeout: float
) -> None:
    """Take a savepoint of job JOBID into DIR (default: the job's execution.checkpointing.savepoint-dir).

    The job keeps running. Prints the savepoint's path, to restore from with `chandy run -s PATH`.
    """
    job_id = check_job_id(job_id)
    directory = _absolute(directory)
    click.echo(f"Triggering savepoint for job {job_id}.")
    click.echo("Waiting for response...")
    with RestClient(address, token) as client:
        since = time.time()
        trigger = client.trigger_savepoint(job_id, directory, format_type.upper())
        outcome = _await_outcome(client, job_id, trigger, timeout, directory, since, "savepoint")
    if outcome.location is None:
        raise CliError(f"the savepoint of job {job_id} failed: {outcome.failure}")
    click.echo(f"Savepoint completed. Path: {outcome.location}")
    click.echo("You can resume your program from this savepoint with the run command.")


@click.command("stop")
@rest_options
@click.argument("job_id", metavar="JOBID")
@click.option(
    "-p",
    "--savepoint-path",
    "--savepointPath",
    "directory",
    default=None,
    metavar="DIR",
    help="Directory of the savepoint (default: the job's execution.checkpointing.savepoint-dir).",
)
@click.option(
    "-d",
    "--drain",
    is_flag=True,
    help="Emit MAX_WATERMARK before the savepoint, so every window and event-time timer fires.",
)
@_savepoint_options
def stop(
    address: str,
    token: str | None,
    job_id: str,
    directory: str | None,
    drain: bool,
    format_type: str,
    timeout: float,
) -> None:
    """Stop job JOBID with a savepoint (Flink's stop-with-savepoint).

    Sources stop, the savepoint is taken, two-phase-commit sinks commit it, and the job ends
    FINISHED. If the savepoint fails the job keeps running and this prints why.
    """
    job_id = check_job_id(job_id)
    directory = _absolute(directory)
    verb = "Draining" if drain else "Suspending"
    click.echo(f'{verb} job "{job_id}" with a {format_type.upper()} savepoint.')
    with RestClient(address, token) as client:
        since = time.time()
        trigger = client.stop_with_savepoint(job_id, directory, drain, format_type.upper())
        outcome = _await_outcome(client, job_id, trigger, timeout, directory, since, "stop")
    if outcome.location is None:
        raise CliError(
            f"could not stop job {job_id}, it keeps running: the savepoint failed: {outcome.failure}"
        )
    click.echo(f"Savepoint completed. Path: {outcome.location}")


def _await_outcome(
    client: RestClient,
    job_id: str,
    trigger: str,
    timeout: float,
    directory: str | None,
    since: float,
    operation: str,
) -> SavepointOutcome:
    """The outcome the API reports; if the API goes away first (the job's process ended once the
    job stopped, before anyone fetched the outcome), the savepoint the job wrote into
    ``directory`` since ``since``: a complete one on disk is proof it succeeded."""
    try:
        return client.await_savepoint(job_id, trigger, timeout)
    except ApiUnreachable:
        found = find_savepoint(directory, job_id, int(since * 1000)) if directory is not None else None
        if found is None:
            where = f"under {directory}" if directory is not None else "in the job's savepoint directory"
            raise CliError(
                f"the REST API at {client.address} went away before it reported how the {operation} of "
                f"job {job_id} ended (the job's process exited); a savepoint that completed is a "
                f"savepoint-* directory {where}: `chandy checkpoint list` shows it"
            ) from None
        click.echo(
            f"Warning: the REST API at {client.address} went away before it reported the outcome (the "
            "job's process exited); the savepoint below was found complete on disk.",
            err=True,
        )
        return SavepointOutcome(found, None)


def _absolute(directory: str | None) -> str | None:
    """A relative local path made absolute here: the job's process has a working directory of
    its own, where a relative path would mean something else (URIs are left alone)."""
    if directory is None or "://" in directory or os.path.isabs(directory):
        return directory
    return os.path.abspath(directory)


@click.command("cancel")
@rest_options
@click.argument("job_id", metavar="JOBID")
def cancel(address: str, token: str | None, job_id: str) -> None:
    """Cancel job JOBID (no savepoint: use `chandy stop` to keep its state)."""
    job_id = check_job_id(job_id)
    click.echo(f"Cancelling job {job_id}.")
    with RestClient(address, token) as client:
        client.cancel(job_id)
    click.echo(f"Cancelled job {job_id}.")
