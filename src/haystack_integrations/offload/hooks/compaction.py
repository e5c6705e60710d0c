"""`OffloadCompactionHook`: a ``before_llm`` hook compacting by offloading older tool results into the run's store."""

import asyncio
import inspect
import logging
from collections.abc import Sequence
from typing import Any

from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.core.serialization import component_to_dict, default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage
from haystack.hooks.compaction.hooks import _estimated_context_tokens
from haystack.hooks.compaction.types import Compactor
from haystack.hooks.compaction.utils import _last_assistant_index
from haystack.hooks.tool_result_offloading.types import ToolResultStore
from haystack.token_counters import ApproximateTokenCounter, TokenCounter
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_integrations.offload.hooks.compaction_rounds import OffloadRounds
from haystack_integrations.offload.hooks.pointers import offload, offload_async
from haystack_integrations.offload.hooks.store_resolution import run_store

logger = logging.getLogger(__name__)


class OffloadCompactionHook:
    """
    Once the conversation fills too much of the window, offloads older tool results into the run's store.

    Haystack's `CompactionHook` with `ToolResultOffloadCompactor` writes to the compactor's constructor store only, so
    its docstring asks multi-user servers to build an Agent per run. This hook takes the same settings
    (`context_window`, `compact_at`, `compact_to`, `token_counter`, and the compactor's `min_keep_steps`,
    `min_tokens`, `preview_chars`) but writes into the store each run brings in ``hook_context``:

    - Before each LLM call it sizes the conversation as `CompactionHook` does (anchored on the provider's reported
      ``context_tokens``). At `compact_at` of the window it offloads tool results, oldest first, until the
      conversation is down to `compact_to`; the most recent `min_keep_steps` tool-calling steps are never touched.
    - Offloaded results get Haystack's pointer text and meta (``tool_result_offloaded`` and a ``context_compaction``
      marker), so `ToolResultPruningCompactor` and other Haystack hooks recognise them.
    - If offloading alone cannot reach the target, the compactors in `chain` run next, in order, for example
      `ToolResultPruningCompactor()` then `SlidingWindowCompactor()`.
    - In async runs the writes of a round go out concurrently and the event loop never waits on storage.
    - Results of the read-back tools (`read_tool_result`, `list_tool_results`) are never offloaded: the model read
      them from the store in the first place. A failed write leaves its result in the conversation.

    ```python
    from haystack.components.agents import Agent
    from haystack.components.generators.chat import MockChatGenerator
    from haystack.dataclasses import ChatMessage
    from haystack.hooks.compaction import ToolResultPruningCompactor
    from haystack_integrations.offload import FsspecToolResultStore, OffloadCompactionHook, offload_context

    results = FsspecToolResultStore("memory://agent-results")          # once, at start-up
    compaction = OffloadCompactionHook(context_window=128_000, chain=[ToolResultPruningCompactor()])
    agent = Agent(chat_generator=MockChatGenerator(responses="Done."), hooks={"before_llm": [compaction]})

    store = results.for_session(tenant="acme", session="chat-42")      # per request
    reply = agent.run([ChatMessage.from_user("Hi")], hook_context=offload_context(store))
    ```

    Multi-user use: one hook instance serves every run; it keeps no per-run state, and concurrent runs each write into
    their own store, never another's. Haystack's compaction classes are marked experimental and warn when built.
    """

    allowed_hook_points = ("before_llm",)

    def __init__(
        self,
        *,
        context_window: int,
        compact_at: float = 0.7,
        compact_to: float = 0.4,
        token_counter: TokenCounter | None = None,
        store: ToolResultStore | None = None,
        min_keep_steps: int = 1,
        min_tokens: int = 200,
        preview_chars: int = 200,
        chain: Sequence[Compactor] | None = None,
    ) -> None:
        """
        Configure when compaction starts, how far it goes, and what may be offloaded.

        :param context_window: The model's context window in tokens.
        :param compact_at: Fraction of the window at which compaction starts.
        :param compact_to: Fraction of the window compaction brings the conversation down to.
        :param token_counter: Sizes the messages the provider has not counted yet, and each result. Defaults to
            Haystack's `ApproximateTokenCounter`.
        :param store: The store for runs whose ``hook_context`` brings none. Leave it out on multi-user servers.
        :param min_keep_steps: The most recent tool-calling steps whose results are never offloaded; at least 1, so the
            model always sees the results it has not acted on yet.
        :param min_tokens: Only results over this many tokens are offloaded.
        :param preview_chars: How many leading characters of each offloaded text the pointer keeps.
        :param chain: Haystack compactors to run after offloading, in order, while the conversation is still over the
            target (for example pruning, then a sliding window).
        :raises ValueError: If `context_window` is not positive, the fractions are not
            ``0 < compact_to < compact_at <= 1``, `min_keep_steps` is below 1, or `min_tokens` or `preview_chars` is
            negative.
        :raises TypeError: If `store` has no ``write``, or an entry of `chain` has no ``compact``.
        """
        if context_window < 1:
            raise ValueError(f"context_window must be a positive number of tokens, got {context_window}.")
        if not 0 < compact_to < compact_at <= 1:
            raise ValueError(
                f"compact_at and compact_to must satisfy 0 < compact_to < compact_at <= 1, got compact_at={compact_at} "
                f"and compact_to={compact_to}: a target at or above the trigger would compact again at every step."
            )
        if min_keep_steps < 1:
            raise ValueError(f"min_keep_steps must be at least 1, got {min_keep_steps}: the latest results stay.")
        if min_tokens < 0:
            raise ValueError(f"min_tokens must be at least 0, got {min_tokens}.")
        if preview_chars < 0:
            raise ValueError(f"preview_chars must be at least 0, got {preview_chars}.")
        if store is not None and not callable(getattr(store, "write", None)):
            raise TypeError(f"store must be a ToolResultStore (with write), got {type(store).__name__}.")
        for compactor in chain or ():
            if not callable(getattr(compactor, "compact", None)):
                raise TypeError(f"Every entry of chain must be a Compactor (with compact), got {type(compactor)}.")
        self.context_window = context_window
        self.compact_at = compact_at
        self.compact_to = compact_to
        self.token_counter: TokenCounter = token_counter or ApproximateTokenCounter()
        self.store = store
        self.min_keep_steps = min_keep_steps
        self.min_tokens = min_tokens
        self.preview_chars = preview_chars
        self.chain: list[Compactor] = list(chain or [])

    # Running

    def run(self, state: State) -> None:
        """
        Compact ``messages`` if the conversation fills `compact_at` of the window, writing one result at a time.

        :param state: The Agent's live `State`, rewritten in place when compaction changes the conversation.
        :raises ValueError: If neither the run's ``hook_context`` nor the hook has a store.
        """
        # Resolved before sizing, so a run without a store fails on its first step, not once its conversation grows.
        store = run_store(state, self.store, hook_name=type(self).__name__)
        sizing = self._sizing(state)
        if sizing is None:
            return
        target_tokens, overhead = sizing
        messages: list[ChatMessage] = state.data.get("messages") or []
        rounds = self._rounds(store, messages, target_tokens)
        while batch := rounds.next_batch():
            rounds.apply(batch, [offload(rounds.store, candidate.plan) for candidate in batch])
        compacted = rounds.result()
        if rounds.current_tokens > target_tokens:
            for compactor in self.chain:
                chained = compactor.compact(compacted or messages, target_tokens, self.token_counter)
                compacted = chained if chained is not None else compacted
        self._apply(state, messages, compacted, overhead)

    async def run_async(self, state: State) -> None:
        """
        Compact ``messages`` if the conversation fills `compact_at` of the window; each round's writes run at once.

        :param state: The Agent's live `State`, rewritten in place when compaction changes the conversation.
        :raises ValueError: If neither the run's ``hook_context`` nor the hook has a store.
        """
        # Resolved before sizing, so a run without a store fails on its first step, not once its conversation grows.
        store = run_store(state, self.store, hook_name=type(self).__name__)
        sizing = self._sizing(state)
        if sizing is None:
            return
        target_tokens, overhead = sizing
        messages: list[ChatMessage] = state.data.get("messages") or []
        rounds = self._rounds(store, messages, target_tokens)
        while batch := rounds.next_batch():
            pointers = await asyncio.gather(*(offload_async(rounds.store, candidate.plan) for candidate in batch))
            rounds.apply(batch, list(pointers))
        compacted = rounds.result()
        if rounds.current_tokens > target_tokens:
            for compactor in self.chain:
                chained = await _compact_async(compactor, compacted or messages, target_tokens, self.token_counter)
                compacted = chained if chained is not None else compacted
        self._apply(state, messages, compacted, overhead)

    def _sizing(self, state: State) -> tuple[int, int] | None:
        """The target for the messages and the estimated non-message overhead, or None below `compact_at`."""
        messages: list[ChatMessage] = state.data.get("messages") or []
        estimated = _estimated_context_tokens(
            messages=messages,
            context_tokens=state.data.get("context_tokens", 0),
            token_counter=self.token_counter,
            tools=state.data.get("tools"),
        )
        if estimated < self.context_window * self.compact_at:
            return None
        # What the provider counts beyond the messages (system template, tool schemas) stays after compaction.
        overhead = estimated - self.token_counter.count(messages=messages)
        return max(int(self.context_window * self.compact_to) - overhead, 0), overhead

    def _rounds(self, store: ToolResultStore, messages: list[ChatMessage], target_tokens: int) -> OffloadRounds:
        return OffloadRounds(
            messages,
            store=store,
            target_tokens=target_tokens,
            token_counter=self.token_counter,
            min_keep_steps=self.min_keep_steps,
            min_tokens=self.min_tokens,
            preview_chars=self.preview_chars,
        )

    def _apply(
        self, state: State, before: list[ChatMessage], compacted: list[ChatMessage] | None, overhead: int
    ) -> None:
        if compacted is None:
            return
        state.set("messages", compacted, handler_override=replace_values)
        # As CompactionHook does: a provider count of 0 means "count everything locally", so it stays 0; otherwise
        # re-estimate what the provider accounted for (through the last assistant message) plus the overhead.
        if state.data.get("context_tokens", 0) != 0:
            last_assistant = _last_assistant_index(messages=compacted)
            accounted = compacted if last_assistant < 0 else compacted[: last_assistant + 1]
            state.set("context_tokens", self.token_counter.count(messages=accounted) + overhead)
        logger.debug(
            "Compacted the conversation at step %s from %s to %s messages.",
            state.data.get("step_count", 0),
            len(before),
            len(compacted),
        )

    # Lifecycle

    def warm_up(self) -> None:
        """Warm up the token counter, the constructor store and the chained compactors."""
        for resource in (self.token_counter, self.store, *self.chain):
            warm_up = getattr(resource, "warm_up", None)
            if callable(warm_up):
                warm_up()

    async def warm_up_async(self) -> None:
        """Async `warm_up`, awaiting ``warm_up_async`` where a resource has one."""
        for resource in (self.token_counter, self.store, *self.chain):
            warm_up_async = getattr(resource, "warm_up_async", None)
            warm_up = getattr(resource, "warm_up", None)
            if warm_up_async is not None and inspect.iscoroutinefunction(warm_up_async):
                await warm_up_async()
            elif callable(warm_up):
                await asyncio.to_thread(warm_up)

    def close(self) -> None:
        """Release the token counter's and the chained compactors' resources (stores belong to their owner)."""
        for resource in (self.token_counter, *self.chain):
            close = getattr(resource, "close", None)
            if callable(close):
                close()

    async def close_async(self) -> None:
        """Async `close`."""
        for resource in (self.token_counter, *self.chain):
            close_async = getattr(resource, "close_async", None)
            close = getattr(resource, "close", None)
            if close_async is not None and inspect.iscoroutinefunction(close_async):
                await close_async()
            elif callable(close):
                close()

    # Serialization

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the hook with its token counter, chained compactors and constructor store, if any.

        :returns: A dictionary representation.
        :raises SerializationError: If the constructor store cannot be serialized (for example, credentials in clear).
        """
        return default_to_dict(
            self,
            context_window=self.context_window,
            compact_at=self.compact_at,
            compact_to=self.compact_to,
            token_counter=component_to_dict(obj=self.token_counter, name="token_counter"),
            store=component_to_dict(obj=self.store, name="store") if self.store is not None else None,
            min_keep_steps=self.min_keep_steps,
            min_tokens=self.min_tokens,
            preview_chars=self.preview_chars,
            chain=[component_to_dict(obj=compactor, name="chain") for compactor in self.chain],
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OffloadCompactionHook":
        """
        Deserialize a hook produced by `to_dict`; nested objects go through Haystack's import allowlist.

        :param data: The dictionary representation.
        :returns: The hook.
        """
        init_parameters = data.get("init_parameters", {})
        for key in ("token_counter", "store"):
            if init_parameters.get(key) is not None:
                deserialize_component_inplace(init_parameters, key=key)
        chain = init_parameters.get("chain") or []
        restored: list[Any] = []
        for serialized in chain:
            holder = {"compactor": serialized}
            deserialize_component_inplace(holder, key="compactor")
            restored.append(holder["compactor"])
        init_parameters["chain"] = restored
        return default_from_dict(cls, data)


async def _compact_async(
    compactor: Compactor, messages: list[ChatMessage], target_tokens: int, token_counter: TokenCounter
) -> list[ChatMessage] | None:
    # Compactors implementing Haystack's protocol inherit compact_async; duck-typed ones may only have compact.
    compact_async = getattr(compactor, "compact_async", None)
    if compact_async is not None and inspect.iscoroutinefunction(compact_async):
        result: list[ChatMessage] | None = await compact_async(messages, target_tokens, token_counter)
        return result
    return await asyncio.to_thread(compactor.compact, messages, target_tokens, token_counter)
