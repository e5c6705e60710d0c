"""`OffloadCompactionHook`: Haystack's ``before_llm`` compaction, able to offload older results into the run's store."""

import asyncio
import copy
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.core.serialization import (
    component_to_dict,
    default_from_dict,
    default_to_dict,
    generate_qualified_class_name,
)
from haystack.dataclasses import ChatMessage
from haystack.hooks.compaction.types import Compactor
from haystack.hooks.tool_result_offloading.types import ToolResultStore
from haystack.token_counters import ApproximateTokenCounter, TokenCounter
from haystack.tools import ToolsType
from haystack.tracing.tracer import tracer
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_integrations.offload.compat import estimated_context_tokens as _estimated_context_tokens
from haystack_integrations.offload.compat import last_assistant_index as _last_assistant_index
from haystack_integrations.offload.context import run_store
from haystack_integrations.offload.hooks.compaction_rounds import OffloadRounds
from haystack_integrations.offload.hooks.pointers import OffloadPlan
from haystack_integrations.offload.hooks.step_offload import offload, offload_async

logger = logging.getLogger(__name__)

# The tags Haystack's `CompactionHook` sets on its `haystack.agent.hook` span: dashboards built for it keep working.
TAG_STRATEGY = "haystack.agent.hook.compaction.strategy"
TAG_ESTIMATED_CONTEXT_TOKENS = "haystack.agent.hook.compaction.estimated_context_tokens"
TAG_TRIGGERED = "haystack.agent.hook.compaction.triggered"
TAG_TARGET_TOKENS = "haystack.agent.hook.compaction.target_tokens"
TAG_COMPACTED = "haystack.agent.hook.compaction.compacted"

# How `run` and `run_async` differ: they write a round of results, and run a compactor, each in their own way.
_Write = Callable[[ToolResultStore, list[OffloadPlan]], Awaitable[list[ChatMessage | None]]]
_Compact = Callable[[Compactor, list[ChatMessage], int, TokenCounter], Awaitable[list[ChatMessage] | None]]


