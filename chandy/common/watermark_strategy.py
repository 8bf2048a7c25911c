"""PyFlink's ``pyflink.common.watermark_strategy``: ``WatermarkStrategy`` and ``TimestampAssigner``."""

from chandy.core.watermark_strategy import TimestampAssigner, WatermarkStrategy

__all__ = ["TimestampAssigner", "WatermarkStrategy"]
