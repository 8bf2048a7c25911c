"""``chandy run``: start a job file with settings from the command line, as ``flink run`` does.

The job file is an ordinary program that builds its pipeline on a
``StreamExecutionEnvironment``; ``chandy run`` runs it as ``python job.py`` (or through
``spark-submit`` with ``--master``) and hands it the settings in the environment variable
``CHANDY_CONFIG`` (a JSON object of configuration keys), which every new environment reads
as its base configuration. So the program needs no code to accept ``-p`` or ``-s``, and
what it sets itself still wins, as in Flink.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click

from chandy.api.environment import CONFIG_ENV_VAR, configuration_from_environment
from chandy.cli.errors import CliError
from chandy.cli.rest import check_job_id
from chandy.config import Configuration
from chandy.config.options import CoreOptions, PipelineOptions, StateRecoveryOptions, check_configuration
from chandy.errors import ConfigurationError
from chandy.runtime.console import ANNOUNCE_FILE_ENV, DRIVER_PID_FILE_ENV
from chandy.runtime.status_line import dashboard_link

_JOB_ID_KEY = PipelineOptions.FIXED_JOB_ID.key

#: Keys the command's own options set (checked by click already).
_OPTION_KEYS = frozenset(
    {
        CoreOptions.DEFAULT_PARALLELISM.key,
        StateRecoveryOptions.PATH.key,
        StateRecoveryOptions.IGNORE_UNCLAIMED_STATE.key,
        StateRecoveryOptions.CLAIM_MODE.key,
        StateRecoveryOptions.TRUST_SNAPSHOT.key,
    }
)

#: How long ``chandy run --detached`` waits for the job to say where its REST API is.
ANNOUNCE_TIMEOUT_S = 30.0
#: How often it looks for the address meanwhile.
ANNOUNCE_POLL_S = 0.1


def job_config(
    parallelism: int | None,
    restore_path: str | None,
    allow_non_restored_state: bool,
    claim_mode: str | None,
    dynamic: tuple[str, ...],
    trust_snapshot: bool = False,
) -> dict[str, Any]:
    """The configuration keys the options stand for (what goes into ``CHANDY_CONFIG``)."""
    config: dict[str, Any] = {}
    for pair in dynamic:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"-D takes key=value (e.g. -D parallelism.default=4), got '{pair}'")
        config[key.strip()] = value
    if parallelism is not None:
        config[CoreOptions.DEFAULT_PARALLELISM.key] = parallelism
    if restore_path is not None:
        config[StateRecoveryOptions.PATH.key] = restore_path
    if allow_non_restored_state:
        config[StateRecoveryOptions.IGNORE_UNCLAIMED_STATE.key] = True
    if claim_mode is not None:
        config[StateRecoveryOptions.CLAIM_MODE.key] = claim_mode.upper()
    if trust_snapshot:
        config[StateRecoveryOptions.TRUST_SNAPSHOT.key] = True
    return config


def _command(
    job_file: Path, args: tuple[str, ...], master: str | None, py_files: tuple[str, ...] = ()
) -> list[str]:
    if master is None:
        return [sys.executable, str(job_file), *args]
    # The one installed beside this interpreter first (pip's pyspark puts it there): it runs the
    # job on the Python chandy is installed in, where another on PATH might not.
    beside = Path(sys.executable).parent / "spark-submit"
    submit = str(beside) if os.access(beside, os.X_OK) else shutil.which("spark-submit")
    if submit is None:
        raise CliError(
            f"--master needs spark-submit, which is neither in {beside.parent} nor on PATH: install "
            "Spark (pip install pyspark puts it beside python), or run without --master"
        )
    shipped = ["--py-files", ",".join(py_files)] if py_files else []
    return [submit, "--master", master, *shipped, str(job_file), *args]


def _exit_code(returncode: int) -> int:
    """The process's exit status as a shell reports it (128 + N for death by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True},
)
@click.argument("job_file", metavar="JOB_FILE", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "-p", "--parallelism", type=click.IntRange(min=1), help="Default parallelism (parallelism.default)."
)
@click.option(
    "-s",
    "--from-savepoint",
    "--fromSavepoint",
    "restore_path",
    metavar="PATH",
    help="Start from this savepoint or retained checkpoint (execution.state-recovery.path).",
)
@click.option(
    "-n",
    "--allow-non-restored-state",
    "--allowNonRestoredState",
    is_flag=True,
    help="Skip state of operators the job no longer has (execution.state-recovery.ignore-unclaimed-state).",
)
@click.option(
    "--claim-mode",
    type=click.Choice(["claim", "no_claim"], case_sensitive=False),
    help="Who owns the restored files: no_claim (default; chandy never deletes them) or claim.",
)
@click.option(
    "--trust-snapshot",
    is_flag=True,
    help="Restore the -s snapshot even if this deployment's snapshot key does not authenticate it "
    "(unsigned, or signed with another key): its state is unpickled, which runs code, so only "
    "for a snapshot whose origin you trust (execution.state-recovery.trust-snapshot).",
)
@click.option("-D", "dynamic", multiple=True, metavar="KEY=VALUE", help="Any configuration key (repeatable).")
@click.option(
    "-d",
    "--detached",
    is_flag=True,
    help="Start the job in the background, print its job id and return.",
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --detached: where the job's output goes (default: <tmp>/chandy-<uid>/job-<id>.log).",
)
@click.option("--master", metavar="URL", help="Submit through spark-submit to this Spark master.")
@click.option(
    "-pyfs",
    "--py-files",
    "--pyFiles",
    "py_files",
    metavar="FILES",
    multiple=True,
    help="Your own modules for the job and its slots: .py, .zip or .egg files (comma-separated "
    "or repeated). With --master they go to spark-submit --py-files; without, onto PYTHONPATH.",
)
def run(
    job_file: Path,
    args: tuple[str, ...],
    parallelism: int | None,
    restore_path: str | None,
    allow_non_restored_state: bool,
    claim_mode: str | None,
    trust_snapshot: bool,
    dynamic: tuple[str, ...],
    detached: bool,
    log_file: Path | None,
    master: str | None,
    py_files: tuple[str, ...],
) -> None:
    """Run JOB_FILE (a Python program that builds and executes a pipeline) with ARGS.

    Without --master it runs as `python JOB_FILE ARGS`; with --master through
    `spark-submit --master URL JOB_FILE ARGS`. Options may come before or after JOB_FILE;
    arguments after `--` go to the job untouched. The exit code is the job's.
    """
    try:
        # CHANDY_CONFIG set in the shell is the base; the command line's options override it
        config = configuration_from_environment().to_dict()
    except ConfigurationError as exc:
        raise CliError(str(exc)) from None
    config.update(
        job_config(parallelism, restore_path, allow_non_restored_state, claim_mode, dynamic, trust_snapshot)
    )
    _check_settings(config, dynamic)
    if config.get(_JOB_ID_KEY) is not None:
        config[_JOB_ID_KEY] = check_job_id(str(config[_JOB_ID_KEY]))
    if log_file is not None and not detached:
        raise CliError("--log-file is for --detached runs (an attached run's output is this terminal's)")
    files = _py_files(py_files)
    command = _command(job_file, args, master, files)
    if detached:
        job_id = str(config.setdefault(_JOB_ID_KEY, uuid.uuid4().hex))
        _run_detached(command, config, job_id, log_file, files)
        return
    job_id_value = config.get(_JOB_ID_KEY)
    if job_id_value is not None:
        click.echo(f"Job has been submitted with JobID {job_id_value}")
    sys.exit(_run_attached(command, config, files))


