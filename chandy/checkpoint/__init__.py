"""The coordinator side of checkpointing (Flink's ``CheckpointCoordinator`` and friends).

Nothing here imports ``chandy.task``: the coordinator reaches tasks only through
:class:`~chandy.messages.checkpoint.TaskCheckpointGateway` and hears from them
through acknowledge and decline messages.
"""
