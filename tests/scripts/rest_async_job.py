"""A program that starts its job with ``execute_async()``, waits for its result and exits,
for tests/test_rest_api.py.

``python -m tests.scripts.rest_async_job``: prints ``URL <rest url>`` once the server is up,
then ``ENDED <status>`` when the job ended (a client stopped it), then returns from ``main``:
the interpreter must not exit (taking the REST server with it) before the client fetched the
stop's outcome, as Flink's CLI does after the job finished.
"""

from __future__ import annotations

from tests.scripts.rest_interrupted_job import endless_job_announced


def main() -> None:
    client = endless_job_announced().execute_async("stopped, then the program exits")
    client.get_job_execution_result()
    print("ENDED", client.get_job_status().name, flush=True)


if __name__ == "__main__":
    main()
