"""
`haystack_integrations.offload.sessions` hands out every refusal `ChatService` raises, the approval errors `decide`
passes on included, so an app built on it alone (the docs' FastAPI and hayhooks examples) can answer each with a 4xx
instead of a 500.
"""

import builtins
import inspect
import json
import re
import uuid
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy
from haystack.tools import Tool

from haystack_integrations import offload
from haystack_integrations.offload import ApprovalHook, FsspecToolResultStore, errors, sessions
from haystack_integrations.offload.sessions import ChatService

# Raised by the store under every call, not by the service: the library's own error tree, at the top level.
STORE_ERRORS = {"StorageError"}


def _raised_by_the_service() -> set[str]:
    names: set[str] = set()
    for _, method in inspect.getmembers(ChatService, inspect.isfunction):
        names.update(re.findall(r":raises (\w+):", inspect.getdoc(method) or ""))
    return {name for name in names if not hasattr(builtins, name)}


def test_every_error_the_service_raises_is_a_name_of_sessions() -> None:
    raised = _raised_by_the_service()
    assert {"ApprovalAlreadyDecidedError", "ApprovalExpiredError", "InvalidApprovalEditError"} <= raised
    assert raised - STORE_ERRORS <= set(sessions.__all__)
    assert all(hasattr(offload, name) and hasattr(errors, name) for name in STORE_ERRORS)


@pytest.mark.parametrize("name", ["ApprovalAlreadyDecidedError", "ApprovalExpiredError", "InvalidApprovalEditError"])
def test_the_approval_errors_are_the_classes_the_top_level_hands_out(name: str) -> None:
    assert getattr(sessions, name) is getattr(offload, name)


def _script(messages: list[ChatMessage]) -> ChatMessage:
    last = messages[-1]
    if last.is_from(ChatRole.USER):
        return ChatMessage.from_assistant("Sending.", tool_calls=[ToolCall(tool_name="send", arguments={}, id="c1")])
    return ChatMessage.from_assistant("done")


def _send() -> str:
    return "sent"


async def test_a_second_verdict_is_caught_as_the_sessions_error() -> None:
    tool = Tool(name="send", description="Send.", parameters={"type": "object", "properties": {}}, function=_send)
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=_script),
        tools=[tool],
        hooks={"before_tool": [ApprovalHook({"send": AlwaysAskPolicy()})]},
    )
    agent.warm_up()
    service = ChatService(agent)
    store = FsspecToolResultStore(f"memory://exports-{uuid.uuid4().hex}").for_session("acme", "chat-1")
    held = await service.send_message(store, "send it")
    [request] = held.pending
    await service.decide(store, request.request_id, approved=True)
    # What a team's handler writes, importing from sessions alone: a different verdict afterwards is a 409, not a 500.
    answer: dict[str, Any]
    try:
        await service.decide(store, request.request_id, approved=False, reason="changed my mind")
        answer = {"status": 200}
    except sessions.ApprovalAlreadyDecidedError:
        answer = {"status": 409, "error": "already_decided"}
    assert answer == {"status": 409, "error": "already_decided"}, json.dumps(answer)
