"""
Offloading a step's planned results: write each (`writes`), leave its pointer (`pointers`), count what came of it.

`offload` and `offload_async` serve both hooks (`OffloadHook`, `OffloadCompactionHook`) and return one pointer per
plan, or None where the write failed and the result stays; a write-behind result counts once `write_behind.settle_run`
sees its write finish.
"""

import asyncio
import logging
from collections.abc import Sequence

from haystack.components.agents.state.state import State
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.hooks.pointers import OffloadPlan, count_outcome, store_tenant
from haystack_integrations.offload.hooks.write_behind import InFlightOffload, track
from haystack_integrations.offload.hooks.writes import (
    begin_block_async,
    can_write_behind,
    write_block,
    write_block_async,
)
from haystack_integrations.offload.stores.pending import PendingWrite

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
