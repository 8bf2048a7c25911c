"""A keyed count over 0..N-1 run by ``env.execute()``, for tests/test_console.py.

usage: console_job.py CHECKPOINT_DIR MODE

``paced``: 10 ms per record, so it runs until a test interrupts it; prints nothing.
``finish``: at full speed to its end, printing ``key count`` for every record it counts.
The executor and a restore path come from ``chandy run`` (``-D execution.target=local``, ``-s``)
or ``CHANDY_CONFIG``; checkpoints every 100 ms, kept when the job is cancelled.
"""

from __future__ import annotations

import sys

from chandy import StreamExecutionEnvironment
from chandy.core.functions import KeyedProcessFunction, RuntimeContext
from chandy.core.state import ValueStateDescriptor
from chandy.core.types import Types
from tests.jobs import Throttle

N, KEYS = 3000, 10


class Count(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> object:
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        yield f"{ctx.get_current_key()} {count}"


directory, mode = sys.argv[1:3]
env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(2)
env.enable_checkpointing(100)
env.configure(
    {
        "execution.checkpointing.dir": directory,
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "chandy.network.batch-size": 10,  # a barrier and the cancel wait behind 10 paced records
    }
)
numbers = env.from_sequence(0, N - 1).uid("numbers").map(Throttle(0.01 if mode == "paced" else 0)).uid("pace")
counts = numbers.key_by(lambda x: x % KEYS).process(Count()).uid("count")
counts.filter(lambda line: mode == "finish").print()
env.execute("console job")
