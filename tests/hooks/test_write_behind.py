"""
`OffloadHook(write_behind=True)`: the run goes on while results upload, and still loses none.

Timing is observed only where it is the behaviour itself (the next step starts before a slow upload has answered),
with a latency far larger than the margin asserted; the write-through hook runs the same test and must fail it.
"""

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks.tool_result_offloading import AlwaysOffload
from haystack.tools import Tool
from hook_scripts import OFFLOADED, make_agent, page, references, tool_results

from haystack_integrations.offload import FsspecToolResultStore, OffloadHook, offload_context
from haystack_integrations.offload.stores.quotas import Quota
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from haystack_integrations.offload.testing.relay import LatencyProxy
from haystack_integrations.offload.tools import ReadToolResult

PLAN = "acme: fetch+notes, fetch, notes"
# What PLAN's tools return, in conversation order.
ORIGINALS = [
    page("acme step 0 call 0"),
    page("acme step 0 call 1", lines=40),
    page("acme step 1 call 0"),
    page("acme step 2 call 0", lines=40),
]
# How long the proxy holds each S3 answer back: far above a scripted step's few milliseconds.
SLOW = 0.6


def behind_hooks(**kwargs: Any) -> dict[str, list[Any]]:
    hook = OffloadHook({"fetch": AlwaysOffload(), "notes": AlwaysOffload()}, write_behind=True, **kwargs)
    return {"after_tool": [hook], "after_run": [hook]}


def _fetch_tool(function: Any) -> Tool:
    return Tool(
        name="fetch",
        description="Fetch a page.",
        parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        function=function,
    )


def s3_root(server: LocalS3Server, endpoint_url: str | None = None) -> FsspecToolResultStore:
    options = server.storage_options()
    if endpoint_url is not None:
        options["endpoint_url"] = endpoint_url
    return FsspecToolResultStore(f"{server.bucket_url}/{uuid.uuid4().hex}", storage_options=options)


@pytest.mark.s3
async def test_every_result_is_stored_when_the_run_returns(s3_server: LocalS3Server, s3_requests: RequestLog) -> None:
    root = s3_root(s3_server)
    result = await make_agent(behind_hooks()).run_async(
        [ChatMessage.from_user(PLAN)], hook_context=offload_context(root.for_session("acme", "chat-1"))
    )

    assert result["messages"][-1].text == "acme: finished after 3 steps"
    assert all(OFFLOADED in message.meta for message in tool_results(result))
    assert s3_requests.count(method="PUT") == 4  # one per result, as when writing through
    # A store that shares nothing with the run's (no in-flight table to wait on) reads every result at once.
    fresh = FsspecToolResultStore(root.url, storage_options=s3_server.storage_options()).for_session("acme", "chat-1")
    assert [fresh.read(reference) for reference in references(result)] == ORIGINALS


@pytest.mark.s3
@pytest.mark.parametrize("write_behind", [True, False], ids=["write-behind", "write-through"])
async def test_the_next_step_does_not_wait_for_the_upload(s3_server: LocalS3Server, write_behind: bool) -> None:
    called_at: list[float] = []

    def fetch(query: str) -> str:
        called_at.append(time.monotonic())
        return page(query)

    hook = OffloadHook({"fetch": AlwaysOffload()}, write_behind=write_behind)
    agent = make_agent({"after_tool": [hook], "after_run": [hook]}, tools=[_fetch_tool(fetch)])
    with LatencyProxy(s3_server.endpoint_url, latency=SLOW) as proxy:
        root = s3_root(s3_server, proxy.endpoint_url)
        await root.warm_up_async()
        started = time.monotonic()
        result = await agent.run_async(
            [ChatMessage.from_user("slow: fetch, fetch, fetch")],
            hook_context=offload_context(root.for_session("slow", "chat")),
        )
        elapsed = time.monotonic() - started
        puts = [request.at for request in proxy.requests.snapshot() if request.method == "PUT"]

    # Each upload is answered SLOW seconds after its PUT reached the proxy, at the earliest. Ordered against that, not
    # against a fixed gap, so a busy machine (CI runs tests in parallel) cannot fail the test by running slowly.
    assert len(called_at) == 3 and len(puts) == 3
    answered_earliest = [at + SLOW for at in sorted(puts)]
    if write_behind:
        # Each step started before the previous step's upload could have been answered.
        assert all(called_at[i + 1] < answered_earliest[i] for i in range(2)), (called_at, answered_earliest)
        assert elapsed >= SLOW  # and the run still waited for its uploads before returning
    else:
        assert all(called_at[i + 1] >= answered_earliest[i] for i in range(2)), (called_at, answered_earliest)
    assert len(references(result)) == 3


