"""Channels between subtasks: ordered streams of record batches and events,
bounded by credits, and the input gate a task reads them through."""
