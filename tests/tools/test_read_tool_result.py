"""
`read_tool_result` on every backend: pages, search, binary and images, refusals, and configuration.

The tool is called as the Agent calls it (`invoke` / `invoke_async` with the model's arguments and the run's State);
the end-to-end suite drives it from a real Agent.
"""

import base64
import copy
import re
from pathlib import Path

import pytest
from haystack.components.agents import Agent
from haystack.components.agents.state.state import State
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ImageContent, TextContent
from haystack.hooks.tool_result_offloading import FileSystemToolResultStore
from haystack.tools.errors import ToolInvocationError
from read_back_helpers import (
    multilingual,
    next_offset,
    read_all_pages,
    read_all_pages_async,
    split_page,
    state_for,
    tiny_png,
)

from haystack_integrations.offload import FsspecToolResultStore, ReadToolResult, read_tool_result

# Also on RGW with STS credentials and an SSE-C key per tenant (tests/conftest.py, "isolated").
pytestmark = pytest.mark.isolated

TEXT = multilingual(40_000, seed=7)


# Pages


@pytest.mark.parametrize("max_chars", [997, 10_000])
def test_pages_reassemble_the_exact_original(session: FsspecToolResultStore, max_chars: int) -> None:
    reference = session.write(key="1_fetch_call_1.txt", content=TEXT, tool_name="fetch")
    pages = read_all_pages(read_tool_result, state_for(session), reference, max_chars=max_chars)
    assert "".join(pages) == TEXT
    assert all(len(page) <= max_chars for page in pages)
    assert len(pages) >= len(TEXT.encode()) // max_chars


async def test_async_pages_reassemble_the_exact_original(session: FsspecToolResultStore) -> None:
    reference = await session.write_async(key="1_fetch_call_1.txt", content=TEXT)
    pages = await read_all_pages_async(read_tool_result, state_for(session), reference, max_chars=3_001)
    assert "".join(pages) == TEXT


def test_one_enormous_line_still_pages(session: FsspecToolResultStore) -> None:
    line = multilingual(25_000, seed=1, newlines=False)
    assert "\n" not in line
    reference = session.write(key="k.txt", content=line)
    pages = read_all_pages(read_tool_result, state_for(session), reference, max_chars=2_000)
    assert len(pages) > 10
    assert "".join(pages) == line


def test_the_header_tells_size_range_and_how_to_continue(session: FsspecToolResultStore) -> None:
    text = "a" * 25_000
    reference = session.write(key="k.txt", content=text)
    state = state_for(session)
    header, content = split_page(read_tool_result.invoke(state=state, reference=reference))
    assert content == "a" * 10_000
    assert "25000 bytes" in header
    assert "offset 0 to 10000" in header
    assert "10000 characters" in header
    assert next_offset(header) == 10_000
    header, content = split_page(read_tool_result.invoke(state=state, reference=reference, offset=20_000))
    assert content == "a" * 5_000
    assert "end of result" in header and next_offset(header) is None


def test_the_page_size_is_bounded_by_the_tool(session: FsspecToolResultStore) -> None:
    reference = session.write(key="k.txt", content="b" * 100)
    tool = ReadToolResult(page_chars=10, max_page_chars=20)
    _, content = split_page(tool.invoke(state=state_for(session), reference=reference))
    assert content == "b" * 10
    _, content = split_page(tool.invoke(state=state_for(session), reference=reference, max_chars=1_000_000))
    assert content == "b" * 20


def test_an_offset_inside_a_character_is_reported_and_nothing_is_corrupted(session: FsspecToolResultStore) -> None:
    reference = session.write(key="k.txt", content="ab🎉cd")
    header, content = split_page(read_tool_result.invoke(state=state_for(session), reference=reference, offset=3))
    assert content == "cd"
    assert "offset 3 is inside a character" in header


def test_empty_and_past_the_end(session: FsspecToolResultStore) -> None:
    state = state_for(session)
    empty = session.write(key="e.txt", content="")
    header, content = split_page(read_tool_result.invoke(state=state, reference=empty))
    assert (content, next_offset(header)) == ("", None)
    assert "empty" in header
    reference = session.write(key="k.txt", content="short")
    result = read_tool_result.invoke(state=state, reference=reference, offset=99)
    assert result.startswith("Error: offset=99 is past the end")
    header, content = split_page(read_tool_result.invoke(state=state, reference=reference, offset=5))
    assert content == "" and next_offset(header) is None


