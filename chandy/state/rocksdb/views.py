"""Key-group views: one state's entries of one key group in RocksDB, seen as a ``dict``.

Why a ``dict``: every piece of chandy that reaches into a state table
(``table.maps[key_group]``: the heap's state handles, timers, the window fast path,
``StreamGroupedReduce``, TTL cleanup) was written against dictionaries. A view *is* a
dictionary subclass whose own storage is a **write-back cache of decoded values**, so
that code runs unchanged on RocksDB, and a hot key costs what it costs on the heap plus
one Python call: ``get`` is ``dict.get`` and two identity checks when the key is cached.

What the cache holds, per view (a view never holds a stale value):

- ``key -> value`` for cached entries, clean or dirty (the dict itself: a hit is
  ``dict``'s own lookup, and a miss reaches :meth:`KeyGroupView.__missing__`);
- ``_absent``: keys known to be absent (a miss is cached too, so ``timer in timers``
  after a delete is a set lookup);
- ``_dirty``: the keys whose cached value is newer than RocksDB. A write marks its key
  dirty; so does a read that returns a value which is not immutable
  (:func:`chandy.state.heap.is_immutable`), because the heap's handles change such values
  in place (``ListState.add`` appends to the list it read) and nothing tells the view.
  For the same reason such a value leaves the cache once a flush wrote it (else every
  flush would write it again): code that keeps a list it read across a checkpoint and
  changes it later must ``update()`` it, as on Flink's RocksDB backend.

Deletes go to RocksDB at once (so RocksDB never holds an entry the cache has deleted),
writes wait for :meth:`ValueCache.flush`, which writes every dirty entry of every view
of the backend in one ``WriteBatch``: at every snapshot and whenever the cache must make
room. The cache is bounded by an entry count (:attr:`ValueCache.limit`, from the slot's
memory budget), counted exactly where a view adds a key (a load, the first write of a new
key), never on a hit: past the limit it flushes and evicts the oldest entries.

Map state keeps one RocksDB key per map entry (:mod:`chandy.state.rocksdb.map_state`
reads and writes them directly); its tables get a :class:`MapKeyGroupView`, which lists,
counts and deletes whole maps for the code that walks tables (``apply_to_all_keys``,
``num_keys``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from rocksdict import Rdict, ReadOptions, WriteBatch

from chandy.state.codec import Loads, decode, decode_from, encode, encode_key
from chandy.state.heap import _ATOMIC, is_immutable

#: A value's bytes (the codec's ``encode``, or a typed state's serializer).
Encode = Callable[[Any], bytes]


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Not in the cache (look in RocksDB).
_MISS: Any = _Marker("<miss>")
#: What a load returns for a key RocksDB does not have.
_ABSENT: Any = _Marker("<absent>")
#: ``pop`` without a default.
_RAISE: Any = _Marker("<raise>")

T = TypeVar("T")

_dget = dict.get
_dcontains = dict.__contains__
_dset = dict.__setitem__
_ddel = dict.__delitem__
_dlen = dict.__len__
_diter = dict.__iter__
_dclear = dict.clear


def prefix_end(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string that starts with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\xff" * (len(prefix) + 1)
    return stripped[:-1] + bytes((stripped[-1] + 1,))


def prefix_read_options(prefix: bytes) -> ReadOptions:
    """Read options that confine an iterator to the keys starting with ``prefix``."""
    options = ReadOptions()
    options.set_iterate_lower_bound(prefix)
    options.set_iterate_upper_bound(prefix_end(prefix))
    return options


def scan_keys(db: Rdict, prefix: bytes) -> Iterator[bytes]:
    """The RocksDB keys starting with ``prefix``, in order, as of this call (a RocksDB
    iterator reads a consistent view: later writes and deletes do not change what it gives)."""
    options = prefix_read_options(prefix)
    keys: Iterator[bytes] = db.keys(from_key=prefix, read_opt=options)  # type: ignore[assignment]
    return _keeping(keys, options)


def scan_items(db: Rdict, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
    """The ``(key, value)`` pairs whose key starts with ``prefix`` (from ``start`` on, if
    given; see :func:`scan_keys`)."""
    options = prefix_read_options(prefix)
    items: Iterator[tuple[bytes, bytes]] = db.items(from_key=start or prefix, read_opt=options)  # type: ignore[assignment]
    return _keeping(items, options)


def _keeping(iterator: Iterator[T], options: ReadOptions) -> Iterator[T]:
    """``iterator``, with ``options`` alive as long as it is: rocksdict's iterator does not
    keep its read options alive, and bounds freed under it read garbage."""
    yield from iterator
    del options


class ValueCache:
    """The write-back cache of one backend: its views, its exact entry count, flushes.

    ``limit`` is an entry count; ``limit_for`` (from the backend, its share of the slot's
    budget in bytes) turns the measured average entry size into it at every eviction, so a
    state of large values (a window's lists) caches fewer entries than a state of ints.
    ``total`` counts cached entries and known-absent keys exactly: it changes only where a
    view adds a key (a load, a first write of a key), never on a hit or a rewrite.
    """

    #: What a cached entry costs beside its encoded size (the dict slot, the key and value
    #: objects' headers, a dirty set's slot). Measured with tracemalloc: 195 bytes an entry
    #: of an int state (estimated 236), 315 of a list of three ints (estimated 304).
    ENTRY_OVERHEAD = 200
    #: Decoded objects take more memory than their encoding; a value's cost is this many
    #: times its encoded size plus the overhead.
    DECODED_FACTOR = 4
    #: Until it has seen a value's size, the limit guesses ints; after this many entries the
    #: cache flushes once to learn the real sizes. Without it, 4 KB values filled 15,887
    #: entries (64 MB on a 4 MB share) before the first eviction learned them.
    LEARN_AFTER = 64

    def __init__(self, db: Rdict, limit_for: Callable[[int], int]) -> None:
        self.db = db
        #: How every view of the backend decodes what it reads (:meth:`read_pickles_with`).
        self.decode: Callable[[bytes], Any] = decode
        self.decode_from: Callable[[bytes, int], tuple[Any, int]] = decode_from
        self._limit_for = limit_for
        self.views: list[KeyGroupView] = []
        #: Views that had dirty keys since the last flush (the ones a flush visits).
        self.active: list[KeyGroupView] = []
        self._encoded_bytes = 0
        self._encoded_entries = 0
        self.limit = max(16, limit_for(self.entry_cost()))
        self.total = 0
        self._learned = False
        #: How often the cache evicted, and how many keys it read from RocksDB (for tests and metrics).
        self.evictions = 0
        self.misses = 0

    def read_pickles_with(self, loads: Loads) -> None:
        """Read every pickled key and value with ``loads`` from now on: the restricted
        unpickler once the database holds a snapshot's bytes (a native restore)."""

        def decode_restricted(data: bytes) -> Any:
            return decode(data, loads)

        def decode_restricted_from(data: bytes, pos: int = 0) -> tuple[Any, int]:
            return decode_from(data, pos, loads)

        self.decode = decode_restricted
        self.decode_from = decode_restricted_from

    def entry_cost(self) -> int:
        """The estimated bytes one cached entry takes, from the sizes seen so far."""
        average = self._encoded_bytes // self._encoded_entries if self._encoded_entries else 16
        return self.DECODED_FACTOR * average + self.ENTRY_OVERHEAD

    def _seen(self, size: int, entries: int) -> None:
        """``entries`` of ``size`` encoded bytes in all were read or written."""
        self._encoded_bytes += size
        self._encoded_entries += entries
        if self._encoded_entries >= 1 << 20:  # keep it a recent average
            self._encoded_bytes >>= 1
            self._encoded_entries >>= 1

    def register(self, view: KeyGroupView) -> None:
        self.views.append(view)

    def activate(self, view: KeyGroupView) -> None:
        if not view._active:
            view._active = True
            self.active.append(view)

    def added(self) -> None:
        """A view is about to cache one more key: evict first if the cache is full."""
        if self.total >= self.limit or (self.total == self.LEARN_AFTER and not self._learned):
            self.make_room()
        self.total += 1

    def size(self) -> int:
        """The number of cached entries (known absent keys included), counted anew."""
        return sum(_dlen(view) + len(view._absent) for view in self.views)

    def flush(self) -> None:
        """Write every dirty entry in one batch (no WAL: the checkpoint is the durability).

        The batch is built whole before anything is marked clean, so a value that cannot be
        encoded leaves every entry dirty (and the error names its state's bytes prefix).
        A value that is not immutable leaves the cache once written: code that read it may
        change it in place, so while cached it would have to be written again at every
        flush (a checkpoint of a cache of lists would rewrite them all); read again, it is
        marked dirty again."""
        batch: WriteBatch | None = None
        size = entries = 0
        written: list[tuple[KeyGroupView, list[Any]]] = []
        for view in self.active:
            dirty = view._dirty
            if not dirty:
                continue
            if batch is None:
                batch = WriteBatch(raw_mode=True)
            prefix = view._prefix
            put = batch.put
            encode_value = view._encode
            mutable = []
            for key in dirty:
                value = _dget(view, key)
                try:
                    data = encode_value(value)
                    put(prefix + encode_key(key), data)
                except Exception as exc:
                    exc.add_note(
                        f"while writing the RocksDB state entry {key!r} (state prefix {prefix.hex()}): "
                        "keys must be picklable, values picklable or of the state's declared type"
                    )
                    raise
                size += len(data)
                if type(value) not in _ATOMIC and not is_immutable(value):
                    mutable.append(key)
            entries += len(dirty)
            written.append((view, mutable))
        if batch is not None:
            self.db.write(batch)
            self._seen(size, entries)
        for view, mutable in written:
            view._dirty.clear()
            for key in mutable:
                _ddel(view, key)
            self.total -= len(mutable)
        for view in self.active:
            view._active = False
        self.active = []

    def make_room(self) -> None:
        """Flush, then evict the oldest entries down to three quarters of the limit.

        Eviction takes each view's share in insertion order (a dict's), skipping the keys
        written since the last flush, which are likely hot, unless there are not enough
        others: a second chance for recently used entries at no cost on the hit path, where
        an LRU would need bookkeeping. Known absent keys go first (they cost a RocksDB get
        to learn again, no decode)."""
        self.limit = max(16, self._limit_for(self.entry_cost()))
        victims: list[tuple[KeyGroupView, list[Any]]] = []
        if self.size() >= self.limit:
            self.evictions += 1
            for view in self.views:
                view._absent.clear()
            present = self.size()
            keep = self.limit * 3 // 4
            if present > keep:
                for view in self.views:
                    n = _dlen(view)
                    drop = n - n * keep // present
                    if drop > 0:
                        victims.append((view, _oldest(view, drop)))
        self.flush()  # the victims' values reach RocksDB before they leave the cache
        for view, keys in victims:
            for key in keys:
                if _dcontains(view, key):  # the flush already dropped the mutable ones
                    _ddel(view, key)
        self.total = self.size()
        self.limit = max(16, self._limit_for(self.entry_cost()))  # with the sizes the flush saw
        self._learned = self._encoded_entries > 0

    def drop(self) -> None:
        """Forget every cached entry, dirty or not (the database was replaced or closed)."""
        for view in self.views:
            _dclear(view)
            view._dirty.clear()
            view._absent.clear()
            view._active = False
        self.active = []
        self.total = 0


def _oldest(view: KeyGroupView, count: int) -> list[Any]:
    """The ``count`` oldest keys of ``view``, those not written since the last flush first."""
    dirty = view._dirty
    chosen: list[Any] = []
    if len(dirty) < _dlen(view):
        for key in _diter(view):
            if key not in dirty:
                chosen.append(key)
                if len(chosen) == count:
                    return chosen
    for key in _diter(view):
        if key in dirty:
            chosen.append(key)
            if len(chosen) == count:
                break
    return chosen


class _DictView(dict[Any, Any]):
    """What both views build on their own ``items()`` and ``__setitem__``: a dict's
    comparisons, copies, updates, printing and pickling (as a plain dict of the entries)."""

    __slots__ = ()

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        items = other.items() if isinstance(other, Mapping) else other
        for key, value in itertools.chain(items, kwargs.items()):
            self[key] = value

    def copy(self) -> dict[Any, Any]:
        return dict(self.items())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _DictView):
            return dict(self.items()) == dict(other.items())
        return dict(self.items()) == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __or__(self, other: Any) -> dict[Any, Any]:
        merged: dict[Any, Any] = dict(self.items())
        merged.update(other)
        return merged

    def __ior__(self, other: Any) -> _DictView:
        self.update(other)
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"

    def __reduce__(self) -> tuple[type, tuple[dict[Any, Any]]]:
        # a copy of the entries, never the view (it holds a database)
        return dict, (dict(self.items()),)


