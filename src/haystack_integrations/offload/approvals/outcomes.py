"""
What the model sees: error results for calls that did not run, notes for edited arguments, and the message shapes.

The text follows the hook's ``result_format`` (``"haystack"``, the default, or ``"structured"``); the message shapes
are those of Haystack's `ConfirmationHook`.
"""

import json
from dataclasses import replace
from typing import Literal

from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks.human_in_the_loop.strategies import (
    MODIFICATION_FEEDBACK_TEMPLATE,
    REJECTION_FEEDBACK_TEMPLATE,
    USER_FEEDBACK_TEMPLATE,
)

from haystack_integrations.offload.approvals.approval_records import APPROVAL_DENIED, APPROVAL_EXPIRED, Denial, HeldStep

META_KEY = "approval"
"""The tool-result meta key carrying ``{"kind": ..., "request_id": ...}`` for calls that did not run."""

APPROVAL_REQUIRED_META_KEY = "approval_required"
"""The meta key of the notice a durable stop leaves as the run's last message: the ids of the pending requests."""

ResultFormat = Literal["haystack", "structured"]
"""How a call that did not run is worded for the model: Haystack's sentences, or a JSON object."""

RESULT_FORMATS: tuple[ResultFormat, ...] = ("haystack", "structured")


def denial_result(
    call: ToolCall, denial: Denial, *, request_id: str | None = None, result_format: ResultFormat = "haystack"
) -> ChatMessage:
    """
    The error result a model receives for a call that did not run.

    :param call: The tool call.
    :param denial: Its kind and reason.
    :param request_id: The approval request, if there was one.
    :param result_format: ``"haystack"`` (Haystack's wording) or ``"structured"`` (a JSON object).
    :returns: A tool message with ``error=True``.
    """
    if result_format == "structured":
        payload = {"kind": denial.kind, "tool": call.tool_name, "message": denial.reason, "request_id": request_id}
        text = json.dumps({"error": payload}, ensure_ascii=False)
    else:
        text = _haystack_wording(call.tool_name, denial)
    return ChatMessage.from_tool(
        tool_result=text,
        origin=call,
        error=True,
        meta={META_KEY: {"kind": denial.kind, "request_id": request_id}},
    )


def approval_notice(held: HeldStep) -> ChatMessage:
    """The notice a durable stop leaves as the run's last message, naming the held step's pending requests."""
    ids = [request.request_id for request in held.requests()]
    return ChatMessage.from_assistant("Approval required: " + ", ".join(ids), meta={APPROVAL_REQUIRED_META_KEY: ids})


def _haystack_wording(tool_name: str, denial: Denial) -> str:
    # A person's "no" reads exactly as ConfirmationHook words it; every other reason is said as it is.
    if denial.kind == APPROVAL_DENIED and denial.reason.startswith(_DENIED):
        text = REJECTION_FEEDBACK_TEMPLATE.format(tool_name=tool_name)
        if denial.feedback and denial.feedback.startswith(text):
            return denial.feedback  # already Haystack's words: a ConfirmationStrategy's rejection, kept as it is
        return f"{text} {USER_FEEDBACK_TEMPLATE.format(feedback=denial.feedback)}" if denial.feedback else text
    return f"Tool execution for '{tool_name}' did not happen. {denial.reason}"


_DENIED = "The user denied this tool call."


def denied_by_person(reason: str | None) -> Denial:
    """The denial for a person's "no"."""
    return Denial(
        kind=APPROVAL_DENIED, reason=f"{_DENIED} Reason: {reason}" if reason else _DENIED, feedback=reason or None
    )


def expired(detail: str) -> Denial:
    """The denial for an approval nobody gave in time."""
    return Denial(kind=APPROVAL_EXPIRED, reason=f"No approval was given in time: {detail}")


def edit_note(call: ToolCall, arguments: dict[str, object]) -> ChatMessage:
    """The user message telling the model its arguments were changed (Haystack's wording), so it does not retry."""
    return ChatMessage.from_user(
        MODIFICATION_FEEDBACK_TEMPLATE.format(tool_name=call.tool_name, final_tool_params=arguments)
    )


def in_process_shape(
    message: ChatMessage,
    denials: dict[int, tuple[Denial, str | None]],
    edits: dict[int, dict[str, object]],
    result_format: ResultFormat = "haystack",
) -> list[ChatMessage]:
    """
    Rewrite the pending assistant message for the in-process channel (Haystack's `ConfirmationHook` shape).

    The message's text, reasoning and meta stay on one assistant message only (the one that runs, or the first
    denial when nothing runs), so nothing is duplicated.

    :param message: The assistant message with the pending calls.
    :param denials: Position -> (denial, request id) for calls that do not run.
    :param edits: Position -> edited arguments for approved calls.
    :param result_format: How denials are worded (see the module documentation).
    :returns: The messages that replace `message`; the last one holds the calls the Agent runs, if any.
    """
    calls = message.tool_calls
    running = [replace(call, arguments=edits.get(index, call.arguments)) for index, call in enumerate(calls)]
    running = [call for index, call in enumerate(running) if index not in denials]
    shaped: list[ChatMessage] = []
    for index, call in enumerate(calls):
        if index not in denials:
            continue
        denial, request = denials[index]
        carries_text = not running and not shaped
        shaped.append(_assistant_like(message, [call], whole=carries_text))
        shaped.append(denial_result(call, denial, request_id=request, result_format=result_format))
    shaped.extend(edit_note(calls[index], arguments) for index, arguments in sorted(edits.items()))
    if running:
        shaped.append(_assistant_like(message, running, whole=True))
    return shaped


def _assistant_like(message: ChatMessage, calls: list[ToolCall], *, whole: bool) -> ChatMessage:
    if not whole:
        return ChatMessage.from_assistant(tool_calls=calls, name=message.name)
    return ChatMessage.from_assistant(
        text=message.text, meta=dict(message.meta), name=message.name, tool_calls=calls, reasoning=message.reasoning
    )
