"""
A scripted model and side-effecting tools for the approval tests, importable by the tests and by worker processes.

The model is Haystack's `MockChatGenerator` with a `response_fn` that decides from the conversation alone (never from a
call counter), so any process and any number of concurrent runs can drive the same script:

- a user message whose text is a JSON list of calls -> the assistant requests exactly those calls;
- otherwise, after tool results -> a final answer quoting every tool result since the last assistant message.

`send_invoice` appends one line per execution to the ledger file named by ``$OFFLOAD_APPROVAL_TEST_LEDGER``
(``O_APPEND``, so writes from several processes never interleave): counting its lines counts executions across
processes. The tools are module-level functions, so an Agent using them serializes with `Agent.to_dict()`.
"""

import json
import os
from pathlib import Path
from typing import Any

from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks.human_in_the_loop.types import ConfirmationPolicy
from haystack.tools import Tool

from haystack_integrations.offload import ApprovalHook

INVOICE_SCHEMA = {
    "type": "object",
    "properties": {"customer": {"type": "string"}, "amount": {"type": "integer", "minimum": 1}},
    "required": ["customer", "amount"],
    "additionalProperties": False,
}
LEDGER_ENV = "OFFLOAD_APPROVAL_TEST_LEDGER"
"""The environment variable naming the file `send_invoice` appends to (set per test; inherited by workers)."""
SEARCH_SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}


def plan(*calls: tuple[str, dict[str, Any], str | None]) -> ChatMessage:
    """A user message asking the scripted model for these calls: ``(tool, arguments, id)``."""
    return ChatMessage.from_user(json.dumps([{"tool": t, "arguments": a, "id": i} for t, a, i in calls]))


def script(messages: list[ChatMessage]) -> ChatMessage:
    """The scripted model: request the calls the last user message lists, then answer with the results it got."""
    last = messages[-1]
    if last.is_from(ChatRole.USER) and last.text and last.text.startswith("["):
        calls = [ToolCall(tool_name=c["tool"], arguments=c["arguments"], id=c["id"]) for c in json.loads(last.text)]
        return ChatMessage.from_assistant("Working on it.", tool_calls=calls)
    results = []
    for message in reversed(messages):
        if message.is_from(ChatRole.ASSISTANT):
            break
        if message.tool_call_result is not None:
            results.append(str(message.tool_call_result.result))
    return ChatMessage.from_assistant("final: " + " | ".join(reversed(results)))


def ledger_lines(ledger: Path) -> list[str]:
    """The executions `send_invoice` recorded."""
    return ledger.read_text().splitlines() if ledger.exists() else []


def send_invoice(customer: str, amount: int) -> str:
    """Send an invoice (here: append a line to the ledger named by the environment)."""
    line = f"{customer}:{amount}:{os.getpid()}\n"
    fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return f"invoice sent to {customer} for {amount}"


def web_search(query: str) -> str:
    """Search the web (here: a deterministic answer)."""
    return f"results for {query}"


def make_tools() -> list[Tool]:
    """`send_invoice` (side effect: one ledger line per run) and `web_search` (pure); both serializable."""
    return [
        Tool(name="send_invoice", description="Send an invoice.", parameters=INVOICE_SCHEMA, function=send_invoice),
        Tool(name="web_search", description="Search the web.", parameters=SEARCH_SCHEMA, function=web_search),
    ]


def structured_error(text: str) -> dict[str, Any]:
    """The error a tool result carries in the hook's ``"structured"`` format, flattened to kind, tool and message."""
    payload = json.loads(text)["error"]
    return {"error": payload["kind"], "tool": payload["tool"], "message": payload["message"]}


def make_agent(rules: dict[Any, ConfirmationPolicy], **agent_kwargs: Any) -> Agent:
    """A real Agent with the scripted model, both tools and an `ApprovalHook` with `rules` (machine-readable errors)."""
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=make_tools(),
        hooks={"before_tool": [ApprovalHook(rules, result_format="structured")]},
        **agent_kwargs,
    )
    agent.warm_up()
    return agent
