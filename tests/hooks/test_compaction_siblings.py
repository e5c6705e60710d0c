"""
`OffloadCompactionHook` as a drop-in for Haystack's `CompactionHook`: same compactor slot, trigger, target, warning,
tracing tags and serialization; offloading into the run's store as an option; shared-store compactors refused.

Parity is checked against Haystack's own `CompactionHook`, run side by side on the same input, rather than against
numbers written down here.
"""

import logging
from collections.abc import Callable
from typing import Any

import pytest
from haystack import tracing
from haystack.components.agents import Agent
from haystack.components.agents.state.state import State
from haystack.components.generators.chat import MockChatGenerator
from haystack.core.serialization import default_to_dict, generate_qualified_class_name
from haystack.dataclasses import ChatMessage
from haystack.hooks.compaction import (
    CompactionHook,
    SlidingWindowCompactor,
    ToolResultOffloadCompactor,
    ToolResultPruningCompactor,
)
from haystack.token_counters import ApproximateTokenCounter, TokenCounter
from hook_scripts import (
    ALLOW_EXPERIMENTAL,
    COMPACTED,
    OFFLOADED,
    TOOLS,
    RecordingStore,
    make_agent,
    make_state,
    tool_step,
)
from tracing_spy import HOOK_SPAN, RecordingTracer

from haystack_integrations.offload import FsspecToolResultStore, OffloadCompactionHook, offload_context

pytestmark = ALLOW_EXPERIMENTAL

WINDOW = 1000
OURS = generate_qualified_class_name(OffloadCompactionHook)
PRUNING = generate_qualified_class_name(ToolResultPruningCompactor)
SLIDING = generate_qualified_class_name(SlidingWindowCompactor)
COMPACTION_TAGS = "haystack.agent.hook.compaction."
COUNTER = ApproximateTokenCounter()


class RecordingCompactor:
    """A `Compactor` that records its calls (with their targets) and returns a preset result."""

    def __init__(self, result: list[ChatMessage] | None = None) -> None:
        self.result = result
        self.calls: list[tuple[str, int, int]] = []
        self.lifecycle: list[str] = []

    def compact(
        self, messages: list[ChatMessage], target_tokens: int, token_counter: TokenCounter
    ) -> list[ChatMessage] | None:
        self.calls.append(("compact", target_tokens, len(messages)))
        return self.result

    async def compact_async(
        self, messages: list[ChatMessage], target_tokens: int, token_counter: TokenCounter
    ) -> list[ChatMessage] | None:
        self.calls.append(("compact_async", target_tokens, len(messages)))
        return self.result

    def warm_up(self) -> None:
        self.lifecycle.append("warm_up")

    async def warm_up_async(self) -> None:
        self.lifecycle.append("warm_up_async")

    def close(self) -> None:
        self.lifecycle.append("close")

    async def close_async(self) -> None:
        self.lifecycle.append("close_async")

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self)


class CompactorWithAStore(RecordingCompactor):
    """A compactor of someone else's that writes into a store it holds, like `ToolResultOffloadCompactor`."""

    def __init__(self, store: Any) -> None:
        super().__init__()
        self.store = store


def _conversation(chars: int = 2000, *, last_chars: int | None = None) -> list[ChatMessage]:
    """System prompt, task, and three tool steps; the last result (which the provider has not counted) may differ."""
    messages = [ChatMessage.from_system("rules"), ChatMessage.from_user("start")]
    for step in range(3):
        size = chars if step < 2 or last_chars is None else last_chars
        messages += tool_step(("notes", f"step {step} " + "n" * size), step=step)
    return messages


def _state(messages: list[ChatMessage], *, context_tokens: int, tools: list[Any] | None = None) -> State:
    state = make_state(messages, context_tokens=context_tokens)
    state.data["tools"] = tools
    return state


def _both(compactor: Any, other: Any, **settings: Any) -> tuple[CompactionHook, OffloadCompactionHook]:
    """Haystack's hook and ours, built with the same line apart from the class name."""
    return CompactionHook(compactor, **settings), OffloadCompactionHook(other, **settings)


def _compaction_tags(span: Any) -> dict[str, Any]:
    return {key: value for key, value in span.tags.items() if key.startswith(COMPACTION_TAGS)}


# The one-line switch: same trigger, target, application and warning as CompactionHook


