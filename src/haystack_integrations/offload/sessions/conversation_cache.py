"""
A worker's bounded cache of the conversations it served, so its next turn in a session reads only what changed.

An entry is never trusted on its own: `SessionHistory.read` checks it against the session's head document and the
next turn's start, or leaves the second check to the claim itself when this worker's entries are seldom behind
(`ConversationCache.claims_first`; `docs/design.md`).
"""

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Protocol

DEFAULT_CACHE_BYTES = 64 * 2**20
"""What one worker keeps by default: the JSON of the conversations it served most recently, 64 MiB at most."""

CLAIM_FIRST_BELOW = 1 / 20
"""Claim first while fewer than this share of checked entries were behind. Claiming first saves a GET when the entry is
current and costs a refused PUT and two GETs when it is not: at AWS prices ($0.0004 a GET, $0.005 a PUT per 1,000) that
pays while under 1 in 15 are behind (sessions that stay on one worker), and never with round-robin routing."""
_BEHIND_WEIGHT = 1 / 8
"""The weight of the newest check in the moving share: one entry found behind stops claiming first for 7 checks."""


class CacheEntry(Protocol):
    """What the cache holds: anything that says how many bytes it keeps (`history.CachedConversation`)."""

    @property
    def size(self) -> int:
        """The bytes this entry is charged for."""
        ...


class ConversationCache:
    """
    Least recently used conversations, bounded by their JSON's size; safe to share between threads and event loops.

    ```python
    cache = ConversationCache(max_bytes=16 * 2**20)
    history = SessionHistory(store.for_session("acme", "chat-42"), worker="web-1", cache=cache)
    ```
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        """
        :param max_bytes: The most this cache holds; 0 keeps nothing (every read goes to the store).
        :raises ValueError: If `max_bytes` is negative.
        """
        if max_bytes < 0:
            raise ValueError(f"The cache size must be 0 or more bytes, got {max_bytes}.")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, CacheEntry] = OrderedDict()
        self._bytes = 0
        self._behind = 0.0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> CacheEntry | None:
        """
        :param key: The session's key.
        :returns: Its entry, or None.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: Hashable, entry: CacheEntry) -> None:
        """
        Keep `entry` for `key`, dropping the least recently used entries past the bound (an entry over a quarter of
        the bound is not kept at all: one long conversation must not empty the cache of every other).

        :param key: The session's key.
        :param entry: What to keep.
        """
        with self._lock:
            self._drop(key)
            if entry.size * 4 > self.max_bytes:
                return
            self._entries[key] = entry
            self._bytes += entry.size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def discard(self, key: Hashable) -> None:
        """
        Forget `key`'s entry, if any.

        :param key: The session's key.
        """
        with self._lock:
            self._drop(key)

    def observe(self, *, current: bool) -> None:
        """
        Count one check of an entry against the store: `current`, or behind turns another worker ran.

        :param current: Whether no other worker had run the session's next turn.
        """
        with self._lock:
            self._behind += ((0.0 if current else 1.0) - self._behind) * _BEHIND_WEIGHT

    @property
    def claims_first(self) -> bool:
        """Whether a turn on a cached conversation claims the next turn without reading its start first."""
        with self._lock:
            return self._behind < CLAIM_FIRST_BELOW

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def bytes(self) -> int:
        """The bytes the entries hold together."""
        with self._lock:
            return self._bytes

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size


SHARED_CONVERSATIONS = ConversationCache()
"""The process's cache, used by every `SessionHistory` not given one of its own."""
