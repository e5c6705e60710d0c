"""
End to end: one real Haystack Agent with Haystack's own ToolResultOffloadHook, shared by two tenants' concurrent runs.

Each run brings its own session store through `offload_context`; the model is scripted with MockChatGenerator, whose
`response_fn` decides from the conversation alone so concurrent runs never share a script position.
"""

import asyncio
import hashlib
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks.tool_result_offloading import AlwaysOffload, OffloadOverChars, ToolResultOffloadHook
from haystack.tools import Tool

from haystack_integrations.offload import (
    FsspecToolResultStore,
    InvalidReferenceError,
    ResultNotFoundError,
    offload_context,
)


def _big_page(query: str) -> str:
    """A deterministic, large search result whose content depends on the query (so tenants' data differ)."""
    digest = hashlib.sha256(query.encode()).hexdigest()
    return "\n".join(f"{query} hit {i}: {digest} {'lorem ipsum ' * 8}" for i in range(400))


def _search(query: str) -> str:
    return _big_page(query)


SEARCH = Tool(
    name="web_search",
    description="Search the web.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    function=_search,
)


def _script(messages: list[ChatMessage]) -> ChatMessage:
    """First turn: search for the user's text; after the tool result: answer with the pointer the model saw."""
    last = messages[-1]
    if last.tool_call_result is not None:
        return ChatMessage.from_assistant(f"done: {last.tool_call_result.result[:60]}")
    query = last.text or ""
    return ChatMessage.from_assistant(
        tool_calls=[
            ToolCall(tool_name="web_search", arguments={"query": query}, id="call_1"),
            ToolCall(tool_name="web_search", arguments={"query": query + " (page 2)"}, id="call_2"),
        ]
    )


@pytest.fixture
def agent() -> Agent:
    hook = ToolResultOffloadHook(
        store=FsspecToolResultStore("memory://must-never-be-used"),
        offload_strategies={"web_search": OffloadOverChars(2000), "*": AlwaysOffload()},
    )
    agent = Agent(chat_generator=MockChatGenerator(response_fn=_script), tools=[SEARCH], hooks={"after_tool": [hook]})
    agent.warm_up()
    return agent


def _references(result: dict[str, Any]) -> list[str]:
    return [
        reference
        for message in result["messages"]
        if message.tool_call_result is not None
        for reference in message.meta.get("tool_result_offloaded", [])
    ]


async def test_two_tenants_run_concurrently_on_one_agent_and_stay_isolated(
    agent: Agent, store: FsspecToolResultStore
) -> None:
    acme = store.for_session("acme", "chat-1")
    globex = store.for_session("globex", "chat-1")

    acme_result, globex_result = await asyncio.gather(
        agent.run_async([ChatMessage.from_user("acme quarterly numbers")], hook_context=offload_context(acme)),
        agent.run_async([ChatMessage.from_user("globex merger rumours")], hook_context=offload_context(globex)),
    )

    acme_refs, globex_refs = _references(acme_result), _references(globex_result)
    assert len(acme_refs) == 2
    assert len(globex_refs) == 2
    # Each result went to its own session, byte for byte, and nowhere else.
    assert {acme.read(ref) for ref in acme_refs} == {
        _big_page("acme quarterly numbers"),
        _big_page("acme quarterly numbers (page 2)"),
    }
    assert {globex.read(ref) for ref in globex_refs} == {
        _big_page("globex merger rumours"),
        _big_page("globex merger rumours (page 2)"),
    }
    tree = sorted(record.reference.rsplit("/", 1)[0] for record in store.list())
    assert tree == ["acme/chat-1", "acme/chat-1", "globex/chat-1", "globex/chat-1"]
    # The pointer the model saw names the reference, and the context shrank.
    pointer = acme_result["messages"][2].tool_call_result.result
    assert pointer.startswith("Tool result offloaded to text (")
    assert acme_refs[0] in pointer
    assert len(pointer) < 1000

    # Neither session can read the other's references, in any spelling.
    for reference in globex_refs:
        with pytest.raises(ResultNotFoundError):
            acme.read(reference)
        for spelling in (f"globex/chat-1/{reference}", f"../../globex/chat-1/{reference}"):
            with pytest.raises(InvalidReferenceError):
                acme.read(spelling)
    for reference in acme_refs:
        with pytest.raises(ResultNotFoundError):
            await globex.read_async(reference)

    # The constructor store, shared by every run, was never written.
    assert FsspecToolResultStore("memory://must-never-be-used").list() == []


def test_sync_run_with_the_stock_hook(agent: Agent, store: FsspecToolResultStore) -> None:
    session = store.for_session("initech", "chat-9")
    result = agent.run([ChatMessage.from_user("tps reports")], hook_context=offload_context(session))
    references = _references(result)
    assert [session.read(reference) for reference in sorted(references)] == [
        session.read(reference) for reference in sorted(r.reference for r in session.list())
    ]
    assert {session.read(reference) for reference in references} == {
        _big_page("tps reports"),
        _big_page("tps reports (page 2)"),
    }