def test_a_reference_wrapped_in_quotes_is_accepted(session: FsspecToolResultStore) -> None:
    reference = session.write(key="k.txt", content="quoted")
    for spelled in (f"'{reference}'", f' "{reference}" ', f"`{reference}`"):
        assert split_page(read_tool_result.invoke(state=state_for(session), reference=spelled))[1] == "quoted"


# Search


def test_search_finds_text_with_offsets_and_context(session: FsspecToolResultStore) -> None:
    reference = session.write(key="k.txt", content=TEXT)
    result = read_tool_result.invoke(state=state_for(session), reference=reference, search="日本語", max_matches=5)
    lines = result.splitlines()
    assert lines[0].startswith("[search for text '日本語'")
    assert "5 matches" in lines[0] and "more may follow" in lines[0]
    data = TEXT.encode()
    expected = [len(TEXT[: m.start()].encode()) for m in re.finditer("日本語", TEXT)][:5]
    found = [int(re.match(r"offset (\d+): ", line).group(1)) for line in lines[1:6]]  # type: ignore[union-attr]
    assert found == expected
    for offset, line in zip(found, lines[1:6], strict=True):
        assert data[offset:].startswith("日本語".encode())
        assert "⟦日本語⟧" in line


def test_search_resumes_where_it_stopped_and_covers_every_match(session: FsspecToolResultStore) -> None:
    reference = session.write(key="k.txt", content=TEXT)
    state = state_for(session)
    offsets: list[int] = []
    offset = 0
    while True:
        result = read_tool_result.invoke(state=state, reference=reference, search="café", max_matches=7, offset=offset)
        header, *lines = result.splitlines()
        offsets += [int(line.split(":", 1)[0].removeprefix("offset ")) for line in lines if line.startswith("offset ")]
        resume = re.search(r"search again with offset=(\d+)", header)
        if resume is None:
            break
        offset = int(resume.group(1))
    assert offsets == [len(TEXT[: m.start()].encode()) for m in re.finditer("café", TEXT)]


def test_regex_and_ignore_case_search(session: FsspecToolResultStore) -> None:
    reference = session.write(key="k.txt", content="Alpha beta GAMMA\nalpha 42 Beta 7\n")
    state = state_for(session)
    result = read_tool_result.invoke(state=state, reference=reference, search=r"[a-z]+ \d+", regex=True)
    # Case-sensitive: "Beta 7" matches from its lower-case "eta".
    assert [line.split("⟦")[1].split("⟧")[0] for line in result.splitlines()[1:3]] == ["alpha 42", "eta 7"]
    result = read_tool_result.invoke(state=state, reference=reference, search="alpha", ignore_case=True)
    assert "2 matches" in result.splitlines()[0]
    result = read_tool_result.invoke(state=state, reference=reference, search="alpha")
    assert "1 match |" in result.splitlines()[0]
    assert read_tool_result.invoke(state=state, reference=reference, search="(", regex=True).startswith(
        "Error: Invalid regular expression"
    )
    result = read_tool_result.invoke(state=state, reference=reference, search="nowhere")
    assert "0 matches" in result and "searched to the end" in result


def test_a_catastrophic_regex_is_stopped_not_left_running(session: FsspecToolResultStore) -> None:
    reference = session.write(key="k.txt", content="a" * 5_000 + "!")
    tool = ReadToolResult(regex_timeout=0.05)
    result = tool.invoke(state=state_for(session), reference=reference, search="(a|aa)+c", regex=True)
    assert "took too long" in result.splitlines()[0]


# Binary and images


def test_an_image_comes_back_as_image_content(session: FsspecToolResultStore) -> None:
    png = tiny_png()
    # As Haystack's hook stores an ImageContent: the bytes, under a key ending in the MIME type's extension.
    reference = session.write(key="2_render_chart_call_7.png", content=png)
    result = read_tool_result.invoke(state=state_for(session), reference=reference)
    assert isinstance(result, list)
    text, image = result
    assert isinstance(text, TextContent) and "image/png" in text.text
    assert isinstance(image, ImageContent)
    assert image.mime_type == "image/png"
    assert base64.b64decode(image.base64_image) == png


async def test_an_image_under_an_unhelpful_key_is_recognised_by_its_bytes(session: FsspecToolResultStore) -> None:
    png = tiny_png(40, 40)
    reference = await session.write_async(key="2_blob_call_7.bin", content=png)
    result = await read_tool_result.invoke_async(state=state_for(session), reference=reference)
    assert isinstance(result, list)
    assert base64.b64decode(result[1].base64_image) == png


