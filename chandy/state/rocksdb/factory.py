"""Builds the RocksDB keyed state backends of one slot (``state.backend.type: rocksdb``).

Each backend (one per keyed operator subtask) gets a directory of its own under
``state.backend.rocksdb.localdir`` (several directories, comma-separated, are used
round-robin by slot, as Flink spreads instances over its local directories), or under
the system's temporary directory; :meth:`RocksDBKeyedStateBackend.dispose` deletes it.
A process killed outright (a SIGKILLed slot, a lost executor) disposes nothing: its
directories are named for its host and pid, and the next factory built on that host
under the same local directory deletes those whose process is gone (Flink leaves them to
the next TaskManager start the same way).
The slot's backends share one memory budget (:mod:`chandy.state.rocksdb.resources`).

Both things a user's setup can get wrong fail here, before any record, with the cause
and the fix: ``rocksdict`` missing, and a local directory that cannot be written.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import MutableMapping
from typing import Any

from chandy.config.configuration import Configuration
from chandy.config.options import CheckpointingOptions, RocksDBOptions
from chandy.errors import ConfigurationError, UnrecoverableError
from chandy.state.backend import KeyedStateBackend, KeyedStateBackendFactory
from chandy.state.key_groups import KeyGroupRange
from chandy.util.clock import Clock

log = logging.getLogger(__name__)


class RocksDBSetupError(UnrecoverableError, ConfigurationError):
    """The RocksDB state backend cannot start here: a restart would fail the same way."""


def _require_rocksdict() -> None:
    try:
        import rocksdict  # noqa: F401
    except ImportError as e:
        raise RocksDBSetupError(
            f"state.backend.type is 'rocksdb' but the RocksDB binding 'rocksdict' cannot be imported "
            f"({e}). Install it where the tasks run (pip install rocksdict), or set "
            "state.backend.type: hashmap"
        ) from e


def local_directories(configuration: Configuration) -> list[str]:
    """The directories backends may put their databases in (the temp dir by default)."""
    configured = configuration.get(RocksDBOptions.LOCAL_DIRECTORIES)
    if not configured:
        return [tempfile.gettempdir()]
    return [path.strip() for path in str(configured).split(",") if path.strip()]


DIRECTORY_PREFIX = "chandy-rocksdb-"


def _owner_tag(pid: int) -> str:
    """What a backend directory's name says of the process that owns it."""
    return f"{socket.gethostname()}-p{pid}-"


def backend_directory(root: str) -> str:
    """A new directory for one backend under ``root``, created now (so an unwritable
    ``root`` fails here, naming the option to change)."""
    try:
        os.makedirs(root, exist_ok=True)
        return tempfile.mkdtemp(prefix=DIRECTORY_PREFIX + _owner_tag(os.getpid()), dir=root)
    except OSError as e:
        raise RocksDBSetupError(
            f"the RocksDB state backend cannot create its working directory under '{root}' "
            f"({e.strerror or e}). Set {RocksDBOptions.LOCAL_DIRECTORIES.key} to a writable "
            "local directory (fast local disk: every state access may read it)"
        ) from e


def delete_directories_of_dead_processes(root: str) -> list[str]:
    """Delete the backend directories under ``root`` that processes of this host left when
    they were killed (their pid is gone); returns their names. A directory of a live
    process, or of another host sharing ``root``, is never touched."""
    prefix = DIRECTORY_PREFIX + socket.gethostname() + "-p"
    deleted: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return deleted
    for name in names:
        pid_text = name[len(prefix) :].split("-", 1)[0] if name.startswith(prefix) else ""
        if not pid_text.isdigit() or _alive(int(pid_text)) or _database_in_use(os.path.join(root, name)):
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        deleted.append(name)
    if deleted:
        log.info("deleted %d RocksDB directories of killed processes under %s", len(deleted), root)
    return deleted


def _database_in_use(directory: str) -> bool:
    """True if a live process holds the database's lock (RocksDB's ``LOCK`` file): a process
    of another pid namespace on this host (a container sharing the host's name and this
    directory) looks dead by its pid and must keep its database."""
    lock_path = os.path.join(directory, "db", "LOCK")
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except OSError:
        return False  # no database (yet, or any more)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists (owned by another user)
        return True
    return True


def rocksdb_backend_factory(
    configuration: Configuration, shared_resources: MutableMapping[Any, Any], slot_index: int
) -> KeyedStateBackendFactory:
    """The factory of RocksDB backends for the tasks of slot ``slot_index`` (see
    :func:`chandy.state.factory.keyed_state_backend_factory`)."""
    _require_rocksdict()
    from chandy.state.rocksdb.backend import RocksDBKeyedStateBackend
    from chandy.state.rocksdb.resources import SlotMemory, memory_budget, slot_memory

    directories = local_directories(configuration)
    root = directories[slot_index % len(directories)]
    backend_directory_check = backend_directory(root)  # fail before the first record, not at it
    os.rmdir(backend_directory_check)
    delete_directories_of_dead_processes(root)
    memory = slot_memory(configuration, shared_resources, slot_index)
    budget, _ = memory_budget(configuration)
    incremental = bool(configuration.get(CheckpointingOptions.INCREMENTAL))

    def create(
        key_group_range: KeyGroupRange, max_parallelism: int, owner: str, clock: Clock
    ) -> KeyedStateBackend:
        return RocksDBKeyedStateBackend(
            key_group_range,
            max_parallelism,
            directory=backend_directory(root),
            memory=memory if memory is not None else SlotMemory.of(budget),
            incremental=incremental,
            owner=owner,
            clock=clock,
        )

    return create
