"""Keyed and operator state: key groups, backends, snapshots."""
