"""
What reading back costs on S3, measured from the HTTP traffic moto's server received (Range headers, body sizes).

A page is one ranged GET that moves about the page size, never the whole object; a search reads its first MiB alone,
then larger ranges ahead, and stops at its match bound; an image is one GET; nothing HEADs or LISTs on the way.
"""

import math
import uuid

import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import NeverOffload, OffloadOverChars, ToolResultOffloadHook
from read_back_helpers import FETCH, multilingual, read_all_pages_async, report, script, split_page, state_for, tiny_png

from haystack_integrations.offload import (
    FsspecToolResultStore,
    ReadToolResult,
    list_tool_results,
    offload_context,
    read_tool_result,
)
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RecordedRequest, RequestLog

pytestmark = pytest.mark.s3

PAGE = 10_000
MiB = 1 << 20


@pytest.fixture
def s3_session(s3_server: LocalS3Server) -> FsspecToolResultStore:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    root.warm_up()
    return root.for_session("acme", "chat-1")


def _gets(log: RequestLog) -> list[RecordedRequest]:
    requests = log.snapshot()
    assert {request.method for request in requests} <= {"GET"}, [str(request) for request in requests]
    assert all("list-type" not in request.query for request in requests)
    return requests


@pytest.fixture(scope="module")
def big_text() -> str:
    """About 4 MB of multilingual text: large enough that reading it whole per page would show in the traffic."""
    return multilingual(3_400_000, seed=11)


def test_each_page_is_one_ranged_get_of_the_page_size(
    s3_session: FsspecToolResultStore, s3_requests: RequestLog, big_text: str
) -> None:
    data = big_text.encode()
    reference = s3_session.write(key="1_fetch_call_1.txt", content=big_text)
    state = state_for(s3_session)
    for offset in (0, MiB, 2 * MiB + 1, len(data) - 4_000):
        s3_requests.clear()
        header, content = split_page(read_tool_result.invoke(state=state, reference=reference, offset=offset))
        (get,) = _gets(s3_requests)
        assert get.range == f"bytes={offset}-{offset + PAGE - 1}"
        assert get.bytes_sent == min(PAGE, len(data) - offset)
        assert len(content) <= PAGE
        # The page is the stored text at that position, cut on character boundaries only.
        start = int(header.split("this page: offset ")[1].split(" ")[0])
        assert content.encode() == data[start : start + len(content.encode())]
        assert f"{len(data)} bytes" in header


async def test_paging_a_whole_result_moves_its_size_once(
    s3_session: FsspecToolResultStore, s3_requests: RequestLog
) -> None:
    text = multilingual(250_000, seed=5)
    size = len(text.encode())
    reference = await s3_session.write_async(key="1_fetch_call_1.txt", content=text)
    s3_requests.clear()
    pages = await read_all_pages_async(read_tool_result, state_for(s3_session), reference)
    assert "".join(pages) == text
    gets = _gets(s3_requests)
    assert len(gets) == len(pages)
    # A page is up to 3 bytes short of PAGE when it stops before a character the range cut.
    assert math.ceil(size / PAGE) <= len(pages) <= math.ceil(size / (PAGE - 3))
    assert all(get.range is not None for get in gets)
    moved = sum(get.bytes_sent for get in gets)
    # Every byte once, plus at most 3 bytes per page: a character cut by a page edge is read again by the next page.
    assert size <= moved <= size + 3 * len(pages)
    assert max(get.bytes_sent for get in gets) == PAGE


def test_an_agent_paging_on_s3_sends_one_ranged_get_per_page(
    s3_session: FsspecToolResultStore, s3_requests: RequestLog
) -> None:
    hook = ToolResultOffloadHook(
        store=FsspecToolResultStore("memory://must-never-be-used"),
        offload_strategies={("read_tool_result", "list_tool_results"): NeverOffload(), "*": OffloadOverChars(1000)},
    )
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=[FETCH, read_tool_result, list_tool_results],
        hooks={"after_tool": [hook]},
        max_agent_steps=200,
    )
    s3_requests.clear()
    result = agent.run([ChatMessage.from_user("read:s3 traffic")], hook_context=offload_context(s3_session))
    pages = [
        message.tool_call_result
        for message in result["messages"]
        if message.tool_call_result is not None and message.tool_call_result.origin.tool_name == "read_tool_result"
    ]
    assert "".join(split_page(page.result)[1] for page in pages) == report("s3 traffic")
    requests = s3_requests.snapshot()
    assert [request.method for request in requests] == ["PUT"] + ["GET"] * len(pages)
    size = len(report("s3 traffic").encode())
    gets = requests[1:]
    assert all(get.range is not None and get.bytes_sent <= 2_500 for get in gets)  # the script's page size
    assert size <= sum(get.bytes_sent for get in gets) <= size + 3 * len(pages)


async def test_a_search_reads_ranged_chunks_and_stops_at_the_match_bound(
    s3_session: FsspecToolResultStore, s3_requests: RequestLog, big_text: str
) -> None:
    text = "needle at the start " + big_text
    size = len(text.encode())
    reference = await s3_session.write_async(key="k.txt", content=text)
    state = state_for(s3_session)

    s3_requests.clear()
    found = await read_tool_result.invoke_async(state=state, reference=reference, search="needle", max_matches=1)
    assert "1 match" in found.splitlines()[0]
    (get,) = _gets(s3_requests)
    assert (get.range, get.bytes_sent) == (f"bytes=0-{MiB - 1}", MiB)

    s3_requests.clear()
    missing = await read_tool_result.invoke_async(state=state, reference=reference, search="no such thing")
    assert "0 matches" in missing and "searched to the end" in missing
    gets = _gets(s3_requests)
    # The first MiB alone (it tells the size), then ranges read ahead growing from 2 MiB, never past the end; every
    # byte moves once (a chunk that stops before a character the range cut is served again from memory).
    assert sorted(get.range or "" for get in gets) == sorted(
        [f"bytes=0-{MiB - 1}", f"bytes={MiB}-{3 * MiB - 1}", f"bytes={3 * MiB}-{size - 1}"]
    )
    assert sum(get.bytes_sent for get in gets) == size

    s3_requests.clear()
    limited = ReadToolResult(max_scan_bytes=MiB)
    stopped = await limited.invoke_async(state=state, reference=reference, search="no such thing")
    assert "scan limit" in stopped
    assert len(_gets(s3_requests)) == 1


def test_an_image_is_one_get(s3_session: FsspecToolResultStore, s3_requests: RequestLog) -> None:
    png = tiny_png(32, 32)
    reference = s3_session.write(key="2_render_chart_call_1.png", content=png)
    s3_requests.clear()
    result = read_tool_result.invoke(state=state_for(s3_session), reference=reference)
    assert isinstance(result, list)
    (get,) = _gets(s3_requests)
    assert get.bytes_sent == len(png) and get.range is not None


def test_a_refused_reference_sends_nothing(s3_session: FsspecToolResultStore, s3_requests: RequestLog) -> None:
    s3_requests.clear()
    for hostile in ("../../globex/chat-1/x.txt", "s3://offload-results/globex/x", "/etc/passwd"):
        assert read_tool_result.invoke(state=state_for(s3_session), reference=hostile).startswith("Error: ")
    assert s3_requests.snapshot() == []
