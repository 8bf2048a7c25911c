"""Stream operators: what a task runs, one per node of the chain."""

from chandy.task.operators.base import Emit, StreamOperator

__all__ = ["Emit", "StreamOperator"]
