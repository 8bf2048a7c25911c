"""The secret that signs checkpoints and savepoints, and where a deployment keeps it.

A restore unpickles state, and unpickling runs code: whoever can put a ``_metadata`` (or
a state file it lists) where chandy restores from could otherwise run code in the driver
and in every task. So every ``_metadata`` chandy writes carries an HMAC-SHA256 under a
key the deployment owns (:mod:`chandy.checkpoint.metadata`), and a restore checks it
before anything of the snapshot is parsed or unpickled. The key, first found wins:

1. the environment variable ``CHANDY_SNAPSHOT_KEY`` (the secret itself, as text);
2. the file named by ``execution.checkpointing.snapshot-key-file``;
3. ``<execution.checkpointing.dir>/.chandy-snapshot-key``, generated on first use (on S3
   too: created with a conditional PUT, reached with the job's ``s3.*`` settings);
4. ``<execution.checkpointing.savepoint-dir>/.chandy-snapshot-key``, generated on first use;
5. with no directory either, the user's own key, ``~/.config/chandy/snapshot-key``
   (``$XDG_CONFIG_HOME``), generated on first use: a savepoint written to a directory
   named in the request restores in the next job of the same user without configuration.

A generated key is 32 random bytes (hex), created mode 0600 and published with an
exclusive link, so drivers starting at once against the same storage agree on one key;
a driver that finds the file reads it. It is only as safe as that directory: whoever can
replace it can sign. On storage others can write, set 1 or 2 to a secret kept elsewhere.
See docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from chandy.config import Configuration
from chandy.config.options import CheckpointingOptions
from chandy.errors import StorageError
from chandy.storage.filesystem import (
    DEFAULT_OBJECT_STORE,
    FsspecFileSystem,
    LocalFileSystem,
    ObjectStoreOptions,
    resolve,
)

log = logging.getLogger(__name__)

#: The environment variable holding the key itself (wins over every other source).
KEY_ENV_VAR = "CHANDY_SNAPSHOT_KEY"
#: The name of a generated key file, in the root of checkpoint (or savepoint) storage.
KEY_FILE_NAME = ".chandy-snapshot-key"
#: A key file is a few dozen bytes: anything larger is not one (and is not read whole).
_MAX_KEY_FILE_BYTES = 4096
#: The name of the per-user key file (see :func:`user_key_path`).
USER_KEY_FILE_NAME = "snapshot-key"
_KEY_ID_LABEL = b"chandy snapshot key id"


@dataclass(frozen=True)
class SnapshotKey:
    """A signing key and where it came from (named in errors; the secret never is)."""

    secret: bytes = field(repr=False)
    #: "environment variable CHANDY_SNAPSHOT_KEY", "key file /x/.chandy-snapshot-key", ...
    source: str

    def __post_init__(self) -> None:
        if not self.secret:
            raise StorageError(f"the snapshot key from {self.source} is empty")

    @property
    def key_id(self) -> bytes:
        """8 bytes that name the key without revealing it: a file signed with another key is
        told apart from a modified one, and the error can say so."""
        return hmac.new(self.secret, _KEY_ID_LABEL, hashlib.sha256).digest()[:8]

    def sign(self, data: bytes) -> bytes:
        return hmac.new(self.secret, data, hashlib.sha256).digest()


def snapshot_key(config: Configuration, environ: Mapping[str, str] | None = None) -> SnapshotKey | None:
    """This deployment's key (see the module for the order), generating the key file in
    the checkpoint (or savepoint) storage's root if none exists; ``None`` if the
    deployment names no key and has no storage directory to keep one in."""
    from_env = environment_key(environ)
    if from_env is not None:
        return from_env
    object_store = ObjectStoreOptions.from_configuration(config, environ)
    key_file = config.get(CheckpointingOptions.SNAPSHOT_KEY_FILE)
    if key_file:
        return read_key_file(key_file, object_store)
    for option in (CheckpointingOptions.DIRECTORY, CheckpointingOptions.SAVEPOINT_DIRECTORY):
        root = config.get(option)
        if root:
            return key_at_root(root, object_store)
    return user_key(environ)


def user_key_path(environ: Mapping[str, str] | None = None) -> str:
    """Where the key of a deployment without storage directories is kept: the user's
    ``$XDG_CONFIG_HOME/chandy/snapshot-key`` (``~/.config/chandy/snapshot-key``)."""
    env = os.environ if environ is None else environ
    config_home = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(config_home, "chandy", USER_KEY_FILE_NAME)


def user_key(environ: Mapping[str, str] | None = None) -> SnapshotKey | None:
    """The key of this user on this machine, generated on first use (directory 0700, file
    0600): a job that names neither a key nor a storage directory (a savepoint written to a
    directory given with the request, then restored with ``set_restore_path``) signs and
    checks with it. ``None`` if the user has no writable home."""
    path = user_key_path(environ)
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        _create_local_key_file(path)
    except OSError as exc:
        log.warning("No snapshot key: cannot create %s (%s); set %s.", path, exc, KEY_ENV_VAR)
        return None
    return read_key_file(path)


def environment_key(environ: Mapping[str, str] | None = None) -> SnapshotKey | None:
    """The key in ``CHANDY_SNAPSHOT_KEY``, if set (it wins over every other source)."""
    value = (os.environ if environ is None else environ).get(KEY_ENV_VAR)
    return SnapshotKey(value.encode("utf-8"), f"environment variable {KEY_ENV_VAR}") if value else None


def key_at_root(root: str, object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE) -> SnapshotKey:
    """The key kept in storage root ``root`` (``<root>/.chandy-snapshot-key``), generated
    there first if it does not exist yet.

    On S3 the key object is created with a conditional PUT (``If-None-Match: *``): two
    drivers racing agree on one key, as the exclusive link does on a local disk. The object
    is only as private as the bucket's policy makes it (object stores have no file modes)."""
    fs, base = resolve(root, options=object_store)
    path = fs.join(base, KEY_FILE_NAME)
    try:
        fs.mkdirs(base)
        if isinstance(fs, LocalFileSystem):
            _create_local_key_file(path)
        elif isinstance(fs, FsspecFileSystem):
            if not fs.exists(path) and fs.create_exclusive(
                path, secrets.token_hex(32).encode("ascii") + b"\n"
            ):
                log.info("Generated the snapshot key %s: it signs checkpoints and savepoints.", path)
        elif not fs.exists(path):  # pragma: no cover - every filesystem is one of the two
            fs.write_atomic(path, secrets.token_hex(32).encode("ascii") + b"\n")
    except OSError as exc:
        raise StorageError(f"cannot create the snapshot key file {path}: {exc}") from None
    return read_key_file(path, object_store)


