"""PyFlink's ``pyflink.datastream.state_backend``: the state backends a job chooses from."""

from chandy.api.state_backend import (
    EmbeddedRocksDBStateBackend,
    HashMapStateBackend,
    RocksDBStateBackend,
    StateBackend,
)

__all__ = ["EmbeddedRocksDBStateBackend", "HashMapStateBackend", "RocksDBStateBackend", "StateBackend"]
