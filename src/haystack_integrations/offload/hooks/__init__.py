"""When things happen: the offload and compaction hooks, both writing into the store each run brings."""

from haystack_integrations.offload.hooks.approval import ApprovalHook
from haystack_integrations.offload.hooks.compaction import OffloadCompactionHook
from haystack_integrations.offload.hooks.offload import OffloadHook

__all__ = ["ApprovalHook", "OffloadCompactionHook", "OffloadHook"]
