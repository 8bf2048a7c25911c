"""Chaos testing: exactly-once under random faults (``python -m chaos``).

Seeded runs of a bounded keyed job (running sums, and event-time windows and timers)
whose source splits end at different times, on the Spark executor or the local one,
on the heap or RocksDB, with aligned or unaligned checkpoints, into two-phase-commit
sinks, with slot and executor kills, failing user functions and commits, checkpoint
storage faults (through :mod:`chaos.faultyfs`) and faults timed to a subtask finishing
(:mod:`chaos.finishing`) at random moments; each run's committed output is checked for
every record, and every event-time window, exactly once. See ``README.md`` ("Chaos testing").
"""
