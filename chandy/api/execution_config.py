"""ExecutionConfig: PyFlink's ``env.get_config()``, stored as Flink's configuration keys.

PyFlink jobs set the watermark interval here
(``env.get_config().set_auto_watermark_interval(ms)``); the setter writes the
key ``env.configure({"pipeline.auto-watermark-interval": ...})`` would, so both
spellings are one setting, validated the same way.
"""

from __future__ import annotations

from chandy.config import Configuration
from chandy.config.options import PipelineOptions

__all__ = ["ExecutionConfig"]


class ExecutionConfig:
    """Execution settings of one environment (``env.get_config()``)."""

    def __init__(self, configuration: Configuration) -> None:
        self._config = configuration

    def set_auto_watermark_interval(self, interval: int) -> ExecutionConfig:
        """How often (ms) sources and ``assign_timestamps_and_watermarks`` emit watermarks;
        0 turns periodic watermarks off (the only one is then the last, at the end of input)."""
        self._config.set(PipelineOptions.AUTO_WATERMARK_INTERVAL, interval)
        self._config.get(PipelineOptions.AUTO_WATERMARK_INTERVAL)  # refuse a bad value at once
        return self

    def get_auto_watermark_interval(self) -> int:
        """Milliseconds between periodic watermarks at the sources (0: only the last one, at the end of the
        input)."""
        return self._config.get(PipelineOptions.AUTO_WATERMARK_INTERVAL)
