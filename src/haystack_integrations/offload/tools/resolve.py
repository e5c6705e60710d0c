"""
Which store a read-back tool reads through: the current run's, never a process-wide one.

The Agent hands a tool its live `State` through a `State`-typed parameter. The run's store is the one the application
put in `hook_context` (`Agent.run(..., hook_context=offload_context(store))`), under Haystack's
`RESULT_STORE_CONTEXT_KEY`, where Haystack's `ToolResultOffloadHook` looks too. `state.data` is read directly:
`state.get` deep-copies, which would copy the store (and its client) on every call.
"""

import logging
from collections.abc import Mapping

from haystack.components.agents.state.state import State
from haystack.hooks.tool_result_offloading import RESULT_STORE_CONTEXT_KEY
from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.tools.errors import ReadBackToolError

logger = logging.getLogger(__name__)


def resolve_store(state: State | None, fallback: ToolResultStore | None, *, tool_name: str) -> ToolResultStore:
    """
    Return the store this call reads through: the run's own, else the tool's fallback.

    :param state: The Agent's live `State`, or None when the tool is called outside an Agent.
    :param fallback: The store given when the tool was constructed, if any.
    :param tool_name: The calling tool's name, for messages.
    :returns: The store to read through.
    :raises ReadBackToolError: If the run carries no store and the tool has no fallback, or the store cannot read.
    """
    hook_context = state.data.get("hook_context") if state is not None else None
    store = hook_context.get(RESULT_STORE_CONTEXT_KEY) if isinstance(hook_context, Mapping) else None
    if store is None:
        store = fallback
    if store is None:
        logger.warning(
            "%s was called in a run without a result store: pass hook_context=offload_context(store) to Agent.run "
            "(or construct the tool with store=...).",
            tool_name,
        )
        raise ReadBackToolError(
            "No result store is available in this run, so offloaded tool results cannot be read back here."
        )
    if not callable(getattr(store, "read", None)):
        logger.warning(
            "%s: the run's %s under %r has no read method.", tool_name, type(store).__name__, RESULT_STORE_CONTEXT_KEY
        )
        raise ReadBackToolError("This run's result store cannot be read from.")
    return store