@pytest.mark.parametrize("context_tokens", [0, 300, 699, 700, 800])
@pytest.mark.parametrize("with_tools", [False, True])
@pytest.mark.parametrize("declines", [False, True])
async def test_same_trigger_target_and_result_as_compaction_hook(
    context_tokens: int, with_tools: bool, declines: bool
) -> None:
    messages = _conversation(last_chars=4)  # a small unreported tail, so the reported count decides the trigger
    replacement = None if declines else [messages[0], messages[1], ChatMessage.from_assistant("summary")]
    theirs, ours = RecordingCompactor(replacement), RecordingCompactor(replacement)
    stock, sibling = _both(theirs, ours, context_window=WINDOW)
    tools = list(TOOLS) if with_tools else None
    for mode in ("sync", "async"):
        stock_state = _state(messages, context_tokens=context_tokens, tools=tools)
        our_state = _state(messages, context_tokens=context_tokens, tools=tools)
        if mode == "sync":
            stock.run(stock_state)
            sibling.run(our_state)
        else:
            await stock.run_async(stock_state)
            await sibling.run_async(our_state)
        assert our_state.data["messages"] == stock_state.data["messages"]
        assert our_state.data["context_tokens"] == stock_state.data["context_tokens"]
    assert ours.calls == theirs.calls
    # Both sides of the trigger are covered: the comparison is not between two hooks doing nothing.
    if context_tokens == 300:
        assert ours.calls == []
    if context_tokens in (0, 800):
        assert [call[0] for call in ours.calls] == ["compact", "compact_async"]


def test_the_compactor_goes_in_the_same_slot_no_store_needed() -> None:
    positional = OffloadCompactionHook(SlidingWindowCompactor(), context_window=WINDOW)
    keyword = OffloadCompactionHook(compactor=SlidingWindowCompactor(), context_window=WINDOW)
    for hook in (positional, keyword):
        assert isinstance(hook.compactor, SlidingWindowCompactor)
        assert hook.offload is False  # exactly CompactionHook's behaviour unless offloading is asked for
        state = make_state(_conversation(), context_tokens=900)  # no store anywhere
        hook.run(state)
        assert any(COMPACTED in message.meta for message in state.data["messages"])


def test_the_same_warning_when_the_counter_exceeds_the_estimate(caplog: pytest.LogCaptureFixture) -> None:
    stock, sibling = _both(RecordingCompactor(), RecordingCompactor(), context_window=WINDOW)
    messages = [ChatMessage.from_assistant("x" * 4000)]
    warnings: list[list[str]] = []
    for hook in (stock, sibling):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            hook.run(make_state(messages, context_tokens=800))
        warnings.append([record.getMessage() for record in caplog.records if record.levelno == logging.WARNING])
    assert warnings[0] and warnings[1] == warnings[0]
    assert "TokenCounter estimated more tokens for the messages" in warnings[1][0]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_agent_compacts_exactly_as_with_compaction_hook(mode: str) -> None:
    results = []
    for hook_class in (CompactionHook, OffloadCompactionHook):
        agent = make_agent({"before_llm": [hook_class(SlidingWindowCompactor(), context_window=20_000)]})
        messages = [ChatMessage.from_user("p: fetch, fetch, fetch, notes")]
        result = agent.run(messages) if mode == "sync" else await agent.run_async(messages)
        results.append(result["messages"])
    assert results[1] == results[0]
    assert any(COMPACTED in message.meta for message in results[1])


# Tracing: Haystack's tags on the Agent's hook span


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_agent_run_leaves_the_same_compaction_tags(recording_tracer: RecordingTracer, mode: str) -> None:
    tags: list[list[dict[str, Any]]] = []
    for hook_class in (CompactionHook, OffloadCompactionHook):
        recording_tracer.spans.clear()
        agent = make_agent({"before_llm": [hook_class(SlidingWindowCompactor(), context_window=20_000)]})
        messages = [ChatMessage.from_user("p: fetch, fetch, fetch, notes")]
        _ = agent.run(messages) if mode == "sync" else await agent.run_async(messages)
        spans = recording_tracer.hook_spans("before_llm")
        assert all(span.parent is not None and span.parent.operation_name == "haystack.agent.step" for span in spans)
        tags.append([_compaction_tags(span) for span in spans])
    assert tags[1] == tags[0]
    assert {span_tags[f"{COMPACTION_TAGS}triggered"] for span_tags in tags[1]} == {True, False}
    assert any(span_tags.get(f"{COMPACTION_TAGS}compacted") for span_tags in tags[1])
    assert recording_tracer.hook_spans("before_llm")[0].tags["haystack.agent.hook.type"] == OURS


