"""`OffloadHook`: an async-native ``after_tool`` hook that offloads a step's tool results into the run's own store."""

import asyncio
import inspect
from collections.abc import Mapping
from typing import Any, overload

from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.core.serialization import component_to_dict, default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading.types import OffloadPolicy, ToolResultStore
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_integrations.offload.context import run_store
from haystack_integrations.offload.hooks.pointers import OffloadPlan, plan, store_tenant
from haystack_integrations.offload.hooks.policies import (
    deserialize_strategies,
    policy_for,
    serialize_strategies,
    validate_strategies,
)
from haystack_integrations.offload.hooks.step_offload import offload, offload_async
from haystack_integrations.offload.hooks.write_behind import settle_run
from haystack_integrations.offload.metrics import result_offloaded


class OffloadHook:
    """
    Offloads tool results to the run's `ToolResultStore` and leaves Haystack's pointer in the conversation.

    The multi-user sibling of Haystack's `ToolResultOffloadHook`, configured the same way (`offload_strategies` with
    Haystack's `OffloadPolicy` objects, `preview_chars`; ``OffloadHook(store, offload_strategies)`` in Haystack's
    argument order works too) and leaving the same pointer text and ``tool_result_offloaded`` meta, so Haystack's
    compactors recognise its results. Like Haystack's hook it adds no tracing tags of its own: each call is traced by
    the Agent's ``haystack.agent.hook`` span, as every hook's is. What it adds:

    - **Async-native.** In `Agent.run_async` it awaits the store's ``write_async`` (one PUT per block on S3) and writes
      all of a step's results concurrently; Haystack's sync-only hook instead occupies one thread of a small pool per
      write. Stores without ``write_async`` are written from a worker thread, so the event loop never blocks.
    - **The run's store.** Each run brings its store in ``hook_context`` (`offload_context(store)`); the constructor
      `store` is only a fallback, and the hook holds no per-run state.
    - **Tool names recorded.** Stores whose ``write`` takes ``tool_name`` (like `FsspecToolResultStore`) record the
      tool, so `list_tool_results` can show it.
    - **Read-back tools skipped.** Results of `read_tool_result` and `list_tool_results` are never offloaded. With
      Haystack's stock hook, map those tools to `NeverOffload()` yourself.

    A failed write (network, permissions, a missing bucket) is logged and leaves that result in the conversation; the
    run goes on. Errors, empty results and results already offloaded stay as they are.

    Metrics (`metrics.result_offloaded`): each result a policy decides on counts once in ``offload.results``, by
    outcome: ``stored`` (with the bytes written; behind, once the write has finished), ``under_threshold`` (its policy
    kept it), ``refused_quota`` or ``kept_inline`` (the write failed and the result stayed). Results of tools no key
    covers, errors and empty results are not counted.

    **Write-behind** (``write_behind=True``, async runs, stores with ``begin_write_async`` such as
    `FsspecToolResultStore`): the pointer replaces the result as soon as the write has started, and the run's next
    model call and tools overlap the upload instead of waiting for it. Register the same hook under ``after_run`` as
    well: there it waits for every write of the run, so when the run returns every pointer names a stored result.
    Each call of the hook puts back any result whose write has failed meanwhile; reading a result whose write is still
    in flight (`read_tool_result`) waits for it. Sync runs and other stores write through as usual.

    ```python
    hook = OffloadHook({"*": OffloadOverChars(4000)}, write_behind=True)
    agent = Agent(chat_generator=..., hooks={"after_tool": [hook], "after_run": [hook]})
    ```

    ```python
    from haystack.components.agents import Agent
    from haystack.components.generators.chat import MockChatGenerator
    from haystack.dataclasses import ChatMessage
    from haystack.hooks.tool_result_offloading import NeverOffload, OffloadOverChars
    from haystack_integrations.offload import FsspecToolResultStore, OffloadHook, offload_context

    results = FsspecToolResultStore("memory://agent-results")          # once, at start-up
    agent = Agent(
        chat_generator=MockChatGenerator(responses="Done."),            # your chat generator and tools
        hooks={"after_tool": [OffloadHook({"*": OffloadOverChars(4000), "get_time": NeverOffload()})]},
    )

    store = results.for_session(tenant="acme", session="chat-42")      # per request
    reply = agent.run([ChatMessage.from_user("Hi")], hook_context=offload_context(store))
    ```

    Multi-user use: build one Agent with one `OffloadHook` at start-up and give every run its own
    ``results.for_session(tenant, session)`` through ``hook_context``; concurrent runs never share a store.
    """

    allowed_hook_points = ("after_tool", "after_run")

    @overload
    def __init__(
        self,
        offload_strategies: Mapping[str | tuple[str, ...], OffloadPolicy],
        *,
        store: ToolResultStore | None = None,
        preview_chars: int = 200,
        write_behind: bool = False,
    ) -> None: ...

    @overload
    def __init__(
        self,
        store: ToolResultStore | None,
        offload_strategies: Mapping[str | tuple[str, ...], OffloadPolicy],
        *,
        preview_chars: int = 200,
        write_behind: bool = False,
    ) -> None: ...

    def __init__(
        self,
        *args: Any,
        store: ToolResultStore | None = None,
        offload_strategies: Mapping[str | tuple[str, ...], OffloadPolicy] | None = None,
        preview_chars: int = 200,
        write_behind: bool = False,
    ) -> None:
        """
        Configure which tools' results are offloaded, and how much of each stays visible.

        Takes this library's order, ``OffloadHook(offload_strategies, store=...)``, and Haystack's
        `ToolResultOffloadHook` order, ``OffloadHook(store, offload_strategies)``, so switching from Haystack's hook
        is a change of class name. Keywords work in either case.

        :param offload_strategies: Tool name, tuple of tool names, or ``"*"`` mapped to the `OffloadPolicy` deciding
            whether that tool's results are offloaded (`OffloadOverChars`, `AlwaysOffload`, `NeverOffload`, or your
            own). The most specific key wins; tools no key covers are not offloaded.
        :param store: The store for runs whose ``hook_context`` brings none. Leave it out on multi-user servers, so a
            run without its own store fails loudly instead of writing into a shared one.
        :param preview_chars: How many leading characters of each offloaded text the pointer keeps.
        :param write_behind: In async runs, let the run go on while results upload (see the class docs); register
            the hook under both ``after_tool`` and ``after_run``.
        :raises TypeError: If `offload_strategies` is missing or given twice, a strategy key or policy has the wrong
            type, `store` has no ``write``, or `write_behind` is not a bool.
        :raises ValueError: If `preview_chars` is negative, a key is empty or repeated, or a read-back tool is given
            a policy other than `NeverOffload`.
        """
        store, strategies = _store_and_strategies(args, store, offload_strategies)
        if isinstance(preview_chars, bool) or not isinstance(preview_chars, int) or preview_chars < 0:
            raise ValueError(f"preview_chars must be a non-negative integer, got {preview_chars!r}.")
        if store is not None and not callable(getattr(store, "write", None)):
            raise TypeError(f"store must be a ToolResultStore (with write), got {type(store).__name__}.")
        if not isinstance(write_behind, bool):
            raise TypeError(f"write_behind must be a bool, got {type(write_behind).__name__}.")
        self.offload_strategies = validate_strategies(strategies)
        self.store = store
        self.preview_chars = preview_chars
        self.write_behind = write_behind

    # Running

    def run(self, state: State) -> None:
        """
        Offload this step's tool results that their policies select, one write after another.

        :param state: The Agent's live `State`; offloaded results are replaced in ``messages``.
        :raises ValueError: If neither the run's ``hook_context`` nor the hook has a store.
        """
        planned = self._plan(state)
        if planned is None:
            return
        store, plans = planned
        self._apply(state, plans, offload(store, [offload_plan for _, offload_plan in plans]))

    async def run_async(self, state: State) -> None:
        """
        Offload this step's tool results that their policies select, all writes at once, without blocking the loop.

        With ``write_behind``, the writes go on after this returns; at the end of the run (``after_run``, when the
        Agent has set ``exit_reason``) every write of the run is waited for, and a result whose write failed is put
        back into the conversation.

        :param state: The Agent's live `State`; offloaded results are replaced in ``messages``.
        :raises ValueError: If neither the run's ``hook_context`` nor the hook has a store.
        """
        # The Agent sets `exit_reason` only once the run is ending, so it tells `after_run` from `after_tool`. Taking
        # an `after_tool` for the end (after an `on_exit` hook revived the run) only makes that step write through.
        ending = state.data.get("exit_reason") is not None
        planned = self._plan(state)
        if planned is not None:
            store, plans = planned
            behind = state if self.write_behind and not ending else None
            pointers = await offload_async(store, [offload_plan for _, offload_plan in plans], behind=behind)
            self._apply(state, plans, pointers)
        await settle_run(state, wait=ending)

    def _plan(self, state: State) -> tuple[ToolResultStore, list[tuple[int, OffloadPlan]]] | None:
        # The policy, in one place: which of this step's results go (what of each goes is `plan`'s to say). A result
        # its policy keeps counts as ``under_threshold`` here; those that go count in `writes` once written or not.
        messages: list[ChatMessage] = state.data.get("messages") or []
        start = _fresh_results_start(messages)
        if start == len(messages):
            return None
        store = run_store(state, self.store, hook_name=type(self).__name__)
        step = state.data.get("step_count", 0)
        # At the end of a run (`after_run`) the last step's results come round again; they counted at `after_tool`.
        count_kept = state.data.get("exit_reason") is None
        plans: list[tuple[int, OffloadPlan]] = []
        for position, message in enumerate(messages[start:]):
            result = message.tool_call_result
            if result is None:
                continue
            policy = policy_for(self.offload_strategies, result.origin.tool_name)
            if policy is None:
                continue
            offload_plan = plan(
                message,
                store=store,
                # Step, tool and call id keep a run's keys apart; an id-less call falls back to its place in the step.
                key_prefix=f"{step}_{result.origin.tool_name}_{result.origin.id or f'call{position}'}",
                preview_chars=self.preview_chars,
            )
            if offload_plan is None:
                continue
            if policy.should_offload(tool_name=offload_plan.tool_name, result=offload_plan.payload, state=state):
                plans.append((start + position, offload_plan))
            elif count_kept:
                result_offloaded("under_threshold", offload_plan.size, tenant=store_tenant(store))
        return (store, plans) if plans else None

    @staticmethod
    def _apply(state: State, plans: list[tuple[int, OffloadPlan]], pointers: list[ChatMessage | None]) -> None:
        messages: list[ChatMessage] = list(state.data.get("messages") or [])
        changed = False
        for (index, _), pointer in zip(plans, pointers, strict=True):
            if pointer is not None:  # None: the write failed and the result stays
                messages[index] = pointer
                changed = True
        if changed:
            state.set("messages", messages, handler_override=replace_values)

    # Lifecycle

    def warm_up(self) -> None:
        """Open the constructor store's client, if it has one to open (per-run stores share their root's client)."""
        warm_up = getattr(self.store, "warm_up", None)
        if callable(warm_up):
            warm_up()

    async def warm_up_async(self) -> None:
        """Async `warm_up`: awaits the store's ``warm_up_async`` when it has one."""
        warm_up_async = getattr(self.store, "warm_up_async", None)
        if warm_up_async is not None and inspect.iscoroutinefunction(warm_up_async):
            await warm_up_async()
        elif self.store is not None:
            await asyncio.to_thread(self.warm_up)

    # Serialization

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the hook, its strategies (in Haystack's format) and its constructor store, if any.

        :returns: A dictionary representation.
        :raises SerializationError: If the constructor store cannot be serialized (for example, credentials in clear).
        """
        return default_to_dict(
            self,
            offload_strategies=serialize_strategies(self.offload_strategies),
            store=component_to_dict(obj=self.store, name="store") if self.store is not None else None,
            preview_chars=self.preview_chars,
            write_behind=self.write_behind,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OffloadHook":
        """
        Deserialize a hook produced by `to_dict`. Policies and the store go through Haystack's import allowlist.

        :param data: The dictionary representation.
        :returns: The hook.
        """
        init_parameters = data.get("init_parameters", {})
        if init_parameters.get("store") is not None:
            deserialize_component_inplace(init_parameters, key="store")
        if init_parameters.get("offload_strategies") is not None:
            init_parameters["offload_strategies"] = deserialize_strategies(init_parameters["offload_strategies"])
        return default_from_dict(cls, data)

    def __repr__(self) -> str:
        keys = ", ".join(repr(key) for key in self.offload_strategies)
        behind = ", write_behind=True" if self.write_behind else ""
        return f"{type(self).__name__}(keys=[{keys}], preview_chars={self.preview_chars}{behind})"


def _store_and_strategies(
    args: tuple[Any, ...],
    store: ToolResultStore | None,
    offload_strategies: Mapping[str | tuple[str, ...], OffloadPolicy] | None,
) -> tuple[ToolResultStore | None, Any]:
    """Sort the arguments: ``(strategies)`` is our order, ``(store, strategies)`` and ``(store)`` are Haystack's."""
    if len(args) > 2:
        raise TypeError(
            f"OffloadHook takes at most 2 positional arguments (store, offload_strategies), got {len(args)}."
        )
    stores: list[Any]
    strategies: list[Any]
    if len(args) == 2:
        if isinstance(args[0], Mapping):
            raise TypeError(
                "With two positional arguments OffloadHook takes Haystack's order, (store, offload_strategies); "
                "pass OffloadHook(offload_strategies, store=store) or OffloadHook(store, offload_strategies)."
            )
        stores, strategies = [args[0]], [args[1]]
    elif args and not isinstance(args[0], Mapping) and callable(getattr(args[0], "write", None)):
        stores, strategies = [args[0]], []
    else:
        # Anything that is not a store is taken for strategies, so their validation says what is wrong with it.
        stores, strategies = [], list(args)
    if store is not None:
        stores.append(store)
    if offload_strategies is not None:
        strategies.append(offload_strategies)
    if len(stores) > 1:
        raise TypeError("OffloadHook got two stores: one positional and one as store=.")
    if len(strategies) > 1:
        raise TypeError("OffloadHook got offload_strategies twice: positional and as a keyword.")
    if not strategies:
        raise TypeError("OffloadHook needs offload_strategies: a dict of tool name (or '*') to OffloadPolicy.")
    return (stores[0] if stores else None), strategies[0]


def _fresh_results_start(messages: list[ChatMessage]) -> int:
    # The Agent appends this step's results last: the trailing run of tool results is this step's batch, and anything
    # before it is history this hook leaves alone.
    index = len(messages)
    while index > 0 and messages[index - 1].tool_call_result is not None:
        index -= 1
    return index
