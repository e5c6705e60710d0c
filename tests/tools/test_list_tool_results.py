"""`list_tool_results` on every backend: this session's results only, newest first, bounded, with tool names."""

from pathlib import Path

import pytest
from haystack.components.agents.state.state import State
from haystack.hooks.tool_result_offloading import FileSystemToolResultStore
from haystack.tools import Tool
from read_back_helpers import state_for

from haystack_integrations.offload import FsspecToolResultStore, ListToolResults, list_tool_results, offload_context

# Also on RGW with STS credentials and an SSE-C key per tenant (tests/conftest.py, "isolated").
pytestmark = pytest.mark.isolated


def _tool(name: str) -> Tool:
    return Tool(name=name, description=name, parameters={"type": "object", "properties": {}}, function=lambda: "")


def _agent_state(store: FsspecToolResultStore, *tool_names: str) -> State:
    """A State as the Agent builds it: the run's store in hook_context and the run's tools under "tools"."""
    return State(
        schema={"hook_context": {"type": dict}, "tools": {"type": list}},
        data={"hook_context": offload_context(store), "tools": [_tool(name) for name in tool_names]},
    )


def test_lists_this_sessions_results_newest_first(session: FsspecToolResultStore, store: FsspecToolResultStore) -> None:
    references = [
        session.write(key=f"{step}_web_search_call_{step}.txt", content="x" * (100 * step), tool_name="web_search")
        for step in range(1, 4)
    ]
    store.for_session("acme", "chat-2").write(key="other.txt", content="other session")
    store.for_session("globex", "chat-1").write(key="other.txt", content="other tenant")
    result = list_tool_results.invoke(state=state_for(session))
    header, *lines = result.splitlines()
    assert header == "[3 stored results in this conversation, newest first]"
    assert [line.split(" | ")[0].removeprefix("- ") for line in lines] == references[::-1]
    assert lines[0].split(" | ")[1:3] == ["tool: web_search", "text, 300 bytes"]
    assert lines[0].split(" | ")[3].startswith("stored 20")


async def test_is_bounded_and_says_how_to_see_more(session: FsspecToolResultStore) -> None:
    for index in range(7):
        await session.write_async(key=f"{index}.txt", content=str(index), tool_name="calc")
    tool = ListToolResults(default_limit=3, max_limit=5)
    header, *lines = (await tool.invoke_async(state=state_for(session))).splitlines()
    # Counting them all would cost a walk of the session: the header says where the next page starts instead.
    after = lines[-1].split(" | ")[0].removeprefix("- ")
    assert (
        header
        == f"[showing the 3 newest stored results; older ones follow: pass after={after!r} (limit up to 5) to see them]"
    )
    assert len(lines) == 3
    assert len((await tool.invoke_async(state=state_for(session), limit=50)).splitlines()) == 1 + 5
    header, *rest = (await tool.invoke_async(state=state_for(session), after=after, limit=5)).splitlines()
    assert header == "[4 older stored results in this conversation, newest first]"
    assert len(rest) == 4


def test_tool_names_recorded_inferred_or_unknown(session: FsspecToolResultStore) -> None:
    session.write(key="1_web_search_call_a.txt", content="a", tool_name="web_search")
    # Haystack's stock hook passes only a key: "{step}_{tool_name}_{call_id}.{ext}".
    session.write(key="2_web_search_pro_call_b.txt", content="b")
    session.write(key="3_gone_tool_call_c.txt", content="c")
    state = _agent_state(session, "web_search", "web_search_pro", "read_tool_result")
    lines = list_tool_results.invoke(state=state).splitlines()[1:]
    assert lines[0].split(" | ")[1] == "tool: not recorded (key 3_gone_tool_call_c.txt)"
    # Both "web_search" and "web_search_pro" fit the key; the longer one is the tool.
    assert lines[1].split(" | ")[1] == "tool: web_search_pro (inferred from key)"
    assert lines[2].split(" | ")[1] == "tool: web_search"
    only = list_tool_results.invoke(state=state, tool_name="web_search_pro").splitlines()
    assert only[0] == "[1 stored result of tool 'web_search_pro' in this conversation, newest first]"


def test_empty_session_and_errors(session: FsspecToolResultStore, tmp_path: Path) -> None:
    assert list_tool_results.invoke(state=state_for(session)) == "[no stored results in this conversation]"
    assert list_tool_results.invoke().startswith("Error: No result store is available")
    assert list_tool_results.invoke(state=state_for(session), limit=0).startswith("Error: Invalid arguments")
    # Haystack's own file-system store cannot list: the model is told, the run goes on.
    plain = FileSystemToolResultStore(root=tmp_path)
    assert list_tool_results.invoke(state=state_for(plain)).startswith("Error: This conversation's result store cannot")


def test_serialization_round_trips() -> None:
    tool = ListToolResults(default_limit=5, max_limit=10)
    restored = ListToolResults.from_dict(tool.to_dict())
    assert restored.to_dict() == tool.to_dict()
    assert restored.tool_spec == tool.tool_spec
    assert "state" not in tool.tool_spec["parameters"]["properties"]
