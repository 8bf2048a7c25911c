"""Map state on RocksDB: one RocksDB key per map entry (Flink's ``RocksDBMapState``).

A map's entries live under ``key group | state id | encode_key(table key) | encode_key(map key)``
(:mod:`chandy.state.rocksdb.layout`), so ``get``, ``put``, ``remove`` and ``contains`` are
point operations and iterating a map is a prefix scan: a map of millions of entries is
never loaded whole, unlike a map held as one value. The table key is the current key, or
``(key, namespace)`` for a window's map state, as on the heap.

Nothing is cached: the handles read and write RocksDB directly (without a WAL), so a
snapshot's flush has nothing to do for them. Iteration reads the map as it was when it was
called, entry by entry, so the caller may change the map while it walks it, as on the heap.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rocksdict import WriteBatch

from chandy.core.state import MapState
from chandy.state.codec import encode, encode_key
from chandy.state.heap import StateTable
from chandy.state.rocksdb.layout import state_id, table_prefix
from chandy.state.rocksdb.views import scan_items, scan_keys

if TYPE_CHECKING:
    from chandy.state.rocksdb.backend import RocksDBKeyedStateBackend


class RocksDBMapState(MapState):
    """The map of the backend's current key, entry by entry in RocksDB."""

    __slots__ = ("_backend", "_table", "_prefixes", "_namespace")

    def __init__(self, backend: RocksDBKeyedStateBackend, table: StateTable) -> None:
        self._backend = backend
        self._table = table
        sid = state_id(table.name)
        #: The key-group-and-state prefix of every key group, indexed by key group.
        self._prefixes: list[bytes] = [b""] * backend.max_parallelism
        for kg in backend.key_group_range:
            self._prefixes[kg] = table_prefix(kg, sid)
        self._namespace: Any = None

    def _table_key(self) -> Any:
        return self._backend.current_key

    def _map_prefix(self) -> bytes:
        b = self._backend
        return self._prefixes[b.current_index] + encode_key(self._table_key())

    def _encode(self, value: Any) -> bytes:
        """An entry's value as its state writes it: typed, or with the codec."""
        serializer = self._table.serializer
        return encode(value) if serializer is None else serializer.encode_entry(value)

    def get(self, key: Any) -> Any:
        backend = self._backend
        data = backend.db.get(self._map_prefix() + encode_key(key))
        return None if data is None else backend.cache.decode(data)

    def put(self, key: Any, value: Any) -> None:
        self._backend.db.put(self._map_prefix() + encode_key(key), self._encode(value))

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        if not dict_value:
            return
        prefix = self._map_prefix()
        batch = WriteBatch(raw_mode=True)
        for key, value in dict_value.items():
            batch.put(prefix + encode_key(key), self._encode(value))
        self._backend.db.write(batch)

    def remove(self, key: Any) -> None:
        self._backend.db.delete(self._map_prefix() + encode_key(key))

    def contains(self, key: Any) -> bool:
        return self._backend.db.get(self._map_prefix() + encode_key(key)) is not None

    # Iteration is a prefix scan read as it goes, never the whole map at once; it gives the
    # map as it was when called (a RocksDB iterator's consistent view), so the caller may
    # change the map meanwhile, as on the heap.

    def items(self) -> Iterator[tuple[Any, Any]]:
        prefix = self._map_prefix()
        start = len(prefix)
        cache = self._backend.cache
        decode_key, decode_value = cache.decode_from, cache.decode
        return ((decode_key(k, start)[0], decode_value(v)) for k, v in scan_items(self._backend.db, prefix))

    def keys(self) -> Iterator[Any]:
        prefix = self._map_prefix()
        start = len(prefix)
        decode_key = self._backend.cache.decode_from
        return (decode_key(k, start)[0] for k in scan_keys(self._backend.db, prefix))

    def values(self) -> Iterator[Any]:
        decode_value = self._backend.cache.decode
        return (decode_value(v) for _, v in scan_items(self._backend.db, self._map_prefix()))

    def is_empty(self) -> bool:
        prefix = self._map_prefix()
        return next(scan_keys(self._backend.db, prefix), None) is None

    def clear(self) -> None:
        # Point deletes, not a range delete: a range tombstone per cleared map (one per
        # window fired, say) would slow every later read that crosses it.
        prefix = self._map_prefix()
        db = self._backend.db
        batch = WriteBatch(raw_mode=True)
        for key in scan_keys(db, prefix):
            batch.delete(key)
        if not batch.is_empty():
            db.write(batch)


class RocksDBNamespacedMapState(RocksDBMapState):
    """A map per key *and* namespace (a window's map state)."""

    __slots__ = ()

    def set_current_namespace(self, namespace: Any) -> None:
        """Scope the following operations to ``namespace`` (for example a window)."""
        self._namespace = namespace

    def get_current_namespace(self) -> Any:
        return self._namespace

    def _table_key(self) -> Any:
        return (self._backend.current_key, self._namespace)