class KeyGroupView(_DictView):
    """One state table's entries of one key group: RocksDB behind a cache of decoded values.

    Behaves as the ``dict`` the heap backend keeps there (see the module docstring). Keys
    are encoded with :func:`chandy.state.codec.encode_key` after the view's prefix
    (key group and state id, :func:`chandy.state.rocksdb.layout.table_prefix`), values
    with ``_encode`` (the codec's, or the typed state's serializer).
    """

    __slots__ = ("_cache", "_prefix", "_dirty", "_absent", "_active", "_encode")

    def __init__(self, cache: ValueCache, prefix: bytes) -> None:
        super().__init__()
        self._cache = cache
        self._prefix = prefix
        self._encode: Encode = encode
        self._dirty: set[Any] = set()
        #: Keys known to be absent from RocksDB (and so from the dict).
        self._absent: set[Any] = set()
        self._active = False
        cache.register(self)

    # ---------------------------------------------------------------- the hot path

    def get(self, key: Any, default: Any = None) -> Any:
        # ``self[key]`` is dict's own lookup, C all the way on a hit; a miss calls __missing__
        try:
            return self[key]
        except KeyError:
            return default

    def __missing__(self, key: Any) -> Any:
        if key in self._absent:
            raise KeyError(key)
        value = self._load(key)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        dirty = self._dirty
        if key not in dirty:
            self._first_write(key)
            dirty.add(key)
        _dset(self, key, value)

    def _first_write(self, key: Any) -> None:
        """``key`` is written for the first time since the last flush: count it if new."""
        cache = self._cache
        if not _dcontains(self, key):
            absent = self._absent
            if key in absent:
                absent.remove(key)  # the entry takes the absent key's place
            else:
                cache.added()  # may flush and evict: before this view is marked active
        if not self._active:
            cache.activate(self)

    def _load(self, key: Any) -> Any:
        """Read ``key`` from RocksDB into the cache (a miss is cached as absent)."""
        cache = self._cache
        data = cache.db.get(self._prefix + encode_key(key))
        cache.misses += 1
        if cache.total >= cache.limit or (cache.total == cache.LEARN_AFTER and not cache._learned):
            # cache.added(), inlined: every miss comes here
            cache.make_room()
        cache.total += 1
        if data is None:
            self._absent.add(key)
            return _ABSENT
        cache._encoded_bytes += len(data)  # the average flush() keeps recent
        cache._encoded_entries += 1
        value = cache.decode(data)
        _dset(self, key, value)
        if type(value) not in _ATOMIC and not is_immutable(value):
            # code that reads it may change it in place: write it back at the next flush
            self._dirty.add(key)
            cache.activate(self)
        return value

    # ---------------------------------------------------------------- the rest of a dict

    def __contains__(self, key: object) -> bool:
        if _dcontains(self, key):
            return True
        if key in self._absent:
            return False
        return self._load(key) is not _ABSENT

    def pop(self, key: Any, default: Any = _RAISE) -> Any:
        value = _dget(self, key, _MISS)
        if value is _MISS:
            value = _ABSENT if key in self._absent else self._load(key)
        if value is _ABSENT:
            if default is _RAISE:
                raise KeyError(key)
            return default
        self._cache.db.delete(self._prefix + encode_key(key))
        _ddel(self, key)
        self._absent.add(key)  # in the deleted entry's place: the count stays
        self._dirty.discard(key)
        return value

    def __delitem__(self, key: Any) -> None:
        self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        value = self.get(key, _MISS)
        if value is _MISS:
            self[key] = value = default
        return value

    def clear(self) -> None:
        self._cache.db.delete_range(self._prefix, prefix_end(self._prefix))
        self._cache.total -= _dlen(self) + len(self._absent)
        _dclear(self)
        self._dirty.clear()
        self._absent.clear()

    def popitem(self) -> tuple[Any, Any]:
        keys = self._keys()
        if not keys:
            raise KeyError("popitem(): the state is empty")
        key = keys[-1]
        return key, self.pop(key)

    def _db_items(self) -> Iterator[tuple[bytes, bytes]]:
        return scan_items(self._cache.db, self._prefix)

    def items(self) -> list[tuple[Any, Any]]:  # type: ignore[override]
        """Every entry: RocksDB's, with the cached (newer) values over them, then the dirty
        entries RocksDB does not have yet. A list, taken at once: the caller may change the
        view while it walks it."""
        start = len(self._prefix)
        result: list[tuple[Any, Any]] = []
        listed: set[Any] = set()
        decode_value, decode_key = self._cache.decode, self._cache.decode_from
        for db_key, data in self._db_items():
            key = decode_key(db_key, start)[0]
            listed.add(key)
            value = _dget(self, key, _MISS)
            result.append((key, decode_value(data) if value is _MISS else value))
        for key in self._dirty:
            if key not in listed:
                result.append((key, _dget(self, key)))
        return result

    def _keys(self) -> list[Any]:
        start = len(self._prefix)
        decode_key = self._cache.decode_from
        keys = [decode_key(db_key, start)[0] for db_key in self._db_keys()]
        dirty = self._dirty
        if dirty:
            listed = set(keys)
            keys.extend(key for key in dirty if key not in listed)
        return keys

    def _db_keys(self) -> Iterator[bytes]:
        return scan_keys(self._cache.db, self._prefix)

    def keys(self) -> list[Any]:  # type: ignore[override]
        return self._keys()

    def values(self) -> list[Any]:  # type: ignore[override]
        return [value for _, value in self.items()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._keys())

    def __reversed__(self) -> Iterator[Any]:
        return iter(self._keys()[::-1])

    def __len__(self) -> int:
        count = 0
        for _ in self._db_keys():
            count += 1
        dirty = self._dirty
        if dirty:
            prefix = self._prefix
            get = self._cache.db.get
            # a dirty key RocksDB does not have yet is an entry too
            count += sum(1 for key in dirty if get(prefix + encode_key(key)) is None)
        return count

    def __bool__(self) -> bool:
        if _dlen(self):
            return True
        return next(self._db_keys(), None) is not None

    def forget(self, key: Any) -> None:
        """Drop ``key`` from the cache (RocksDB changed under it; it must be clean)."""
        if _dcontains(self, key):
            _ddel(self, key)
            self._dirty.discard(key)
            self._cache.total -= 1
        elif key in self._absent:
            self._absent.discard(key)
            self._cache.total -= 1

    def cached(self) -> int:
        """How many entries this view's cache holds (known absent keys included)."""
        return _dlen(self) + len(self._absent)