@pytest.mark.s3
async def test_reading_a_result_still_uploading_waits_for_it(s3_server: LocalS3Server) -> None:
    def script(messages: list[ChatMessage]) -> ChatMessage:
        last = messages[-1]
        if last.is_from(ChatRole.USER):
            return ChatMessage.from_assistant(
                tool_calls=[ToolCall(tool_name="fetch", arguments={"query": "early"}, id="call_fetch")]
            )
        if last.tool_call_result is not None and last.tool_call_result.origin.tool_name == "fetch":
            # Ask for the result back in the very next step, while its PUT is still held by the proxy.
            reference = last.meta[OFFLOADED][0]
            return ChatMessage.from_assistant(
                tool_calls=[ToolCall(tool_name="read_tool_result", arguments={"reference": reference}, id="call_read")]
            )
        return ChatMessage.from_assistant("done")

    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=[_fetch_tool(lambda query: page(query, lines=40)), ReadToolResult()],
        hooks=behind_hooks(),  # type: ignore[arg-type]
    )
    agent.warm_up()
    with LatencyProxy(s3_server.endpoint_url, latency=SLOW) as proxy:
        root = s3_root(s3_server, proxy.endpoint_url)
        result = await agent.run_async(
            [ChatMessage.from_user("read it back")], hook_context=offload_context(root.for_session("t", "s"))
        )

    read_back = tool_results(result)[-1].tool_call_result
    assert read_back is not None and not read_back.error
    assert page("early", lines=40)[:500] in str(read_back.result)


async def test_failed_uploads_put_every_result_back(
    failing_store: FsspecToolResultStore, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        result = await make_agent(behind_hooks()).run_async(
            [ChatMessage.from_user(PLAN)], hook_context=offload_context(failing_store)
        )

    assert result["messages"][-1].text == "acme: finished after 3 steps"
    results = tool_results(result)
    assert [message.tool_call_result.result for message in results] == ORIGINALS  # type: ignore[union-attr]
    assert all(OFFLOADED not in message.meta for message in results)
    put_back = [record for record in caplog.records if "putting the result back" in record.getMessage()]
    assert len(put_back) == 4
    assert all(record.exc_info for record in put_back)


async def test_a_result_over_quota_stays_and_nothing_is_sent(tmp_path: Path) -> None:
    root = FsspecToolResultStore(str(tmp_path / "results"), quota=Quota(session_results=1))
    session = root.for_session("acme", "chat-1")
    result = await make_agent(behind_hooks()).run_async(
        [ChatMessage.from_user(PLAN)], hook_context=offload_context(session)
    )

    results = tool_results(result)
    offloaded = [message for message in results if OFFLOADED in message.meta]
    assert len(offloaded) == 1  # the first result fits the quota; the rest were refused before any byte was sent
    kept = [message.tool_call_result.result for message in results if OFFLOADED not in message.meta]  # type: ignore[union-attr]
    assert kept == ORIGINALS[1:]
    assert [record.reference for record in session.list()] == offloaded[0].meta[OFFLOADED]


def test_sync_runs_write_through(tmp_path: Path) -> None:
    session = FsspecToolResultStore(str(tmp_path / "results")).for_session("acme", "chat-1")
    result = make_agent(behind_hooks()).run([ChatMessage.from_user(PLAN)], hook_context=offload_context(session))

    assert [session.read(reference) for reference in references(result)] == ORIGINALS


async def test_a_store_without_begin_write_writes_through() -> None:
    from hook_scripts import RecordingStore

    store = RecordingStore()
    result = await make_agent(behind_hooks()).run_async(
        [ChatMessage.from_user(PLAN)], hook_context=offload_context(store)
    )

    assert [store.read(reference) for reference in references(result)] == ORIGINALS


def test_write_behind_round_trips_and_is_checked() -> None:
    hook = behind_hooks(preview_chars=50)["after_tool"][0]
    agent = Agent(
        chat_generator=MockChatGenerator(responses=["done"]), hooks={"after_tool": [hook], "after_run": [hook]}
    )
    data = agent.to_dict()
    json.dumps(data)
    restored = Agent.from_dict(data)
    for point in ("after_tool", "after_run"):
        (restored_hook,) = restored.hooks[point]
        assert isinstance(restored_hook, OffloadHook)
        assert restored_hook.write_behind is True and restored_hook.preview_chars == 50
    assert "write_behind=True" in repr(hook)
    with pytest.raises(TypeError, match="write_behind must be a bool"):
        OffloadHook({"*": AlwaysOffload()}, write_behind="yes")  # type: ignore[arg-type]