def _check_settings(config: dict[str, Any], dynamic: tuple[str, ...]) -> None:
    """Every setting is checked now, at submission, whether or not the job overrides it later
    (a job that sets its own parallelism would otherwise run with ``-D parallelism.default=four``
    silently ignored): an unknown key or a bad value is one error naming where it came from."""
    from_command_line = {pair.partition("=")[0].strip() for pair in dynamic}

    def where(key: str) -> str:
        if key in from_command_line:
            return f"-D {key}=...: "
        return f"{CONFIG_ENV_VAR}: " if key not in _OPTION_KEYS else ""

    try:
        check_configuration(Configuration(config), where)
    except ConfigurationError as exc:
        raise CliError(str(exc)) from None


def _py_files(given: tuple[str, ...]) -> tuple[str, ...]:
    """``--py-files`` as absolute paths, each checked to exist (the job would fail later,
    in a slot, with a less clear error)."""
    files = []
    for entry in given:
        for name in filter(None, (part.strip() for part in entry.split(","))):
            path = Path(name).expanduser()
            if not path.exists():
                raise CliError(f"--py-files: {name} does not exist")
            files.append(str(path.resolve()))
    return tuple(files)


def _environment(
    command: list[str], config: dict[str, Any], py_files: tuple[str, ...] = ()
) -> dict[str, str]:
    env = dict(os.environ)
    if config:
        env[CONFIG_ENV_VAR] = json.dumps(config)
    if py_files and Path(command[0]).name != "spark-submit":
        # a local run: the job and its local Spark's workers inherit this environment
        env["PYTHONPATH"] = os.pathsep.join([*py_files, *filter(None, [env.get("PYTHONPATH")])])
    if Path(command[0]).name == "spark-submit":
        # it would start the driver on whatever `python3` is on PATH, maybe one without chandy
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env


