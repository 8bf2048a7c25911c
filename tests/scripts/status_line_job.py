"""A job of about two seconds run by ``env.execute()``, for the status line tests.

usage: status_line_job.py LOG_FILE [key=value ...]: chandy's log records go to LOG_FILE,
the settings to the environment; prints ``done`` on stdout once the job finished.
"""

from __future__ import annotations

import logging
import sys

from chandy import StreamExecutionEnvironment
from tests.jobs import Throttle

logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
env = StreamExecutionEnvironment.get_execution_environment(executor="local")
env.set_parallelism(1)
env.enable_checkpointing(200)
env.configure({"rest.port": 0, "chandy.metrics.report-interval": "100 ms", "chandy.network.batch-size": 10})
env.configure(dict(arg.split("=", 1) for arg in sys.argv[2:]))
env.from_sequence(1, 1000).map(Throttle(0.002)).rebalance().add_sink(lambda value: None)
env.execute("status line")
print("done", flush=True)
