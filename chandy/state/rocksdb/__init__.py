"""The embedded RocksDB keyed state backend (``state.backend.type: rocksdb``)."""