@pytest.mark.parametrize(
    ("settings", "strategy"),
    [
        (lambda: {}, OURS),
        (lambda: {"chain": [ToolResultPruningCompactor()]}, f"{OURS},{PRUNING}"),
        (lambda: {"compactor": SlidingWindowCompactor()}, SLIDING),
        (lambda: {"compactor": SlidingWindowCompactor(), "offload": True}, f"{OURS},{SLIDING}"),
    ],
)
def test_the_strategy_tag_names_every_stage_in_order(
    recording_tracer: RecordingTracer, settings: Callable[[], dict[str, Any]], strategy: str
) -> None:
    messages = _conversation()
    # The provider counted everything up to the last tool result, plus 100 tokens of template and schemas.
    reported = COUNTER.count(messages=messages[:-1]) + 100
    hook = OffloadCompactionHook(context_window=WINDOW, **settings())
    state = make_state(messages, store=RecordingStore(), context_tokens=reported)
    with tracing.tracer.trace(HOOK_SPAN) as span:
        hook.run(state)
    estimated = reported + COUNTER.count(messages=messages[-1:])
    assert _compaction_tags(span) == {
        f"{COMPACTION_TAGS}strategy": strategy,
        f"{COMPACTION_TAGS}estimated_context_tokens": estimated,
        f"{COMPACTION_TAGS}triggered": True,
        # The window's target less what the provider counts beyond the messages (about the 100 tokens above).
        f"{COMPACTION_TAGS}target_tokens": int(WINDOW * 0.4) - (estimated - COUNTER.count(messages=messages)),
        f"{COMPACTION_TAGS}compacted": True,
    }


def test_below_the_trigger_only_the_sizing_is_tagged(recording_tracer: RecordingTracer) -> None:
    hook = OffloadCompactionHook(context_window=1_000_000)
    with tracing.tracer.trace(HOOK_SPAN) as span:
        hook.run(make_state(_conversation(), store=RecordingStore(), context_tokens=900))
    assert set(_compaction_tags(span)) == {
        f"{COMPACTION_TAGS}strategy",
        f"{COMPACTION_TAGS}estimated_context_tokens",
        f"{COMPACTION_TAGS}triggered",
    }


# Offloading into the run's store, and how it combines with a compactor


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_with_offloading_the_compactor_runs_only_if_offloading_falls_short(mode: str) -> None:
    enough, short = RecordingCompactor(), RecordingCompactor([ChatMessage.from_user("start")])
    runs = []
    for compactor, chars in ((enough, 4000), (short, 100)):  # results of 100 chars are under min_tokens
        store = RecordingStore()
        state = make_state(_conversation(chars), store=store, context_tokens=0)
        hook = OffloadCompactionHook(compactor, offload=True, context_window=_window(_conversation(chars)))
        if mode == "sync":
            hook.run(state)
        else:
            await hook.run_async(state)
        runs.append((state.data["messages"], store))
    (offloaded, store), (compacted, untouched) = runs
    assert enough.calls == []
    assert [index for index, message in enumerate(offloaded) if OFFLOADED in message.meta] == [3, 5]
    assert len(store.written) == 2
    assert [call[0] for call in short.calls] == ["compact" if mode == "sync" else "compact_async"]
    assert compacted == [ChatMessage.from_user("start")] and untouched.written == {}


def _window(messages: list[ChatMessage]) -> int:
    return int(COUNTER.count(messages=messages) / 0.8)


