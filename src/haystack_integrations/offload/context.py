"""The per-run `hook_context` that carries a run's own store to every hook and tool."""

from typing import Any

from haystack.hooks.tool_result_offloading import RESULT_STORE_CONTEXT_KEY
from haystack.hooks.tool_result_offloading.types import ToolResultStore


def offload_context(store: ToolResultStore, **extra: Any) -> dict[str, Any]:
    """
    Build the `hook_context` for one Agent run, with `store` under Haystack's `RESULT_STORE_CONTEXT_KEY`.

    Haystack's `ToolResultOffloadHook` and this library's hooks and tools all read the run's store from there, so one
    shared Agent serves many users while each run writes to, and reads from, its own scope::

        store = results.for_session(tenant=user.org_id, session=chat_id)
        reply = await agent.run_async(messages, hook_context=offload_context(store))

    :param store: The store for this run, typically `FsspecToolResultStore.for_session(...)`.
    :param extra: Further per-run values for other hooks (for example an approval channel).
    :returns: A new dictionary to pass as `hook_context`.
    :raises TypeError: If `store` does not implement `write` and `read`, or `extra` tries to replace the store.
    """
    if not (callable(getattr(store, "write", None)) and callable(getattr(store, "read", None))):
        raise TypeError(f"offload_context needs a ToolResultStore (with write and read), got {type(store).__name__}.")
    if RESULT_STORE_CONTEXT_KEY in extra:
        raise TypeError(f"Pass the store as the first argument, not as {RESULT_STORE_CONTEXT_KEY}=.")
    return {RESULT_STORE_CONTEXT_KEY: store, **extra}
