"""The ``chandy`` command: run a job, and operate running jobs and their checkpoints.

``chandy run`` starts a job file (as ``python`` or through ``spark-submit``) with settings
from the command line; ``list``, ``savepoint``, ``stop`` and ``cancel`` talk to a running
job's REST API as Flink's CLI does; ``checkpoint inspect`` and ``checkpoint list`` read
checkpoints and savepoints on disk without running anything. See ``docs/cli.md``.
"""
