"""
The read-back tools: the model reads offloaded results through the current run's store.

- `read_tool_result` pages through a result by characters (one ranged read per page), searches it, and returns images
  as image content;
- `list_tool_results` lists the conversation's stored results, newest first.

Both are Haystack `Tool`s that find the run's store in `hook_context` (see `resolve`), so one Agent serves every user.
"""

from haystack_integrations.offload.tools.base import ReadBackTool
from haystack_integrations.offload.tools.errors import ReadBackToolError
from haystack_integrations.offload.tools.list_tool_results import ListToolResults, list_tool_results
from haystack_integrations.offload.tools.read_tool_result import ReadToolResult, read_tool_result

__all__ = [
    "ListToolResults",
    "ReadBackTool",
    "ReadBackToolError",
    "ReadToolResult",
    "list_tool_results",
    "read_tool_result",
]
