"""Which store a run writes to: the one in the run's `hook_context`, else the hook's own."""

from typing import Any, cast

from haystack.components.agents.state.state import State
from haystack.hooks.tool_result_offloading import RESULT_STORE_CONTEXT_KEY
from haystack.hooks.tool_result_offloading.types import ToolResultStore


def run_store(state: State, fallback: ToolResultStore | None, *, hook_name: str) -> ToolResultStore:
    """
    Return the store this run writes to.

    Hooks are shared by every run of an Agent, so the run's own store comes from `hook_context` under Haystack's
    `RESULT_STORE_CONTEXT_KEY` (put there by `offload_context`); the hook's constructor store serves runs that bring
    none. `state.data` is read directly: `state.get` would deep-copy the store, and its client, on every call.

    :param state: The Agent's live `State`.
    :param fallback: The store the hook was built with, or `None`.
    :param hook_name: The hook's class name, for error messages.
    :returns: The store to write to.
    :raises ValueError: If the run brought no store and the hook has none.
    :raises TypeError: If `hook_context` is not a dictionary, or holds something that is not a store.
    """
    hook_context: Any = state.data.get("hook_context") or {}
    if not isinstance(hook_context, dict):
        raise TypeError(f"hook_context must be a dictionary, got {type(hook_context).__name__}.")
    store = hook_context.get(RESULT_STORE_CONTEXT_KEY, fallback)
    if store is None:
        raise ValueError(
            f"{hook_name} has no store for this run: pass hook_context=offload_context(store) to Agent.run / "
            f"run_async (one store per tenant and session), or give the hook a store= for single-user use."
        )
    if not callable(getattr(store, "write", None)):
        raise TypeError(
            f"hook_context[{RESULT_STORE_CONTEXT_KEY!r}] must be a ToolResultStore (with write), "
            f"got {type(store).__name__}."
        )
    return cast(ToolResultStore, store)