def _run_attached(command: list[str], config: dict[str, Any], py_files: tuple[str, ...] = ()) -> int:
    """Run the job in the foreground and report its exit code.

    Ctrl-C reaches the job too (same process group): it cancels its job, and this waits for
    it to end. A SIGTERM sent to this process alone (a supervisor stopping it, ``timeout``)
    is passed on to the job, which would otherwise run on without anyone waiting for it.
    """
    if Path(command[0]).name == "spark-submit":
        return _run_spark_submit_attached(command, config, py_files)
    process = subprocess.Popen(command, env=_environment(command, config, py_files))

    def forward(signum: int, frame: object) -> None:
        process.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                return _exit_code(process.wait())
            except KeyboardInterrupt:
                continue  # the job got the same SIGINT and is shutting down: wait for it
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_spark_submit_attached(command: list[str], config: dict[str, Any], py_files: tuple[str, ...]) -> int:
    """``spark-submit`` in the foreground, with Ctrl-C and SIGTERM for the job's driver only.

    spark-submit's JVM is the Spark driver, and the job's Python driver its child. Were both
    in the terminal's process group, Ctrl-C would stop the JVM (and its Spark context) under
    the job's own orderly cancel: slots reported lost, Spark's errors, no line saying how to
    resume. So spark-submit runs in a process group of its own, and this process passes
    Ctrl-C, SIGTERM and the terminal's hang-up (as SIGTERM) to the Python driver, whose id
    the driver writes into a file once a job runs (:func:`chandy.runtime.console.announce_driver`).
    Before that there is no job to keep, and the signal goes to spark-submit's whole group.
    """
    with tempfile.TemporaryDirectory(prefix="chandy-run-") as directory:
        pid_file = Path(directory) / "driver.pid"
        env = _environment(command, config, py_files)
        env[DRIVER_PID_FILE_ENV] = str(pid_file)
        process = subprocess.Popen(command, env=env, process_group=0)

        def forward(signum: int, frame: object) -> None:
            passed = signal.SIGTERM if signum == signal.SIGHUP else signum
            try:
                driver = int(pid_file.read_text())
            except (OSError, ValueError):  # no job yet: nothing to cancel in order
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, passed)
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(driver, passed)

        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {signum: signal.signal(signum, forward) for signum in handled}
        try:
            return _exit_code(process.wait())
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def private_log_directory() -> Path:
    """``<tmp>/chandy-<uid>``: where detached jobs log unless told otherwise, created 0700.

    The temporary directory is shared by every local user, and a job id can be fixed (so
    its log's name predicted): another user could plant a symbolic link there and have the
    job's output appended to a file of the victim's choosing, or read the log. A directory
    of our own, that no one else can enter, rules both out; one that is someone else's, a
    link, or open to others is refused rather than trusted.
    """
    directory = Path(tempfile.gettempdir()) / f"chandy-{os.getuid()}"
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise CliError(
            f"cannot create the log directory {directory}: {exc.strerror}; pass --log-file"
        ) from None
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        problem = "is a symbolic link" if stat.S_ISLNK(info.st_mode) else "is not a directory"
    elif info.st_uid != os.getuid():
        problem = f"belongs to another user (uid {info.st_uid})"
    elif stat.S_IMODE(info.st_mode) & 0o077:
        problem = f"is open to other users (mode {stat.S_IMODE(info.st_mode):o}, not 700)"
    else:
        return directory
    raise CliError(
        f"refusing to write the job's log into {directory}: it {problem}; remove it or pass --log-file"
    )


