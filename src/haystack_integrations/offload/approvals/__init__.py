"""
Tool-call approvals for multi-user servers: per-run channels, durable pending approvals, exactly-once resume.

An `ApprovalHook` holds the calls its rules ask about; the run's channel asks a person. A server lists and decides
with `pending_approvals_async` and `decide_async`, continues with `resume_async` and reads `read_audit_async`, from
any worker: everything lives under the session's scope in the store.
"""

from haystack_integrations.offload.approvals.approval_records import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_INVALID,
    ApprovalDecision,
    ApprovalRequest,
    AuditEvent,
    CallOutcome,
    Decision,
)
from haystack_integrations.offload.approvals.audit import read_audit, read_audit_async
from haystack_integrations.offload.approvals.audit_repair import repair_audit, repair_audit_async
from haystack_integrations.offload.approvals.channels import (
    APPROVAL_REQUIRED,
    ApprovalCallback,
    CallbackApprovals,
    DurableApprovals,
)
from haystack_integrations.offload.approvals.decisions import (
    decide,
    decide_async,
    pending_approvals,
    pending_approvals_async,
)
from haystack_integrations.offload.approvals.errors import (
    ApprovalAlreadyDecidedError,
    ApprovalClaimedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    ApprovalRecordError,
    InvalidApprovalEditError,
    ResumeConversationError,
    ResumeInterruptedError,
)
from haystack_integrations.offload.approvals.outcomes import APPROVAL_REQUIRED_META_KEY, META_KEY
from haystack_integrations.offload.approvals.resume import DEFAULT_RESUME_LEASE, resume, resume_async
from haystack_integrations.offload.approvals.rules import AskOncePerSession, AskWhen
from haystack_integrations.offload.context import APPROVAL_CHANNEL_KEY

__all__ = [
    "APPROVAL_CHANNEL_KEY",
    "APPROVAL_DENIED",
    "APPROVAL_EXPIRED",
    "APPROVAL_INVALID",
    "APPROVAL_REQUIRED",
    "APPROVAL_REQUIRED_META_KEY",
    "DEFAULT_RESUME_LEASE",
    "META_KEY",
    "ApprovalAlreadyDecidedError",
    "ApprovalCallback",
    "ApprovalClaimedError",
    "ApprovalDecision",
    "ApprovalExpiredError",
    "ApprovalNotFoundError",
    "ApprovalPendingError",
    "ApprovalRecordError",
    "ApprovalRequest",
    "AskOncePerSession",
    "AskWhen",
    "AuditEvent",
    "CallOutcome",
    "CallbackApprovals",
    "Decision",
    "DurableApprovals",
    "InvalidApprovalEditError",
    "ResumeConversationError",
    "ResumeInterruptedError",
    "decide",
    "decide_async",
    "pending_approvals",
    "pending_approvals_async",
    "read_audit",
    "read_audit_async",
    "repair_audit",
    "repair_audit_async",
    "resume",
    "resume_async",
]
