"""Keyed state with a time-to-live: PyFlink's ``state_access.py`` example, ported by changing its imports.

Each person's amounts are summed in a ``ValueState`` whose values expire one second
after they were last read or written (``StateTtlConfig`` with ``OnReadAndWrite``,
no cleanup in the background: an expired sum is dropped when it is next read).
Every record prints the person's running sum. Run it with
``python examples/state_access.py`` (``--executor local`` for threads instead of
a local Spark session).

The eight records arrive within a few milliseconds, far less than the TTL, so no
sum expires and the output is PyFlink's (``tests/test_state_ttl.py`` compares it
with what PyFlink 2.3 printed, ``tests/pyflink_outputs/state-access.txt``). The
amounts are declared ``Types.FLOAT()``, so they arrive rounded to 32 bits, as in
PyFlink: 110.1 becomes 110.0999984741211. ``docs/state-ttl.md`` shows sums
expiring.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from typing import Any

from chandy.common import Time
from chandy.common.typeinfo import Types
from chandy.datastream import StreamExecutionEnvironment
from chandy.datastream.functions import KeyedProcessFunction, RuntimeContext
from chandy.datastream.state import StateTtlConfig, ValueStateDescriptor


class Sum(KeyedProcessFunction):
    def __init__(self) -> None:
        self.state: Any = None

    def open(self, runtime_context: RuntimeContext) -> None:
        state_descriptor = ValueStateDescriptor("state", Types.FLOAT())
        state_ttl_config = (
            StateTtlConfig.new_builder(Time.seconds(1))
            .set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)
            .disable_cleanup_in_background()
            .build()
        )
        state_descriptor.enable_time_to_live(state_ttl_config)
        self.state = runtime_context.get_state(state_descriptor)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterator[tuple[str, float]]:
        # retrieve the current count
        current = self.state.value()
        if current is None:
            current = 0

        # update the state's count
        current += value[1]
        self.state.update(current)

        yield value[0], current


def state_access_demo(executor: str = "spark") -> None:
    env = StreamExecutionEnvironment.get_execution_environment(executor=executor)

    ds = env.from_collection(
        collection=[
            ("Alice", 110.1),
            ("Bob", 30.2),
            ("Alice", 20.0),
            ("Bob", 53.1),
            ("Alice", 13.1),
            ("Bob", 3.1),
            ("Bob", 16.1),
            ("Alice", 20.1),
        ],
        type_info=Types.TUPLE([Types.STRING(), Types.FLOAT()]),
    )

    # apply the process function onto a keyed stream
    ds.key_by(lambda value: value[0]).process(Sum()).print()

    # submit for execution
    env.execute()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executor", choices=["spark", "local"], default="spark")
    state_access_demo(parser.parse_args().executor)
