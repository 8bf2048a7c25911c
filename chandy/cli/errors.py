"""How the ``chandy`` command fails: one line naming the cause and the fix, and a non-zero exit."""

from __future__ import annotations

import click


class CliError(click.ClickException):
    """A failure the user can act on; click prints ``Error: <message>`` to stderr and exits 1.

    No traceback: every message says what went wrong and what to do, so a stack trace
    would only bury it.
    """

    exit_code = 1
