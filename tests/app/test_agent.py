"""
`build_agent` is the first thing a team copying the app changes: the tools (and which of them ask first, which are
always offloaded) are its parameters; left out, the Agent serves the demo's tools with the demo's rules.
"""

import uuid

from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.tools import Tool

from haystack_integrations.offload import (
    APPROVAL_REQUIRED,
    DurableApprovals,
    FsspecToolResultStore,
    offload_context,
    pending_approvals_async,
)
from haystack_integrations.offload.hooks import OFFLOADED_META_KEY
from offload_haystack_app.demo.scripted_model import scripted_generator
from offload_haystack_app.demo.tools import DEMO_TOOLS
from offload_haystack_app.server.agent import build_agent

READ_BACK_TOOLS = ["read_tool_result", "list_tool_results"]


def _lookup(term: str) -> str:
    return f"{term}: found"


def _send(to: str) -> str:
    return f"sent to {to}"


LOOKUP = Tool(
    name="lookup",
    description="Look a term up.",
    parameters={"type": "object", "properties": {"term": {"type": "string"}}, "required": ["term"]},
    function=_lookup,
)
SEND = Tool(
    name="send",
    description="Send a message.",
    parameters={"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]},
    function=_send,
)


def _calls_then_done(messages: list[ChatMessage]) -> ChatMessage:
    # Calls each tool once on the user's message, then ends the run.
    if messages[-1].is_from(ChatRole.USER):
        return ChatMessage.from_assistant(
            tool_calls=[
                ToolCall(tool_name="lookup", arguments={"term": "haystack"}, id="c1"),
                ToolCall(tool_name="send", arguments={"to": "ops"}, id="c2"),
            ]
        )
    return ChatMessage.from_assistant("done")


def _store() -> FsspecToolResultStore:
    return FsspecToolResultStore(f"memory://agent-{uuid.uuid4().hex}").for_session("acme", "chat-1")


def test_the_agent_serves_the_tools_it_is_given() -> None:
    agent = build_agent(MockChatGenerator(response_fn=_calls_then_done), tools=[LOOKUP, SEND])
    assert [tool.name for tool in agent.tools] == ["lookup", "send", *READ_BACK_TOOLS]


def test_by_default_it_serves_the_demo_tools() -> None:
    agent = build_agent(scripted_generator())
    assert [tool.name for tool in agent.tools] == [*(tool.name for tool in DEMO_TOOLS), *READ_BACK_TOOLS]


async def test_tools_of_your_own_ask_first_only_when_named() -> None:
    asked = build_agent(MockChatGenerator(response_fn=_calls_then_done), tools=[LOOKUP, SEND], ask_first=["send"])
    unasked = build_agent(MockChatGenerator(response_fn=_calls_then_done), tools=[LOOKUP, SEND])
    held_store = _store()
    context = offload_context(held_store, approval_channel=DurableApprovals())
    held = await asked.run_async([ChatMessage.from_user("go")], hook_context=context)
    ran = await unasked.run_async([ChatMessage.from_user("go")], hook_context=offload_context(_store()))
    assert held["exit_reason"] == APPROVAL_REQUIRED
    assert [request.tool_name for request in await pending_approvals_async(held_store)] == ["send"]
    assert ran["exit_reason"] != APPROVAL_REQUIRED and ran["tool_call_counts"] == {
        "lookup": 1,
        "send": 1,
        "read_tool_result": 0,
        "list_tool_results": 0,
    }


async def test_always_offload_names_the_tools_whose_short_results_still_go_to_the_store() -> None:
    agent = build_agent(
        MockChatGenerator(response_fn=_calls_then_done), tools=[LOOKUP, SEND], always_offload=["lookup"]
    )
    store = _store()
    reply = await agent.run_async([ChatMessage.from_user("go")], hook_context=offload_context(store))
    offloaded = {
        message.tool_call_result.origin.tool_name: message.meta.get(OFFLOADED_META_KEY)
        for message in reply["messages"]
        if message.tool_call_result
    }
    assert offloaded["send"] is None  # short, and not named: it stays in the conversation
    [reference] = offloaded["lookup"]
    assert await store.read_async(reference) == "haystack: found"
