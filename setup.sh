#!/usr/bin/env bash
# Set-up on a fresh Debian machine (Python >= 3.11 and Java 17 present): everything the test
# suite uses, installed once. Safe to run again: what is there is kept.
#   1. Debian's chromium, the real browser the dashboard test drives (through playwright);
#   2. chandy itself with its test tools (pip install -e '.[dev]');
#   3. Flink's own command-line client (`flink list/savepoint/stop/cancel`), from the
#      apache-flink packages on PyPI, into .cache/flink-cli: the test that drives a chandy job
#      with it needs the client only, and apache-flink's Python pins (py4j, pandas, beam)
#      would clash with PySpark's, so it is unpacked outside the environment, without them.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium
fi

python -m pip install -e '.[dev]'

FLINK_VERSION=2.3.0
if [ ! -x .cache/flink-cli/pyflink/bin/flink ]; then
    rm -rf .cache/flink-cli
    python -m pip install --no-deps --target .cache/flink-cli \
        "apache-flink==${FLINK_VERSION}" "apache-flink-libraries==${FLINK_VERSION}"
fi
