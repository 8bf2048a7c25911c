"""Virtual environments for the reference systems, under ``bench/.cache/venvs``.

Each reference system gets its own environment so that nothing it needs (a second
PySpark, Flink's pinned dependencies) lands in the project's environment, and a
benchmark run never changes what the tests run against. An environment is made once
and reused; ``requirements`` pins the versions that appear in the results.
"""

from __future__ import annotations

import importlib.metadata
import logging
import subprocess
import sys
import venv
from pathlib import Path

log = logging.getLogger(__name__)

CACHE = Path(__file__).resolve().parent / ".cache"
SYSTEMS_DIR = Path(__file__).resolve().parent / "systems"


#: Systems that run in another system's environment: Flink SQL is the same ``apache-flink``
#: installation as PyFlink (its runner drives the Table API instead of Python functions).
SHARED_ENV = {"flink_sql": "pyflink"}


def env_of(system: str) -> str:
    """The environment ``system``'s runner runs in (its own, or the one it shares)."""
    return SHARED_ENV.get(system, system)


def requirements(system: str) -> list[str]:
    """What the reference system's environment holds (pinned)."""
    system = env_of(system)
    if system == "pyflink":
        return ["apache-flink==2.3.0"]
    if system == "bytewax":
        return ["bytewax==0.21.1"]
    if system == "pathway":
        return ["pathway==0.33.0"]
    if system == "spark_ss":  # the project's own PySpark version, with pandas for the Python APIs
        # protobuf: transformWithStateInPandas talks to the JVM with it
        return [
            f"pyspark=={importlib.metadata.version('pyspark')}",
            "pandas>=2.2,<3",
            "pyarrow>=15",
            "protobuf>=6.33.5,<7",
        ]
    raise ValueError(
        f"unknown reference system '{system}'; use pyflink, flink_sql, bytewax, spark_ss or pathway"
    )


def python_of(system: str) -> Path:
    """The interpreter that runs ``system``'s runner (the project's for chandy)."""
    if system == "chandy":
        return Path(sys.executable)
    return CACHE / "venvs" / env_of(system) / "bin" / "python"


def ensure_env(system: str) -> Path:
    """Make ``system``'s environment unless it exists with the pinned requirements."""
    python = python_of(system)
    if system == "chandy":
        return python
    wanted = requirements(system)
    stamp = python.parent.parent / "chandy-bench-requirements.txt"
    if python.exists() and stamp.exists() and stamp.read_text().split() == wanted:
        return python
    log.warning("Installing %s into %s (once; later runs reuse it)", " ".join(wanted), python.parent.parent)
    venv.create(python.parent.parent, with_pip=True, clear=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *wanted], check=True)
    stamp.write_text("\n".join(wanted) + "\n")
    return python


def installed_version(system: str) -> str:
    """The installed version of the system's main package, as the results report it."""
    package = {
        "chandy": "chandy",
        "pyflink": "apache-flink",
        "flink_sql": "apache-flink",
        "bytewax": "bytewax",
        "spark_ss": "pyspark",
        "pathway": "pathway",
    }[system]
    if system == "chandy":
        return importlib.metadata.version(package)
    done = subprocess.run(
        [str(python_of(system)), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def runner_of(system: str) -> Path:
    return SYSTEMS_DIR / f"{system}_runner.py"
