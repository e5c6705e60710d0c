"""
End to end: a real Haystack Agent, a scripted model, an offload hook, and the read-back tools, on every backend.

A tool returns a large result; the hook writes it to the run's store and leaves Haystack's pointer text; the model,
scripted with `MockChatGenerator`, takes the reference from that pointer and reads the result back page by page (or
searches it, or looks at an image). The script decides from the conversation alone (`response_fn`), so concurrent runs
on one Agent never share a position in a script.

Each test runs with Haystack's stock `ToolResultOffloadHook` (the read-back tools mapped to `NeverOffload()`, as the
tool docstrings say) and with this library's `OffloadHook` (which skips them by itself). Both are told to offload
anything over 1000 characters, and pages are 2500: a hook that offloaded a page would break the reassembly.
"""

import asyncio
import base64
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ImageContent
from haystack.hooks.tool_result_offloading import (
    AlwaysOffload,
    NeverOffload,
    OffloadOverChars,
    ToolResultOffloadHook,
)
from read_back_helpers import CHART, CHART_TOOL, FETCH, NEEDLE, POINTER, report, script, split_page

from haystack_integrations.offload import (
    FsspecToolResultStore,
    OffloadHook,
    list_tool_results,
    offload_context,
    read_tool_result,
)

# Also on RGW with STS credentials and an SSE-C key per tenant (tests/conftest.py, "isolated").
pytestmark = pytest.mark.isolated


def _hook(kind: str) -> Any:
    if kind == "stock":
        return ToolResultOffloadHook(
            # Never used: every run brings its own store in hook_context.
            store=FsspecToolResultStore("memory://must-never-be-used"),
            offload_strategies={
                ("read_tool_result", "list_tool_results"): NeverOffload(),
                "render_chart": AlwaysOffload(),
                "*": OffloadOverChars(1000),
            },
        )
    return OffloadHook({"render_chart": AlwaysOffload(), "*": OffloadOverChars(1000)})


@pytest.fixture(params=["stock", "ours"])
def agent(request: pytest.FixtureRequest) -> Agent:
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=[FETCH, CHART_TOOL, read_tool_result, list_tool_results],
        hooks={"after_tool": [_hook(request.param)]},
        max_agent_steps=200,
    )
    agent.warm_up()
    return agent


def _results_of(messages: list[ChatMessage], tool_name: str) -> list[Any]:
    return [
        message.tool_call_result
        for message in messages
        if message.tool_call_result is not None and message.tool_call_result.origin.tool_name == tool_name
    ]


def _reassembled(messages: list[ChatMessage]) -> str:
    pages = _results_of(messages, "read_tool_result")
    for page in pages:
        assert not page.error
    return "".join(split_page(page.result)[1] for page in pages)


def _offloaded_references(messages: list[ChatMessage]) -> list[str]:
    return [reference for message in messages for reference in message.meta.get("tool_result_offloaded", [])]


def test_the_model_reassembles_the_exact_original_from_pages(agent: Agent, session: FsspecToolResultStore) -> None:
    result = agent.run([ChatMessage.from_user("read:q3 revenue")], hook_context=offload_context(session))
    messages = result["messages"]
    (reference,) = _offloaded_references(messages)  # the report, and nothing the read-back tools returned
    assert session.read(reference) == report("q3 revenue")
    assert len(_results_of(messages, "read_tool_result")) > 10
    assert _reassembled(messages) == report("q3 revenue")
    assert messages[-1].text == "Done."


async def test_async_runs_page_the_same_way(agent: Agent, session: FsspecToolResultStore) -> None:
    result = await agent.run_async([ChatMessage.from_user("read:q4 costs")], hook_context=offload_context(session))
    assert _reassembled(result["messages"]) == report("q4 costs")


async def test_the_model_searches_an_offloaded_result(agent: Agent, session: FsspecToolResultStore) -> None:
    result = await agent.run_async([ChatMessage.from_user("search:churn")], hook_context=offload_context(session))
    (found,) = _results_of(result["messages"], "read_tool_result")
    header, *lines = found.result.splitlines()
    original = report("churn")
    expected = [len(original[: m.start()].encode()) for m in re.finditer(NEEDLE, original)]
    assert len(expected) >= 10
    assert f"{len(expected)} matches" in header and "searched to the end" in header
    assert [int(line.split(":")[0].removeprefix("offset ")) for line in lines if line.startswith("offset ")] == expected


def test_the_model_sees_an_offloaded_image(agent: Agent, session: FsspecToolResultStore) -> None:
    result = agent.run([ChatMessage.from_user("chart:")], hook_context=offload_context(session))
    pointer = _results_of(result["messages"], "render_chart")[0].result
    assert "image/png" in pointer and POINTER.search(pointer)
    (read,) = _results_of(result["messages"], "read_tool_result")
    image = read.result[1]
    assert isinstance(image, ImageContent)
    assert base64.b64decode(image.base64_image) == CHART


def test_the_model_lists_the_conversations_results(agent: Agent, session: FsspecToolResultStore) -> None:
    result = agent.run([ChatMessage.from_user("list:hiring")], hook_context=offload_context(session))
    (reference,) = _offloaded_references(result["messages"])
    (listing,) = _results_of(result["messages"], "list_tool_results")
    header, line = listing.result.splitlines()
    assert header == "[1 stored result in this conversation, newest first]"
    # OffloadHook records the tool name; with Haystack's hook it is inferred from the key.
    assert line.startswith(f"- {reference} | tool: fetch_report")


async def test_two_tenants_concurrently_read_only_their_own(agent: Agent, store: FsspecToolResultStore) -> None:
    acme = store.for_session("acme", "chat-1")
    globex = store.for_session("globex", "chat-1")
    acme_run, globex_run = await asyncio.gather(
        agent.run_async([ChatMessage.from_user("read:acme numbers")], hook_context=offload_context(acme)),
        agent.run_async([ChatMessage.from_user("read:globex numbers")], hook_context=offload_context(globex)),
    )
    assert _reassembled(acme_run["messages"]) == report("acme numbers")
    assert _reassembled(globex_run["messages"]) == report("globex numbers")

    # Globex's run presents Acme's reference: an error result, and not one byte of Acme's report.
    (acme_reference,) = _offloaded_references(acme_run["messages"])
    theft = await agent.run_async(
        [ChatMessage.from_user(f"steal:{acme_reference}")], hook_context=offload_context(globex)
    )
    (refused,) = _results_of(theft["messages"], "read_tool_result")
    assert refused.result.startswith("Error: No stored result")
    assert not any("REPORT ON acme" in str(message) for message in theft["messages"])
    for spelling in (f"acme/chat-1/{acme_reference}", f"../../acme/chat-1/{acme_reference}"):
        theft = agent.run([ChatMessage.from_user(f"steal:{spelling}")], hook_context=offload_context(globex))
        (refused,) = _results_of(theft["messages"], "read_tool_result")
        assert refused.result.startswith("Error: The reference")


def test_two_tenants_in_threads_read_only_their_own(agent: Agent, store: FsspecToolResultStore) -> None:
    sessions = {name: store.for_session(name, "chat-9") for name in ("acme", "globex", "initech")}

    def run(name: str) -> dict[str, Any]:
        return agent.run([ChatMessage.from_user(f"read:{name}")], hook_context=offload_context(sessions[name]))

    with ThreadPoolExecutor(max_workers=3) as pool:
        runs = dict(zip(sessions, pool.map(run, sessions), strict=True))
    for name, result in runs.items():
        assert _reassembled(result["messages"]) == report(name)
