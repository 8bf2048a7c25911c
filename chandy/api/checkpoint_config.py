"""CheckpointConfig: PyFlink's checkpoint settings, stored as Flink's configuration keys.

Every setter writes the same key ``env.configure({...})`` would, so code and
configuration files are two spellings of one setting, and ``execute()``
validates both the same way.
"""

from __future__ import annotations

import warnings

from chandy.config import Configuration
from chandy.config.options import (
    CheckpointingMode,
    CheckpointingOptions,
    ExternalizedCheckpointRetention,
)
from chandy.core.time import Duration, Time, to_millis

__all__ = ["CheckpointConfig", "CheckpointingMode", "ExternalizedCheckpointRetention"]


class CheckpointConfig:
    """Checkpoint settings of one environment (``env.get_checkpoint_config()``)."""

    def __init__(self, configuration: Configuration) -> None:
        self._config = configuration

    def _set(self, option: object, value: object) -> CheckpointConfig:
        # Refuse a bad value at once, and leave the configuration as it was: a caller that
        # catches the error must not find the bad value stored.
        trial = self._config.copy()
        trial.set(option, value)  # type: ignore[arg-type]
        trial.get(option)  # type: ignore[arg-type]
        self._config.set(option, value)  # type: ignore[arg-type]
        return self

    def is_checkpointing_enabled(self) -> bool:
        """Whether the job takes periodic checkpoints (``enable_checkpointing`` was called with an
        interval)."""
        return self._config.get(CheckpointingOptions.INTERVAL) is not None

    def set_checkpoint_interval(self, checkpoint_interval: int) -> CheckpointConfig:
        """Milliseconds between the starts of two periodic checkpoints (at least 10)."""
        return self._set(CheckpointingOptions.INTERVAL, checkpoint_interval)

    def get_checkpoint_interval(self) -> int:
        """The interval in ms, or -1 when checkpointing is off."""
        interval = self._config.get(CheckpointingOptions.INTERVAL)
        return -1 if interval is None else interval

    def set_checkpointing_mode(self, checkpointing_mode: CheckpointingMode) -> CheckpointConfig:
        """Choose ``EXACTLY_ONCE`` (aligned barriers: state counts every record once) or ``AT_LEAST_ONCE`` (no
        alignment wait; after a failure some records are counted again)."""
        return self._set(CheckpointingOptions.MODE, checkpointing_mode)

    def get_checkpointing_mode(self) -> CheckpointingMode:
        """``EXACTLY_ONCE`` (barriers aligned, the default) or ``AT_LEAST_ONCE`` (barriers not aligned;
        records may be counted again after a failure)."""
        return self._config.get(CheckpointingOptions.MODE)

    def set_checkpoint_timeout(self, checkpoint_timeout: int) -> CheckpointConfig:
        """Milliseconds after which a checkpoint that has not completed is aborted."""
        return self._set(CheckpointingOptions.TIMEOUT, checkpoint_timeout)

    def get_checkpoint_timeout(self) -> int:
        """Milliseconds after which a checkpoint that has not completed is aborted."""
        return self._config.get(CheckpointingOptions.TIMEOUT)

    def set_min_pause_between_checkpoints(self, min_pause_between_checkpoints: int) -> CheckpointConfig:
        """Least milliseconds from one checkpoint's completion to the next one's start."""
        return self._set(CheckpointingOptions.MIN_PAUSE, min_pause_between_checkpoints)

    def get_min_pause_between_checkpoints(self) -> int:
        """The least time in milliseconds between the end of one checkpoint and the start of the next, which
        leaves the job time to process records under slow checkpoints."""
        return self._config.get(CheckpointingOptions.MIN_PAUSE)

    def set_max_concurrent_checkpoints(self, max_concurrent_checkpoints: int) -> CheckpointConfig:
        """Allow this many checkpoints in progress at once (unaligned checkpoints need 1)."""
        return self._set(CheckpointingOptions.MAX_CONCURRENT, max_concurrent_checkpoints)

    def get_max_concurrent_checkpoints(self) -> int:
        """How many checkpoints may be in progress at once."""
        return self._config.get(CheckpointingOptions.MAX_CONCURRENT)

    def set_tolerable_checkpoint_failure_number(self, number: int) -> CheckpointConfig:
        """Consecutive failed checkpoints tolerated before the job fails over."""
        return self._set(CheckpointingOptions.TOLERABLE_FAILURES, number)

    def get_tolerable_checkpoint_failure_number(self) -> int:
        """How many checkpoint failures in a row the job tolerates before it fails over."""
        return self._config.get(CheckpointingOptions.TOLERABLE_FAILURES)

    def set_externalized_checkpoint_retention(
        self, retention: ExternalizedCheckpointRetention
    ) -> CheckpointConfig:
        """Keep completed checkpoints when the job is cancelled (``RETAIN_ON_CANCELLATION``) or delete them
        (``DELETE_ON_CANCELLATION``), so a cancelled job can be resumed from its latest checkpoint."""
        return self._set(CheckpointingOptions.EXTERNALIZED_RETENTION, retention)

    def enable_externalized_checkpoints(
        self, cleanup_mode: ExternalizedCheckpointRetention
    ) -> CheckpointConfig:
        """PyFlink 1.x name of :meth:`set_externalized_checkpoint_retention`."""
        return self.set_externalized_checkpoint_retention(cleanup_mode)

    def get_externalized_checkpoint_retention(self) -> ExternalizedCheckpointRetention:
        """Whether completed checkpoints are kept when the job is cancelled or fails for good, so that it can
        be restored from them later."""
        return self._config.get(CheckpointingOptions.EXTERNALIZED_RETENTION)

    def is_externalized_checkpoints_enabled(self) -> bool:
        """Whether completed checkpoints outlive the job (any retention but
        ``NO_EXTERNALIZED_CHECKPOINTS``)."""
        return (
            self.get_externalized_checkpoint_retention()
            is not ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS
        )

    def set_checkpoint_storage(self, storage: str) -> CheckpointConfig:
        """Write checkpoints to a directory: a path or URI (``file:///...``, ``s3://...``)."""
        self._set(CheckpointingOptions.DIRECTORY, storage)
        return self._set(CheckpointingOptions.STORAGE, "filesystem")

    def set_checkpoint_storage_dir(self, checkpoint_path: str) -> CheckpointConfig:
        """PyFlink's other name for :meth:`set_checkpoint_storage`: where checkpoints are written (a path or
        fsspec URI every slot can reach)."""
        return self.set_checkpoint_storage(checkpoint_path)

    def get_checkpoint_storage(self) -> str | None:
        """The checkpoint directory (a path or fsspec URI), or ``None`` when none is set."""
        return self._config.get(CheckpointingOptions.DIRECTORY)

    def set_num_retained_checkpoints(self, number: int) -> CheckpointConfig:
        """Keep this many completed checkpoints (at least 1), to restore from an older one if the latest is
        unusable."""
        return self._set(CheckpointingOptions.NUM_RETAINED, number)

    def get_num_retained_checkpoints(self) -> int:
        """How many completed checkpoints are kept; older ones are deleted as new ones complete."""
        return self._config.get(CheckpointingOptions.NUM_RETAINED)

    def is_unaligned_checkpoints_enabled(self) -> bool:
        """Whether checkpoints are unaligned (``execution.checkpointing.unaligned.enabled``)."""
        return self._config.get(CheckpointingOptions.UNALIGNED)

    def enable_unaligned_checkpoints(self, enabled: bool = True) -> CheckpointConfig:
        """Unaligned checkpoints: the first barrier at a task overtakes the data queued in its
        input channels, the task snapshots at once and the overtaken data is written with the
        checkpoint, so checkpoints stay fast under backpressure. EXACTLY_ONCE and one
        checkpoint at a time only (``execute()`` refuses other settings); savepoints are always
        aligned. See docs/unaligned-checkpoints.md."""
        if not isinstance(enabled, bool):
            raise TypeError(f"enable_unaligned_checkpoints takes a bool, got {enabled!r}")
        return self._set(CheckpointingOptions.UNALIGNED, enabled)

    def disable_unaligned_checkpoints(self) -> CheckpointConfig:
        """Make every checkpoint aligned again (the default): barriers wait for the records queued ahead of
        them, and no in-flight data is written."""
        return self.enable_unaligned_checkpoints(False)

    def set_force_unaligned_checkpoints(self, force_unaligned_checkpoints: bool = True) -> CheckpointConfig:
        """PyFlink's switch that lets unaligned checkpoints run where Flink would otherwise keep
        them aligned (iterative jobs). chandy has no iterations and no exchange that unaligned
        checkpoints leave out, so the value is stored (``execution.checkpointing.unaligned.forced``)
        and changes nothing: with unaligned checkpoints enabled, every checkpoint of every job
        is unaligned or aligned-with-timeout as configured."""
        if not isinstance(force_unaligned_checkpoints, bool):
            raise TypeError(
                f"set_force_unaligned_checkpoints takes a bool, got {force_unaligned_checkpoints!r}"
            )
        return self._set(CheckpointingOptions.FORCE_UNALIGNED, force_unaligned_checkpoints)

    def is_force_unaligned_checkpoints(self) -> bool:
        """The value of ``execution.checkpointing.unaligned.forced`` (see
        :meth:`set_force_unaligned_checkpoints`)."""
        return self._config.get(CheckpointingOptions.FORCE_UNALIGNED)

    def set_aligned_checkpoint_timeout(self, alignment_timeout: Duration | Time | int) -> CheckpointConfig:
        """With unaligned checkpoints enabled: 0 makes every checkpoint unaligned from the start;
        a positive timeout (a ``Duration``, or milliseconds) starts each checkpoint aligned and
        switches it to unaligned at a task still aligning that long after the checkpoint started."""
        millis = to_millis(alignment_timeout, "the aligned checkpoint timeout")
        return self._set(CheckpointingOptions.ALIGNED_CHECKPOINT_TIMEOUT, millis)

    def get_aligned_checkpoint_timeout(self) -> Duration:
        """How long a barrier may wait for alignment before the checkpoint goes unaligned at that task (0:
        unaligned from the start)."""
        return Duration.of_millis(self._config.get(CheckpointingOptions.ALIGNED_CHECKPOINT_TIMEOUT))

    def set_alignment_timeout(self, alignment_timeout: Duration | Time | int) -> CheckpointConfig:
        """Deprecated (PyFlink 2.0): use :meth:`set_aligned_checkpoint_timeout`."""
        warnings.warn(
            "set_alignment_timeout is deprecated; use set_aligned_checkpoint_timeout",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.set_aligned_checkpoint_timeout(alignment_timeout)

    def get_alignment_timeout(self) -> Duration:
        """Deprecated (PyFlink 2.0): use :meth:`get_aligned_checkpoint_timeout`."""
        warnings.warn(
            "get_alignment_timeout is deprecated; use get_aligned_checkpoint_timeout",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.get_aligned_checkpoint_timeout()
