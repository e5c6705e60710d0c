"""
When things happen: the offload and compaction hooks, both writing into the store each run brings.

`ApprovalHook` lives with the rest of approvals (`haystack_integrations.offload.approvals.hook`).
"""

from haystack_integrations.offload.hooks.compaction import OffloadCompactionHook
from haystack_integrations.offload.hooks.offload import OffloadHook

__all__ = ["OffloadCompactionHook", "OffloadHook"]
