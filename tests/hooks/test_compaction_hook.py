"""`OffloadCompactionHook`: when it compacts, what it offloads (and where), chaining, and Haystack parity."""

import asyncio
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from haystack.hooks.compaction import (
    CompactionHook,
    SlidingWindowCompactor,
    ToolResultOffloadCompactor,
    ToolResultPruningCompactor,
)
from haystack.hooks.tool_result_offloading import OffloadOverChars
from haystack.token_counters import ApproximateTokenCounter
from hook_scripts import (
    ALLOW_EXPERIMENTAL,
    COMPACTED,
    OFFLOADED,
    RecordingStore,
    make_agent,
    make_state,
    page,
    references,
    tool_results,
    tool_step,
)

from haystack_integrations.offload import FsspecToolResultStore, OffloadCompactionHook, OffloadHook, offload_context

COUNTER = ApproximateTokenCounter()


def _conversation(steps: int = 5, chars: int = 4000) -> list[ChatMessage]:
    messages = [ChatMessage.from_system("be brief"), ChatMessage.from_user("research")]
    for step in range(steps):
        messages += tool_step(("notes", f"step {step} " + "n" * chars), step=step)
    return messages


def _compacted_indices(messages: list[ChatMessage]) -> list[int]:
    return [index for index, message in enumerate(messages) if COMPACTED in message.meta]


def _window_for(messages: list[ChatMessage], fill: float) -> int:
    """A context window that the conversation fills to `fill`."""
    return int(COUNTER.count(messages=messages) / fill)


# When


def test_below_compact_at_nothing_is_touched() -> None:
    store = RecordingStore()
    messages = _conversation()
    state = make_state(messages, store=store)
    OffloadCompactionHook(context_window=_window_for(messages, 0.69), compact_at=0.7).run(state)
    assert state.data["messages"] == messages
    assert store.written == {}


# What and where


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_older_results_go_oldest_first_into_the_runs_store(mode: str) -> None:
    store, fallback = RecordingStore(), RecordingStore()
    messages = _conversation(steps=5)
    state = make_state(messages, store=store)
    # At 0.8 of the window, down to 0.5: about three of the five 1000-token results must go.
    hook = OffloadCompactionHook(
        context_window=_window_for(messages, 0.8), compact_at=0.7, compact_to=0.5, store=fallback
    )
    if mode == "sync":
        hook.run(state)
    else:
        await hook.run_async(state)

    compacted = state.data["messages"]
    indices = _compacted_indices(compacted)
    assert indices == [3, 5, 7]  # the three oldest results, in order; step 4's (index 11) is never a candidate
    assert COUNTER.count(messages=compacted) <= int(hook.context_window * 0.5)
    assert fallback.written == {}
    for index in indices:
        marker = compacted[index].meta[COMPACTED]
        assert marker["strategy"] == "tool_result_offloading"
        assert marker["original_tokens"] > 200
        (reference,) = compacted[index].meta[OFFLOADED]
        assert store.read(reference) == messages[index].tool_call_result.result  # type: ignore[union-attr]
        assert compacted[index].tool_call_result.origin == messages[index].tool_call_result.origin  # type: ignore[union-attr]
    untouched = [index for index in range(len(messages)) if index not in indices]
    assert [compacted[index] for index in untouched] == [messages[index] for index in untouched]


@ALLOW_EXPERIMENTAL
@pytest.mark.parametrize(("steps", "fill", "compact_to"), [(5, 0.8, 0.5), (6, 0.95, 0.2), (3, 0.75, 0.6)])
def test_the_same_results_are_offloaded_as_with_haystacks_compactor(steps: int, fill: float, compact_to: float) -> None:
    messages = _conversation(steps=steps)
    window = _window_for(messages, fill)
    ours, theirs = make_state(messages, store=RecordingStore()), make_state(messages)
    OffloadCompactionHook(context_window=window, compact_to=compact_to).run(ours)
    CompactionHook(
        ToolResultOffloadCompactor(store=RecordingStore()), context_window=window, compact_to=compact_to
    ).run(theirs)
    assert _compacted_indices(ours.data["messages"]) == _compacted_indices(theirs.data["messages"])
    assert _compacted_indices(ours.data["messages"])


