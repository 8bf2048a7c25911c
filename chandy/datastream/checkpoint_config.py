"""PyFlink's ``pyflink.datastream.checkpoint_config`` and ``checkpointing_mode``."""

from chandy.api.checkpoint_config import CheckpointConfig
from chandy.config.options import CheckpointingMode, ExternalizedCheckpointRetention

__all__ = ["CheckpointConfig", "CheckpointingMode", "ExternalizedCheckpointRetention"]
