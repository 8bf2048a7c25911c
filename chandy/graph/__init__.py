"""The three graphs of a job: StreamGraph (what the user wrote), JobGraph
(operators chained into tasks) and ExecutionGraph (parallel subtasks and their
attempts, with the job's status)."""
