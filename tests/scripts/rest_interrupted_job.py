"""An endless job run by ``env.execute()`` in the main thread, for tests/test_rest_api.py.

``python -m tests.scripts.rest_interrupted_job``: prints ``URL <rest url>`` once the server is up,
runs the job until Ctrl-C (SIGINT), catches the KeyboardInterrupt as a notebook or a
supervising loop would, and prints ``AFTER <rest url or None>``: whether the REST
server was stopped.
"""

from __future__ import annotations

import logging
import threading
import time

from chandy import StreamExecutionEnvironment
from tests.jobs import Throttle


def announce(env: StreamExecutionEnvironment) -> None:
    while env.rest_url is None:
        time.sleep(0.01)
    print("URL", env.rest_url, flush=True)


def endless_job_announced() -> StreamExecutionEnvironment:
    """An environment with an endless, quiet job defined; ``URL <rest url>`` is printed once
    its server is up (the job starts with the caller's execute). Batches of 10 paced records:
    a savepoint's barrier or a cancel waits 20 ms behind one, not 2 s."""
    logging.basicConfig(level=logging.WARNING)
    env = StreamExecutionEnvironment.get_execution_environment(
        {
            "rest.port": 0,
            "chandy.rest.await-results-timeout": "120 s",
            "chandy.status-line.enabled": False,
            "chandy.network.batch-size": 10,
        },
        executor="local",
    )
    env.from_sequence(0, 10_000_000).map(Throttle(0.002)).filter(lambda _: False).print()
    threading.Thread(target=announce, args=(env,), daemon=True).start()
    return env


def main() -> None:
    env = endless_job_announced()
    try:
        env.execute("interrupted")
    except KeyboardInterrupt:
        pass
    print("AFTER", env.rest_url, flush=True)


if __name__ == "__main__":
    main()
