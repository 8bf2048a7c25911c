"""The ``s3_server`` fixture: one real S3 server (SeaweedFS, :class:`bench.s3_server.S3Server`)
on loopback for the whole test session, with its data in a temporary directory, stopped by
its pid at the end. Tests write under their own prefix (:meth:`S3Server.unique_prefix`)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.s3_server import ACCESS_KEY, BUCKET, SECRET_KEY, S3Server

__all__ = ["ACCESS_KEY", "BUCKET", "SECRET_KEY", "S3Server", "s3_server"]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One SeaweedFS S3 server on loopback for the whole session, stopped by pid at the end."""
    root = Path(tempfile.mkdtemp(prefix="chandy-weed-"))
    server = S3Server(root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
