"""
Which older tool results compaction offloads, chosen oldest first in rounds so that a round's writes run at once.

Haystack's `ToolResultOffloadCompactor` writes one result, measures, and decides on the next: one store round trip
after another. Here each round picks, oldest first, as many results as should bring the conversation under the target
(measuring each pointer with its key standing in for the reference the store will return), the caller writes them all
concurrently, and the real pointers are measured. If the estimate fell short, for example because a write failed, the
next round picks up where the last stopped. The choice matches Haystack's: oldest first, stopping at the target, never
touching the most recent tool-calling steps, and only results over a size floor.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from uuid import uuid4

from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading.types import ToolResultStore
from haystack.token_counters import TokenCounter

from haystack_integrations.offload.compat import COMPACTION_META_KEY as _COMPACTION_META_KEY
from haystack_integrations.offload.compat import agent_step_spans as _agent_step_spans
from haystack_integrations.offload.constants import READ_BACK_TOOL_NAMES
from haystack_integrations.offload.hooks.pointers import OFFLOADED_META_KEY, OffloadPlan, plan

COMPACTION_META_KEY = _COMPACTION_META_KEY
"""Haystack's meta key on a message a compactor produced; the value names the strategy."""

STRATEGY = "tool_result_offloading"
"""The strategy name recorded on compacted results: the same as Haystack's `ToolResultOffloadCompactor`."""


@dataclass(frozen=True)
class Candidate:
    """
    An older tool result chosen for offloading in this round.

    :param index: Its position in the conversation.
    :param plan: What to write.
    :param original_tokens: Its size before offloading.
    """

    index: int
    plan: OffloadPlan
    original_tokens: int


class OffloadRounds:
    """
    Offload older tool results, oldest first, until the conversation fits `target_tokens`.

    Use: ``while batch := rounds.next_batch(): rounds.apply(batch, <pointer or None per candidate>)``, then
    ``rounds.result()``. The messages given are never modified.
    """

    def __init__(
        self,
        messages: list[ChatMessage],
        *,
        store: ToolResultStore,
        target_tokens: int,
        token_counter: TokenCounter,
        min_keep_steps: int,
        min_tokens: int,
        preview_chars: int,
    ) -> None:
        """
        :param messages: The conversation, oldest first.
        :param store: The run's store: where the caller writes each batch (consulted here for binary support).
        :param target_tokens: What the conversation should come in under.
        :param token_counter: The counter the hook sized the conversation with.
        :param min_keep_steps: How many of the most recent tool-calling steps keep their results.
        :param min_tokens: Only results over this many tokens are offloaded.
        :param preview_chars: How many leading characters of each text the pointer keeps.
        """
        self._messages = messages
        self.store = store
        self._target_tokens = target_tokens
        self._token_counter = token_counter
        self._min_tokens = min_tokens
        self._preview_chars = preview_chars
        self._compacted = list(messages)
        self._changed = False
        self.current_tokens = token_counter.count(messages=messages)
        self._indices: Iterator[int] = iter(self._unprotected_results(min_keep_steps))

    def _unprotected_results(self, min_keep_steps: int) -> list[int]:
        if self.current_tokens <= self._target_tokens:
            return []
        # A step is an assistant message and the tool results after it; parallel calls' results share a step.
        spans = _agent_step_spans(messages=self._messages, start=0)
        result_steps = [range(start + 1, end) for start, end in spans if end > start + 1]
        protected = {index for step in result_steps[-min_keep_steps:] for index in step}
        return [
            index
            for index, message in enumerate(self._messages)
            if message.tool_call_result is not None and index not in protected
        ]

    def _candidate(self, index: int) -> tuple[Candidate, int] | None:
        message = self._messages[index]
        result = message.tool_call_result
        if (
            result is None
            or COMPACTION_META_KEY in message.meta
            or message.meta.get(OFFLOADED_META_KEY)
            or result.origin.tool_name in READ_BACK_TOOL_NAMES
        ):
            return None
        original_tokens = self._token_counter.count(messages=[message])
        if original_tokens <= self._min_tokens:
            return None
        offload_plan = plan(
            message,
            store=self.store,
            # A random part keeps keys apart across runs sharing a store, with or without a tool-call id.
            key_prefix=f"compacted_{result.origin.tool_name}_{uuid4().hex}",
            preview_chars=self._preview_chars,
            extra_meta={COMPACTION_META_KEY: {"strategy": STRATEGY, "original_tokens": original_tokens}},
        )
        if offload_plan is None:
            return None
        estimate = offload_plan.pointer_message([block.key for block in offload_plan.blocks])
        estimated_saving = original_tokens - self._token_counter.count(messages=[estimate])
        if estimated_saving <= 0:
            return None
        return Candidate(index=index, plan=offload_plan, original_tokens=original_tokens), estimated_saving

    def next_batch(self) -> list[Candidate]:
        """
        Choose the next results to offload, oldest first, until their estimated savings reach the target.

        :returns: The results to write now; empty when the target is met or nothing is left to offload.
        """
        batch: list[Candidate] = []
        expected = self.current_tokens
        if expected <= self._target_tokens:
            return batch
        for index in self._indices:
            chosen = self._candidate(index)
            if chosen is None:
                continue
            candidate, estimated_saving = chosen
            batch.append(candidate)
            expected -= estimated_saving
            if expected <= self._target_tokens:
                break
        return batch

    def apply(self, batch: list[Candidate], pointers: list[ChatMessage | None]) -> None:
        """
        Put the written results' pointers into the conversation.

        :param batch: The round's candidates, as `next_batch` returned them.
        :param pointers: Each candidate's pointer message, or `None` where its write failed (it stays in context).
        """
        for candidate, pointer in zip(batch, pointers, strict=True):
            if pointer is None:
                continue
            saved = candidate.original_tokens - self._token_counter.count(messages=[pointer])
            if saved <= 0:
                # The reference came out longer than estimated and the pointer saves nothing: keep the result in
                # context; the stored copy is left unreferenced (as Haystack's compactor does).
                continue
            self._compacted[candidate.index] = pointer
            self.current_tokens -= saved
            self._changed = True

    def result(self) -> list[ChatMessage] | None:
        """
        :returns: The conversation with offloaded results replaced, or `None` if nothing was offloaded.
        """
        return self._compacted if self._changed else None