def test_images_too_large_or_switched_off_are_described(session: FsspecToolResultStore) -> None:
    png = tiny_png(64, 64)
    reference = session.write(key="k.png", content=png)
    small = ReadToolResult(max_image_bytes=len(png) - 1).invoke(state=state_for(session), reference=reference)
    assert isinstance(small, str)
    assert f"(image/png), {len(png)} bytes" in small and "too large" in small
    off = ReadToolResult(return_images=False).invoke(state=state_for(session), reference=reference)
    assert isinstance(off, str) and "image/png" in off and "not to return images" in off


def test_bytes_under_an_image_key_that_are_no_image_are_described(session: FsspecToolResultStore) -> None:
    reference = session.write(key="2_render_chart_call_7.png", content=b"\x00\x01 not a png at all")
    result = read_tool_result.invoke(state=state_for(session), reference=reference)
    assert isinstance(result, str)
    assert "stored as image/png, but its bytes are not an image" in result and "00 01 20 6e" in result


def test_other_binary_is_described_with_kind_size_and_a_preview(session: FsspecToolResultStore) -> None:
    blob = b"%PDF-1.7\n" + bytes(range(256)) * 40
    reference = session.write(key="3_report_call_1.pdf", content=blob)
    result = read_tool_result.invoke(state=state_for(session), reference=reference)
    assert isinstance(result, str)
    assert "application/pdf" in result and f"{len(blob)} bytes" in result
    assert "25 50 44 46" in result  # "%PDF" in hex
    assert read_tool_result.invoke(state=state_for(session), reference=reference, search="x").startswith(
        "Error: This result is binary data"
    )


def test_bytes_that_are_utf8_text_are_paged_as_text(session: FsspecToolResultStore) -> None:
    csv = ("name,city\n" + "".join(f"row{i},Zürich 東京\n" for i in range(3_000))).encode()
    reference = session.write(key="4_export_call_1.csv", content=csv)
    pages = read_all_pages(read_tool_result, state_for(session), reference, max_chars=4_096)
    assert "".join(pages).encode() == csv
    header, _ = split_page(read_tool_result.invoke(state=state_for(session), reference=reference))
    assert "text/csv" in header and "UTF-8 text" in header


# Refusals: nothing outside the run's own scope is ever read


def test_hostile_and_foreign_references_get_error_results(
    session: FsspecToolResultStore, store: FsspecToolResultStore
) -> None:
    confidential = "globex confidential quarterly numbers"
    foreign = store.for_session("globex", "chat-1").write(key="k.txt", content=confidential)
    sibling = store.for_session("acme", "chat-10").write(key="k.txt", content=confidential)
    state = state_for(session)
    hostile = [
        foreign,  # another tenant's reference, as is
        sibling,  # the same tenant's other session
        f"globex/chat-1/{foreign}",
        f"../../globex/chat-1/{foreign}",
        f"..%2F..%2Fglobex%2Fchat-1%2F{foreign}",
        f"/acme/chat-1/{foreign}",
        f"s3://offload-results/globex/chat-1/{foreign}",
        "file:///etc/passwd",
        "/etc/passwd",
        "C:\\Windows\\win.ini",
        "..",
        "x" * 5000,
        "",
        "   ",
    ]
    for reference in hostile:
        for result in (
            read_tool_result.invoke(state=state, reference=reference),
            read_tool_result.invoke(state=state, reference=reference, search="confidential"),
        ):
            assert isinstance(result, str) and result.startswith("Error: "), (reference, result)
            assert "quarterly" not in result


async def test_the_async_path_refuses_the_same_way(
    session: FsspecToolResultStore, store: FsspecToolResultStore
) -> None:
    foreign = await store.for_session("globex", "chat-1").write_async(key="k.txt", content="secret")
    result = await read_tool_result.invoke_async(state=state_for(session), reference=foreign)
    assert result.startswith("Error: No stored result")
    result = await read_tool_result.invoke_async(state=state_for(session), reference=f"../globex/chat-1/{foreign}")
    assert result.startswith("Error: The reference")


def test_without_a_store_the_model_gets_an_error_result() -> None:
    assert read_tool_result.invoke(reference="x").startswith("Error: No result store is available")
    empty_context = State(schema={"hook_context": {"type": dict}}, data={"hook_context": {}})
    assert read_tool_result.invoke(state=empty_context, reference="x").startswith("Error: No result store")


