"""
What ties a decision to exactly one call: the arguments digest and the binding checks made before a call runs.

A decision is only honoured for the request it was made for: the same tenant and session (the store's scope), the same
request, tool call id, tool name and arguments digest, and only until it expires. Anything else is refused, whatever
the document says, so a decision copied from another session, a replayed one or one naming another tool never runs a
call.
"""

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from haystack_integrations.offload.approvals.approval_records import (
    APPROVAL_EXPIRED,
    APPROVAL_INVALID,
    ApprovalDecision,
    ApprovalRequest,
    Denial,
)


def arguments_digest(arguments: Mapping[str, Any]) -> str:
    """
    Return ``sha256:<hex>`` of the canonical JSON of `arguments` (sorted keys, no spaces, UTF-8).

    :param arguments: Tool-call arguments, as the model sent them (JSON values).
    :returns: The digest.
    :raises TypeError: If the arguments are not JSON values.
    """
    canonical = json.dumps(dict(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def binding_problem(
    decision: ApprovalDecision, request: ApprovalRequest, *, tenant: str, session: str, now: datetime
) -> Denial | None:
    """
    Check that `decision` may let `request`'s call run in the session `tenant`/`session` at `now`.

    :param decision: The stored decision.
    :param request: The request it claims to answer, from the held step.
    :param tenant: The tenant of the store resuming the step.
    :param session: The session of the store resuming the step.
    :param now: The current time.
    :returns: None if the decision binds; otherwise the denial the model gets instead of a result.
    """
    if (decision.tenant, decision.session) != (tenant, session) or (request.tenant, request.session) != (
        tenant,
        session,
    ):
        return Denial(kind=APPROVAL_INVALID, reason="The decision was made for another tenant or session.")
    expected = (request.request_id, request.step_id, request.tool_call_id, request.arguments_digest)
    if (decision.request_id, decision.step_id, decision.tool_call_id, decision.arguments_digest) != expected:
        return Denial(kind=APPROVAL_INVALID, reason="The decision does not match this tool call or its arguments.")
    if decision.tool_name != request.tool_name:
        return Denial(kind=APPROVAL_INVALID, reason="The decision names another tool; a tool name never changes.")
    if decision.approved and (
        decision.arguments is None or decision.final_arguments_digest != arguments_digest(decision.arguments)
    ):
        return Denial(kind=APPROVAL_INVALID, reason="The approved arguments do not match their digest.")
    if decision.expired(now):
        return Denial(kind=APPROVAL_EXPIRED, reason="The approval expired before the call was resumed.")
    return None
