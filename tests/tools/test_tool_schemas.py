"""
What the read-back tools' schemas cost the model on every call, and that their short descriptions stay true.

The schemas go out with every model call of every step, so they are kept to what the tools' own output does not say.
Sizes are Haystack's `ApproximateTokenCounter` estimate (4 characters a token of the rendered JSON schema), the same
estimate `CompactionHook` sizes tool schemas with; benchmarks/README.md records the before and after.
"""

import re

from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks.tool_result_offloading import AlwaysOffload
from haystack.token_counters import ApproximateTokenCounter
from read_back_helpers import split_page, state_for

from haystack_integrations.offload import (
    FsspecToolResultStore,
    ListToolResults,
    OffloadHook,
    ReadToolResult,
    list_tool_results,
    offload_context,
    read_tool_result,
)

COUNTER = ApproximateTokenCounter()


def _tokens(*tools: object) -> int:
    return COUNTER.count(messages=[], tools=list(tools))  # type: ignore[arg-type]


def test_the_schemas_stay_within_their_budget() -> None:
    # Before the descriptions were shortened: 448 + 130 = 579 tokens per model call.
    assert _tokens(read_tool_result) <= 140
    assert _tokens(list_tool_results) <= 65
    assert _tokens(read_tool_result, list_tool_results) <= 200


def test_configured_limits_do_not_grow_the_schema() -> None:
    # Limits are enforced (clamped or explained) by the tool, so a configured tool costs what the default one does.
    configured = ReadToolResult(page_chars=500, max_page_chars=1000, max_matches=5, context_chars=10)
    assert configured.tool_spec == read_tool_result.tool_spec
    assert ListToolResults(default_limit=3, max_limit=7).tool_spec == list_tool_results.tool_spec


def test_every_argument_the_tools_accept_is_in_their_schema_with_its_type() -> None:
    assert read_tool_result.tool_spec["parameters"] == {
        "type": "object",
        "properties": {
            "reference": {"type": "string"},
            "offset": {"type": "integer"},
            "max_chars": {"type": "integer"},
            "search": {"type": "string"},
            "regex": {"type": "boolean"},
            "ignore_case": {"type": "boolean"},
            "max_matches": {"type": "integer"},
        },
        "required": ["reference"],
    }
    assert set(read_tool_result.tool_spec["parameters"]["properties"]) == set(
        ReadToolResult.arguments_model.model_fields
    )
    assert set(list_tool_results.tool_spec["parameters"]["properties"]) == set(
        ListToolResults.arguments_model.model_fields
    )


def test_what_the_descriptions_leave_out_the_output_says() -> None:
    store = FsspecToolResultStore("memory://schemas").for_session("acme", "chat-1")
    text = "".join(f"line {i} of the report\n" for i in range(2_000))  # ~46,000 characters: several pages
    # The description points at the pointer's "... at '<reference>'": a pointer our hook leaves has exactly that.
    assert "at '<reference>'" in read_tool_result.description
    hook = OffloadHook({"*": AlwaysOffload()})
    state = _step_state(store, text)
    hook.run(state)
    pointer = state.data["messages"][-1].tool_call_result
    reference = re.search(r" at '([^']+)'", str(pointer.result))
    assert reference is not None
    reference_text, run_state = reference.group(1), state_for(store)

    # "its first line says where the next starts": follow it to the end, knowing nothing else.
    pages, offset = [], 0
    while True:
        header, content = split_page(
            read_tool_result.invoke(reference=reference.group(1), offset=offset, state=run_state)
        )
        pages.append(content)
        following = re.search(r"call read_tool_result again with offset=(\d+)", header)
        if following is None:
            assert "end of result" in header
            break
        offset = int(following.group(1))
    assert "".join(pages) == text and len(pages) > 1

    # "Set search to find text instead": matches come with their offsets and how to read there.
    found = read_tool_result.invoke(reference=reference_text, search="line 1500 ", state=run_state)
    assert re.search(r"^offset \d+: ", found, re.MULTILINE)
    assert "read the page at a match with read_tool_result and that offset" in found

    # list_tool_results "with their references": the one to pass on.
    assert reference_text in list_tool_results.invoke(state=run_state)


def _step_state(store: FsspecToolResultStore, text: str) -> State:
    """The State after a step whose one tool returned `text`, as an ``after_tool`` hook sees it."""
    call = ToolCall(tool_name="fetch", arguments={}, id="call_1")
    messages = [ChatMessage.from_assistant(tool_calls=[call]), ChatMessage.from_tool(tool_result=text, origin=call)]
    return State(
        schema={"hook_context": {"type": dict, "handler": replace_values}, "step_count": {"type": int}},
        data={"messages": messages, "hook_context": offload_context(store), "step_count": 1},
    )