def test_the_run_store_wins_over_the_fallback_store(
    session: FsspecToolResultStore, store: FsspecToolResultStore
) -> None:
    fallback = store.for_session("fallback", "chat-1")
    in_fallback = fallback.write(key="k.txt", content="from the fallback")
    in_run = session.write(key="k.txt", content="from the run")
    tool = ReadToolResult(store=fallback)
    assert split_page(tool.invoke(state=state_for(session), reference=in_run))[1] == "from the run"
    assert tool.invoke(state=state_for(session), reference=in_fallback).startswith("Error: No stored result")
    assert split_page(tool.invoke(reference=in_fallback))[1] == "from the fallback"


def test_bad_arguments_get_an_error_result_that_names_them(session: FsspecToolResultStore) -> None:
    state = state_for(session)
    result = read_tool_result.invoke(state=state, reference="r", offset=-1, colour="blue")
    assert result.startswith("Error: Invalid arguments for read_tool_result")
    assert "offset" in result and "colour" in result
    assert read_tool_result.invoke(state=state).startswith("Error: Invalid arguments for read_tool_result: reference")


def test_raise_on_error_lets_haystack_apply_its_failure_policy(session: FsspecToolResultStore) -> None:
    tool = ReadToolResult(raise_on_error=True)
    with pytest.raises(ToolInvocationError, match="read_tool_result: The reference"):
        tool.invoke(state=state_for(session), reference="../x")
    reference = session.write(key="k.txt", content="fine")
    assert split_page(tool.invoke(state=state_for(session), reference=reference))[1] == "fine"


# Any Haystack ToolResultStore works, read whole


def test_haystacks_file_system_store_is_read_whole_and_paged(tmp_path: Path) -> None:
    fs_store = FileSystemToolResultStore(root=tmp_path / "results")
    reference = fs_store.write(key="1_fetch_call_1.txt", content=TEXT)
    pages = read_all_pages(read_tool_result, state_for(fs_store), reference, max_chars=5_000)
    assert "".join(pages) == TEXT
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    result = read_tool_result.invoke(state=state_for(fs_store), reference=str(outside))
    assert result.startswith("Error: ") and "secret" not in result and str(tmp_path) not in result


# Configuration and serialization


def test_construction_checks_its_limits() -> None:
    with pytest.raises(ValueError, match="page_chars"):
        ReadToolResult(page_chars=0)
    with pytest.raises(ValueError, match="must not exceed"):
        ReadToolResult(page_chars=100, max_page_chars=10)
    with pytest.raises(ValueError, match="context_chars"):
        ReadToolResult(context_chars=-1)


def test_the_model_sees_a_schema_without_state(session: FsspecToolResultStore) -> None:
    spec = read_tool_result.tool_spec
    assert spec["name"] == "read_tool_result"
    properties = spec["parameters"]["properties"]
    assert "state" not in properties
    assert set(properties) == set(ReadToolResult.arguments_model.model_fields)
    assert spec["parameters"]["required"] == ["reference"]


def test_serialization_round_trips_alone_and_inside_an_agent() -> None:
    tool = ReadToolResult(page_chars=500, max_matches=7, return_images=False)
    data = tool.to_dict()
    assert data["type"] == "haystack_integrations.offload.tools.read_tool_result.ReadToolResult"
    restored = ReadToolResult.from_dict(data)
    assert restored.to_dict() == data
    assert restored.tool_spec == tool.tool_spec

    agent = Agent(chat_generator=MockChatGenerator(responses="ok"), tools=[tool])
    again = Agent.from_dict(agent.to_dict())
    assert isinstance(again.tools[0], ReadToolResult)
    assert again.tools[0].to_dict() == data

    # A fallback store serializes with the tool.
    fallback = FsspecToolResultStore("memory://serialized").for_session("acme", "chat-1")
    restored_store = ReadToolResult.from_dict(ReadToolResult(store=fallback).to_dict()).store
    assert isinstance(restored_store, FsspecToolResultStore)
    assert (restored_store.url, restored_store.scope) == ("memory://serialized", ("acme", "chat-1"))


def test_a_deep_copy_keeps_the_configuration_and_shares_the_fallback_store(session: FsspecToolResultStore) -> None:
    session.warm_up()  # a live client (locks, a connection pool) cannot be deep-copied, and must not be
    tool = ReadToolResult(store=session, page_chars=7)
    clone = copy.deepcopy(tool)
    assert clone.store is session and clone.tool_spec == tool.tool_spec and clone is not tool
    reference = session.write(key="k.txt", content="0123456789")
    assert split_page(clone.invoke(reference=reference))[1] == "0123456"