def _create_local_key_file(path: str) -> None:
    """Create ``path`` with a new key, mode 0600, unless it exists: written under a temporary
    name, then linked to ``path`` (which fails if another driver got there first), so no
    reader ever sees a partial key."""
    if os.path.lexists(path):
        return
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.write(fd, secrets.token_hex(32).encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
            log.info("Generated the snapshot key %s (mode 0600): it signs checkpoints and savepoints.", path)
        except FileExistsError:
            pass
    finally:
        os.remove(tmp)


def read_key_file(path: str, object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE) -> SnapshotKey:
    """The key in file ``path`` (its text, surrounding whitespace stripped)."""
    fs, resolved = resolve(path, options=object_store)
    try:
        if isinstance(fs, LocalFileSystem):
            data = _read_local_key_file(resolved)
        else:
            data = fs.read(resolved)[: _MAX_KEY_FILE_BYTES + 1]
    except FileNotFoundError:
        raise StorageError(
            f"the snapshot key file {path} does not exist (execution.checkpointing.snapshot-key-file)"
        ) from None
    except OSError as exc:
        raise StorageError(f"cannot read the snapshot key file {path}: {exc}") from None
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise StorageError(f"{path} is not a snapshot key file: larger than {_MAX_KEY_FILE_BYTES} bytes")
    secret = data.strip()
    if not secret:
        raise StorageError(f"the snapshot key file {path} is empty")
    return SnapshotKey(secret, f"key file {path}")


def _read_local_key_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"the snapshot key file {path} is not a regular file")
        if st.st_mode & 0o022:
            log.warning(
                "The snapshot key file %s is writable by others (mode %o): whoever can replace it "
                "can sign checkpoints this deployment restores. chmod 600 it.",
                path,
                stat.S_IMODE(st.st_mode),
            )
        return os.read(fd, _MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
