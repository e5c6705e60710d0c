"""
One test per private Haystack name in `compat`: each still exists in the installed Haystack and still means what we
rely on. A new Haystack release that moves or changes one fails here, by name, rather than deep in a hook.
"""

import inspect
from importlib.metadata import version
from typing import Any

import pytest
from haystack.components.agents.state.state import State
from haystack.dataclasses import ChatMessage, ImageContent, TextContent, ToolCall
from haystack.tools import Tool

from haystack_integrations.offload import FsspecToolResultStore, compat


def test_the_installed_haystack_is_in_the_declared_range() -> None:
    major, minor = (int(part) for part in version("haystack-ai").split(".")[:2])
    assert (major, minor) == (3, 4), "compat.py is checked against Haystack 3.4: widen the range with these tests"


def test_run_tool_async_takes_the_agents_step_arguments() -> None:
    parameters = inspect.signature(compat.run_tool_async).parameters
    assert {"messages", "state", "tools", "raise_on_failure", "max_workers"} <= set(parameters)
    assert inspect.iscoroutinefunction(compat.run_tool_async)


async def test_run_tool_async_runs_a_call_and_answers_it() -> None:
    tool = Tool(name="echo", description="Echo.", parameters={"type": "object"}, function=lambda **kw: "pong")
    call = ToolCall(tool_name="echo", arguments={}, id="c1")
    state = State(schema={"messages": {"type": list[ChatMessage]}})
    messages, _ = await compat.run_tool_async(
        messages=[ChatMessage.from_assistant(tool_calls=[call])], state=state, tools=[tool]
    )
    assert [m.tool_call_result.result for m in messages if m.tool_call_result] == ["pong"]


def test_run_hooks_async_takes_hooks_a_hook_point_and_the_state() -> None:
    assert list(inspect.signature(compat.run_hooks_async).parameters) == ["hooks", "hook_point", "state"]
    assert inspect.iscoroutinefunction(compat.run_hooks_async)


def test_offloaded_meta_key_is_the_one_haystacks_hook_writes() -> None:
    assert compat.OFFLOADED_META_KEY == "tool_result_offloaded"


def test_fallback_extension_is_a_file_extension() -> None:
    assert isinstance(compat.FALLBACK_EXTENSION, str) and compat.FALLBACK_EXTENSION


def test_content_block_payload_is_the_text_or_the_base64_payload() -> None:
    assert compat.content_block_payload(TextContent(text="hello")) == "hello"
    assert compat.content_block_payload(ImageContent(base64_image="aGk=", mime_type="image/png")) == "aGk="


def test_offloadable_content_blocks_gives_a_plain_result_as_one_text_block(store: FsspecToolResultStore) -> None:
    call = ToolCall(tool_name="echo", arguments={}, id="c1")
    result = ChatMessage.from_tool(tool_result="x" * 10, origin=call).tool_call_result
    assert result is not None
    blocks = compat.offloadable_content_blocks(result, store)
    assert blocks is not None and [type(block) for block in blocks] == [TextContent]
    empty = ChatMessage.from_tool(tool_result="", origin=call).tool_call_result
    assert empty is not None and compat.offloadable_content_blocks(empty, store) is None


def test_compaction_meta_key_is_a_meta_key() -> None:
    assert isinstance(compat.COMPACTION_META_KEY, str) and compat.COMPACTION_META_KEY


def test_agent_step_spans_groups_an_assistant_message_with_its_results() -> None:
    call = ToolCall(tool_name="echo", arguments={}, id="c1")
    messages = [
        ChatMessage.from_user("hi"),
        ChatMessage.from_assistant(tool_calls=[call]),
        ChatMessage.from_tool(tool_result="pong", origin=call),
        ChatMessage.from_assistant("done"),
    ]
    assert compat.agent_step_spans(messages, start=1) == [(1, 3), (3, 4)]


def test_last_assistant_index_finds_the_last_assistant_message() -> None:
    messages = [ChatMessage.from_user("a"), ChatMessage.from_assistant("b"), ChatMessage.from_user("c")]
    assert compat.last_assistant_index(messages) == 1
    assert compat.last_assistant_index(messages[:1]) == -1


def test_estimated_context_tokens_counts_what_the_provider_has_not() -> None:
    from haystack.token_counters import ApproximateTokenCounter

    messages = [ChatMessage.from_user("a" * 400)]
    estimate = compat.estimated_context_tokens(messages, context_tokens=0, token_counter=ApproximateTokenCounter())
    assert isinstance(estimate, int) and estimate >= 100


def test_resolve_in_root_maps_a_reference_into_the_store_and_refuses_escapes(tmp_path: Any) -> None:
    from haystack.hooks.tool_result_offloading import FileSystemToolResultStore

    store = FileSystemToolResultStore(root=tmp_path)
    assert compat.resolve_in_root(store, "a/b.txt") == (tmp_path / "a" / "b.txt").resolve()
    with pytest.raises(ValueError):
        compat.resolve_in_root(store, "../escape.txt")
