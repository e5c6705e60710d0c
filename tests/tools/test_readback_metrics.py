"""
What the read-back tools count (``offload.readback.calls``, ``offload.readback.bytes``), checked against what the store
really served: the byte ranges each page asked of a result whose length is known, and on S3 moto's request log.
"""

from collections.abc import Iterator
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import AlwaysOffload, OffloadOverChars
from read_back_helpers import CHART, CHART_TOOL, FETCH, PAGE_CHARS, report, script

from haystack_integrations.offload import (
    FsspecToolResultStore,
    OffloadHook,
    list_tool_results,
    metrics,
    offload_context,
    read_tool_result,
)
from haystack_integrations.offload.testing.local_s3 import RequestLog
from metric_readings import MetricReadings

CALLS = "offload.readback.calls"
BYTES = "offload.readback.bytes"


@pytest.fixture
def agent() -> Agent:
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=[FETCH, CHART_TOOL, read_tool_result, list_tool_results],
        hooks={"after_tool": [OffloadHook({"render_chart": AlwaysOffload(), "*": OffloadOverChars(1000)})]},
        max_agent_steps=200,
    )
    agent.warm_up()
    return agent


@pytest.fixture
def s3_log(request: pytest.FixtureRequest, session: FsspecToolResultStore) -> RequestLog | None:
    """Moto's request log on the s3 backend (emptied now), None on the others."""
    return request.getfixturevalue("s3_requests") if session.url.startswith("s3://") else None


async def run(mode: str, agent: Agent, store: Any, command: str) -> list[ChatMessage]:
    messages = [ChatMessage.from_user(command)]
    if mode == "sync":
        result = agent.run(messages, hook_context=offload_context(store))
    else:
        result = await agent.run_async(messages, hook_context=offload_context(store))
    return list(result["messages"])


def read_calls(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The arguments of each `read_tool_result` call the model made."""
    return [
        call.arguments for message in messages for call in message.tool_calls if call.tool_name == "read_tool_result"
    ]


def ranged_gets_bytes(log: RequestLog) -> list[int]:
    """The bytes moto sent for each ranged GET: the page reads (the hook's write is a PUT)."""
    return [request.bytes_sent for request in log.filter(method="GET") if request.range is not None]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_each_page_counts_the_bytes_the_store_served_for_it(
    mode: str, agent: Agent, session: FsspecToolResultStore, s3_log: RequestLog | None, metric_readings: MetricReadings
) -> None:
    messages = await run(mode, agent, session, "read:q3 revenue")

    total = len(report("q3 revenue").encode())
    # A page of PAGE_CHARS characters asks for PAGE_CHARS bytes from its offset, cut at the end of the result.
    served = [min(call["offset"] + PAGE_CHARS, total) - call["offset"] for call in read_calls(messages)]
    assert len(served) > 10
    assert metric_readings.added(CALLS, offload__kind="page") == len(served)
    assert metric_readings.added(BYTES, offload__kind="page") == sum(served)
    if s3_log is not None:
        assert ranged_gets_bytes(s3_log) == served
    assert metric_readings.added(CALLS) == len(served)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_search_counts_the_bytes_it_scanned(
    mode: str, agent: Agent, session: FsspecToolResultStore, s3_log: RequestLog | None, metric_readings: MetricReadings
) -> None:
    messages = await run(mode, agent, session, "search:churn")

    assert len(read_calls(messages)) == 1
    # The report is far below one search chunk: the search scanned all of it, in one range.
    total = len(report("churn").encode())
    assert metric_readings.added(CALLS, offload__kind="search") == 1
    assert metric_readings.added(BYTES, offload__kind="search") == total
    if s3_log is not None:
        assert ranged_gets_bytes(s3_log) == [total]


async def test_an_image_counts_as_binary_with_its_bytes(
    agent: Agent, session: FsspecToolResultStore, metric_readings: MetricReadings
) -> None:
    await run("async", agent, session, "chart:")

    assert metric_readings.added(CALLS, offload__kind="binary") == 1
    assert metric_readings.added(BYTES, offload__kind="binary") == len(CHART)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_listing_counts_once_and_reads_no_bytes(
    mode: str, agent: Agent, session: FsspecToolResultStore, metric_readings: MetricReadings
) -> None:
    messages = await run(mode, agent, session, "list:hiring")

    listings = [message for message in messages if message.tool_call_result is not None]
    assert [message.tool_call_result.origin.tool_name for message in listings][-1] == "list_tool_results"  # type: ignore[union-attr]
    assert metric_readings.added(CALLS, offload__kind="list") == 1
    assert metric_readings.added(BYTES) == 0
    assert metric_readings.added(CALLS) == 1


async def test_a_failed_call_counts_nothing(
    agent: Agent, store: FsspecToolResultStore, metric_readings: MetricReadings
) -> None:
    acme = store.for_session("acme", "chat-1")
    reference = await acme.write_async(
        key="1_fetch_report_call_1.txt", content=report("acme only"), tool_name="fetch_report"
    )
    messages = await run("async", agent, store.for_session("globex", "chat-1"), f"steal:{reference}")

    (refused,) = [message.tool_call_result for message in messages if message.tool_call_result is not None]
    assert str(refused.result).startswith("Error:")
    assert metric_readings.added(CALLS) == 0
    assert metric_readings.added(BYTES) == 0


@pytest.fixture
def labelled_tenants() -> Iterator[None]:
    """Label acme's series with its tenant for one test; labelling is process-wide, so it is turned off after."""
    metrics.label_tenants(["acme"])
    yield
    metrics.label_tenants([])


async def test_only_a_listed_tenant_is_labelled(
    agent: Agent, store: FsspecToolResultStore, labelled_tenants: None, metric_readings: MetricReadings
) -> None:
    await run("async", agent, store.for_session("acme", "chat-1"), "list:a")
    await run("async", agent, store.for_session("globex", "chat-1"), "list:b")

    assert metric_readings.added(CALLS, offload__kind="list", offload__tenant="acme") == 1
    assert metric_readings.added(CALLS, offload__kind="list") == 2
    assert {frozenset(series) for series in metric_readings.series(CALLS)} == {
        frozenset({"offload.kind"}),
        frozenset({"offload.kind", "offload.tenant"}),
    }
