"""
Where `ApprovalHook` lived before it moved next to the rest of approvals (`haystack_integrations.offload.approvals`).

Kept so that Agents serialized with the old type path (``haystack_integrations.offload.hooks.approval.ApprovalHook``)
still load.
"""

from haystack_integrations.offload.approvals.hook import ApprovalHook

__all__ = ["ApprovalHook"]