class OffloadCompactionHook:
    """
    Compacts an Agent's conversation once it fills too much of the window, offloading into each run's own store.

    A drop-in sibling of Haystack's `CompactionHook`: ``CompactionHook(compactor, context_window=...)`` becomes
    ``OffloadCompactionHook(compactor, context_window=...)`` and behaves the same (the same trigger and target, the same
    warning, the same tracing tags on the ``haystack.agent.hook`` span). What it adds is offloading that writes into the
    store each run brings in ``hook_context`` (`offload_context(store)`): Haystack's `ToolResultOffloadCompactor`
    writes to the one store it was built with, so its docstring asks multi-user servers to build an Agent per run.

    How offloading and compactors combine, once the conversation reaches `compact_at` of the window:

    1. **Offloading** (``offload=True``; the default when no `compactor` is given) writes older tool results into the
       run's store, oldest first, until the conversation is down to `compact_to`. The most recent `min_keep_steps`
       tool-calling steps, results under `min_tokens`, errors and the read-back tools' results stay. Offloaded results
       get Haystack's pointer text and meta (``tool_result_offloaded`` and a ``context_compaction`` marker), so
       `ToolResultPruningCompactor` and other Haystack hooks recognise them. In async runs a round's writes go out
       concurrently; a failed write leaves its result in the conversation.
    2. **The compactor, then the chain** run in order, each on the previous one's output: without offloading whenever
       compaction triggers (as in `CompactionHook`), with offloading only if it could not reach the target.

    A compactor that writes into a store of its own (`ToolResultOffloadCompactor(store=...)`) is refused: every
    tenant's compacted results would land in that one store. Use this hook's offloading instead, or pass
    ``allow_shared_store=True`` where one store for every run is intended (a single-user tool).

    Metrics: each write offloading makes counts once in ``offload.results`` (`metrics.result_offloaded`): ``stored``
    with its bytes (even if its pointer then saves too little to replace the result), else ``refused_quota`` or
    ``kept_inline``; a result whose write failed is tried, and counted, again at the next compaction. Results it leaves
    (under `min_tokens`, in the kept steps) are not counted as ``under_threshold``: each compaction sees them again.

    Tracing: the tags are Haystack's (``haystack.agent.hook.compaction.strategy``, ``.estimated_context_tokens``,
    ``.triggered``, ``.target_tokens``, ``.compacted``). The strategy is the compactor's qualified class name, as in
    `CompactionHook`; with offloading or a chain it lists every stage in order, comma-separated, offloading named by
    this class.

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
        compactor: Compactor | None = None,
        *,
        context_window: int,
        compact_at: float = 0.7,
        compact_to: float = 0.4,
        token_counter: TokenCounter | None = None,
        offload: bool | None = None,
        store: ToolResultStore | None = None,
        min_keep_steps: int = 1,
        min_tokens: int = 200,
        preview_chars: int = 200,
        chain: Sequence[Compactor] | None = None,
        allow_shared_store: bool = False,
    ) -> None:
        """
        Configure when compaction starts, how far it goes, and what compacts.

        :param compactor: A Haystack `Compactor`, as `CompactionHook` takes it (for example `SlidingWindowCompactor()`).
        :param context_window: The model's context window in tokens.
        :param compact_at: Fraction of the window at which compaction starts.
        :param compact_to: Fraction of the window compaction brings the conversation down to.
        :param token_counter: Sizes the messages the provider has not counted yet, and each result. Defaults to
            Haystack's `ApproximateTokenCounter`.
        :param offload: Offload older tool results into the run's store before any compactor runs. Defaults to on
            without a `compactor` and off with one (so a switch from `CompactionHook` changes nothing else).
        :param store: With offloading, the store for runs whose ``hook_context`` brings none. Leave it out on
            multi-user servers.
        :param min_keep_steps: The most recent tool-calling steps whose results are never offloaded; at least 1, so the
            model always sees the results it has not acted on yet.
        :param min_tokens: Only results over this many tokens are offloaded.
        :param preview_chars: How many leading characters of each offloaded text the pointer keeps.
        :param chain: Further compactors, run in order after `compactor` (for example pruning, then a sliding window).
        :param allow_shared_store: Accept compactors that write into a store of their own, shared by every run.
        :raises ValueError: If `context_window` is not positive, the fractions are not
            ``0 < compact_to < compact_at <= 1``, `min_keep_steps` is below 1, `min_tokens` or `preview_chars` is
            negative, nothing is left to compact with (``offload=False`` and no compactor), or a compactor holds its
            own store and `allow_shared_store` is off.
        :raises TypeError: If `store` has no ``write``, `compactor` or an entry of `chain` has no ``compact``, or
            `offload` or `allow_shared_store` is not a bool.
        """
        # Messages as in Haystack's CompactionHook, so code matching on them keeps working after the switch.
        if context_window < 1:
            raise ValueError(f"`context_window` must be a positive number of tokens, got {context_window}.")
        if not 0 < compact_to < compact_at <= 1:
            raise ValueError(
                f"`compact_at` and `compact_to` must satisfy 0 < compact_to < compact_at <= 1, got "
                f"compact_at={compact_at} and compact_to={compact_to}: a target at or above the trigger would compact "
                f"again at every step."
            )
        if min_keep_steps < 1:
            raise ValueError(f"`min_keep_steps` must be at least 1, got {min_keep_steps}: the latest results stay.")
        if min_tokens < 0:
            raise ValueError(f"`min_tokens` must be at least 0, got {min_tokens}.")
        if preview_chars < 0:
            raise ValueError(f"`preview_chars` must be at least 0, got {preview_chars}.")
        if store is not None and not callable(getattr(store, "write", None)):
            raise TypeError(f"store must be a ToolResultStore (with write), got {type(store).__name__}.")
        for name, flag in (("offload", offload), ("allow_shared_store", allow_shared_store)):
            if flag is not None and not isinstance(flag, bool):
                raise TypeError(f"`{name}` must be a bool, got {type(flag).__name__}.")
        self.compactor = compactor
        self.chain: list[Compactor] = list(chain or [])
        compactors = self._compactors()
        for entry in compactors:
            if not callable(getattr(entry, "compact", None)):
                raise TypeError(f"compactor and each entry of chain must be a Compactor (with compact), got {entry!r}.")
        offloading = compactor is None if offload is None else offload
        if not offloading and not compactors:
            raise ValueError("With offload=False there is nothing to compact with: pass a compactor.")
        if not allow_shared_store:
            for entry in compactors:
                _refuse_shared_store(entry)
        self.context_window = context_window
        self.compact_at = compact_at
        self.compact_to = compact_to
        self.token_counter: TokenCounter = token_counter or ApproximateTokenCounter()
        self.offload = offloading
        self.store = store
        self.min_keep_steps = min_keep_steps
        self.min_tokens = min_tokens
        self.preview_chars = preview_chars
        self.allow_shared_store = allow_shared_store

    # Running

    def run(self, state: State) -> None:
        """
        Compact ``messages`` if the conversation fills `compact_at` of the window, writing one result at a time.

        :param state: The Agent's live `State`, rewritten in place when compaction changes the conversation.
        :raises ValueError: If offloading is on and neither the run's ``hook_context`` nor the hook has a store.
        """
        _run_without_suspending(self._compact(state, _offload_sync, _compact_sync))

    async def run_async(self, state: State) -> None:
        """
        Compact ``messages`` if the conversation fills `compact_at` of the window; each round's writes run at once.

        :param state: The Agent's live `State`, rewritten in place when compaction changes the conversation.
        :raises ValueError: If offloading is on and neither the run's ``hook_context`` nor the hook has a store.
        """
        await self._compact(state, offload_async, _compact_async)

    async def _compact(self, state: State, write: _Write, compact: _Compact) -> None:
        """The one compaction routine of `run` and `run_async`, which differ in how they `write` and `compact`."""
        # Resolved before sizing, so a run without a store fails on its first step, not once its conversation grows.
        store = run_store(state, self.store, hook_name=type(self).__name__) if self.offload else None
        messages: list[ChatMessage] = state.data.get("messages") or []
        context_tokens: int = state.data.get("context_tokens", 0)
        target = self._target_tokens(messages, context_tokens, state.data.get("tools"))
        if target is None:
            return
        target_tokens, overhead = target
        compacted: list[ChatMessage] | None = None
        if store is not None:
            rounds = self._rounds(store, messages, target_tokens)
            while batch := rounds.next_batch():
                rounds.apply(batch, await write(rounds.store, [candidate.plan for candidate in batch]))
            compacted = rounds.result()
            if rounds.current_tokens <= target_tokens:
                self._apply(state, messages, compacted, target_tokens, context_tokens, overhead)
                return
        for compactor in self._compactors():
            current = messages if compacted is None else compacted
            chained = await compact(compactor, current, target_tokens, self.token_counter)
            compacted = chained if chained is not None else compacted
        self._apply(state, messages, compacted, target_tokens, context_tokens, overhead)

    def _compactors(self) -> list[Compactor]:
        """The compactors in the order they run: `compactor`, then `chain`."""
        return [self.compactor, *self.chain] if self.compactor is not None else list(self.chain)

    def _strategy(self) -> str:
        """The ``strategy`` tag: the qualified class name of each stage, in order; offloading is named by this class."""
        stages: list[type] = [type(self)] if self.offload else []
        stages += [type(compactor) for compactor in self._compactors()]
        return ",".join(generate_qualified_class_name(stage) for stage in stages)

    def _target_tokens(
        self, messages: list[ChatMessage], context_tokens: int, tools: ToolsType | None
    ) -> tuple[int, int] | None:
        """The target for the messages and the estimated non-message overhead, or None below `compact_at`."""
        estimated = _estimated_context_tokens(
            messages=messages, context_tokens=context_tokens, token_counter=self.token_counter, tools=tools
        )
        triggered = estimated >= self.context_window * self.compact_at
        span = tracer.current_span()
        if span is not None:
            span.set_tags(
                tags={TAG_STRATEGY: self._strategy(), TAG_ESTIMATED_CONTEXT_TOKENS: estimated, TAG_TRIGGERED: triggered}
            )
        if not triggered:
            return None
        # What the provider counts beyond the messages (system template, tool schemas) stays after compaction.
        message_tokens = self.token_counter.count(messages=messages)
        overhead = estimated - message_tokens
        if overhead < 0:
            logger.warning(
                "The TokenCounter estimated more tokens for the messages (%s) than the estimated total context size "
                "(%s). It may be overestimating; consider configuring a more accurate TokenCounter.",
                message_tokens,
                estimated,
            )
        target_tokens = max(int(self.context_window * self.compact_to) - overhead, 0)
        if span is not None:
            span.set_tag(key=TAG_TARGET_TOKENS, value=target_tokens)
        return target_tokens, overhead

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
        self,
        state: State,
        before: list[ChatMessage],
        compacted: list[ChatMessage] | None,
        target_tokens: int,
        original_context_tokens: int,
        overhead: int,
    ) -> None:
        span = tracer.current_span()
        if span is not None:
            span.set_tag(key=TAG_COMPACTED, value=compacted is not None)
        if compacted is None:
            return
        state.set("messages", compacted, handler_override=replace_values)
        # As CompactionHook does: a provider count of 0 means "count everything locally", so it stays 0; otherwise
        # re-estimate what the provider accounted for (through the last assistant message) plus the overhead.
        if original_context_tokens != 0:
            last_assistant = _last_assistant_index(messages=compacted)
            accounted = compacted if last_assistant < 0 else compacted[: last_assistant + 1]
            state.set("context_tokens", self.token_counter.count(messages=accounted) + overhead)
        logger.debug(
            "Compacted the conversation at step %s from %s to %s messages, targeting %s tokens.",
            state.data.get("step_count", 0),
            len(before),
            len(compacted),
            target_tokens,
        )

    # Lifecycle

    def warm_up(self) -> None:
        """Warm up the token counter, the constructor store and the compactors."""
        for resource in (self.token_counter, self.store, *self._compactors()):
            warm_up = getattr(resource, "warm_up", None)
            if callable(warm_up):
                warm_up()

    async def warm_up_async(self) -> None:
        """Async `warm_up`, awaiting ``warm_up_async`` where a resource has one."""
        for resource in (self.token_counter, self.store, *self._compactors()):
            await _call_async(resource, "warm_up", in_thread=True)

    def close(self) -> None:
        """Release the token counter's and the compactors' resources (stores belong to their owner)."""
        for resource in (self.token_counter, *self._compactors()):
            close = getattr(resource, "close", None)
            if callable(close):
                close()

    async def close_async(self) -> None:
        """Async `close`."""
        for resource in (self.token_counter, *self._compactors()):
            await _call_async(resource, "close", in_thread=False)

    # Serialization

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the hook with its compactor, token counter, chained compactors and constructor store, if any.

        :returns: A dictionary representation.
        :raises SerializationError: If the constructor store cannot be serialized (for example, credentials in clear).
        """
        return default_to_dict(
            self,
            compactor=component_to_dict(obj=self.compactor, name="compactor") if self.compactor is not None else None,
            context_window=self.context_window,
            compact_at=self.compact_at,
            compact_to=self.compact_to,
            token_counter=component_to_dict(obj=self.token_counter, name="token_counter"),
            offload=self.offload,
            store=component_to_dict(obj=self.store, name="store") if self.store is not None else None,
            min_keep_steps=self.min_keep_steps,
            min_tokens=self.min_tokens,
            preview_chars=self.preview_chars,
            chain=[component_to_dict(obj=compactor, name="chain") for compactor in self.chain],
            allow_shared_store=self.allow_shared_store,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OffloadCompactionHook":
        """
        Deserialize a hook produced by `to_dict` (or by `CompactionHook.to_dict`, with this class as its type).

        Nested objects go through Haystack's import allowlist.

        :param data: The dictionary representation.
        :returns: The hook.
        """
        # A deep copy: nested from_dicts rebuild in place, and the caller's dictionary may be loaded again or compared.
        init_parameters = copy.deepcopy(data.get("init_parameters", {}))
        data = {**data, "init_parameters": init_parameters}
        for key in ("compactor", "token_counter", "store"):
            if init_parameters.get(key) is not None:
                deserialize_component_inplace(init_parameters, key=key)
        restored: list[Any] = []
        for serialized in init_parameters.get("chain") or []:
            holder = {"compactor": serialized}
            deserialize_component_inplace(holder, key="compactor")
            restored.append(holder["compactor"])
        init_parameters["chain"] = restored
        return default_from_dict(cls, data)


def _refuse_shared_store(compactor: Compactor) -> None:
    # A compactor's own store is shared by every run of the Agent, hence by every tenant: refused unless opted in.
    store = getattr(compactor, "store", None)
    if store is None or not callable(getattr(store, "write", None)):
        return
    settings = ", ".join(
        f"{name}={getattr(compactor, name)!r}"
        for name in ("min_keep_steps", "min_tokens", "preview_chars")
        if hasattr(compactor, name)
    )
    raise ValueError(
        f"{type(compactor).__name__} writes every run's results into the one store it was built with "
        f"({type(store).__name__}), so on a multi-user server all tenants' compacted results would share it. Drop it "
        f"and let this hook offload into each run's own store: OffloadCompactionHook(context_window=..."
        f"{', ' + settings if settings else ''}) with hook_context=offload_context(store). If one store for every run "
        f"is intended (a single-user tool), pass allow_shared_store=True."
    )


async def _offload_sync(store: ToolResultStore, plans: list[OffloadPlan]) -> list[ChatMessage | None]:
    # Awaitable but never suspending: `run` gets the one compaction routine with sync, one-at-a-time writes.
    return offload(store, plans)


async def _compact_sync(
    compactor: Compactor, messages: list[ChatMessage], target_tokens: int, token_counter: TokenCounter
) -> list[ChatMessage] | None:
    # Awaitable but never suspending, as `_offload_sync`.
    return compactor.compact(messages=messages, target_tokens=target_tokens, token_counter=token_counter)


def _run_without_suspending(routine: Coroutine[Any, Any, None]) -> None:
    # A coroutine that awaits only what never suspends ends at its first step, with no event loop to drive it.
    try:
        routine.send(None)
    except StopIteration:
        return
    routine.close()
    raise RuntimeError("The sync compaction path awaited something that suspends.")


async def _compact_async(
    compactor: Compactor, messages: list[ChatMessage], target_tokens: int, token_counter: TokenCounter
) -> list[ChatMessage] | None:
    # Compactors implementing Haystack's protocol inherit compact_async; duck-typed ones may only have compact.
    result: list[ChatMessage] | None = await _call_async(
        compactor,
        "compact",
        in_thread=True,
        messages=messages,
        target_tokens=target_tokens,
        token_counter=token_counter,
    )
    return result


async def _call_async(resource: Any, name: str, *, in_thread: bool, **kwargs: Any) -> Any:
    # Awaits ``<name>_async`` where it is a coroutine function; otherwise calls ``<name>``, if any, in a worker thread
    # or (`in_thread` off, for quick calls such as close) right here.
    method_async = getattr(resource, f"{name}_async", None)
    if method_async is not None and inspect.iscoroutinefunction(method_async):
        return await method_async(**kwargs)
    method = getattr(resource, name, None)
    if not callable(method):
        return None
    return await asyncio.to_thread(method, **kwargs) if in_thread else method(**kwargs)
