"""
`OffloadHook` as a drop-in for Haystack's `ToolResultOffloadHook`: Haystack's argument order, the same tracing.

Each check builds Haystack's hook and ours with the same line, apart from the class name, and compares them.
"""

from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import AlwaysOffload, NeverOffload, OffloadOverChars, ToolResultOffloadHook
from haystack.hooks.tool_result_offloading.types import OffloadPolicy
from hook_scripts import OFFLOADED, RecordingStore, make_agent, make_state, tool_results, tool_step
from tracing_spy import RecordingTracer

from haystack_integrations.offload import FsspecToolResultStore, OffloadHook, offload_context

STRATEGIES: dict[str | tuple[str, ...], OffloadPolicy] = {"fetch": OffloadOverChars(4000), "clock": NeverOffload()}


def _pointers(hook: Any, store: RecordingStore) -> list[ChatMessage]:
    """Run `hook` on one step with a big and a small result; the run brings no store, so the hook's own is used."""
    state = make_state([ChatMessage.from_user("go"), *tool_step(("fetch", "f" * 5000), ("clock", "12:00"))])
    hook.run(state)
    return list(state.data["messages"])


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda cls, store: cls(store, STRATEGIES), id="(store, strategies)"),
        pytest.param(lambda cls, store: cls(store, STRATEGIES, preview_chars=20), id="(store, strategies, preview)"),
        pytest.param(lambda cls, store: cls(store, offload_strategies=STRATEGIES), id="(store, offload_strategies=)"),
        pytest.param(lambda cls, store: cls(store=store, offload_strategies=STRATEGIES), id="keywords"),
    ],
)
def test_haystacks_calls_build_the_same_hook(build: Any) -> None:
    stock_store, our_store = RecordingStore(), RecordingStore()
    stock, ours = build(ToolResultOffloadHook, stock_store), build(OffloadHook, our_store)
    assert ours.store is our_store
    assert ours.offload_strategies == stock.offload_strategies
    assert ours.preview_chars == stock.preview_chars
    assert _pointers(ours, our_store) == _pointers(stock, stock_store)
    assert list(our_store.written.values()) == ["f" * 5000]


def test_our_own_order_still_works() -> None:
    store = RecordingStore()
    for hook in (
        OffloadHook(STRATEGIES),
        OffloadHook(STRATEGIES, store=store),
        OffloadHook(offload_strategies=STRATEGIES),
        OffloadHook(STRATEGIES, preview_chars=10, write_behind=True),
    ):
        assert hook.offload_strategies == STRATEGIES
    assert OffloadHook(STRATEGIES, store=store).store is store
    assert OffloadHook(STRATEGIES).to_dict() == OffloadHook(None, STRATEGIES).to_dict()


def test_either_order_serializes_alike() -> None:
    store = FsspecToolResultStore("memory://either-order")
    ours_first = OffloadHook(STRATEGIES, store=store, preview_chars=50).to_dict()
    haystack_first = OffloadHook(store, STRATEGIES, preview_chars=50).to_dict()
    assert haystack_first == ours_first
    restored = OffloadHook.from_dict(haystack_first)
    assert isinstance(restored.store, FsspecToolResultStore) and restored.store.url == "memory://either-order"


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((STRATEGIES, RecordingStore()), {}, r"Haystack's order, \(store, offload_strategies\)"),
        ((RecordingStore(),), {"store": RecordingStore()}, "two stores"),
        ((RecordingStore(), STRATEGIES), {"store": RecordingStore()}, "two stores"),
        ((STRATEGIES,), {"offload_strategies": STRATEGIES}, "offload_strategies twice"),
        ((RecordingStore(), STRATEGIES), {"offload_strategies": STRATEGIES}, "offload_strategies twice"),
        ((RecordingStore(),), {}, "needs offload_strategies"),
        ((), {}, "needs offload_strategies"),
        ((RecordingStore(), STRATEGIES, 200), {}, "at most 2 positional arguments"),
        (("s3://bucket/prefix",), {}, "must be a dict"),
        ((RecordingStore(), [("fetch", AlwaysOffload())]), {}, "must be a dict"),
        (("s3://bucket/prefix", STRATEGIES), {}, "must be a ToolResultStore"),
    ],
)
def test_mixed_up_arguments_get_a_clear_type_error(args: tuple[Any, ...], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        OffloadHook(*args, **kwargs)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_agent_traces_our_hook_as_it_traces_haystacks(recording_tracer: RecordingTracer, mode: str) -> None:
    # Haystack's offload hook sets no tags of its own: each call is traced by the Agent's hook span. Ours, the same.
    traced: list[list[dict[str, Any]]] = []
    for hook_class in (ToolResultOffloadHook, OffloadHook):
        recording_tracer.spans.clear()
        store = FsspecToolResultStore("memory://traced").for_session("acme", f"{mode}-{hook_class.__name__}")
        agent = make_agent({"after_tool": [hook_class(store, {"fetch": AlwaysOffload()})]})
        messages = [ChatMessage.from_user("p: fetch, notes+fetch")]
        if mode == "sync":
            result = agent.run(messages, hook_context=offload_context(store))
        else:
            result = await agent.run_async(messages, hook_context=offload_context(store))
        assert sum(OFFLOADED in message.meta for message in tool_results(result)) == 2
        spans = recording_tracer.hook_spans("after_tool")
        assert len(spans) == 2  # one per tool step
        assert all(span.parent is not None and span.parent.operation_name == "haystack.agent.step" for span in spans)
        traced.append([span.tags for span in spans])
    stock, ours = traced
    for stock_tags, our_tags in zip(stock, ours, strict=True):
        assert set(our_tags) == set(stock_tags)
        assert our_tags["haystack.agent.hook.point"] == stock_tags["haystack.agent.hook.point"] == "after_tool"
        assert our_tags["haystack.agent.hook.name"] == "OffloadHook"
        assert our_tags["haystack.agent.hook.type"] == "haystack_integrations.offload.hooks.offload.OffloadHook"


async def test_write_behind_is_traced_at_both_hook_points(recording_tracer: RecordingTracer) -> None:
    store = FsspecToolResultStore("memory://traced-behind").for_session("acme", "chat-1")
    hook = OffloadHook({"fetch": AlwaysOffload()}, write_behind=True)
    agent = make_agent({"after_tool": [hook], "after_run": [hook]})
    await agent.run_async([ChatMessage.from_user("p: fetch")], hook_context=offload_context(store))
    assert [span.tags["haystack.agent.hook.point"] for span in recording_tracer.hook_spans()] == [
        "after_tool",
        "after_run",
    ]
