"""The job side: JobMaster (scheduling, failover, job status) and the executors
that place tasks in processes (local: threads here; spark: barrier-mode tasks)."""
