"""Chaos testing: exactly-once under random faults (``python -m chaos``).

Seeded runs of a bounded keyed job (running sums, and event-time windows and timers)
on the Spark executor into two-phase-commit sinks, with slot and executor kills, failing
user functions and commits, and checkpoint storage faults (through
:mod:`chaos.faultyfs`) at random moments; each run's committed output is checked for
every record, and every event-time window, exactly once. See ``README.md`` ("Chaos testing").
"""
