"""
Every private Haystack name this library uses, in one place, each pinned by a test (``tests/test_compat.py``).

We implement Haystack's public contracts (`ToolResultStore`, hooks, policies) and use its public API wherever one
exists. Where we must run exactly what the Agent runs, or write exactly what Haystack's own hooks write, we import the
function or constant Haystack uses itself, so our behaviour cannot drift from it. Private names may move between
releases (one moved between 3.2 and 3.4), which is why they live here only and why the supported range is declared in
``pyproject.toml`` (``haystack-ai>=3.4,<3.5``): a new minor release is taken on by running the compat tests against it.

==========================  =====================================  ============================================
name here                   Haystack's module                      why
==========================  =====================================  ============================================
run_tool_async              components.agents.tool_calling         resume runs approved calls as the Agent does
run_hooks_async             hooks.invocation                       resume re-enters the before_tool chain
OFFLOADED_META_KEY          hooks.tool_result_offloading.utils     its pruning compactor finds our pointers
FALLBACK_EXTENSION          hooks.tool_result_offloading.utils     the same extension for unknown media
content_block_payload       hooks.tool_result_offloading.utils     the same bytes for a content block
offloadable_content_blocks  hooks.tool_result_offloading.utils     the same blocks chosen for offloading
COMPACTION_META_KEY         hooks.compaction.utils                 compacted messages marked as Haystack does
agent_step_spans            hooks.compaction.utils                 steps counted as CompactionHook counts them
last_assistant_index        hooks.compaction.utils                 the same boundary for the kept tail
estimated_context_tokens    hooks.compaction.hooks                 the same context estimate as CompactionHook
resolve_in_root             FileSystemToolResultStore method       pages of its results checked as its read does
==========================  =====================================  ============================================
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
