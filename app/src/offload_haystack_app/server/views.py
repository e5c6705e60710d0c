"""
The JSON the HTTP API answers with: plain dictionaries built from the service's records, one function per shape.

Nothing here names the bucket, the store's root, or another tenant: references are relative to the caller's session.
"""

import json
from typing import Any

from haystack.dataclasses import ChatMessage, ChatRole
from haystack.hooks.human_in_the_loop.strategies import (
    MODIFICATION_FEEDBACK_TEMPLATE,
    REJECTION_FEEDBACK_TEMPLATE,
    USER_FEEDBACK_TEMPLATE,
)

from haystack_integrations.offload.approvals import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_REQUIRED_META_KEY,
    META_KEY,
    ApprovalDecision,
    ApprovalRequest,
    AuditEvent,
    CallOutcome,
)
from haystack_integrations.offload.hooks import OFFLOADED_META_KEY
from haystack_integrations.offload.sessions import (
    DecisionOutcome,
    SessionSummary,
    Transcript,
    TurnOutcome,
    media_type_of,
    record_named,
)
from haystack_integrations.offload.stores import StoredResult

MAX_TOOL_TEXT_CHARS = 4000
# How a person's denial reads in the structured result format (`approvals.outcomes.denied_by_person`).
_DENIED_BY_PERSON = "The user denied this tool call."
_DENIAL_KINDS: dict[str, str] = {APPROVAL_DENIED: "denied", APPROVAL_EXPIRED: "expired"}


def approval_view(request: ApprovalRequest) -> dict[str, Any]:
    """One pending approval, with what a person needs to decide (and to edit the arguments)."""
    return _fields(
        request,
        ("request_id", "tool_name", "tool_description", "arguments", "parameters", "rule", "requested_by"),
        ("created", "expires"),
    )


def decision_view(decision: ApprovalDecision) -> dict[str, Any]:
    """A recorded decision."""
    return _fields(
        decision,
        ("request_id", "tool_name", "approved", "edited", "arguments", "reason", "decided_by"),
        ("decided_at",),
    )


def outcome_view(outcome: CallOutcome) -> dict[str, Any]:
    """What happened to one call of a resumed step."""
    return _fields(outcome, ("tool_call_id", "tool_name", "outcome", "reason"))