class MapKeyGroupView(_DictView):
    """A map state's entries of one key group, one RocksDB key per map entry, seen as
    ``{table key: {map key: value}}``.

    The map state handles read and write entries directly; this view serves the code that
    walks a table: listing and counting the keys that hold a map, reading or deleting a
    whole map. Nothing is cached, so its own dict storage stays empty.
    """

    __slots__ = ("_cache", "_prefix", "_encode")

    def __init__(self, cache: ValueCache, prefix: bytes) -> None:
        super().__init__()
        self._cache = cache  # for its database, which a restore replaces, and its decoding
        self._prefix = prefix
        #: How an entry's value is written (the codec's, or the typed state's serializer).
        self._encode: Encode = encode

    @property
    def _db(self) -> Rdict:
        return self._cache.db

    def _map_prefix(self, key: Any) -> bytes:
        return self._prefix + encode_key(key)

    def _entries(self, key: Any) -> dict[Any, Any]:
        prefix = self._map_prefix(key)
        start = len(prefix)
        decode_value, decode_key = self._cache.decode, self._cache.decode_from
        return {
            decode_key(db_key, start)[0]: decode_value(data) for db_key, data in scan_items(self._db, prefix)
        }

    def _keys(self) -> list[Any]:
        start = len(self._prefix)
        keys: list[Any] = []
        last: bytes | None = None
        decode_key = self._cache.decode_from
        for db_key in scan_keys(self._db, self._prefix):
            key, end = decode_key(db_key, start)
            encoded = db_key[start:end]
            if encoded != last:  # a map's entries are contiguous: its key encodes first
                keys.append(key)
                last = encoded
        return keys

    def get(self, key: Any, default: Any = None) -> Any:
        entries = self._entries(key)
        return entries if entries else default

    def __getitem__(self, key: Any) -> Any:
        entries = self._entries(key)
        if not entries:
            raise KeyError(key)
        return entries

    def __contains__(self, key: object) -> bool:
        prefix = self._map_prefix(key)
        return next(scan_keys(self._db, prefix), None) is not None

    def __setitem__(self, key: Any, value: Any) -> None:
        """Replace the map of ``key`` by ``value`` (a mapping)."""
        prefix = self._map_prefix(key)
        self._db.delete_range(prefix, prefix_end(prefix))
        batch = WriteBatch(raw_mode=True)
        encode_value = self._encode
        for map_key, map_value in dict(value).items():
            batch.put(prefix + encode_key(map_key), encode_value(map_value))
        self._db.write(batch)

    def pop(self, key: Any, default: Any = _RAISE) -> Any:
        entries = self._entries(key)
        if not entries:
            if default is _RAISE:
                raise KeyError(key)
            return default
        prefix = self._map_prefix(key)
        self._db.delete_range(prefix, prefix_end(prefix))
        return entries

    def __delitem__(self, key: Any) -> None:
        self.pop(key)

    def clear(self) -> None:
        self._db.delete_range(self._prefix, prefix_end(self._prefix))

    def items(self) -> list[tuple[Any, Any]]:  # type: ignore[override]
        return [(key, self._entries(key)) for key in self._keys()]

    def keys(self) -> list[Any]:  # type: ignore[override]
        return self._keys()

    def values(self) -> list[Any]:  # type: ignore[override]
        return [self._entries(key) for key in self._keys()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def __bool__(self) -> bool:
        return next(scan_keys(self._db, self._prefix), None) is not None
