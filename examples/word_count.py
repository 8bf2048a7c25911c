"""Word count: the classic first job.

Run it with ``python examples/word_count.py`` (add a path to count a file's words).
"""

from __future__ import annotations

import logging
import sys

from chandy import StreamExecutionEnvironment

TEXT = """To be, or not to be, that is the question:
Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune,
Or to take arms against a sea of troubles
And by opposing end them."""


def main(argv: list[str]) -> None:
    text = open(argv[1], encoding="utf-8").read() if len(argv) > 1 else TEXT
    env = StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    (
        env.from_collection(text.splitlines())
        .flat_map(lambda line: (w.strip(".,:;'!?").lower() for w in line.split()))
        .filter(bool)
        .map(lambda word: (word, 1))
        .key_by(lambda pair: pair[0])
        .sum(1)
        .print()
    )
    env.execute("word count")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main(sys.argv)
