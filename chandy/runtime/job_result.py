"""What ``env.execute()`` returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobExecutionResult:
    """The outcome of a finished job (PyFlink's ``JobExecutionResult``)."""

    job_id: str
    job_name: str
    net_runtime_ms: int
    restarts: int = 0

    def get_job_id(self) -> str:
        """The id of the job that ran."""
        return self.job_id

    def get_job_name(self) -> str:
        """The name given to ``execute()``."""
        return self.job_name

    def get_net_runtime(self) -> int:
        """Milliseconds from the job's start to its end."""
        return self.net_runtime_ms

    def is_job_execution_result(self) -> bool:
        """``True``: this is the result of a finished job (PyFlink's API asks)."""
        return True
