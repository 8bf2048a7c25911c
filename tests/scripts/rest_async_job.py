"""A program that starts its job with ``execute_async()``, waits for its result and exits,
for tests/test_rest_api.py.

``python -m tests.scripts.rest_async_job``: prints ``URL <rest url>`` once the server is up,
then ``ENDED <status>`` when the job ended (a client stopped it), then returns from ``main``:
the interpreter must not exit (taking the REST server with it) before the client fetched the
stop's outcome, as Flink's CLI does after the job finished.
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


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    env = StreamExecutionEnvironment.get_execution_environment(
        {"rest.port": 0, "chandy.rest.await-results-timeout": "120 s", "chandy.status-line.enabled": False},
        executor="local",
    )
    env.from_sequence(0, 10_000_000).map(Throttle(0.002)).filter(lambda _: False).print()
    threading.Thread(target=announce, args=(env,), daemon=True).start()
    client = env.execute_async("stopped, then the program exits")
    client.get_job_execution_result()
    print("ENDED", client.get_job_status().name, flush=True)


if __name__ == "__main__":
    main()
