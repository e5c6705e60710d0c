"""A store whose writes really fail: every result stays in the conversation, and the run completes."""

import logging
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from haystack.hooks.compaction import ToolResultPruningCompactor
from haystack.hooks.tool_result_offloading import AlwaysOffload
from hook_scripts import ALLOW_EXPERIMENTAL, COMPACTED, OFFLOADED, make_agent, page, tool_results

from haystack_integrations.offload import FsspecToolResultStore, OffloadCompactionHook, OffloadHook, offload_context
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog


@ALLOW_EXPERIMENTAL
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_results_stay_in_context_and_the_run_completes(
    failing_store: FsspecToolResultStore, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent(
        {
            "after_tool": [OffloadHook({"*": AlwaysOffload()})],
            # Offloading cannot free anything, so the chained pruning compactor does the compacting instead.
            "before_llm": [OffloadCompactionHook(context_window=6000, chain=[ToolResultPruningCompactor()])],
        }
    )
    messages = [ChatMessage.from_user("acme: fetch+notes, notes, notes")]
    with caplog.at_level(logging.WARNING):
        if mode == "sync":
            result = agent.run(messages, hook_context=offload_context(failing_store))
        else:
            result = await agent.run_async(messages, hook_context=offload_context(failing_store))

    assert result["messages"][-1].text == "acme: finished after 3 steps"
    results = tool_results(result)
    assert all(OFFLOADED not in message.meta for message in results)
    originals = [page("acme step 0 call 0"), page("acme step 0 call 1", lines=40)]
    originals += [page(f"acme step {step} call 0", lines=40) for step in (1, 2)]
    pruned = [COMPACTED in message.meta for message in results]
    for message, original, was_pruned in zip(results, originals, pruned, strict=True):
        content = message.tool_call_result.result  # type: ignore[union-attr]
        assert content.startswith("[Tool result removed") if was_pruned else content == original
    assert any(pruned)
    assert not pruned[-1]  # the latest step stays whole
    assert {message.meta[COMPACTED]["strategy"] for message in results if COMPACTED in message.meta} == {
        "tool_result_pruning"
    }
    failures = [record for record in caplog.records if "leaving the result in context" in record.getMessage()]
    assert len(failures) >= 4  # every after_tool write, plus compaction's attempts
    assert all(record.exc_info for record in failures)


@pytest.mark.s3
async def test_a_failed_s3_write_is_tried_once(s3_server: LocalS3Server, s3_requests: RequestLog) -> None:
    store = FsspecToolResultStore("s3://no-such-bucket-either/x", storage_options=s3_server.storage_options())
    agent = make_agent({"after_tool": [OffloadHook({"fetch": AlwaysOffload()})]})
    s3_requests.clear()
    result: dict[str, Any] = await agent.run_async(
        [ChatMessage.from_user("once: fetch")], hook_context=offload_context(store.for_session("t", "s"))
    )
    assert result["messages"][-1].text == "once: finished after 1 steps"
    assert [(request.method, request.status) for request in s3_requests] == [("PUT", 404)]
