"""
Which store a read-back tool reads through: the current run's, never a process-wide one.

The Agent hands a tool its live `State` through a `State`-typed parameter; the run's store is the one the application
put in its `hook_context` (`offload_context(store)`). How that is read lives with the rest of what a run's context
holds, in `haystack_integrations.offload.context`; here it is bound to the tools' error, whose message the model reads.
"""

from haystack.components.agents.state.state import State
from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.context import tool_store
from haystack_integrations.offload.tools.errors import ReadBackToolError


def resolve_store(state: State | None, fallback: ToolResultStore | None, *, tool_name: str) -> ToolResultStore:
    """
    Return the store this call reads through: the run's own, else the tool's fallback.

    :param state: The Agent's live `State`, or None when the tool is called outside an Agent.
    :param fallback: The store given when the tool was constructed, if any.
    :param tool_name: The calling tool's name, for messages.
    :returns: The store to read through.
    :raises ReadBackToolError: If the run carries no store and the tool has no fallback, or the store cannot read.
    """
    return tool_store(state, fallback, tool_name=tool_name, error=ReadBackToolError)
