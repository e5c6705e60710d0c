"""
Write-behind offloading: the pointer goes into the conversation while the result's bytes are still being stored.

`writes` starts a result's writes and `track`s them in the run's table; `settle_run` counts each result once its writes
have finished (`pointers.count_outcome`), puts back any whose write has failed and, at ``after_run``, waits for every
write of the run first.
"""

import logging
from dataclasses import dataclass
from weakref import WeakKeyDictionary

from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.dataclasses import ChatMessage

from haystack_integrations.offload.hooks.pointers import OFFLOADED_META_KEY, OffloadPlan, count_outcome
from haystack_integrations.offload.stores.pending import PendingWrite, settle

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InFlightOffload:
    """
    A result whose pointer is in the conversation while its blocks are being written.

    :param plan: What was offloaded (the original message, to put back if a write fails).
    :param writes: One write per block, in block order.
    :param tenant: The store's tenant, to count the result under once its writes finish.
    """

    plan: OffloadPlan
    writes: tuple[PendingWrite, ...]
    tenant: str | None = None

    @property
    def references(self) -> list[str]:
        """The references the pointer names, in block order."""
        return [write.reference for write in self.writes]

    def done(self) -> bool:
        """:returns: Whether every block's write has finished."""
        return all(write.done() for write in self.writes)

    def error(self) -> BaseException | None:
        """:returns: The first block's failure, or `None` if every block is stored (only once `done`)."""
        return next((error for write in self.writes if (error := write.error()) is not None), None)


_RUNS: "WeakKeyDictionary[State, list[InFlightOffload]]" = WeakKeyDictionary()


def track(state: State, offload: InFlightOffload) -> None:
    """
    Keep a result's writes in flight as the run's, for `settle_run` to settle.

    :param state: The run's live `State`.
    :param offload: The result whose pointer is in the conversation, and its writes.
    """
    _RUNS.setdefault(state, []).append(offload)


async def settle_run(state: State, *, wait: bool) -> None:
    """
    Settle the run's finished writes: each result is counted, and one whose write failed gets its original message back.

    A result counts when its writes are seen finished here, not when its pointer was placed: ``stored`` once every
    block is stored, else ``kept_inline`` (what the hook does on a storage failure, even when a compactor has dropped
    the pointer since and there is nothing left to put back). A run whose hook never settles it counts nothing more.

    :param state: The run's live `State`.
    :param wait: Wait for every write in flight first (at the end of the run); otherwise only look at finished ones.
    """
    offloads = _RUNS.get(state)
    if not offloads:
        return
    if wait:
        await settle(write for offload in offloads for write in offload.writes)
    finished = [offload for offload in offloads if offload.done()]
    if not finished:
        return
    remaining = [offload for offload in offloads if not offload.done()]
    if remaining:
        _RUNS[state] = remaining
    else:
        del _RUNS[state]
    for offload in finished:
        count_outcome(offload.plan, tenant=offload.tenant, error=offload.error())
    failed = [offload for offload in finished if offload.error() is not None]
    if failed:
        _restore(state, failed)


def _restore(state: State, failed: list[InFlightOffload]) -> None:
    messages: list[ChatMessage] = list(state.data.get("messages") or [])
    # References are unique (each carries a random nonce), so they find the pointer wherever it now sits.
    positions = {
        tuple(references): index
        for index, message in enumerate(messages)
        if isinstance(references := message.meta.get(OFFLOADED_META_KEY), list)
    }
    changed = False
    for offload in failed:
        error = offload.error()
        index = positions.get(tuple(offload.references))
        if index is None:
            # A compactor has dropped the pointer since: the result left the conversation by that compactor's choice.
            logger.warning(
                "Failed to offload the result of tool %r (%s); its pointer is no longer in the conversation, so "
                "there is nothing to put back.",
                offload.plan.tool_name,
                error,
            )
            continue
        logger.warning(
            "Failed to offload the result of tool %r; putting the result back into the conversation. Error: %s",
            offload.plan.tool_name,
            error,
            exc_info=error,
        )
        messages[index] = offload.plan.message
        changed = True
    if changed:
        state.set("messages", messages, handler_override=replace_values)
