"""
One value per running event loop: made on first use on that loop, closed when that loop shuts down.

It holds async S3 clients bound to the caller's own loop; `CrossLoopLock` is the lock for what the loops share.
"""

import asyncio
import atexit
import threading
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    loop: asyncio.AbstractEventLoop
    value: T
    guard: AsyncGenerator[None, None] | None = field(default=None)


class LoopLocal(Generic[T]):
    """A value per event loop, with its closing tied to the loop's shutdown."""

    def __init__(
        self,
        make: Callable[[], T],
        close: Callable[[T], Awaitable[None]],
        close_now: Callable[[T, asyncio.AbstractEventLoop], None],
    ) -> None:
        """
        :param make: Builds the value for the running loop (called on that loop, without awaiting).
        :param close: Closes a value on its own loop, as the loop shuts down.
        :param close_now: Closes a value without its loop (closed already, or the interpreter is exiting).
        """
        self._make = make
        self._close = close
        self._close_now = close_now
        self._entries: dict[int, _Entry[T]] = {}
        self._lock = threading.Lock()
        _LIVE.add(self)

    async def get(self) -> T:
        """
        The running loop's value, made on first use.

        :returns: The value for the running loop.
        """
        loop = asyncio.get_running_loop()
        entry = self._entries.get(id(loop))
        if entry is not None and entry.loop is loop:
            return entry.value
        with self._lock:
            self._close_abandoned()
            entry = _Entry(loop, self._make())
            self._entries[id(loop)] = entry
        guard = self._close_at_shutdown(entry)
        entry.guard = guard
        await guard.__anext__()  # runs to the `yield` at once; from here the loop tracks the generator
        return entry.value

    async def _close_at_shutdown(self, entry: _Entry[T]) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                if self._entries.get(id(entry.loop)) is entry:
                    del self._entries[id(entry.loop)]
            await self._close(entry.value)

    def _close_abandoned(self) -> None:
        # Called with the lock held. A closed loop's id may be reused by a new loop, so entries are matched by identity.
        for key, entry in list(self._entries.items()):
            if entry.loop.is_closed():
                del self._entries[key]
                self._close_now(entry.value, entry.loop)

    async def close_async(self) -> None:
        """
        Close every value now that its owner is done with them: the running loop's awaited, another running loop's
        scheduled on that loop (never awaited: that loop's thread may be waiting on this one), a stopped loop's at once.
        """
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        running = asyncio.get_running_loop()
        for entry in entries:
            # Closing through the guard runs its `finally` once, so the loop's shutdown does not close it again.
            guard = entry.guard
            if guard is not None and entry.loop is running:
                await guard.aclose()
            elif guard is not None and entry.loop.is_running():
                asyncio.run_coroutine_threadsafe(guard.aclose(), entry.loop)
            else:
                self._close_now(entry.value, entry.loop)

    def close_all_now(self) -> None:
        """Close every value synchronously (at interpreter exit)."""
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        for entry in entries:
            self._close_now(entry.value, entry.loop)

    def __len__(self) -> int:
        return len(self._entries)


class CrossLoopLock:
    """
    An async lock that tasks on any event loop, in any thread, may share (an `asyncio.Lock` belongs to one loop).

    A thread lock tried without blocking; while another holder has it, the waiter sleeps on its own loop and tries
    again (1 ms, doubling to 50 ms). Meant for rare contention on slow, one-off work (making a client, refreshing
    credentials), where the polling costs nothing measurable; not fair, and not for hot paths.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def locked(self) -> bool:
        """Whether some task holds the lock."""
        return self._lock.locked()

    async def acquire(self) -> bool:
        """Wait for the lock without blocking the running loop."""
        delay = 0.001
        while not self._lock.acquire(blocking=False):
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.05)
        return True

    def release(self) -> None:
        """Release the lock (from any thread)."""
        self._lock.release()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()


_LIVE: "weakref.WeakSet[LoopLocal[Any]]" = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for loop_local in list(_LIVE):
        loop_local.close_all_now()
