"""State backends as PyFlink names them: where a job's keyed state lives while it runs.

``env.set_state_backend(EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=True))``
writes the configuration keys a config file would (``state.backend.type``,
``execution.checkpointing.incremental``, ``state.backend.rocksdb.localdir``), so code and
configuration are two spellings of one setting, as with :class:`CheckpointConfig`. The objects
hold settings only: every operator subtask builds its own backend from the job's configuration
(``chandy.state.factory``), on the driver's threads or in a Spark slot alike.

Where checkpoints go is the checkpoint storage's business
(``env.get_checkpoint_config().set_checkpoint_storage(...)``), as in Flink 1.13+; only the
deprecated :class:`RocksDBStateBackend` still takes a checkpoint directory.
"""

from __future__ import annotations

import os
import warnings
from abc import ABC, abstractmethod

from chandy.config import Configuration
from chandy.config.options import CheckpointingOptions, RocksDBOptions, StateBackendOptions

__all__ = [
    "EmbeddedRocksDBStateBackend",
    "HashMapStateBackend",
    "RocksDBStateBackend",
    "StateBackend",
]

#: How ``state.backend.rocksdb.localdir`` separates several directories (Flink's spelling).
_PATH_SEPARATOR = ","


class StateBackend(ABC):
    """Where keyed state lives while a job runs, and how it is checkpointed.

    :class:`HashMapStateBackend` keeps state as Python objects in memory: the fastest, for
    state that fits in the slot's memory. :class:`EmbeddedRocksDBStateBackend` keeps it
    serialized in an embedded RocksDB on local disk, with a bounded cache in memory: for state
    larger than memory, and the only one with incremental checkpoints. See
    ``docs/state-backends.md``.
    """

    @abstractmethod
    def _write_to(self, configuration: Configuration) -> None:
        """Write this backend's settings into a job's configuration."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return str(self)


class HashMapStateBackend(StateBackend):
    """Keyed state as Python objects in per-key-group dictionaries (the default).

    Fast (a state access is a dict lookup) and checkpointed in full every time; all the state
    of a slot's subtasks must fit in that slot's memory.
    """

    def _write_to(self, configuration: Configuration) -> None:
        configuration.set(StateBackendOptions.TYPE, "hashmap")

    def __str__(self) -> str:
        return "HashMapStateBackend"


class EmbeddedRocksDBStateBackend(StateBackend):
    """Keyed state in an embedded RocksDB per operator subtask, on local disk.

    State can grow far beyond memory: the slot's memory budget
    (``taskmanager.memory.managed.size``, or ``state.backend.rocksdb.memory.fixed-per-slot``)
    bounds RocksDB's block cache, its write buffers and chandy's cache of decoded values
    together. With incremental checkpoints, a checkpoint uploads only the RocksDB files the
    checkpoint storage does not have yet.

    :param enable_incremental_checkpointing: ``True`` or ``False`` sets
        ``execution.checkpointing.incremental``; ``None`` (the default) leaves it to the
        configuration (off unless configured), as Flink's ``TernaryBoolean.UNDEFINED`` does.
    """

    def __init__(self, enable_incremental_checkpointing: bool | None = None) -> None:
        if enable_incremental_checkpointing is not None and not isinstance(
            enable_incremental_checkpointing, bool
        ):
            raise TypeError(
                "EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=...) takes True, False "
                f"or None (leave it to the configuration), got {enable_incremental_checkpointing!r} "
                f"({type(enable_incremental_checkpointing).__name__})"
            )
        self._incremental = enable_incremental_checkpointing
        self._db_storage_paths: tuple[str, ...] = ()

    def is_incremental_checkpoints_enabled(self) -> bool:
        """Whether this backend asks for incremental checkpoints (``False`` when left to the
        configuration, whose default is off; :meth:`StreamExecutionEnvironment.get_state_backend`
        reports the configuration's value)."""
        return bool(self._incremental)

    def set_db_storage_paths(self, *paths: str | os.PathLike[str] | None) -> None:
        """The local directories the RocksDB instances keep their files in
        (``state.backend.rocksdb.localdir``). They need not survive the machine: the state is
        recovered from checkpoints. Each operator subtask's database lives in one of them (a
        subdirectory per instance, deleted when the subtask ends); several directories spread
        the instances over several disks. No argument (or ``None``) restores the default, the
        system's temporary directory.

        :raises TypeError: a path that is not a string or ``os.PathLike``.
        :raises ValueError: an empty path, or one containing ``,`` (the key's separator).
        """
        if len(paths) == 1 and paths[0] is None:
            paths = ()
        checked: list[str] = []
        for path in paths:
            if not isinstance(path, str | os.PathLike):
                raise TypeError(
                    f"set_db_storage_paths() takes directory paths as str or os.PathLike, got "
                    f"{path!r} ({type(path).__name__})"
                )
            text = os.fspath(path)
            if not text:
                raise ValueError("set_db_storage_paths(): an empty path names no directory")
            if _PATH_SEPARATOR in text:
                raise ValueError(
                    f"set_db_storage_paths(): the path {text!r} contains {_PATH_SEPARATOR!r}, which "
                    "state.backend.rocksdb.localdir uses to separate directories; choose a directory "
                    "whose path has none"
                )
            checked.append(text)
        self._db_storage_paths = tuple(checked)

    def get_db_storage_paths(self) -> list[str]:
        """The configured local directories (empty: the system's temporary directory)."""
        return list(self._db_storage_paths)

    def _write_to(self, configuration: Configuration) -> None:
        configuration.set(StateBackendOptions.TYPE, "rocksdb")
        if self._incremental is not None:
            configuration.set(CheckpointingOptions.INCREMENTAL, self._incremental)
        if self._db_storage_paths:
            configuration.set(RocksDBOptions.LOCAL_DIRECTORIES, _PATH_SEPARATOR.join(self._db_storage_paths))

    def __str__(self) -> str:
        incremental = "UNDEFINED" if self._incremental is None else str(self._incremental).upper()
        paths = ", ".join(self._db_storage_paths) or "the temporary directory"
        return f"EmbeddedRocksDBStateBackend{{incremental={incremental}, local directories={paths}}}"


class RocksDBStateBackend(EmbeddedRocksDBStateBackend):
    """PyFlink 1.x's ``RocksDBStateBackend``: the RocksDB backend together with a checkpoint
    directory. Deprecated, as in Flink since 1.13: use :class:`EmbeddedRocksDBStateBackend`
    and ``env.get_checkpoint_config().set_checkpoint_storage(checkpoint_data_uri)``.

    :param checkpoint_data_uri: where checkpoints are written (``execution.checkpointing.dir``);
        ``None`` leaves the checkpoint storage as configured.
    """

    def __init__(
        self, checkpoint_data_uri: str | None = None, enable_incremental_checkpointing: bool | None = None
    ) -> None:
        warnings.warn(
            "RocksDBStateBackend is deprecated (as in Flink 1.13+): use EmbeddedRocksDBStateBackend() "
            "and env.get_checkpoint_config().set_checkpoint_storage(checkpoint_data_uri)",
            DeprecationWarning,
            stacklevel=2,
        )
        if checkpoint_data_uri is not None and not isinstance(checkpoint_data_uri, str):
            raise TypeError(
                "RocksDBStateBackend(checkpoint_data_uri=...) takes a path or URI as a string, got "
                f"{checkpoint_data_uri!r} ({type(checkpoint_data_uri).__name__})"
            )
        super().__init__(enable_incremental_checkpointing)
        self._checkpoint_data_uri = checkpoint_data_uri

    def get_checkpoint_backend(self) -> str | None:
        """The checkpoint directory this backend was given (``None``: as configured)."""
        return self._checkpoint_data_uri

    def _write_to(self, configuration: Configuration) -> None:
        super()._write_to(configuration)
        if self._checkpoint_data_uri is not None:
            configuration.set(CheckpointingOptions.DIRECTORY, self._checkpoint_data_uri)
            configuration.set(CheckpointingOptions.STORAGE, "filesystem")


def state_backend_of(configuration: Configuration) -> StateBackend | None:
    """The backend a job's configuration describes, or ``None`` when ``state.backend.type`` is
    not set (the default, the hashmap backend, applies): Flink's ``getStateBackend()``."""
    if not configuration.contains(StateBackendOptions.TYPE):
        return None
    if configuration.get(StateBackendOptions.TYPE) == "hashmap":
        return HashMapStateBackend()
    incremental: bool | None = (
        configuration.get(CheckpointingOptions.INCREMENTAL)
        if configuration.contains(CheckpointingOptions.INCREMENTAL)
        else None
    )
    backend = EmbeddedRocksDBStateBackend(incremental)
    local = configuration.get(RocksDBOptions.LOCAL_DIRECTORIES)
    if local:
        backend._db_storage_paths = tuple(p.strip() for p in local.split(_PATH_SEPARATOR) if p.strip())
    return backend
