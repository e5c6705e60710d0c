"""
The sync API, derived from the async one: each storage operation is written once, as a coroutine, and its sync twin
runs that coroutine while the caller's thread waits.

A network engine runs it on fsspec's I/O loop, a blocking one (local disk, memory) on a loop private to the calling
thread; `InFlightWrites` refuses a wait that would block the loop still uploading what it waits for.
"""

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from threading import get_ident
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from fsspec.asyn import get_loop, sync

P = ParamSpec("P")
T = TypeVar("T")

# The thread waiting for the operation running in this task (None: an async caller, whose thread keeps running).
WAITING_THREAD: ContextVar[int | None] = ContextVar("offload_waiting_thread", default=None)


def run_on_io_loop(operation: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """
    Run one async storage operation to completion from sync code, on fsspec's I/O loop thread.

    :param operation: The coroutine function (an ``*_async`` method).
    :param args: Its positional arguments.
    :param kwargs: Its keyword arguments.
    :returns: What the operation returned.
    :raises Exception: What the operation raised, unchanged.
    :raises NotImplementedError: If called on fsspec's I/O loop thread itself (await the async twin there).
    """
    return sync(get_loop(), _with_waiting_thread, get_ident(), operation, *args, **kwargs)  # type: ignore[no-any-return]


def run_on_own_loop(operation: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """
    `run_on_io_loop` for engines whose calls block anyway: run the operation on this thread's private event loop.

    :param operation: The coroutine function.
    :param args: Its positional arguments.
    :param kwargs: Its keyword arguments.
    :returns: What the operation returned.
    :raises Exception: What the operation raised, unchanged.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _thread_loop().run_until_complete(_with_waiting_thread(get_ident(), operation, *args, **kwargs))
    return run_on_io_loop(operation, *args, **kwargs)


class RunsSync(Protocol):
    """An object whose sync methods wait for its async ones: it decides where they run (`run_on_io_loop`, ...)."""

    def _run_sync(self, operation: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T: ...


Owner = TypeVar("Owner", bound=RunsSync)


def synced(operation: Callable[Concatenate[Owner, P], Coroutine[Any, Any, T]]) -> Callable[Concatenate[Owner, P], T]:
    """
    Derive the sync twin of an async method, as fsspec's ``sync_wrapper`` does: ``read = synced(read_async)``.

    The twin calls the instance's own ``<name>_async`` (so an override or a patched method is the one waited for)
    through its `RunsSync._run_sync`, and carries the async method's signature and docstring. A module function whose
    first parameter is such an object works the same: ``end_session = synced(end_session_async)``.

    :param operation: The ``*_async`` method, as defined in the class body, or the async function.
    :returns: The sync method, named without ``_async``.
    """
    name = operation.__name__
    is_method = "." in operation.__qualname__

    @functools.wraps(operation)
    def twin(self: Owner, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if is_method:
            return self._run_sync(getattr(self, name), *args, **kwargs)  # type: ignore[no-any-return]
        return self._run_sync(operation, self, *args, **kwargs)  # a function of the object: `end_session(store)`

    twin.__name__ = name.removesuffix("_async")
    twin.__qualname__ = operation.__qualname__.removesuffix("_async")
    twin.__doc__ = f"The sync form of `{name}`, waiting for it.\n\n{operation.__doc__ or ''}".rstrip()
    return twin


def caller_is_waiting() -> bool:
    """
    Whether the running operation is a sync caller's, on that caller's own thread (`run_on_own_loop`).

    :returns: True if blocking calls may run inline: the thread they would block is waiting for them anyway.
    """
    return WAITING_THREAD.get() == get_ident()


async def _with_waiting_thread(
    thread: int, operation: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
) -> T:
    # Set inside the task (a context of its own), so it never leaks to other operations on the loop.
    WAITING_THREAD.set(thread)
    return await operation(*args, **kwargs)


class _OwnLoop:
    """A thread's private event loop, closed when the thread ends (so it is never reported as unclosed)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __del__(self) -> None:
        if not self.loop.is_closed():
            self.loop.close()


_THREAD_LOOPS = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    own: _OwnLoop | None = getattr(_THREAD_LOOPS, "own", None)
    if own is None or own.loop.is_closed():
        own = _THREAD_LOOPS.own = _OwnLoop()
    return own.loop