def test_min_keep_steps_and_min_tokens_are_respected() -> None:
    store = RecordingStore()
    messages = [ChatMessage.from_user("go")]
    messages += tool_step(("notes", "tiny"), ("notes", "n" * 4000), step=0)
    for step in range(1, 4):
        messages += tool_step(("notes", "m" * 4000), step=step)
    state = make_state(messages, store=store)
    OffloadCompactionHook(context_window=_window_for(messages, 0.9), compact_to=0.1, min_keep_steps=2).run(state)
    # Everything offloadable goes (the target is far), except "tiny" (under min_tokens) and the last two steps.
    assert _compacted_indices(state.data["messages"]) == [3, 5]
    assert len(store.written) == 2


def test_errors_read_back_results_and_earlier_pointers_stay() -> None:
    store = RecordingStore()
    messages = [ChatMessage.from_user("go")]
    messages += tool_step(("notes", "e" * 4000), step=0, error=True)
    messages += tool_step(("read_tool_result", "r" * 4000), ("list_tool_results", "l" * 4000), step=1)
    messages += tool_step(("fetch", "f" * 4000), step=2)
    messages += tool_step(("notes", "n" * 4000), step=3)
    state = make_state(messages, store=store)
    OffloadHook({"fetch": OffloadOverChars(100)}, store=store).run(make_state(messages[:9], store=store))
    OffloadCompactionHook(context_window=_window_for(messages, 0.9), compact_to=0.1).run(state)
    assert [messages[i].tool_call_result.origin.tool_name for i in _compacted_indices(state.data["messages"])] == [  # type: ignore[union-attr]
        "fetch"
    ]


async def test_a_failed_write_stays_and_a_later_round_takes_the_next_result() -> None:
    class FailsOnce(RecordingStore):
        def write(self, *, key: str, content: str | bytes) -> str:
            if isinstance(content, str) and content.startswith("step 0 "):
                raise OSError("disk full")
            return super().write(key=key, content=content)

    messages = _conversation(steps=5)
    state = make_state(messages, store=FailsOnce())
    # One result's worth of compaction: the first (oldest) write fails, so the next round offloads the second oldest.
    hook = OffloadCompactionHook(context_window=_window_for(messages, 0.75), compact_at=0.7, compact_to=0.62)
    await hook.run_async(state)
    compacted = state.data["messages"]
    assert compacted[3] == messages[3]
    assert _compacted_indices(compacted) == [5]


async def test_a_rounds_writes_run_concurrently() -> None:
    class BarrierStore(RecordingStore):
        def __init__(self) -> None:
            super().__init__()
            self.barrier = asyncio.Barrier(3)

        async def write_async(self, *, key: str, content: str | bytes) -> str:
            async with asyncio.timeout(10):
                await self.barrier.wait()
            return self.write(key=key, content=content)

    messages = _conversation(steps=5)
    state = make_state(messages, store=BarrierStore())
    await OffloadCompactionHook(context_window=_window_for(messages, 0.8), compact_to=0.5).run_async(state)
    assert _compacted_indices(state.data["messages"]) == [3, 5, 7]


def test_context_tokens_is_re_estimated_when_the_provider_reported_it() -> None:
    messages = _conversation(steps=5)
    window = _window_for(messages, 0.8)
    reported = make_state(messages, store=RecordingStore(), context_tokens=COUNTER.count(messages=messages[:-1]) + 50)
    OffloadCompactionHook(context_window=window, compact_to=0.5).run(reported)
    compacted = reported.data["messages"]
    # Through the last assistant message, plus the ~50 tokens of overhead the provider counted beyond the messages
    # (counting parts separately rounds differently from counting them together, hence the tolerance).
    assert abs(reported.data["context_tokens"] - (COUNTER.count(messages=compacted[:-1]) + 50)) <= 1
    assert reported.data["context_tokens"] < COUNTER.count(messages=messages) / 2

    unreported = make_state(messages, store=RecordingStore(), context_tokens=0)
    OffloadCompactionHook(context_window=window, compact_to=0.5).run(unreported)
    assert unreported.data["context_tokens"] == 0


# Chaining Haystack's compactors


