#!/usr/bin/env bash
# Set-up on a fresh Debian machine (Python >= 3.11 and Java 17 present): everything the test
# suite uses, installed once. Safe to run again.
#   1. Debian's chromium, the real browser the dashboard test drives (through playwright);
#   2. a virtual environment, .venv, with chandy and its test tools (pip install -e '.[dev]').
#      Nothing comes from the machine's own Python packages, so an import that pyproject.toml
#      does not declare fails here (and in CI, which runs this script on a clean clone) instead
#      of working by chance. Run again, the script keeps .venv and installs into it again (what
#      pyproject.toml added since comes in); `./setup.sh --fresh` makes a new one first;
#   3. Flink's own command-line client (`flink list/savepoint/stop/cancel`), from the
#      apache-flink packages on PyPI, into .cache/flink-cli: the test that drives a chandy job
#      with it needs the client only, and apache-flink's Python pins (py4j, pandas, beam)
#      would clash with PySpark's, so it is unpacked outside the environment, without them.
# Then: .venv/bin/python -m pytest (or `. .venv/bin/activate` first, and plain `pytest`).
# PYTHON=/path/to/python3.X ./setup.sh makes .venv with that interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")"

FRESH=0
for arg in "$@"; do
    case "$arg" in
        --fresh) FRESH=1 ;;
        *) echo "usage: ./setup.sh [--fresh]   (--fresh: make .venv anew)" >&2; exit 2 ;;
    esac
done

if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium
fi

PYTHON="${PYTHON:-python3}"
VENV=.venv
# A venv whose interpreter no longer runs (its base Python moved or was removed) is made anew.
if [ "$FRESH" = 1 ] || ! "$VENV/bin/python" -c "" >/dev/null 2>&1; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
        echo "setup.sh: chandy needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>&1)" >&2
        echo "          (PYTHON=/path/to/python3.11 ./setup.sh picks another)" >&2
        exit 1
    }
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -e '.[dev]'

FLINK_VERSION=2.3.0
if [ ! -x .cache/flink-cli/pyflink/bin/flink ]; then
    rm -rf .cache/flink-cli
    "$VENV/bin/python" -m pip install --no-deps --target .cache/flink-cli \
        "apache-flink==${FLINK_VERSION}" "apache-flink-libraries==${FLINK_VERSION}"
fi

echo "setup.sh: done. Run the tests with: $VENV/bin/python -m pytest"
