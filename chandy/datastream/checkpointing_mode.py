"""PyFlink's ``pyflink.datastream.checkpointing_mode``: ``CheckpointingMode``."""

from chandy.config.options import CheckpointingMode

__all__ = ["CheckpointingMode"]
