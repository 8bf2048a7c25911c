"""The ``chandy`` command's entry point (console script ``chandy = chandy.cli.main:main``)."""

from __future__ import annotations

import logging

import click

from chandy.cli.checkpoints import checkpoint
from chandy.cli.jobs import cancel, list_jobs, savepoint, stop
from chandy.cli.run import run


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="chandy", prog_name="chandy")
@click.option("-v", "--verbose", is_flag=True, help="Log what the command does (to stderr).")
def cli(verbose: bool) -> None:
    """Run chandy jobs and operate them: Flink's CLI for chandy.

    \b
    chandy run job.py [ARGS]...        start a job (-p, -s SAVEPOINT, --detached, --master URL)
    chandy list                        jobs of the REST API at -m HOST:PORT (default 127.0.0.1:8081)
    chandy savepoint JOBID [DIR]       take a savepoint; the job keeps running
    chandy stop [--drain] JOBID        stop with a savepoint (-p DIR)
    chandy cancel JOBID                cancel without a savepoint
    chandy checkpoint inspect PATH     what a checkpoint or savepoint holds
    chandy checkpoint list DIR         every checkpoint and savepoint under DIR, valid or not
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )


for command in (run, list_jobs, savepoint, stop, cancel, checkpoint):
    cli.add_command(command)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="chandy")
