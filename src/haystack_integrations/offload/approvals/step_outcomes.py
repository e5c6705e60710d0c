"""
What came of each call of a resumed step (`CallOutcome`), read from what the step added to the conversation.

Pure: `resume` reads it as the step finishes, and the audit repair reads it again from the step's done record.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_integrations.offload.approvals.approval_records import CallOutcome, HeldStep, arguments_digest
from haystack_integrations.offload.approvals.outcomes import META_KEY

HELD_AGAIN = "held again"
ANOTHER_HOOK = "another hook kept it from running"

Ran = Mapping[str, tuple[str, str, int]]
"""The calls that ran (or whose recorded result was used), by tool call id: outcome, idempotency key, attempt."""


def step_outcomes(step: HeldStep, added: Sequence[ChatMessage], ran: Ran, held: HeldStep | None) -> list[CallOutcome]:
    """
    One outcome per call of `step`.

    :param step: The resumed step.
    :param added: What the step added to the conversation (its done record's messages).
    :param ran: The calls that ran, or whose recorded result was used.
    :param held: The step held while resuming this one, if any.
    :returns: The outcomes, in the calls' order.
    """
    answered = {message.tool_call_result.origin.id: message for message in added if message.tool_call_result}
    held_calls = {call.tool_call_id for call in held.calls} if held is not None else set()
    asked_again = {call.tool_call_id for call in held.calls if call.request is not None} if held is not None else set()
    outcomes = []
    for call, tool_call in zip(step.calls, step.chat_message().tool_calls, strict=True):
        common: dict[str, Any] = {
            "position": call.position,
            "tool_call_id": call.tool_call_id,
            "tool_name": call.tool_name,
            "request_id": call.request.request_id if call.request is not None else None,
        }
        answer = answered.get(tool_call.id)
        if (done := ran.get(str(tool_call.id))) is not None:
            outcome, key, _ = done
            result = answer.tool_call_result if answer is not None else None
            digest = arguments_digest(result.origin.arguments) if result is not None else None
            outcomes.append(CallOutcome(outcome=outcome, arguments_digest=digest, idempotency_key=key, **common))  # type: ignore[arg-type]
        elif tool_call.id in held_calls:
            outcome = "may-have-run" if tool_call.id in asked_again else "not-run"
            outcomes.append(CallOutcome(outcome=outcome, reason=HELD_AGAIN, **common))  # type: ignore[arg-type]
        elif isinstance(meta := answer.meta.get(META_KEY) if answer is not None else None, dict) and meta.get("kind"):
            kind = str(meta["kind"]).removeprefix("approval-")
            outcomes.append(CallOutcome(outcome=kind, reason=_text(answer), **common))  # type: ignore[arg-type]
        else:
            outcomes.append(CallOutcome(outcome="not-run", reason=ANOTHER_HOOK, **common))
    return outcomes


def _text(message: ChatMessage | None) -> str | None:
    if message is None or message.tool_call_result is None:
        return None
    return str(message.tool_call_result.result)
