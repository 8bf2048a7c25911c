"""A job of about two seconds whose map prints, logs and warns while the status line is up,
for tests/test_status_line.py.

usage: chatty_job.py: prints ``processing N`` every 50 records, logs a WARNING and raises a
Python warning every 200, and ``done`` once the job finished.
"""

from __future__ import annotations

import logging
import time
import warnings

from chandy import StreamExecutionEnvironment

log = logging.getLogger("chatty")


def chatty(value: int) -> int:
    time.sleep(0.002)
    if value % 50 == 0:
        print(f"processing {value}")
    if value % 200 == 0:
        log.warning("a log record at %d", value)
        warnings.warn(f"a warning at {value}", stacklevel=1)
    return value


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    warnings.simplefilter("always")
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    env.set_parallelism(1)
    env.configure(
        {"rest.port": 0, "chandy.metrics.report-interval": "100 ms", "chandy.network.batch-size": 10}
    )
    env.from_sequence(1, 1000).map(chatty).rebalance().add_sink(lambda value: None)
    env.execute("chatty")
    print("done", flush=True)
