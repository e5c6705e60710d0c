"""
What the model sees: error results for calls that did not run, notes for edited arguments, and the message shapes.

A call that does not run still gets a tool result, so the conversation stays valid for every provider (each tool call
answered) and the model learns why. The result is an error whose text is a small JSON object with a machine-readable
``error`` kind, which the message meta repeats for programs::

    {"error": "approval-denied", "tool": "send_invoice", "message": "The user denied this call: over budget."}

Two shapes, one per channel:

- in-process (the Agent runs the approved calls itself, as with Haystack's `ConfirmationHook`): each denied call
  becomes an ``[assistant(call), tool(error)]`` pair, followed by a user note per edited call and the assistant
  message with the calls that run. Keeping Haystack's shape lets the Agent run them natively (exit conditions, tool
  counts, ``after_tool`` hooks);
- resumed (durable): the held message comes back whole, edited arguments in place, followed by one result per call
  in the model's original order, whether it ran or was denied.
"""

import json
from dataclasses import replace

from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks.human_in_the_loop.strategies import MODIFICATION_FEEDBACK_TEMPLATE

from haystack_integrations.offload.approvals.records import APPROVAL_DENIED, APPROVAL_EXPIRED, Denial

META_KEY = "approval"
"""The tool-result meta key carrying ``{"kind": ..., "request_id": ...}`` for calls that did not run."""


def denial_result(call: ToolCall, denial: Denial, *, request_id: str | None = None) -> ChatMessage:
    """
    The error result a model receives for a call that did not run.

    :param call: The tool call.
    :param denial: Its kind and reason.
    :param request_id: The approval request, if there was one.
    :returns: A tool message with ``error=True``.
    """
    payload = {"error": denial.kind, "tool": call.tool_name, "message": denial.reason}
    return ChatMessage.from_tool(
        tool_result=json.dumps(payload, ensure_ascii=False),
        origin=call,
        error=True,
        meta={META_KEY: {"kind": denial.kind, "request_id": request_id}},
    )


def denied_by_person(reason: str | None) -> Denial:
    """The denial for a person's "no"."""
    text = "The user denied this tool call."
    return Denial(kind=APPROVAL_DENIED, reason=f"{text} Reason: {reason}" if reason else text)


def expired(detail: str) -> Denial:
    """The denial for an approval nobody gave in time."""
    return Denial(kind=APPROVAL_EXPIRED, reason=f"No approval was given in time: {detail}")


def edit_note(call: ToolCall, arguments: dict[str, object]) -> ChatMessage:
    """The user message telling the model its arguments were changed (Haystack's wording), so it does not retry."""
    return ChatMessage.from_user(
        MODIFICATION_FEEDBACK_TEMPLATE.format(tool_name=call.tool_name, final_tool_params=arguments)
    )


def in_process_shape(
    message: ChatMessage, denials: dict[int, tuple[Denial, str | None]], edits: dict[int, dict[str, object]]
) -> list[ChatMessage]:
    """
    Rewrite the pending assistant message for the in-process channel (Haystack's `ConfirmationHook` shape).

    The message's text, reasoning and meta stay on one assistant message only (the one that runs, or the first
    denial when nothing runs), so nothing is duplicated.

    :param message: The assistant message with the pending calls.
    :param denials: Position -> (denial, request id) for calls that do not run.
    :param edits: Position -> edited arguments for approved calls.
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
        shaped.append(denial_result(call, denial, request_id=request))
    shaped.extend(edit_note(calls[index], arguments) for index, arguments in sorted(edits.items()))
    if running:
        shaped.append(_assistant_like(message, running, whole=True))
    return shaped


def resumed_shape(
    message: ChatMessage, calls: list[ToolCall], results: list[ChatMessage], edits: dict[int, dict[str, object]]
) -> tuple[list[ChatMessage], ChatMessage]:
    """
    The held message with its results in the model's order, for the resumed conversation.

    :param message: The held assistant message.
    :param calls: Its tool calls with their final arguments (edited ones replaced), in order.
    :param results: One tool message per call, in the same order.
    :param edits: Position -> edited arguments, for the notes that tell the model.
    :returns: ``(messages, assistant)``: the notes, the assistant message and the results; and the assistant message.
    """
    assistant = _assistant_like(message, calls, whole=True)
    notes = [edit_note(message.tool_calls[index], arguments) for index, arguments in sorted(edits.items())]
    return [*notes, assistant, *results], assistant


def _assistant_like(message: ChatMessage, calls: list[ToolCall], *, whole: bool) -> ChatMessage:
    if not whole:
        return ChatMessage.from_assistant(tool_calls=calls, name=message.name)
    return ChatMessage.from_assistant(
        text=message.text, meta=dict(message.meta), name=message.name, tool_calls=calls, reasoning=message.reasoning
    )
