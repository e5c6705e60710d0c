"""
Writing planned results into whatever store the run brought: sync, async, or started for write-behind.

`offload` and `offload_async` write a step's plans (from `pointers.plan`) and return their pointers; which way a store
is written, block by block, is chosen here and nowhere else, and so is what each written result counts as
(`_stored`, `_not_stored`; a write-behind result counts once `write_behind.settle_run` sees its write finish).
"""

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol, cast

from haystack.components.agents.state.state import State
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.hooks.pointers import OffloadPlan, count_outcome, store_tenant
from haystack_integrations.offload.hooks.write_behind import InFlightOffload, track
from haystack_integrations.offload.stores.pending import PendingWrite
from haystack_integrations.offload.types import AsyncWrites, TaggedWrites, WriteBehind

logger = logging.getLogger(__name__)


# A step's planned results: each way ends in the plan's pointer, or None if the store failed (the result stays).


def offload(store: ToolResultStore, plans: Sequence[OffloadPlan]) -> list[ChatMessage | None]:
    """
    Write planned results one block after another, and return their pointer messages.

    Offloading only saves context, so a failed write must not end the run: it is logged, that result's pointer is
    `None`, and the caller leaves the result in the conversation. Blocks written before a failure stay, unreferenced.

    :param store: The run's store.
    :param plans: What to write.
    :returns: One pointer message per plan, in order; `None` where a write failed.
    """
    return [_write_through(store, offload_plan) for offload_plan in plans]


async def offload_async(
    store: ToolResultStore, plans: Sequence[OffloadPlan], *, behind: State | None = None
) -> list[ChatMessage | None]:
    """
    Write planned results without blocking the event loop, and return their pointer messages.

    Written through, every block of every plan is written at once, and each write is awaited, failed or not, before
    this returns. With `behind`, and a store that can (`can_write_behind`), the writes are only started: each pointer
    is returned at once and the writes are kept in the run's table (`write_behind.track`).

    :param store: The run's store.
    :param plans: What to write.
    :param behind: The run's live `State`, to write behind; `None` writes through.
    :returns: One pointer message per plan, in order; `None` where a write failed (logged; the result stays).
    """
    if behind is not None and can_write_behind(store):
        return [await _write_behind(behind, store, offload_plan) for offload_plan in plans]
    if len(plans) == 1:
        # No task to create for the common single result.
        return [await _write_through_async(store, plans[0])]
    return list(await asyncio.gather(*(_write_through_async(store, offload_plan) for offload_plan in plans)))


def _write_through(store: ToolResultStore, offload_plan: OffloadPlan) -> ChatMessage | None:
    try:
        references = [
            write_block(store, key=block.key, content=block.content, tool_name=offload_plan.tool_name)
            for block in offload_plan.blocks
        ]
    except Exception as error:
        _not_stored(offload_plan, store, error)
        return None
    return _stored(offload_plan, store, references)


async def _write_through_async(store: ToolResultStore, offload_plan: OffloadPlan) -> ChatMessage | None:
    writes = [
        write_block_async(store, key=block.key, content=block.content, tool_name=offload_plan.tool_name)
        for block in offload_plan.blocks
    ]
    outcomes: list[str | BaseException]
    if len(writes) == 1:
        # Most results are one block: await it in place, without the task a gather would create.
        try:
            outcomes = [await writes[0]]
        except Exception as error:
            outcomes = [error]
    else:
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
    references: list[str] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, Exception):
                raise outcome  # cancellation and interpreter exits are not storage failures
            _not_stored(offload_plan, store, outcome)
            return None
        references.append(outcome)
    return _stored(offload_plan, store, references)


async def _write_behind(state: State, store: ToolResultStore, offload_plan: OffloadPlan) -> ChatMessage | None:
    # The store names each reference before sending anything (`begin_write_async`), so the pointer is final.
    writes: list[PendingWrite] = []
    try:
        for block in offload_plan.blocks:
            writes.append(
                await begin_block_async(store, key=block.key, content=block.content, tool_name=offload_plan.tool_name)
            )
    except Exception as error:
        # A refusal before sending (a quota, say). Blocks already started finish unreferenced, as a failed
        # write-through leaves its earlier blocks.
        _not_stored(offload_plan, store, error)
        return None
    pointer = offload_plan.pointer_message([write.reference for write in writes])
    # Not counted yet: its bytes are still on their way (`settle_run` counts it once they are stored, or not).
    track(state, InFlightOffload(offload_plan, tuple(writes), tenant=store_tenant(store)))
    return pointer


def _stored(offload_plan: OffloadPlan, store: ToolResultStore, references: list[str]) -> ChatMessage:
    # Every block written: the result counts as stored, with the bytes written.
    count_outcome(offload_plan, tenant=store_tenant(store))
    return offload_plan.pointer_message(references)


def _not_stored(offload_plan: OffloadPlan, store: ToolResultStore, error: BaseException) -> None:
    # The result stays in the conversation: counted as refused by quota, or kept inline after a failed write.
    _log_failure(offload_plan, store, error)
    count_outcome(offload_plan, tenant=store_tenant(store), error=error)


def _log_failure(offload_plan: OffloadPlan, store: ToolResultStore, error: BaseException) -> None:
    logger.warning(
        "Failed to offload the result of tool %r to %s; leaving the result in context. Error: %s",
        offload_plan.tool_name,
        type(store).__name__,
        error,
        exc_info=error,
    )


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
