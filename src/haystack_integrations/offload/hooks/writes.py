"""
How one block is written to whatever store the run brought: sync, async, or started for write-behind.

`pointers` writes a planned result's blocks with these and builds the pointer from what they return; the hook only
asks `can_write_behind` to choose how a step is written.

Haystack's `ToolResultStore` protocol has only ``write(*, key, content)``. Stores of this library add a ``tool_name``
argument (recorded for `list_tool_results`) and an async twin, ``write_async``, that never blocks the event loop.
Hooks accept any store: they pass ``tool_name`` only where the store's ``write`` takes it, await ``write_async``
where it exists, and otherwise run the sync ``write`` in a worker thread so the loop stays free.
"""

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.stores.pending import PendingWrite


@dataclass(frozen=True)
class _WriteCapabilities:
    sync_takes_tool_name: bool
    has_async: bool
    async_takes_tool_name: bool
    can_write_behind: bool


def _takes_tool_name(method: Callable[..., Any] | None) -> bool:
    if method is None:
        return False
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # some C callables expose no signature
        return False
    return any(
        parameter.name == "tool_name" or parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters
    )


@lru_cache(maxsize=256)
def _capabilities_of(store_type: type) -> _WriteCapabilities:
    # Looked up once per store class: signature inspection is too slow to repeat for every write of a busy server.
    write_async = getattr(store_type, "write_async", None)
    has_async = write_async is not None and inspect.iscoroutinefunction(write_async)
    begin_write_async = getattr(store_type, "begin_write_async", None)
    return _WriteCapabilities(
        sync_takes_tool_name=_takes_tool_name(getattr(store_type, "write", None)),
        has_async=has_async,
        async_takes_tool_name=has_async and _takes_tool_name(write_async),
        can_write_behind=begin_write_async is not None and inspect.iscoroutinefunction(begin_write_async),
    )


def _capabilities(store: ToolResultStore) -> _WriteCapabilities:
    return _capabilities_of(type(store))


def write_block(store: ToolResultStore, *, key: str, content: str | bytes, tool_name: str) -> str:
    """
    Write one block with the store's sync ``write``.

    :param store: The run's store.
    :param key: The block's key (with its extension).
    :param content: Text or bytes.
    :param tool_name: The tool that produced the result; passed on only if the store's ``write`` takes it.
    :returns: The reference the store returned.
    :raises Exception: Whatever the store raises; callers decide what a failed write means.
    """
    if _capabilities(store).sync_takes_tool_name:
        return _reference(store.write(key=key, content=content, tool_name=tool_name))  # type: ignore[call-arg]
    return _reference(store.write(key=key, content=content))


async def write_block_async(store: ToolResultStore, *, key: str, content: str | bytes, tool_name: str) -> str:
    """
    Write one block without blocking the event loop.

    Awaits the store's ``write_async`` when it has one; otherwise runs ``write`` in a worker thread.

    :param store: The run's store.
    :param key: The block's key (with its extension).
    :param content: Text or bytes.
    :param tool_name: The tool that produced the result; passed on only if the store takes it.
    :returns: The reference the store returned.
    :raises Exception: Whatever the store raises; callers decide what a failed write means.
    """
    capabilities = _capabilities(store)
    if capabilities.has_async:
        write_async = store.write_async  # type: ignore[attr-defined]
        if capabilities.async_takes_tool_name:
            return _reference(await write_async(key=key, content=content, tool_name=tool_name))
        return _reference(await write_async(key=key, content=content))
    return await asyncio.to_thread(write_block, store, key=key, content=content, tool_name=tool_name)


def can_write_behind(store: ToolResultStore) -> bool:
    """
    Whether the store can start a write and name its reference before the bytes are stored.

    :param store: The run's store.
    :returns: True for stores with an async ``begin_write_async`` (like `FsspecToolResultStore`).
    """
    return _capabilities(store).can_write_behind


async def begin_block_async(store: ToolResultStore, *, key: str, content: str | bytes, tool_name: str) -> PendingWrite:
    """
    Start writing one block with the store's ``begin_write_async``; the upload goes on after this returns.

    :param store: The run's store; `can_write_behind` must be true for it.
    :param key: The block's key (with its extension).
    :param content: Text or bytes.
    :param tool_name: The tool that produced the result.
    :returns: The write in flight, with its reference.
    :raises Exception: Whatever the store raises before sending (a quota refusal, say).
    """
    pending = await store.begin_write_async(key=key, content=content, tool_name=tool_name)  # type: ignore[attr-defined]
    if not isinstance(pending, PendingWrite):
        raise TypeError(f"The store returned {pending!r} from begin_write_async; expected a PendingWrite.")
    _reference(pending.reference)
    return pending


def _reference(value: object) -> str:
    # The reference goes into the conversation and back to `read`: anything but a non-empty string is a broken store.
    if not isinstance(value, str) or not value:
        raise TypeError(f"The store returned {value!r} from write; a reference must be a non-empty string.")
    return value
