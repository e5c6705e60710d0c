"""Names shared by the hooks and the read-back tools."""

# The read-back tools' own results must never be offloaded again: a model that reads a result page by page would
# otherwise get a pointer to a copy of the page, read that, and loop. Our hooks skip these tools; with Haystack's stock
# ToolResultOffloadHook, map them to NeverOffload() in offload_strategies.
READ_BACK_TOOL_NAMES: frozenset[str] = frozenset({"read_tool_result", "list_tool_results"})
