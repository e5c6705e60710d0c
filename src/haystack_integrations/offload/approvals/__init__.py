"""
Tool-call approvals for multi-user servers: per-run channels, durable pending approvals, exactly-once resume.

The flow a server implements (see `ApprovalHook` for the Agent side)::

    send message   reply = await agent.run_async(messages, hook_context=offload_context(store,
                                                 approval_channel=DurableApprovals(actor=user.id)))
                   reply["exit_reason"] == "approval_required"  ->  await pending_approvals_async(store)
    decide         await decide_async(store, request_id, Decision.approve(by=user.id))      (any worker)
    resume         reply = await resume_async(agent, reply["messages"], store)              (any worker, once)
    audit          await read_audit_async(store)

Everything lives under the session's scope in the store (``.approvals/`` and ``.audit/``), so workers hold no state
and the store's conditional create is the only coordination between them. One concern per module: `hook` (the
`ApprovalHook`), `records` (what is stored), `rules` (whether to ask), `learning` (policies that learn, per session),
`channels` (how to ask), `validation` and `binding` (whether a decision is acceptable, and for which call), `ledger`
(where records live), `decisions` (pending and decide), `resume`, `resuming` and `execution` (running decided calls
once, through the Agent's hook chain), `outcomes` (what the model sees), `audit` (who did what, when).
"""

from haystack_integrations.offload.approvals.audit import read_audit, read_audit_async
from haystack_integrations.offload.approvals.binding import arguments_digest
from haystack_integrations.offload.approvals.channels import (
    APPROVAL_REQUIRED,
    ApprovalCallback,
    CallbackApprovals,
    DurableApprovals,
)
from haystack_integrations.offload.approvals.decisions import (
    DEFAULT_DECISION_TTL,
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
from haystack_integrations.offload.approvals.outcomes import META_KEY
from haystack_integrations.offload.approvals.records import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_INVALID,
    ApprovalDecision,
    ApprovalRequest,
    AuditEvent,
    CallOutcome,
    Decision,
    ErrorKind,
    HeldStep,
)
from haystack_integrations.offload.approvals.resume import OUTCOMES_KEY, resume, resume_async
from haystack_integrations.offload.approvals.rules import AskOncePerSession, AskWhen
from haystack_integrations.offload.context import APPROVAL_CHANNEL_KEY

__all__ = [
    "APPROVAL_CHANNEL_KEY",
    "APPROVAL_DENIED",
    "APPROVAL_EXPIRED",
    "APPROVAL_INVALID",
    "APPROVAL_REQUIRED",
    "DEFAULT_DECISION_TTL",
    "META_KEY",
    "OUTCOMES_KEY",
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
    "ErrorKind",
    "HeldStep",
    "InvalidApprovalEditError",
    "ResumeConversationError",
    "ResumeInterruptedError",
    "arguments_digest",
    "decide",
    "decide_async",
    "pending_approvals",
    "pending_approvals_async",
    "read_audit",
    "read_audit_async",
    "resume",
    "resume_async",
]