def turn_view(session: str, outcome: TurnOutcome) -> dict[str, Any]:
    """A turn's outcome: the reply, or the approvals it waits for."""
    return {
        "session": session,
        **_fields(outcome, ("turn", "status", "reply")),
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
        offloaded = [str(reference) for reference in message.meta.get(OFFLOADED_META_KEY) or []]
        view["tool_result"] = {
            "tool_name": result.origin.tool_name,
            "tool_call_id": result.origin.id,
            "text": shown,
            "error": result.error,
            "offloaded": offloaded,
            "offloaded_results": [_offloaded_view(reference) for reference in offloaded],
        }
    return view


def _offloaded_view(reference: str) -> dict[str, Any]:
    # From the name alone (no request): what the page needs to show an image inline and a text in the viewer.
    record = record_named(reference)
    if record is None:
        return {"reference": reference, "kind": None, "media_type": None}
    return {"reference": reference, "kind": record.kind, "media_type": media_type_of(record)}


def approval_event(messages: list[ChatMessage], index: int) -> dict[str, Any] | None:
    """
    What a message of a conversation says about approvals, for a chat page to show as an event rather than a bubble.

    - ``approval_required``: the notice a durable stop leaves as the run's last message (``request_ids``);
    - ``approved`` with ``edited: true``: the note Haystack adds as a *user* message when a person edited a call's
      arguments (recognised by its exact wording for a call of the next assistant message; ``arguments`` are that
      call's, as it ran);
    - ``denied``, ``expired`` or ``not_run``: the error result of a call that did not run, with the person's
      ``reason`` when there was one.

    An approval without edits leaves no trace in the conversation (the call ran as the model asked it); the audit
    record has it.

    :param messages: The conversation.
    :param index: The message to describe.
    :returns: The event, or None for an ordinary message.
    """
    message = messages[index]
    if message.is_from(ChatRole.ASSISTANT) and APPROVAL_REQUIRED_META_KEY in message.meta:
        ids = message.meta.get(APPROVAL_REQUIRED_META_KEY)
        return {"kind": "approval_required", "request_ids": [str(item) for item in ids or []]}
    result = message.tool_call_result
    marker = message.meta.get(META_KEY)
    if result is not None and isinstance(marker, dict):
        kind = str(marker.get("kind"))
        text = result.result if isinstance(result.result, str) else ""
        return {
            "kind": _DENIAL_KINDS.get(kind, "not_run"),
            "tool_name": result.origin.tool_name,
            "tool_call_id": result.origin.id,
            "request_id": marker.get("request_id"),
            "reason": _denial_reason(result.origin.tool_name, kind, text),
        }
    if message.is_from(ChatRole.USER) and message.text:
        return _edit_event(messages, index, message.text)
    return None


def _edit_event(messages: list[ChatMessage], index: int, text: str) -> dict[str, Any] | None:
    # The notes of one step sit between the user's message (or the denied calls' results) and the assistant message
    # holding the calls that run; a note matches one of those calls word for word.
    following = index + 1
    while following < len(messages) and messages[following].is_from(ChatRole.USER):
        following += 1
    if following == len(messages) or not messages[following].is_from(ChatRole.ASSISTANT):
        return None
    for call in messages[following].tool_calls:
        if text == MODIFICATION_FEEDBACK_TEMPLATE.format(tool_name=call.tool_name, final_tool_params=call.arguments):
            return {
                "kind": "approved",
                "edited": True,
                "tool_name": call.tool_name,
                "tool_call_id": call.id,
                "arguments": call.arguments,
            }
    return None


def _denial_reason(tool_name: str, kind: str, text: str) -> str | None:
    """The person's reason (or the system's, for other kinds) out of the error result the model was given."""
    rejected = REJECTION_FEEDBACK_TEMPLATE.format(tool_name=tool_name)
    if text.startswith(rejected):  # Haystack's wording of a person's "no", with their feedback after it
        feedback = USER_FEEDBACK_TEMPLATE.split("{feedback}")[0]
        return text[len(rejected) :].strip().removeprefix(feedback).strip() or None
    did_not_happen = f"Tool execution for '{tool_name}' did not happen."
    if text.startswith(did_not_happen):
        return text[len(did_not_happen) :].strip() or None
    try:
        structured = json.loads(text)["error"]["message"]
    except (ValueError, TypeError, KeyError):
        return text or None
    reason = str(structured)
    if kind == APPROVAL_DENIED and reason.startswith(_DENIED_BY_PERSON):
        reason = reason[len(_DENIED_BY_PERSON) :].strip().removeprefix("Reason:").strip()
    return reason or None


def transcript_view(session: str, transcript: Transcript) -> dict[str, Any]:
    """A session's conversation and the state of its newest turn."""
    messages = []
    for index, message in enumerate(transcript.messages):
        view = message_view(message)
        if view is None:
            continue
        event = approval_event(transcript.messages, index)
        if event is not None:
            view["event"] = event
        messages.append(view)
    return {
        "session": session,
        **_fields(transcript, ("turns", "busy", "status", "error", "resumable")),
        "messages": messages,
    }


def result_view(record: StoredResult) -> dict[str, Any]:
    """One stored result, as listed."""
    return {
        **_fields(record, ("reference", "kind", "size"), ("created",)),
        "tool_name": record.tool_name,
        "media_type": media_type_of(record),
    }


def session_view(summary: SessionSummary) -> dict[str, Any]:
    """One of the caller's sessions, as listed."""
    return {
        "session": summary.session,
        "last_activity": summary.last_activity.isoformat() if summary.last_activity is not None else None,
        **_fields(summary, ("turns", "results")),
    }


def audit_view(event: AuditEvent) -> dict[str, Any]:
    """One audit event."""
    return event.model_dump(mode="json", exclude={"tenant", "session"})


def _fields(source: Any, names: tuple[str, ...], times: tuple[str, ...] = ()) -> dict[str, Any]:
    """`source`'s attributes by name, in order, then its `times` in ISO 8601."""
    return {
        **{name: getattr(source, name) for name in names},
        **{name: getattr(source, name).isoformat() for name in times},
    }