def test_offloading_with_a_compactor_needs_the_runs_store() -> None:
    agent = make_agent(
        {"before_llm": [OffloadCompactionHook(SlidingWindowCompactor(), offload=True, context_window=10)]}
    )
    with pytest.raises(ValueError, match="OffloadCompactionHook has no store"):
        agent.run([ChatMessage.from_user("p: notes")])


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"offload": False}, ValueError, "nothing to compact with"),
        ({"offload": "yes"}, TypeError, "`offload` must be a bool"),
        ({"compactor": "sliding"}, TypeError, "must be a Compactor"),
        ({"allow_shared_store": 1}, TypeError, "`allow_shared_store` must be a bool"),
        ({"context_window": 0}, ValueError, "`context_window` must be a positive number of tokens"),
        ({"compact_at": 0.4, "compact_to": 0.7}, ValueError, "0 < compact_to < compact_at <= 1"),
    ],
)
def test_settings_that_cannot_work_are_refused(settings: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        OffloadCompactionHook(**{"context_window": WINDOW, **settings})


# Compactors holding a store of their own


@pytest.mark.parametrize("place", ["compactor", "chain"])
def test_a_compactor_with_its_own_store_is_refused(place: str) -> None:
    compactor = ToolResultOffloadCompactor(store=RecordingStore(), min_tokens=50)
    settings: dict[str, Any] = {"compactor": compactor} if place == "compactor" else {"chain": [compactor]}
    with pytest.raises(ValueError, match="all tenants' compacted results would share it") as refused:
        OffloadCompactionHook(context_window=WINDOW, **settings)
    message = str(refused.value)
    # The message says what to write instead, with the compactor's own settings, and how to opt out.
    assert "OffloadCompactionHook(context_window=..., min_keep_steps=1, min_tokens=50, preview_chars=200)" in message
    assert "allow_shared_store=True" in message


def test_any_compactor_holding_a_store_is_refused_and_one_without_is_not() -> None:
    with pytest.raises(ValueError, match="CompactorWithAStore writes every run's results"):
        OffloadCompactionHook(CompactorWithAStore(RecordingStore()), context_window=WINDOW)
    OffloadCompactionHook(CompactorWithAStore(None), context_window=WINDOW)
    OffloadCompactionHook(CompactorWithAStore("s3://not-a-store-object"), context_window=WINDOW)


def test_opting_in_writes_every_run_into_the_compactors_store() -> None:
    shared, own = RecordingStore(), RecordingStore()
    hook = OffloadCompactionHook(
        ToolResultOffloadCompactor(store=shared), context_window=_window(_conversation(4000)), allow_shared_store=True
    )
    state = make_state(_conversation(4000), store=own)  # the run's own store is not what it writes to
    hook.run(state)
    assert shared.written and own.written == {}


# Serialization


def test_round_trip_with_a_compactor() -> None:
    hook = OffloadCompactionHook(SlidingWindowCompactor(min_keep_steps=3), context_window=50_000, compact_at=0.6)
    data = hook.to_dict()
    assert data["init_parameters"]["compactor"]["init_parameters"]["min_keep_steps"] == 3
    assert data["init_parameters"]["offload"] is False
    restored = OffloadCompactionHook.from_dict(data)
    assert isinstance(restored.compactor, SlidingWindowCompactor) and restored.compactor.min_keep_steps == 3
    assert (restored.offload, restored.context_window, restored.compact_at) == (False, 50_000, 0.6)
    assert restored.to_dict() == data


def test_a_compaction_hook_dict_loads_with_our_class_name() -> None:
    data = CompactionHook(SlidingWindowCompactor(min_keep_steps=2), context_window=8000, compact_to=0.3).to_dict()
    data["type"] = OURS
    restored = OffloadCompactionHook.from_dict(data)
    assert isinstance(restored.compactor, SlidingWindowCompactor) and restored.compactor.min_keep_steps == 2
    assert (restored.offload, restored.context_window, restored.compact_to) == (False, 8000, 0.3)


def test_a_shared_store_round_trips_only_with_its_opt_in() -> None:
    compactor = ToolResultOffloadCompactor(store=FsspecToolResultStore("memory://shared"))
    hook = OffloadCompactionHook(compactor, context_window=WINDOW, allow_shared_store=True)
    data = hook.to_dict()
    restored = OffloadCompactionHook.from_dict(data)
    assert isinstance(restored.compactor, ToolResultOffloadCompactor)
    assert restored.allow_shared_store is True
    data["init_parameters"]["allow_shared_store"] = False  # a configuration file cannot slip one in either
    with pytest.raises(ValueError, match="allow_shared_store=True"):
        OffloadCompactionHook.from_dict(data)


async def test_an_agent_with_a_compactor_round_trips_and_runs() -> None:
    hook = OffloadCompactionHook(SlidingWindowCompactor(), context_window=20_000, chain=[ToolResultPruningCompactor()])
    agent = Agent(chat_generator=MockChatGenerator(responses="done"), hooks={"before_llm": [hook]})
    restored = Agent.from_dict(agent.to_dict())
    again = restored.hooks["before_llm"][0]
    assert isinstance(again, OffloadCompactionHook)
    assert isinstance(again.compactor, SlidingWindowCompactor)
    assert [type(compactor) for compactor in again.chain] == [ToolResultPruningCompactor]
    result = await restored.run_async([ChatMessage.from_user("hi")], hook_context=offload_context(RecordingStore()))
    assert result["last_message"].text == "done"


# Lifecycle and the async path


def test_lifecycle_reaches_the_compactor() -> None:
    compactor = RecordingCompactor()
    hook = OffloadCompactionHook(compactor, context_window=WINDOW)
    hook.warm_up()
    hook.close()
    assert compactor.lifecycle == ["warm_up", "close"]


async def test_async_lifecycle_and_compaction_prefer_the_async_methods() -> None:
    compactor = RecordingCompactor()
    hook = OffloadCompactionHook(compactor, context_window=WINDOW)
    await hook.warm_up_async()
    await hook.run_async(make_state(_conversation(), context_tokens=900))
    await hook.close_async()
    assert compactor.lifecycle == ["warm_up_async", "close_async"]
    assert [call[0] for call in compactor.calls] == ["compact_async"]
