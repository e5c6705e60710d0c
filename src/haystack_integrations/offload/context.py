"""
What a run's `hook_context` holds, and the one place hooks, tools and approvals read it from.

`offload_context` builds it for a run and `resume_context` for a resumed one; hooks read it with `hook_context_of`
and `run_store`, the read-back tools with `tool_store`.
"""

import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

from haystack.components.agents.state.state import State
from haystack.hooks.tool_result_offloading import RESULT_STORE_CONTEXT_KEY
from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.types import SessionDocumentSource

__all__ = [
    "APPROVAL_CHANNEL_KEY",
    "RESULT_STORE_CONTEXT_KEY",
    "RESUMING_KEY",
    "context_store",
    "hook_context_of",
    "offload_context",
    "resume_context",
    "run_store",
    "tool_store",
]

logger = logging.getLogger(__name__)

APPROVAL_CHANNEL_KEY = "approval_channel"
"""The `hook_context` key of the run's approval channel: ``offload_context(store, approval_channel=...)``."""

RESUMING_KEY = "offload.resuming"
"""The `hook_context` key under which `resume` puts the `Rulings` of the step it resumes."""


# Building a run's context


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


def resume_context(
    store: SessionDocumentSource, hook_context: dict[str, Any] | None, *, default_channel: Callable[[], object]
) -> dict[str, Any]:
    """
    Build the `hook_context` a resumed run goes on with: the caller's, bound to the store being resumed.

    :param store: The session's store, whose held step is being resumed.
    :param hook_context: The caller's context, or None for the store and a fresh `default_channel()`.
    :param default_channel: Makes the approval channel when the caller brings no context (`DurableApprovals`).
    :returns: A new dictionary; the caller's is not modified.
    :raises TypeError: If `hook_context` is not a dictionary.
    :raises ValueError: If `hook_context` carries a store of another scope than `store`.
    """
    if hook_context is None:
        return {RESULT_STORE_CONTEXT_KEY: store, APPROVAL_CHANNEL_KEY: default_channel()}
    if not isinstance(hook_context, dict):
        raise TypeError(f"hook_context must be a dictionary, got {type(hook_context).__name__}.")
    context = dict(hook_context)
    given = context.setdefault(RESULT_STORE_CONTEXT_KEY, store)
    # A store without a tenant and session (a plain Haystack one) is of another scope too: its writes would leave it.
    if not isinstance(given, SessionDocumentSource) or (given.tenant, given.session) != (store.tenant, store.session):
        raise ValueError("hook_context carries the store of another scope than the one being resumed.")
    return context


# Reading a run's context


def hook_context_of(state: State) -> dict[str, Any]:
    """
    Return the run's `hook_context`, checked: hooks fail loudly on a malformed one.

    :param state: The Agent's live `State`.
    :returns: The run's dictionary itself (not a copy), or a new empty one if the run brought none.
    :raises TypeError: If the run's `hook_context` is not a dictionary.
    """
    hook_context: Any = state.data.get("hook_context") or {}
    if not isinstance(hook_context, dict):
        raise TypeError(f"hook_context must be a dictionary, got {type(hook_context).__name__}.")
    return hook_context


def context_store(state: State | None) -> object | None:
    """
    Return whatever the run brought under `RESULT_STORE_CONTEXT_KEY`, leniently, unchecked.

    :param state: The Agent's live `State`, or None outside an Agent.
    :returns: The value, or None if there is no state, no `hook_context`, or one that is not a mapping.
    """
    hook_context = state.data.get("hook_context") if state is not None else None
    return hook_context.get(RESULT_STORE_CONTEXT_KEY) if isinstance(hook_context, Mapping) else None


def run_store(state: State, fallback: ToolResultStore | None, *, hook_name: str) -> ToolResultStore:
    """
    Return the store a hook writes this run's results to: the run's own, else the hook's constructor store.

    :param state: The Agent's live `State`.
    :param fallback: The store the hook was built with, or `None`.
    :param hook_name: The hook's class name, for error messages.
    :returns: The store to write to.
    :raises ValueError: If the run brought no store and the hook has none.
    :raises TypeError: If `hook_context` is not a dictionary, or holds something that is not a store.
    """
    store = hook_context_of(state).get(RESULT_STORE_CONTEXT_KEY, fallback)
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


def tool_store(
    state: State | None, fallback: ToolResultStore | None, *, tool_name: str, error: Callable[[str], Exception]
) -> ToolResultStore:
    """
    Return the store a read-back tool reads through: the run's own, else the tool's constructor store.

    Lenient where `run_store` is strict: a tool called outside an Agent, or with a malformed `hook_context`, falls
    back to its own store, and a missing or unreadable store is an `error` whose message the model can read.

    :param state: The Agent's live `State`, or None when the tool is called outside an Agent.
    :param fallback: The store given when the tool was constructed, if any.
    :param tool_name: The calling tool's name, for the log.
    :param error: Makes the exception to raise from a message safe to show to the model (`ReadBackToolError`).
    :returns: The store to read through.
    :raises Exception: `error(...)`, if the run carries no store and the tool has none, or the store cannot read.
    """
    store = context_store(state)
    if store is None:
        store = fallback
    if store is None:
        logger.warning(
            "%s was called in a run without a result store: pass hook_context=offload_context(store) to Agent.run "
            "(or construct the tool with store=...).",
            tool_name,
        )
        raise error("No result store is available in this run, so offloaded tool results cannot be read back here.")
    if not callable(getattr(store, "read", None)):
        logger.warning(
            "%s: the run's %s under %r has no read method.", tool_name, type(store).__name__, RESULT_STORE_CONTEXT_KEY
        )
        raise error("This run's result store cannot be read from.")
    return cast(ToolResultStore, store)
