"""
The JSON the HTTP API answers with: plain dictionaries built from the service's records, one function per shape.

Nothing here names the bucket, the store's root, or another tenant: references are relative to the caller's session.
"""

from typing import Any

from haystack.dataclasses import ChatMessage, ChatRole

from haystack_integrations.offload.approvals import ApprovalDecision, ApprovalRequest, AuditEvent, CallOutcome
from haystack_integrations.offload.hooks.pointers import OFFLOADED_META_KEY
from haystack_integrations.offload.server.service import DecisionOutcome, Transcript, TurnOutcome, media_type_of
from haystack_integrations.offload.stores import StoredResult

MAX_TOOL_TEXT_CHARS = 4000


def approval_view(request: ApprovalRequest) -> dict[str, Any]:
    """One pending approval, with what a person needs to decide (and to edit the arguments)."""
    return {
        "request_id": request.request_id,
        "tool_name": request.tool_name,
        "tool_description": request.tool_description,
        "arguments": request.arguments,
        "parameters": request.parameters,
        "rule": request.rule,
        "requested_by": request.requested_by,
        "created": request.created.isoformat(),
        "expires": request.expires.isoformat(),
    }


def decision_view(decision: ApprovalDecision) -> dict[str, Any]:
    """A recorded decision."""
    return {
        "request_id": decision.request_id,
        "tool_name": decision.tool_name,
        "approved": decision.approved,
        "edited": decision.edited,
        "arguments": decision.arguments,
        "reason": decision.reason,
        "decided_by": decision.decided_by,
        "decided_at": decision.decided_at.isoformat(),
    }


def outcome_view(outcome: CallOutcome) -> dict[str, Any]:
    """What happened to one call of a resumed step."""
    return {
        "tool_call_id": outcome.tool_call_id,
        "tool_name": outcome.tool_name,
        "outcome": outcome.outcome,
        "reason": outcome.reason,
    }


def turn_view(session: str, outcome: TurnOutcome) -> dict[str, Any]:
    """A turn's outcome: the reply, or the approvals it waits for."""
    return {
        "session": session,
        "turn": outcome.turn,
        "status": outcome.status,
        "reply": outcome.reply,
        "pending": [approval_view(request) for request in outcome.pending],
        "new_results": outcome.new_references,
        "approval_outcomes": [outcome_view(item) for item in outcome.approval_outcomes],
    }


def decision_outcome_view(session: str, outcome: DecisionOutcome) -> dict[str, Any]:
    """A decision and what it led to."""
    return {
        "session": session,
        "decision": decision_view(outcome.decision),
        "pending": [approval_view(request) for request in outcome.pending],
        "resumed": turn_view(session, outcome.resumed) if outcome.resumed is not None else None,
        "resumed_elsewhere": outcome.resumed_elsewhere,
    }


def message_view(message: ChatMessage) -> dict[str, Any] | None:
    """One message of a transcript; system messages are left out."""
    if message.is_from(ChatRole.SYSTEM):
        return None
    view: dict[str, Any] = {"role": message.role.value, "text": message.text}
    if message.tool_calls:
        view["tool_calls"] = [
            {"id": call.id, "tool_name": call.tool_name, "arguments": call.arguments} for call in message.tool_calls
        ]
    result = message.tool_call_result
    if result is not None:
        if isinstance(result.result, str):
            text = result.result
            shown = text if len(text) <= MAX_TOOL_TEXT_CHARS else text[:MAX_TOOL_TEXT_CHARS] + "..."
        else:
            shown = f"({len(result.result)} content blocks: text and images)"
        view["tool_result"] = {
            "tool_name": result.origin.tool_name,
            "tool_call_id": result.origin.id,
            "text": shown,
            "error": result.error,
            "offloaded": list(message.meta.get(OFFLOADED_META_KEY) or []),
        }
    return view


def transcript_view(session: str, transcript: Transcript) -> dict[str, Any]:
    """A session's conversation and the state of its newest turn."""
    messages = [view for view in (message_view(message) for message in transcript.messages) if view is not None]
    return {
        "session": session,
        "turns": transcript.turns,
        "busy": transcript.busy,
        "status": transcript.status,
        "error": transcript.error,
        "messages": messages,
    }


def result_view(record: StoredResult) -> dict[str, Any]:
    """One stored result, as listed."""
    return {
        "reference": record.reference,
        "kind": record.kind,
        "size": record.size,
        "created": record.created.isoformat(),
        "tool_name": record.tool_name,
        "media_type": media_type_of(record),
    }


def audit_view(event: AuditEvent) -> dict[str, Any]:
    """One audit event."""
    return event.model_dump(mode="json", exclude={"tenant", "session"})
