"""
The demo's scripted model, a stand-in for an LLM: Haystack's MockChatGenerator with a response function, labelled as
scripted everywhere. The server answers with it until a model endpoint is configured (``OFFLOAD_SERVER_MODEL``).

The response function picks tool calls from phrases in the last user message, and decides from the conversation alone.
"""

import re

from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall

SCRIPTED_MODEL_LABEL = "scripted model (MockChatGenerator), no LLM is called"
SCRIPTED_CONTEXT_WINDOW = 4_000
"""The scripted model's pretend context window (tokens): small, so compaction visibly happens within a short chat."""

HELP_TEXT = (
    "I am a scripted model (no LLM is called). Try: 'Research solar panels, dump the invoices table and chart "
    "revenue', 'Check the logs of billing and payroll', 'Read back the search results for \"result 7\"', 'List my "
    "results', or 'Send an invoice to Initech for 250 EUR'."
)

_SERVICES = ("billing", "search", "payroll", "checkout")
_POINTER = re.compile(r"at '([^']+)'")
_QUOTED = re.compile(r"[\"“']([^\"”']{1,200})[\"”']")
_CUSTOMER = re.compile(r"\bto ([A-Za-z][\w&.-]*(?: [A-Z][\w&.-]*)*)")
_NUMBER = re.compile(r"\b(\d{1,6})\b")
_CHART_METRIC = re.compile(r"\b(?:chart|plot)\s+(?:of\s+|the\s+)?([a-z][a-z_-]{1,40})")
_TABLE_NAME = re.compile(r"\b([a-z][a-z_]{1,40})\s+table\b")
_READ_TOOLS = {"search": "web_search", "table": "sql_query", "chart": "render_chart", "log": "fetch_logs"}


def scripted_reply(messages: list[ChatMessage]) -> ChatMessage:
    """
    Decide the next assistant message from the conversation alone.

    :param messages: The conversation so far.
    :returns: The assistant's reply: tool calls for a user message, a summary after tool results.
    """
    last = messages[-1]
    if last.tool_call_result is not None:
        return ChatMessage.from_assistant(_summary(messages))
    text = last.text or ""
    calls = _calls_for(text, messages)
    if not calls:
        return ChatMessage.from_assistant(HELP_TEXT)
    # Ids are unique within the conversation (its length only grows), so approvals and offload keys can bind to them.
    step = len(messages)
    return ChatMessage.from_assistant(
        tool_calls=[
            ToolCall(tool_name=name, arguments=arguments, id=f"call_{step}_{index}")
            for index, (name, arguments) in enumerate(calls)
        ]
    )


def scripted_generator() -> MockChatGenerator:
    """
    Build the demo's chat generator.

    :returns: A `MockChatGenerator` driven by `scripted_reply`.
    """
    return MockChatGenerator(response_fn=scripted_reply)


def _calls_for(text: str, messages: list[ChatMessage]) -> list[tuple[str, dict[str, object]]]:
    lowered = text.lower()
    if "log" in lowered:
        services = [service for service in _SERVICES if service in lowered] or list(_SERVICES[:3])
        return [("fetch_logs", {"service": service}) for service in services]
    if "invoice" in lowered and "send" in lowered:
        customer = _CUSTOMER.search(text)
        amount = _NUMBER.search(text)
        return [
            (
                "send_invoice",
                {
                    "customer": customer.group(1) if customer else "ACME Corp",
                    "amount": int(amount.group(1)) if amount else 100,
                },
            )
        ]
    if "read" in lowered:
        reference = _newest_reference(messages, _tool_named(lowered))
        if reference is None:
            return []
        arguments: dict[str, object] = {"reference": reference}
        quoted = _QUOTED.search(text)
        if quoted:
            arguments["search"] = quoted.group(1)
        else:
            arguments["max_chars"] = 2000
        return [("read_tool_result", arguments)]
    if "list" in lowered and "result" in lowered:
        return [("list_tool_results", {})]
    calls: list[tuple[str, dict[str, object]]] = []
    if "search" in lowered:
        calls.append(("web_search", {"query": text.strip()[:200]}))
    if any(word in lowered for word in ("table", "dump", "sql")):
        table = _TABLE_NAME.search(lowered)
        calls.append(("sql_query", {"table": table.group(1) if table else "invoices"}))
    if "chart" in lowered or "plot" in lowered:
        metric = _CHART_METRIC.search(lowered)
        calls.append(("render_chart", {"metric": metric.group(1) if metric else "revenue"}))
    return calls


def _tool_named(lowered: str) -> str | None:
    return next((tool for word, tool in _READ_TOOLS.items() if word in lowered), None)


def _newest_reference(messages: list[ChatMessage], tool_name: str | None) -> str | None:
    """The newest offloaded reference in the conversation, of `tool_name`'s results when given (its last block)."""
    for message in reversed(messages):
        result = message.tool_call_result
        if result is None or not isinstance(result.result, str):
            continue
        if tool_name is not None and result.origin.tool_name != tool_name:
            continue
        references = _POINTER.findall(result.result)
        if references:
            return str(references[-1])
    return None


def _after_newest_assistant(messages: list[ChatMessage]) -> list[ChatMessage]:
    newest = max((n for n, message in enumerate(messages) if message.role == ChatRole.ASSISTANT), default=-1)
    return messages[newest + 1 :]


def _summary(messages: list[ChatMessage]) -> str:
    lines = []
    # This step's tool results: everything after the newest assistant message.
    for message in _after_newest_assistant(messages):
        result = message.tool_call_result
        if result is None:
            continue
        name = result.origin.tool_name
        text = result.result if isinstance(result.result, str) else "(image and text content)"
        if result.error:
            lines.append(f"- {name} did not run: {text}")
        elif "tool_result_offloaded" in message.meta:
            lines.append(f"- {name}: I got a pointer, not the full result. {_first_line(text, 240)}")
        else:
            lines.append(f"- {name}: {_first_line(text, 400)}")
    return "Here is what the tools returned (scripted summary):\n" + "\n".join(lines)


def _first_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."