@ALLOW_EXPERIMENTAL
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_pruning_runs_after_offloading_when_offloading_is_not_enough(mode: str) -> None:
    store = RecordingStore()
    messages = [ChatMessage.from_user("go")]
    messages += tool_step(("read_tool_result", "r" * 4000), step=0)  # never offloaded, but may be pruned
    messages += tool_step(("notes", "n" * 4000), step=1)
    messages += tool_step(("notes", "m" * 4000), step=2)
    state = make_state(messages, store=store)
    hook = OffloadCompactionHook(
        context_window=_window_for(messages, 0.9), compact_to=0.3, chain=[ToolResultPruningCompactor()]
    )
    if mode == "sync":
        hook.run(state)
    else:
        await hook.run_async(state)
    compacted = state.data["messages"]
    assert compacted[4].meta[COMPACTED]["strategy"] == "tool_result_offloading"
    assert compacted[2].meta[COMPACTED]["strategy"] == "tool_result_pruning"
    assert compacted[6] == messages[6]  # the latest step stays whole
    assert len(store.written) == 1


@ALLOW_EXPERIMENTAL
def test_the_chain_does_not_run_when_offloading_reached_the_target() -> None:
    messages = _conversation(steps=5)
    state = make_state(messages, store=RecordingStore())
    hook = OffloadCompactionHook(
        context_window=_window_for(messages, 0.8), compact_to=0.5, chain=[SlidingWindowCompactor()]
    )
    hook.run(state)
    assert len(state.data["messages"]) == len(messages)
    assert _compacted_indices(state.data["messages"]) == [3, 5, 7]


@ALLOW_EXPERIMENTAL
def test_a_sliding_window_can_finish_what_offloading_cannot() -> None:
    messages = _conversation(steps=5, chars=150)  # results under min_tokens: nothing to offload
    messages[1:1] = [ChatMessage.from_user("an old question " * 400), ChatMessage.from_assistant("old answer")]
    state = make_state(messages, store=RecordingStore())
    hook = OffloadCompactionHook(
        context_window=_window_for(messages, 0.9), compact_to=0.3, chain=[SlidingWindowCompactor()]
    )
    hook.run(state)
    assert len(state.data["messages"]) < len(messages)
    assert _compacted_indices(state.data["messages"])  # the window's omission note


# Settings


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"context_window": 0}, ValueError, "context_window"),
        ({"compact_at": 0.4, "compact_to": 0.4}, ValueError, "compact_to < compact_at"),
        ({"compact_at": 1.2}, ValueError, "compact_to < compact_at"),
        ({"min_keep_steps": 0}, ValueError, "min_keep_steps"),
        ({"min_tokens": -1}, ValueError, "min_tokens"),
        ({"preview_chars": -1}, ValueError, "preview_chars"),
        ({"store": "s3://bucket"}, TypeError, "ToolResultStore"),
        ({"chain": ["prune"]}, TypeError, "Compactor"),
    ],
)
def test_bad_settings_get_a_clear_error(settings: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        OffloadCompactionHook(**{"context_window": 1000, **settings})


def test_a_run_without_any_store_fails_on_its_first_step() -> None:
    agent = make_agent({"before_llm": [OffloadCompactionHook(context_window=1_000_000)]})
    with pytest.raises(ValueError, match="OffloadCompactionHook has no store"):
        agent.run([ChatMessage.from_user("lost: notes")])


# Real Agent on every backend, with both hooks


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_agent_with_both_hooks(store: FsspecToolResultStore, mode: str) -> None:
    agent = make_agent(
        {
            "after_tool": [OffloadHook({"fetch": OffloadOverChars(10_000)})],
            "before_llm": [OffloadCompactionHook(context_window=4000)],
        }
    )
    session = store.for_session("globex", mode)
    messages = [ChatMessage.from_user("globex: fetch+notes, notes, notes, notes")]
    if mode == "sync":
        result = agent.run(messages, hook_context=offload_context(session))
    else:
        result = await agent.run_async(messages, hook_context=offload_context(session))

    assert result["messages"][-1].text == "globex: finished after 4 steps"
    offloaded, compacted = references(result, compacted=False), references(result, compacted=True)
    assert [session.read(reference) for reference in offloaded] == [page("globex step 0 call 0")]
    assert len(compacted) >= 2
    originals = {page(f"globex step {step} call {call}", lines=40) for step, call in ((0, 1), (1, 0), (2, 0))}
    assert {session.read(reference) for reference in compacted} <= originals
    assert {record.tool_name for record in session.list()} == {"fetch", "notes"}
    assert len(session.list()) == len(offloaded) + len(compacted)
    last = tool_results(result)[-1]
    assert OFFLOADED not in last.meta  # the latest step stays whole
