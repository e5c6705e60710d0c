"""
Every private Haystack name this library uses, in one place, each pinned by a test (``tests/test_compat.py``).
"""

from pathlib import Path

from haystack.components.agents.tool_calling import _run_tool_async as run_tool_async
from haystack.hooks.compaction.hooks import _estimated_context_tokens as estimated_context_tokens
from haystack.hooks.compaction.utils import _COMPACTION_META_KEY as COMPACTION_META_KEY
from haystack.hooks.compaction.utils import _agent_step_spans as agent_step_spans
from haystack.hooks.compaction.utils import _last_assistant_index as last_assistant_index
from haystack.hooks.invocation import _run_hooks_async as run_hooks_async
from haystack.hooks.tool_result_offloading.stores import FileSystemToolResultStore
from haystack.hooks.tool_result_offloading.utils import _FALLBACK_EXTENSION as FALLBACK_EXTENSION
from haystack.hooks.tool_result_offloading.utils import _OFFLOADED_META_KEY as OFFLOADED_META_KEY
from haystack.hooks.tool_result_offloading.utils import _content_block_payload as content_block_payload
from haystack.hooks.tool_result_offloading.utils import _offloadable_content_blocks as offloadable_content_blocks


def resolve_in_root(store: FileSystemToolResultStore, reference: str) -> Path:
    """
    The file a `FileSystemToolResultStore` reference names, through the store's own containment check.

    :param store: Haystack's local-disk store.
    :param reference: The reference (a model's input: the check refuses anything outside the store's root).
    :returns: The resolved path.
    :raises ValueError: If the reference resolves outside the store's root.
    """
    resolved: Path = store._resolve_in_root(reference, subject="Result reference")
    return resolved


__all__ = [
    "COMPACTION_META_KEY",
    "FALLBACK_EXTENSION",
    "OFFLOADED_META_KEY",
    "agent_step_spans",
    "content_block_payload",
    "estimated_context_tokens",
    "last_assistant_index",
    "offloadable_content_blocks",
    "resolve_in_root",
    "run_hooks_async",
    "run_tool_async",
]
