"""
Writing one block into whatever store the run brought: sync, async, or started for write-behind.

Which way a store is written is chosen here and nowhere else; what a write means for the conversation (a pointer, a
count, a result kept) is `step_offload`'s to say.
"""

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol, cast

from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.stores.pending import PendingWrite
from haystack_integrations.offload.types import AsyncWrites, TaggedWrites, WriteBehind

logger = logging.getLogger(__name__)


# One block, whichever way the store takes it.


class _TaggedWrite(Protocol):
    """A sync ``write`` that records the tool (`TaggedWrites` without its async twin)."""

    def write(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> str: ...


@dataclass(frozen=True)
class _WriteCapabilities:
    sync_takes_tool_name: bool
    has_async: bool
    """`AsyncWrites` (or `TaggedWrites`): ``write_async`` is awaited."""
    async_takes_tool_name: bool
    """`TaggedWrites` proper: its ``write_async`` takes the tool name."""
    can_write_behind: bool
    """`WriteBehind`."""


def _takes_tool_name(method: Callable[..., Any] | None) -> bool:
    # The part of TaggedWrites a runtime Protocol check cannot see: whether the method accepts ``tool_name``.
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
    # Checked against the class, once: these Protocols have methods only, so `issubclass` answers for every instance.
    has_async = issubclass(store_type, AsyncWrites)
    return _WriteCapabilities(
        sync_takes_tool_name=_takes_tool_name(getattr(store_type, "write", None)),
        has_async=has_async,
        async_takes_tool_name=issubclass(store_type, TaggedWrites)
        and _takes_tool_name(getattr(store_type, "write_async", None)),
        can_write_behind=issubclass(store_type, WriteBehind),
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
        return _reference(cast(_TaggedWrite, store).write(key=key, content=content, tool_name=tool_name))
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
    if capabilities.async_takes_tool_name:
        return _reference(await cast(TaggedWrites, store).write_async(key=key, content=content, tool_name=tool_name))
    if capabilities.has_async:
        return _reference(await cast(AsyncWrites, store).write_async(key=key, content=content))
    return await asyncio.to_thread(write_block, store, key=key, content=content, tool_name=tool_name)


def can_write_behind(store: ToolResultStore) -> bool:
    """
    Whether the store can start a write and name its reference before the bytes are stored.

    :param store: The run's store.
    :returns: True for `WriteBehind` stores (like `FsspecToolResultStore`).
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
    pending = await cast(WriteBehind, store).begin_write_async(key=key, content=content, tool_name=tool_name)
    if not isinstance(pending, PendingWrite):
        raise TypeError(f"The store returned {pending!r} from begin_write_async; expected a PendingWrite.")
    _reference(pending.reference)
    return pending


def _reference(value: object) -> str:
    # The reference goes into the conversation and back to `read`: anything but a non-empty string is a broken store.
    if not isinstance(value, str) or not value:
        raise TypeError(f"The store returned {value!r} from write; a reference must be a non-empty string.")
    return value
