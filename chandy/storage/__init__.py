"""Checkpoint storage: Flink's directory layout on any filesystem, with atomic, checksummed writes."""
