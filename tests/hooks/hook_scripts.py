"""
Shared parts of the hook suites: tools, a scripted model, a recording store and a State builder.

The model is Haystack's `MockChatGenerator` with a `response_fn` that reads its plan from the latest user message,
so any number of concurrent runs share one Agent without sharing a script position. A plan looks like
``"acme/chat-1: fetch+notes, notes, notes"``: one step per comma, parallel tool calls joined by ``+``; after the last
step the model answers with text. Replies carry a provider-style token count (as real generators do), so compaction
is sized the way it is in production.
"""

import hashlib
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks.tool_result_offloading import RESULT_STORE_CONTEXT_KEY
from haystack.hooks.tool_result_offloading.types import ToolResultStore
from haystack.token_counters import ApproximateTokenCounter
from haystack.tools import Tool

# Haystack's compaction classes are experimental and warn when built; the suite turns warnings into errors.
ALLOW_EXPERIMENTAL = pytest.mark.filterwarnings("ignore::haystack.utils.experimental.ExperimentalWarning")

OFFLOADED = "tool_result_offloaded"
COMPACTED = "context_compaction"


def page(query: str, lines: int = 200) -> str:
    """A deterministic result whose every line names the query, so a stored copy shows whose it is."""
    digest = hashlib.sha256(query.encode()).hexdigest()[:16]
    return "\n".join(f"{query} line {i} {digest} " + "lorem ipsum " * 6 for i in range(lines))


def fetch(query: str) -> str:
    return page(query, lines=200)  # ~24 KB


def notes(query: str) -> str:
    return page(query, lines=40)  # ~4.8 KB


def clock(query: str) -> str:
    return f"12:00 for {query}"


def read_tool_result(query: str) -> str:
    # Named like the library's read-back tool: its results must never be offloaded.
    return page(query, lines=100)


def broken(query: str) -> str:
    raise RuntimeError(f"broken tool for {query} " + "x" * 5000)


def _tool(name: str, function: Any) -> Tool:
    return Tool(
        name=name,
        description=f"The {name} tool.",
        parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        function=function,
    )


TOOLS = [
    _tool("fetch", fetch),
    _tool("notes", notes),
    _tool("clock", clock),
    _tool("read_tool_result", read_tool_result),
    _tool("broken", broken),
]

_COUNTER = ApproximateTokenCounter()


def script(messages: list[ChatMessage]) -> ChatMessage:
    """Follow the plan in the latest user message; answer with text once every step has run."""
    user_index = max(i for i, message in enumerate(messages) if message.is_from(ChatRole.USER))
    label, _, plan_text = (messages[user_index].text or "").partition(": ")
    steps = [step.split("+") for step in plan_text.split(", ") if step]
    done = sum(1 for message in messages[user_index + 1 :] if message.tool_calls)
    usage = {"usage": {"prompt_tokens": _COUNTER.count(messages=messages), "completion_tokens": 5}}
    if done >= len(steps):
        return ChatMessage.from_assistant(f"{label}: finished after {done} steps", meta=usage)
    calls = [
        ToolCall(tool_name=tool, arguments={"query": f"{label} step {done} call {j}"}, id=f"call_{done}_{j}")
        for j, tool in enumerate(steps[done])
    ]
    return ChatMessage.from_assistant(tool_calls=calls, meta=usage)


def make_agent(hooks: dict[str, list[Any]], *, tools: list[Tool] | None = None, **kwargs: Any) -> Agent:
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=list(TOOLS) if tools is None else tools,
        hooks=hooks,  # type: ignore[arg-type]
        max_agent_steps=20,
        **kwargs,
    )
    agent.warm_up()
    return agent


def tool_results(result: dict[str, Any]) -> list[ChatMessage]:
    return [message for message in result["messages"] if message.tool_call_result is not None]


def references(result: dict[str, Any], *, compacted: bool | None = None) -> list[str]:
    """References in a run's final messages; `compacted` selects those written by compaction (or not)."""
    return [
        reference
        for message in tool_results(result)
        if compacted is None or (COMPACTED in message.meta) == compacted
        for reference in message.meta.get(OFFLOADED, [])
    ]


class RecordingStore:
    """A plain Haystack-protocol store (sync write only, no tool name) whose references are predictable."""

    supports_binary_content = True

    def __init__(self) -> None:
        self.written: dict[str, str | bytes] = {}

    def write(self, *, key: str, content: str | bytes) -> str:
        reference = f"ref/{key}"
        self.written[reference] = content
        return reference

    def read(self, reference: str) -> str | bytes:
        return self.written[reference]


def make_state(
    messages: list[ChatMessage],
    *,
    store: ToolResultStore | None = None,
    step: int = 1,
    context_tokens: int = 0,
) -> State:
    """A State shaped like the Agent's, for calling a hook directly."""
    schema = {
        "hook_context": {"type": dict[str, Any], "handler": replace_values},
        "step_count": {"type": int, "handler": replace_values},
        "context_tokens": {"type": int, "handler": replace_values},
        "tools": {"type": list, "handler": replace_values},
    }
    data: dict[str, Any] = {
        "messages": list(messages),
        "hook_context": {RESULT_STORE_CONTEXT_KEY: store} if store is not None else {},
        "step_count": step,
        "context_tokens": context_tokens,
    }
    return State(schema=schema, data=data)


def tool_step(*calls: tuple[str, Any], step: int = 0, error: bool = False) -> list[ChatMessage]:
    """An assistant message calling tools, followed by their results: ``tool_step(("fetch", "text"), ...)``."""
    tool_calls = [
        ToolCall(tool_name=name, arguments={"query": f"q{step}_{i}"}, id=f"call_{step}_{i}")
        for i, (name, _) in enumerate(calls)
    ]
    results = [
        ChatMessage.from_tool(tool_result=content, origin=tool_call, error=error)
        for tool_call, (_, content) in zip(tool_calls, calls, strict=True)
    ]
    return [ChatMessage.from_assistant(tool_calls=tool_calls), *results]
