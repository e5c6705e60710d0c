"""
Sync entry points above the store, derived from their async twins: each operation is written once, as a coroutine,
and ``sync_twin`` makes the function that waits for it (as fsspec's ``sync_wrapper``; the store's own twins are made
by `stores.sync_api`). The coroutine runs on an event loop the call owns, so it may block; `docs/design.md` says why.
"""

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def run_blocking(operation: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """
    Run ``operation(*args, **kwargs)`` to its end from sync code: on a new event loop in this thread, or, when a loop
    already runs in this thread, on a new loop in a helper thread (with this thread's context variables).

    :param operation: The coroutine function.
    :param args: Its positional arguments.
    :param kwargs: Its keyword arguments.
    :returns: What it returns.
    :raises Exception: What it raises, unchanged.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(operation(*args, **kwargs))
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="offload-sync") as pool:
        return pool.submit(context.run, asyncio.run, operation(*args, **kwargs)).result()


def sync_twin(operation: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """
    Derive the sync twin of an async function or method: ``decide = sync_twin(decide_async)``.

    The twin runs the coroutine with `run_blocking` and carries the async one's signature and docstring. A method's twin
    calls the instance's own ``<name>_async`` (so an override or a patched method is the one waited for).

    :param operation: The ``*_async`` function, or method as defined in the class body.
    :returns: The sync function, named without ``_async``.
    """
    name = operation.__name__
    is_method = "." in operation.__qualname__.rsplit("<locals>.", 1)[-1]

    @functools.wraps(operation)
    def twin(*args: P.args, **kwargs: P.kwargs) -> T:
        _check_sync_use(args)
        if is_method:
            owner, *rest = args
            return run_blocking(getattr(owner, name), *rest, **kwargs)  # type: ignore[no-any-return]
        return run_blocking(operation, *args, **kwargs)

    twin.__name__ = name.removesuffix("_async")
    twin.__qualname__ = operation.__qualname__.removesuffix("_async")
    twin.__doc__ = f"The sync form of `{name}`, waiting for it.\n\n{inspect.cleandoc(operation.__doc__ or '')}".rstrip()
    return twin


def _check_sync_use(args: tuple[object, ...]) -> None:
    # A store (or an object holding one, as a ledger does) that cannot be used from sync code says so itself
    # (`FsspecToolResultStore.check_sync_use`), rather than failing later on a loop its client does not belong to.
    for value in args:
        check = getattr(getattr(value, "store", value), "check_sync_use", None)
        if callable(check):
            check()