def open_log(path: Path) -> int:
    """Open (create 0600, or append to) a job's log, never through a symbolic link at
    ``path``: a planted link must not redirect the output to another file."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except OSError as exc:
        why = "it is a symbolic link, which is not followed" if exc.errno == errno.ELOOP else exc.strerror
        raise CliError(f"cannot write the job's log file {path}: {why}; pass --log-file") from None


def _run_detached(
    command: list[str],
    config: dict[str, Any],
    job_id: str,
    log_file: Path | None,
    py_files: tuple[str, ...] = (),
) -> None:
    """Start the job in its own session (it outlives this command and the terminal), its
    output to a log file, and return at once."""
    if log_file is None:
        log_path = private_log_directory() / f"job-{job_id}.log"
    else:
        log_path = log_file
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CliError(
                f"cannot create the directory of the log file {log_path}: {exc.strerror}"
            ) from None
    log = os.fdopen(open_log(log_path), "ab")
    # The job writes its REST address into this file once it serves it: the port may not be
    # rest.port (taken by another job), and the user should not have to dig it out of the log.
    with tempfile.TemporaryDirectory(prefix="chandy-run-") as directory:
        announced = Path(directory) / "rest-address"
        env = _environment(command, config, py_files)
        env[ANNOUNCE_FILE_ENV] = str(announced)
        with log:
            process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        click.echo(f"Job has been submitted with JobID {job_id}")
        click.echo(f"Its output goes to {log_path} (process {process.pid}).")
        url = _announced_address(announced, process, ANNOUNCE_TIMEOUT_S)
    if url is None:
        click.echo(f"Its REST API is not up after {ANNOUNCE_TIMEOUT_S:.0f} s; the log will name its address.")
    elif url == "":
        click.echo("It ended before it served its REST API: see the log.")
    elif url != "-":
        click.echo(f"REST API at {url}, dashboard {dashboard_link(url, job_id)}")


def _announced_address(path: Path, process: subprocess.Popen[bytes], timeout_s: float) -> str | None:
    """The line the job wrote into ``path``: its REST URL, ``-`` (it serves none), ``""`` (it
    exited without writing one) or ``None`` (nothing within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ended = process.poll() is not None  # before the read: a line written, then the end
        with contextlib.suppress(FileNotFoundError):
            line = path.read_text(errors="replace")
            if line.endswith("\n"):
                return line.strip()
        if ended:
            return ""
        if time.monotonic() >= deadline:
            return None
        time.sleep(ANNOUNCE_POLL_S)
