"""The one shape of an in-process cache: bounded by size (the least recently used entry
goes first) and by age. A plain dict keyed by anything a client can choose (a slug, an
action name, a token) grows the process for as long as it lives."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")


class BoundedCache(Generic[K, V]):
    """A thread-safe LRU map of at most `maxsize` entries, each kept at most `max_age`
    seconds (None: no age limit). `on_evict(key, value)` is called for entries pushed
    out by the size bound, e.g. to close a client."""

    def __init__(self, maxsize: int, max_age: float | None = None,
                 on_evict: Callable[[K, V], object] | None = None) -> None:
        self.maxsize = maxsize
        self.max_age = max_age
        self.on_evict = on_evict
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()  # key -> (stored_at, value)
        self._lock = threading.Lock()

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...

    def get(self, key: K, default: object = None) -> object:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return default
            if self.max_age is not None and time.monotonic() - entry[0] > self.max_age:
                del self._entries[key]
                return default
            self._entries.move_to_end(key)
            return entry[1]

    def set(self, key: K, value: V) -> V:
        evicted: list[tuple[K, tuple[float, V]]] = []
        with self._lock:
            self._entries[key] = (time.monotonic(), value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                evicted.append(self._entries.popitem(last=False))
        for old_key, (_, old_value) in evicted:
            if self.on_evict is not None:
                self.on_evict(old_key, old_value)
        return value

    @overload
    def pop(self, key: K) -> V | None: ...
    @overload
    def pop(self, key: K, default: D) -> V | D: ...

    def pop(self, key: K, default: object = None) -> object:
        with self._lock:
            entry = self._entries.pop(key, None)
        return default if entry is None else entry[1]

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __contains__(self, key: K) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def __len__(self) -> int:
        return len(self._entries)


_MISSING = object()
