"""The exception that unwinds a cancelled task's thread."""


class TaskCancelledError(Exception):
    """Raised inside a task thread when its task was cancelled; never a failure."""
